"""The key index's interface (KeyIndex) on an LMDB cache of its own: which layer answers a
lookup, how a scan lays the memtable and the runs over the B-tree, and that settling the runs
into the B-tree changes no answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from kvlog.index import (
    STALE,
    IndexEntry,
    IndexReader,
    KeyIndex,
    check_cache_file,
    index_records,
    runs_pending,
)
from kvlog.meta import LmdbEnv, MetaTxn, acquire_env, release_env

INLINE = 8


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def env(tmp_path: Path) -> Iterator[LmdbEnv]:
    the_env = acquire_env(tmp_path / "cache", check_cache_file)
    yield the_env
    release_env(the_env)


def write(env: LmdbEnv, entries: dict[bytes, bytes | None], first_offset: int, *, run: bool) -> None:
    """Index ``entries`` (None: a deletion) at consecutive offsets of partition 0, as one run or
    straight into the B-tree."""
    keys = pa.array(list(entries), pa.binary())
    values = pa.array(list(entries.values()), pa.binary())
    offsets = np.arange(first_offset, first_offset + len(entries), dtype=np.int64)
    env.write(lambda txn: index_records(MetaTxn(env, txn), 0, keys, values, offsets, INLINE,
                                        1 if run else 0))


def layered(env: LmdbEnv, run_limit: int = 32) -> tuple[KeyIndex, Clock]:
    """An index whose keys are answered by each layer in turn (see the assertions below)."""
    clock = Clock()
    index = KeyIndex(env, run_limit=run_limit, apply_lock=threading.RLock(), monotonic_s=clock)
    write(env, {b"a": b"tree", b"b": b"tree", b"c": b"tree", b"d": b"tree", b"e": b"tree",
                b"f": b"tree", b"g": b"tree", b"h": b"tree-value-not-inline"}, 0, run=False)
    write(env, {b"a": b"run0", b"b": b"run0", b"c": b"run0", b"d": b"run0", b"x": b"run0"}, 100, run=True)
    write(env, {b"a": b"run1", b"b": b"run1", b"c": b"run1", b"f": None, b"y": b"run1"}, 200, run=True)
    with index.lock:
        index.memtable.write([(b"a", b"frozen"), (b"b", b"frozen"), (b"g", None)])
        index.memtable.freeze()
        index.memtable.write([(b"a", b"front"), (b"z", b"front"), (b"x", None)])
    return index, clock


def test_lookup_takes_memtable_then_frozen_then_runs_newest_first_then_the_btree(env: LmdbEnv) -> None:
    index, _clock = layered(env)
    assert index.lookup(b"a") == b"front"
    assert index.lookup(b"b") == b"frozen"
    assert index.lookup(b"c") == b"run1"
    assert index.lookup(b"d") == b"run0"
    assert index.lookup(b"e") == b"tree"
    assert index.lookup(b"f") is None  # deleted by the newest run
    assert index.lookup(b"g") is None  # deleted in the frozen memtable
    assert index.lookup(b"x") is None  # deleted in the front memtable
    assert index.lookup(b"y") == b"run1" and index.lookup(b"z") == b"front"
    assert index.lookup(b"absent") is None
    assert index.lookup(b"h") == IndexEntry(0, 7, None)  # the value is in a data file
    with index.lock:
        index.memtable.retire()  # the flush is applied: the index answers for its keys
    assert index.lookup(b"b") == b"run1"
    assert index.lookup(b"g") == b"tree"


def test_lookup_past_its_deadline_answers_stale_unless_the_memtable_holds_the_key(env: LmdbEnv) -> None:
    index, clock = layered(env)
    clock.now = 10.0
    assert index.lookup(b"c", 10.0) is STALE
    assert index.lookup(b"absent", 5.0) is STALE
    assert index.lookup(b"a", 10.0) == b"front"
    assert index.lookup(b"x", 10.0) is None
    assert index.lookup(b"c", 10.5) == b"run1"


@contextmanager
def _reader(index: KeyIndex) -> Iterator[IndexReader]:
    reader = index.reader()
    try:
        yield reader
    finally:
        reader.close()


def resolve(key: bytes, entry: IndexEntry, reader: IndexReader) -> bytes:
    assert isinstance(reader, IndexReader)
    return b"resolved %s at %d" % (key, entry.offset)


EXPECTED = [
    (b"a", b"front"), (b"b", b"frozen"), (b"c", b"run1"), (b"d", b"run0"), (b"e", b"tree"),
    (b"h", b"resolved h at 7"), (b"y", b"run1"), (b"z", b"front"),
]


def test_scan_lays_memtable_and_runs_over_the_btree_and_drops_deletions(env: LmdbEnv) -> None:
    index, _clock = layered(env)
    assert list(index.scan(None, None, None, False, resolve)) == EXPECTED
    assert list(index.scan(None, None, None, True, resolve)) == EXPECTED[::-1]
    assert list(index.scan(b"b", b"h", None, False, resolve)) == EXPECTED[1:5]
    assert list(index.scan(b"b", b"h", None, True, resolve)) == EXPECTED[1:5][::-1]
    assert list(index.scan(None, None, b"y", False, resolve)) == [(b"y", b"run1")]
    assert index.count() == len(EXPECTED)


def test_scan_without_memtable_or_runs_reads_the_btree_in_bulk_and_resolves_the_rest(env: LmdbEnv) -> None:
    index = KeyIndex(env, run_limit=32, apply_lock=threading.RLock(), monotonic_s=Clock())
    write(env, {b"a": b"1", b"b": b"long value here", b"c": b"3", b"d": None}, 0, run=False)
    assert list(index.scan(None, None, None, False, resolve)) == [
        (b"a", b"1"), (b"b", b"resolved b at 1"), (b"c", b"3")]
    assert list(index.scan(b"b", None, None, False, resolve)) == [(b"b", b"resolved b at 1"), (b"c", b"3")]
    assert index.count() == 3


def test_settling_merges_the_runs_and_changes_no_answer(env: LmdbEnv) -> None:
    index, _clock = layered(env)
    keys = [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"x", b"y", b"z", b"absent"]
    before = [index.lookup(key) for key in keys]
    with _reader(index) as reader:
        assert runs_pending(reader) == 2
    assert index.settle() == 2
    with _reader(index) as reader:
        assert runs_pending(reader) == 0
        assert reader.index_get(b"c") == IndexEntry(0, 202, b"run1")  # now in the B-tree
        assert reader.index_get(b"f") is None
    assert [index.lookup(key) for key in keys] == before
    assert list(index.scan(None, None, None, False, resolve)) == EXPECTED
    assert list(index.scan(None, None, None, True, resolve)) == EXPECTED[::-1]
    assert index.count() == len(EXPECTED)
    assert index.settle() == 0


def test_settling_and_record_by_record_applies_hold_the_index_lock(env: LmdbEnv) -> None:
    index, _clock = layered(env)
    assert index.applying() is not index.lock  # runs: a commit's index is one LMDB write
    direct = KeyIndex(env, run_limit=0, apply_lock=threading.RLock(), monotonic_s=Clock())
    assert direct.applying() is direct.lock
    settled = threading.Event()
    with index.lock:
        worker = threading.Thread(target=lambda: (index.settle(), settled.set()))
        worker.start()
        assert not settled.wait(0.3)  # a writer holds the lock: the merge waits for it
    worker.join(10)
    assert settled.is_set()


def test_settle_due_after_an_apply(env: LmdbEnv) -> None:
    index = KeyIndex(env, run_limit=2, apply_lock=threading.RLock(), monotonic_s=Clock())
    assert not index.settle_due(2)
    assert index.settle_due(3)
    with index.settle_deferred():
        assert not index.settle_due(3)
    assert index.settle_due(3)
    never = KeyIndex(env, run_limit=0, apply_lock=threading.RLock(), monotonic_s=Clock())
    assert not never.settle_due(100)
