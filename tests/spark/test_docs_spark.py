"""The Spark pages of the documentation run: every ``>>>`` example of ``docs/spark*.rst``.

Each page is one test, run with :func:`doctest.testfile` in this process, where the
Spark tests' session is already the active one: a page's
``SparkSession.builder.getOrCreate()`` returns it, as it would return a reader's own
session. The plain docs test (``tests/test_docs.py``) leaves these pages to this one.
"""

from __future__ import annotations

import doctest
import os
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
SPARK_PAGES = sorted(DOCS.glob("spark*.rst"))
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

pytestmark = pytest.mark.spark


def test_spark_pages_found() -> None:
    assert SPARK_PAGES, f"no spark*.rst page in {DOCS}"


@pytest.mark.parametrize("page", SPARK_PAGES, ids=[page.name for page in SPARK_PAGES])
def test_spark_page_examples(page: Path, spark: Any, tmp_path: Path) -> None:
    # Pages work in a temporary directory of their own: the files they write stay there.
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = doctest.testfile(str(page), module_relative=False, optionflags=OPTIONS, encoding="utf-8",
                                  verbose=False)
    finally:
        os.chdir(cwd)
    assert result.attempted > 0, f"{page.name} has no >>> examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {page.name} failed"
