"""The log: a storage root, its commit log, and the metadata cache that replays it.

Commit order, and why (see docs/log.rst): a data file is written first, under a fresh
name nobody references; then ``log/<v+1>.json`` is created with put-if-absent,
the single atomic switch that makes the file's batches live; then the commit
is applied to the LMDB cache. A crash before the commit leaves an orphan file
for GC; a crash after it loses nothing, since the cache is rebuilt from the
log; a replaced file is deleted only after ``file_delete_delay_ms`` so readers
of older versions keep their files.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from hashlib import sha256
from pathlib import Path
from typing import Any

import pyarrow as pa

from kvlog.clock import Clock, IdSource, SystemClock, SystemIdSource
from kvlog.config import StoreConfig
from kvlog.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    ConfigError,
    CorruptDataError,
    InvalidRecordError,
    KvlogError,
    OutOfOrderSequenceError,
    ProducerError,
    ProducerFencedError,
    ReadOnlyError,
    StorageBehindError,
    StorageError,
    StoreClosedError,
    StoreNotFoundError,
)
from kvlog.format.checksum import crc32c
from kvlog.format.commit import BatchEntry, Commit, FileEntry, decode_commit, encode_commit
from kvlog.format.datafile import DataFileWriter, content_digest, decode_batch, make_record_batch
from kvlog.format.envelope import decode_document, encode_document
from kvlog.format.identity import IDENTITY_NAME, Identity, decode_identity, encode_identity
from kvlog.index import IndexReader, KeyIndex, RebuildChunk, check_cache_file, runs_pending
from kvlog.log.naming import (
    DATA_PREFIX,
    LOG_PREFIX,
    checkpoint_name,
    commit_name,
    data_file_name,
    parse_log_name,
)
from kvlog.log.producers import check_batch, producer_from_json, producer_to_json
from kvlog.log.reader import BatchCache, records_of_batch
from kvlog.log.records import (
    AppendResult,
    Record,
    ValidRecords,
    partition_for_key,
    validate_records,
)
from kvlog.log.replay import ApplySettings, FileCollected, apply_commit, apply_stray
from kvlog.meta import LmdbEnv, MetaReader, MetaTxn, acquire_env, release_env, reset_env
from kvlog.progress import progress
from kvlog.storage import Storage, is_local_uri, open_storage

__all__ = ["Log", "Producer", "open_log", "PendingBatch", "newest_checkpoint"]

log = logging.getLogger("kvlog.log")

#: How many times an append writes its data file again after GC collected it before its commit.
_COLLECTED_RETRIES = 5

_ERRORS: dict[str, type[ProducerError]] = {
    "ProducerFencedError": ProducerFencedError,
    "OutOfOrderSequenceError": OutOfOrderSequenceError,
}


class PendingBatch:
    """A batch to append: a partition, its records, and its producer sequence."""

    __slots__ = ("partition", "records", "base_sequence")

    def __init__(self, partition: int, records: pa.RecordBatch, base_sequence: int) -> None:
        self.partition = partition
        self.records = records
        self.base_sequence = base_sequence


class Log:
    """A store's log: partitions, offsets, producers, reads. See :func:`open_log`."""

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
        self._apply_lock = threading.RLock()
        self._commit_lock = threading.RLock()
        #: The key index, with this process's memtable in front of it.
        self.index = KeyIndex(env, run_limit=config.index_run_limit, apply_lock=self._apply_lock,
                              monotonic_s=clock.monotonic_s)
        self._own: dict[str, dict[tuple[str, int], pa.RecordBatch]] = {}
        self._closed = False
        self._settings = ApplySettings(
            config.producer_id_expiration_ms, config.file_delete_delay_ms, config.inline_value_bytes,
            maintain_index, config.index_run_limit,
        )
        self._metadata_only = replace(self._settings, maintain_index=False)
        self.maintain_index = maintain_index
        self.commits_written = 0
        self.commits_applied = 0
        self._index_stale = False

    # -- basic facts ------------------------------------------------------------------------------
    @property
    def partitions(self) -> int:
        """Number of partitions (fixed at creation)."""
        return self.identity.partitions

    def partition_for(self, key: bytes | str) -> int:
        """The partition of ``key`` (XXH3-64 of its bytes modulo the partition count)."""
        data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        return partition_for_key(data, self.partitions)

    def _check_partition(self, partition: int) -> int:
        if not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < self.partitions:
            raise InvalidRecordError(f"partition {partition!r} is not in [0, {self.partitions})")
        return partition

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the log is closed")

    def reader(self) -> IndexReader:
        """A consistent snapshot of the metadata; ``close()`` it when done (or use :meth:`snapshot`)."""
        return self.index.reader()

    def snapshot(self, fn: Callable[[IndexReader], Any]) -> Any:
        """``fn`` applied to a read snapshot of the metadata."""
        reader = self.reader()
        try:
            return fn(reader)
        finally:
            reader.close()

    def settle_index(self) -> int:
        """Merge the key index's pending runs into its B-tree (writers paused); return how many."""
        self._check_open()
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
        self._check_partition(partition)

        def first(r: MetaReader) -> int:
            for batch in r.iter_batches(partition, 0):
                return int(batch["base"])
            return int(r.get_partition(partition)["end"])

        return int(self.snapshot(first))

    def end_offset(self, partition: int) -> int:
        """The next offset ``partition`` will assign."""
        self._check_partition(partition)
        return int(self.snapshot(lambda r: r.get_partition(partition)["end"]))

    # -- reading ----------------------------------------------------------------------------------
    def read(self, partition: int, from_offset: int = 0, to_offset: int | None = None) -> Iterator[Record]:
        """Records of ``partition`` in offset order from ``from_offset`` (to ``to_offset``), skipping holes."""
        self._check_open()
        self._check_partition(partition)
        if from_offset < 0:
            raise InvalidRecordError("from_offset must be >= 0")
        return self._read(partition, from_offset, to_offset)

    def _read(self, partition: int, from_offset: int, to_offset: int | None) -> Iterator[Record]:
        cursor = from_offset
        while True:
            # Short snapshots of at most 256 batches, so no reader slot is held for long.
            def chunk(r: MetaReader, start: int = cursor) -> list[dict[str, Any]]:
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
                if to_offset is not None and batch["base"] >= to_offset:
                    return
                yield from records_of_batch(batch, partition, self.batch_cache.get(batch), cursor, to_offset)
                cursor = int(batch["last"]) + 1

    def read_batch(self, batch: dict[str, Any]) -> pa.RecordBatch:
        """The records of a resolved batch (through the bounded cache)."""
        return self.batch_cache.get(batch)

    # -- replay -----------------------------------------------------------------------------------
    def refresh(self) -> int:
        """Apply every commit that landed since the applied version; return the new version."""
        self._check_open()
        with self._apply_lock:
            version = self.version
            while True:
                name = commit_name(version + 1)
                try:
                    data = self.storage.read(name)
                except FileNotFoundError:
                    if self._index_stale and self.maintain_index:
                        self.rebuild_index()  # some appended data was compacted away meanwhile
                        self._index_stale = False
                    return version
                commit = decode_commit(name, data)
                if commit.version != version + 1:
                    raise CorruptDataError(name, f"holds version {commit.version}")
                self._apply(commit, crc32c(data))
                version += 1

    def _apply(self, commit: Commit, crc: int) -> None:
        own = self._own.get(commit.commit_id, {})

        def source(file: FileEntry, index: int) -> pa.RecordBatch:
            cached = own.get((file.file_id, index))
            if cached is not None:
                return cached
            loc = file.batches[index].location
            try:
                data = self.storage.read_range(file.path, loc.position, loc.length)
            except FileNotFoundError:
                # This cache fell behind GC: a later replace took the batch and its file is gone.
                # Index nothing now; once caught up, the key index is rebuilt from the live
                # batches (which raises if a live batch's file is missing).
                missing.append(file.path)
                return make_record_batch([], [], [])
            return decode_batch(file.path, data, loc)

        missing: list[str] = []
        stray = self._is_stray(commit)

        def work(txn: Any) -> int | None:
            meta = MetaTxn(self.env, txn)
            if meta.version() != commit.version - 1:
                return None
            if stray:
                apply_stray(meta, commit)
                meta.set_applied_commit(commit.version, commit.commit_id, crc)
                return runs_pending(meta)
            missing.clear()
            # An index marked for rebuilding is not maintained meanwhile (the rebuild reads the
            # live data at the newest version; files of older versions may be gone).
            settings = self._settings if meta.get_meta("index_ready") != b"0" else self._metadata_only
            apply_commit(meta, commit, source, settings)
            meta.set_applied_commit(commit.version, commit.commit_id, crc)
            if missing:
                meta.put_meta("index_ready", b"0")  # rebuilt at the next open if we stop here
            return runs_pending(meta)

        with self.index.applying():
            runs = self.env.write(work)
        if runs is not None:
            self.commits_applied += 1
            self._index_stale = self._index_stale or bool(missing)
            if self.index.settle_due(runs):
                self.settle_index()

    def _is_stray(self, commit: Commit) -> bool:
        """Whether ``commit`` was written after a gap: it names another predecessor than the
        commit at the version before, which storage holds as this cache applied it.

        Every reader whose cache agrees with storage decides the same, so refusing it keeps
        replay deterministic; a cache that applied another commit than storage holds is itself
        out of date, and :class:`StorageBehindError` says so.
        """
        applied: tuple[int, str, int] | None = self.snapshot(lambda r: r.applied_commit())
        if (commit.previous_id is None or applied is None or applied[0] != commit.version - 1
                or applied[1] == commit.previous_id):
            return False
        name = commit_name(applied[0])
        try:
            holds = crc32c(self.storage.read(name)) == applied[2]
        except FileNotFoundError:
            holds = False
        if holds:
            log.warning("commit %s does not follow %s (written after a gap, when the root was "
                        "restored): refused", commit_name(commit.version), name)
            return True
        raise StorageBehindError(
            commit_name(commit.version),
            f"follows commit {commit.previous_id}, but this cache applied commit {applied[1]} at "
            f"version {applied[0]}, which the storage root no longer holds (restored from an older "
            "copy?): reopen the store to rebuild its cache",
        )

    def outcome(self, commit_id: str) -> dict[str, Any] | None:
        """What applying commit ``commit_id`` decided, if it was applied here recently."""
        return self.snapshot(lambda r: r.get_outcome(commit_id))  # type: ignore[no-any-return]

    # -- committing -------------------------------------------------------------------------------
    def commit(
        self, build: Callable[[int], Commit], own: dict[tuple[str, int], pa.RecordBatch] | None = None
    ) -> dict[str, Any]:
        """Write the commit ``build(version)`` at the next free version and return its outcome.

        ``build`` is called again for each attempt (it may re-validate, raising to abort) and must
        keep the same commit id, by which a commit whose outcome was unknown is recognised.
        """
        self._check_open()
        if self.read_only:
            raise ReadOnlyError("the store is open read-only")
        with self._commit_lock:
            storage_errors = 0
            last_error: StorageError | None = None
            for _attempt in range(self.config.commit_retries):
                if storage_errors:
                    # Back off from a failing backend (not from a lost race): 10 ms doubling to 1 s.
                    self._pause(min(0.01 * 2 ** (storage_errors - 1), 1.0))
                version = self.refresh() + 1
                commit = build(version)
                done = self.outcome(commit.commit_id)
                if done is not None:
                    return done
                try:
                    previous = self._verify_head(version - 1)
                except StorageError as e:
                    storage_errors += 1
                    last_error = e
                    continue
                commit = replace(commit, previous_id=previous)
                name = commit_name(version)
                if own:
                    self._own[commit.commit_id] = own
                created = False
                try:
                    try:
                        self.storage.put_if_absent(name, encode_commit(commit))
                        self.commits_written += 1
                        created = True
                    except FileExistsError:
                        pass  # another writer took this version; ours may have landed earlier
                    except StorageError as e:
                        if not self._landed(name, commit.commit_id, e):
                            storage_errors += 1
                            last_error = e
                            continue
                        created = True  # it landed, its answer was lost
                    self.refresh()
                finally:
                    self._own.pop(commit.commit_id, None)
                done = self.outcome(commit.commit_id)
                if done is not None:
                    if created:
                        self._verify_follows(commit, version - 1)
                    self._maybe_checkpoint()
                    return done
            if last_error is not None and storage_errors == self.config.commit_retries:
                raise StorageError(f"every commit attempt failed: {last_error}") from last_error
            raise CommitConflictError(
                f"{self.config.commit_retries} attempts lost the race for the next commit version"
            )

    def _verify_head(self, version: int) -> str | None:
        """Before writing commit ``version + 1``: check that commit ``version``, the newest this
        cache applied, is still in storage as applied, and return its id.

        Commit names are taken with put-if-absent, which cannot tell a free name from one whose
        commit vanished: a root restored from an older copy, or commits collected after a
        checkpoint while this cache slept. Writing on would put an acknowledged commit after a
        gap that no fresh reader ever crosses. A cache that merely fell behind the retention
        window catches up from the newest checkpoint; otherwise :class:`StorageBehindError`.
        """
        if version == 0:
            return None
        applied: tuple[int, str, int] | None = self.snapshot(lambda r: r.applied_commit())
        name = commit_name(version)
        try:
            data = self.storage.read(name)
        except FileNotFoundError:
            if newest_checkpoint(self.storage) > version:
                # Reloading the cache in place would empty the key index under concurrent reads.
                raise StorageBehindError(
                    name, "this cache fell behind the commit retention window (commits it has not "
                    "applied were collected after a checkpoint); nothing was written: reopen the "
                    "store to catch up from the checkpoint",
                ) from None
            raise StorageBehindError(
                name, "the newest commit this cache applied is missing from storage (restored from an "
                "older copy, or damaged); nothing was written: reopen the store to rebuild its cache "
                "from storage",
            ) from None
        if applied is None or applied[0] != version:
            return decode_commit(name, data).commit_id
        if crc32c(data) != applied[2]:
            raise StorageBehindError(
                name, "differs from the commit this cache applied at that version (restored from an "
                "older copy, or damaged); nothing was written: reopen the store to rebuild its cache",
            )
        return applied[1]

    def _verify_follows(self, commit: Commit, previous: int) -> None:
        """After ``commit`` landed: check that the commit it follows is still in storage, so it
        is not acknowledged after a gap (a root restored while it was on its way).

        Otherwise the commit, which no fresh reader can reach, is taken back (deleted: only its
        writer does that, and only a cache of the lost history could have applied it) and
        :class:`StorageBehindError` is raised; nothing is acknowledged.
        """
        if previous == 0 or commit.previous_id is None:
            return
        name = commit_name(previous)
        try:
            follows = decode_commit(name, self.storage.read(name)).commit_id == commit.previous_id
        except FileNotFoundError:
            # Commit GC removes only commits below the newest checkpoint: if one covers this
            # commit, its predecessor was collected, not lost, and the commit is history.
            follows = newest_checkpoint(self.storage) >= commit.version
        if follows:
            return
        own = commit_name(commit.version)
        try:
            if decode_commit(own, self.storage.read(own)).commit_id == commit.commit_id:
                self.storage.delete(own)
        except (FileNotFoundError, KvlogError) as e:
            log.warning("could not take back commit %s written after a gap: %s", own, e)
        raise StorageBehindError(
            name, f"is no longer the commit {own} follows (the storage root was restored while the "
            "commit was on its way); nothing was acknowledged: reopen the store to rebuild its cache",
        )

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (an event wait, so no module reads the clock to sleep)."""
        threading.Event().wait(seconds)

    def _landed(self, name: str, commit_id: str, cause: StorageError) -> bool:
        """After a failed put-if-absent: whether our commit is there (re-read until known)."""
        last: Exception = cause
        for _ in range(5):
            try:
                data = self.storage.read(name)
            except FileNotFoundError:
                return False
            except StorageError as e:
                last = e
                continue
            return decode_commit(name, data).commit_id == commit_id
        raise CommitStateUnknownError(
            f"could not learn whether {name} landed; reopen the store before resending"
        ) from last

    def new_id(self) -> str:
        """A fresh identifier for a commit or a data file."""
        return self.ids.token(16).hex()

    def write_data_file(
        self, level: int, batches: Sequence[tuple[int, pa.RecordBatch, dict[str, Any]]]
    ) -> tuple[FileEntry, memoryview]:
        """Write one data file of ``(partition, records, batch fields)`` (sorted by partition);
        returns its entry and its bytes (a read-only view)."""
        self._check_open()
        if self.read_only:
            raise ReadOnlyError("the store is open read-only")
        writer = DataFileWriter(self.config.compression)
        order = sorted(range(len(batches)), key=lambda i: batches[i][0])
        for i in order:
            writer.add(batches[i][1])
        data, locations = writer.finish_view()  # the writer's own buffer, not a copy
        file_id = self.new_id()
        path = data_file_name(level, file_id)
        entries = []
        for i, loc in zip(order, locations, strict=True):
            partition, _records, fields = batches[i]
            entries.append(BatchEntry(partition=partition, location=loc, **fields))
        entry = FileEntry(file_id, path, level, len(data), crc32c(data), tuple(entries))
        self.storage.put(path, data)
        return entry, data

    def _known_duplicates(
        self, producer_id: int, epoch: int, batches: Sequence[PendingBatch], digests: Sequence[int]
    ) -> list[AppendResult] | None:
        """The original offsets if every batch repeats one the log already holds, else None.

        Offsets never change, so a duplicate seen in the cache is final. Checked on the cache, then
        once more after a refresh (a newer epoch may have fenced us); anything else is written and
        decided at replay as usual.
        """
        if self.read_only:
            return None
        results: list[AppendResult] = []
        for fresh in (False, True):
            if fresh:
                self.refresh()
            state, last_ms = self.snapshot(lambda r: (r.get_producer(producer_id), r.last_commit_ms()))
            if state is None:
                return None
            now = max(self.clock.now_ms(), last_ms)
            results = []
            for b, digest in zip(batches, digests, strict=True):
                try:
                    decision = check_batch(state, b.partition, epoch, b.base_sequence, b.records.num_rows,
                                           now, self.config.producer_id_expiration_ms, digest)
                except ProducerError:
                    return None
                if decision.duplicate_of is None:
                    return None
                results.append(AppendResult(decision.duplicate_of.first_offset,
                                            decision.duplicate_of.last_offset, True))
        return results

    def append_batches(
        self, producer_id: int, epoch: int, batches: Sequence[PendingBatch]
    ) -> list[AppendResult]:
        """Append batches of one producer in one data file and one commit, all or nothing; durable on return."""
        if not batches:
            return []
        digests = [content_digest(b.records) for b in batches]
        known = self._known_duplicates(producer_id, epoch, batches, digests)
        if known is not None:
            return known  # a duplicate returns the original offsets and writes nothing
        fields = [
            (b.partition, b.records, {"producer_id": producer_id, "epoch": epoch,
                                      "base_sequence": b.base_sequence, "digest": digest})
            for b, digest in zip(batches, digests, strict=True)
        ]
        # The file's batch order is by partition; map each input batch to its position in the file.
        order = sorted(range(len(batches)), key=lambda i: batches[i].partition)
        position = {i: pos for pos, i in enumerate(order)}
        for _attempt in range(_COLLECTED_RETRIES):
            outcome = self._append_file(fields, batches, position)
            if outcome["error"] is None or outcome["error"][0] != FileCollected.__name__:
                break
            # GC condemned the file while the commit was on its way (a writer slower than
            # file_delete_delay_ms): nothing of it became live; write it again under a new name.
            log.warning("an append's data file was collected before its commit; writing it again")
        else:
            raise StorageError(
                f"garbage collection took this append's data file {_COLLECTED_RETRIES} times before "
                "its commit landed; nothing was written (raise file_delete_delay_ms)"
            )
        if outcome["error"] is not None:
            kind, message = outcome["error"]
            raise _ERRORS.get(kind, ProducerError)(message)
        by_position = {r[1]: r for r in outcome["results"]}
        results = []
        for i in range(len(batches)):
            r = by_position[position[i]]
            results.append(AppendResult(int(r[3]), int(r[4]), r[2] == "duplicate"))
        return results

    def _append_file(
        self, fields: list[tuple[int, pa.RecordBatch, dict[str, Any]]], batches: Sequence[PendingBatch],
        position: dict[int, int],
    ) -> dict[str, Any]:
        """Write one data file of ``fields`` and commit it; the commit's outcome."""
        entry, data = self.write_data_file(0, fields)
        written_ms = self.clock.now_ms()
        commit_id = self.new_id()
        own = {(entry.file_id, position[i]): batches[i].records for i in range(len(batches))}

        def build(version: int) -> Commit:
            nonlocal written_ms
            now = self.clock.now_ms()
            if now - written_ms > self.config.file_delete_delay_ms // 2:
                # Long retries: refresh the file so orphan GC is unlikely to condemn it meanwhile
                # (if it does, the commit is refused and the caller writes a new file).
                self.storage.put(entry.path, data)
                written_ms = now
            return Commit(version, commit_id, now, "append", add=(entry,))

        return self.commit(build, own)

    def producer(self, producer_id: int | None = None, *, epoch: int | None = None) -> Producer:
        """A producer handle: a new id, a bumped epoch (fencing), or a resumed one."""
        self._check_open()
        if self.read_only:
            raise ReadOnlyError("the store is open read-only")
        if producer_id is None:
            return Producer(self, int.from_bytes(self.ids.token(8), "big") >> 1, 0 if epoch is None else epoch)
        if not isinstance(producer_id, int) or isinstance(producer_id, bool) or not 0 <= producer_id < 2**63:
            raise InvalidRecordError(f"producer_id must be an integer in [0, 2^63), not {producer_id!r}")
        if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0):
            raise InvalidRecordError(f"epoch must be an integer >= 0, not {epoch!r}")
        for _attempt in range(self.config.commit_retries):
            self.refresh()
            state = self.snapshot(lambda r: r.get_producer(producer_id))
            now = max(self.clock.now_ms(), self.snapshot(lambda r: r.last_commit_ms()))
            current = None
            if state is not None and not state.expired(now, self.config.producer_id_expiration_ms):
                current = state.epoch
            if epoch is None:
                # Bump past the newest epoch still remembered, even an expired one, so an old holder
                # that wakes up can never fence the new one.
                new_epoch = 0 if state is None else state.epoch + 1
            elif current is not None and epoch < current:
                raise ProducerFencedError(f"producer {producer_id} epoch {epoch} is older than {current}")
            else:
                new_epoch = epoch
            if current is not None and new_epoch == current:
                return Producer(self, producer_id, new_epoch)  # resumed: the same holder restarted
            try:
                self.register_producer(producer_id, new_epoch)
            except ProducerFencedError:
                # Another opener took this epoch first (the registration is conditional, so
                # exactly one wins it): read the new state and try again.
                continue
            return Producer(self, producer_id, new_epoch)
        raise ProducerFencedError(
            f"producer {producer_id}: {self.config.commit_retries} attempts to take an epoch lost to other openers"
        )

    def register_producer(self, producer_id: int, epoch: int) -> None:
        """Commit ``epoch`` as the producer's current epoch, fencing older holders."""
        commit_id = self.new_id()
        outcome = self.commit(
            lambda v: Commit(v, commit_id, self.clock.now_ms(), "producer", producer_id=producer_id, epoch=epoch)
        )
        if outcome["error"] is not None:
            kind, message = outcome["error"]
            raise _ERRORS.get(kind, ProducerError)(message)

    # -- checkpoints ------------------------------------------------------------------------------
    def _maybe_checkpoint(self) -> None:
        last = self.snapshot(lambda r: r.get_meta("checkpoint_version"))
        last_version = int(last) if last else 0
        if self.version - last_version >= self.config.checkpoint_interval:
            try:
                self.write_checkpoint()
            except KvlogError as e:
                # The commit that triggered it is durable and applied: a checkpoint only saves
                # later openers replay time, and the next commit tries again.
                log.warning("could not write a checkpoint (the next commit retries): %s", e)

    def write_checkpoint(self) -> int:
        """Write the full metadata at the applied version as ``log/<version>.checkpoint.json``."""
        body = self.snapshot(_checkpoint_body)
        version = int(body["version"])
        # A checkpoint describes this cache's history: write it only while storage still holds
        # that history (a checkpoint of a history a restore removed would mislead every opener).
        body["commit_id"] = self._verify_head(version)
        try:
            self.storage.put_if_absent(checkpoint_name(version), encode_document("checkpoint", body))
        except FileExistsError:
            pass
        def record(txn: Any) -> None:
            meta = MetaTxn(self.env, txn)
            meta.put_meta("checkpoint_version", str(version).encode())
            # Outcomes are only needed by a committer that is still waiting for its commit.
            meta.prune_outcomes(version - self.config.checkpoint_interval)

        self.env.write(record)
        return version

    def load_checkpoint(self, version: int) -> None:
        """Replace the metadata cache with checkpoint ``version``, replay the commits after it,
        then rebuild the key index from the live data.

        The index is rebuilt at the newest version, never at the checkpoint's: files live at
        an old checkpoint may have been replaced and deleted since.
        """
        name = checkpoint_name(version)
        body = decode_document(name, self.storage.read(name), "checkpoint")
        head = _checkpoint_commit(self.storage, version, body)
        if head is None:
            raise CorruptDataError(name, f"its commit {commit_name(version)} is missing or another "
                                   "commit: a checkpoint of a history the root no longer holds")

        def load(txn: Any) -> None:
            meta = MetaTxn(self.env, txn)
            kept = {key: meta.get_meta(key) for key in ("uuid", "store_producer_id")}
            meta.clear()
            for key, value in kept.items():
                if value is not None:
                    meta.put_meta(key, value)
            _load_checkpoint_body(meta, name, body)
            meta.set_applied_commit(version, head[0], head[1])  # later commits' ``prev`` is checked
            meta.put_meta("index_ready", b"0")

        self.env.write(load)
        self.refresh()  # indexes nothing while the index is marked not ready
        if self.maintain_index:
            self.rebuild_index()

    def rebuild_index(self) -> None:
        """Rebuild the key index by reading every live batch in offset order."""
        def every_batch(r: MetaReader) -> list[dict[str, Any]]:
            return [b for p in range(self.partitions) for b in r.iter_batches(p, 0)]

        def chunks() -> Iterator[RebuildChunk]:
            batches: list[dict[str, Any]] = self.snapshot(every_batch)  # once the index is emptied
            with progress("rebuilding the key index", len(batches)) as bar:
                for start in range(0, len(batches), 64):
                    chunk = [(b, self.batch_cache.get(b)) for b in batches[start:start + 64]]
                    yield [(batch["p"], batch["base"], records,
                            [r.offset for r in records_of_batch(batch, batch["p"], records)])
                           for batch, records in chunk]
                    bar.advance(len(chunk))

        self.index.rebuild(chunks(), self.config.inline_value_bytes)

    # -- garbage collection -----------------------------------------------------------------------
    def gc(self, now_ms: int | None = None) -> dict[str, int]:
        """Delete replaced files past their delay, orphan data files, and commits behind the newest checkpoint.

        A replaced input goes once ``file_delete_delay_ms`` has passed since its replace commit.
        An orphan (a file no commit made live) is a candidate once it is older than the delay
        both by the clock and relative to the newest commit's storage time; candidates are first
        condemned by a ``gc`` commit and only then deleted. A commit that adds a condemned file
        is refused when applied, so whichever lands first wins: the file becomes live and GC
        keeps it, or GC takes it and its writer learns that its commit was refused (and writes
        the file again, or discards the job). No commit ever makes live a file GC deleted,
        however long its writer was stalled. Commits older than the newest checkpoint by more
        than ``commit_retention_ms`` (storage time) go too.
        """
        self._check_open()
        if self.read_only:
            raise ReadOnlyError("the store is open read-only")
        now = self.clock.now_ms() if now_ms is None else now_ms
        self.refresh()
        # Deleting trusts this cache's view of what is live and what was replaced: a cache ahead
        # of a restored root would delete files the restored history needs.
        self._verify_head(self.version)
        deleted = {"replaced": 0, "orphans": 0, "commits": 0}
        pending = dict(self.snapshot(lambda r: list(r.iter_pending())))
        live_paths = set(self.snapshot(lambda r: [e["path"] for _fid, e in r.iter_files()]))
        for path, due in pending.items():
            if due <= now:
                self.storage.delete(path)

                def forget(txn: Any, path: str = path) -> None:
                    MetaTxn(self.env, txn).delete_pending(path)

                self.env.write(forget)
                deleted["replaced"] += 1
        # Orphans are judged by storage time, never by this process's clock alone: a file is a
        # candidate only when it is older than the delay both by our clock and relative to the
        # newest commit (the condemnation commit below is what makes deleting it safe).
        try:
            newest_commit_ms = self.storage.stat(commit_name(self.version)).mtime_ms if self.version else 0
        except FileNotFoundError:
            newest_commit_ms = 0
        horizon = min(now, newest_commit_ms) - self.config.file_delete_delay_ms
        condemned = set(self.snapshot(lambda r: [path for path, _at in r.iter_condemned()]))
        candidates = []
        for info in self.storage.list(DATA_PREFIX):
            if info.name in live_paths or info.name in pending or info.mtime_ms > horizon:
                continue
            if info.name in condemned:
                self.storage.delete(info.name)  # condemned earlier; its deletion did not finish
                deleted["orphans"] += 1
            else:
                candidates.append(info.name)
        if candidates:
            deleted["orphans"] += self._collect_orphans(sorted(candidates))
        entries = [(parse_log_name(i.name), i) for i in self.storage.list(LOG_PREFIX)]
        checkpoints = [v for parsed, _i in entries if parsed and parsed[1] == "checkpoint" for v in [parsed[0]]]
        if checkpoints:
            newest = max(checkpoints)
            newest_info = next(i for parsed, i in entries if parsed == (newest, "checkpoint"))
            horizon = newest_info.mtime_ms - self.config.commit_retention_ms
            for parsed, info in entries:
                if parsed and parsed[0] < newest and info.mtime_ms < horizon:
                    self.storage.delete(info.name)
                    deleted["commits"] += 1
        return deleted

    def _collect_orphans(self, paths: list[str]) -> int:
        """Condemn ``paths`` with a ``gc`` commit, then delete the ones it condemned."""
        commit_id = self.new_id()

        def build(version: int) -> Commit:
            # Condemned paths are remembered for good (a few dozen bytes each, for files only a
            # crash leaves behind): a commit adding one is refused however late it comes.
            return Commit(version, commit_id, self.clock.now_ms(), "gc", remove=tuple(paths))

        outcome = self.commit(build)
        doomed = [path for path, verdict in outcome["results"] if verdict == "condemned"]
        for path in doomed:
            self.storage.delete(path)
        return len(doomed)

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


