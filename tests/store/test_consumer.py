"""Consumer groups: positions, poll, commit, and the committed offsets kept in the store."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from store_support import EXPLICIT_FLUSH, Root

import kvlog
from kvlog.errors import InvalidRecordError, ReadOnlyError, StoreClosedError


def _fill(store: kvlog.Store, keys: list[str]) -> None:
    for k in keys:
        store.put(k, f"value-{k}")
    store.flush()


def test_poll_reads_every_record_in_offset_order_and_advances(root: Root) -> None:
    with root.open(partitions=3, **EXPLICIT_FLUSH) as store:
        keys = [f"k{i:03d}" for i in range(100)]
        _fill(store, keys)
        consumer = store.consumer("g")
        got: list[kvlog.Record] = []
        while batch := consumer.poll(timeout_s=0, max_records=7):
            assert len(batch) <= 7
            got.extend(batch)
        assert sorted(r.key.decode() for r in got) == keys
        for p in range(3):
            offsets = [r.offset for r in got if r.partition == p]
            assert offsets == list(range(len(offsets)))
            assert consumer.position(p) == store.log.end_offset(p)
        assert consumer.committed(0) is None


def test_start_is_the_committed_offset_else_the_log_start(root: Root) -> None:
    with root.open(partitions=2, **EXPLICIT_FLUSH) as store:
        _fill(store, [f"k{i}" for i in range(20)])
        first = store.consumer("g", partitions=[0])
        first.poll(timeout_s=0, max_records=3)
        first.commit()
        assert first.committed(0) == 3
        again = store.consumer("g", partitions=[0, 1])
        assert again.position(0) == 3 and again.position(1) == 0
        assert store.consumer("other").position(0) == 0


def test_seek_and_seek_to_beginning(root: Root) -> None:
    with root.open(partitions=1, **EXPLICIT_FLUSH) as store:
        _fill(store, [f"k{i}" for i in range(10)])
        consumer = store.consumer("g")
        consumer.seek(0, 7)
        assert [r.offset for r in consumer.poll(timeout_s=0)] == [7, 8, 9]
        consumer.seek_to_beginning()
        assert consumer.position(0) == 0
        consumer.seek(0, 50)  # past the end: waits for offset 50
        assert consumer.poll(timeout_s=0) == []
        consumer.seek_to_beginning([0])
        assert len(consumer.poll(timeout_s=0)) == 10


def test_poll_waits_for_this_process_writes(root: Root) -> None:
    with root.open(partitions=1, **EXPLICIT_FLUSH, follow_interval_ms=600_000) as store:
        consumer = store.consumer("g")
        writer = threading.Timer(0.2, lambda: store.put("late", "1", sync=True))
        writer.start()
        records = consumer.poll(timeout_s=120)
        writer.join()
        assert [r.key for r in records] == [b"late"]


def test_poll_times_out_empty(root: Root) -> None:
    with root.open(partitions=1, **EXPLICIT_FLUSH, follow_interval_ms=10) as store:
        assert store.consumer("g").poll(timeout_s=0.05) == []


def test_iterating_polls_until_closed(root: Root) -> None:
    with root.open(partitions=2, **EXPLICIT_FLUSH) as store:
        _fill(store, [f"k{i}" for i in range(6)])
        seen = []
        with store.consumer("g") as consumer:
            for record in consumer:
                seen.append(record.key)
                if len(seen) == 6:
                    consumer.close()
        assert sorted(seen) == sorted(f"k{i}".encode() for i in range(6))
        with pytest.raises(StoreClosedError):
            consumer.poll()


def _storage_second_passes(root: Root) -> None:
    """Commit GC compares storage times: an object store's have a resolution of one second."""
    if root.kind == "s3":
        time.sleep(1.1)


