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
