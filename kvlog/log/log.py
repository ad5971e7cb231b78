"""The log: a storage root, its commit log, and the metadata cache that replays it.

:class:`Log` is the face the store, the compactor and the Spark jobs use; each of
its responsibilities lives in a module of its own:

* :mod:`kvlog.log.committer` — the commit protocol and applying commits (replay);
* :mod:`kvlog.log.append` — data files and ``append`` commits;
* :mod:`kvlog.log.producer_handle` — producer epochs (fencing) and sequences;
* ``kvlog.log.checkpoints`` — writing and loading checkpoints;
* ``kvlog.log.gc`` — deleting replaced files, orphans and old commits;
* :mod:`kvlog.log.opening` — opening a log and catching its cache up with storage.

Commit order, and why (see docs/log.rst): a data file is written first, under a fresh
name nobody references; then the head is swapped to the commit (``kvlog.log.head``),
the single atomic switch that makes the file's batches live; then the commit
is applied to the LMDB cache. A crash before the commit leaves an orphan file
for GC; a crash after it loses nothing, since the cache is rebuilt from the
log; a replaced file is deleted only after ``file_delete_delay_ms`` so readers
of older versions keep their files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import pyarrow as pa

from kvlog.clock import Clock, IdSource
from kvlog.config import KEY_BYTES_LIMIT, StoreConfig
from kvlog.errors import (
    CorruptDataError,
    InvalidRecordError,
    KvlogError,
    StorageError,
    StoreClosedError,
)
from kvlog.format.commit import Commit, FileEntry
from kvlog.format.identity import Identity
from kvlog.index import IndexEntry, IndexReader, KeyIndex, RebuildChunk, RecordExpired
from kvlog.log import append, checkpoints, gc, producer_handle, waiting
from kvlog.log.append import PendingBatch
from kvlog.log.committer import Committer, OwnBatches
from kvlog.log.latency import HistogramSnapshot
from kvlog.log.pins import registry_for
from kvlog.log.producer_handle import Producer
from kvlog.log.reader import (
    BatchCache,
    DataFileMissing,
    batch_offsets,
    records_of_batch,
    value_in_batch,
    values_in_batches,
)
from kvlog.log.records import AppendResult, Record, partition_for_key, to_key
from kvlog.log.replay import ApplySettings
from kvlog.meta import CommitOutcome, EncodedRow, LiveBatch, LmdbEnv, MetaReader, release_env
from kvlog.progress import progress
from kvlog.storage import Storage

__all__ = ["Log"]

log = logging.getLogger("kvlog.log")

#: How many times an open's key index rebuild starts again at a newer head when a data file
#: no longer live there was deleted under it (see :meth:`Log.rebuild_index`).
_REBUILD_ATTEMPTS = 16

#: How many times :meth:`Log.snapshot` applies its function when map resizes keep ending it.
_SNAPSHOT_ATTEMPTS = 8


def check_read_offset(offset: object, what: str) -> int:
    """``offset`` if it is an offset a read may start or stop at (an int in [0, 2**63), not a
    bool: offsets are 64-bit), else :class:`InvalidRecordError` naming ``what``."""
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < 2**63:
        raise InvalidRecordError(f"{what} must be an integer in [0, 2**63), not {offset!r:.60}")
    return offset


class Log:
    """A store's log: partitions, offsets, producers, reads. See ``open_log``."""

    def __init__(
        self, storage: Storage, identity: Identity, env: LmdbEnv, config: StoreConfig,
        clock: Clock, ids: IdSource, read_only: bool, owns_storage: bool, maintain_index: bool = True,
    ) -> None:
        self.storage = storage
        self.identity = identity
        self.env = env
        self.config = config
        self.clock = clock
        self.ids = ids
        self.read_only = read_only
        self._owns_storage = owns_storage
        self.batch_cache = BatchCache(storage, config.cache_bytes)
        self._closed = False
        self._settings = ApplySettings(
            config.producer_id_expiration_ms, config.file_delete_delay_ms, config.inline_value_bytes,
            maintain_index, config.index_run_limit,
        )
        self._metadata_only = replace(self._settings, maintain_index=False)
        self.maintain_index = maintain_index
        #: Set on a log opened at a named checkpoint: the version it stays at (no commit after
        #: it is applied; see ``kvlog.log.pinned_open``).
        self.frozen_at: int | None = None
        #: Rows of the catalog's files and batches the last checkpoint wrote, by their stored
        #: bytes (see ``kvlog.log.checkpoints``).
        self.checkpoint_rows: dict[str, dict[bytes, EncodedRow]] = {}
        #: The newest checkpoint's version as this process last saw it in the cache (a lower
        #: bound: others sharing the cache may have written newer ones).
        self.checkpoint_seen = 0
        self._committer = Committer(self)
        #: Held while commits are applied: a reader holding it sees no apply in between.
        self.apply_lock = self._committer.apply_lock
        #: The key index, with this process's memtable in front of it.
        self.index = KeyIndex(env, run_limit=config.index_run_limit, apply_lock=self.apply_lock,
                              monotonic_s=clock.monotonic_s, now_ms=clock.now_ms)
        #: This process's read views of this store, whose files GC keeps (see ``kvlog.log.pins``).
        self.pins = registry_for(identity.store_uuid)

    # -- basic facts ------------------------------------------------------------------------------
    @property
    def partitions(self) -> int:
        """Number of partitions (fixed at creation)."""
        return self.identity.partitions

    def partition_for(self, key: bytes | str) -> int:
        """The partition of ``key`` (XXH3-64 of its bytes modulo the partition count).

        ``key`` is any key a store may hold (bytes-like, or str as UTF-8); anything else is an
        :class:`InvalidRecordError`, as it is for a put.
        """
        return partition_for_key(to_key(key, KEY_BYTES_LIMIT), self.partitions)

    def check_partition(self, partition: int) -> int:
        """``partition``, if it is one of this log's; else :class:`InvalidRecordError`."""
        if not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < self.partitions:
            raise InvalidRecordError(f"partition {partition!r} is not in [0, {self.partitions})")
        return partition

    def check_open(self) -> None:
        """Raise :class:`StoreClosedError` once the log is closed."""
        if self._closed:
            raise StoreClosedError("the log is closed")

    def reader(self) -> IndexReader:
        """A consistent snapshot of the metadata; ``close()`` it when done (or use :meth:`snapshot`)."""
        return self.index.reader()

    def snapshot(self, fn: Callable[[IndexReader], Any]) -> Any:
        """``fn`` applied to a read snapshot of the metadata.

        A resize of the LMDB map (the cache grew, here or in another process) ends every read
        transaction of this process, so ``fn``, which only reads, fails if one happens while it
        runs: it is then applied again to a new snapshot, as many times as resizes end it (a
        resize doubles the map, so they are few). Any other failure is raised.
        """
        gate = self.env.gate
        for attempt in range(_SNAPSHOT_ATTEMPTS):
            epoch = gate.epoch
            reader = self.reader()
            try:
                return fn(reader)
            except KvlogError:  # the reader's failures, LMDB's included, are kvlog errors
                if gate.epoch == epoch or attempt == _SNAPSHOT_ATTEMPTS - 1:
                    raise
            finally:
                reader.close()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def settle_index(self) -> int:
        """Merge the key index's pending runs into its B-tree (writers paused); return how many."""
        self.check_open()
        return self.index.settle()

    def settle_deferred(self) -> AbstractContextManager[None]:
        """Within the block, applying commits never merges the key index's pending runs."""
        return self.index.settle_deferred()

    @property
    def version(self) -> int:
        """The applied commit version."""
        return int(self.snapshot(lambda r: r.version()))

    def start_offset(self, partition: int) -> int:
        """The lowest offset still in ``partition`` (its end offset when it holds nothing)."""
        self.check_partition(partition)

        def first(r: MetaReader) -> int:
            for batch in r.iter_batches(partition, 0):
                return batch.base
            return r.partition_end(partition)

        return int(self.snapshot(first))

    def end_offset(self, partition: int) -> int:
        """The next offset ``partition`` will assign."""
        self.check_partition(partition)
        return int(self.snapshot(lambda r: r.partition_end(partition)))

    def end_offsets(self) -> dict[int, int]:
        """Every partition's next offset, all from one snapshot of the applied version."""
        return dict(self.snapshot(lambda r: {p: r.partition_end(p) for p in range(self.partitions)}))

    def begin_offsets(self) -> dict[int, int]:
        """Every partition's lowest offset still in the log (its end when it holds nothing),
        all from one snapshot of the applied version."""
        def begins(r: MetaReader) -> dict[int, int]:
            out = {}
            for p in range(self.partitions):
                first = next(r.iter_batches(p, 0), None)
                out[p] = first.base if first is not None else r.partition_end(p)
            return out

        return dict(self.snapshot(begins))

    # -- reading ----------------------------------------------------------------------------------
    def read(self, partition: int, from_offset: int = 0, to_offset: int | None = None) -> Iterator[Record]:
        """Records of ``partition`` in offset order from ``from_offset`` (to ``to_offset``), skipping holes."""
        self.check_open()
        self.check_partition(partition)
        check_read_offset(from_offset, "from_offset")
        if to_offset is not None:
            check_read_offset(to_offset, "to_offset")
        return self._read(partition, from_offset, to_offset)

    def _read(self, partition: int, from_offset: int, to_offset: int | None) -> Iterator[Record]:
        cursor = from_offset
        while True:
            # Short snapshots of at most 256 batches, so no reader slot is held for long.
            def chunk(r: MetaReader, start: int = cursor) -> list[LiveBatch]:
                out = []
                for batch in r.iter_batches(partition, start):
                    out.append(batch)
                    if len(out) >= 256:
                        break
                return out

            batches = self.snapshot(chunk)
            if not batches:
                return
            for batch in batches:
                if to_offset is not None and batch.base >= to_offset:
                    return
                try:
                    records = self.batch_cache.get(batch)
                except DataFileMissing:
                    if not self.caught_up_past(batch):
                        raise
                    break  # the batches live at the newest version, from the same offset on
                yield from records_of_batch(batch, partition, records, cursor, to_offset)
                cursor = batch.last + 1

    def caught_up_past(self, batch: LiveBatch) -> bool:
        """After ``batch``'s data file was found missing: apply the commits that landed since
        (another process compacted, and its GC deleted the file once a newer commit replaced
        it) and say whether ``batch`` is not live at the new version, so the caller reads
        again from the same position. False when it is still live there (the file is lost:
        the caller raises) or when this log stays at one version (a named checkpoint's)."""
        if self.frozen_at is not None:
            return False
        self.refresh()
        live = self.snapshot(lambda r: r.find_batch(batch.partition, batch.base))
        return live is None or (live.path, live.position) != (batch.path, batch.position)

    def _caught_up(self, missing: DataFileMissing) -> bool:
        """After a data file was found missing under an index entry: apply the commits that
        landed since; whether the newest version lists the file no more (another process's
        compaction replaced it: look the key up again), else it is lost."""
        if self.frozen_at is not None:
            return False
        self.refresh()
        path = missing.path
        return not self.snapshot(lambda r: any(entry.path == path for _fid, entry in r.iter_files()))

    def value_of(self, key: bytes, entry: IndexEntry, reader: MetaReader | None = None) -> bytes:
        """The value of ``key`` at its index ``entry`` (inline, or read from its batch, looked
        up in ``reader``: the entry's snapshot). The record read must hold ``key``: an index or
        batch directory that points elsewhere (damage the checksums missed) raises
        ``CorruptDataError``, never another key's value.

        A data file missing from storage is not yet a loss: another process may have compacted
        and collected it after this cache's snapshot. The newer commits are applied and ``key``
        is looked up again at the new version (:class:`RecordExpired` when it has no value
        there); only a file missing at the newest version raises ``CorruptDataError``."""
        try:
            return self.value_in_snapshot(key, entry, reader)
        except DataFileMissing as e:
            if not self._caught_up(e):
                raise

        def again(r: IndexReader) -> bytes:
            found = r.index_get(key)
            if found is None:
                raise RecordExpired(key)  # deleted, or expired, at the newer version
            return self.value_in_snapshot(key, found, r)

        while True:
            try:
                return bytes(self.snapshot(again))
            except DataFileMissing as e:  # its newer file went too meanwhile
                if not self._caught_up(e):
                    raise

    def value_in_snapshot(self, key: bytes, entry: IndexEntry, reader: MetaReader | None = None) -> bytes:
        """:meth:`value_of` within one snapshot: a missing data file raises
        :class:`~kvlog.log.reader.DataFileMissing` (a read view pinned at one commit, such as
        :class:`kvlog.Snapshot`, reads nothing newer)."""
        if entry.inline is not None:
            return entry.inline
        if reader is not None:
            batch = reader.find_batch(entry.partition, entry.offset)
        else:
            batch = self.snapshot(lambda r: r.find_batch(entry.partition, entry.offset))
        if batch is None:
            if entry.expires_ms is not None:
                # An expiring record that compaction removed (its expiry passed by the clock of
                # the compaction): the entry stays until it is replaced, and means no value.
                raise RecordExpired(key)
            raise CorruptDataError(f"partition {entry.partition}", f"offset {entry.offset} is not live")
        return value_in_batch(self.env, key, entry, batch, self.read_batch(batch))

    def values_of(self, pairs: list[tuple[bytes, IndexEntry]], reader: MetaReader) -> list[bytes | None]:
        """The values of keys at their index entries (:meth:`value_of` for each pair), looked up
        in ``reader`` (the entries' snapshot); each batch is read once, however many of the
        keys it holds. A missing data file is handled as in :meth:`value_of`: the newer commits
        are applied and every key is looked up again at the new version."""
        try:
            return self.values_in_snapshot(pairs, reader)
        except DataFileMissing as e:
            if not self._caught_up(e):
                raise

        def again(r: IndexReader) -> list[bytes | None]:
            found = [(key, r.index_get(key)) for key, _entry in pairs]
            present = [(key, entry) for key, entry in found if entry is not None]
            values = iter(self.values_of(present, r) if present else [])
            return [None if entry is None else next(values) for _key, entry in found]

        return list(self.snapshot(again))

    def values_in_snapshot(self, pairs: list[tuple[bytes, IndexEntry]], reader: MetaReader) -> list[bytes | None]:
        """:meth:`values_of` within one snapshot (a missing data file raises
        :class:`~kvlog.log.reader.DataFileMissing`, as :meth:`value_in_snapshot`)."""
        return values_in_batches(self.env, pairs, reader, self.read_batch)

    def read_batch(self, batch: LiveBatch) -> pa.RecordBatch:
        """The records of a live batch (through the bounded cache)."""
        return self.batch_cache.get(batch)

    # -- committing and replay: kvlog.log.committer ------------------------------------------------
    def refresh(self) -> int:
        """Apply every commit that landed since the applied version; return the new version."""
        self.check_open()
        if self.frozen_at is not None:
            return self.frozen_at
        with self.apply_lock:
            version = self._committer.apply_landed()
            if self._committer.index_stale and self.maintain_index:
                self.rebuild_index()  # some appended data was compacted away meanwhile
                self._committer.index_stale = False
            return version

    def wait_for_commit(self, after_version: int, timeout_s: float) -> int:
        """Block until a commit newer than ``after_version`` is applied to this cache (this
        process's commits wake it at once, other processes' are found every
        ``follow_interval_ms``) or ``timeout_s`` passes; return the applied version."""
        return waiting.wait_for_commit(self, self._committer.signal, after_version, timeout_s)

    def drop_past_head(self) -> None:
        """Delete the commits and checkpoints past the head (see
        ``kvlog.log.committer.Committer.drop_past_head``)."""
        self._committer.drop_past_head()

    def commit(self, build: Callable[[int], Commit], own: OwnBatches | None = None) -> CommitOutcome:
        """Write the commit ``build(version)`` at the next free version and return its outcome
        (see ``kvlog.log.committer.Committer.commit``)."""
        return self._committer.commit(build, own)

    def outcome(self, commit_id: str) -> CommitOutcome | None:
        """What applying commit ``commit_id`` decided, if it was applied here recently."""
        return self._committer.outcome(commit_id)

    @property
    def commits_written(self) -> int:
        """Commits this process wrote."""
        return self._committer.commits_written

    @property
    def commits_applied(self) -> int:
        """Commits this process applied to the cache."""
        return self._committer.commits_applied

    def commit_latency(self) -> HistogramSnapshot:
        """How long this process's commits took (each from the call to its outcome)."""
        return self._committer.latency.snapshot()

    def apply_settings(self, *, index_ready: bool) -> ApplySettings:
        """The replay settings for one apply (metadata only while the index awaits a rebuild)."""
        return self._settings if index_ready else self._metadata_only

    def new_id(self) -> str:
        """A fresh identifier for a commit or a data file."""
        return self.ids.token(16).hex()

    # -- appending and producers: kvlog.log.append, kvlog.log.producer_handle ----------------------
    def write_data_file(
        self, level: int, batches: Sequence[tuple[int, pa.RecordBatch, dict[str, Any]]]
    ) -> tuple[FileEntry, memoryview]:
        """Write one data file of ``(partition, records, batch fields)`` (sorted by partition);
        returns its entry and its bytes (a read-only view)."""
        entry, data, _inline = append.write_data_file(self, level, batches)
        return entry, data

    def append_batches(
        self, producer_id: int, epoch: int, batches: Sequence[PendingBatch], *, resend: bool = True,
    ) -> list[AppendResult]:
        """Append batches of one producer in one data file and one commit, all or nothing; durable
        on return (``resend=False``: never sent before, see ``kvlog.log.append.append_batches``)."""
        return append.append_batches(self, producer_id, epoch, batches, resend=resend)

    def producer(self, producer_id: int | None = None, *, epoch: int | None = None) -> Producer:
        """A producer handle: a new id, a bumped epoch (fencing), or a resumed one."""
        return producer_handle.open_producer(self, producer_id, epoch=epoch)

    def register_producer(self, producer_id: int, epoch: int) -> None:
        """Commit ``epoch`` as the producer's current epoch, fencing older holders."""
        producer_handle.register_producer(self, producer_id, epoch)

    # -- checkpoints: kvlog.log.checkpoints ----------------------------------------------------
    def maybe_checkpoint(self, version: int | None = None) -> None:
        """Write a checkpoint when ``checkpoint_interval`` commits were applied since the last one
        (``version``: the one just applied, if known)."""
        checkpoints.maybe_checkpoint(self, version)

    def write_checkpoint(self) -> int:
        """Write the full metadata at the applied version as ``log/<version>.checkpoint.json``."""
        return checkpoints.write_checkpoint(self)

    def catch_up(self) -> bool:
        """Catch the cache up from the newest checkpoint, built beside it and moved in whole
        (see ``kvlog.log.catch_up``); whether it moved forward."""
        return self._committer.catch_up()

    def beside(self, env: LmdbEnv) -> Log:
        """A log of this store on the cache ``env`` (read-only, sharing this log's storage):
        where a catch-up builds the cache it moves into this one (``kvlog.log.catch_up``)."""
        return Log(self.storage, self.identity, env, self.config, self.clock, self.ids, True, False,
                   self.maintain_index)

    def load_checkpoint(self, version: int) -> None:
        """Replace the metadata cache with checkpoint ``version``, replay the commits after it,
        then rebuild the key index from the live data."""
        checkpoints.load_checkpoint(self, version)

    def rebuild_index(self) -> None:
        """Rebuild the key index by reading every live batch in offset order.

        A data file missing meanwhile may be no loss: another process replaced it after the
        version read here and its GC deleted it once the delay passed (an open that rebuilds
        for longer than ``file_delete_delay_ms``). The newer commits are then applied and, when
        the file is no longer live at the new head, the rebuild starts again there. A file
        missing while the head stands still, or still live at the new head, is a real loss
        (``DataFileMissing``); a rebuild overtaken again and again is a ``StorageError`` that
        says so.
        """
        for _attempt in range(_REBUILD_ATTEMPTS):
            try:
                self._rebuild_index_once()
                break
            except DataFileMissing as e:
                if self.frozen_at is not None:
                    raise
                with self.apply_lock:
                    before = self.version
                    if self._committer.apply_landed() == before or self._is_live(e.path):
                        raise  # the head stood still, or the file is live at the new one: lost
        else:
            raise StorageError(
                f"rebuilding the key index of {self.storage.uri} was overtaken {_REBUILD_ATTEMPTS} times "
                "by other processes' compactions and garbage collection (each deleted files it was "
                "reading): open again, or raise file_delete_delay_ms above the time a rebuild takes")
        self._committer.index_stale = False  # whatever was applied meanwhile is indexed now

    def _is_live(self, path: str) -> bool:
        """Whether a live file of the applied version is at ``path``."""
        return bool(self.snapshot(lambda r: any(entry.path == path for _id, entry in r.iter_files())))

    def _rebuild_index_once(self) -> None:
        def every_batch(r: MetaReader) -> list[LiveBatch]:
            return [b for p in range(self.partitions) for b in r.iter_batches(p, 0)]

        def chunks() -> Iterator[RebuildChunk]:
            batches: list[LiveBatch] = self.snapshot(every_batch)  # once the index is emptied
            with progress("rebuilding the key index", len(batches)) as bar:
                for start in range(0, len(batches), 64):
                    chunk = [(b, self.batch_cache.get(b)) for b in batches[start:start + 64]]
                    yield [(batch.partition, batch.base, records, batch_offsets(batch, records))
                           for batch, records in chunk]
                    bar.advance(len(chunk))

        self.index.rebuild(chunks(), self.config.inline_value_bytes)

    # -- garbage collection: kvlog.log.gc -----------------------------------------------------
    def gc(self, now_ms: int | None = None) -> dict[str, int]:
        """Delete replaced files past their delay, orphan data files, and commits behind the
        newest checkpoint (see ``kvlog.log.gc``); how many of each kind. ``now_ms`` (an int
        >= 0 of milliseconds since the epoch) overrides the clock for the deletion delays."""
        if now_ms is not None and (not isinstance(now_ms, int) or isinstance(now_ms, bool)
                                   or not 0 <= now_ms < 2**63):
            raise InvalidRecordError(f"now_ms must be an integer of milliseconds in [0, 2**63), not {now_ms!r}")
        return gc.collect_garbage(self, now_ms)

    def close(self) -> None:
        """Release the metadata cache and the storage."""
        if self._closed:
            return
        self._closed = True
        self.batch_cache.clear()
        release_env(self.env)
        if self._owns_storage:
            self.storage.close()

    def __repr__(self) -> str:
        return f"Log({self.storage.uri!r}, partitions={self.partitions})"



