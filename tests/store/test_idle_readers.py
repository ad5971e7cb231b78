"""Idle readers beside another process's compaction and GC.

A handle reads, then idles while another process (``compact_gc_proc.py``, a real process)
overwrites keys, compacts every partition and collects the replaced files. The idle handle's
cache still lists the replaced files; its next read meets a missing file, applies the newer
commits and reads again from the same position, so it answers as a fresh handle does.
"""

from __future__ import annotations

import asyncio

import pytest
from store_support import EXPLICIT_FLUSH, PAD, Root, fill_old, replay_from, run_script

import kvlog
import kvlog.aio
from kvlog.errors import CorruptDataError

# Data files of their own: the tests need GC in the other process to delete the files the idle
# handle lists.
SETTINGS = {**EXPLICIT_FLUSH, "commit_inline_bytes": 0}


def _fill(root: Root, keys: int, flushes: int, partitions: int = 2) -> list[str]:
    return fill_old(root, keys, flushes, SETTINGS, partitions)


def _compact_and_collect(root: Root, keys: list[str]) -> None:
    """Another process overwrites ``keys``, compacts, and collects past the default delay."""
    counts = run_script("compact_gc_proc.py", root.spec("other", keys=keys, settings=SETTINGS),
                        timeout=120)
    assert counts["replaced"] > 0  # the files the idle handle lists are gone


def test_an_idle_consumer_resumes_after_another_process_compacts_and_collects(local_root: Root) -> None:
    names = _fill(local_root, 40, 4)
    with local_root.open(cache="consumer", **SETTINGS) as store:
        consumer = store.consumer("g")
        assert len(consumer.poll(timeout_s=0, max_records=7)) == 7
        consumer.commit()
        committed = {p: consumer.position(p) for p in consumer.partitions}
        _compact_and_collect(local_root, names[::3])  # some read already, some not
        got = []
        while batch := consumer.poll(timeout_s=0):
            got.extend(batch)
    expected = replay_from(local_root, committed)
    assert sorted((r.partition, r.offset, r.key, r.value) for r in got) == expected
    assert {r.key for r in got if r.value and r.value.startswith(b"new-")} == {k.encode() for k in names[::3]}


@pytest.mark.parametrize("read", ["get", "get_many", "scan", "changes"])
def test_an_idle_readers_reads_see_the_compacted_store(local_root: Root, read: str) -> None:
    names = _fill(local_root, 40, 4)  # every file holds a key overwritten below: all are replaced
    # A manual clock that never moves: the handle's periodic refresh never comes due again.
    with local_root.open(cache="reader", read_only=True, clock=kvlog.ManualClock()) as reader:
        assert len(reader) == len(names)  # its one refresh; no value read yet
        _compact_and_collect(local_root, names[::3])
        with local_root.open(cache="fresh", read_only=True) as fresh:
            expected_pairs = list(fresh.scan())
            expected_changes = [(r.partition, r.offset, r.key, r.value) for r in fresh.changes()]
        if read == "get":
            assert reader.get("k000") == f"new-k000|{'y' * 600}".encode()
            assert reader.get("k001") == f"old-k001|{PAD}".encode()  # kept, in a new file
        elif read == "get_many":
            assert reader.get_many(names) == [v for _k, v in expected_pairs]
        elif read == "scan":
            assert list(reader.scan()) == expected_pairs
        else:
            assert [(r.partition, r.offset, r.key, r.value) for r in reader.changes()] == expected_changes


def test_an_idle_async_follower_resumes_after_another_process_compacts(local_root: Root) -> None:
    # More than one worker hop of records, a batch ending where the first hop ends.
    names = _fill(local_root, 5 * kvlog.aio.CHUNK_ROWS // 4, 5, partitions=1)

    async def follow() -> tuple[int, list[tuple[int, bytes, bytes | None]]]:
        async with kvlog.aio.open(local_root.uri, cache_dir=local_root.cache_dir("follower"),
                                        read_only=True) as store:
            records = store.changes(0, follow=True)
            # One worker hop fetched the first CHUNK_ROWS records, before the compaction.
            assert (await records.__anext__()).offset == 0
            last = kvlog.aio.CHUNK_ROWS - 1
            _compact_and_collect(local_root, names[::2])
            expected = last + len(replay_from(local_root, {0: last + 1}))
            got = []
            async for record in records:
                got.append((record.offset, record.key, record.value))
                if len(got) == expected:
                    break
            await records.aclose()
            return last, got

    last, got = asyncio.run(follow())
    assert [o for o, _k, _v in got[:last]] == list(range(1, last + 1))  # read before
    assert got[last:] == [(o, k, v) for _p, o, k, v in replay_from(local_root, {0: last + 1})]


def test_a_snapshot_read_of_a_file_another_process_collected_says_so(local_root: Root) -> None:
    names = _fill(local_root, 20, 2)
    with local_root.open(cache="reader", read_only=True) as reader, reader.snapshot() as snap:
        _compact_and_collect(local_root, names)
        with pytest.raises(CorruptDataError, match="GC in another process deleted it.*named checkpoint"):
            snap.get("k001")