class Producer:
    """An idempotent producer: appends carry (producer id, epoch, base sequence)."""

    def __init__(self, log: Log, producer_id: int, epoch: int) -> None:
        self._log = log
        self.producer_id = producer_id
        self.epoch = epoch

    def append(self, partition: int, records: Sequence[Sequence[Any]], *, base_sequence: int) -> AppendResult:
        """Append ``records`` to ``partition``; durable on return. A repeat of one of the last 5
        batches returns the original offsets with ``duplicate=True``."""
        self._log._check_partition(partition)
        if not isinstance(base_sequence, int) or isinstance(base_sequence, bool):
            raise InvalidRecordError("base_sequence must be an integer")
        if not 0 <= base_sequence < 2**31:
            raise OutOfOrderSequenceError(f"base_sequence {base_sequence} outside [0, 2^31)")
        cfg = self._log.config
        valid = validate_records(records, default_timestamp=self._log.clock.now_ms(),
                                 max_key_bytes=cfg.max_key_bytes, max_record_bytes=cfg.max_record_bytes)
        batch = PendingBatch(partition, to_record_batch(valid), base_sequence)
        return self._log.append_batches(self.producer_id, self.epoch, [batch])[0]

    def __repr__(self) -> str:
        return f"Producer(producer_id={self.producer_id}, epoch={self.epoch})"


