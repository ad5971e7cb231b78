"""The commit protocol: publishing a commit with one conditional swap of the head, and
applying commits.

A commit becomes live when its writer swaps the head (:mod:`kvlog.log.head`) from the
version its cache applied to the commit's bytes, which also leaves the commit at its own
name, ``log/<v>.json``. Then every commit up to it is applied to the metadata cache, in
version order, by the deterministic rules of :mod:`kvlog.log.replay`. A writer learns what
its commit decided (its outcome) from the cache after applying it, exactly as every other
reader does.

Everything about the history is decided here, in three places: a refused swap (another
writer won, or the cache is stale), a lost answer (:meth:`Committer._landed`), and the
history check as commits are applied (:meth:`Committer.apply_landed`: the head against the
cache, then each commit's ``prev`` against the commit before it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from kvlog.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    CorruptDataError,
    ReadOnlyError,
    StorageBehindError,
    StorageError,
)
from kvlog.format.checksum import crc32c
from kvlog.format.commit import Commit, FileEntry, decode_commit, encode_commit
from kvlog.format.datafile import decode_batch, make_record_batch
from kvlog.index import runs_pending
from kvlog.log.catch_up import catch_up
from kvlog.log.checkpoints import newest_checkpoint
from kvlog.log.head import HEAD_NAME, Head, head_files_present, hole_text, read_head, storage_behind
from kvlog.log.latency import Histogram
from kvlog.log.naming import LOG_PREFIX, commit_name, parse_log_name
from kvlog.log.replay import apply_commit
from kvlog.log.waiting import CommitSignal
from kvlog.meta import CommitOutcome, MetaTxn
from kvlog.storage import SwapConflict

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["Committer", "OwnBatches", "REBUILD_REOPEN"]

log = logging.getLogger("kvlog.log")

#: What a writer that found storage behind its cache tells its caller: reopening refuses the
#: cache (:class:`StorageBehindError`) until the loss of the commits storage lost is accepted.
REBUILD_REOPEN = ('reopen the store with on_storage_behind="rebuild" to rebuild its cache from '
                  "storage, losing the commits storage no longer holds")

#: How many attempts of one commit may fail on storage errors before the commit fails: a
#: backend failing that often (a full disk, a lost network) is not a race to retry for
#: ``commit_retries`` attempts. The pauses between them (10 ms doubling) add up to 1.3 s.
_STORAGE_ATTEMPTS = 8

#: The record batches a writer already holds for its own commit, by (file id, batch index):
#: applying that commit indexes them without reading the file back.
OwnBatches = dict[tuple[str, int], pa.RecordBatch]


class Committer:
    """Publishes commits by swapping the head and applies every published commit to the cache."""

    def __init__(self, the_log: Log) -> None:
        self._log = the_log
        self.apply_lock = threading.RLock()
        self._commit_lock = threading.RLock()
        self._own: dict[str, OwnBatches] = {}
        self.commits_written = 0
        #: How long each commit took, from the call to its outcome (retries included).
        self.latency = Histogram()
        self.commits_applied = 0
        #: Wakes :meth:`kvlog.log.log.Log.wait_for_commit` after every commit applied here.
        self.signal = CommitSignal()
        #: Some appended data was compacted away before this cache indexed it: the key index is
        #: rebuilt once caught up.
        self.index_stale = False
        #: The head as this process last read or swapped it: the next swap is conditional on it.
        self._head: Head | None = None

    # -- applying ---------------------------------------------------------------------------------
    def apply_landed(self) -> int:
        """Apply every commit up to the head; return the new version.

        The head is checked against the cache first (:func:`~kvlog.log.head.storage_behind`),
        then each commit against the one before it, which it names (``prev``). A commit
        missing below the head is one commit GC collected while this cache was behind (the
        cache catches up from the newest checkpoint, past it) or a damaged history
        (:class:`StorageBehindError`). The head's own commit is applied once its copy is at its
        name (where its inline file is read): a writer puts the copy there if a writer that
        swapped the head died before it did; a read-only cache waits for the next writer.
        """
        the_log = self._log
        storage = the_log.storage
        with self.apply_lock:
            # The head is remembered (for the next swap) only once the cache is found on its
            # history: a cache refused here keeps the head it last matched, so its swaps are refused.
            head = read_head(storage, self._head)
            while True:
                version: int
                applied: tuple[int, str, int] | None
                version, applied = the_log.snapshot(lambda r: (r.version(), r.applied_commit()))
                if head.version < version:
                    # Another process sharing the cache applied commits published after the head
                    # was read: read it again (it only moves on, unless the root was restored).
                    head = read_head(storage, head)
                behind = storage_behind(applied, head, storage.uri)
                if behind is not None:
                    raise StorageBehindError(behind[0], f"{behind[1]}: {REBUILD_REOPEN}")
                if version >= head.version:
                    self._head = head
                    return version
                name = commit_name(version + 1)
                try:
                    data = storage.read(name)
                    if version + 1 == head.version and crc32c(data) != head.crc:
                        if the_log.read_only:
                            raise CorruptDataError(name, "differs from the head, which holds that commit")
                        raise FileNotFoundError(name)  # damaged, or left by a history the head lost
                except FileNotFoundError:
                    if version + 1 == head.version:
                        if the_log.read_only:
                            self._head = head
                            return version  # its writer died before the copy: the next writer makes it
                        if not head_files_present(storage, head):
                            raise StorageBehindError(name, hole_text(storage.uri, head.version)) from None
                        storage.put(name, head.data)
                        data = head.data
                    elif newest_checkpoint(storage) > version:
                        # Caught up here, or by another handle sharing the cache meanwhile.
                        if not self.catch_up() and the_log.version == version:
                            raise StorageBehindError(name, "a commit below the newest checkpoint is "
                                                     "missing and the checkpoint could not be loaded") from None
                        continue
                    else:
                        raise StorageBehindError(name, hole_text(storage.uri, head.version)) from None
                commit = decode_commit(name, data)
                if commit.version != version + 1:
                    raise CorruptDataError(name, f"holds version {commit.version}")
                self._apply(commit, crc32c(data), data)

    def drop_past_head(self) -> None:
        """Delete the commits and checkpoints past the head, which a root whose head alone was
        put back from an older copy still holds: a checkpoint of the history the head lost would
        look like one of the history written after it once that passes its version.

        The names are listed before the head is read: a writer publishing meanwhile writes a
        name only after its swap moved the head there, so no name past the head read is theirs.
        """
        storage = self._log.storage
        names = list(storage.iter_names(LOG_PREFIX))
        version = read_head(storage).version
        past = [(p[0], name) for name in names if (p := parse_log_name(name)) is not None and p[0] > version]
        for _later, name in sorted(past, reverse=True):
            storage.delete(name)

    def catch_up(self) -> bool:
        """Catch this cache up from the newest checkpoint after it fell behind commit GC
        (:mod:`kvlog.log.catch_up`); whether it moved forward."""
        with self.apply_lock:
            if not catch_up(self._log):
                return False
            self.index_stale = False
            self._log.checkpoint_rows = {}
        self.signal.notify()
        return True

    def _apply(self, commit: Commit, crc: int, held: bytes | None = None) -> CommitOutcome | None:
        """Apply ``commit`` (``crc``: the CRC32C of its bytes, ``held``: those bytes, where the
        batches of an inline file are read from) if the cache is at the version before it;
        return the outcome it decided (None: the cache was elsewhere)."""
        the_log = self._log
        own = self._own.get(commit.commit_id, {})
        name = commit_name(commit.version)

        def source(file: FileEntry, index: int) -> pa.RecordBatch:
            cached = own.get((file.file_id, index))
            if cached is not None:
                return cached
            loc = file.batches[index].location
            if held is not None and file.path == name:
                return decode_batch(name, memoryview(held)[loc.position:loc.position + loc.length], loc)
            try:
                data = the_log.storage.read_range(file.path, loc.position, loc.length)
            except FileNotFoundError:
                # This cache fell behind GC: a later replace took the batch and its file is gone.
                # Index nothing now; once caught up, the key index is rebuilt from the live
                # batches (which raises if a live batch's file is missing).
                missing.append(file.path)
                return make_record_batch([], [], [])
            return decode_batch(file.path, data, loc)

        missing: list[str] = []

        def work(txn: Any) -> tuple[int, CommitOutcome] | None:
            meta = MetaTxn(the_log.env, txn)
            if meta.version() != commit.version - 1:
                return None
            applied = meta.applied_commit()
            if applied is not None and commit.previous_id not in (None, applied[1]):
                # The one check that a commit continues the history this cache applied. The head
                # is forgotten: the next commit reads it again, and is refused as this apply was.
                self._head = None
                raise StorageBehindError(name, (
                    f"follows commit {commit.previous_id}, but this cache applied commit {applied[1]} "
                    f"at version {applied[0]}: the storage root holds another history (restored "
                    "from an older copy?): " + REBUILD_REOPEN))
            missing.clear()
            # An index marked for rebuilding is not maintained meanwhile (the rebuild reads the
            # live data at the newest version; files of older versions may be gone).
            settings = the_log.apply_settings(index_ready=meta.get_meta("index_ready") != b"0")
            outcome = apply_commit(meta, commit, source, settings)
            meta.set_applied_commit(commit.version, commit.commit_id, crc)
            if missing:
                meta.put_meta("index_ready", b"0")  # rebuilt at the next open if we stop here
            return runs_pending(meta), outcome

        # The index pauses the store's writers while a commit writes it record by record.
        with the_log.index.applying():
            done = the_log.env.write(work)
        if done is None:
            return None
        runs, outcome = done
        self.commits_applied += 1
        self.signal.notify()
        self.index_stale = self.index_stale or bool(missing)
        if the_log.index.settle_due(runs):
            the_log.settle_index()
        return outcome

    def outcome(self, commit_id: str) -> CommitOutcome | None:
        """What applying commit ``commit_id`` decided, if it was applied here recently."""
        found: CommitOutcome | None = self._log.snapshot(lambda r: r.get_outcome(commit_id))
        return found

    # -- committing -------------------------------------------------------------------------------
    def commit(self, build: Callable[[int], Commit], own: OwnBatches | None = None) -> CommitOutcome:
        """Publish the commit ``build(version)`` at the next version and return its outcome.

        ``build`` is called again for each attempt (it may re-validate, raising to abort) and must
        keep the same commit id, by which a commit whose outcome was unknown is recognised.
        """
        the_log = self._log
        the_log.check_open()
        if the_log.read_only:
            raise ReadOnlyError("the store is open read-only")
        retries = the_log.config.commit_retries
        failing = min(retries, _STORAGE_ATTEMPTS)
        started = the_log.clock.monotonic_s()
        with self._commit_lock:
            storage_errors = 0
            last_error: StorageError | None = None
            attempted = False  # the commit id is fresh: no outcome to look for before a first swap
            for _attempt in range(retries):
                if storage_errors:
                    # Back off from a failing backend (not from a lost race): 10 ms doubling to 1 s.
                    _pause(min(0.01 * 2 ** (storage_errors - 1), 1.0))
                try:
                    head = self._current_head()
                except StorageBehindError:
                    raise
                except StorageError as e:
                    storage_errors += 1
                    last_error = e
                    if storage_errors >= failing:
                        break
                    continue
                version = head.version + 1
                commit = replace(build(version), previous_id=head.commit_id)
                if attempted:
                    done = self.outcome(commit.commit_id)  # an earlier attempt's answer was lost?
                    if done is not None:
                        return done
                attempted = True
                name = commit_name(version)
                if own:
                    self._own[commit.commit_id] = own
                decided: CommitOutcome | None = None
                try:
                    data = encode_commit(commit)
                    try:
                        token = the_log.storage.swap(HEAD_NAME, data, head.token, copy_to=name)
                    except SwapConflict:
                        the_log.refresh()  # another writer won; or ours landed and its answer was lost
                    except StorageError as e:
                        if not self._landed(version, commit.commit_id, e):
                            storage_errors += 1
                            last_error = e
                            if storage_errors >= failing:
                                break
                            continue
                        the_log.refresh()
                    else:
                        self.commits_written += 1
                        crc = crc32c(data)
                        self._head = Head(version, commit.commit_id, crc, token, data)
                        decided = self._apply_created(decode_commit(name, data), crc, data)
                finally:
                    self._own.pop(commit.commit_id, None)
                done = decided if decided is not None else self.outcome(commit.commit_id)
                if done is not None:
                    self.latency.observe(the_log.clock.monotonic_s() - started)
                    the_log.maybe_checkpoint(version)
                    return done
            if last_error is not None and storage_errors >= failing:
                raise StorageError(f"{storage_errors} commit attempts failed: {last_error}") from last_error
            raise CommitConflictError(f"{retries} attempts lost the race for the next commit version")

    def _current_head(self) -> Head:
        """The head the next swap expects: the one this process last read or swapped (read it
        first if none). A head that moved since (another writer, another process sharing the
        cache) refuses the swap, which then refreshes: nothing is looked up before it."""
        head = self._head
        if head is None:
            self._log.refresh()
            head = self._head
            assert head is not None
        return head

    def _apply_created(self, commit: Commit, crc: int, data: bytes) -> CommitOutcome | None:
        """Apply ``commit``, which this writer just published (``crc``: the CRC32C of ``data``,
        its bytes), and return the outcome applying it here decided (None: the cache was
        elsewhere). A swap that succeeded proves the head holds exactly these bytes: the commit
        is decoded from them, not read back. If the cache moved on meanwhile (another process
        sharing it applied the commit), the outcome is read from the cache."""
        the_log = self._log
        with self.apply_lock:
            decided = self._apply(commit, crc, data)
            if (decided is None and the_log.version < commit.version) or self.index_stale:
                the_log.refresh()
            return decided

    def _landed(self, version: int, commit_id: str, cause: StorageError) -> bool:
        """After a swap that failed with ``cause``: whether our commit ``version`` is live.

        The head tells while it holds our commit or one before it. Once it moved past, the
        commit at our version (its copy, which every swap leaves before the head moves on) is
        ours or another writer's; if commit GC collected it already, nobody can tell.
        """
        storage = self._log.storage
        last: Exception = cause
        for _ in range(5):
            try:
                head = read_head(storage)
                if head.commit_id == commit_id or head.version < version:
                    return head.commit_id == commit_id
                name = commit_name(version)
                try:
                    return decode_commit(name, storage.read(name)).commit_id == commit_id
                except FileNotFoundError:
                    break
            except StorageError as e:
                last = e
        raise CommitStateUnknownError(
            f"could not learn whether commit {commit_name(version)} landed; reopen the store and "
            "read back what it holds before resending"
        ) from last


def _pause(seconds: float) -> None:
    """Wait ``seconds`` (an event wait, so no module reads the clock to sleep)."""
    threading.Event().wait(seconds)
