"""A put that fills ``flush_bytes`` flushes in the writer's own thread; a failure there is retried."""

from __future__ import annotations

import threading
import time
from pathlib import Path

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
    store = kvlog.open(storage, create=True, flush_bytes=10 * RECORD, max_unflushed_bytes=100 * RECORD, max_key_bytes=100, max_record_bytes=1000,
                       flush_interval_ms=20, background_compaction=False)
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
