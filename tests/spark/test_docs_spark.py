"""The Spark pages of the documentation run: every ``>>>`` example and console block of ``docs/spark*.rst``.

Each page is one test, run with :func:`doctest.testfile` in this process, where the
Spark tests' session is already the active one: a page's
``SparkSession.builder.getOrCreate()`` returns it, as it would return a reader's own
session. The console blocks (the ones without a ``.. run-by:`` test) run as
tests/test_docs_blocks.py describes. The plain docs tests (``tests/test_docs.py``,
``tests/test_docs_blocks.py``) leave these pages to this module.
"""

from __future__ import annotations

import doctest
import os
from pathlib import Path
from typing import Any

import pytest

from tests.docs_blocks import Block, blocks, classify, run_console

DOCS = Path(__file__).resolve().parents[2] / "docs"
SPARK_PAGES = sorted(DOCS.glob("spark*.rst"))
CONSOLE_BLOCKS = [block for page in SPARK_PAGES for block in blocks(page)
                  if not block.is_output and not block.is_doctest and not block.run_by
                  and block.language == "console"]
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


@pytest.mark.parametrize("block", CONSOLE_BLOCKS, ids=[block.where for block in CONSOLE_BLOCKS])
def test_spark_page_console_block(block: Block, tmp_path: Path) -> None:
    assert classify(block, DOCS.parent) == "console"
    run_console(block, tmp_path)
