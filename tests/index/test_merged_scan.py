"""Forward scans merged from the memtable, pending runs and the B-tree (kvlog.index.merged and
the ``ScanWalk`` of ``_runs``, C and Python) agree with a model (a dict), stopped anywhere.

The store holds a B-tree of keys, then runs pending over it and unflushed writes over those,
with deletions, overwrites, expiring writes (some expired at the scan's time), values in data
files and long keys, placed at the edges of the overlay's chunks (16, 32, 64 ... entries).
Every scan is compared with the model, taking its first ``n`` pairs for ``n`` around each
chunk boundary, forward and reverse, with bounds and prefixes. A scan abandoned partway
releases its snapshot.
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from types import ModuleType

import pytest

import kvlog
from kvlog.clock import ManualClock
from kvlog.index import encode_index_key, encode_index_value
from kvlog.index.merged import FIRST_CHUNK, MAX_CHUNK
from tests.native import Native

pytestmark = pytest.mark.usefixtures("native")

BOUNDARIES = sorted({1, 2} | {c + d for c in (FIRST_CHUNK, 2 * FIRST_CHUNK, 3 * FIRST_CHUNK, 7 * FIRST_CHUNK,
                                                  MAX_CHUNK, 2 * MAX_CHUNK) for d in (-1, 0, 1)})
TTL_MS = 1_000


def _key(i: int) -> bytes:
    return b"k%06d" % i


class Model:
    """The store's contents as a dict, with the expiry of each expiring key."""

    def __init__(self, store: kvlog.Store, clock: ManualClock) -> None:
        self.store = store
        self.clock = clock
        self.values: dict[bytes, bytes] = {}
        self.expires: dict[bytes, int] = {}

    def put(self, key: bytes, value: bytes, ttl: bool = False) -> None:
        self.store.put(key, value, ttl_ms=TTL_MS if ttl else None)
        self.values[key] = value
        if ttl:
            self.expires[key] = self.clock.now_ms() + TTL_MS
        else:
            self.expires.pop(key, None)

    def delete(self, key: bytes) -> None:
        self.store.delete(key)
        self.values.pop(key, None)
        self.expires.pop(key, None)

    def live(self) -> list[tuple[bytes, bytes]]:
        now = self.clock.now_ms()
        return sorted((k, v) for k, v in self.values.items() if k not in self.expires or now < self.expires[k])


