"""End offsets, lag and an exact bootstrap: what a consumer needs to know it is caught up.

``store.end_offsets()`` and ``begin_offsets()`` read the head first, so another process's
commits count; ``snap.end_offsets()`` are the offsets a snapshot's state is exactly as of, so
the state read from it plus the changelog from those offsets on equals the store; a consumer
seeks to them (``seek_all``), to the end, commits chosen offsets, and reports its lag.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import kvlog
import kvlog.aio
from kvlog.errors import InvalidRecordError

QUIET: dict[str, Any] = {"background_compaction": False, "flush_interval_ms": 0, "partitions": 3}


def _write(store: kvlog.Store, start: int, count: int) -> None:
    for i in range(start, start + count):
        store.put(f"k{i % 7}".encode(), f"v{i}".encode())
        if i % 5 == 4:
            store.delete(f"k{(i + 3) % 7}".encode())
    store.flush()


def test_end_offsets_count_every_record_and_another_processes_writes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "a", **QUIET) as a, \
            kvlog.open(root, cache_dir=tmp_path / "b", **QUIET) as b:
        assert a.end_offsets() == a.begin_offsets() == {0: 0, 1: 0, 2: 0}
        _write(a, 0, 10)
        b.put(b"from-b", b"x", sync=True)  # another cache: a's end offsets read the head first
        ends = a.end_offsets()
        records = list(a.changes())
        assert sum(ends.values()) == len(records) == 13
        assert ends == {p: max([r.offset + 1 for r in records if r.partition == p], default=0) for p in range(3)}
        assert a.begin_offsets() == {0: 0, 1: 0, 2: 0}
        a.put(b"buffered", b"not durable yet")  # no offset until it is flushed
        assert a.end_offsets() == ends


def test_begin_offsets_move_past_what_compaction_removed(tmp_path: Path) -> None:
    with kvlog.open(tmp_path / "root", **QUIET, delete_retention_ms=0) as store:
        for i in range(20):
            store.put(b"only", f"v{i}".encode())
            store.flush()
        store.delete(b"only")
        store.flush()
        store.compact(force=True, now_ms=2**62)
        begins, ends = store.begin_offsets(), store.end_offsets()
        first = {p: min((r.offset for r in store.changes(p)), default=ends[p]) for p in range(3)}
        assert begins == first
        assert any(begins[p] > 0 for p in range(3))  # the superseded records and the tombstone went


def test_a_snapshot_plus_the_changelog_from_its_end_offsets_is_the_store(tmp_path: Path) -> None:
    """The bootstrap, exact: state from a snapshot of a reader's handle, then every record from
    ``snap.end_offsets()`` while another handle keeps writing and compacting; nothing is read
    twice or missed."""
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "w", **QUIET) as writer, \
            kvlog.open(root, cache_dir=tmp_path / "r", **QUIET) as reader:
        _write(writer, 0, 40)
        reader.refresh()
        with reader.snapshot() as snap:
            _write(writer, 40, 30)  # after the snapshot: not in its state
            writer.compact(force=True)
            state = dict(snap.scan())
            offsets = snap.end_offsets()
        _write(writer, 70, 20)
        consumer = reader.consumer("view")
        consumer.seek_all(offsets)
        seen: set[tuple[int, int]] = set()
        while not consumer.caught_up():
            for record in consumer.poll(timeout_s=0):
                assert record.offset >= offsets[record.partition]
                assert (record.partition, record.offset) not in seen
                seen.add((record.partition, record.offset))
                if record.value is None:
                    state.pop(record.key, None)
                else:
                    state[record.key] = record.value
        assert consumer.lag() == {0: 0, 1: 0, 2: 0}
        assert state == dict(reader.scan()) == dict(writer.scan())


def test_seek_to_end_reads_only_what_comes_next_and_lag_counts_what_is_left(tmp_path: Path) -> None:
    with kvlog.open(tmp_path / "root", **QUIET) as store:
        _write(store, 0, 12)
        consumer = store.consumer("late")
        lag = consumer.lag()
        assert lag == store.end_offsets() and sum(lag.values()) == 14 and not consumer.caught_up()
        consumer.seek_to_end()
        assert consumer.caught_up() and consumer.poll(timeout_s=0) == []
        store.put(b"next", b"1", sync=True)
        assert sum(consumer.lag().values()) == 1
        assert [r.key for r in consumer.poll(timeout_s=0)] == [b"next"]
        assert consumer.caught_up()
        consumer.seek_to_beginning([0])
        assert consumer.position(0) == 0 and consumer.lag()[0] == store.end_offsets()[0]


def test_commit_of_chosen_offsets_moves_only_those(tmp_path: Path) -> None:
    with kvlog.open(tmp_path / "root", **QUIET) as store:
        _write(store, 0, 12)
        consumer = store.consumer("g")
        consumer.commit({0: 2, 2: 1})
        assert [consumer.committed(p) for p in range(3)] == [2, None, 1]
        version = store.log.version
        consumer.commit({})  # nothing to commit: no commit
        assert store.log.version == version
        consumer.poll(timeout_s=0)
        consumer.commit()
        ends = store.end_offsets()
        assert [consumer.committed(p) for p in range(3)] == [ends[0], ends[1], ends[2]]
        again = store.consumer("g")
        assert again.caught_up()


@pytest.mark.parametrize("offsets", [{3: 1}, {-1: 0}, {0: -1}, {0: 2**63}, {True: 1}, {0: 1.5}, {"0": 1},
                                     [(0, 1)], None, 5])
def test_bad_offsets_are_refused_before_anything_moves(tmp_path: Path, offsets: Any) -> None:
    with kvlog.open(tmp_path / "root", **QUIET) as store:
        _write(store, 0, 12)
        consumer = store.consumer("g", partitions=[0, 1, 2])
        positions = [consumer.position(p) for p in range(3)]
        version = store.log.version
        with pytest.raises(InvalidRecordError):
            consumer.seek_all({2: 1, **offsets} if isinstance(offsets, dict) else offsets)
        if offsets is not None:
            with pytest.raises(InvalidRecordError):
                consumer.commit(offsets)
        assert [consumer.position(p) for p in range(3)] == positions
        assert store.log.version == version and consumer.committed(2) is None


def test_a_consumer_of_some_partitions_reports_only_those(tmp_path: Path) -> None:
    with kvlog.open(tmp_path / "root", **QUIET) as store:
        _write(store, 0, 12)
        consumer = store.consumer("g", partitions=[2])
        assert list(consumer.lag()) == [2]
        with pytest.raises(InvalidRecordError):
            consumer.seek_to_end([0])


def test_the_async_store_gives_the_same_offsets(tmp_path: Path) -> None:
    async def run() -> tuple[dict[int, int], dict[int, int], dict[int, int], dict[int, int]]:
        async with kvlog.aio.open(str(tmp_path / "root"), **QUIET) as astore:
            for i in range(10):
                await astore.put(f"k{i}", "v")
            await astore.flush()
            return (await astore.end_offsets(), astore.sync.end_offsets(),
                    await astore.begin_offsets(), astore.sync.begin_offsets())

    ends, sync_ends, begins, sync_begins = asyncio.run(run())
    assert ends == sync_ends and sum(ends.values()) == 10
    assert begins == sync_begins == {0: 0, 1: 0, 2: 0}
