"""kvlog for asyncio: the :class:`~kvlog.Store` API as coroutines that never block the event loop.

>>> import asyncio, tempfile, kvlog.aio
>>> async def main():
...     async with kvlog.aio.open(tempfile.mkdtemp()) as store:
...         await store.put(b"k", b"v")
...         return await store.get(b"k")
>>> asyncio.run(main())
b'v'

Threads. Two calls that memory answers run on the event loop itself, with no thread hop: a
plain ``put`` of bytes (``sync=False``, no time to live), which only appends to the write
buffer under its lock (the flush a full buffer triggers, and backpressure, then run in a
worker), and a ``get`` whose answer is in memory: this process's unflushed writes, or a key the
key index says is absent or holds inline (reading the index is a lookup in the LMDB map, which
is memory). Every other call, and every ``get`` that must read a data file or refresh first,
runs in a worker thread of a
bounded :class:`~concurrent.futures.ThreadPoolExecutor` that the :class:`AsyncStore` owns
(``workers`` threads, 4 by default) and shuts down when it closes. A store of its own, not the
loop's default executor: a long flush or a slow object store then never starves the other
users of ``asyncio.to_thread``, and closing can wait for exactly the calls this store started.
Opening and closing run in a thread of their own (closing waits for those workers). For the
rest, the event loop thread only hands calls over and receives results.

Iterators. :meth:`AsyncStore.scan` and :meth:`AsyncStore.changes` are async generators over the
sync iterators, which are made and advanced only in the workers, :data:`CHUNK_ROWS` rows per
thread hop. Closing one (``aclose()``, leaving an ``async for`` by an exception, cancellation,
or dropping it) closes the sync iterator in a worker, which releases its snapshot.

Consumers. :meth:`AsyncStore.consumer` gives an :class:`AsyncConsumer`: its reads, seeks and
commits are worker hops, and a ``poll`` that waits for new records waits on the loop (for the
head's rename on a local root, else ``follow_interval_ms``), holding no worker.

Cancellation. A call is handed to the executor whole: cancelling the task that awaits it either
withdraws it before a worker starts it (it never runs) or, once started, lets it run to the
end and discards its result. A put, a delete, a flush or a compaction is thus done completely or
not at all, never half; the caller of a cancelled write does not learn which (``flush()``
afterwards, then read). A cancelled ``async for`` ends its iterator and releases its snapshot.
:meth:`AsyncStore.close` refuses new calls at once (:class:`~kvlog.errors.StoreClosedError`),
waits for the calls already running, makes those still queued raise ``StoreClosedError``,
closes the open iterators, then closes the store (flushing, unless ``flush=False``). An
async store the program never closes is closed through the :class:`~kvlog.Store` it wraps, as
that one is: flushed at interpreter exit, or when the garbage collector frees it.

Errors are the sync API's: every :mod:`kvlog.errors` error raised in a worker reaches the
awaiting task unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import threading
import weakref
from collections.abc import (
    AsyncGenerator,
    Callable,
    Generator,
    Iterable,
    Iterator,
)
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Generic, TypeVar

from kvlog.aio_consumer import AsyncConsumer
from kvlog.clock import Clock, IdSource
from kvlog.compaction import CompactionReport
from kvlog.config import StoreConfig
from kvlog.consumer import Consumer, GroupInfo
from kvlog.errors import ConfigError, StoreClosedError
from kvlog.log.records import Record
from kvlog.storage import Storage
from kvlog.store import NOT_AT_ONCE, Store, open_store

__all__ = ["AsyncConsumer", "AsyncStore", "CHUNK_ROWS", "DEFAULT_WORKERS", "Opening", "open"]

#: Rows (scan pairs or changelog records) fetched per worker hop by an async iterator.
CHUNK_ROWS = 256
#: Worker threads of an :class:`AsyncStore` unless ``workers`` says otherwise.
DEFAULT_WORKERS = 4
#: Bounds of the pause between two looks for new commits of ``changes(follow=True)``; within
#: them the pause is the store's ``refresh_interval_ms``.
FOLLOW_WAIT_MIN_S = 0.01
FOLLOW_WAIT_MAX_S = 1.0

_T = TypeVar("_T")
_R = TypeVar("_R")


def _check_workers(workers: int) -> int:
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"workers={workers!r}: must be an int >= 1")
    return workers


class _RowSource(Generic[_T]):
    """A sync iterator made and advanced only in worker threads, one thread at a time.

    The lock orders a fetch still running in a worker (its awaiting task was cancelled) before
    the close of the same iterator, which may come from another worker.
    """

    __slots__ = ("_make", "_rows", "_lock", "is_open", "__weakref__")

    def __init__(self, make: Callable[[], Iterator[_T]]) -> None:
        self._make: Callable[[], Iterator[_T]] | None = make
        self._rows: Iterator[_T] | None = None
        self._lock = threading.Lock()
        #: False once the rows are exhausted, failed or closed: nothing left to release.
        self.is_open = True

    def fetch(self) -> tuple[list[_T], bool]:
        """The next chunk, and whether the rows ended with it (then they are released)."""
        with self._lock:
            if not self.is_open:
                return [], True
            try:
                if self._rows is None:
                    assert self._make is not None
                    self._rows = self._make()
                    self._make = None
                chunk = list(itertools.islice(self._rows, CHUNK_ROWS))
            except BaseException:
                self._release()
                raise
            if len(chunk) < CHUNK_ROWS:
                self._release()
            return chunk, not self.is_open

    def close(self) -> None:
        """Close the sync iterator (releasing its snapshot); a no-op once it ended."""
        with self._lock:
            self._release()

    def _release(self) -> None:
        rows, self._rows, self._make = self._rows, None, None
        self.is_open = False
        close = getattr(rows, "close", None)
        if close is not None:
            close()


class AsyncStore:
    """An open kvlog store for asyncio; create with :func:`kvlog.aio.open`, or wrap an open
    :class:`~kvlog.Store` (the async store then owns it: closing one closes both)."""

    def __init__(self, store: Store, *, workers: int = DEFAULT_WORKERS) -> None:
        self._store = store
        self._executor = ThreadPoolExecutor(_check_workers(workers), thread_name_prefix="kvlog-aio")
        self._closing = False
        self._closed_event = asyncio.Event()
        self._close_future: asyncio.Future[None] | None = None
        self._sources: weakref.WeakSet[_RowSource[Any]] = weakref.WeakSet()
        wait_s = store.config.refresh_interval_ms / 1000.0
        self._follow_wait_s = min(FOLLOW_WAIT_MAX_S, max(FOLLOW_WAIT_MIN_S, wait_s))

    @property
    def sync(self) -> Store:
        """The underlying :class:`~kvlog.Store` (blocking: call it from a thread, not the loop)."""
        return self._store

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closing

    # -- handing calls to the workers -----------------------------------------------------------
    def _job(self, fn: Callable[..., _R], args: tuple[Any, ...]) -> _R:
        """Run in a worker: a call queued before close began but started after it is refused."""
        if self._closing:
            raise StoreClosedError("the store was closed")
        return fn(*args)

    async def _call(self, fn: Callable[..., _R], *args: Any) -> _R:
        if self._closing:
            raise StoreClosedError("the store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._job, fn, args)

    def _submit(self, fn: Callable[[], None]) -> Future[None] | None:
        """``fn`` queued in a worker from any thread, not awaited; None once the executor is
        shut down (close then takes care of what ``fn`` would have done)."""
        try:
            return self._executor.submit(fn)
        except RuntimeError:
            return None

    async def call(self, fn: Callable[..., _R], *args: Any) -> _R:
        """``fn(*args)`` in one of this store's workers: any blocking use of :attr:`sync` (a
        write batch, ``check()``…) without blocking the loop, under the same close rules."""
        return await self._call(fn, *args)

    # -- writes ---------------------------------------------------------------------------------
    async def put(self, key: bytes | str, value: bytes | str, *, sync: bool = False,
                  ttl_ms: int | None = None) -> None:
        """:meth:`kvlog.Store.put`: set ``key``; with ``sync=True`` return once durable; with
        ``ttl_ms`` the record expires that long after its timestamp. A plain put of bytes
        is buffered on the loop itself (see the module's docstring)."""
        if not sync and ttl_ms is None and not self._closing:
            due = self._store._put_at_once(key, value)
            if due is not None:
                if due:  # the buffer's trigger: a flush, or backpressure, in a worker
                    await self._call(self._store._after_put_trigger)
                return
        await self._call(functools.partial(self._store.put, key, value, sync=sync, ttl_ms=ttl_ms))

    async def delete(self, key: bytes | str, *, sync: bool = False) -> None:
        """:meth:`kvlog.Store.delete`: append a tombstone for ``key``."""
        await self._call(functools.partial(self._store.delete, key, sync=sync))

    async def flush(self) -> int:
        """:meth:`kvlog.Store.flush`: make every earlier write durable; the commit version."""
        return await self._call(self._store.flush)

    async def refresh(self) -> int:
        """:meth:`kvlog.Store.refresh`: apply other writers' commits; the applied version."""
        return await self._call(self._store.refresh)

    # -- reads ----------------------------------------------------------------------------------
    async def get(self, key: bytes | str, default: Any = None) -> Any:
        """:meth:`kvlog.Store.get`: the value of ``key``, or ``default``. Answered on the loop
        when memory holds the answer (see the module's docstring)."""
        if not self._closing:
            found = self._store._get_at_once(key)
            if found is not NOT_AT_ONCE:
                return default if found is None else found
        return await self._call(self._store.get, key, default)

    async def get_many(self, keys: Iterable[bytes | str]) -> list[bytes | None]:
        """The values of ``keys`` in the order asked (None where missing), in one worker hop."""
        return await self._call(self._store.get_many, keys)

    async def contains(self, key: object) -> bool:
        """``key in store``: False for a key that cannot be stored, as in a dict."""
        return await self._call(self._store.__contains__, key)

    def consumer(self, group: str, partitions: Iterable[int] | None = None, *,
                 hold_tombstones: bool = False) -> AsyncConsumer:
        """:meth:`kvlog.Store.consumer` for asyncio: a member of consumer group ``group`` whose
        polls wait on the loop, holding no worker (see :class:`kvlog.aio.AsyncConsumer`). A
        tombstone hold is committed by the consumer's first call, in a worker, before it reads."""
        if self._closing:
            raise StoreClosedError("the store is closed")
        sync = Consumer(self._store.log, group, partitions, hold_tombstones=hold_tombstones, defer_hold=True)
        return AsyncConsumer(
            sync, self._store.log, self._store.clock, call=self._call,
            submit=lambda fn: self._executor.submit(self._job, fn, ()), closing=lambda: self._closing,
            closed=self._closed_event)

    async def consumer_groups(self) -> list[GroupInfo]:
        """:meth:`kvlog.Store.consumer_groups`: every consumer group, with lags and holds."""
        return await self._call(self._store.consumer_groups)

    async def delete_group(self, group: str) -> None:
        """:meth:`kvlog.Store.delete_group`: forget a consumer group and its tombstone hold."""
        await self._call(self._store.delete_group, group)

    async def end_offsets(self) -> dict[int, int]:
        """:meth:`kvlog.Store.end_offsets`: every partition's next offset, after reading the head."""
        return await self._call(self._store.end_offsets)

    async def begin_offsets(self) -> dict[int, int]:
        """:meth:`kvlog.Store.begin_offsets`: every partition's lowest offset still in the log."""
        return await self._call(self._store.begin_offsets)

    def scan(
        self, start: bytes | str | None = None, stop: bytes | str | None = None, *,
        prefix: bytes | str | None = None, reverse: bool = False,
    ) -> AsyncGenerator[tuple[bytes, bytes], None]:
        """:meth:`kvlog.Store.scan` as an async iterator: ``(key, value)`` pairs of one snapshot,
        :data:`CHUNK_ROWS` per worker hop. Bad bounds raise when iteration starts."""
        return self._rows(_RowSource(
            functools.partial(self._store.scan, start, stop, prefix=prefix, reverse=reverse)))

    async def changes(
        self, partition: int | None = None, from_offset: int = 0, *, follow: bool = False,
    ) -> AsyncGenerator[Record, None]:
        """:meth:`kvlog.Store.changes` as an async iterator: durable records in offset order, one
        partition or all of them one after another, :data:`CHUNK_ROWS` per worker hop.

        With ``follow=True`` it never ends: once the log is read it waits for new commits (this
        process's flushes, other processes' commits) and yields their records, partition by
        partition from where each stopped. Waiting holds no worker thread; it ends when the
        consuming task is cancelled or the iterator closed, and raises
        :class:`~kvlog.errors.StoreClosedError` when the store closes. Bad arguments raise when
        iteration starts.
        """
        cursors: dict[int, int] = {}
        while True:
            version = await self._call(self._version)
            source: _RowSource[Record] = _RowSource(
                functools.partial(self._round, partition, from_offset, cursors))
            async with contextlib.aclosing(self._rows(source)) as records:
                async for record in records:
                    yield record
            if not follow:
                return
            while await self._wait_for_commit(version) <= version:
                pass

    def _version(self) -> int:
        self._store.log.check_open()
        return self._store.log.version

    def _round(self, partition: int | None, from_offset: int, cursors: dict[int, int]) -> Iterator[Record]:
        """In a worker: each partition's records from its cursor on, moving the cursors."""
        if partition is not None:
            self._store.log.check_partition(partition)  # before it keys the cursors
        parts = range(self._store.log.partitions) if partition is None else (partition,)
        for p in parts:
            for record in self._store.changes(p, cursors.get(p, from_offset)):
                cursors[p] = record.offset + 1
                yield record

    async def _wait_for_commit(self, after_version: int) -> int:
        """Wait for a commit newer than ``after_version``: the applied version once one is
        applied, or after one pause (it may still be ``after_version``). The only place
        ``changes(follow=True)`` waits: a pause on the loop (no worker held, cut short by
        close), then one refresh in a worker."""
        try:
            await asyncio.wait_for(self._closed_event.wait(), self._follow_wait_s)
        except TimeoutError:
            pass
        return await self._call(self._store.refresh)

    async def _rows(self, source: _RowSource[_T]) -> AsyncGenerator[_T, None]:
        """The rows of ``source``, one worker hop per chunk; the source is closed in a worker
        however the iteration ends (exhausted, failed, cancelled, closed or dropped)."""
        self._sources.add(source)
        cancelled = False
        try:
            while True:
                chunk, ended = await self._call(source.fetch)
                for row in chunk:
                    yield row
                if ended:
                    return
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            if source.is_open:
                job = self._submit(source.close)
                # aclose() returns once the snapshot is released; a cancelled task does not wait
                # (its fetch may still be running: the close follows it in a worker).
                if job is not None and not cancelled:
                    await asyncio.shield(asyncio.wrap_future(job))

    # -- maintenance ----------------------------------------------------------------------------
    async def compact(self, *, force: bool = False, now_ms: int | None = None) -> CompactionReport:
        """:meth:`kvlog.Store.compact`: one compaction job now, reported."""
        return await self._call(functools.partial(self._store.compact, force=force, now_ms=now_ms))

    async def stats(self) -> dict[str, Any]:
        """:meth:`kvlog.Store.stats`: counts, sizes, versions, flush and cache state."""
        return await self._call(self._store.stats)

    async def check(self) -> list[str]:
        """:meth:`kvlog.Store.check`: invariants verified against storage (empty: consistent)."""
        return await self._call(self._store.check)

    async def gc(self) -> dict[str, int]:
        """:meth:`kvlog.Store.gc`: delete replaced files and old commits past their delay."""
        return await self._call(self._store.gc)

    async def disk_usage(self) -> dict[str, int]:
        """:meth:`kvlog.Store.disk_usage`: bytes of the store and its cache by what holds them."""
        return await self._call(self._store.disk_usage)

    # -- closing --------------------------------------------------------------------------------
    async def close(self, *, flush: bool = True) -> None:
        """Close (see the module's notes on cancellation); calling it again waits for the first
        close. Cancelling the caller does not stop the close, which runs in its own thread."""
        if self._close_future is None:
            self._closing = True
            self._closed_event.set()
            self._close_future = _in_thread(functools.partial(self._shut_down, flush), "kvlog-aio-close")
        await asyncio.shield(self._close_future)

    def _shut_down(self, flush: bool) -> None:
        """In the closing thread: wait for the workers, release open iterators, close the store."""
        self._executor.shutdown(wait=True)
        try:
            for source in list(self._sources):
                source.close()
        finally:
            self._store.close(flush=flush)

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncStore({self._store!r})"


def _in_thread(fn: Callable[[], _R], name: str,
               orphan: Callable[[_R], None] | None = None) -> asyncio.Future[_R]:
    """``fn()`` in a new (non-daemon) thread, as a future of the running loop. If the future was
    cancelled (or the loop closed) before ``fn`` returned, its result goes to ``orphan``."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_R] = loop.create_future()

    def deliver(value: Any, error: BaseException | None) -> None:
        if future.cancelled():
            if error is None and orphan is not None:
                threading.Thread(target=orphan, args=(value,), name=name).start()
        elif error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def run() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            error = e
        try:
            loop.call_soon_threadsafe(deliver, value, error)
        except RuntimeError:  # the loop is closed: nobody awaits the result
            if error is None and orphan is not None:
                orphan(value)

    threading.Thread(target=run, name=name).start()
    return future


class Opening:
    """What :func:`open` returns: ``await`` it for an :class:`AsyncStore`, or use it as
    ``async with`` (the store is closed when the block exits). Each ``await`` opens."""

    def __init__(self, opener: Callable[[], Store], workers: int) -> None:
        self._opener = opener
        self._workers = workers
        self._store: AsyncStore | None = None

    def __await__(self) -> Generator[Any, None, AsyncStore]:
        return self._open().__await__()

    async def _open(self) -> AsyncStore:
        workers = _check_workers(self._workers)
        # Cancelled while opening: the open runs to its end in its thread, then that store is closed.
        store = await _in_thread(self._opener, "kvlog-aio-open", orphan=_close_quietly)
        return AsyncStore(store, workers=workers)

    async def __aenter__(self) -> AsyncStore:
        self._store = await self._open()
        return self._store

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._store is not None:
            await self._store.close()


def _close_quietly(store: Store) -> None:
    store.close()


def open(  # noqa: A001 - the public name, as kvlog.open
    uri: str | os.PathLike[str] | Storage,
    *,
    partitions: int | None = None,
    create: bool | None = None,
    read_only: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    clock: Clock | None = None,
    config: StoreConfig | None = None,
    ids: IdSource | None = None,
    producer_id: int | None = None,
    checkpoint: str | None = None,
    on_storage_behind: str = "raise",
    workers: int = DEFAULT_WORKERS,
    **settings: Any,
) -> Opening:
    """Open the store at ``uri`` for asyncio: the arguments of :func:`kvlog.open`, plus
    ``workers``, the size of the store's thread pool. ``await kvlog.aio.open(...)`` or
    ``async with kvlog.aio.open(...) as store``; opening runs in a thread, and its errors
    (:class:`~kvlog.errors.ConfigError`, :class:`~kvlog.errors.StoreNotFoundError`…) are
    raised by the ``await``."""
    return Opening(functools.partial(
        open_store, uri, partitions=partitions, create=create, read_only=read_only,
        cache_dir=cache_dir, storage_options=storage_options, clock=clock, config=config,
        ids=ids, producer_id=producer_id, checkpoint=checkpoint,
        on_storage_behind=on_storage_behind, **settings,
    ), workers)