def to_record_batch(valid: ValidRecords) -> pa.RecordBatch:
    """The Arrow batch of validated records."""
    return make_record_batch(valid.keys, valid.values, valid.timestamps)


def _checkpoint_body(r: MetaReader) -> dict[str, Any]:
    files = dict(r.iter_files())
    batches = []
    for _fid, entry in files.items():
        for p, last in entry["batches"]:
            b = r.find_batch(p, last)
            if b is not None:
                batches.append(b)
    parts = {str(p): info for p, info in r.iter_partitions()}
    cleaner = {str(p): state for p, state in r.iter_cleaner()}
    return {
        "version": r.version(),
        "last_commit_ms": r.last_commit_ms(),
        "files": files,
        "batches": batches,
        "parts": parts,
        "producers": [producer_to_json(s) for s in r.iter_producers()],
        "pending": dict(r.iter_pending()),
        "condemned": dict(r.iter_condemned()),
        "cleaner": cleaner,
    }


def _load_checkpoint_body(meta: MetaTxn, name: str, body: dict[str, Any]) -> None:
    try:
        for fid, entry in body["files"].items():
            meta.put_file(fid, entry)
        for b in body["batches"]:
            meta.put_batch(int(b["p"]), int(b["last"]), b)
        for p, info in body["parts"].items():
            meta.put_partition(int(p), info)
        for p, state in body["cleaner"].items():
            meta.put_cleaner(int(p), state)
        for obj in body["producers"]:
            meta.put_producer(producer_from_json(obj))
        for path, due in body["pending"].items():
            meta.put_pending(path, int(due))
        for path, at in body.get("condemned", {}).items():
            meta.put_condemned(path, int(at))
        meta.set_version(int(body["version"]))
        meta.set_last_commit_ms(int(body["last_commit_ms"]))
        meta.put_meta("checkpoint_version", str(int(body["version"])).encode())
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptDataError(name, f"malformed checkpoint ({e})") from None


