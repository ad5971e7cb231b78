"""A put that fills ``flush_bytes`` flushes in the writer's own thread; a failure there is retried."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import kvlog
from kvlog.log import flusher as flusher_module
from kvlog.storage import LocalStorage
from kvlog.storage.faulty import FaultPlan, FaultyStorage

RECORD = 4 + 10 + flusher_module.RECORD_OVERHEAD_BYTES  # key + value + bookkeeping


def test_the_writer_that_fills_the_buffer_flushes_it(tmp_path: Path) -> None:
    store = kvlog.open(str(tmp_path / "s"), flush_bytes=10 * RECORD, max_unflushed_bytes=100 * RECORD, max_key_bytes=100, max_record_bytes=1000,
                       background_compaction=False)
    flushing_threads: list[str] = []
    real = store._flusher._flush_once  # type: ignore[union-attr]

    def traced() -> None:
        flushing_threads.append(threading.current_thread().name)
        real()

    store._flusher._flush_once = traced  # type: ignore[union-attr,method-assign]
    try:
        for i in range(10):
            store.put(b"k%03d" % i, b"v" * 10)
        assert store.stats()["unflushed_bytes"] == 0  # the tenth put flushed before returning
        assert flushing_threads == [threading.current_thread().name]
    finally:
        store.close()


def test_a_failed_writer_flush_does_not_raise_and_is_retried(tmp_path: Path) -> None:
    storage = FaultyStorage(LocalStorage(tmp_path / "s"), FaultPlan().fail("put", "data/*", times=2))
    # Data files of their own: the test fails the writes of the flushes' data files.
    store = kvlog.open(storage, create=True, flush_bytes=10 * RECORD, max_unflushed_bytes=100 * RECORD, max_key_bytes=100, max_record_bytes=1000,
                       flush_interval_ms=20, background_compaction=False, commit_inline_bytes=0)
    try:
        for i in range(10):
            store.put(b"k%03d" % i, b"v" * 10)  # the tenth put's flush fails: not an error of the put
        assert store.stats()["flush_error"] is not None
        deadline = time.monotonic() + 20
        while store.stats()["unflushed_bytes"] and time.monotonic() < deadline:
            time.sleep(0.02)  # the background thread retries the same batches
        assert store.stats()["unflushed_bytes"] == 0 and store.stats()["flush_error"] is None
        assert len(storage.injected) == 2
    finally:
        store.close()
    reopened = kvlog.open(str(tmp_path / "s"))
    try:
        assert dict(reopened.scan()) == {b"k%03d" % i: b"v" * 10 for i in range(10)}
        assert reopened.check() == []
    finally:
        reopened.close()


def test_freed_memory_is_handed_back_once_per_megabyte_flushed(tmp_path: Path, monkeypatch: Any) -> None:
    """Small flushes hand memory back once they add up to RELEASE_AFTER_BYTES, from whichever
    thread flushed; a flush that large hands it back at once."""
    releases: list[str] = []
    real = flusher_module.release_unused_memory

    def counted() -> None:
        releases.append(threading.current_thread().name)
        real()

    monkeypatch.setattr(flusher_module, "release_unused_memory", counted)
    store = kvlog.open(str(tmp_path / "s"), background_compaction=False)
    try:
        value = b"v" * 8000
        small = len(b"k0000") + len(value) + flusher_module.RECORD_OVERHEAD_BYTES
        per_release = -(-flusher_module.RELEASE_AFTER_BYTES // small)  # sync puts per release

        def durable(thread: int, n: int) -> None:
            for i in range(n):
                store.put(b"k%d%03d" % (thread, i), value, sync=True)

        durable(0, per_release - 1)
        assert releases == []
        durable(0, 1)
        assert len(releases) == 1
        workers = [threading.Thread(target=durable, args=(t, per_release // 4 + 1)) for t in range(1, 9)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        with store._flusher._flush_lock:  # type: ignore[union-attr]
            pass  # the last flush handed memory back (after its writers were acknowledged)
        # 2 * per_release + 8 puts flushed since: twice, or once if a group commit of up to 8
        # puts went past the megabyte (what it flushed beyond counts towards no next time).
        assert len(releases) in (2, 3)
        count = len(releases)
        with store.batch() as batch:  # one write: one flush of a megabyte
            for i in range(per_release):
                batch.put(b"k9%03d" % i, value)
        store.flush()
        with store._flusher._flush_lock:  # type: ignore[union-attr]
            pass
        assert len(releases) == count + 1
    finally:
        store.close()
