"""The import rules of docs/architecture.rst, checked on the source.

Each top-level unit of ``kvlog`` (a package or a module) has a layer; a unit may import
only units of lower layers (or itself), so there is no cycle between packages and no
arrow up. lmdb is imported only by the two units that own LMDB data; kvlog never imports
Spark or the benchmark harness; no module is longer than 600 lines; and no text cites
documents that are not in the repository.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvlog"

#: The layers of docs/architecture.rst, lowest first.
LAYERS: dict[str, int] = {
    "errors": 0,
    "clock": 1, "memory": 1, "progress": 1, "extras": 1, "config": 1, "_native": 1,
    "storage": 2, "format": 2,
    "meta": 3,
    "index": 4,
    "log": 5,
    "compaction": 6, "check": 6, "consumer": 6, "snapshot": 6, "views": 6,
    "store": 7,
    "aio": 8, "demo": 8, "testing": 8, "__init__": 8,
    "cli": 9, "__main__": 9,
}

#: Imports allowed to reach above their layer, each for a reason the docs give.
EXCEPTIONS = {
    # ``kvlog spark`` runs the Spark jobs; kvlog's library code never imports spark_ext.
    ("cli", "spark_ext"),
}

LMDB_OWNERS = {"meta", "index"}
FORBIDDEN = {"spark_ext", "pyspark", "benchmarks", "sqlite3", "matplotlib", "rocksdict"}


def _unit(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[str, int]]:
    """Absolute module names ``path`` imports (relative imports resolved), with line numbers."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inside = path.is_relative_to(ROOT)
    package = ".".join(path.relative_to(ROOT).parts[:-1]) if inside else ""
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((module, node.lineno))
            # ``from kvlog import log`` names a unit too.
            if module == "kvlog":
                out.extend((f"kvlog.{alias.name}", node.lineno) for alias in node.names)
    return out


SOURCES = sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_unit_has_a_layer() -> None:
    units = {_unit(p) for p in SOURCES}
    assert units <= set(LAYERS), f"units without a layer: {sorted(units - set(LAYERS))}"


def _violations(path: Path, unit: str) -> list[str]:
    """The import rules ``path``, a module of ``unit``, breaks."""
    wrong = []
    for module, line in _imports(path):
        top, _, rest = module.partition(".")
        if top in FORBIDDEN and (unit, top) not in EXCEPTIONS:
            wrong.append(f"line {line}: imports {module}")
        if top == "lmdb" and unit not in LMDB_OWNERS:
            wrong.append(f"line {line}: imports lmdb outside {sorted(LMDB_OWNERS)}")
        if top != "kvlog" or not rest:
            continue
        target = rest.split(".")[0]
        if target == unit or target not in LAYERS:
            continue
        if LAYERS[target] >= LAYERS[unit] and (unit, target) not in EXCEPTIONS:
            wrong.append(f"line {line}: {unit} (layer {LAYERS[unit]}) imports {module} "
                         f"(layer {LAYERS[target]})")
    return wrong


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path: Path) -> None:
    wrong = _violations(path, _unit(path))
    assert not wrong, f"{path.relative_to(ROOT)}:\n" + "\n".join(wrong)


def test_the_rules_catch_what_they_forbid(tmp_path: Path) -> None:
    """The checker itself: an upward import, lmdb outside its owners, and Spark are reported."""
    probe = tmp_path / "probe.py"
    probe.write_text("from kvlog.log import Log\nimport lmdb\nimport pyspark.sql\nfrom kvlog.errors import KvlogError\n")
    assert _violations(probe, "format") == [
        "line 1: format (layer 2) imports kvlog.log (layer 5)",
        "line 2: imports lmdb outside ['index', 'meta']",
        "line 3: imports pyspark.sql",
    ]
    assert _violations(probe, "store") == [
        "line 2: imports lmdb outside ['index', 'meta']",
        "line 3: imports pyspark.sql",
    ]


@pytest.mark.parametrize("path", SOURCES + sorted(PACKAGE.rglob("*.[ch]")), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_are_short(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= 600, f"{path.relative_to(ROOT)} has {lines} lines; split it by concept"


def test_no_text_cites_documents_outside_the_repository() -> None:
    pattern = re.compile(r"DESIGN §|STYLE #|API\.md")
    hits = []
    for top in ("kvlog", "spark_ext", "docs", "tests", "examples", "benchmarks"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix not in {".py", ".rst", ".md", ".c", ".h", ".pyi"} or "_build" in path.parts:
                continue
            if path == Path(__file__).resolve():
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "\n".join(hits)


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` (``kvlog.x.y.name``) names a module or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def test_the_architecture_page_names_what_exists() -> None:
    """Every file and every ``kvlog.…`` name docs/architecture.rst points a reader at exists."""
    text = (ROOT / "docs" / "architecture.rst").read_text()
    paths = set(re.findall(r"\b((?:kvlog|tests|spark_ext)/[\w/]+\.(?:py|rst))\b", text))
    names = {name.rstrip(".") for name in re.findall(r"\bkvlog\.[a-z_][\w.]*", text)}
    assert len(paths) >= 10 and len(names) >= 10, "the page points at the code"
    assert sorted(p for p in paths if not (ROOT / p).is_file()) == []
    assert sorted(n for n in names if not _resolves(n)) == []
