"""Races on the commit path: GC by condemnation, restores during a commit, lost answers,
checkpoints, commit GC past a writer.

A commit is live once its writer swapped the head (``log/head.json``), conditional on the
version of the head its cache applied; only then is the commit's own name written. So a
writer whose root was restored under it, or whose cache is stale, is refused at the swap and
writes nothing, and every reader of the root sees one history. Interleavings are made
deterministic with a real ``LocalStorage`` subclass that runs a hook at one step (no mocks),
as in ``test_gc_races.py`` and ``test_storage_behind.py``.
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
    restore_root,
    write_past_a_backup,
)

import kvlog
from kvlog.clock import ManualClock
from kvlog.config import DAY_MS
from kvlog.errors import StorageBehindError, StorageError
from kvlog.log.naming import commit_name
from kvlog.storage import LocalStorage, SwapConflict
from kvlog.storage.base import BytesLike
from tests.commits import HEAD_NAME, HookBeforeSwap, head_version


def _commit_versions(root: Path) -> list[int]:
    """The versions of the commits a local root holds at their own names."""
    return sorted(int(p.name.split(".")[0]) for p in (root / "log").glob("*[0-9].json"))


# -- GC by condemnation: a condemnation is never forgotten ----------------------------------------

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
    with another ``commit_retention_ms``, and condemns another orphan. The stalled writer's
    swap is refused (the GC commits moved the head); applying them it learns its file was
    condemned, and the flush writes its file again."""
    root = tmp_path / "root"
    storage = HookBeforeSwap(root, fsync=False)
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
        assert storage.refused >= 1, "the stalled swap was not refused"
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.check() == []
        assert reader.get(b"slow") == b"acknowledged"


# -- A restore under a writer about to swap the head ----------------------------------------------

class RestoreBeforeSwap(LocalStorage):
    """Restores ``restored_dirs`` of the root from ``backup`` just before the next swap of the
    head, then runs ``after_restore`` (another writer on the restored root, say), and swaps.

    ``lose_answer``: that swap's caller gets a ``StorageError`` whatever the swap did (a lost
    response). ``head_reads_failing``: how many reads of the head fail after the restore (a
    transient error: the writer cannot learn what the head holds). Counts the swaps refused.
    """

    backup: Path | None = None
    restored_dirs: tuple[str, ...] = ("log", "data")
    after_restore: Callable[[], None] | None = None
    lose_answer = False
    head_reads_failing = 0
    failing = 0
    refused = 0

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        backup, self.backup = self.backup, None
        if backup is not None:
            restore_root(self.root, backup, self.restored_dirs)
            self.failing = self.head_reads_failing
            if self.after_restore is not None:
                self.after_restore()
        lose = backup is not None and self.lose_answer
        try:
            token = super().swap(name, data, expected, copy_to)
        except SwapConflict:
            self.refused += 1
            if lose:
                raise StorageError(f"timed out swapping {name}") from None
            raise
        if lose:
            raise StorageError(f"timed out swapping {name}")
        return token

    def read_versioned(self, name: str, unless: str | None = None) -> tuple[bytes, str] | None:
        if self.failing and name == HEAD_NAME:
            self.failing -= 1
            raise StorageError(f"cannot read {name}: service unavailable")
        return super().read_versioned(name, unless)


def test_a_commit_whose_answer_was_lost_is_not_acknowledged_after_a_restore_gap(tmp_path: Path) -> None:
    """The root is restored from an older copy just before a writer swaps the head, and the
    swap's answer is lost. The writer reads the head to learn whether its commit landed: the
    head is older than the commit, so it did not. The retry's swap, conditional on the head the
    cache applied, is refused too, and the writer finds the head older than its cache: nothing
    is acknowledged, nothing is written at the commit's name, and a fresh reader holds the
    restored history."""
    root = tmp_path / "root"
    storage = RestoreBeforeSwap(root, fsync=False)
    storage.lose_answer = True
    # data files of their own: restore_root puts back the data directory of the backup
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET)
    try:
        write_past_a_backup(store, root, tmp_path / "backup")
        storage.backup = tmp_path / "backup"
        with pytest.raises(StorageBehindError, match="whose newest commit is version 1"):
            store.put(b"d", b"4", sync=True)
        assert storage.refused == 2  # the swap whose answer was lost, and its retry
        assert _commit_versions(root) == [1] and head_version(storage) == 1
    finally:
        store.close(flush=False)
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.check() == []
        assert reader.get(b"a") == b"1"
        assert [reader.get(k) for k in (b"b", b"c", b"d")] == [None] * 3


