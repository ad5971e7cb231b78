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
from typing import Any

import pytest
from root_surgery import QUIET, age_every_data_file

import kvlog
from kvlog.clock import ManualClock
from kvlog.errors import ConfigError, StorageError
from kvlog.log.head import HEAD_NAME
from kvlog.log.naming import parse_log_name
from kvlog.storage import LocalStorage
from kvlog.storage.base import BytesLike


class InterleavingStorage(LocalStorage):
    """A real local storage that runs ``hook`` once, just before the next commit is published
    (the swap of the head)."""

    hook: Callable[[], None] | None = None

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        hook, self.hook = self.hook, None
        if hook is not None and name == HEAD_NAME:
            hook()
        return super().swap(name, data, expected, copy_to)


def _gc_by_another_writer(root: Path, cache: Path, collected: list[dict[str, int]]) -> Callable[[], None]:
    """Age every data file and run GC from another handle; what it deleted goes to ``collected``."""
    def run() -> None:
        age_every_data_file(root)
        with kvlog.open(root, cache_dir=cache, **QUIET) as other:
            collected.append(other.gc())
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
        collected: list[dict[str, int]] = []
        storage.hook = _gc_by_another_writer(root, tmp_path / "other-cache", collected)
        report = store.compact(force=True)
        assert collected[0]["orphans"] > 0
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
    # data files of their own: a flush small enough to travel inside its commit has no file to lose
    with kvlog.open(storage, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET) as store:
        store.put(b"before", b"1", sync=True)
        collected: list[dict[str, int]] = []
        storage.hook = _gc_by_another_writer(root, tmp_path / "other-cache", collected)
        store.put(b"slow", b"acknowledged", sync=True)  # its first file is collected meanwhile
        assert collected[0]["orphans"] == 1
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


