"""The commit protocol: taking the next version with put-if-absent, and applying commits.

A commit is written as ``log/<v+1>`` with put-if-absent, the single atomic switch
that makes what it describes live; then every commit up to it is applied to the
metadata cache, in version order, by the deterministic rules of
:mod:`kvlog.log.replay`. A writer learns what its commit decided (its outcome)
from the cache after applying it, exactly as every other reader does.

Around the switch, the committer checks that storage still holds the history the
cache applied (see :meth:`Committer.verify_head`): put-if-absent cannot tell a
free name from one whose commit vanished (a root restored from an older copy).
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
    KvlogError,
    ReadOnlyError,
    StorageBehindError,
    StorageError,
)
from kvlog.format.checksum import crc32c
from kvlog.format.commit import Commit, FileEntry, decode_commit, encode_commit
from kvlog.format.datafile import decode_batch, make_record_batch
from kvlog.index import runs_pending
from kvlog.log.catch_up import catch_up, fell_behind
from kvlog.log.checkpoints import newest_checkpoint
from kvlog.log.lineage import followed_by, left_behind, link_broken
from kvlog.log.naming import commit_name
from kvlog.log.replay import apply_commit, apply_stray
from kvlog.log.waiting import CommitSignal
from kvlog.meta import CommitOutcome, MetaTxn

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["Committer", "FellBehind", "OwnBatches"]

log = logging.getLogger("kvlog.log")

#: Why a cache that fell behind commit GC could not go on: the commits after its head are
#: gone. The store's history is whole, and the cache catches up from the newest checkpoint
#: (:mod:`kvlog.log.catch_up`) before this is raised, so the same call made again goes on.
_BEHIND_WINDOW = (
    "this cache fell behind the commit retention window (the commits after the newest one it "
    "applied were collected below a newer checkpoint) and caught up from the checkpoint; "
    "nothing was {done}: try again, or keep commits longer with a larger commit_retention_ms"
)


class FellBehind(StorageBehindError):
    """A cache that fell behind commit GC met it in the middle of a step, caught up from the
    newest checkpoint, and abandoned the step (nothing written): it can be made again."""

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
    """Writes commits at the next free version and applies every landed commit to the cache."""

    def __init__(self, the_log: Log) -> None:
        self._log = the_log
        self.apply_lock = threading.RLock()
        self._commit_lock = threading.RLock()
        self._own: dict[str, OwnBatches] = {}
        self.commits_written = 0
        self.commits_applied = 0
        #: Wakes :meth:`kvlog.log.log.Log.wait_for_commit` after every commit applied here.
        self.signal = CommitSignal()
        #: Some appended data was compacted away before this cache indexed it: the key index is
        #: rebuilt once caught up.
        self.index_stale = False
        #: ``(version, commit id)`` of a head whose link to the commit before it was checked
        #: in storage after it landed: :meth:`verify_head` need not read that commit again.
        self._linked: tuple[int, str] | None = None
        #: ``(version, commit id)`` of the newest commit this writer created and checked after
        #: it landed (:meth:`_verify_follows`): the next commit need not read it before writing.
        self._own_head: tuple[int, str] | None = None
        #: A commit this writer created whose check after it landed (:meth:`_verify_follows`)
        #: raised before it could decide: ``(commit, version it follows, head)``, checked again
        #: before this cache is trusted to write or answer (:meth:`verify_head`).
        self._unverified: tuple[Commit, int, tuple[int, tuple[int, str, int] | None]] | None = None
        #: Set once a commit this writer created was found to follow a gap: this cache applied
        #: it, so it is out of date for good (:meth:`verify_head` raises until it is reopened).
        self._gap: tuple[str, str] | None = None

    # -- applying ---------------------------------------------------------------------------------
    def apply_landed(self) -> int:
        """Apply every commit that landed after the applied version; return the new version."""
        the_log = self._log
        with self.apply_lock:
            version = the_log.version
            while True:
                name = commit_name(version + 1)
                try:
                    data = the_log.storage.read(name)
                except FileNotFoundError:
                    if not fell_behind(the_log.storage, version) or not self.catch_up():
                        return version
                    version = the_log.version
                    continue
                commit = decode_commit(name, data)
                if commit.version != version + 1:
                    raise CorruptDataError(name, f"holds version {commit.version}")
                try:
                    self._apply(commit, crc32c(data), self._log.snapshot(lambda r: r.applied_commit()), data)
                except FellBehind:
                    version = the_log.version  # caught up: go on from there
                    continue
                version += 1

    def catch_up(self) -> bool:
        """Catch this cache up from the newest checkpoint after it fell behind commit GC
        (:mod:`kvlog.log.catch_up`); whether it moved forward. What this committer remembered
        of the history it left is dropped with it."""
        with self.apply_lock:
            if not catch_up(self._log):
                return False
            self._linked = self._own_head = self._unverified = self._gap = None
            self.index_stale = False
            self._log.checkpoint_rows = {}
        self.signal.notify()
        return True

    def _behind(self, name: str, done: str) -> FellBehind:
        """The error for a step that met commit GC past this cache, once the cache caught up."""
        self.catch_up()
        return FellBehind(name, _BEHIND_WINDOW.format(done=done))

    def _apply(self, commit: Commit, crc: int, applied: tuple[int, str, int] | None,
               held: bytes | None = None) -> CommitOutcome | None:
        """Apply ``commit`` (``crc``: the CRC32C of its bytes, ``held``: those bytes, where the
        batches of an inline file are read from) if the cache is at the version before it;
        return the outcome it decided (None: the cache was elsewhere). ``applied`` is the
        cache's head (:meth:`MetaReader.applied_commit`), read under :attr:`apply_lock`."""
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
        stray = self._is_stray(commit, applied)

        def work(txn: Any) -> tuple[int, CommitOutcome] | None:
            meta = MetaTxn(the_log.env, txn)
            if meta.version() != commit.version - 1:
                return None
            if stray:
                outcome = apply_stray(meta, commit)
                meta.set_applied_commit(commit.version, commit.commit_id, crc)
                return runs_pending(meta), outcome
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

    def _is_stray(self, commit: Commit, applied: tuple[int, str, int] | None) -> bool:
        """Whether ``commit`` was written after a gap: it names another predecessor than the
        commit at the version before, which storage holds as this cache applied it.

        Every reader whose cache agrees with storage decides the same, so refusing it keeps
        replay deterministic; a cache that applied another commit than storage holds is itself
        out of date, and :class:`StorageBehindError` says so.
        """
        the_log = self._log
        if (commit.previous_id is None or applied is None or applied[0] != commit.version - 1
                or applied[1] == commit.previous_id):
            return False
        name = commit_name(applied[0])
        try:
            holds = crc32c(the_log.storage.read(name)) == applied[2]
        except FileNotFoundError:
            if newest_checkpoint(the_log.storage) > commit.version:
                # The commit this cache applied was taken back by its writer (it had landed in
                # a version commit GC freed) and the history it left was collected below a
                # checkpoint: the store is whole, this cache is behind it.
                raise self._behind(commit_name(commit.version), "written") from None
            holds = False
        if holds and left_behind(the_log.storage, applied[0]):
            raise self._behind(name, "written")
        if holds:
            log.warning("commit %s does not follow %s (written after a gap, when the root was "
                        "restored): refused", commit_name(commit.version), name)
            return True
        raise StorageBehindError(
            commit_name(commit.version),
            f"follows commit {commit.previous_id}, but this cache applied commit {applied[1]} at "
            f"version {applied[0]}, which the storage root no longer holds (restored from an older "
            "copy?): " + REBUILD_REOPEN,
        )

    def outcome(self, commit_id: str) -> CommitOutcome | None:
        """What applying commit ``commit_id`` decided, if it was applied here recently."""
        found: CommitOutcome | None = self._log.snapshot(lambda r: r.get_outcome(commit_id))
        return found

    # -- committing -------------------------------------------------------------------------------
    def commit(self, build: Callable[[int], Commit], own: OwnBatches | None = None) -> CommitOutcome:
        """Write the commit ``build(version)`` at the next free version and return its outcome.

        ``build`` is called again for each attempt (it may re-validate, raising to abort) and must
        keep the same commit id, by which a commit whose outcome was unknown is recognised. A
        cache found behind commit GC on the way catches up and the commit is made again.
        """
        tries = 3
        while True:
            try:
                return self._commit(build, own)
            except FellBehind:
                tries -= 1
                if not tries:
                    raise

    def _commit(self, build: Callable[[int], Commit], own: OwnBatches | None) -> CommitOutcome:
        the_log = self._log
        the_log.check_open()
        if the_log.read_only:
            raise ReadOnlyError("the store is open read-only")
        retries = the_log.config.commit_retries
        failing = min(retries, _STORAGE_ATTEMPTS)
        with self._commit_lock:
            storage_errors = 0
            last_error: StorageError | None = None
            for attempt in range(retries):
                if storage_errors:
                    # Back off from a failing backend (not from a lost race): 10 ms doubling to 1 s.
                    _pause(min(0.01 * 2 ** (storage_errors - 1), 1.0))
                # The first attempt takes the version after the applied one without asking
                # storage: if another writer took it, put-if-absent refuses, and the retry reads.
                # The head is read in the same snapshot: the commit at that version.
                if attempt == 0:
                    head: tuple[int, tuple[int, str, int] | None] = the_log.snapshot(
                        lambda r: (r.version(), r.applied_commit()))
                else:
                    head = the_log.refresh(), None
                version = head[0] + 1
                commit = build(version)
                done = self.outcome(commit.commit_id)
                if done is not None:
                    return done
                try:
                    self._check_own_commits()
                    previous = self._checked_own_head(version - 1, head)
                    if previous is None:
                        previous = self.verify_head(version - 1)
                except StorageError as e:
                    storage_errors += 1
                    last_error = e
                    if storage_errors >= failing:
                        break
                    continue
                commit = replace(commit, previous_id=previous)
                name = commit_name(version)
                if own:
                    self._own[commit.commit_id] = own
                created = checked = False
                decided: CommitOutcome | None = None
                try:
                    data = encode_commit(commit)
                    try:
                        the_log.storage.put_if_absent(name, data)
                        self.commits_written += 1
                        created = True
                    except FileExistsError:
                        the_log.refresh()  # another writer took this version; ours may have landed earlier
                    except StorageError as e:
                        if not self._landed(name, commit.commit_id, e):
                            storage_errors += 1
                            last_error = e
                            if storage_errors >= failing:
                                break
                            continue
                        created = True  # it landed, its answer was lost
                        the_log.refresh()
                    else:
                        # Checked before it is applied here: a commit that landed in a version
                        # commit GC had freed is taken back before this cache ever applies it.
                        self._check_follows(commit, version - 1, head)
                        checked = True
                        decided = self._apply_created(decode_commit(name, data), crc32c(data), data)
                finally:
                    self._own.pop(commit.commit_id, None)
                done = decided if decided is not None else self.outcome(commit.commit_id)
                if done is not None:
                    if created and not checked:
                        self._check_follows(commit, version - 1, head)
                    the_log.maybe_checkpoint()
                    return done
            if last_error is not None and storage_errors >= failing:
                raise StorageError(f"{storage_errors} commit attempts failed: {last_error}") from last_error
            raise CommitConflictError(f"{retries} attempts lost the race for the next commit version")

    def _checked_own_head(self, version: int, head: tuple[int, tuple[int, str, int] | None]) -> str | None:
        """The id of commit ``version`` when it is the commit this writer created last, checked
        after it landed, and still the head this cache applied; else None (read it in storage).
        ``head``: the applied version and head read in one snapshot (the head unread: None).

        Skipping the read is safe because every commit is checked after it lands
        (:meth:`_verify_follows` reads the commit it follows): a restore that removed or
        replaced this head since it was checked is found there, and the commit written on top
        is taken back before anything is acknowledged.
        """
        own = self._own_head
        if own is None or own[0] != version:
            return None
        applied = head[1] if head[0] == version else None
        if applied is None:
            applied = self._log.snapshot(lambda r: r.applied_commit())
        if applied is None or (applied[0], applied[1]) != own:
            return None
        return own[1]

    def _apply_created(self, commit: Commit, crc: int, data: bytes) -> CommitOutcome | None:
        """Apply ``commit``, which this writer just created (``crc``: the CRC32C of ``data``, its
        bytes), and return the outcome applying it here decided (None: the cache was elsewhere).

        A put-if-absent that succeeded proves storage holds exactly these bytes at that
        version: the commit is decoded from them and applied, not read back. If the cache moved on
        meanwhile (another thread refreshed it from storage), it is caught up as usual.
        """
        the_log = self._log
        with self.apply_lock:
            version, applied = the_log.snapshot(lambda r: (r.version(), r.applied_commit()))
            decided = self._apply(commit, crc, applied, data) if version == commit.version - 1 else None
            if (decided is None and the_log.version < commit.version) or self.index_stale:
                the_log.refresh()
            return decided

    def verify_head(self, version: int) -> str | None:
        """Before writing commit ``version + 1``: check that commit ``version``, the newest this
        cache applied, is still in storage as applied, and return its id.

        Commit names are taken with put-if-absent, which cannot tell a free name from one whose
        commit vanished: a root restored from an older copy, or commits collected after a
        checkpoint while this cache slept. Writing on would put an acknowledged commit after a
        gap that no fresh reader ever crosses. A cache that merely fell behind the retention
        window catches up from the newest checkpoint; otherwise :class:`StorageBehindError`.
        """
        self._check_own_commits()
        if version == 0:
            if fell_behind(self._log.storage, 0):
                raise self._behind(commit_name(1), "written")  # commit 1 was collected
            return None
        the_log = self._log
        applied: tuple[int, str, int] | None = the_log.snapshot(lambda r: r.applied_commit())
        name = commit_name(version)
        try:
            data = the_log.storage.read(name)
        except FileNotFoundError:
            if applied is not None and applied[0] == version and \
                    followed_by(the_log.storage, version, applied[1]):
                # Collected below a checkpoint under a successor that follows it: storage holds
                # this cache's history, which is merely behind (the write at the next version is
                # refused as taken, and the retry applies what landed).
                return applied[1]
            if newest_checkpoint(the_log.storage) > version:
                raise self._behind(name, "written") from None
            raise StorageBehindError(
                name, "the newest commit this cache applied is missing from storage (restored from an "
                "older copy, or damaged); nothing was written: " + REBUILD_REOPEN,
            ) from None
        if applied is None or applied[0] != version:
            return decode_commit(name, data).commit_id
        if crc32c(data) != applied[2]:
            raise StorageBehindError(
                name, "differs from the commit this cache applied at that version (restored from an "
                "older copy, or damaged); nothing was written: " + REBUILD_REOPEN,
            )
        if self._linked != (applied[0], applied[1]):
            self._verify_link(version)
            self._linked = (applied[0], applied[1])
        return applied[1]

    def _check_own_commits(self) -> None:
        """Refuse to trust this cache while a commit this writer created is known to follow a
        gap, or was never checked after it landed (then check it now).

        The link check of :meth:`verify_head` looks one commit back from the head, and that is
        not enough once another writer's commit lands on top of ours: a writer of the lost
        history whose own check failed leaves its commit after the gap, this cache applies it
        as a refused no-op, and the head's link to our commit holds. Writing on would put
        acknowledged commits, and checkpoints that fresh readers start from, on top of a gap.
        """
        if self._gap is not None:
            raise StorageBehindError(*self._gap)
        pending = self._unverified
        if pending is not None:
            self._verify_follows(*pending)
            if self._unverified is pending:
                self._unverified = None

    def _verify_link(self, version: int) -> None:
        """Check that the commit this cache applied before its head ``version`` is still in
        storage as applied (or was collected below a checkpoint that covers the head).

        The head alone proves nothing when it landed after a restore removed the commit it
        follows and its writer could not check that (a failed read, a crash before the check):
        a cache of the lost history applies such a commit like any other, and writing on top of
        it would acknowledge commits and checkpoints that name data files the restore removed.
        """
        before: tuple[int, str, int] | None = self._log.snapshot(lambda r: r.applied_before())
        if before is None or before[0] != version - 1:
            return
        broken = link_broken(self._log.storage, version, before)
        if broken is not None:
            raise StorageBehindError(
                commit_name(version - 1), f"{broken}, but this cache applied it before its newest "
                f"commit {commit_name(version)} (the storage root was restored from an older copy while "
                "that commit was on its way); nothing was written: " + REBUILD_REOPEN,
            )

    def _check_follows(self, commit: Commit, previous: int,
                       head: tuple[int, tuple[int, str, int] | None]) -> None:
        """:meth:`_verify_follows`, remembered as unverified until it decides (a check that
        raised before deciding is made again before this cache is trusted)."""
        self._unverified = (commit, previous, head)
        self._verify_follows(commit, previous, head)
        self._unverified = None

    def _verify_follows(self, commit: Commit, previous: int,
                        head: tuple[int, tuple[int, str, int] | None]) -> None:
        """After ``commit`` landed: check that the commit it follows is still in storage, so it
        is not acknowledged after a gap (a root restored while it was on its way).

        Otherwise the commit, which no fresh reader can reach, is taken back (deleted: only its
        writer does that, and only a cache of the lost history could have applied it) and
        :class:`StorageBehindError` is raised; nothing is acknowledged. ``head``: the applied
        version and head read before writing (the head unread: None); when the commit read now
        has the bytes of that head, which ``commit`` follows, it need not be decoded.
        """
        if previous != 0 and commit.previous_id is None:
            return
        storage = self._log.storage
        own = commit_name(commit.version)
        name = commit_name(previous) if previous else own
        known = head[1] if head[0] == previous else None
        missing = False
        try:
            if previous == 0:
                # The first commit has nothing before it to read. It took a version commit GC
                # freed (its writer's cache was empty while others wrote, checkpointed and
                # collected) when a checkpoint exists and no commit after it names it.
                missing = True
                follows = followed_by(storage, commit.version, commit.commit_id) or \
                    newest_checkpoint(storage) == 0
            else:
                data = storage.read(name)
                if known is not None and known[0] == previous and known[1] == commit.previous_id \
                        and crc32c(data) == known[2]:
                    follows = True
                else:
                    follows = decode_commit(name, data).commit_id == commit.previous_id
        except FileNotFoundError:
            missing = True
            follows = followed_by(storage, commit.version, commit.commit_id) or \
                self._collected_after(own)
        if follows:
            self._linked = self._own_head = (commit.version, commit.commit_id)
            return
        taken_back = False
        try:
            if decode_commit(own, storage.read(own)).commit_id == commit.commit_id:
                storage.delete(own)
                taken_back = True
        except (FileNotFoundError, KvlogError) as e:
            log.warning("could not take back commit %s written after a gap: %s", own, e)
        self._unverified = None
        applied = self._log.snapshot(lambda r: r.applied_commit())
        if missing and newest_checkpoint(storage) > previous:
            # Commit GC collected the history up to a checkpoint past this cache's head and
            # freed the version this commit took: the cache is behind, not of a lost history.
            # Caught up from that checkpoint, it never crosses this commit (if it was not taken
            # back), and the commit can be written again at the head.
            raise self._behind(name, "acknowledged")
        reason = (f"is no longer the commit {own} follows (the storage root was restored "
                  "while the commit was on its way); nothing was acknowledged: " + REBUILD_REOPEN)
        if not taken_back or (applied is not None and applied[0] >= commit.version):
            # This cache applied the commit, or may yet (it is still in storage): out of date
            # for good.
            self._gap = (name, reason)
        raise StorageBehindError(name, reason)

    def _collected_after(self, own: str) -> bool:
        """Whether the missing predecessor of commit ``own``, which no later commit names, was
        collected after ``own`` landed (False: ``own`` took a version commit GC had freed).

        Commit GC deletes oldest first and keeps the commit right below the newest checkpoint,
        so once the predecessor is gone the commit after ``own`` exists, and it goes only after
        ``own``. While ``own`` is still there, nothing names it: it landed in a freed version.
        Once ``own`` is gone too, whether a reader ever crossed it cannot be told.
        """
        if self._log.storage.exists(own):
            return False
        raise CommitStateUnknownError(
            f"commit {own} and the commits around it were collected before its writer could check "
            "that it follows the commit before it; nothing was acknowledged: reopen the store and "
            "read back what it holds, and keep commits longer than a writer's pauses with a larger "
            "commit_retention_ms"
        )

    def _landed(self, name: str, commit_id: str, cause: StorageError) -> bool:
        """After a failed put-if-absent: whether our commit is there (re-read until known)."""
        last: Exception = cause
        for _ in range(5):
            try:
                data = self._log.storage.read(name)
            except FileNotFoundError:
                return False
            except StorageError as e:
                last = e
                continue
            return decode_commit(name, data).commit_id == commit_id
        raise CommitStateUnknownError(
            f"could not learn whether {name} landed; reopen the store before resending"
        ) from last


def _pause(seconds: float) -> None:
    """Wait ``seconds`` (an event wait, so no module reads the clock to sleep)."""
    threading.Event().wait(seconds)