def default_cache_dir(storage: Storage) -> Path:
    """Where the metadata cache of a store lives when no ``cache_dir`` is given."""
    from kvlog.storage.local import LocalStorage

    if isinstance(storage, LocalStorage):
        return storage.root / "cache"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvlog"
    return base / sha256(storage.uri.encode()).hexdigest()[:24]


def open_log(
    uri: str | os.PathLike[str] | Storage,
    *,
    create: bool = True,
    partitions: int | None = None,
    read_only: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    config: StoreConfig | None = None,
    clock: Clock | None = None,
    ids: IdSource | None = None,
    maintain_index: bool = True,
) -> Log:
    """Open (or create) the log at ``uri`` and bring its metadata cache up to date.

    ``maintain_index=False`` keeps the metadata only, leaving the key index to a bulk
    load (see ``spark_ext.rebuild_index``); such a cache is marked as having no index.
    """
    clock = clock or SystemClock()
    ids = ids or SystemIdSource()
    if isinstance(uri, Storage):
        storage, owns = uri, False
    else:
        if not read_only and not create and is_local_uri(uri):
            target = os.fspath(uri).removeprefix("file://")
            if not os.path.isdir(target):
                raise StoreNotFoundError(f"no kvlog store at {os.fspath(uri)!r}")
        if read_only and is_local_uri(uri) and not os.path.isdir(os.fspath(uri).removeprefix("file://")):
            raise StoreNotFoundError(f"no kvlog store at {os.fspath(uri)!r}")
        storage, owns = open_storage(uri, storage_options), True
    try:
        identity = _identity(storage, create and not read_only, partitions, config, clock, ids)
        cfg = config or StoreConfig()
        if cfg.partitions != identity.partitions:
            cfg = StoreConfig.from_settings(cfg, partitions=identity.partitions)
        cache = Path(cache_dir) if cache_dir else default_cache_dir(storage)
        if cache.exists() and not cache.is_dir():
            raise ConfigError(f"cache_dir {os.fspath(cache)!r} is a file, not a directory")
        env = acquire_env(cache, check_cache_file)
    except BaseException:
        if owns:
            storage.close()
        raise
    the_log = Log(storage, identity, env, cfg, clock, ids, read_only, owns, maintain_index)
    try:
        try:
            _catch_up(the_log)
        except CorruptDataError as e:
            # The cache is derived data: damaged, it is deleted and rebuilt from storage, unless
            # another user (in this process or another) still has it open.
            if e.name != env.name or not reset_env(env):
                raise
            log.warning("metadata cache at %s was damaged (%s): rebuilt from storage", env.path, e.reason)
            the_log.index.reopened()
            _catch_up(the_log)
    except BaseException:
        the_log.close()
        raise
    return the_log