def test_committed_offsets_survive_reopen_and_gc_of_old_commits(root: Root) -> None:
    # Data files of their own: commit GC collects the first commits only if they carry no live file.
    settings_ = dict(EXPLICIT_FLUSH, checkpoint_interval=2, commit_retention_ms=0, commit_inline_bytes=0)
    with root.open(partitions=1, **settings_) as store:
        _fill(store, [f"k{i}" for i in range(10)])
        consumer = store.consumer("g")
        consumer.poll(timeout_s=0, max_records=4)
        consumer.commit()
        _storage_second_passes(root)
        for i in range(6):  # later commits, checkpoints, then GC of the commit holding the offsets
            store.put(f"later{i}", "x", sync=True)
        assert store.gc()["commits"] > 0
        names = {i.name for i in store.log.storage.list("log/")}
        assert "log/00000000000000000001.json" not in names
    with root.open(cache="fresh", partitions=1, **settings_) as store:  # loads a checkpoint
        assert store.consumer("g").committed(0) == 4
        assert store.consumer("g").position(0) == 4


def test_a_position_compacted_away_resumes_at_the_next_surviving_record(root: Root) -> None:
    with root.open(partitions=1, **EXPLICIT_FLUSH) as store:
        for _round in range(3):
            _fill(store, [f"k{i}" for i in range(5)])  # offsets 5r..5r+4, the same keys each round
        consumer = store.consumer("g")
        consumer.seek(0, 2)
        store.compact(force=True)
        survivors = [r.offset for r in store.changes(0)]
        assert survivors == list(range(10, 15))
        assert store.log.start_offset(0) == 10
        assert consumer.position(0) == 10  # below the start: resumes there
        consumer.seek(0, 3)
        assert [r.offset for r in consumer.poll(timeout_s=0)] == survivors
        store.delete("k2")
        store.put("k9", "new")
        store.flush()
        store.compact(force=True)
        consumer.seek(0, 12)  # k2's record at offset 12 was replaced by its tombstone
        assert [r.offset for r in consumer.poll(timeout_s=0)] == [
            o for o in (r.offset for r in store.changes(0)) if o >= 12]


BAD_CONSUMER_ARGS: list[Any] = [
    pytest.param(("",), id="empty-group"), pytest.param((None,), id="None-group"),
    pytest.param((b"g",), id="bytes-group"), pytest.param(("a\x00b",), id="nul-group"),
    pytest.param(("x" * 300,), id="long-group"), pytest.param(("g", [5]), id="unknown-partition"),
    pytest.param(("g", [-1]), id="negative-partition"), pytest.param(("g", []), id="no-partitions"),
    pytest.param(("g", [0, 0]), id="repeated-partition"), pytest.param(("g", "0"), id="str-partitions"),
    pytest.param(("g", 3), id="int-partitions"), pytest.param(("g", [True]), id="bool-partition"),
]


@pytest.mark.parametrize("args", BAD_CONSUMER_ARGS)
def test_bad_consumer_arguments(local_root: Root, args: tuple[Any, ...]) -> None:
    with local_root.open(partitions=2, **EXPLICIT_FLUSH) as store:
        version = store.log.version
        with pytest.raises(InvalidRecordError):
            store.consumer(*args)
        assert store.log.version == version


@pytest.mark.parametrize("call", [
    pytest.param(lambda c: c.poll(timeout_s=-1), id="negative-timeout"),
    pytest.param(lambda c: c.poll(timeout_s="1"), id="str-timeout"),
    pytest.param(lambda c: c.poll(max_records=0), id="zero-max"),
    pytest.param(lambda c: c.poll(max_records=-3), id="negative-max"),
    pytest.param(lambda c: c.poll(max_records=1.5), id="float-max"),
    pytest.param(lambda c: c.seek(0, -1), id="negative-offset"),
    pytest.param(lambda c: c.seek(0, None), id="None-offset"),
    pytest.param(lambda c: c.seek(1, 0), id="unassigned-partition"),
    pytest.param(lambda c: c.seek(9, 0), id="unknown-partition"),
    pytest.param(lambda c: c.position(9), id="position-unknown"),
    pytest.param(lambda c: c.committed(-1), id="committed-unknown"),
    pytest.param(lambda c: c.seek_to_beginning([1]), id="beginning-unassigned"),
    pytest.param(lambda c: c.seek_to_beginning(0), id="beginning-int"),
])
def test_bad_consumer_calls_change_nothing(local_root: Root, call: Any) -> None:
    with local_root.open(partitions=2, **EXPLICIT_FLUSH) as store:
        _fill(store, ["a", "b", "c", "d"])
        consumer = store.consumer("g", partitions=[0])
        consumer.seek(0, 1)
        consumer.commit()
        version = store.log.version
        with pytest.raises(InvalidRecordError):
            call(consumer)
        assert consumer.position(0) == 1 and consumer.committed(0) == 1
        assert store.log.version == version


