"""The Python twins give what the C extensions give, on random input; kvlog._native picks one.

Every entry point is called with the same arguments on the extension and on its twin: equal
results, equal tables and buffers written, or an error of the same class from both. The twins'
signatures are those of the extensions' stubs (``.pyi``), which mypy checks callers against.
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlog.index import MemTable
from kvlog.index.entry import encode_index_value
from tests.native import MODULES, implementation

REPO = Path(__file__).resolve().parent.parent
C = implementation("c")
PY = implementation("python")
EXAMPLES = int(os.environ.get("KVLOG_FUZZ_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same(call: Callable[[Any], Any]) -> Any:
    """``call`` on the C modules and on the twins: equal results or the same error class."""
    outcomes = []
    for modules in (C, PY):
        try:
            outcomes.append(("ok", call(modules)))
        except Exception as e:  # noqa: BLE001 - the class is what is compared
            outcomes.append(("error", type(e)))
    assert outcomes[0][0] == outcomes[1][0], outcomes
    if outcomes[0][0] == "ok":
        assert _comparable(outcomes[0][1]) == _comparable(outcomes[1][1])
    else:
        assert outcomes[0][1] is outcomes[1][1], outcomes
    return outcomes[0][1]


def _comparable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | list):
        return [_comparable(v) for v in value]
    return value


# -- the stubs ------------------------------------------------------------------------------------

def _stub_functions(stub: ast.Module) -> list[tuple[str | None, ast.FunctionDef]]:
    """(class name or None, function) of each function a stub declares."""
    found: list[tuple[str | None, ast.FunctionDef]] = []
    for node in stub.body:
        if isinstance(node, ast.FunctionDef):
            found.append((None, node))
        elif isinstance(node, ast.ClassDef):
            found.extend((node.name, f) for f in node.body if isinstance(f, ast.FunctionDef))
    return found


@pytest.mark.parametrize("key", sorted(MODULES))
def test_each_twin_has_the_stubs_functions_and_parameters(key: str) -> None:
    compiled, _twin, _holders = MODULES[key]
    stub = ast.parse((REPO / (compiled.replace(".", "/") + ".pyi")).read_text())
    functions = _stub_functions(stub)
    assert functions
    for cls, node in functions:
        for modules in (C, PY):
            owner = getattr(modules, key) if cls is None else getattr(getattr(modules, key), cls)
            assert callable(getattr(owner, node.name)), (modules.name, cls, node.name)
        twin = getattr(PY, key) if cls is None else getattr(getattr(PY, key), cls)
        wanted = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg != "self"]
        wanted += [a.arg for a in (node.args.vararg, node.args.kwarg) if a is not None]
        got = [name for name in inspect.signature(getattr(twin, node.name)).parameters if name != "self"]
        assert got == wanted, (key, cls, node.name)
    declared = {node.name for node in stub.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    public = {name for name in dir(getattr(C, key)) if not name.startswith("_")}
    assert public == declared  # the stub is complete: it declares every name the extension has


# -- compaction kernels -----------------------------------------------------------------------------

@SETTINGS
@given(st.lists(st.binary(max_size=40), max_size=60), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_fingerprints_are_equal(keys: list[bytes], first: int, second: int) -> None:
    ends = np.cumsum([0] + [len(k) for k in keys]).astype(np.int64)
    data = np.frombuffer(b"".join(keys), dtype=np.uint8)
    material = np.arange(20, dtype=np.uint32) * np.uint32(2654435761)

    def call(m: Any) -> Any:
        hi, lo = np.zeros(len(keys), dtype=np.uint64), np.zeros(len(keys), dtype=np.uint32)
        m.kernels.nh_fingerprints(data, ends, material, first, second, hi, lo)
        return hi, lo

    same(call)


@SETTINGS
@given(st.integers(1, 40), st.integers(0, 45), st.lists(
    st.lists(st.tuples(st.integers(1, 12), st.integers(0, 2), st.integers(0, 99)), max_size=40), max_size=4))
def test_table_kernels_write_equal_tables(slots: int, capacity: int, batches: list[list[tuple[int, int, int]]]) -> None:
    tables = {id(C): np.zeros(2 * slots, dtype=np.uint64), id(PY): np.zeros(2 * slots, dtype=np.uint64)}
    sizes = {id(C): 0, id(PY): 0}
    for batch in batches:
        # Few distinct fingerprints whose home rows collide: long probes, repeats, a full table.
        hi = np.array([h * 0x9E3779B97F4A7C15 % 2**64 for h, _l, _r in batch], dtype=np.uint64)
        lo = np.array([lo for _h, lo, _r in batch], dtype=np.uint32)
        relative = np.array([r for _h, _l, r in batch], dtype=np.int64)

        def insert(m: Any, hi: Any = hi, lo: Any = lo, relative: Any = relative) -> Any:
            mapped, sizes[id(m)] = m.kernels.insert_rows(tables[id(m)], slots, hi, lo, relative, sizes[id(m)], capacity)
            return mapped, sizes[id(m)], tables[id(m)]

        def lookup(m: Any, hi: Any = hi, lo: Any = lo) -> Any:
            out = np.zeros(len(hi), dtype=np.int64)
            m.kernels.lookup_rows(tables[id(m)], slots, hi, lo, out)
            return out

        def values(m: Any) -> Any:
            out = np.zeros(slots, dtype=np.uint32)
            return m.kernels.mapped_values(tables[id(m)], out), out

        same(insert)
        same(lookup)
        same(values)


# -- column loops -----------------------------------------------------------------------------------

@SETTINGS
@given(st.lists(st.none() | st.binary(max_size=12), max_size=40), st.none() | st.lists(st.integers(0, 39), max_size=40))
def test_pack_binary_is_equal(items: list[bytes | None], order: list[int] | None) -> None:
    positions = None if order is None else np.array(order, dtype=np.int64)
    same(lambda m: m.columns.pack_binary(items, positions))


@SETTINGS
@given(st.lists(st.binary(min_size=1, max_size=10), max_size=30), st.lists(st.binary(max_size=20), max_size=30),
       st.integers(-1, 20), st.data())
def test_index_values_are_equal(keys: list[bytes], values: list[bytes], inline_limit: int, data: st.DataObject) -> None:
    n = min(len(keys), len(values))
    keys, values = keys[:n], values[:n]
    rows = np.array(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=n if n else 0)), dtype=np.int64)
    key_ends = np.cumsum([0] + [len(k) for k in keys]).astype(np.int32)
    value_ends = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    partitions = np.arange(len(rows), dtype=np.uint16)
    positions = np.arange(len(rows), dtype=np.int64) * 7
    same(lambda m: m.columns.index_values(key_ends, b"".join(keys), value_ends, b"".join(values), rows,
                                          partitions, positions, inline_limit))


@SETTINGS
@given(st.lists(st.binary(max_size=12).map(lambda b: bytes(x % 3 for x in b)), max_size=80))
def test_latest_rows_are_equal(keys: list[bytes]) -> None:
    ends = np.cumsum([0] + [len(k) for k in keys]).astype(np.int32)
    same(lambda m: m.columns.latest_rows(ends, b"".join(keys)))


# -- index runs and values ----------------------------------------------------------------------

def _run_inputs(keys: list[bytes], seed: int) -> tuple[Any, ...]:
    values = [bytes([i % 256]) * ((i * 7 + seed) % 12) for i in range(len(keys))]
    n = len(keys)
    key_ends = np.cumsum([0] + [len(k) for k in keys]).astype(np.int32)
    value_ends = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    live = np.array([(i + seed) % 5 != 0 for i in range(n)], dtype=np.uint8)
    inputs = (key_ends, b"".join(keys), value_ends, b"".join(values), np.arange(n, dtype=np.int64),
              np.full(n, seed % 65536, dtype=np.uint16), np.arange(n, dtype=np.int64) * 3, live, 6)
    if seed % 2:  # some entries expire (flag 4 and the expiry after the head)
        expires = np.arange(n, dtype=np.int64) * 1_000 - seed
        expiring = np.array([(i + seed) % 3 == 0 for i in range(n)], dtype=np.uint8)
        return (*inputs, expires, expiring)
    return inputs


@SETTINGS
@given(st.lists(st.binary(min_size=1, max_size=8), max_size=30, unique=True).map(sorted), st.integers(0, 1000),
       st.binary(max_size=9), st.none() | st.binary(max_size=4), st.none() | st.binary(max_size=4),
       st.integers(-1, 10), st.booleans(), st.integers(0, 400), st.binary(max_size=3))
def test_runs_are_equal(keys: list[bytes], seed: int, probe: bytes, lower: bytes | None, upper: bytes | None,
                        limit: int, reverse: bool, flip: int, patch: bytes) -> None:
    run = same(lambda m: m.runs.build(*_run_inputs(keys, seed)))
    damaged = bytearray(run)
    if damaged:
        at = flip % len(damaged)
        damaged[at:at + len(patch)] = patch
    for candidate in (run, bytes(damaged)):
        same(lambda m, r=candidate: m.runs.find(r, probe))
        same(lambda m, r=candidate: m.runs.find_first([r, run], probe))
        same(lambda m, r=candidate: m.runs.entries(r, lower, upper, limit, reverse))


def _merge_all(m: Any, front: list[tuple[bytes, Any]], runs: list[bytes], lower: bytes | None,
               upper: bytes | None, now_ms: int, sizes: list[int]) -> list[Any]:
    """Every chunk of a RunMerge of ``runs`` under ``front``, of the sizes given (then of 7),
    and its done flag, until it is done."""
    merge = m.runs.RunMerge(front, runs, lower, upper, now_ms)
    out: list[Any] = []
    for size in sizes + [7] * 200:
        chunk, done = merge.chunk(size)
        assert len(chunk) <= size and (done or len(chunk) == size)
        out.append((chunk, done))
        if done:
            return out
    raise AssertionError("a merge that never ends")


@SETTINGS
def _scan_item(lmdb_key: bytes, value: bytes, now_ms: int) -> Any:
    """A run entry as a scan reads it: its inline value, ``(partition, offset, expiry)`` for a
    value in a data file, or None for a deletion (an empty value) or an entry expired at ``now_ms``."""
    if not value:
        return None
    _key, partition, offset, inline_value, expires = C.runs.decode(lmdb_key, value)
    if expires is not None and now_ms >= expires:
        return None
    return inline_value if inline_value is not None else (partition, offset, expires)


@given(st.lists(st.tuples(st.lists(st.binary(min_size=1, max_size=3), max_size=25, unique=True).map(sorted),
                          st.integers(0, 1000)), max_size=5),
       st.lists(st.binary(min_size=1, max_size=3), max_size=12, unique=True).map(sorted),
       st.none() | st.binary(max_size=3), st.none() | st.binary(max_size=3), st.integers(-5, 30_000),
       st.lists(st.integers(1, 9), max_size=4), st.integers(-1, 4), st.integers(0, 4000), st.binary(max_size=3))
def test_run_merges_are_equal_and_match_the_newest_entries(
        specs: list[tuple[list[bytes], int]], front_keys: list[bytes], lower: bytes | None, upper: bytes | None,
        now_ms: int, sizes: list[int], damage: int, flip: int, patch: bytes) -> None:
    runs = [same(lambda m, k=keys, s=seed: m.runs.build(*_run_inputs(k, s))) for keys, seed in specs]
    front: list[tuple[bytes, Any]] = [(k, b"front" + k if i % 3 else "entry") for i, k in enumerate(front_keys)]
    merged = same(lambda m: _merge_all(m, front, runs, lower, upper, now_ms, sizes))
    newest: dict[bytes, Any] = {}
    for run in reversed(runs):  # oldest first: the newer runs' entries win
        newest.update((key, _scan_item(key, value, now_ms))
                      for key, value in C.runs.entries(run, lower, upper, -1, False))
    newest.update(front)
    assert [pair for chunk, _done in merged for pair in chunk] == sorted(newest.items())
    if 0 <= damage < len(runs) and runs[damage]:
        damaged = bytearray(runs[damage])
        at = flip % len(damaged)
        damaged[at:at + len(patch)] = patch
        spoiled = [bytes(damaged) if i == damage else run for i, run in enumerate(runs)]
        same(lambda m: _merge_all(m, front, spoiled, lower, upper, now_ms, sizes))


def test_run_merges_refuse_what_they_cannot_read() -> None:
    run = C.runs.build(*_run_inputs([b"a", b"b"], 2))
    same(lambda m: m.runs.RunMerge([], [run], "a", None, 0))
    same(lambda m: m.runs.RunMerge((), [run], None, None, 0))
    same(lambda m: m.runs.RunMerge([], [run], None, None, 0).chunk(0))
    same(lambda m: m.runs.RunMerge([], [run, 5], None, None, 0).chunk(4))
    same(lambda m: m.runs.RunMerge([(b"a", b"x"), ("b", b"y")], [run], None, None, 0).chunk(4))
    same(lambda m: m.runs.RunMerge([], [run[:-1]], None, None, 0).chunk(4))
    # Entries each sound, in the wrong order: the merge finds it as it steps from one to the next.
    pairs = C.runs.entries(C.runs.build(*_run_inputs([b"a", b"b", b"c"], 2)), None, None, -1, False)
    backwards = _raw_run([pairs[0], pairs[2], pairs[1]])
    for sizes in ([1, 1, 1], [3]):
        for m in (C, PY):
            with pytest.raises(ValueError):
                _merge_all(m, [], [backwards], None, None, 0, sizes)


def _raw_run(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """A run of ``pairs`` in the order given (the layout of kvlog.index.runs, unchecked)."""
    keys = np.cumsum([len(k) for k, _v in pairs]).astype("<u4").tobytes()
    values = np.cumsum([len(v) for _k, v in pairs]).astype("<u4").tobytes()
    return (np.array([0x3252564B, len(pairs)], dtype="<u4").tobytes() + keys + values
            + b"".join(k for k, _v in pairs) + b"".join(v for _k, v in pairs))


@SETTINGS
@given(st.binary(min_size=1, max_size=20), st.integers(0, 65535), st.integers(0, 2**63), st.none() | st.binary(max_size=20),
       st.integers(0, 60), st.binary(max_size=2), st.none() | st.integers(-(2**63) + 1, 2**63 - 1))
def test_index_values_decode_equally(key: bytes, partition: int, offset: int, inline: bytes | None, at: int,
                                     patch: bytes, expires: int | None) -> None:
    value = bytearray(encode_index_value(key, partition, offset, inline, expires))
    value[at:at + len(patch)] = patch
    same(lambda m: m.runs.decode(key, bytes(value)))
    same(lambda m: m.runs.inline(key, bytes(value)))
    same(lambda m: m.runs.crc32c(bytes(value), offset % 2**32))


@pytest.fixture(scope="module")
def lmdb_file(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    from tests.format.test_fuzz_extensions import _small_lmdb

    return _small_lmdb(tmp_path_factory.mktemp("lmdb"))


@SETTINGS
@given(st.integers(0, 2**32 - 1))
def test_check_lmdb_finds_the_same_damage(lmdb_file: bytes, seed: int) -> None:
    from tests.format.test_fuzz_extensions import NAMES

    rng = np.random.default_rng(seed)
    bad = bytearray(lmdb_file)
    for _ in range(int(rng.integers(0, 3))):
        at = int(rng.integers(0, len(bad) - 8))
        patch = rng.bytes(int(rng.integers(1, 9)))
        bad[at:at + len(patch)] = patch
    same(lambda m: m.cache_check.check_lmdb(bytes(bad), *NAMES))


# -- the write buffer -------------------------------------------------------------------------------

@SETTINGS
@given(st.lists(st.tuples(st.binary(max_size=4), st.binary(max_size=8)), max_size=30), st.integers(0, 200))
def test_write_buffers_hold_the_same_records(puts: list[tuple[bytes, bytes]], trigger: int) -> None:
    def call(m: Any) -> Any:
        table = MemTable()
        ticks = iter(range(10**6))
        buffer = m.WriteBuffer(table, table.lock, lambda: next(ticks), 10)
        buffer.trigger = trigger
        reached = [buffer.put(k, v) for k, v in puts]
        return reached, buffer.keys, buffer.values, buffer.stamps, buffer.buffered_bytes, sorted(table.front.items())

    same(call)


# -- the choice -------------------------------------------------------------------------------------

def _child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def test_kvlog_pure_python_forces_every_twin_without_a_warning() -> None:
    done = _child("import kvlog, kvlog._native as n; print(sorted(set(n.active().values())), len(n.active()))",
                  KVLOG_PURE_PYTHON="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("]")[0] + "]" == "['python']" and done.stdout.split()[-1] == str(len(MODULES))
    assert "compiled extensions" not in done.stderr


def test_missing_extensions_fall_back_with_one_warning() -> None:
    blocked = [compiled for compiled, _twin, _holders in MODULES.values()]
    code = ("import sys, logging; logging.basicConfig(); "
            f"sys.modules.update(dict.fromkeys({blocked!r})); "
            "import kvlog, kvlog._native as n; print(sorted(set(n.active().values())))")
    done = _child(code, KVLOG_PURE_PYTHON="")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['python']"
    assert done.stderr.count("kvlog runs without its compiled extensions") == 1, done.stderr


def test_built_extensions_are_used() -> None:
    done = _child("import kvlog, kvlog._native as n; print(sorted(set(n.active().values())))", KVLOG_PURE_PYTHON="")
    assert done.returncode == 0 and done.stdout.strip() == "['c']", done.stdout + done.stderr


def test_an_extension_that_does_not_build_does_not_fail_the_build(tmp_path: Path) -> None:
    """No C compiler: ``setup.py build_ext`` says so in one line per extension and succeeds."""
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "MANIFEST.in"):
        (tmp_path / name).write_bytes((REPO / name).read_bytes())
    for source in list(REPO.glob("kvlog/**/*.c")) + list(REPO.glob("kvlog/**/*.h")):
        target = tmp_path / source.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "temp")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "CC": str(tmp_path / "no-compiler"), "LDSHARED": str(tmp_path / "no-compiler")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    failed = [line for line in done.stderr.splitlines() if line.startswith("kvlog: building ")]
    assert len(failed) == len(MODULES), done.stderr
    assert all("pure-Python twin" in line for line in failed)
    assert not list((tmp_path / "lib").rglob("*.so"))
