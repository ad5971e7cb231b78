"""Fixtures of the compaction tests: stores on local disk driven by a manual clock.

Every store opened here flushes only when told to (``flush()``, ``sync=True``,
a batch's exit) and compacts only when ``compact()`` is called, so a test
decides exactly what is durable and when each cleaning round runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog import ManualClock

#: Settings that leave flushing and compaction entirely to the test.
MANUAL: dict[str, Any] = {
    "flush_interval_ms": 0,
    "flush_bytes": 1 << 30,
    "max_unflushed_bytes": 1 << 30,
    "background_compaction": False,
}

#: A store factory: ``make_store(path, **settings)``; stores are closed at teardown.
MakeStore = Callable[..., kvlog.Store]


def real_now_ms() -> int:
    """The real wall clock, so file mtimes (which GC compares with the clock) agree with it."""
    return time.time_ns() // 1_000_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(real_now_ms())


@pytest.fixture
def make_store(clock: ManualClock) -> Iterator[MakeStore]:
    opened: list[kvlog.Store] = []

    def factory(path: Path | str | kvlog.Storage, *, store_clock: Any = None, **settings: Any) -> kvlog.Store:
        options = {"partitions": 2, **MANUAL, **settings}
        store = kvlog.open(path if isinstance(path, kvlog.Storage) else str(path),
                           clock=store_clock or clock, **options)
        opened.append(store)
        return store

    yield factory
    for store in reversed(opened):
        try:
            store.close(flush=False)
        except Exception:  # noqa: BLE001 - a crashed or fenced store still gets released
            pass


def log_records(store: kvlog.Store) -> list[tuple[int, int, bytes, bytes | None]]:
    """``(partition, offset, key, value)`` of every durable record, partition by partition."""
    return [(r.partition, r.offset, r.key, r.value) for r in store.changes()]


def latest_by_key(records: list[tuple[int, int, bytes, bytes | None]]) -> dict[bytes, tuple[int, int, bytes | None]]:
    """The last record of every key: key -> (partition, offset, value)."""
    out: dict[bytes, tuple[int, int, bytes | None]] = {}
    for p, offset, key, value in records:
        out[key] = (p, offset, value)
    return out


class Helpers:
    """Plain helpers, reachable from every test module through the ``h`` fixture."""

    log_records = staticmethod(log_records)
    latest_by_key = staticmethod(latest_by_key)
    real_now_ms = staticmethod(real_now_ms)
    MANUAL = MANUAL

    @staticmethod
    def compact_until_clean(store: kvlog.Store, *, now_ms: int | None = None, limit: int = 500,
                            force: bool = False) -> list[kvlog.CompactionReport]:
        """Run rounds until one does nothing (at most ``limit``); return the reports that did work."""
        reports = []
        for _ in range(limit):
            report = store.compact(now_ms=now_ms, force=force)
            if report.rounds == 0:
                return reports
            reports.append(report)
            if force and not report.partial:
                return reports
        raise AssertionError(f"compaction still had work after {limit} rounds")


@pytest.fixture
def h() -> type[Helpers]:
    return Helpers