class _FailingCommitDelete(LocalStorage):
    """A real local storage whose ``fail_at``-th deletion of a commit fails: commit GC cut short."""

    def __init__(self, root: Path, fail_at: int, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.fail_at = fail_at
        self.commit_deletes = 0

    def delete(self, name: str) -> None:
        parsed = parse_log_name(name)
        if parsed is not None and parsed[1] == "commit":
            self.commit_deletes += 1
            if self.commit_deletes == self.fail_at:
                raise StorageError(f"injected: deleting {name} failed")
        super().delete(name)


def _commits_left(root: Path) -> list[int]:
    """The versions whose commits ``root`` holds (not the head object)."""
    parsed = (parse_log_name(f"log/{p.name}") for p in (root / "log").iterdir())
    return sorted(p[0] for p in parsed if p is not None and p[1] == "commit")


@pytest.mark.parametrize("fail_at", [1, 2, 4])
def test_commit_gc_cut_short_leaves_a_store_every_cache_goes_on_from(tmp_path: Path, fail_at: int) -> None:
    """Commit GC stops at a failed deletion with part of the commits below the newest
    checkpoint gone. Caches left at every version below it go on: one whose next commit
    is gone catches up from the checkpoint, one whose next commit is left replays it (its
    ``prev`` names the commit the cache applied, collected or not); each one's write lands at
    the head, never in a version GC freed; GC run again collects the rest; a fresh reader
    holds every write."""
    root = tmp_path / "root"
    # data files of their own: commit GC keeps a commit whose inline file is live
    settings = dict(QUIET, checkpoint_interval=1000, commit_retention_ms=0, commit_inline_bytes=0)
    storage = _FailingCommitDelete(root, fail_at, fsync=False)
    stale: list[kvlog.Store] = []
    try:
        with kvlog.open(storage, cache_dir=tmp_path / "c", **settings) as store:
            for i in range(5):
                store.put(f"k{i}".encode(), b"v", sync=True)
                if i < 3:  # caches left at versions 1, 2 and 3
                    stale.append(kvlog.open(root, cache_dir=tmp_path / f"stale{i}", **settings))
            assert [s.log.version for s in stale] == [1, 2, 3]
            time.sleep(0.01)  # the newest checkpoint's storage time is after the commits it covers
            store.log.write_checkpoint()
            time.sleep(0.01)
            with pytest.raises(StorageError):
                store.gc()
            assert _commits_left(root) == list(range(fail_at, 6))  # cut short
            for n, s in enumerate(stale):
                s.put(f"stale{n}".encode(), b"w", sync=True)
            assert _commits_left(root) == [*range(fail_at, 6), 6, 7, 8]  # at the head only
            assert store.gc()["commits"] > 0
            assert _commits_left(root) == [5, 6, 7, 8]
        written = [f"k{i}".encode() for i in range(5)] + [f"stale{n}".encode() for n in range(3)]
        for s in stale:
            assert [s.get(k) is not None for k in written] == [True] * 8
            assert s.check() == []
        with kvlog.open(root, cache_dir=tmp_path / "fresh", **settings) as again:
            assert [again.get(k) is not None for k in written] == [True] * 8
            assert again.check() == []
    finally:
        for s in stale:
            s.close()


class CompactedUnderTheFirstDataRead(LocalStorage):
    """A real local storage that runs ``hook`` once, just before its first read of a data file."""

    hook: Callable[[], None] | None = None

    def read_range(self, name: str, start: int, length: int) -> bytes:
        hook, self.hook = (self.hook, None) if name.startswith("data/") else (None, self.hook)
        if hook is not None:
            hook()
        return super().read_range(name, start, length)


def _thirty_files_and_a_clock() -> tuple[ManualClock, dict[str, Any]]:
    """A clock the test moves past the delete delay, and settings that give each flush a data file."""
    clock = ManualClock(time.time_ns() // 1_000_000)
    return clock, dict(QUIET, clock=clock, file_delete_delay_ms=1_000, commit_inline_bytes=0)


def _write_thirty(store: kvlog.Store) -> None:
    for i in range(30):
        store.put(f"k{i}".encode(), f"v{i}".encode(), sync=True)


def test_an_open_whose_rebuild_outlasts_the_delete_delay_starts_again_at_the_new_head(tmp_path: Path) -> None:
    """A fresh cache rebuilds its key index from the files live at the version it caught up to.
    Another process compacts them all and its GC deletes them (their delay past) while the
    rebuild reads the first one: the open applies the newer commits and rebuilds there."""
    root, clock, settings = tmp_path / "root", *_thirty_files_and_a_clock()
    with kvlog.open(root, cache_dir=tmp_path / "writer", **settings) as writer:
        _write_thirty(writer)
        collected: list[dict[str, int]] = []

        def compact_and_collect() -> None:
            writer.compact(force=True)
            clock.advance(10_000)
            collected.append(writer.gc())

        storage = CompactedUnderTheFirstDataRead(root, fsync=False)
        storage.hook = compact_and_collect
        with kvlog.open(storage, cache_dir=tmp_path / "fresh", **settings) as opener:
            assert collected[0]["replaced"] == 30  # the file being read among them
            assert opener.log.version == writer.log.version
            assert dict(opener.scan()) == {f"k{i}".encode(): f"v{i}".encode() for i in range(30)}
            assert opener.check() == []


def test_an_open_overtaken_again_and_again_says_so_and_a_file_lost_by_hand_is_still_missing(
        tmp_path: Path) -> None:
    """Another process compacts and collects under every rebuild attempt: the open ends with a
    StorageError saying so (no file was lost). A live file deleted by hand is reported missing,
    even while another writer keeps committing."""
    from kvlog.errors import CorruptDataError, StorageError

    root, clock, settings = tmp_path / "root", *_thirty_files_and_a_clock()
    with kvlog.open(root, cache_dir=tmp_path / "writer", **settings) as writer:
        _write_thirty(writer)

        def compact_and_collect() -> None:
            writer.put(b"more", b"x", sync=True)
            writer.compact(force=True)
            clock.advance(10_000)
            writer.gc()

        class EveryTime(CompactedUnderTheFirstDataRead):
            def read_range(self, name: str, start: int, length: int) -> bytes:
                if name.startswith("data/"):
                    compact_and_collect()
                return LocalStorage.read_range(self, name, start, length)

        with pytest.raises(StorageError, match="overtaken 16 times"):
            kvlog.open(EveryTime(root, fsync=False), cache_dir=tmp_path / "overtaken", **settings).close()

        live = sorted((root / "data").rglob("*.arrow"))
        assert live
        live[0].unlink()

        class WriterKeepsCommitting(LocalStorage):
            def read_range(self, name: str, start: int, length: int) -> bytes:
                writer.put(b"busy", b"x", sync=True)
                return super().read_range(name, start, length)

        with pytest.raises(CorruptDataError, match="data file is missing"):
            kvlog.open(WriterKeepsCommitting(root, fsync=False), cache_dir=tmp_path / "lost", **settings).close()