def _identity(
    storage: Storage, create: bool, partitions: int | None, config: StoreConfig | None,
    clock: Clock, ids: IdSource,
) -> Identity:
    try:
        identity = decode_identity(storage.read(IDENTITY_NAME))
    except FileNotFoundError:
        if not create:
            raise StoreNotFoundError(f"no kvlog store at {storage.uri}") from None
        wanted = partitions if partitions is not None else (config.partitions if config else 8)
        StoreConfig(partitions=wanted)  # validates
        fresh = Identity(
            store_uuid=ids.token(16).hex(), partitions=wanted, created_ms=clock.now_ms(),
            fingerprint_seed=int.from_bytes(ids.token(8), "big"),
        )
        try:
            storage.put_if_absent(IDENTITY_NAME, encode_identity(fresh))
            return fresh
        except FileExistsError:
            identity = decode_identity(storage.read(IDENTITY_NAME))
    if partitions is not None and partitions != identity.partitions:
        raise ConfigError(
            f"partitions={partitions} but the store at {storage.uri} has {identity.partitions} partitions"
        )
    return identity


def _catch_up(the_log: Log) -> None:
    """Reset a cache of another store, reload from a checkpoint when behind it, then replay."""
    uuid = the_log.identity.store_uuid.encode()

    def check_uuid(txn: Any) -> bool:
        meta = MetaTxn(the_log.env, txn)
        current = meta.get_meta("uuid")
        if current == uuid:
            return False
        meta.clear()
        meta.put_meta("uuid", uuid)
        meta.put_meta("index_ready", b"1")
        return True

    if the_log.env.write(check_uuid):
        log.info("metadata cache at %s rebuilt for store %s", the_log.env.path, the_log.identity.store_uuid)
    if not _cache_matches_storage(the_log):
        log.warning("metadata cache at %s is ahead of or apart from the storage root %s (restored from "
                    "an older copy?): rebuilding it from storage", the_log.env.path, the_log.storage.uri)

        def reset(txn: Any) -> None:
            meta = MetaTxn(the_log.env, txn)
            producer_id = meta.get_meta("store_producer_id")
            meta.clear()
            meta.put_meta("uuid", uuid)
            meta.put_meta("index_ready", b"1")
            if producer_id is not None:
                meta.put_meta("store_producer_id", producer_id)

        the_log.env.write(reset)
    if not the_log.maintain_index:
        the_log.env.write(lambda txn: MetaTxn(the_log.env, txn).put_meta("index_ready", b"0"))
    version = the_log.version
    newest = newest_checkpoint(the_log.storage)
    # A fresh cache starts from the newest checkpoint; so does one whose next commit was
    # already deleted by commit GC (it fell behind the retention window).
    # Replaying what a killed writer left applies its commits' index runs without merging them:
    # reads search pending runs, and the writer's quiet spells merge them later, so reopening
    # never waits for a merge, whatever was pending.
    with the_log.settle_deferred():
        loaded = False
        for attempt in range(3):
            if not (newest > version and (
                version == 0 or not the_log.storage.exists(commit_name(version + 1))
            )):
                break
            try:
                the_log.load_checkpoint(newest)
                loaded = True
                break
            except FileNotFoundError:
                # Collected between the listing and the read (a newer one was written): list again.
                if attempt == 2:
                    raise StorageError(f"checkpoints of {the_log.storage.uri} keep vanishing while "
                                       "being read; try again") from None
                newest = newest_checkpoint(the_log.storage)
            except StorageBehindError:
                raise
            except CorruptDataError as e:
                # A damaged checkpoint only costs replay time while the commits it sums up remain.
                if not the_log.storage.exists(commit_name(version + 1)):
                    raise
                log.warning("checkpoint %d unusable (%s): replaying the commits instead", newest, e)
                break
        if not loaded:
            # Replay first, then rebuild an index marked for it: at the newest version, whose
            # live files exist (an older version's may have been compacted away and deleted).
            the_log.refresh()
            if the_log.maintain_index and the_log.snapshot(lambda r: r.get_meta("index_ready")) == b"0":
                the_log.rebuild_index()


