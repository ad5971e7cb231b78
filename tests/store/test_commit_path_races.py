"""Races on the commit path: GC by condemnation, commits after a restore gap, checkpoints.

Interleavings are made deterministic with a real ``LocalStorage`` subclass that runs a hook
at one step (no mocks), as in ``test_gc_races.py`` and ``test_storage_behind.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from root_surgery import (
    QUIET,
    age_every_data_file,
    copy_root,
    is_commit,
    restore_root,
    write_past_a_backup,
)

import kvlog
from kvlog.clock import ManualClock
from kvlog.config import DAY_MS
from kvlog.errors import KvlogError, StorageBehindError, StorageError
from kvlog.log.naming import commit_name
from kvlog.storage import LocalStorage
from kvlog.storage.base import BytesLike

# -- GC by condemnation: a condemnation is never forgotten ----------------------------------------

class HookBeforeCommit(LocalStorage):
    """Runs ``hook`` once, just before the next commit is written (after the writer built it)."""

    hook: Callable[[], None] | None = None

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        hook, self.hook = self.hook, None
        if hook is not None and is_commit(name):
            hook()
        super().put_if_absent(name, data)


@pytest.mark.parametrize(
    ("later_ms", "settings"),
    [
        pytest.param(8 * DAY_MS, {}, id="second-gc-8-days-later-default-retention"),
        pytest.param(1_000, {"commit_retention_ms": 0}, id="second-gc-by-a-process-with-retention-0"),
    ],
)
def test_a_writer_stalled_across_two_gc_runs_never_makes_live_a_file_gc_deleted(
    tmp_path: Path, later_ms: int, settings: dict[str, int]
) -> None:
    """No commit ever makes live a file that GC deleted, however long the writer stalled:
    GC 1 condemns and deletes the stalled flush's file; GC 2 runs days later, or from a process
    with another ``commit_retention_ms``, and condemns another orphan; the stalled commit is
    still refused, and the flush writes its file again."""
    root = tmp_path / "root"
    storage = HookBeforeCommit(root, fsync=False)
    start = time.time_ns() // 1_000_000
    # data files of their own: orphan GC deletes the stalled flush's file
    with kvlog.open(storage, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET) as store:
        store.put(b"before", b"1", sync=True)

        def stall() -> None:
            age_every_data_file(root)  # the stalled flush's file is old now
            with kvlog.open(root, cache_dir=tmp_path / "gc1", **QUIET) as gc1:
                assert gc1.gc()["orphans"] >= 1  # condemned and deleted
            # Another orphan for the second GC to condemn (a crashed flush's file, say).
            stray = next((root / "data").rglob("*.arrow")).parent / ("f" * 32 + ".arrow")
            stray.write_bytes(b"x" * 100)
            age_every_data_file(root)
            clock = ManualClock(start + later_ms)
            with kvlog.open(root, cache_dir=tmp_path / "gc2", clock=clock, **{**QUIET, **settings}) as gc2:
                gc2.gc()

        storage.hook = stall
        store.put(b"slow", b"acknowledged", sync=True)  # acknowledged
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.check() == []
        assert reader.get(b"slow") == b"acknowledged"


# -- A commit whose answer was lost is checked like any other ---------------------------------

class RestoreThenLoseResponse(LocalStorage):
    """Restores the root from ``backup`` just before the next commit is written, writes it, and
    then loses the response (``timeout_after_success``)."""

    backup: Path | None = None

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        backup, self.backup = self.backup, None
        if backup is None or not is_commit(name):
            super().put_if_absent(name, data)
            return
        restore_root(self.root, backup)
        super().put_if_absent(name, data)
        raise StorageError(f"timed out writing {name} (it landed)")


def test_a_commit_whose_answer_was_lost_is_not_acknowledged_after_a_restore_gap(tmp_path: Path) -> None:
    """A commit that landed after a restore gap and whose answer was lost (found by reading
    it back) is checked for its predecessor too: never acknowledged unless a fresh reader sees
    it."""
    root = tmp_path / "root"
    storage = RestoreThenLoseResponse(root, fsync=False)
    # data files of their own: restore_root puts back the data directory of the backup
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET)
    acknowledged = False
    try:
        write_past_a_backup(store, root, tmp_path / "backup")
        storage.backup = tmp_path / "backup"
        try:
            store.put(b"d", b"4", sync=True)
            acknowledged = True
        except (StorageBehindError, StorageError):
            pass  # not acknowledged: fine
    finally:
        store.close(flush=False)
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        if acknowledged:
            assert reader.get(b"d") == b"4", "an acknowledged write is invisible to every fresh reader"


# -- A commit left after a gap never blocks the store ---------------------------------------------

class RestoreOnCommitFailingTakeBack(LocalStorage):
    """Restores the root from ``backup`` just before the next commit is written; the next
    delete of a commit fails (a transient error: nothing deleted)."""

    backup: Path | None = None
    fail_commit_delete = False
    after_restore: Callable[[], None] | None = None
    restored_dirs: tuple[str, ...] = ("log", "data")

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        backup, self.backup = self.backup, None
        if backup is not None and is_commit(name):
            restore_root(self.root, backup, self.restored_dirs)
            self.fail_commit_delete = True
            if self.after_restore is not None:
                self.after_restore()
        super().put_if_absent(name, data)

    def delete(self, name: str) -> None:
        if self.fail_commit_delete and is_commit(name):
            self.fail_commit_delete = False
            raise StorageError(f"cannot delete {name}: service unavailable")
        super().delete(name)


def test_a_commit_left_after_a_gap_is_refused_and_the_store_goes_on(tmp_path: Path) -> None:
    """A commit written after a restore gap whose take-back failed (or whose writer died before
    taking it back) names a predecessor the root does not hold: once the versions before it
    are written again, every reader refuses it as a no-op, and opens and writes go on."""
    root = tmp_path / "root"
    storage = RestoreOnCommitFailingTakeBack(root, fsync=False)
    # data files of their own: restore_root puts back the data directory of the backup
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET)
    try:
        write_past_a_backup(store, root, tmp_path / "backup")
        storage.backup = tmp_path / "backup"
        with pytest.raises(StorageBehindError):
            store.put(b"d", b"4", sync=True)  # not acknowledged, but its take-back failed
    finally:
        store.close(flush=False)
    # Life goes on on the restored root: a writer fills the versions up to the stray commit.
    with kvlog.open(root, cache_dir=tmp_path / "writer", **QUIET) as writer:
        for i in range(4):
            try:
                writer.put(f"w{i}".encode(), b"x", sync=True)
            except KvlogError:
                break
    # Every later open must still work (the stray commit is not part of the history).
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.get(b"a") == b"1"
        assert reader.get(b"d") is None
    with kvlog.open(root, cache_dir=tmp_path / "fresh2", **QUIET) as again:
        again.put(b"e", b"5", sync=True)
        assert again.get(b"e") == b"5"


# -- Readers that start from a checkpoint decide like readers that replayed --------------------

def test_a_reader_from_a_checkpoint_refuses_a_commit_written_after_a_gap_like_every_reader(
    tmp_path: Path,
) -> None:
    """A reader that starts from a checkpoint checks the first commit after it against the
    checkpoint's commit, so a commit written after a restore gap is refused by it as by a
    reader that replayed: readers of one root never disagree, and nobody sees a write its
    writer was told was not acknowledged."""
    root = tmp_path / "root"
    storage = RestoreOnCommitFailingTakeBack(root, fsync=False)
    # Only the log prefix is rolled back (data files are immutable, uniquely named objects):
    # the stray commit's data file stays, so what differs is only which readers apply it.
    storage.restored_dirs = ("log",)
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", **QUIET)
    try:
        write_past_a_backup(store, root, tmp_path / "backup")

        def another_writer_on_the_restored_root() -> None:
            with kvlog.open(root, cache_dir=tmp_path / "writer", checkpoint_interval=1, **QUIET) as w:
                w.put(b"w", b"x", sync=True)  # versions 3 (its producer) and 4, checkpointed

        storage.after_restore = another_writer_on_the_restored_root
        storage.backup = tmp_path / "backup"
        with pytest.raises(StorageBehindError):
            store.put(b"d", b"4", sync=True)  # lands at 5 after the restore; not acknowledged
    finally:
        store.close(flush=False)
    assert sorted((root / "log").glob("*.checkpoint.json")), "the other writer checkpointed"
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as fresh:
        fresh_view = (fresh.log.version, fresh.get(b"d"))
    try:
        with kvlog.open(root, read_only=True, cache_dir=tmp_path / "writer") as replayed:
            replayed_view: object = (replayed.log.version, replayed.get(b"d"))
    except StorageBehindError as e:
        replayed_view = e
    assert fresh_view == replayed_view, "two readers of one root reached different states"
    assert fresh_view[1] is None, "a fresh reader sees a write its writer was told was not acknowledged"


# -- A writer behind the commit retention window ---------------------------------------------

class HookOnDataRead(LocalStorage):
    """Runs ``hook`` once, at the next read of a data file's range (a batch read)."""

    hook: Callable[[], None] | None = None

    def read_range(self, name: str, start: int, length: int) -> bytes:
        hook, self.hook = self.hook, None
        if hook is not None and name.startswith("data/"):
            hook()
        return super().read_range(name, start, length)


