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
    "clock": 1, "memory": 1, "progress": 1, "unclosed": 1, "extras": 1, "config": 1, "_native": 1,
    "storage": 2, "format": 2,
    "meta": 3,
    "index": 4,
    "log": 5,
    "compaction": 6, "check": 6, "consumer": 6, "snapshot": 6, "views": 6,
    "store": 7, "aio_consumer": 7,
    "aio": 8, "demo": 8, "testing": 8, "metrics": 8, "__init__": 8,
    "cli": 9,
    "__main__": 10,
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


#: What the Spark extension may not import: it makes files live and loads the key index
#: through the door of :mod:`kvlog.log` (``kvlog.log.outside``), never the cache's own modules.
SPARK_FORBIDDEN = ("kvlog.meta", "kvlog.index")


def _spark_violations(path: Path) -> list[str]:
    return [f"line {line}: imports {module}" for module, line in _imports(path)
            if any(module == f or module.startswith(f + ".") for f in SPARK_FORBIDDEN)]


@pytest.mark.parametrize("path", sorted((ROOT / "spark_ext").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_spark_extension_goes_through_the_door_of_the_log(path: Path) -> None:
    wrong = _spark_violations(path)
    assert not wrong, f"{path.relative_to(ROOT)}:\n" + "\n".join(wrong)


def test_the_spark_rule_catches_what_it_forbids(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from kvlog.meta import MetaTxn\nimport kvlog.index.write\nfrom kvlog.log import LiveBatch\n")
    assert _spark_violations(probe) == ["line 1: imports kvlog.meta", "line 2: imports kvlog.index.write"]


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


#: Words that tell how the project was built rather than what it is: the work's sessions,
#: issue numbers, goals, what the code did before. CHANGELOG.md is the one place for history.
#: "session" is allowed as a Spark session ("Spark session", ``SparkSession``, ``get_session``,
#: ``spark_ext.session``) and as a quoted string (pytest's ``scope="session"``, a key in an example).
HISTORY_WORDS = re.compile(
    r"(?<![\w.\"])(?<!Spark )(?<!Spark's )sessions?(?![\w(\"])"
    r"|\bissues?\s*#?\s*\d|\"issue\"|\bgoals?\b|\bpreviously\b|\bused\s+to\b"
    r"|\bnow\s+(?:faster|slower)\b|\bmoved\s+from\b|\bearlier\s+(?:runs?|measurements?|versions?)\b"
    r"|\bthis\s+week\b|\bfirst\s+version\b|\bv1\s+did\b|\b(?:before|after)/(?:after|before)\b",
    re.IGNORECASE,
)
#: In prose (README, the docs pages, the benchmarks' README) also what narrates a change.
HISTORY_PROSE = re.compile(r"\bno\s+longer\b|\bany\s+more\b", re.IGNORECASE)
_ALLOWED_SESSION = re.compile(r"\bSpark\s+sessions?\b", re.IGNORECASE)


def _history_files() -> list[Path]:
    """The README, the docs pages, the benchmarks' texts and code, kvlog, spark_ext, examples."""
    files = [ROOT / "README.md", ROOT / "pyspark_kvlog.py", *sorted((ROOT / "docs").glob("*.rst"))]
    files += sorted(p for p in (ROOT / "benchmarks").rglob("*") if p.suffix in {".md", ".py"})
    for top in ("kvlog", "spark_ext", "examples"):
        files += sorted(p for p in (ROOT / top).rglob("*")
                        if p.suffix in {".py", ".pyi", ".c", ".h", ".md", ".rst", ".txt"})
    return [p for p in files if "_build" not in p.parts]


def _history_hits(path: Path) -> list[str]:
    """Each line of ``path`` that narrates the project's history, as ``path:line: text``."""
    prose = path.suffix in {".md", ".rst"}
    hits = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if HISTORY_WORDS.search(line) or (prose and HISTORY_PROSE.search(line)):
            hits.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}: "
                        f"{line.strip()}")
    return hits


def test_no_text_narrates_the_projects_history() -> None:
    hits = [hit for path in _history_files() for hit in _history_hits(path)]
    assert not hits, "words for CHANGELOG.md, not for the code and docs:\n" + "\n".join(hits)


def test_the_history_check_catches_what_it_forbids(tmp_path: Path) -> None:
    """The checker itself: each narrating phrase is caught, a Spark session is not."""
    caught = ["measured in session 6", "this session", "see issue 3", "issue #12", '"issue": 4',
              "Every goal is met", "goals", "it previously copied", "the index used to merge",
              "gets are now faster", "moved from kvlog.bench", "three earlier runs today",
              "this week", "the first version", "what v1 did", "the before/after figures"]
    allowed = ["a Spark session", "SparkSession.builder", "spark_ext.get_session()",
               "spark_ext.session", "SESSION_DEFAULTS", '@pytest.fixture(scope="session")',
               "the file is not live", "used for", "an issue of the journal", 'store.put("session", b"v")',
               "a value moved to another file"]
    code = tmp_path / "probe.py"
    code.write_text("\n".join(caught + allowed) + "\n")
    assert [h.split(": ", 1)[1] for h in _history_hits(code)] == caught
    prose = tmp_path / "probe.rst"
    prose.write_text("the map is no longer needed\nit is not needed any more\na Spark session\n")
    assert len(_history_hits(prose)) == 2
    assert _ALLOWED_SESSION.search("the Spark session") and not HISTORY_WORDS.search("the Spark session")