def newest_checkpoint(storage: Storage) -> int:
    """The version of the newest checkpoint in ``storage`` whose commit is present (0: none).

    A checkpoint is written after its commit, and commit GC keeps the newest checkpoint's
    commit, so a checkpoint without its commit describes a history the root no longer holds
    (written by a cache that was ahead of a restored root): it is passed over.
    """
    names = {info.name for info in storage.list(LOG_PREFIX)}
    versions = sorted((parsed[0] for parsed in map(parse_log_name, names)
                       if parsed and parsed[1] == "checkpoint"), reverse=True)
    for version in versions:
        if commit_name(version) in names:
            return version
    return 0


def _checkpoint_commit(storage: Storage, version: int, body: dict[str, Any]) -> tuple[str, int] | None:
    """``(id, CRC32C)`` of the commit storage holds at ``version``, if checkpoint ``version``
    describes it (None: that commit is missing or another one)."""
    name = commit_name(version)
    try:
        data = storage.read(name)
    except FileNotFoundError:
        return None
    commit_id = decode_commit(name, data).commit_id
    recorded = body.get("commit_id")
    if recorded is not None and recorded != commit_id:  # older checkpoints do not name it
        return None
    return commit_id, crc32c(data)


def _cache_matches_storage(the_log: Log) -> bool:
    """Whether the newest commit the cache applied is in storage as it was applied.

    A cache that fell behind commit GC is fine (it catches up from a checkpoint). One whose
    commit is missing with no newer checkpoint, or whose commit differs, belongs to a history
    the storage root no longer holds.
    """
    applied: tuple[int, str, int] | None = the_log.snapshot(lambda r: r.applied_commit())
    if applied is None:
        return True
    version, _commit_id, crc = applied
    name = commit_name(version)
    try:
        data = the_log.storage.read(name)
    except FileNotFoundError:
        return newest_checkpoint(the_log.storage) > version
    return crc32c(data) == crc