def test_a_writer_behind_the_commit_retention_window_catches_up_beside_its_reads(
    tmp_path: Path,
) -> None:
    """A writer whose head commit was collected by commit GC (it idled past
    ``commit_retention_ms``) catches up inside ``commit()`` without emptying the key index its
    reads use: a read made while the caught-up cache is being built (at its first batch read)
    still answers, and the write then lands at the head with everything before it."""
    root = tmp_path / "root"
    storage = HookOnDataRead(root, fsync=False)
    # data files of their own: commit GC keeps a commit whose inline file is live, and the hook
    # runs at a data file's read
    settings = {**QUIET, "checkpoint_interval": 1, "commit_retention_ms": 0, "commit_inline_bytes": 0}
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", **settings)
    try:
        store.put(b"held", b"value", sync=True)
        time.sleep(0.01)
        with kvlog.open(root, cache_dir=tmp_path / "other", **settings) as other:
            other.put(b"other", b"x", sync=True)
            time.sleep(0.01)
            other.put(b"other2", b"x", sync=True)
            time.sleep(0.01)
            other.put(b"other3", b"x", sync=True)
            # The first writer's head commit and the one after it are gone: its cache cannot
            # replay to the head (commit GC keeps only the commit below the newest checkpoint).
            assert other.gc()["commits"] >= 2
        during: list[object] = []
        storage.hook = lambda: during.append(store.get(b"held"))
        store.put(b"next", b"y", sync=True)
        assert during == [b"value"]
        assert [store.get(k) for k in (b"held", b"other3", b"next")] == [b"value", b"x", b"y"]
    finally:
        store.close()
    with kvlog.open(root, cache_dir=tmp_path / "cache", **settings) as again:
        assert (again.get(b"held"), again.get(b"other2"), again.get(b"next")) == (b"value", b"x", b"y")
        assert again.check() == []


