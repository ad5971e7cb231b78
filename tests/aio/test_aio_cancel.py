"""Cancellation and closing with calls in flight leave the store consistent.

A call cancelled before a worker starts it never runs; one cancelled while it runs completes.
A cancelled, abandoned or closed async iterator releases its LMDB snapshot (a thousand and more
of them would exhaust LMDB's reader slots otherwise). Closing while calls are in flight: each
finishes or raises StoreClosedError, and exactly the writes that returned are kept.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kvlog
import kvlog.aio
from kvlog.aio import CHUNK_ROWS, AsyncStore
from tests.aio.support import QUIET, run

#: More iterators than LMDB has reader slots (1024): a snapshot leaked by each would fail.
MANY = 1100


async def _until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.002)

    await asyncio.wait_for(poll(), timeout_s)


def test_a_put_cancelled_before_it_started_never_runs(tmp_path: Path) -> None:
    async def main() -> None:
        async with kvlog.aio.open(tmp_path / "s", workers=1, **QUIET) as store:
            gate = threading.Event()
            busy = asyncio.create_task(store.call(gate.wait, 30))  # the only worker is taken
            put = asyncio.create_task(store.put(b"k", b"v", sync=True))
            await asyncio.sleep(0.05)  # the put is queued behind the busy worker
            put.cancel()
            with pytest.raises(asyncio.CancelledError):
                await put
            gate.set()
            assert await busy is True
            await store.flush()
            assert await store.get(b"k") is None
            assert [r async for r in store.changes()] == []

    run(main())


def test_a_flush_cancelled_while_it_runs_completes(tmp_path: Path) -> None:
    entered = threading.Event()

    class Watched(kvlog.Store):
        def flush(self) -> int:
            entered.set()
            return super().flush()

    async def main() -> None:
        sync = kvlog.open(tmp_path / "s", **QUIET)
        sync.__class__ = Watched
        async with AsyncStore(sync, workers=1) as store:
            def fill() -> None:
                for i in range(50_000):
                    sync.put(b"k%06d" % i, b"v" * 50)

            await store.call(fill)
            flush = asyncio.create_task(store.flush())
            await _until(entered.is_set)
            flush.cancel()
            with pytest.raises(asyncio.CancelledError):
                await flush
            # The flush ran to its end in the worker: the next call, queued behind it, sees it.
            stats = await store.stats()
            assert stats["unflushed_bytes"] == 0 and stats["flushes"] == 1
            assert await store.check() == []
            await store.close(flush=False)  # nothing left to flush: all 50,000 are durable
        with kvlog.open(tmp_path / "s") as again:
            assert len(again) == 50_000

    run(main())


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    """A store of three chunks of rows, flushed."""
    with kvlog.open(tmp_path / "s", **QUIET) as store:
        for i in range(3 * CHUNK_ROWS):
            store.put(b"k%05d" % i, b"v")
    return tmp_path / "s"


class _Gate:
    """Stops a store's rows in the worker before row ``CHUNK_ROWS + 1`` until released."""

    def __init__(self) -> None:
        self.rows = 0
        self.reached = threading.Event()
        self.release = threading.Event()

    #: The threads in which the store's iterators ended (exhausted or closed).
    ended_in: list[str] = []

    def wrap(self, rows: Any) -> Any:
        try:
            for row in rows:
                self.rows += 1
                if self.rows == CHUNK_ROWS + 1:
                    self.reached.set()
                    self.release.wait(30)
                yield row
        finally:
            _Gate.ended_in.append(threading.current_thread().name)


class _Gated(kvlog.Store):
    """A store whose scans and changelogs pass through the gate of the moment."""

    gate = _Gate()

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        return _Gated.gate.wrap(super().scan(*args, **kwargs))

    def changes(self, *args: Any, **kwargs: Any) -> Any:
        return _Gated.gate.wrap(super().changes(*args, **kwargs))


def test_iterations_cancelled_in_a_fetch_release_their_snapshots(filled: Path) -> None:
    """Each task is cancelled while a worker is inside its second fetch; the close of the
    iterator then waits for that fetch to end and releases the snapshot."""
    async def main() -> None:
        sync = kvlog.open(filled, **QUIET)
        sync.__class__ = _Gated
        # One worker, so the call at the end of each iteration waits for that iteration's fetch
        # and close: no row of an earlier iterator passes the gate of a later one.
        async with AsyncStore(sync, workers=1) as store:
            kept: list[Any] = []  # the iterators stay referenced: release must not wait for GC
            for i in range(MANY):
                gate = _Gated.gate = _Gate()
                rows = store.scan() if i % 2 else store.changes()
                kept.append(rows)
                seen: list[Any] = []

                async def consume(rows: Any = rows, seen: list[Any] = seen) -> None:
                    async for row in rows:
                        seen.append(row)

                task = asyncio.create_task(consume())
                await _until(gate.reached.is_set)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                gate.release.set()
                assert len(seen) == CHUNK_ROWS
                await store.call(int)  # queued behind the rest of that fetch and the close
            _Gated.gate = _Gate()
            _Gated.gate.release.set()
            assert len([kv async for kv in store.scan()]) == 3 * CHUNK_ROWS
        # Released by the close in a worker, never by garbage collection on the loop thread.
        assert len(_Gate.ended_in) >= MANY and all(t.startswith("kvlog-aio") for t in _Gate.ended_in)

    _Gate.ended_in.clear()
    run(main())


