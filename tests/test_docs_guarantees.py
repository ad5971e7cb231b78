"""Every test the guarantees page names exists, so the page cannot cite a test that is gone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "guarantees.rst"
REFERENCE = re.compile(r"``(tests/[\w/]+\.py)::(\w+)``")


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")}


def test_every_named_test_exists() -> None:
    references = REFERENCE.findall(PAGE.read_text(encoding="utf-8"))
    assert len(references) >= 15, "the guarantees page names the tests behind its statements"
    missing = [f"{file}::{name}" for file, name in references
               if not (ROOT / file).is_file() or name not in _test_names(ROOT / file)]
    assert missing == []
