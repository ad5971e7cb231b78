"""The ``Store`` facade: a dict-like key-value API over the log.

Reads ask the key index (``kvlog.index.KeyIndex``: this process's unapplied
writes, then the LMDB index), which answers with the value (from the memtable or
inline) or where it is (one batch read through the bounded cache).
Writes are buffered and committed by the flusher; see :mod:`kvlog.log.flusher`.

Every writable handle is a producer. Opened without ``producer_id`` it is a producer of its
own (Kafka's idempotent producer without a transactional id): a fresh id, epoch 0, nothing
committed at open, so any number of handles and processes write at once and none fences
another. An explicit ``producer_id`` is a stable identity: opening it bumps its epoch, fencing
an earlier holder of the same id.

A handle the program never closes is closed the way Python closes an unclosed file: when
the garbage collector frees it (with a :class:`ResourceWarning`), and at interpreter exit
(an ``atexit`` hook over weak references to the open handles); both flush its buffered
writes. Neither runs in a process forked from the one that opened the handle: a child never
flushes or closes its parent's handle.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Iterable, Iterator
from types import MethodType, TracebackType
from typing import Any, TypeVar

from kvlog import unclosed
from kvlog._native import active as native_active
from kvlog.clock import Clock, IdSource
from kvlog.compaction import CompactionReport, Compactor, check_compact_args
from kvlog.config import KEY_BYTES_LIMIT, StoreConfig
from kvlog.consumer import Consumer, GroupInfo, consumer_groups, delete_group
from kvlog.errors import ConfigError, InvalidRecordError, ReadOnlyError, StoreClosedError
from kvlog.index import STALE, IndexEntry, IndexReader, RecordExpired
from kvlog.log import Log, open_log, pins_named
from kvlog.log.disk_usage import disk_usage
from kvlog.log.flusher import Flusher
from kvlog.log.pins_named import Checkpoint
from kvlog.log.records import Record, check_ttl, to_key, to_value
from kvlog.snapshot import OpenScans, Snapshot, key_bound, open_snapshot, to_keys
from kvlog.storage import Storage
from kvlog.views import StoreMapping

__all__ = ["Store", "WriteBatch", "open_store"]

_MISSING = object()
#: What :meth:`Store._get_at_once` returns when memory cannot answer.
NOT_AT_ONCE = object()
_T = TypeVar("_T")



class WriteBatch:
    """Writes applied together, all or nothing, durable when the ``with`` block exits."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._records: list[tuple[bytes, bytes | None]] = []
        self._ttls: list[int | None] | None = None  # one per record once a put has a ttl_ms
        self._done = False

    def put(self, key: bytes | str, value: bytes | str, *, ttl_ms: int | None = None) -> None:
        """Add a put (expiring ``ttl_ms`` after the batch's timestamp, when given); bad input
        raises at once and is not added (the rest of the batch stands)."""
        if ttl_ms is None:
            self._add(key, value, is_put=True)
            if self._ttls is not None:
                self._ttls.append(None)
            return
        ttl = check_ttl(ttl_ms)
        self._add(key, value, is_put=True)
        if self._ttls is None:
            self._ttls = [None] * (len(self._records) - 1)
        self._ttls.append(ttl)

    def delete(self, key: bytes | str) -> None:
        """Add a delete (a tombstone)."""
        self._add(key, None, is_put=False)
        if self._ttls is not None:
            self._ttls.append(None)

    def _add(self, key: Any, value: Any, *, is_put: bool) -> None:
        if self._done:
            raise StoreClosedError("this write batch is finished")
        # Validated before it is added: a refused record changes nothing, and a caller that
        # catches the error keeps the records it added before and after it.
        self._records.append(self._store._record(key, to_value(value) if is_put else None))

    def __len__(self) -> int:
        return len(self._records)

    def __enter__(self) -> WriteBatch:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done = True
        if kind is None and self._records:
            self._store._writer().write(self._records, sync=True, ttls=self._ttls)


