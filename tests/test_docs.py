"""The documentation's examples run: every ``>>>`` example in docs/*.rst, and kvlog's docstring.

Each page is one test, run with :func:`doctest.testfile` (the way diskcache's
``tests/test_doctest.py`` runs its tutorials), so a page whose examples stop
matching the code fails the suite. CI builds the docs as HTML only, so these
tests, not ``sphinx-build -b doctest``, are what keeps the tutorials honest.
"""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

import kvlog

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: The Spark pages run in tests/spark/test_docs_spark.py, with the Spark tests' session.
PAGES = sorted(page for page in DOCS.glob("*.rst") if not page.name.startswith("spark"))
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

#: Tutorial pages that must keep executable examples (a guard against losing them).
TUTORIALS = ("quickstart.rst", "store.rst", "log.rst")


def test_pages_found() -> None:
    names = {page.name for page in PAGES}
    assert set(TUTORIALS) <= names, f"missing tutorial pages in {DOCS}: {sorted(set(TUTORIALS) - names)}"


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_page_examples(page: Path) -> None:
    # Failures are reported on stdout by doctest; pytest shows them with the failure.
    result = doctest.testfile(
        str(page), module_relative=False, optionflags=OPTIONS, encoding="utf-8", verbose=False
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {page.name} failed"
    if page.name in TUTORIALS:
        assert result.attempted > 0, f"{page.name} has no >>> examples left"


def test_package_docstring() -> None:
    result = doctest.testmod(kvlog, optionflags=OPTIONS, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in kvlog/__init__.py failed"


#: The public modules: every name in their ``__all__`` is in the API reference.
PUBLIC_MODULES = ("kvlog", "kvlog.aio", "kvlog.errors", "kvlog.config", "kvlog.clock", "kvlog.format",
                  "kvlog.storage", "kvlog.testing", "spark_ext")


def test_every_public_name_is_in_the_api_reference(tmp_path: Path) -> None:
    """docs/api.rst, built with the docs' configuration, documents every name of every public
    module's ``__all__`` (as ``module.name``; ``kvlog.ConfigError`` also answers for
    ``kvlog.errors.ConfigError``, its canonical name), so a public name added without
    documentation fails here. Importing spark_ext needs no JVM: this build imports it."""
    import importlib
    import io
    import shutil
    import warnings

    from sphinx.application import Sphinx

    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(DOCS / "conf.py", source / "conf.py")
    shutil.copy(DOCS / "api.rst", source / "index.rst")
    with warnings.catch_warnings():
        # Sphinx's own extensions (napoleon) use APIs Sphinx itself deprecates; the suite turns
        # warnings into errors, which is for kvlog's code, not for Sphinx's.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        app = Sphinx(str(source), str(source), str(tmp_path / "out"), str(tmp_path / "doctrees"), "dummy",
                     status=None, warning=io.StringIO(), freshenv=True)
        app.build()
    documented = set(app.env.domains["py"].objects)
    missing = [f"{name}.{public}" for name in PUBLIC_MODULES
               for public in importlib.import_module(name).__all__
               if f"{name}.{public}" not in documented]
    assert missing == [], f"public names missing from docs/api.rst: {missing}"
    assert {"kvlog.open", "kvlog.Store.put", "kvlog.errors.ConfigError", "spark_ext.register"} <= documented