def test_a_writer_whose_root_is_restored_before_its_swap_writes_nothing_and_the_store_goes_on(
        tmp_path: Path) -> None:
    """The root is restored from an older copy between a writer's read of the head and its
    swap: the swap, conditional on the head the writer's cache applied, is refused, so nothing
    of that writer is left on the restored root (not even at its version's name, which the next
    writer takes). Writers and readers of the restored root go on from it."""
    root = tmp_path / "root"
    storage = RestoreBeforeSwap(root, fsync=False)
    # data files of their own: restore_root puts back the data directory of the backup
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET)
    try:
        write_past_a_backup(store, root, tmp_path / "backup")
        storage.backup = tmp_path / "backup"
        with pytest.raises(StorageBehindError):
            store.put(b"d", b"4", sync=True)  # never acknowledged
        assert storage.refused == 1
        assert _commit_versions(root) == [1] and head_version(storage) == 1
    finally:
        store.close(flush=False)
    # Life goes on on the restored root: a writer takes the versions the lost history had.
    with kvlog.open(root, cache_dir=tmp_path / "writer", **QUIET) as writer:
        for i in range(4):
            writer.put(f"w{i}".encode(), b"x", sync=True)
        assert writer.log.version == 5
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.check() == []
        assert reader.get(b"a") == b"1"
        assert [reader.get(k) for k in (b"b", b"c", b"d")] == [None] * 3
        assert [reader.get(f"w{i}".encode()) for i in range(4)] == [b"x"] * 4
    with kvlog.open(root, cache_dir=tmp_path / "fresh2", **QUIET) as again:
        again.put(b"e", b"5", sync=True)
        assert again.get(b"e") == b"5"


# -- Readers that start from a checkpoint decide like readers that replayed --------------------

def test_readers_from_a_checkpoint_and_from_replay_agree_after_a_stale_writers_swap_is_refused(
    tmp_path: Path,
) -> None:
    """Only the log prefix is restored (data files are immutable, uniquely named objects), and
    another writer writes and checkpoints on the restored root before a writer that kept its
    cache swaps. That swap is refused, so the root holds one history: a reader starting from
    the other writer's checkpoint and one that replayed every commit reach the same state, and
    neither sees the write its writer was told was not acknowledged."""
    root = tmp_path / "root"
    storage = RestoreBeforeSwap(root, fsync=False)
    storage.restored_dirs = ("log",)
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", **QUIET)
    try:
        write_past_a_backup(store, root, tmp_path / "backup")

        def another_writer_on_the_restored_root() -> None:
            with kvlog.open(root, cache_dir=tmp_path / "writer", checkpoint_interval=1, **QUIET) as w:
                w.put(b"w", b"x", sync=True)  # version 2, checkpointed

        storage.after_restore = another_writer_on_the_restored_root
        storage.backup = tmp_path / "backup"
        with pytest.raises(StorageBehindError):
            store.put(b"d", b"4", sync=True)  # not acknowledged
        assert storage.refused == 1
    finally:
        store.close(flush=False)
    assert [p.name for p in (root / "log").glob("*.checkpoint.json")] == [
        "00000000000000000002.checkpoint.json"], "the other writer checkpointed"
    assert _commit_versions(root) == [1, 2] and head_version(LocalStorage(root)) == 2

    def view(reader: kvlog.Store) -> tuple[object, ...]:
        return reader.log.version, reader.get(b"a"), reader.get(b"w"), reader.get(b"c"), reader.get(b"d")

    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as fresh:
        fresh_view = view(fresh)
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "writer") as replayed:
        replayed_view = view(replayed)
    assert fresh_view == replayed_view == (2, b"1", b"x", None, None)


# -- A writer behind the commit retention window ---------------------------------------------

class HookOnDataRead(LocalStorage):
    """Runs ``hook`` once, at the next read of a data file's range (a batch read)."""

    hook: Callable[[], None] | None = None

    def read_range(self, name: str, start: int, length: int) -> bytes:
        hook, self.hook = self.hook, None
        if hook is not None and name.startswith("data/"):
            hook()
        return super().read_range(name, start, length)