# -- A follow check that could not be made is made before the next write ----------------------

class RestoreOnCommitFailingFollowCheck(LocalStorage):
    """Restores the root from ``backup`` just before the next commit is written; the next
    ``failing_reads`` reads of a commit after it fail (a transient error: the writer cannot
    learn whether the commit it follows is still there)."""

    backup: Path | None = None
    failing_reads = 0

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        backup, self.backup = self.backup, None
        if backup is not None and is_commit(name):
            restore_root(self.root, backup)
            super().put_if_absent(name, data)
            self.landed = name
            self.failing_reads = 1
            return
        super().put_if_absent(name, data)

    def read(self, name: str) -> bytes:
        if self.failing_reads and is_commit(name) and name != self.landed:
            self.failing_reads -= 1
            raise StorageError(f"cannot read {name}: service unavailable")
        return super().read(name)

    landed = ""


def test_a_writer_that_could_not_check_its_commit_after_a_restore_never_writes_on_top_of_it(
        tmp_path: Path) -> None:
    """A commit that landed after a restore gap, whose writer could not read its predecessor
    (a transient error) and so neither acknowledged nor took it back, is still in the cache:
    the next commit, checkpoint or GC of that cache finds that the commit before it is gone and
    refuses to write, so no commit and no checkpoint of the lost history follows it, and a fresh
    opener reads the restored root with every acknowledged write."""
    root = tmp_path / "root"
    storage = RestoreOnCommitFailingFollowCheck(root, fsync=False)
    # data files of their own: restore_root puts back the data directory of the backup
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", checkpoint_interval=2, commit_inline_bytes=0,
                       **QUIET)
    acknowledged: list[bytes] = []
    try:
        write_past_a_backup(store, root, tmp_path / "backup")
        storage.backup = tmp_path / "backup"
        with pytest.raises(StorageError):
            store.put(b"d", b"4", sync=True)  # landed after the gap; its check failed
        for i in range(6):
            key = f"e{i}".encode()
            try:
                store.put(key, b"5", sync=True)
                acknowledged.append(key)
            except StorageBehindError:
                pass
        assert acknowledged == [], "a write acknowledged on top of a commit that follows a gap"
        with pytest.raises(StorageBehindError):
            store.gc()
    finally:
        store.close(flush=False)
    names = sorted(p.name for p in (root / "log").iterdir())
    assert not any(n.endswith(".checkpoint.json") and int(n.split(".")[0]) > 3 for n in names), names
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.check() == []
        assert reader.get(b"a") == b"1"
        assert reader.get(b"d") is None
    # The same cache, reopened, names the commits of the lost history it applied; accepting
    # their loss rebuilds it from the restored root, and it writes on from there.
    with pytest.raises(StorageBehindError, match=r"commits log/0+2\.json to log/0+3\.json"):
        kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET)
    with kvlog.open(root, cache_dir=tmp_path / "cache", on_storage_behind="rebuild", **QUIET) as again:
        again.put(b"f", b"6", sync=True)
        assert again.get(b"f") == b"6"
        assert again.get(b"d") is None
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh2") as reader:
        assert reader.check() == []
        assert reader.get(b"f") == b"6"