def test_closed_and_abandoned_iterators_release_their_snapshots(filled: Path) -> None:
    async def main() -> None:
        sync = kvlog.open(filled, **QUIET)
        sync.__class__ = _Gated
        _Gated.gate = _Gate()
        _Gated.gate.release.set()
        async with AsyncStore(sync) as store:
            kept: list[Any] = []
            for i in range(MANY):
                rows = store.scan(reverse=True) if i % 2 else store.changes(follow=True)
                kept.append(rows)
                assert await rows.__anext__() is not None
                await rows.aclose()
            for i in range(MANY):
                async for _row in store.scan() if i % 2 else store.changes():
                    break  # abandoned: nothing refers to the iterator any more
            assert len([kv async for kv in store.scan()]) == 3 * CHUNK_ROWS
        assert len(_Gate.ended_in) >= 2 * MANY and all(t.startswith("kvlog-aio") for t in _Gate.ended_in)

    _Gate.ended_in.clear()
    run(main())


def test_closing_with_calls_in_flight(tmp_path: Path) -> None:
    """Every call either completes or raises StoreClosedError; after reopening, exactly the
    puts that returned are there (close flushed them)."""
    async def main() -> dict[bytes, bool]:
        store = await kvlog.aio.open(tmp_path / "s", workers=2, **QUIET)
        gate, first = threading.Event(), threading.Event()
        busy = [asyncio.create_task(store.call(gate.wait, 30)), asyncio.create_task(store.call(first.wait, 30))]
        puts = {b"k%03d" % i: asyncio.create_task(store.put(b"k%03d" % i, b"v", sync=i % 2 == 0))
                for i in range(50)}
        gets = [asyncio.create_task(store.get(b"k000")) for _ in range(10)]
        scans = [asyncio.create_task(_collect(store)) for _ in range(3)]
        await asyncio.sleep(0.05)
        first.set()  # one worker goes through the queue while the store closes
        await asyncio.sleep(0.002)
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0.05)
        with pytest.raises(kvlog.StoreClosedError):
            await store.put(b"late", b"v")  # refused at once, on the loop
        gate.set()
        await closing
        assert [await task for task in busy] == [True, True]
        outcome: dict[bytes, bool] = {}
        for key, task in puts.items():
            try:
                await task
                outcome[key] = True
            except kvlog.StoreClosedError:
                outcome[key] = False
        for other in [*gets, *scans]:
            try:
                await other
            except kvlog.StoreClosedError:
                pass
        return outcome

    outcome = run(main())
    with kvlog.open(tmp_path / "s") as again:
        assert {key for key, _v in again.scan()} == {key for key, ok in outcome.items() if ok}
        assert again.check() == []


async def _collect(store: AsyncStore) -> list[tuple[bytes, bytes]]:
    return [kv async for kv in store.scan()]


def test_closing_releases_an_open_iterator(filled: Path) -> None:
    async def main() -> None:
        store = await kvlog.aio.open(filled, **QUIET)
        rows = store.scan()
        assert await rows.__anext__() == (b"k00000", b"v")
        await store.close()  # the scan's snapshot is released before the store closes
        with pytest.raises(kvlog.StoreClosedError):
            async for _row in rows:
                pass

    run(main())


def test_a_cancelled_close_still_closes(tmp_path: Path) -> None:
    async def main() -> None:
        store = await kvlog.aio.open(tmp_path / "s", **QUIET)
        await store.put(b"k", b"v")
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        await store.close()  # waits for the same close, which flushed
        assert store.closed

    run(main())
    with kvlog.open(tmp_path / "s") as again:
        assert again.get(b"k") == b"v"


def _kvlog_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("kvlog"))


def test_a_cancelled_open_closes_the_store_it_opened(tmp_path: Path) -> None:
    before = _kvlog_threads()

    async def main() -> None:
        # Defaults: the store it opens starts a flusher and a compactor thread.
        opening = asyncio.create_task(_open(tmp_path / "s"))
        await asyncio.sleep(0)
        assert "kvlog-aio-open" in _kvlog_threads()  # cancelled while the thread opens
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        await _until(lambda: _kvlog_threads() == before)

    run(main())
    with kvlog.open(tmp_path / "s", create=False) as again:  # it was created, and released
        assert again.get(b"k") is None


async def _open(path: Path) -> AsyncStore:
    return await kvlog.aio.open(path)