#: Commits are collected below the newest checkpoint as soon as one is written. Data files of
#: their own: commit GC keeps a commit whose inline file is live.
_COLLECTING = {**QUIET, "checkpoint_interval": 1, "commit_retention_ms": 0, "commit_inline_bytes": 0}


def _others_write_past_and_collect(root: Path, cache: Path) -> int:
    """Another writer writes three commits, each checkpointed, and collects the commits below
    the newest checkpoint: a cache behind them can no longer replay to the head. Returns the
    head's version."""
    with kvlog.open(root, cache_dir=cache, **_COLLECTING) as other:
        for key in (b"other", b"other2", b"other3"):
            time.sleep(0.01)  # each checkpoint's storage time is after the commits it covers
            other.put(key, b"x", sync=True)
        assert other.gc()["commits"] >= 2
        return other.log.version


def test_a_writer_behind_the_commit_retention_window_catches_up_beside_its_reads(
    tmp_path: Path,
) -> None:
    """A writer whose next commits were collected by commit GC (it idled past
    ``commit_retention_ms``) is refused at the swap (the head moved on) and catches up inside
    ``commit()`` without emptying the key index its reads use: a read made while the caught-up
    cache is being built (at its first batch read) still answers, from the cache as it was, and
    the write then lands at the head with everything before it."""
    root = tmp_path / "root"
    storage = HookOnDataRead(root, fsync=False)
    # Its reads never refresh on their own: the read in the hook reads the cache beside the
    # catch-up rather than catching up itself.
    settings = {**_COLLECTING, "refresh_interval_ms": 3_600_000}
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", **settings)
    try:
        store.put(b"held", b"value", sync=True)
        store.refresh()
        head = _others_write_past_and_collect(root, tmp_path / "other")
        assert not (root / commit_name(store.log.version + 1)).exists()
        during: list[object] = []
        storage.hook = lambda: during.append((store.log.version, store.get(b"held")))
        store.put(b"next", b"y", sync=True)
        assert during == [(1, b"value")]
        assert store.log.version == head + 1
        assert [store.get(k) for k in (b"held", b"other3", b"next")] == [b"value", b"x", b"y"]
    finally:
        store.close()
    with kvlog.open(root, cache_dir=tmp_path / "cache", **settings) as again:
        assert (again.get(b"held"), again.get(b"other2"), again.get(b"next")) == (b"value", b"x", b"y")
        assert again.check() == []


class HookOnRead(LocalStorage):
    """Runs ``hook`` once, at the next read of the object named ``name``."""

    name = ""
    hook: Callable[[], None] | None = None

    def read(self, name: str) -> bytes:
        if self.hook is not None and name == self.name:
            hook, self.hook = self.hook, None
            hook()
        return super().read(name)


def test_a_writer_whose_shared_cache_another_handle_caught_up_meanwhile_writes_at_the_head(
    tmp_path: Path,
) -> None:
    """Two handles share one cache, behind commit GC. The writer, refused at the swap, finds its
    next commit missing; before it catches up, the other handle catches the shared cache up
    from the checkpoint. The writer then has nothing left to load: the cache is on the root's
    history, at the head, and the write lands there."""
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "shared", **_COLLECTING) as first:
        first.put(b"held", b"value", sync=True)
    storage = HookOnRead(root, fsync=False)
    writer = kvlog.open(storage, cache_dir=tmp_path / "shared", **_COLLECTING)
    reader = kvlog.open(root, cache_dir=tmp_path / "shared", read_only=True, **_COLLECTING)
    try:
        head = _others_write_past_and_collect(root, tmp_path / "other")
        storage.name = commit_name(writer.log.version + 1)
        storage.hook = reader.refresh  # the shared cache catches up from the checkpoint here
        writer.put(b"next", b"y", sync=True)
        assert storage.hook is None, "the writer never read its missing next commit"
        assert writer.log.version == head + 1
        assert [writer.get(k) for k in (b"held", b"other3", b"next")] == [b"value", b"x", b"y"]
    finally:
        writer.close()
        reader.close()
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as fresh:
        assert [fresh.get(k) for k in (b"held", b"other3", b"next")] == [b"value", b"x", b"y"]
        assert fresh.check() == []