def _fill(path: Path, *, runs: bool, memtable: bool) -> tuple[kvlog.Store, Model]:
    clock = ManualClock()
    store = kvlog.open(path, partitions=2, clock=clock, inline_value_bytes=64, background_compaction=False,
                       flush_interval_ms=0, index_run_limit=64)
    model = Model(store, clock)
    for i in range(0, 3000, 2):
        big = i % 331 == 0
        model.put(_key(i), b"big%d-" % i * (30 if big else 1), ttl=i % 97 == 0)
    model.put(_key(1200) + b"L" * 600, b"long-a")  # long keys in the B-tree
    model.put(_key(1200) + b"M" * 600, b"long-b")
    model.put(_key(2601) + b"L" * 600, b"long-c")
    store.flush()
    store.log.index.settle()
    if runs:
        for r in range(3):  # three runs pending, each touching chunk edges
            for i in range(r, 3000, 15 + r):
                if i % 4 == 1:
                    model.delete(_key(i - 1))
                else:
                    model.put(_key(i), b"run%d-%d" % (r, i) * (40 if i % 113 == 0 else 1), ttl=i % 29 == 0)
            store.flush()
    clock.advance(TTL_MS // 2)
    if memtable:
        for i in range(1, 3000, 13):
            if i % 3 == 0:
                model.delete(_key(i - 1))
            else:
                model.put(_key(i), b"mem%d" % i, ttl=i % 7 == 0)
        model.put(_key(1200) + b"N" * 600, b"long-mem")
        model.delete(_key(2601) + b"L" * 600)
    clock.advance(TTL_MS // 2)  # the first expiring writes expire, those of the memtable not
    return store, model


def _runs_pending(store: kvlog.Store) -> int:
    reader = store.log.index.reader()
    try:
        return reader.runs_pending()
    finally:
        reader.close()


@pytest.fixture(params=["tree", "runs", "runs+memtable"])
def filled(request: pytest.FixtureRequest, tmp_path: Path, native: Native) -> Iterator[tuple[kvlog.Store, Model]]:
    store, model = _fill(tmp_path / "store", runs=request.param != "tree", memtable=request.param == "runs+memtable")
    if request.param != "tree":
        assert _runs_pending(store) >= 3
    yield store, model
    store.close(flush=False)


def test_full_scans_match_the_model(filled: tuple[kvlog.Store, Model]) -> None:
    store, model = filled
    expected = model.live()
    assert list(store.scan()) == expected
    assert list(store.scan(reverse=True)) == expected[::-1]


@pytest.mark.parametrize("n", BOUNDARIES)
def test_scans_stopped_at_every_chunk_boundary_match_the_model(filled: tuple[kvlog.Store, Model], n: int) -> None:
    store, model = filled
    expected = model.live()
    for start_at in (0, 1, 17, 600, 1199, 2400):
        start = _key(start_at)
        tail = [p for p in expected if p[0] >= start]
        assert list(islice(store.scan(start=start), n)) == tail[:n]
        head = [p for p in expected if p[0] < start]
        assert list(islice(store.scan(stop=start, reverse=True), n)) == head[::-1][:n]


@pytest.mark.parametrize(("start", "stop", "prefix"), [
    (None, None, b"k0012"), (_key(1199), _key(1201), None), (_key(1200), _key(1200) + b"M", None),
    (_key(1200) + b"L" * 600, None, None), (None, _key(1200) + b"L" * 700, None), (_key(5), _key(5), None),
    (_key(900), _key(100), None), (b"k00", b"k01", b"k0"), (None, None, b"zz"), (_key(2999), None, None),
])
def test_bounds_and_prefixes_match_the_model(filled: tuple[kvlog.Store, Model], start: bytes | None,
                                             stop: bytes | None, prefix: bytes | None) -> None:
    store, model = filled
    expected = [(k, v) for k, v in model.live() if (start is None or k >= start) and (stop is None or k < stop)
                and (prefix is None or k.startswith(prefix))]
    assert list(store.scan(start, stop, prefix=prefix)) == expected
    assert list(store.scan(start, stop, prefix=prefix, reverse=True)) == expected[::-1]
    for n in (1, FIRST_CHUNK, FIRST_CHUNK + 1):
        assert list(islice(store.scan(start, stop, prefix=prefix), n)) == expected[:n]


def test_one_key_scans_from_every_start_match_the_model(filled: tuple[kvlog.Store, Model]) -> None:
    store, model = filled
    expected = model.live()
    keys = [k for k, _ in expected]
    for i in range(0, 3010, 7):
        start = _key(i)
        tail = [p for p in expected if p[0] >= start]
        assert list(islice(store.scan(start=start), 1)) == tail[:1]
        assert list(store.scan(start=start, stop=start + b"\x00")) == [p for p in tail[:1] if p[0] == start]
    for at in (0, 1, 600, len(keys) - 2):
        assert list(store.scan(start=keys[at], stop=keys[at + 1])) == [expected[at]]


@pytest.mark.parametrize("n", BOUNDARIES)
def test_scans_with_a_stop_at_every_chunk_boundary_match_the_model(filled: tuple[kvlog.Store, Model],
                                                                  n: int) -> None:
    store, model = filled
    expected = model.live()
    for start_at in (0, 17, 1199):
        tail = [p for p in expected if p[0] >= _key(start_at)]
        if n < len(tail):
            assert list(store.scan(start=_key(start_at), stop=tail[n][0])) == tail[:n]


def _readers(store: kvlog.Store) -> int:
    """The LMDB read transactions open on the store's cache."""
    table = store.log.index._env.env.readers()  # noqa: SLF001 - the reader slots the scans hold
    return 0 if "no active readers" in table else table.count("\n") - 1


def _take(scans: list[Iterator[tuple[bytes, bytes]]]) -> None:
    for scan in scans:
        next(scan)


def test_an_abandoned_scan_releases_its_snapshot(filled: tuple[kvlog.Store, Model]) -> None:
    store, _model = filled
    before = _readers(store)
    slots = store.log.index._env.env.max_readers()  # noqa: SLF001
    for _ in range(2 * slots):  # more than the slots there are: each must be released
        _take([store.scan(start=_key(100))])
    assert _readers(store) == before
    scans = [store.scan(start=_key(i)) for i in range(5)]
    assert _readers(store) >= before + 5  # each holds its snapshot (two transactions with runs pending)
    _take(scans)
    scans.clear()
    gc.collect()
    assert _readers(store) == before


def test_a_scan_of_a_closed_store_raises_at_its_next_step(tmp_path: Path) -> None:
    store, model = _fill(tmp_path / "store", runs=True, memtable=False)
    scan = store.scan()
    first = [next(scan) for _ in range(3)]
    assert first == model.live()[:3]
    store.close()
    with pytest.raises(kvlog.StoreClosedError):
        next(scan)


def test_a_scan_never_started_releases_its_snapshot(filled: tuple[kvlog.Store, Model]) -> None:
    store, _model = filled
    before = _readers(store)
    for _ in range(2 * store.log.index._env.env.max_readers()):  # noqa: SLF001
        store.scan(start=_key(100))
    gc.collect()
    assert _readers(store) == before
    assert list(islice(store.scan(start=_key(100)), 2)) == [p for p in _model.live() if p[0] >= _key(100)][:2]


@pytest.mark.parametrize("taken", [0, 1, 40])
def test_closing_the_store_mid_scan_raises_at_the_next_step(filled: tuple[kvlog.Store, Model], taken: int) -> None:
    store, model = filled
    scan = store.scan(start=_key(17))
    first = [next(scan) for _ in range(taken)]
    assert first == [p for p in model.live() if p[0] >= _key(17)][:taken]
    store.close(flush=False)
    with pytest.raises(kvlog.StoreClosedError):
        next(scan)


def _walk_all(runs: ModuleType, source: list[tuple[bytes, bytes]], overlay: list[tuple[bytes, object]],
              upper: bytes | None, now_ms: int) -> list[object]:
    """Every step of a walk: its pairs, then why it stopped and what it holds."""
    walk = runs.ScanWalk(iter(source), overlay, 0, True, upper, None, now_ms, None)
    pairs = list(walk)
    error = walk.error
    return [pairs, walk.state, walk.held, walk.item, walk.resume, walk.at,
            None if error is None else (type(error), str(error))]


def test_the_scan_walks_of_both_twins_agree() -> None:
    """The C walk and its twin stop at the same place for the same reason, on every kind of
    entry: inline, in a data file, expired or not, damaged, a long key, past the bound."""
    c, twin = importlib.import_module("kvlog.index._runs"), importlib.import_module("kvlog.index._runs_py")
    now = 1_000
    entries = {
        b"a": encode_index_value(b"a", 1, 2, b"va"),
        b"b": encode_index_value(b"b", 1, 3, None),
        b"c": encode_index_value(b"c", 1, 4, b"vc", expires_ms=now),
        b"d": encode_index_value(b"d", 1, 5, b"vd", expires_ms=now + 1),
        b"e": b"\x00" + encode_index_value(b"e", 1, 6, b"ve")[1:],
    }
    long_key = b"f" * 600
    source_all = sorted(entries.items()) + [(encode_index_key(long_key), encode_index_value(long_key, 1, 7, b"vf"))]
    overlays: list[list[tuple[bytes, object]]] = [[], [(b"a", None)], [(b"a", b"new"), (b"c", b"alive")],
                                                   [(b"0", (1, 2, None))], [(b"cc", b"x"), (b"z", b"past")]]
    for skip in range(len(source_all) + 1):
        source = [p for i, p in enumerate(source_all) if i != skip and (skip > 0 or i != 1)]
        for overlay in overlays:
            for upper in (None, b"c", b"d0", b"zz"):
                assert _walk_all(c, source, overlay, upper, now) == _walk_all(twin, source, overlay, upper, now)


def _fill_many_runs(path: Path) -> tuple[kvlog.Store, Model, list[list[bytes]]]:
    """A B-tree of the even keys under ten runs: dense and sparse, overlapping and disjoint,
    before and after the B-tree's keys, deleting its keys and writing keys anew, the newer runs
    over the older ones' keys, with expiring entries and values in data files; and the keys of
    each run."""
    clock = ManualClock()
    store = kvlog.open(path, partitions=2, clock=clock, inline_value_bytes=64, background_compaction=False,
                       flush_interval_ms=0, index_run_limit=64)
    model = Model(store, clock)
    for i in range(200, 2200, 2):
        model.put(_key(i), b"tree%d" % i * (20 if i % 251 == 0 else 1), ttl=i % 89 == 0)
    store.flush()
    store.log.index.settle()
    plans: list[list[tuple[int, str]]] = [
        [(i, "put") for i in range(0, 2400, 3)],                  # dense, over the whole range
        [(i, "put") for i in range(1000, 1040)],                  # a disjoint block
        [(i, "delete") for i in range(600, 700, 2)],              # deletions of the B-tree's keys
        [(i, "put") for i in range(0, 2400, 6)],                  # the first run's keys anew
        [(1500, "put")],                                          # one key
        [(i, "put") for i in range(2300, 2400)],                  # past the B-tree's last key
        [(i, "put") for i in range(0, 150, 5)],                   # before its first key
        [(i, "put") for i in range(600, 700, 4)],                 # some deleted keys written anew
        [(i, "delete") for i in range(1000, 1040, 3)] + [(i, "put") for i in range(1040, 1100, 7)],
        [(i, "put" if i % 2 else "delete") for i in range(1490, 1510)],
    ]
    keys = []
    for r, plan in enumerate(plans):
        for i, op in plan:
            if op == "delete":
                model.delete(_key(i))
            else:
                model.put(_key(i), b"run%d-%d" % (r, i) * (30 if i % 97 == 0 else 1), ttl=(i + r) % 41 == 0)
        keys.append([_key(i) for i, _op in plan])
        store.flush()
    clock.advance(TTL_MS)  # the expiring entries of the B-tree and of the runs have expired
    for i in range(1495, 1505):
        model.put(_key(i), b"mem%d" % i, ttl=i % 3 == 0)  # the memtable over them, not expired
    return store, model, keys


@pytest.fixture
def many_runs(tmp_path: Path, native: Native) -> Iterator[tuple[kvlog.Store, Model, list[list[bytes]]]]:
    store, model, keys = _fill_many_runs(tmp_path / "store")
    assert _runs_pending(store) == 10
    yield store, model, keys
    store.close(flush=False)


def test_scans_over_many_runs_from_and_to_each_runs_edges_match_the_model(
        many_runs: tuple[kvlog.Store, Model, list[list[bytes]]]) -> None:
    store, model, keys = many_runs
    expected = model.live()
    assert list(store.scan()) == expected
    edges = sorted({e for run in keys for k in (run[0], run[-1]) for e in (k[:-1], k, k + b"\x00")}
                   | {b"", b"k", b"l"})
    for start in edges:
        tail = [p for p in expected if p[0] >= start]
        for n in (1, 2, FIRST_CHUNK, 3 * FIRST_CHUNK + 1):
            assert list(islice(store.scan(start=start), n)) == tail[:n]
        for stop in edges:
            if stop > start:
                within = [p for p in tail if p[0] < stop]
                assert list(islice(store.scan(start=start, stop=stop), 40)) == within[:40]
                assert list(store.scan(start=start, stop=stop)) == within
    assert list(store.scan(prefix=_key(1000)[:-1])) == [p for p in expected if p[0].startswith(_key(1000)[:-1])]


def test_one_key_scans_over_many_runs_from_every_start_match_the_model(
        many_runs: tuple[kvlog.Store, Model, list[list[bytes]]]) -> None:
    store, model, _keys = many_runs
    expected = model.live()
    for i in range(0, 2410):
        start = _key(i)
        tail = [p for p in expected if p[0] >= start][:1]
        assert list(islice(store.scan(start=start), 1)) == tail
        assert list(store.scan(start=start, stop=start + b"\x00")) == [p for p in tail if p[0] == start]