# -- The retry of a flush whose commit followed a gap is no duplicate -----------------------------

#: A storage for ``root`` and how to arm it: restore the root from a backup at the next commit.
Restoring = Callable[[Path], tuple[LocalStorage, Callable[[Path], None]]]


def _restore_on_commit(root: Path) -> tuple[LocalStorage, Callable[[Path], None]]:
    storage = HookBeforeCommit(root, fsync=False)

    def arm(backup: Path) -> None:
        storage.hook = lambda: restore_root(root, backup)
    return storage, arm


def _restore_then_lose_response(root: Path) -> tuple[LocalStorage, Callable[[Path], None]]:
    storage = RestoreThenLoseResponse(root, fsync=False)
    return storage, lambda backup: setattr(storage, "backup", backup)


def _restore_failing_take_back(root: Path) -> tuple[LocalStorage, Callable[[Path], None]]:
    storage = RestoreOnCommitFailingTakeBack(root, fsync=False)
    return storage, lambda backup: setattr(storage, "backup", backup)


def _restore_failing_follow_check(root: Path) -> tuple[LocalStorage, Callable[[Path], None]]:
    storage = RestoreOnCommitFailingFollowCheck(root, fsync=False)
    return storage, lambda backup: setattr(storage, "backup", backup)


@pytest.mark.parametrize("restoring", [
    pytest.param(_restore_on_commit, id="taken-back"),
    pytest.param(_restore_then_lose_response, id="answer-lost-then-taken-back"),
    pytest.param(_restore_failing_take_back, id="take-back-failed"),
    pytest.param(_restore_failing_follow_check, id="follow-check-failed"),
])
@pytest.mark.parametrize("retry", ["flush", "background"])
def test_the_retry_of_a_flush_whose_commit_followed_a_restore_gap_acknowledges_nothing(
        tmp_path: Path, restoring: Restoring, retry: str) -> None:
    """A flush whose commit landed after a restore gap fails (the commit taken back, or its
    check not made), but the writer's cache applied that commit, producer sequences included,
    and the flush's batches stay buffered for a retry. The retry must not take them for
    duplicates of a commit in storage and acknowledge them: neither ``flush()`` nor the
    background flusher (whose success ``flush()`` would report) ever succeeds for them, and a
    fresh reader of the restored root holds every acknowledged write and not the lost one."""
    root = tmp_path / "root"
    storage, arm = restoring(root)
    # data files of their own: restore_root puts back the data directory of the backup
    settings = {**QUIET, "flush_interval_ms": 20 if retry == "background" else 0, "commit_inline_bytes": 0}
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", **settings)
    try:
        write_past_a_backup(store, root, tmp_path / "backup")
        arm(tmp_path / "backup")
        with pytest.raises((StorageBehindError, StorageError)):
            store.put(b"d", b"4", sync=True)  # its commit followed the gap: not acknowledged
        if retry == "background":
            time.sleep(0.3)  # the background flusher retries the failed flush meanwhile
        for _ in range(3):
            with pytest.raises(StorageBehindError):
                store.flush()
    finally:
        store.close(flush=False)
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.get(b"a") == b"1"
        assert reader.get(b"d") is None