# -- A writer that could not learn what the head holds writes nothing on a restored root ----------

def test_a_writer_that_could_not_read_the_head_after_a_restore_never_writes_on_the_restored_root(
        tmp_path: Path) -> None:
    """The root is restored just before a writer swaps the head; the swap is refused, and the
    writer cannot read the head to learn why (a transient error): the write fails. Its cache
    still holds the commits the restore removed, and every later commit, checkpoint and GC of
    that cache meets the restored head (its swaps are refused, and the head is older than the
    cache): nothing of the lost history is written on the restored root, and a fresh opener
    reads it with every acknowledged write. Reopening the cache names the lost commits;
    accepting their loss rebuilds it from the restored root."""
    root = tmp_path / "root"
    storage = RestoreBeforeSwap(root, fsync=False)
    storage.head_reads_failing = 1
    # data files of their own: restore_root puts back the data directory of the backup
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", checkpoint_interval=2, commit_inline_bytes=0,
                       **QUIET)
    acknowledged: list[bytes] = []
    try:
        write_past_a_backup(store, root, tmp_path / "backup")
        storage.backup = tmp_path / "backup"
        with pytest.raises(StorageError, match="service unavailable"):
            store.put(b"d", b"4", sync=True)  # refused, and the head could not be read
        assert storage.refused == 1 and storage.failing == 0
        for i in range(6):
            key = f"e{i}".encode()
            try:
                store.put(key, b"5", sync=True)
                acknowledged.append(key)
            except StorageBehindError:
                pass
        assert acknowledged == [], "a write acknowledged on a root restored under its writer"
        with pytest.raises(StorageBehindError):
            store.gc()
    finally:
        store.close(flush=False)
    assert _commit_versions(root) == [1] and head_version(LocalStorage(root)) == 1
    names = sorted(p.name for p in (root / "log").iterdir())
    assert not any(n.endswith(".checkpoint.json") and int(n.split(".")[0]) > 1 for n in names), names
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


# -- The retry of a flush refused after a restore is no duplicate ---------------------------------

def _refused(storage: RestoreBeforeSwap, root: Path, cache: Path) -> None:
    """The swap is refused; the writer reads the head and finds it older than its cache."""


def _refused_answer_lost(storage: RestoreBeforeSwap, root: Path, cache: Path) -> None:
    """The swap's answer is lost; the writer reads the head to learn whether it landed."""
    storage.lose_answer = True


def _refused_head_unreadable(storage: RestoreBeforeSwap, root: Path, cache: Path) -> None:
    """The swap is refused and the head cannot be read once (a transient error)."""
    storage.head_reads_failing = 1


def _refused_others_wrote_on(storage: RestoreBeforeSwap, root: Path, cache: Path) -> None:
    """Another writer wrote on the restored root past the writer's version: the head is newer
    than the writer's cache, and the commits before it are of another history."""
    def others() -> None:
        with kvlog.open(root, cache_dir=cache, **QUIET) as other:
            for i in range(3):
                other.put(f"o{i}".encode(), b"x", sync=True)
    storage.after_restore = others


