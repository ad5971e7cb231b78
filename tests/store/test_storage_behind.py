"""A writer whose cache is ahead of storage never acknowledges a write; check() sees damage.

A commit is live once its writer swapped the head (``log/head.json``), conditional on the
version of the head its cache applied. A storage root restored from an older copy while a
writer kept its cache holds an older head: the writer's swap is refused, and applying the
head it finds the head older than its cache, or another commit at a version it applied (the
cache records the newest commit it applied: version, id, checksum; every commit names the
one before it). It raises :class:`~kvlog.StorageBehindError` and acknowledges nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from root_surgery import QUIET, copy_root, restore_root, write_past_a_backup

import kvlog
from kvlog.clock import ManualClock
from kvlog.errors import CorruptDataError, StorageBehindError
from kvlog.log.naming import commit_name
from kvlog.storage import LocalStorage, SwapConflict
from kvlog.storage.base import BytesLike
from tests.commits import HEAD_NAME, HookBeforeSwap, head_version


def test_a_writer_refuses_to_write_after_its_root_was_restored_from_an_older_copy(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # data files of their own: restore_root puts back the data directory of the backup
    store = kvlog.open(root, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET)
    try:
        write_past_a_backup(store, root, tmp_path / "backup")
        restore_root(root, tmp_path / "backup")
        with pytest.raises(StorageBehindError):
            store.put(b"d", b"4", sync=True)  # would land after a gap: never acknowledged
        findings = store.check()
        assert any("missing from storage" in f for f in findings), findings
    finally:
        store.close(flush=False)
    # Reopening names the lost commits (b's and c's) and changes nothing, until the loss is
    # accepted: then the cache is rebuilt from storage, the restored state, and writes work again.
    with pytest.raises(StorageBehindError, match=r"commits log/0+2\.json to log/0+3\.json, which the cache applied, are missing"):
        kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET)
    with kvlog.open(root, cache_dir=tmp_path / "cache", on_storage_behind="rebuild", **QUIET) as again:
        assert again.get(b"a") == b"1" and again.get(b"b") is None
        again.put(b"e", b"5", sync=True)
        assert again.check() == []
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.get(b"e") == b"5" and reader.get(b"a") == b"1"


@pytest.mark.parametrize(("others", "names"), [
    pytest.param(1, r"commit log/0+2\.json in \S+ differs from the commit the cache applied", id="head-at-the-cache"),
    pytest.param(3, r"log/0+3\.json: follows commit \w+, but this cache applied commit \w+ at version 2: "
                    "the storage root holds another history", id="head-past-the-cache"),
])
def test_a_writer_detects_a_history_rewritten_after_a_restore(tmp_path: Path, others: int, names: str) -> None:
    """Restored, then another writer took the same version numbers: the first writer's cache
    holds another history. Its swap is refused, and it refuses to apply or write on that
    history, whether the head is another commit at the cache's version or past it (then the
    first commit after the cache names another commit before it)."""
    root = tmp_path / "root"
    # data files of their own: restore_root puts back the data directory of the backup
    store = kvlog.open(root, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET)
    try:
        store.put(b"a", b"1", sync=True)
        copy_root(root, tmp_path / "backup")
        store.put(b"b", b"2", sync=True)
        restore_root(root, tmp_path / "backup")
        with kvlog.open(root, cache_dir=tmp_path / "other", **QUIET) as other:
            for i in range(others):
                other.put(f"o{i}".encode(), b"x", sync=True)
        assert head_version(LocalStorage(root)) == 1 + others
        with pytest.raises(StorageBehindError, match=names):
            store.put(b"c", b"3", sync=True)
    finally:
        store.close(flush=False)
    with pytest.raises(StorageBehindError, match=names):
        kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET)
    with kvlog.open(root, cache_dir=tmp_path / "cache", on_storage_behind="rebuild", **QUIET) as again:
        assert again.get(f"o{others - 1}".encode()) == b"x" and again.get(b"b") is None
        assert again.get(b"c") is None
        assert again.check() == []


def test_check_names_a_deleted_newest_commit(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET) as store:
        store.put(b"k", b"v", sync=True)
        newest = max((root / "log").glob("*[0-9].json"))
        newest.unlink()
        findings = store.check()
        assert any(newest.name in f and "missing" in f for f in findings), findings


@pytest.mark.parametrize("damaged", ["copy", "head"])
def test_check_names_a_truncated_newest_commit(tmp_path: Path, damaged: str) -> None:
    """The newest commit is held twice: by the head and at its own name (on a local root the
    two names are links to one file, so damage in place hits both). Either one truncated is a
    finding naming it."""
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET) as store:
        store.put(b"k", b"v", sync=True)
        newest = max((root / "log").glob("*[0-9].json"))
        path = newest if damaged == "copy" else root / HEAD_NAME
        data = path.read_bytes()
        path.unlink()  # a file of its own: the other name keeps the commit whole
        path.write_bytes(data[:-7])
        findings = store.check()
        assert any(path.name in f for f in findings), findings


def test_check_names_a_data_file_with_a_flipped_byte_in_its_footer(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # a data file of its own: the test damages it
    with kvlog.open(root, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET) as store:
        for i in range(100):
            store.put(f"k{i}".encode(), b"v" * 50)
        store.flush()
        assert store.check() == []
        (path,) = (root / "data").rglob("*.arrow")
        data = bytearray(path.read_bytes())
        data[-12] ^= 0x01  # inside the Arrow footer, which no batch read verifies
        path.write_bytes(bytes(data))
        findings = store.check()
        assert any(path.name in f and "checksum" in f for f in findings), findings


class _RestoreOnCommit(LocalStorage):
    """A real local storage that restores the root from ``backup`` just before the next swap of
    the head: the restore lands between the writer's read of the head and its swap. Counts the
    swaps refused."""

    backup: Path | None = None
    refused = 0

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        backup, self.backup = self.backup, None
        if backup is not None:
            restore_root(self.root, backup)
        try:
            return super().swap(name, data, expected, copy_to)
        except SwapConflict:
            self.refused += 1
            raise


def test_a_commit_after_a_restore_is_refused_at_the_swap_not_acknowledged(tmp_path: Path) -> None:
    """The swap is conditional on the head the writer's cache applied, which the restore
    replaced by an older one: it is refused, nothing is written at the commit's name, and the
    writer, finding the head older than its cache, acknowledges nothing. The next writer on
    the restored root takes the version after the restored head."""
    root = tmp_path / "root"
    storage = _RestoreOnCommit(root, fsync=False)
    # data files of their own: restore_root puts back the data directory of the backup
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET)
    try:
        write_past_a_backup(store, root, tmp_path / "backup")
        storage.backup = tmp_path / "backup"
        with pytest.raises(StorageBehindError, match=r"commits log/0+2\.json to log/0+3\.json"):
            store.put(b"d", b"4", sync=True)  # refused: never acknowledged
        assert storage.refused == 1
        assert head_version(storage) == 1 and not (root / commit_name(4)).exists()
    finally:
        store.close(flush=False)
    with kvlog.open(root, cache_dir=tmp_path / "fresh", **QUIET) as fresh:
        assert fresh.get(b"a") == b"1" and fresh.get(b"d") is None
        fresh.put(b"e", b"5", sync=True)
        assert fresh.log.version == 2
        assert fresh.check() == []


def test_a_checkpoint_without_its_commit_is_passed_over(tmp_path: Path) -> None:
    """A checkpoint written by a cache that was ahead of a restored root names a commit the
    root does not hold: openers use an older checkpoint (or the log) instead."""
    root = tmp_path / "root"
    settings = {**QUIET, "checkpoint_interval": 3}
    with kvlog.open(root, cache_dir=tmp_path / "cache", **settings) as store:
        for i in range(4):
            store.put(f"k{i}".encode(), b"v", sync=True)
    checkpoints = sorted((root / "log").glob("*.checkpoint.json"))
    assert checkpoints
    stray = root / "log" / "00000000000000000999.checkpoint.json"
    stray.write_bytes(checkpoints[-1].read_bytes())
    with kvlog.open(root, cache_dir=tmp_path / "fresh", **settings) as reader:
        assert [reader.get(f"k{i}".encode()) for i in range(4)] == [b"v"] * 4
        assert reader.check() == []


def test_a_damaged_checkpoint_costs_replay_time_not_the_store(tmp_path: Path) -> None:
    root = tmp_path / "root"
    settings = {**QUIET, "checkpoint_interval": 3}
    with kvlog.open(root, cache_dir=tmp_path / "cache", **settings) as store:
        for i in range(7):
            store.put(f"k{i}".encode(), b"v", sync=True)
    newest = sorted((root / "log").glob("*.checkpoint.json"))[-1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x20
    newest.write_bytes(bytes(data))
    with kvlog.open(root, cache_dir=tmp_path / "fresh", **settings) as reader:
        assert [reader.get(f"k{i}".encode()) for i in range(7)] == [b"v"] * 7


def test_a_damaged_checkpoint_over_commits_gc_collected_is_refused_not_rebuilt_back(tmp_path: Path) -> None:
    """Commit GC collects the commits below the newest checkpoint but keeps the one whose inline
    file is still live: the history below the checkpoint has gaps by design. A damaged
    checkpoint there cannot be replaced by replaying the commits, and a rebuild must not take
    such a gap for a restore without the head: it raises, and the head stays where it is."""
    root = tmp_path / "root"
    settings = {**QUIET, "checkpoint_interval": 3, "commit_retention_ms": 0}
    with kvlog.open(root, cache_dir=tmp_path / "cache", **settings) as store:
        store.put(b"a", b"inline", sync=True)  # commit 1 carries its record: kept while live
    with kvlog.open(root, cache_dir=tmp_path / "cache", **settings, commit_inline_bytes=0) as store:
        for i in range(6):
            store.put(f"k{i}".encode(), b"v", sync=True)  # commits 2-7 name data files
        store.gc()
    names = sorted(p.name for p in (root / "log").iterdir())
    assert commit_name(1).removeprefix("log/") in names and commit_name(2).removeprefix("log/") not in names
    newest = sorted((root / "log").glob("*.checkpoint.json"))[-1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x20
    newest.write_bytes(bytes(data))
    head = (root / "log" / "head.json").read_bytes()
    with pytest.raises(CorruptDataError, match=newest.name):
        kvlog.open(root, cache_dir=tmp_path / "fresh", on_storage_behind="rebuild", **settings)
    assert (root / "log" / "head.json").read_bytes() == head
    with kvlog.open(root, cache_dir=tmp_path / "cache", **settings) as store:  # a cache needs no checkpoint
        assert store.get(b"a") == b"inline" and store.get(b"k5") == b"v"


def _compacted_after_a_backup(root: Path, backup: Path, cache: Path, clock: ManualClock) -> kvlog.Store:
    """A store of 20 keys in data files of their own (the tests restore and count them), its
    root copied to ``backup``, then compacted: every file live in the backup is replaced."""
    store = kvlog.open(root, cache_dir=cache, clock=clock, file_delete_delay_ms=1_000,
                       commit_inline_bytes=0, **QUIET)
    for i in range(20):
        store.put(f"k{i}".encode(), b"v", sync=True)
    copy_root(root, backup)
    store.compact(force=True)
    return store


def test_gc_from_a_cache_ahead_of_a_restored_root_deletes_nothing(tmp_path: Path) -> None:
    """The cache knows files that a compaction replaced after the backup: once the root is
    restored they are live again, and GC from that cache must not delete them."""
    root, clock = tmp_path / "root", ManualClock(time.time_ns() // 1_000_000)
    store = _compacted_after_a_backup(root, tmp_path / "backup", tmp_path / "cache", clock)
    try:
        restore_root(root, tmp_path / "backup")
        clock.advance(10_000)
        before = sorted(p.name for p in (root / "data").rglob("*.arrow"))
        with pytest.raises(StorageBehindError):
            store.gc()
        assert sorted(p.name for p in (root / "data").rglob("*.arrow")) == before
    finally:
        store.close(flush=False)
    with kvlog.open(root, cache_dir=tmp_path / "fresh", **QUIET) as reader:
        assert [reader.get(f"k{i}".encode()) for i in range(20)] == [b"v"] * 20
        assert reader.check() == []


class RestoreBeforeFirstDelete(LocalStorage):
    """A local root put back from ``backup`` just before the first delete this handle makes:
    a restore landing between garbage collection's refresh and its deletions."""

    def __init__(self, root: Path, backup: Path) -> None:
        super().__init__(root, fsync=False)
        self.root_dir = root
        self.backup: Path | None = backup
        self.deleted: list[str] = []

    def delete(self, name: str) -> None:
        if self.backup is not None:
            restore_root(self.root_dir, self.backup)
            self.backup = None
        self.deleted.append(name)
        super().delete(name)


