"""GC never takes a file a commit makes live, however slow the writer of that commit was.

A data file is written first and made live by a commit later. Were orphan GC to delete any
unreferenced file older than ``file_delete_delay_ms``, a compaction job (or a flush) whose
commit landed after that would lose every key of its file for good. GC condemns orphans in a
``gc`` commit before deleting them, and a commit that adds a condemned file is refused: the
flush writes its file again, the compaction job is discarded.

"A writer slower than every timeout" is made deterministic here: just before the writer's
commit goes out, its files are aged by two hours (their mtimes set back) and another handle
runs GC, exactly what happens when a job stalls that long.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from root_surgery import QUIET, age_every_data_file, is_commit

import kvlog
from kvlog.clock import ManualClock
from kvlog.errors import ConfigError, StorageError
from kvlog.storage import LocalStorage
from kvlog.storage.base import BytesLike, ObjectInfo


class InterleavingStorage(LocalStorage):
    """A real local storage that runs ``hook`` once, just before the next commit is written."""

    hook: Callable[[], None] | None = None

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        hook, self.hook = self.hook, None
        if hook is not None and name.startswith("log/") and name.endswith(".json"):
            hook()
        super().put_if_absent(name, data)




def _gc_by_another_writer(root: Path, cache: Path) -> Callable[[], None]:
    def run() -> None:
        age_every_data_file(root)
        with kvlog.open(root, cache_dir=cache, **QUIET) as other:
            other.gc()
    return run


def test_a_compaction_slower_than_the_delete_delay_loses_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    storage = InterleavingStorage(root, fsync=False)
    expected: dict[bytes, bytes] = {}
    with kvlog.open(storage, cache_dir=tmp_path / "cache", **QUIET) as store:
        for round_ in range(3):
            for i in range(200):
                key, value = f"k{i}".encode(), f"v{round_}-{i}".encode()
                store.put(key, value)
                expected[key] = value
            store.flush()
        storage.hook = _gc_by_another_writer(root, tmp_path / "other-cache")
        report = store.compact(force=True)
        assert report.refused  # its outputs were collected first: the job was discarded whole
        assert store.check() == []
        assert dict(store.scan()) == expected
        again = store.compact(force=True)  # the next job runs as usual
        assert again.rounds == 1 and not again.refused
        assert store.check() == []
        assert dict(store.scan()) == expected
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert dict(reader.scan()) == expected
        assert reader.check() == []


def test_a_flush_slower_than_the_delete_delay_loses_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    storage = InterleavingStorage(root, fsync=False)
    with kvlog.open(storage, cache_dir=tmp_path / "cache", **QUIET) as store:
        store.put(b"before", b"1", sync=True)
        storage.hook = _gc_by_another_writer(root, tmp_path / "other-cache")
        store.put(b"slow", b"acknowledged", sync=True)  # its first file is collected meanwhile
        assert store.check() == []
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        assert reader.get(b"slow") == b"acknowledged"
        assert reader.get(b"before") == b"1"
        assert reader.check() == []


def test_gc_keeps_a_file_whose_commit_landed_first(tmp_path: Path) -> None:
    """The other order of the race: the commit lands, then GC (with a stale view) condemns
    nothing live."""
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET) as store:
        store.put(b"k", b"v", sync=True)
        stale = kvlog.open(root, cache_dir=tmp_path / "stale", **QUIET)
        try:
            store.put(b"k2", b"v2", sync=True)
            age_every_data_file(root)
            stale.gc()  # it catches up first; nothing live is an orphan
        finally:
            stale.close()
        assert store.check() == []
        assert store.get(b"k2") == b"v2"


@pytest.mark.parametrize("delay", [0, 1, 999])
def test_a_delete_delay_below_the_minimum_is_refused(tmp_path: Path, delay: int) -> None:
    with pytest.raises(ConfigError, match="file_delete_delay_ms"):
        kvlog.open(tmp_path / "root", file_delete_delay_ms=delay)
    assert not (tmp_path / "root").exists()


def test_the_background_gc_with_the_smallest_delay_takes_no_inflight_file(tmp_path: Path) -> None:
    """With the smallest delay and GC running beside many flushes, every write is kept."""
    clock = ManualClock(time.time_ns() // 1_000_000)
    root = tmp_path / "root"
    with kvlog.open(root, clock=clock, file_delete_delay_ms=1_000, **QUIET) as store:
        for i in range(50):
            store.put(f"k{i}".encode(), b"v", sync=True)
            clock.advance(10_000)  # every file is "old" by the clock at once
            store.gc()
        assert store.check() == []
        assert len(store) == 50


class _NewestFirstFailingSecondCommitDelete(LocalStorage):
    """A real local storage listing names newest first (a directory's order is arbitrary),
    whose second deletion of a commit fails: commit GC cut short halfway."""

    commit_deletes = 0

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return sorted(super().list(prefix), key=lambda info: info.name, reverse=True)

    def delete(self, name: str) -> None:
        if is_commit(name):
            self.commit_deletes += 1
            if self.commit_deletes == 2:
                raise StorageError(f"injected: deleting {name} failed")
        super().delete(name)


def test_commit_gc_cut_short_leaves_the_remaining_commits_contiguous(tmp_path: Path) -> None:
    """Commit GC deletes oldest first, so whenever it stops the commits left have no gap: a
    cache whose head storage still holds then never stops replaying below the checkpoint and
    takes a freed version for its next commit."""
    root = tmp_path / "root"
    # data files of their own: commit GC keeps a commit whose inline file is live
    settings = dict(QUIET, checkpoint_interval=1, commit_retention_ms=0, commit_inline_bytes=0)
    with kvlog.open(_NewestFirstFailingSecondCommitDelete(root, fsync=False), cache_dir=tmp_path / "c",
                    **settings) as store:
        for i in range(5):
            store.put(f"k{i}".encode(), b"v", sync=True)
        time.sleep(0.01)  # the newest checkpoint's storage time is after the commits it covers
        store.log.write_checkpoint()
        time.sleep(0.01)
        with pytest.raises(StorageError):
            store.gc()
    left = sorted(int(p.name.split(".")[0]) for p in (root / "log").iterdir() if is_commit(f"log/{p.name}"))
    assert left == list(range(left[0], left[-1] + 1)) and left[0] > 1
    with kvlog.open(root, cache_dir=tmp_path / "c", **settings) as again:
        assert again.gc()["commits"] > 0
        assert [again.get(f"k{i}".encode()) for i in range(5)] == [b"v"] * 5
        assert again.check() == []