class Store(StoreMapping):
    """An open kvlog store. Create with :func:`kvlog.open`.

    A :class:`collections.abc.MutableMapping` of bytes to bytes. Equality and hashing are
    those of a handle (identity), not of the content: comparing two stores by content would
    scan both; compare ``dict(a.items()) == dict(b.items())`` for that.
    """

    def __init__(self, log: Log, *, producer_id: int | None = None) -> None:
        self.log = log
        self.config = log.config
        self._clock = log.clock
        self._index = log.index
        self._lookup = log.index.fast_lookup
        self._partitions = log.partitions
        self._max_key = self.config.max_key_bytes
        self._max_record = self.config.max_record_bytes
        self._monotonic_s = self._clock.monotonic_s
        self._refresh_s = self.config.refresh_interval_ms / 1000.0
        self._closed = False
        self._lock = threading.Lock()
        self._refresh_at = float('-inf')  # monotonic time of the next refresh due
        self._flusher: Flusher | None = None
        self._compactor: Compactor | None = None
        self._snapshots: weakref.WeakSet[Snapshot] = weakref.WeakSet()
        self._scans = OpenScans(lambda: self._closed, "the store was closed while this iterator was in use")
        if type(self).get is Store.get:
            # store.get(key) and store.get(key, default) with a valid bytes key of an open store:
            # one call of the index (kvlog.index.reads.bound_get), no Python frame; every other
            # call is the method's below, which gives the same answers and raises every error.
            self.__dict__["get"] = self._index.bind_get(self, MethodType(Store.get, self), self._found,
                                                        KEY_BYTES_LIMIT)
        if not log.read_only:
            if producer_id is None:
                producer = log.producer(None)  # a producer of its own: a fresh id, epoch 0, no commit
            else:
                with log.settle_deferred():  # opening never waits for the index runs to merge
                    producer = log.producer(producer_id)  # the next epoch: fences an earlier holder
            self._flusher = Flusher(log, producer.producer_id, producer.epoch, self._index.memtable)
            if self.config.flush_interval_ms > 0:
                self._flusher.start()
            self._compactor = Compactor(log)
            if self.config.background_compaction:
                self._compactor.start()
        # Set last: a handle whose opening failed is never closed for the program.
        self._owner_pid = os.getpid()
        unclosed.opened(self)

    @property
    def clock(self) -> Clock:
        """The store's clock: record timestamps and expiry decisions read it."""
        return self._clock

    # -- helpers ----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    def _writer(self) -> Flusher:
        self._check_open()
        if self._flusher is None:
            raise ReadOnlyError("the store is open read-only")
        return self._flusher

    def _record(self, key: Any, value: bytes | None) -> tuple[bytes, bytes | None]:
        if value is None:
            # A delete also takes a longer key that the store holds: one written before
            # max_key_bytes was lowered must stay deletable.
            k = to_key(key, KEY_BYTES_LIMIT)
            if len(k) > self.config.max_key_bytes and self.get(k, _MISSING) is _MISSING:
                raise InvalidRecordError(
                    f"a key of {len(k)} bytes is larger than max_key_bytes={self.config.max_key_bytes}"
                )
        else:
            k = to_key(key, self.config.max_key_bytes)
        size = len(k) + (len(value) if value is not None else 0)
        if size > self.config.max_record_bytes:
            raise InvalidRecordError(
                f"a record of {size} bytes is larger than max_record_bytes={self.config.max_record_bytes}"
            )
        return k, value

    def _write(self, records: list[tuple[bytes, bytes | None]], *, sync: bool) -> None:
        self._writer().write(records, sync=sync)

    def _maybe_refresh(self) -> None:
        now = self._monotonic_s()
        if now >= self._refresh_at:
            self._refresh_at = now + self._refresh_s
            self.log.refresh()

    # -- writes -----------------------------------------------------------------------------------
    def put(self, key: bytes | str, value: bytes | str, *, sync: bool = False,
            ttl_ms: int | None = None) -> None:
        """Set ``key`` to ``value``; with ``sync=True`` return once durable. With ``ttl_ms`` (a
        positive int) the record expires ``ttl_ms`` milliseconds after its timestamp: reads stop
        seeing it then, and compaction removes it."""
        if ttl_ms is not None:
            ttl = check_ttl(ttl_ms)
            k, v = self._record(key, to_value(value))
            self._writer().write([(k, v)], sync=sync, ttls=(ttl,))
            return
        flusher = self._flusher
        if (type(key) is bytes and type(value) is bytes and 0 < len(key) <= self._max_key
                and len(key) + len(value) <= self._max_record and flusher is not None
                and not self._closed):
            if not sync:
                if flusher.buffer_put(key, value):
                    flusher.after_trigger()
                return
            flusher.write(((key, value),), sync=True)
            return
        k, v = self._record(key, to_value(value))
        self._writer().write([(k, v)], sync=sync)

    def _put_at_once(self, key: object, value: object) -> bool | None:
        """A plain put buffered without waiting for anything but the buffer's lock, for
        :mod:`kvlog.aio` to make on the event loop: None when this is not such a put (the
        caller makes it with :meth:`put` in a worker), else whether the buffer's trigger is
        due (then :meth:`_after_put_trigger` must run, in a worker: it may flush or wait)."""
        flusher = self._flusher
        if (type(key) is bytes and type(value) is bytes and 0 < len(key) <= self._max_key
                and len(key) + len(value) <= self._max_record and flusher is not None
                and not self._closed):
            return flusher.buffer_put(key, value)
        return None

    def _after_put_trigger(self) -> None:
        """Attend to a buffer whose put returned True (see :meth:`_put_at_once`)."""
        if self._flusher is not None:
            self._flusher.after_trigger()

    def _get_at_once(self, key: object) -> Any:
        """The value of a valid ``key`` when memory answers it (the memtable, or a value kept
        in the key index) without a look at storage, for :mod:`kvlog.aio` to read on the event
        loop: the value, None for a key that is not there, or :data:`NOT_AT_ONCE` (the caller
        reads with :meth:`get` in a worker: a data file to read, or a refresh due)."""
        if type(key) is bytes and 0 < len(key) <= KEY_BYTES_LIMIT and not self._closed:
            found = self._lookup(key, self._refresh_at)
            if found is None or type(found) is bytes:
                return found
        return NOT_AT_ONCE

    def delete(self, key: bytes | str, *, sync: bool = False) -> None:
        """Delete ``key`` (append a tombstone); deleting a missing key is not an error."""
        k, v = self._record(key, None)
        self._writer().write([(k, v)], sync=sync)

    def batch(self) -> WriteBatch:
        """A write batch: ``with store.batch() as b: b.put(...); b.delete(...)``."""
        self._writer()
        return WriteBatch(self)

    def flush(self) -> int:
        """Make every earlier write durable; return the commit version."""
        self._check_open()
        if self._flusher is None:
            return self.log.version
        return self._flusher.flush()

    def refresh(self) -> int:
        """Apply commits made by other writers; return the applied version."""
        self._check_open()
        self._refresh_at = self._clock.monotonic_s() + self._refresh_s
        return self.log.refresh()

    # -- reads ------------------------------------------------------------------------------------
    def get(self, key: bytes | str, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        if type(key) is bytes and 0 < len(key) <= KEY_BYTES_LIMIT and not self._closed:
            # The common case: a valid key, one call of the index answering with its value.
            found = self._lookup(key, self._refresh_at)
            if type(found) is bytes:
                return found
            if found is None:
                return default
            return self._found(key, found, default)
        return self._get(key, default)

    def _get(self, key: Any, default: Any) -> Any:
        if self._closed:
            raise StoreClosedError("the store is closed")
        k = to_key(key, KEY_BYTES_LIMIT)  # reads take any key a store may hold
        found = self._lookup(k, self._refresh_at)
        if type(found) is bytes:
            return found
        if found is None:
            return default
        return self._found(k, found, default)

    def _found(self, k: bytes, found: Any, default: Any) -> Any:
        """The value of ``k`` from the index's answer that is neither a value nor None: it is
        stale (refresh, then look again), or an entry whose value is in a data file."""
        if found is STALE:
            self._maybe_refresh()
            found = self._lookup(k)
            if found is None:
                return default
            if isinstance(found, bytes):
                return found
        assert isinstance(found, IndexEntry)

        # Compaction may remove the entry's offset between the lookup above and the batch
        # lookup: look the key up again together with its batch, in one snapshot.
        def in_one_snapshot(r: IndexReader) -> Any:
            again = r.index_get(k)  # None when its record has expired meanwhile
            if again is None:
                return default
            try:
                return self.log.value_of(k, again, r)
            except RecordExpired:  # removed by a compaction whose clock saw it expired
                return default

        return self.log.snapshot(in_one_snapshot)

    def scan(
        self, start: bytes | str | None = None, stop: bytes | str | None = None, *,
        prefix: bytes | str | None = None, reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order (or reverse), ``start <= key < stop``, over one snapshot."""
        self._check_open()
        lo = None if start is None else key_bound(start)
        hi = None if stop is None else key_bound(stop)
        pre = None if prefix is None else key_bound(prefix)
        self._maybe_refresh()
        return self._scans.items(self._index.scan_parts(lo, hi, pre, reverse, self.log.value_of))

    def _while_open(self, items: Iterator[_T]) -> Iterator[_T]:
        """``items`` until the store is closed: then :class:`StoreClosedError`, whatever the
        closed snapshot or storage would have raised."""
        try:
            for item in items:
                if self._closed:
                    break
                yield item
            else:
                return
        except Exception:
            if not self._closed:
                raise
        raise StoreClosedError("the store was closed while this iterator was in use")

    def changes(self, partition: int | None = None, from_offset: int = 0) -> Iterator[Record]:
        """The changelog (durable records) in offset order; all partitions one after another."""
        self._check_open()
        self._maybe_refresh()
        if partition is not None:
            return self._while_open(self.log.read(partition, from_offset))
        # Every partition's reader is made here, so a bad offset is refused by the call itself.
        readers = [self.log.read(p, from_offset) for p in range(self.log.partitions)]

        def every() -> Iterator[Record]:
            for reader in readers:
                yield from reader

        return self._while_open(every())

    def end_offsets(self) -> dict[int, int]:
        """Every partition's next offset (Kafka's high watermark): what a consumer at these
        positions has read everything durable. Reads the head first (one look at storage), so
        other processes' commits count; this process's buffered writes do not (no offset yet)."""
        self._check_open()
        self.log.refresh()
        return self.log.end_offsets()

    def begin_offsets(self) -> dict[int, int]:
        """Every partition's lowest offset still in the log (compaction and retention remove
        records below it); its end offset when it holds nothing. Reads the head first."""
        self._check_open()
        self.log.refresh()
        return self.log.begin_offsets()

    # -- dict protocol (the rest of it: kvlog.views.StoreMapping) ------------------------------
    def __getitem__(self, key: bytes | str) -> bytes:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        assert isinstance(value, bytes)
        return value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes | str | bytearray | memoryview):
            return False
        try:
            return self.get(bytes(key) if isinstance(key, bytearray | memoryview) else key, _MISSING) is not _MISSING
        except InvalidRecordError:
            return False  # like a dict: a key that cannot be stored is simply not there

    def __len__(self) -> int:
        self._check_open()
        self._maybe_refresh()
        return self._index.count()

    # -- many keys, snapshots ---------------------------------------------------------------------
    def get_many(self, keys: Iterable[bytes | str]) -> list[bytes | None]:
        """The values of ``keys`` in the order given (None: no value), all from one snapshot:
        this process's unapplied writes, then the key index, then the data files, each batch
        read once. Duplicates are allowed; a bad key raises :class:`InvalidRecordError` before
        anything is read."""
        self._check_open()
        wanted = to_keys(keys)
        self._maybe_refresh()
        return self._index.get_many(wanted, self.log.values_of)

    def snapshot(self) -> Snapshot:
        """A read view pinned at the applied commit with this process's writes made before it
        (see :class:`kvlog.Snapshot`); close it, or use it in a ``with`` block."""
        self._check_open()
        self._maybe_refresh()
        snap = open_snapshot(self.log)
        self._snapshots.add(snap)
        return snap

    # -- maintenance ------------------------------------------------------------------------------
    def check(self) -> list[str]:
        """Invariants verified against storage; an empty list when the store is consistent."""
        self._check_open()
        from kvlog.check import check_store

        return check_store(self.log)

    def stats(self, *, count_keys: bool = True) -> dict[str, Any]:
        """Counts, sizes, versions, flush and cache state. ``count_keys=False``: ``live_keys`` is
        None while index runs wait to be merged (counting through them costs a lookup a key)."""
        self._check_open()
        from kvlog.check import log_stats

        out = log_stats(self.log, count_keys=count_keys)
        f = self._flusher
        out.update(memtable_keys=len(self._index.memtable), unflushed_bytes=f.unflushed_bytes if f else 0,
                   flushes=f.flushes if f else 0, records_flushed=f.records_flushed if f else 0,
                   flush_error=f.last_error if f else None, producer_id=f.producer_id if f else None,
                   producer_epoch=f.epoch if f else None, read_only=self.log.read_only,
                   compaction=self._compactor.stats() if self._compactor else None, native=native_active())
        return out

    def compact(self, *, force: bool = False, now_ms: int | None = None) -> CompactionReport:
        """Run one compaction job now (a cleaning round, or an L0 merge) and report it.

        ``force`` runs a cleaning round on every partition holding records even if none is
        eligible; ``now_ms`` overrides the clock for retention decisions. Durable writes only:
        call :meth:`flush` first to include buffered ones.
        """
        check_compact_args(force, now_ms)
        self._check_open()
        if self._compactor is None:
            raise ReadOnlyError("the store is open read-only")
        return self._compactor.run_once(force=force, now_ms=now_ms)

    def gc(self) -> dict[str, int]:
        """Delete replaced and orphan data files past their delay, and old commits."""
        self._check_open()
        return self.log.gc()

    def disk_usage(self) -> dict[str, int]:
        """Bytes the store and its metadata cache take, split by what holds them: live data
        files, replaced files awaiting deletion, unreferenced files, commits, the cache and its
        pages (see ``kvlog.log.disk_usage.disk_usage``). Lists ``data/`` and ``log/``."""
        self._check_open()
        return disk_usage(self.log)

    # -- consumer groups and named checkpoints: kvlog.consumer, kvlog.log.pins_named -------------
    def consumer(self, group: str, partitions: Iterable[int] | None = None, *,
                 hold_tombstones: bool = False) -> Consumer:
        """A consumer of ``partitions`` (all by default) in consumer group ``group``, starting
        at the group's committed offsets; ``hold_tombstones`` commits a tombstone hold for the
        group (see :class:`kvlog.Consumer`)."""
        self._check_open()
        return Consumer(self.log, group, partitions, hold_tombstones=hold_tombstones)

    def consumer_groups(self) -> list[GroupInfo]:
        """Every consumer group, by name: committed offsets, lags, last commit, hold."""
        self._check_open()
        self._maybe_refresh()
        return consumer_groups(self.log)

    def delete_group(self, group: str) -> None:
        """Forget consumer group ``group`` (offsets and tombstone hold) in every process."""
        self._writer()
        delete_group(self.log, group)

    def checkpoint(self, name: str) -> Checkpoint:
        """Flush, then keep the store as it is at this moment as the named checkpoint ``name``: in every
        process, GC keeps what reading it needs until :meth:`delete_checkpoint`. Open it with
        ``kvlog.open(uri, read_only=True, checkpoint=name)``."""
        self._writer()
        pins_named.check_name(name)
        self.flush()
        return pins_named.create(self.log, name)

    def checkpoints(self) -> list[Checkpoint]:
        """The named checkpoints, by name."""
        self._check_open()
        self._maybe_refresh()
        return pins_named.listed(self.log)

    def delete_checkpoint(self, name: str) -> None:
        """Delete the named checkpoint ``name``; the next :meth:`gc` frees what only it kept."""
        self._writer()
        pins_named.delete(self.log, name)

    def close(self, *, flush: bool = True) -> None:
        """Flush (unless ``flush=False``: unflushed writes are dropped, as in a crash) and release everything."""
        if self._closed:
            return
        try:
            if self._compactor is not None:
                self._compactor.stop()
            if self._flusher is not None:
                self._flusher.stop()
                if flush:
                    self._flusher.flush()
                    self.log.settle_index()  # leave the index whole for the next process
                else:
                    self._flusher.discard()
        finally:
            self._closed = True
            unclosed.closed(self)
            self._scans.close()
            for snap in list(self._snapshots):
                snap.close()  # a snapshot left open is released with the store
            self._index.release()
            self.log.close()

    def __getstate__(self) -> dict[str, Any]:
        """What a copy (``copy.copy``) takes: all but the bound ``get`` (the copy's reads the copy)
        and the owning process (freeing a copy never closes the state it shares)."""
        state = dict(self.__dict__)
        state.pop("get", None)
        state.pop("_owner_pid", None)
        return state

    def __del__(self) -> None:
        """A handle freed unclosed: warn (:class:`ResourceWarning`, like an unclosed file) and
        close it, flushing its buffered writes, in a thread of its own (the next open of a store
        waits for it): the freeing thread may be anywhere, its own flusher thread holding the
        buffer's lock, or LMDB's write lock, included. Not in a forked child (the handle is its
        parent's), nor once the interpreter is finalizing (the exit hook closed every handle)."""
        if self.__dict__.get("_owner_pid") != os.getpid() or self._closed or sys.is_finalizing():
            return
        unclosed.close_when_freed(self)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _name(self) -> str:
        """The store's URI, as warnings about an unclosed handle name it."""
        return self.log.storage.uri

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self.log.read_only else "open")
        return f"Store({self.log.storage.uri!r}, partitions={self.log.partitions}, {state})"


def open_store(
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
    **settings: Any,
) -> Store:
    """Open or create a store; see :func:`kvlog.open`. Every argument is checked before
    anything is created."""
    if producer_id is not None and (not isinstance(producer_id, int) or isinstance(producer_id, bool)
                                    or not 0 <= producer_id < 2**63):
        raise ConfigError(f"producer_id must be an integer in [0, 2^63), not {producer_id!r}")
    if config is not None and not isinstance(config, StoreConfig):
        raise ConfigError(f"config must be a StoreConfig, not {type(config).__name__}")
    cfg = StoreConfig.from_settings(config, **settings)
    unclosed.wait_for_background_closes()
    if partitions is not None:
        cfg = StoreConfig.from_settings(cfg, partitions=partitions)
    the_log = open_log(
        uri, create=create, partitions=partitions, read_only=read_only, cache_dir=cache_dir,
        storage_options=storage_options, config=cfg, clock=clock, ids=ids, checkpoint=checkpoint,
        on_storage_behind=on_storage_behind,
    )
    try:
        return Store(the_log, producer_id=producer_id)
    except BaseException:
        the_log.close()
        raise