def test_gc_deleting_while_the_root_is_put_back_says_so_and_the_copy_put_back_again_opens(
        tmp_path: Path) -> None:
    """Nothing makes a delete conditional on the head, so a restore between the refresh that
    decided the deletions and the deletions loses objects of the copy. Garbage collection
    reads the head again after deleting and raises, naming the repair; the copy put back again
    (writers stopped) opens with every key."""
    root, backup = tmp_path / "root", tmp_path / "backup"
    clock = ManualClock(time.time_ns() // 1_000_000)
    _compacted_after_a_backup(root, backup, tmp_path / "cache", clock).close()
    clock.advance(10_000)
    storage = RestoreBeforeFirstDelete(root, backup)
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", clock=clock, **QUIET)
    try:
        with pytest.raises(StorageBehindError, match="deleting .* while the root was put back"):
            store.gc()
    finally:
        store.close(flush=False)
    assert storage.deleted and all(name.startswith("data/") for name in storage.deleted)
    restore_root(root, backup)
    with kvlog.open(root, cache_dir=tmp_path / "cache", on_storage_behind="rebuild", **QUIET) as reader:
        assert [reader.get(f"k{i}".encode()) for i in range(20)] == [b"v"] * 20
        assert reader.check() == []


def test_a_stalled_writer_whose_version_commit_gc_freed_is_refused_and_writes_at_the_head(
        tmp_path: Path) -> None:
    """Another writer takes the stalled writer's version and more, checkpoints, and collects
    the commits below the checkpoint (retention 0), freeing the name the stalled writer's
    commit would have had. The stalled swap is refused (the head moved on): the name stays
    free, behind a checkpoint every reader starts from. The writer catches up from the
    checkpoint and writes at the head, once."""
    root = tmp_path / "root"
    storage = HookBeforeSwap(root, fsync=False)
    # data files of their own: commit GC keeps a commit whose inline file is live
    settings = dict(QUIET, checkpoint_interval=2, commit_retention_ms=0, file_delete_delay_ms=1_000,
                    commit_inline_bytes=0)
    store = kvlog.open(storage, cache_dir=tmp_path / "cache", **settings)

    def others_run_ahead() -> None:
        with kvlog.open(root, cache_dir=tmp_path / "other", **settings) as other:
            for i in range(4):
                other.put(f"o{i}".encode(), b"x", sync=True)
            time.sleep(0.01)  # the checkpoint's storage time is after the commits it covers
            other.log.write_checkpoint()
            time.sleep(0.01)
            assert other.gc()["commits"] > 0

    try:
        store.put(b"a", b"1", sync=True)
        stalled_at = store.log.version + 1
        storage.hook = others_run_ahead
        store.put(b"late", b"2", sync=True)
        assert storage.refused >= 1
        assert store.log.version >= stalled_at + 4  # written at the head, after the four others
        assert store.log.version == head_version(storage)
        assert not (root / commit_name(stalled_at)).exists()  # the freed name stays free
    finally:
        store.close()
    with kvlog.open(root, cache_dir=tmp_path / "fresh", **QUIET) as fresh:
        assert fresh.get(b"a") == b"1" and fresh.get(b"o3") == b"x" and fresh.get(b"late") == b"2"
        assert sum(1 for p in range(fresh.log.partitions) for r in fresh.log.read(p) if r.key == b"late") == 1
        assert fresh.check() == []


def test_an_opener_whose_replay_stops_at_a_collected_commit_catches_up_from_the_checkpoint(
    tmp_path: Path,
) -> None:
    """A restore racing commit GC puts old commits back after GC collected them while GC goes
    on to collect the next: storage holds the commit a closed cache applied and the one after,
    then a gap, then later commits, a checkpoint and the head. Reopening that cache with a
    producer_id (registered at open) replays up to the gap; it catches up from the checkpoint
    there and registers the producer at the head, so the freed version stays free and every
    reader, from the checkpoint or replaying, reads the same changelog."""
    root = tmp_path / "root"
    # data files of their own: commit GC keeps a commit whose inline file is live
    settings = dict(QUIET, checkpoint_interval=1, commit_retention_ms=0, commit_inline_bytes=0)
    with kvlog.open(root, cache_dir=tmp_path / "stale", **settings) as stale:
        stale.put(b"s", b"1", sync=True)
        head = stale.log.version
    with kvlog.open(root, cache_dir=tmp_path / "other", producer_id=5, **settings) as other:
        # Opening registered the producer at version head + 1; the puts come after it.
        old = {v: (root / commit_name(v)).read_bytes() for v in range(1, head + 2)}
        for i in range(4):
            other.put(f"o{i}".encode(), b"x", sync=True)
        time.sleep(0.01)  # the newest checkpoint's storage time is after the commits it covers
        other.log.write_checkpoint()
        time.sleep(0.01)
        assert other.gc()["commits"] > head + 2
        top = other.log.version
    for v, data in old.items():  # the restore puts back the commits up to head + 1
        (root / commit_name(v)).write_bytes(data)
    assert not (root / commit_name(head + 2)).exists()
    with kvlog.open(root, cache_dir=tmp_path / "stale", producer_id=6, **settings) as again:
        assert again.log.version >= top
        assert [again.get(f"o{i}".encode()) for i in range(4)] == [b"x"] * 4
        again.put(b"after", b"2", sync=True)
        changes = [(r.partition, r.offset, r.key) for r in again.changes()]
        assert again.check() == []
    assert not (root / commit_name(head + 2)).exists()  # the freed version stays free
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh", **settings) as fresh:
        assert [fresh.get(k) for k in (b"s", b"o0", b"o3", b"after")] == [b"1", b"x", b"x", b"2"]
        assert [(r.partition, r.offset, r.key) for r in fresh.changes()] == changes
