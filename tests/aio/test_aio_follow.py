"""``changes(follow=True)``: records committed later (by another task, by another process) reach
a waiting consumer; waiting holds no worker thread and is no busy loop; the consumer ends when
its task is cancelled, and with StoreClosedError when the store closes."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kvlog
import kvlog.aio
from kvlog.aio import CHUNK_ROWS, AsyncStore
from tests.aio.support import QUIET, run

REPO = Path(kvlog.__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "writer_child.py"


async def _until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Wait (on the loop) until ``condition()`` holds; a timeout fails the test."""
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout_s)


def _open(path: Path, **kwargs: Any) -> kvlog.aio.Opening:
    return kvlog.aio.open(path, **{"partitions": 3, **QUIET, "refresh_interval_ms": 20, **kwargs})


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


def test_follow_receives_a_later_put_of_another_task(tmp_path: Path) -> None:
    async def main() -> None:
        # One partition: one offset order (across partitions a round goes partition by partition).
        async with _open(tmp_path / "s", partitions=1) as store:
            await store.put(b"first", b"1", sync=True)
            got: list[tuple[bytes, bytes | None]] = []

            async def consume() -> None:
                async for record in store.changes(follow=True):
                    got.append((record.key, record.value))

            task = asyncio.create_task(consume())
            await _until(lambda: got == [(b"first", b"1")])
            await store.put(b"second", b"2", sync=True)
            await store.delete(b"first", sync=True)
            await _until(lambda: len(got) == 3)
            assert got == [(b"first", b"1"), (b"second", b"2"), (b"first", None)]
            await _cancel(task)
            # The store is whole and still usable after the consumer was cancelled.
            assert [kv async for kv in store.scan()] == [(b"second", b"2")]

    run(main())


def test_follow_receives_a_put_of_another_process(tmp_path: Path) -> None:
    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            got: list[bytes] = []

            async def consume() -> None:
                async for record in store.changes(follow=True):
                    got.append(record.key)

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.1)  # the consumer has read the empty log and waits
            assert got == []
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
            child = await asyncio.create_subprocess_exec(
                sys.executable, str(CHILD), str(tmp_path / "s"), str(tmp_path / "child-cache"),
                "c1", "c2", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await child.communicate()
            assert child.returncode == 0, err.decode()
            assert out.decode().split() == ["done"]
            await _until(lambda: len(got) == 2)
            assert sorted(got) == [b"c1", b"c2"]
            await _cancel(task)
            assert await store.get(b"c2") == b"from-child"

    run(main())


def test_follow_picks_up_every_partition_across_chunks(tmp_path: Path) -> None:
    """Two rounds of more than a chunk each: every record once, each partition in offset order,
    the second round starting where the first stopped (``from_offset`` applies to the first)."""
    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            def fill(prefix: bytes, n: int) -> None:
                for i in range(n):
                    store.sync.put(prefix + b"%05d" % i, b"v")
                store.sync.flush()

            await store.call(fill, b"a", 2 * CHUNK_ROWS + 5)
            got: list[kvlog.Record] = []

            async def consume() -> None:
                async for record in store.changes(follow=True, from_offset=3):
                    got.append(record)

            task = asyncio.create_task(consume())
            first = [r for r in store.sync.changes() if r.offset >= 3]
            await _until(lambda: len(got) == len(first))
            await store.call(fill, b"b", CHUNK_ROWS + 1)
            await _until(lambda: len(got) == len(first) + CHUNK_ROWS + 1)
            await asyncio.sleep(0.1)
            await _cancel(task)
            assert len(got) == len(first) + CHUNK_ROWS + 1  # nothing twice
            assert got[:len(first)] == first
            for p in range(3):
                expected = [r for r in store.sync.changes(p) if r.offset >= 3]
                assert [r for r in got if r.partition == p] == expected

    run(main())


def test_waiting_holds_no_worker_and_is_no_busy_loop(tmp_path: Path) -> None:
    refreshes: list[int] = []

    class Counted(kvlog.Store):
        def refresh(self) -> int:
            refreshes.append(1)
            return super().refresh()

    async def main() -> None:
        sync = kvlog.open(tmp_path / "s", **{**QUIET, "refresh_interval_ms": 100})
        sync.__class__ = Counted
        async with AsyncStore(sync, workers=1) as store:
            followers = [asyncio.create_task(_drain(store)) for _ in range(3)]
            await asyncio.sleep(0.5)
            # Three idle followers and one worker: other calls still go through at once.
            await asyncio.wait_for(store.put(b"k", b"v"), 5)
            assert await asyncio.wait_for(store.get(b"k"), 5) == b"v"
            for task in followers:
                await _cancel(task)
        # About five pauses of 100 ms each per follower; a busy loop would make thousands.
        assert 3 <= len(refreshes) <= 60

    run(main())


async def _drain(store: AsyncStore) -> None:
    async for _record in store.changes(follow=True):
        pass


def test_closing_the_store_ends_a_follower_with_store_closed(tmp_path: Path) -> None:
    async def main() -> None:
        store = await _open(tmp_path / "s", refresh_interval_ms=1000)
        await store.put(b"k", b"v", sync=True)
        got: list[bytes] = []

        async def consume() -> None:
            async for record in store.changes(follow=True):
                got.append(record.key)

        task = asyncio.create_task(consume())
        await _until(lambda: got == [b"k"])
        await store.close()
        # The close cut the follower's pause of 1 s short: it ended while the store closed.
        assert task.done()
        with pytest.raises(kvlog.StoreClosedError):
            await task

    run(main())


def test_follow_on_a_read_only_handle(tmp_path: Path) -> None:
    with kvlog.open(tmp_path / "s", partitions=3) as writer:
        writer.put(b"old", b"1")

    async def main() -> None:
        async with kvlog.aio.open(tmp_path / "s", read_only=True, refresh_interval_ms=20) as reader:
            got: list[bytes] = []

            async def consume() -> None:
                async for record in reader.changes(follow=True):
                    got.append(record.key)

            task = asyncio.create_task(consume())
            await _until(lambda: got == [b"old"])
            writer = await kvlog.aio.open(tmp_path / "s")
            await writer.put(b"new", b"2", sync=True)
            await _until(lambda: got == [b"old", b"new"])
            await writer.close()
            await _cancel(task)

    run(main())