@pytest.mark.parametrize(("restoring", "first_error"), [
    pytest.param(_refused, StorageBehindError, id="refused"),
    pytest.param(_refused_answer_lost, StorageBehindError, id="answer-lost"),
    pytest.param(_refused_head_unreadable, StorageError, id="head-unreadable"),
    pytest.param(_refused_others_wrote_on, StorageBehindError, id="others-wrote-on"),
])
@pytest.mark.parametrize("retry", ["flush", "background"])
def test_the_retry_of_a_flush_refused_after_a_restore_acknowledges_nothing(
        tmp_path: Path, restoring: Callable[[RestoreBeforeSwap, Path, Path], None],
        first_error: type[Exception], retry: str) -> None:
    """A flush whose swap met a root restored under its writer fails, and its batches stay
    buffered for a retry, while the writer's cache still holds the commits the restore removed
    (producer sequences included). The retry must not take the batches for duplicates of a
    commit in that cache and acknowledge them: neither ``flush()`` nor the background flusher
    (whose success ``flush()`` would report) ever succeeds for them, and a fresh reader of the
    restored root holds every acknowledged write and not the lost one."""
    root = tmp_path / "root"
    storage = RestoreBeforeSwap(root, fsync=False)
    restoring(storage, root, tmp_path / "others")
    # data files of their own: restore_root puts back the data directory of the backup
    settings = {**QUIET, "flush_interval_ms": 20 if retry == "background" else 0, "commit_inline_bytes": 0}
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", **settings)
    try:
        write_past_a_backup(store, root, tmp_path / "backup")
        storage.backup = tmp_path / "backup"
        with pytest.raises(first_error):
            store.put(b"d", b"4", sync=True)  # refused: not acknowledged
        if retry == "background":
            time.sleep(0.3)  # the background flusher retries the failed flush meanwhile
        for _ in range(3):
            with pytest.raises(StorageBehindError):
                store.flush()
        assert storage.refused >= 1
        assert head_version(LocalStorage(root)) == (4 if restoring is _refused_others_wrote_on else 1)
        assert _commit_versions(root) == list(range(1, head_version(LocalStorage(root)) + 1))
    finally:
        store.close(flush=False)
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.check() == []
        assert reader.get(b"a") == b"1"
        assert [reader.get(k) for k in (b"b", b"c", b"d")] == [None] * 3
        if restoring is _refused_others_wrote_on:
            assert reader.get(b"o2") == b"x"


# -- Writers that kept their caches through a restore --------------------------------------------

def test_writers_that_kept_their_caches_through_a_restore_never_write_on_the_restored_root(
        tmp_path: Path) -> None:
    """Two writers keep their caches through a restore: A applied versions up to x, B up to
    x + 1, both past the restored head. A's swap is refused and A cannot read the head to learn
    why (a transient error); B's is refused. A third writer, on a fresh cache, then writes on
    the restored root past both versions: the commits A and B applied at those versions are
    not the root's. Neither A nor B acknowledges anything on it (no commit, no checkpoint a
    fresh reader would start from, no retry of A's failed flush), and a fresh reader holds the
    restored history and the third writer's writes."""
    root = tmp_path / "root"
    a_storage = HookBeforeSwap(root, fsync=False)
    b_storage = HookBeforeSwap(root, fsync=False)
    # data files of their own: restore_root puts back the data directory of the backup
    a = kvlog.open(a_storage, cache_dir=tmp_path / "a", checkpoint_interval=2, commit_inline_bytes=0, **QUIET)
    b = kvlog.open(b_storage, cache_dir=tmp_path / "b", checkpoint_interval=2, commit_inline_bytes=0, **QUIET)
    acknowledged: list[bytes] = []
    try:
        a.put(b"a", b"1", sync=True)
        copy_root(root, tmp_path / "backup")
        a.put(b"b", b"2", sync=True)  # A's own commit at version x
        b.put(b"c", b"3", sync=True)  # B's own commit at x + 1
        x = a.log.version
        assert b.log.version == x + 1
        restore_root(root, tmp_path / "backup")
        a_storage.failing = 1
        with pytest.raises(StorageError, match="service unavailable"):
            a.put(b"d", b"4", sync=True)  # refused, and the head could not be read
        with pytest.raises(StorageBehindError):
            b.put(b"e", b"5", sync=True)  # refused: the head is older than B's cache
        with kvlog.open(root, cache_dir=tmp_path / "c", **QUIET) as c:
            for key in (b"c1", b"c2", b"c3"):
                c.put(key, b"7", sync=True)
            assert c.log.version == x + 2
        for key in (b"f", b"g", b"h"):
            for writer in (a, b):
                try:
                    writer.put(key, b"6", sync=True)
                    acknowledged.append(key)
                except StorageBehindError:
                    pass
        try:
            a.flush()
            acknowledged.append(b"d")
        except StorageBehindError:
            pass
        assert acknowledged == [], "a write acknowledged on a root restored under its writer"
        assert a_storage.refused >= 1 and b_storage.refused >= 1
    finally:
        a.close(flush=False)
        b.close(flush=False)
    assert _commit_versions(root) == list(range(1, x + 3))
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.check() == []
        assert reader.get(b"a") == b"1"
        assert [reader.get(k) for k in (b"c1", b"c2", b"c3")] == [b"7"] * 3
        assert [reader.get(k) for k in (b"b", b"c", b"d", b"e", b"f", b"g", b"h")] == [None] * 7