def test_commit_on_a_read_only_store_is_refused(local_root: Root) -> None:
    with local_root.open(partitions=1, **EXPLICIT_FLUSH) as store:
        _fill(store, ["a"])
    with local_root.open(read_only=True) as reader:
        consumer = reader.consumer("g")
        assert len(consumer.poll(timeout_s=0)) == 1
        version = reader.log.version
        with pytest.raises(ReadOnlyError):
            consumer.commit()
        assert reader.log.version == version and consumer.committed(0) is None


def test_a_closed_store_closes_its_consumers(local_root: Root) -> None:
    store = local_root.open(partitions=1, **EXPLICIT_FLUSH)
    consumer = store.consumer("g")
    store.close()
    with pytest.raises(StoreClosedError):
        consumer.poll(timeout_s=0)
    with pytest.raises(StoreClosedError):
        store.consumer("g")


def test_two_consumers_of_one_group_last_commit_wins(local_root: Root) -> None:
    with local_root.open(partitions=1, **EXPLICIT_FLUSH) as store:
        _fill(store, [f"k{i}" for i in range(10)])
        a, b = store.consumer("g"), store.consumer("g")
        a.poll(timeout_s=0, max_records=8)
        b.poll(timeout_s=0, max_records=2)
        a.commit()
        b.commit()
        assert store.consumer("g").committed(0) == 2


class ConsumerAgainstModel(RuleBasedStateMachine):
    """Positions and committed offsets against a model of the changelog (every offset live:
    no compaction runs here)."""

    def __init__(self) -> None:
        super().__init__()
        self.store: kvlog.Store | None = None

    @initialize()
    def open_store(self) -> None:
        import tempfile

        self.dir = tempfile.mkdtemp()
        self.store = kvlog.open(self.dir, partitions=2, **EXPLICIT_FLUSH)
        self.log: list[list[bytes]] = [[], []]  # keys per partition, by offset
        self.consumer = self.store.consumer("g")
        self.position = [0, 0]
        self.committed: list[int | None] = [None, None]
        self.n = 0

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()

    @rule(count=st.integers(1, 6))
    def write(self, count: int) -> None:
        assert self.store is not None
        for _ in range(count):
            key = f"k{self.n}".encode()
            self.n += 1
            self.store.put(key, b"v")
            self.log[self.store.log.partition_for(key)].append(key)
        self.store.flush()

    @rule(max_records=st.integers(1, 10))
    def poll(self, max_records: int) -> None:
        records = self.consumer.poll(timeout_s=0, max_records=max_records)
        assert len(records) <= max_records
        available = sum(max(len(self.log[p]) - self.position[p], 0) for p in range(2))
        assert len(records) == min(max_records, available)
        for r in records:
            assert r.offset == self.position[r.partition]
            assert r.key == self.log[r.partition][r.offset]
            self.position[r.partition] += 1

    @rule(p=st.integers(0, 1), offset=st.integers(0, 30))
    def seek(self, p: int, offset: int) -> None:
        self.consumer.seek(p, offset)
        self.position[p] = offset

    @rule()
    def commit(self) -> None:
        self.consumer.commit()
        self.committed = list(self.position)

    @rule()
    def restart(self) -> None:
        assert self.store is not None
        self.store.close()
        self.store = kvlog.open(self.dir, **EXPLICIT_FLUSH)
        self.consumer = self.store.consumer("g")
        self.position = [c if c is not None else 0 for c in self.committed]

    @invariant()
    def positions_and_commits_agree(self) -> None:
        if self.store is None:
            return
        for p in range(2):
            assert self.consumer.position(p) == self.position[p]
            assert self.consumer.committed(p) == self.committed[p]


TestConsumerAgainstModel = ConsumerAgainstModel.TestCase
TestConsumerAgainstModel.settings = settings(max_examples=15, stateful_step_count=20, deadline=None)
