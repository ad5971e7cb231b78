"""A consumer group member for asyncio: :class:`kvlog.Consumer` whose waits hold no thread.

:meth:`kvlog.aio.AsyncStore.consumer` makes one, handing it the store's way of running a call
in its workers (and of refusing calls once it closes). See :class:`AsyncConsumer`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from kvlog.clock import Clock
from kvlog.consumer import Consumer
from kvlog.errors import InvalidRecordError, StoreClosedError
from kvlog.log import Log
from kvlog.log.head import HEAD_NAME
from kvlog.log.records import Record
from kvlog.log.waiting import check_timeout
from kvlog.storage.watch import RenameWatch

__all__ = ["AsyncConsumer"]

_R = TypeVar("_R")


class AsyncConsumer:
    """:class:`kvlog.Consumer` as coroutines (create with :meth:`kvlog.aio.AsyncStore.consumer`).

    Reading records, seeking and committing run in the store's workers, one hop each. A
    ``poll`` that finds nothing waits on the event loop itself, never in a worker: on a local
    root for the head's rename, which the kernel reports (the watch's descriptor is a reader of
    the loop); elsewhere, and as a backstop, for ``follow_interval_ms``. It then reads the head
    and looks again, until records come or its timeout passes. Cancellation never loses
    records: a poll whose task is cancelled after its worker read records puts the positions
    back to the first of them, so the next poll returns them again.
    """

    def __init__(self, consumer: Consumer, the_log: Log, clock: Clock, *,
                 call: Callable[..., Awaitable[Any]], submit: Callable[[Callable[[], Any]], Future[Any]],
                 closing: Callable[[], bool], closed: asyncio.Event) -> None:
        self._consumer = consumer
        self._log = the_log
        self._clock = clock
        self._call = call
        self._submit = submit
        self._closing = closing
        self._closed = closed
        #: The consumer group.
        self.group = consumer.group
        #: The partitions this consumer reads, in the order given.
        self.partitions = consumer.partitions

    @property
    def sync(self) -> Consumer:
        """The :class:`kvlog.Consumer` this wraps (use it only from a worker: ``astore.call``)."""
        return self._consumer

    async def _hop(self, fn: Callable[..., _R], *args: Any) -> _R:
        result: _R = await self._call(fn, *args)
        return result

    # -- reading ----------------------------------------------------------------------------------
    async def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Record]:
        """:meth:`kvlog.Consumer.poll`: up to ``max_records`` records past the positions; when
        there are none, waits up to ``timeout_s`` for commits that bring some (on the loop)."""
        timeout = check_timeout(timeout_s)
        if not isinstance(max_records, int) or isinstance(max_records, bool) or max_records <= 0:
            raise InvalidRecordError(f"max_records must be an integer > 0, not {max_records!r}")
        monotonic_s = self._clock.monotonic_s
        deadline = monotonic_s() + timeout
        watch = self._log.storage.watch_swaps(HEAD_NAME) if timeout > 0 else None
        try:
            refresh = False
            while True:
                records = await self._read(max_records, refresh)
                left = deadline - monotonic_s()
                if records or left <= 0:
                    return records
                await self._wait(watch, min(left, self._log.config.follow_interval_ms / 1000.0))
                refresh = True
        finally:
            if watch is not None:
                watch.close()

    async def _read(self, max_records: int, refresh: bool) -> list[Record]:
        """One look in a worker (after reading the head when ``refresh``); a task cancelled
        meanwhile leaves the positions where they were (see the class's docstring)."""
        if self._closing():
            raise StoreClosedError("the store is closed")
        consumer, the_log = self._consumer, self._log

        def read() -> list[Record]:
            if refresh:
                the_log.refresh()  # other processes' commits: what woke the wait
            return consumer.poll(timeout_s=0.0, max_records=max_records)

        try:
            job: Future[list[Record]] = self._submit(read)
        except RuntimeError:  # the workers shut down: the store closed since the check above
            raise StoreClosedError("the store is closed") from None
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            job.add_done_callback(self._rewind)
            raise

    def _rewind(self, job: Future[list[Record]]) -> None:
        """Put the positions back to the first record of each partition a cancelled poll read."""
        if job.cancelled() or job.exception() is not None:
            return
        first: dict[int, int] = {}
        for record in job.result():
            first.setdefault(record.partition, record.offset)
        if first:
            with contextlib.suppress(StoreClosedError):
                self._consumer.seek_all(first)

    async def _wait(self, watch: RenameWatch | None, pause: float) -> None:
        """Sleep on the loop until the head is renamed (``watch``) or ``pause`` passes, or the
        store closes."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[bool] = loop.create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(True)

        reading = False
        if watch is not None:
            try:
                loop.add_reader(watch.fileno(), wake)
                reading = True
            except (NotImplementedError, RuntimeError):  # a loop without readers: only look
                pass
        closed: asyncio.Future[bool] = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({woken, closed}, timeout=pause, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            if reading and watch is not None:
                loop.remove_reader(watch.fileno())
                watch.drain()
        if self._closing():
            raise StoreClosedError("the store is closed")

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._records()

    async def _records(self) -> AsyncIterator[Record]:
        """Every record from the positions on, waiting for new ones until the store closes."""
        while True:
            for record in await self.poll():
                yield record

    # -- positions and offsets ----------------------------------------------------------------
    async def position(self, partition: int) -> int:
        """:meth:`kvlog.Consumer.position`."""
        return await self._hop(self._consumer.position, partition)

    async def seek(self, partition: int, offset: int) -> None:
        """:meth:`kvlog.Consumer.seek`."""
        await self._hop(self._consumer.seek, partition, offset)

    async def seek_all(self, offsets: Mapping[int, int]) -> None:
        """:meth:`kvlog.Consumer.seek_all`."""
        await self._hop(self._consumer.seek_all, offsets)

    async def seek_to_beginning(self, partitions: Iterable[int] | None = None) -> None:
        """:meth:`kvlog.Consumer.seek_to_beginning`."""
        await self._hop(self._consumer.seek_to_beginning, partitions)

    async def seek_to_end(self, partitions: Iterable[int] | None = None) -> None:
        """:meth:`kvlog.Consumer.seek_to_end`."""
        await self._hop(self._consumer.seek_to_end, partitions)

    async def lag(self) -> dict[int, int]:
        """:meth:`kvlog.Consumer.lag`."""
        return await self._hop(self._consumer.lag)

    async def caught_up(self) -> bool:
        """:meth:`kvlog.Consumer.caught_up`."""
        return await self._hop(self._consumer.caught_up)

    async def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """:meth:`kvlog.Consumer.commit`."""
        await self._hop(self._consumer.commit, offsets)

    async def committed(self, partition: int) -> int | None:
        """:meth:`kvlog.Consumer.committed`."""
        return await self._hop(self._consumer.committed, partition)

    def close(self) -> None:
        """:meth:`kvlog.Consumer.close` (positions not committed are dropped)."""
        self._consumer.close()

    def __repr__(self) -> str:
        return f"Async{self._consumer!r}"