# -- A commit of ours after a gap stays a gap under another writer's commit ----------------------

class FailingOnce(LocalStorage):
    """Fails the next read of ``fail_read`` and the next delete of a commit when told to."""

    fail_read: str | None = None
    fail_commit_delete = False

    def read(self, name: str) -> bytes:
        if name == self.fail_read:
            self.fail_read = None
            raise StorageError(f"cannot read {name}: service unavailable")
        return super().read(name)

    def delete(self, name: str) -> None:
        if self.fail_commit_delete and is_commit(name):
            self.fail_commit_delete = False
            raise StorageError(f"cannot delete {name}: service unavailable")
        super().delete(name)


def test_a_commit_after_a_gap_covered_by_another_writers_commit_is_still_never_written_on(
        tmp_path: Path) -> None:
    """Two writers keep their caches through a restore. Writer A commits after the gap, but
    cannot read the commit its commit follows (a transient error): neither acknowledged nor
    taken back, its commit stays. Writer B, whose own last commit the restore removed, commits
    on top of A's; B's check finds A's commit where its own was, but B cannot take its commit
    back either. A's cache applies B's commit as a refused no-op, and the head's link to the
    commit before it (A's) holds: A must still find that its own commit follows a gap, and
    acknowledge nothing on top of it (no commit, no checkpoint a fresh reader would start
    from, no retry of its failed flush)."""
    root = tmp_path / "root"
    a_storage = FailingOnce(root, fsync=False)
    b_storage = FailingOnce(root, fsync=False)
    # data files of their own: restore_root puts back the data directory of the backup
    a = kvlog.open(a_storage, cache_dir=tmp_path / "a", checkpoint_interval=2, commit_inline_bytes=0, **QUIET)
    b = kvlog.open(b_storage, cache_dir=tmp_path / "b", checkpoint_interval=2, commit_inline_bytes=0, **QUIET)
    acknowledged: list[bytes] = []
    try:
        a.put(b"a", b"1", sync=True)
        copy_root(root, tmp_path / "backup")
        a.put(b"b", b"2", sync=True)  # A's own commit at version x
        b.put(b"c", b"3", sync=True)  # B's own commit at x + 1
        restore_root(root, tmp_path / "backup")
        a_storage.fail_read = commit_name(a.log.version)
        with pytest.raises(StorageError):
            a.put(b"d", b"4", sync=True)  # A's commit lands at x + 1, after the gap, unchecked
        b_storage.fail_commit_delete = True
        with pytest.raises(StorageBehindError):
            b.put(b"e", b"5", sync=True)  # lands at x + 2 on top of A's, and stays
        for key in (b"f", b"g", b"h"):
            try:
                a.put(key, b"6", sync=True)
                acknowledged.append(key)
            except StorageBehindError:
                pass
        try:
            a.flush()
            acknowledged.append(b"d")
        except StorageBehindError:
            pass
        assert acknowledged == [], "a write acknowledged on top of a commit that follows a gap"
    finally:
        a.close(flush=False)
        b.close(flush=False)
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.check() == []
        assert reader.get(b"a") == b"1"
        assert [reader.get(k) for k in (b"d", b"f", b"g", b"h")] == [None] * 4
