"""Group commit, counted: durable writers that queue while a flush runs share the next flush,
and a flush leader gathers the writers the last flush acknowledged instead of leaving them
to the flush after it. Counts of flushes and records, never times."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.log import flusher as flusher_module
from kvlog.storage import LocalStorage
from kvlog.storage.base import BytesLike

WRITERS = 16
VALUE = b"v" * 100
#: Background flushes only when a test asks: every flush here is led by a durable writer.
SETTINGS: dict[str, Any] = {"flush_interval_ms": 600_000, "background_compaction": False, "partitions": 4}


class _HeldCommit(LocalStorage):
    """A real local storage that holds the next commit's swap of the head until released."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.hold = False
        self.held = threading.Event()
        self.release = threading.Event()

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        if self.hold:
            self.hold = False
            self.held.set()
            assert self.release.wait(60), "the test never released the held commit"
        return super().swap(name, data, expected, copy_to)


def _record_bytes(key: bytes) -> int:
    return len(key) + len(VALUE) + flusher_module.RECORD_OVERHEAD_BYTES


def test_writers_queued_behind_a_flush_all_share_the_next_one(tmp_path: Path) -> None:
    storage = _HeldCommit(tmp_path / "root")
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", **SETTINGS)
    try:
        store.put(b"warm-up-key-0000", VALUE, sync=True)
        before = store.stats()
        storage.hold = True
        first = threading.Thread(target=store.put, args=(b"first-key-000000", VALUE), kwargs={"sync": True})
        first.start()
        assert storage.held.wait(60)  # the first writer's flush is in its commit
        keys = [b"writer-%02d-key-000" % i for i in range(WRITERS)]
        writers = [threading.Thread(target=store.put, args=(k, VALUE), kwargs={"sync": True}) for k in keys]
        for w in writers:
            w.start()
        queued = _record_bytes(b"first-key-000000") + sum(map(_record_bytes, keys))
        deadline = time.monotonic() + 60
        while store.stats()["unflushed_bytes"] < queued:  # every writer has buffered its put
            assert time.monotonic() < deadline, store.stats()["unflushed_bytes"]
            time.sleep(0.005)
        assert all(w.is_alive() for w in writers)  # none is acknowledged while the flush is held
        storage.release.set()
        first.join(60)
        for w in writers:
            w.join(60)
        after = store.stats()
        # Two flushes: the held one (its one record) and one carrying all 16 queued writers.
        assert after["flushes"] - before["flushes"] == 2
        assert after["records_flushed"] - before["records_flushed"] == 1 + WRITERS
        assert after["unflushed_bytes"] == 0
        assert all(store.get(k) == VALUE for k in keys)
    finally:
        store.close()
    with kvlog.open(tmp_path / "root", read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert all(reader.get(k) == VALUE for k in keys)


def test_a_flush_leader_gathers_the_writers_the_last_flush_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """16 threads of durable puts: once every thread has been seen, each flush carries all of
    them (about ``rounds`` flushes for ``16 * rounds`` puts). Without gathering, a leader would
    start as soon as it is woken, with only the writers that waited behind the last flush:
    about half of them, twice as many flushes."""
    monkeypatch.setattr(flusher_module, "GATHER_S", 0.5)  # ample for a loaded machine
    rounds = 20
    store = kvlog.open(LocalStorage(tmp_path / "root", fsync=False), cache_dir=tmp_path / "cache", **SETTINGS)
    try:
        store.put(b"warm-up-key-0000", VALUE, sync=True)
        before = store.stats()
        start = threading.Barrier(WRITERS)

        def write(thread: int) -> None:
            start.wait()
            for i in range(rounds):
                store.put(b"t%02d-key-%08d" % (thread, i), VALUE, sync=True)

        threads = [threading.Thread(target=write, args=(t,)) for t in range(WRITERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        after = store.stats()
        flushes = after["flushes"] - before["flushes"]
        assert after["records_flushed"] - before["records_flushed"] == WRITERS * rounds
        # Without gathering about 2 * rounds; a loaded machine costs a few flushes of stragglers.
        assert flushes <= rounds * 3 // 2, f"{flushes} flushes for {WRITERS} writers x {rounds} durable puts"
        assert len(store) == 1 + WRITERS * rounds
    finally:
        store.close()
