"""Log basics: offsets, reads and holes, partitioning, checkpoints, the cache, GC, idleness."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlog
from kvlog.check import check_store
from kvlog.clock import ManualClock, SeededIdSource
from kvlog.format.bitmap import encode_offsets
from kvlog.format.commit import Commit
from kvlog.format.datafile import make_record_batch
from kvlog.format.producer_state import producer_to_json
from kvlog.log import Log, open_log
from kvlog.log.naming import checkpoint_name, commit_name
from kvlog.log.records import partition_for_key
from kvlog.meta import MetaReader
from kvlog.storage import LocalStorage
from kvlog.storage.faulty import FaultyStorage


def _recs(tag: str, count: int) -> list[tuple[bytes, bytes | None]]:
    return [(f"{tag}-{i}".encode(), None if i % 5 == 4 else f"v-{tag}-{i}".encode()) for i in range(count)]


def _state(the_log: Log) -> dict[str, Any]:
    """Everything the metadata cache knows that replay must reproduce."""

    def collect(r: MetaReader) -> dict[str, Any]:
        return {
            "version": r.version(),
            "files": dict(r.iter_files()),
            "batches": {p: list(r.iter_batches(p, 0)) for p in range(the_log.partitions)},
            "ends": {p: r.partition_end(p) for p in range(the_log.partitions)},
            "producers": sorted((producer_to_json(s) for s in r.iter_producers()), key=lambda s: s["id"]),
            "index": list(r.index_scan()),
        }

    state = the_log.snapshot(collect)
    state["records"] = {p: [(r.offset, r.key, r.value) for r in the_log.read(p)] for p in range(the_log.partitions)}
    return dict(state)


def keys_in(partition: int, partitions: int, count: int, tag: str = "key") -> list[bytes]:
    """``count`` distinct keys that :func:`partition_for_key` puts in ``partition``."""
    out: list[bytes] = []
    n = 0
    while len(out) < count:
        key = f"{tag}-{n}".encode()
        if partition_for_key(key, partitions) == partition:
            out.append(key)
        n += 1
    return out


def _fill(the_log: Log, batches: int, *, pid: int = 9) -> None:
    producer = the_log.producer(pid)
    seqs = [0] * the_log.partitions
    keys = [keys_in(p, the_log.partitions, 7) for p in range(the_log.partitions)]
    for i in range(batches):
        p = (i * 3) % the_log.partitions
        count = 1 + i % 4
        # Overwrite some keys so the index has to keep the latest one.
        producer.append(p, [(keys[p][(i + j) % 7], f"v{i}-{j}".encode()) for j in range(count)],
                        base_sequence=seqs[p])
        seqs[p] += count


# ---------------------------------------------------------------------------------------------
# Offsets and reads
# ---------------------------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 5), st.sampled_from([1, 2])), min_size=1, max_size=12))
def test_offsets_are_dense_per_partition(tmp_path_factory: pytest.TempPathFactory,
                                         batches: list[tuple[int, int, int]]) -> None:
    directory = tmp_path_factory.mktemp("dense")
    the_log = open_log(LocalStorage(directory / "root", fsync=False), cache_dir=directory / "cache",
                       partitions=3, clock=ManualClock(), ids=SeededIdSource(5))
    try:
        producers = {pid: the_log.producer(pid) for pid in (1, 2)}
        seqs: dict[tuple[int, int], int] = {}
        expected: dict[int, list[bytes]] = {p: [] for p in range(3)}
        for n, (p, count, pid) in enumerate(batches):
            keys = [f"{n}.{i}".encode() for i in range(count)]
            seq = seqs.get((pid, p), 0)
            result = producers[pid].append(p, [(k, b"x") for k in keys], base_sequence=seq)
            seqs[(pid, p)] = seq + count
            assert (result.base_offset, result.last_offset, result.duplicate) == (
                len(expected[p]), len(expected[p]) + count - 1, False)
            expected[p].extend(keys)
        for p in range(3):
            n = len(expected[p])
            assert the_log.start_offset(p) == 0
            assert the_log.end_offset(p) == n
            everything = list(the_log.read(p))
            assert [r.offset for r in everything] == list(range(n))
            assert [r.key for r in everything] == expected[p]
            assert all(r.partition == p for r in everything)
            for lo in range(n + 2):
                assert [r.offset for r in the_log.read(p, lo)] == list(range(lo, n))
                for hi in range(n + 2):
                    assert [r.offset for r in the_log.read(p, lo, hi)] == list(range(lo, min(hi, n)))
    finally:
        the_log.close()


def test_records_keep_timestamps_tombstones_and_empty_values(tmp_path: Path, make_log: Any,
                                                              clock: ManualClock) -> None:
    the_log = make_log(tmp_path / "root", tmp_path / "cache")
    producer = the_log.producer(1)
    producer.append(0, [(b"a", b"1", 123), (b"b", None), ("c", b""), (bytearray(b"d"), memoryview(b"4"))],
                    base_sequence=0)
    got = [(r.offset, r.timestamp_ms, r.key, r.value, r.is_tombstone) for r in the_log.read(0)]
    now = clock.now_ms()
    assert got == [(0, 123, b"a", b"1", False), (1, now, b"b", None, True), (2, now, b"c", b"", False),
                   (3, now, b"d", b"4", False)]


def _replace(the_log: Log, clock: ManualClock, partition: int, keep: dict[int, list[int]]) -> None:
    """Commit a replace that keeps only the given relative offsets of the live batches (by base)."""
    batches = the_log.snapshot(lambda r: list(r.iter_batches(partition, 0)))
    removed = sorted({b.file_id for b in batches if b.base in keep})
    outputs = []
    for b in batches:
        if b.base not in keep or not keep[b.base]:
            continue
        rb = the_log.read_batch(b)
        rel = keep[b.base]
        cols = [rb.column(i).to_pylist() for i in range(3)]
        outputs.append((partition, make_record_batch([cols[0][i] for i in rel], [cols[1][i] for i in rel],
                                                     [cols[2][i] for i in rel]),
                        {"base_offset": b.base, "last_offset": b.last,
                         "present": encode_offsets(rel)}))
    add = (the_log.write_data_file(1, outputs)[0],) if outputs else ()
    commit_id = the_log.new_id()
    outcome = the_log.commit(lambda v: Commit(v, commit_id, clock.now_ms(), "replace", add=add,
                                              remove=tuple(removed)))
    assert outcome.refusal is None


def test_read_skips_holes_and_continues_at_the_next_surviving_record(
    tmp_path: Path, make_log: Any, clock: ManualClock
) -> None:
    root = tmp_path / "root"
    the_log = make_log(root, tmp_path / "cache")
    producer = the_log.producer(1)
    for i in range(3):  # batches at offsets 0..4, 5..9, 10..14
        producer.append(0, [(f"k{5 * i + j}".encode(), f"v{5 * i + j}".encode()) for j in range(5)],
                        base_sequence=5 * i)
    # Keep offsets 6 and 8 of the middle batch, remove the first batch entirely.
    _replace(the_log, clock, 0, {0: [], 5: [1, 3]})
    survivors = [6, 8, 10, 11, 12, 13, 14]
    for reader in (the_log, make_log(root, tmp_path / "fresh-cache")):
        assert [r.offset for r in reader.read(0)] == survivors
        assert [r.key for r in reader.read(0)] == [f"k{o}".encode() for o in survivors]
        assert [r.offset for r in reader.read(0, 0)] == survivors
        assert [r.offset for r in reader.read(0, 3)] == survivors  # a removed offset: next survivor
        assert [r.offset for r in reader.read(0, 7)] == survivors[1:]
        assert [r.offset for r in reader.read(0, 9)] == survivors[2:]
        assert [r.offset for r in reader.read(0, 0, 9)] == [6, 8]
        assert [r.offset for r in reader.read(0, 7, 11)] == [8, 10]
        assert list(reader.read(0, 15)) == []
        assert reader.end_offset(0) == 15  # offsets are never reused
        assert reader.start_offset(0) == 5
    # The next append continues after the end, not after the last survivor.
    assert producer.append(0, [(b"k15", b"v15")], base_sequence=15).base_offset == 15
    assert [r.offset for r in the_log.read(0, 14)] == [14, 15]


def test_partition_for_is_a_fixed_function_of_the_key(tmp_path: Path, make_log: Any) -> None:
    # XXH3-64 (seed 0) of the key bytes modulo the partition count; changing the hash breaks stores.
    assert partition_for_key(b"hello", 2**64 - 1) == 10760762337991515389 % (2**64 - 1)
    expected = {b"hello": [5, 13, 389], b"user:1": [1, 1, 465], b"user:2": [2, 2, 754],
                "kéy".encode(): [1, 1, 889], b"\x00\xff": [3, 3, 83]}
    for key, parts in expected.items():
        assert [partition_for_key(key, n) for n in (8, 16, 1000)] == parts
    eight = make_log(tmp_path / "root8", tmp_path / "cache8", partitions=8)
    assert eight.partition_for("hello") == eight.partition_for(b"hello") == 5
    assert eight.partition_for("kéy") == 1
    assert eight.partition_for(bytearray(b"user:2")) == 2
    with kvlog.open(tmp_path / "store", background_compaction=False) as store:
        assert store.log.partitions == 8 and store.log.partition_for(b"user:1") == 1


# ---------------------------------------------------------------------------------------------
# Checkpoints and the metadata cache
# ---------------------------------------------------------------------------------------------
def test_checkpoint_every_checkpoint_interval_commits(tmp_path: Path, make_log: Any) -> None:
    root = tmp_path / "root"
    the_log = make_log(root, tmp_path / "cache", checkpoint_interval=3)
    _fill(the_log, 10)  # 1 registration + 10 appends = 11 commits
    assert the_log.version == 11
    names = sorted(p.name for p in (root / "log").iterdir() if not p.name.startswith("."))
    assert [n for n in names if "checkpoint" in n] == [Path(checkpoint_name(v)).name for v in (3, 6, 9)]
    assert [n for n in names if "checkpoint" not in n] == [
        *(Path(commit_name(v)).name for v in range(1, 12)), "head.json"]
    # A fresh cache loads the newest checkpoint and replays only the commits after it.
    probe = FaultyStorage(LocalStorage(root, fsync=False))
    reopened = make_log(probe, tmp_path / "fresh", checkpoint_interval=3)
    read = [e.name for e in probe.history if e.op == "read"]
    assert checkpoint_name(9) in read
    # 9: the checkpoint's own commit, read to check the checkpoint describes the root's history;
    # then the commits up to the head, which is read twice: to pass over checkpoints past it (of
    # a history a restore of the head removed), and to replay up to it.
    assert [n for n in read if n.startswith("log/") and "checkpoint" not in n] == [
        commit_name(9), commit_name(10), commit_name(11)]
    assert [e.name for e in probe.history if e.op == "read_versioned"] == ["log/head.json"] * 2
    assert _state(reopened) == _state(the_log)


@pytest.mark.parametrize("interval", [1000, 4])
def test_deleting_the_cache_rebuilds_it(tmp_path: Path, make_log: Any, interval: int) -> None:
    root = tmp_path / "root"
    the_log = make_log(root, tmp_path / "cache", checkpoint_interval=interval)
    _fill(the_log, 9)
    before = _state(the_log)
    the_log.close()
    shutil.rmtree(tmp_path / "cache")
    rebuilt = make_log(root, tmp_path / "cache", checkpoint_interval=interval)
    assert _state(rebuilt) == before
    assert len(before["index"]) > 0 and before["version"] == 10
    # The rebuilt cache goes on as before: the producer's window is there, offsets continue.
    producer = rebuilt.producer(9, epoch=0)
    assert producer.append(0, [(keys_in(0, 4, 1)[0], b"v0-0")], base_sequence=0).duplicate
    assert check_store(rebuilt) == []


def test_a_cache_from_another_store_is_reset(tmp_path: Path, make_log: Any) -> None:
    cache = tmp_path / "shared-cache"
    first = make_log(tmp_path / "a", cache)
    first.producer(1).append(partition_for_key(b"only-in-a", 4), [(b"only-in-a", b"1")], base_sequence=0)
    first.producer(2).append(partition_for_key(b"also-in-a", 4), [(b"also-in-a", b"2")], base_sequence=0)
    first.close()
    second = make_log(tmp_path / "b", cache)
    assert second.identity.store_uuid != first.identity.store_uuid
    assert second.version == 0
    assert [second.end_offset(p) for p in range(4)] == [0, 0, 0, 0]
    assert second.snapshot(lambda r: (list(r.index_scan()), list(r.iter_files()), list(r.iter_producers()))) == (
        [], [], [])
    second.producer(3).append(partition_for_key(b"only-in-b", 4), [(b"only-in-b", b"3")], base_sequence=0)
    second.close()
    again = make_log(tmp_path / "a", cache)  # back to the first store: reset and replayed
    assert [k for k, _e in again.snapshot(lambda r: list(r.index_scan()))] == [b"also-in-a", b"only-in-a"]
    assert again.version == 4
    assert sum(again.end_offset(p) for p in range(4)) == 2
    assert check_store(again) == []


# ---------------------------------------------------------------------------------------------
# Garbage collection
# ---------------------------------------------------------------------------------------------
def test_gc_deletes_orphans_and_replaced_files_after_the_delay_and_keeps_live_files(
    tmp_path: Path, make_log: Any
) -> None:
    delay = 60_000
    wall = time.time_ns() // 1_000_000
    clock = ManualClock(wall)  # GC compares storage mtimes (wall time) with the injected clock
    root = tmp_path / "root"
    # Data files of their own: the test has GC delete a replaced one and checks the live ones stay.
    the_log = make_log(root, tmp_path / "cache", log_clock=clock, file_delete_delay_ms=delay, commit_inline_bytes=0)
    producer = the_log.producer(1)
    k0, k1 = keys_in(0, 4, 2)
    for i, key in enumerate([k0, k0, k1]):  # the first batch is superseded by the second
        producer.append(0, [(key, f"v{i}".encode())], base_sequence=i)
    (other,) = keys_in(1, 4, 1)
    producer.append(1, [(other, b"v")], base_sequence=0)
    # An orphan: a data file whose commit never landed.
    orphan, _ = the_log.write_data_file(0, [(2, make_record_batch([b"o"], [b"o"], [wall]),
                                             {"producer_id": 1, "epoch": 0, "base_sequence": 0})])
    # A replaced file: the first batch of partition 0 compacted away.
    replaced = the_log.snapshot(lambda r: next(iter(r.iter_batches(0, 0)))).path
    _replace(the_log, clock, 0, {0: []})
    live = sorted(e.path for _f, e in the_log.snapshot(lambda r: list(r.iter_files())))
    assert orphan.path not in live and replaced not in live and len(live) == 3
    storage = LocalStorage(root)

    clock.advance(delay // 2)
    assert the_log.gc() == {"replaced": 0, "orphans": 0, "commits": 0}
    assert storage.exists(orphan.path) and storage.exists(replaced)

    # Past the delay by the clock: the replaced input goes. The orphan stays, because no commit
    # landed since it was written: by storage time it is not older than the delay yet (a skewed
    # clock alone cannot take a file whose commit may still be on its way).
    clock.set(time.time_ns() // 1_000_000 + delay + 5_000)
    assert the_log.gc() == {"replaced": 1, "orphans": 0, "commits": 0}
    assert not storage.exists(replaced) and storage.exists(orphan.path)
    # Once every data file is older than the delay by storage time too, the orphan goes; live
    # files, however old, stay.
    old = (wall - 2 * delay) / 1000
    for path in (root / "data").rglob("*.arrow"):
        os.utime(path, (old, old))
    assert the_log.gc() == {"replaced": 0, "orphans": 1, "commits": 0}
    assert not storage.exists(orphan.path)
    assert all(storage.exists(path) for path in live)
    assert sorted(str(p.relative_to(root)) for p in (root / "data").rglob("*.arrow")) == live
    assert [(r.offset, r.key, r.value) for r in the_log.read(0)] == [(1, k0, b"v1"), (2, k1, b"v2")]
    assert check_store(the_log) == []
    assert the_log.gc() == {"replaced": 0, "orphans": 0, "commits": 0}


def test_gc_keeps_a_file_whose_commit_is_still_coming(tmp_path: Path, make_log: Any) -> None:
    """A young unreferenced file may be an append in flight: it is not an orphan yet."""
    wall = time.time_ns() // 1_000_000
    clock = ManualClock(wall)
    root = tmp_path / "root"
    the_log = make_log(root, tmp_path / "cache", log_clock=clock, file_delete_delay_ms=60_000)
    entry, _ = the_log.write_data_file(0, [(0, make_record_batch([b"a"], [b"1"], [wall]),
                                            {"producer_id": 5, "epoch": 0, "base_sequence": 0})])
    clock.advance(59_000)
    assert the_log.gc()["orphans"] == 0
    assert LocalStorage(root).exists(entry.path)


# ---------------------------------------------------------------------------------------------
# An idle store writes nothing
# ---------------------------------------------------------------------------------------------
def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for sub in ("log", "data") if (root / sub).is_dir()
                  for p in (root / sub).rglob("*") if p.is_file())


def test_an_idle_store_writes_no_commits(tmp_path: Path) -> None:
    path = tmp_path / "store"
    options: dict[str, Any] = {"flush_interval_ms": 5, "refresh_interval_ms": 0}
    with kvlog.open(path, **options) as store:
        store.put("a", "1")
        store.put("b", "2", sync=True)
    before = _listing(path)
    store = kvlog.open(path, **options)
    opened = _listing(path)
    assert opened == before  # opening without a producer_id commits nothing
    for _ in range(5):
        assert store.get("a") == b"1"
        assert list(store.scan()) == [(b"a", b"1"), (b"b", b"2")]
        assert len(list(store.changes())) == 2 and len(store) == 2 and "b" in store
        assert store.stats()["version"] == store.log.version
        assert store.check() == []
        assert store.flush() == store.log.version
        time.sleep(0.03)  # the background flusher ticks with nothing to do
    store.close()
    assert _listing(path) == opened
    with kvlog.open(path, read_only=True) as reader:
        assert reader.get("b") == b"2"
        time.sleep(0.02)
    assert _listing(path) == opened
    log_only = open_log(path)
    try:
        assert log_only.end_offset(log_only.partition_for("a")) >= 1
        log_only.refresh()
    finally:
        log_only.close()
    assert _listing(path) == opened
