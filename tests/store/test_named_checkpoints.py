"""Named checkpoints: a version kept from GC in every process and opened read-only as it was."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH, Root

import kvlog
from kvlog.clock import ManualClock
from kvlog.errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    ConfigError,
    InvalidRecordError,
    ReadOnlyError,
)
from kvlog.format.commit import Commit
from kvlog.log.head import HEAD_NAME
from kvlog.storage import LocalStorage
from kvlog.storage.base import BytesLike

#: GC may delete a replaced file 1 s (the smallest delay) after its replace commit; the tests
#: move a manual clock past it instead of waiting.
FAST_GC: dict[str, Any] = dict(EXPLICIT_FLUSH, file_delete_delay_ms=1_000, commit_retention_ms=0,
                               checkpoint_interval=2)


def _state(store: kvlog.Store) -> dict[str, Any]:
    """Everything a reader can see of a store, for exact comparison."""
    log = store.log
    return {
        "items": list(store.scan()),
        "len": len(store),
        "changes": [(r.partition, r.offset, r.key, r.value, r.timestamp_ms) for r in store.changes()],
        "offsets": [(log.start_offset(p), log.end_offset(p)) for p in range(log.partitions)],
        "k1": store.get("k1"),
    }


def _write_rounds(store: kvlog.Store, rounds: range, keys: int = 40) -> None:
    for r in rounds:
        for i in range(keys):
            store.put(f"k{i}", f"round{r}-{i}")
        store.delete(f"k{r}")
        store.flush()


def _live_files(store: kvlog.Store) -> set[str]:
    """The paths of the files live at ``store``'s version: data files, and commits that carry
    an inline file."""
    return {e.path for _fid, e in store.log.snapshot(lambda r: list(r.iter_files()))}


def _stored(store: kvlog.Store, paths: set[str]) -> set[str]:
    """Those of ``paths`` that storage still holds."""
    return {path for path in paths if store.log.storage.exists(path)}


def test_open_at_a_checkpoint_after_writes_compaction_and_gc(root: Root) -> None:
    clock = ManualClock()
    with root.open(clock=clock, partitions=2, **FAST_GC) as store:
        _write_rounds(store, range(3))
        before = _state(store)
        cp = store.checkpoint("before")
        assert cp == kvlog.Checkpoint("before", store.log.version - 1, cp.created_ms)
        assert store.checkpoints() == [cp]
        pinned_files = _live_files(store)
        if root.kind == "s3":
            time.sleep(1.1)  # commit GC compares storage times, to the second on an object store
        _write_rounds(store, range(3, 6))
        store.compact(force=True)
        clock.advance(10_000)
        freed = store.gc()
        assert freed["commits"] > 0
        assert _stored(store, pinned_files) == pinned_files  # the replaced files live at the checkpoint stay
        after = _state(store)
        assert after != before
    with root.open(cache="fresh", read_only=True, checkpoint="before") as old:
        assert _state(old) == before
        assert old.log.version == cp.version
        assert old.refresh() == cp.version
        with pytest.raises(ReadOnlyError):
            old.put("k", "v")
    with root.open(read_only=True, checkpoint="before") as again:  # the cache built above, reused
        assert _state(again) == before
    with root.open(cache="fresh", read_only=True) as now:
        assert _state(now) == after


def test_delete_checkpoint_then_gc_frees_its_files(root: Root) -> None:
    clock = ManualClock()
    with root.open(clock=clock, partitions=2, **FAST_GC) as store:
        _write_rounds(store, range(3))
        store.checkpoint("cp")
        pinned_files = _live_files(store)
        cp_version = store.checkpoints()[0].version
        _write_rounds(store, range(3, 5))
        store.compact(force=True)
        clock.advance(10_000)
        store.gc()
        kept = pinned_files - _live_files(store)
        assert kept and _stored(store, kept) == kept
        store.delete_checkpoint("cp")
        assert store.checkpoints() == []
        if root.kind == "s3":
            time.sleep(1.1)  # commit GC compares storage times, to the second on an object store
        for i in range(4):  # newer metadata checkpoints, so the pinned one may go
            store.put(f"x{i}", "y", sync=True)
        clock.advance(10_000)
        store.gc()
        assert not _stored(store, kept)
        names = {i.name for i in store.log.storage.list("log/")}
        assert f"log/{cp_version:020d}.checkpoint.json" not in names
        with pytest.raises(CheckpointNotFoundError):
            root.open(cache="late", read_only=True, checkpoint="cp")


def test_checkpoints_are_seen_by_other_processes_and_survive_gc_of_their_commit(root: Root) -> None:
    clock = ManualClock()
    # Data files of their own: commit GC collects the first commits only if they carry no live file.
    with root.open(clock=clock, partitions=2, **FAST_GC, commit_inline_bytes=0) as store:
        _write_rounds(store, range(2))
        cp = store.checkpoint("a")
        if root.kind == "s3":
            time.sleep(1.1)  # commit GC compares storage times, to the second on an object store
        for i in range(6):
            store.put(f"later{i}", "v", sync=True)
        clock.advance(10_000)
        store.gc()
        names = {i.name for i in store.log.storage.list("log/")}
        assert f"log/{cp.version + 1:020d}.json" not in names  # the pin commit itself was collected
    with root.open(cache="other", read_only=True) as other:  # loads a metadata checkpoint
        assert other.checkpoints() == [cp]


def test_names_and_errors(root: Root) -> None:
    with root.open(partitions=2, **EXPLICIT_FLUSH) as store:
        store.put("a", "1")
        cp = store.checkpoint("one")
        version = store.log.version
        with pytest.raises(CheckpointExistsError):
            store.checkpoint("one")
        for bad in ("", None, b"x", "a\x00b", "x" * 300, 3):
            with pytest.raises(InvalidRecordError):
                store.checkpoint(bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidRecordError):
                store.delete_checkpoint(bad)  # type: ignore[arg-type]
        with pytest.raises(CheckpointNotFoundError):
            store.delete_checkpoint("two")
        assert isinstance(CheckpointNotFoundError("x"), kvlog.StoreNotFoundError)
        assert store.log.version == version and store.checkpoints() == [cp]
    with pytest.raises(ConfigError):
        root.open(checkpoint="one")
    with pytest.raises(CheckpointNotFoundError):
        root.open(read_only=True, checkpoint="two")
    with pytest.raises(InvalidRecordError):
        root.open(read_only=True, checkpoint="")
    with root.open(read_only=True) as reader:
        with pytest.raises(ReadOnlyError):
            reader.checkpoint("three")
        with pytest.raises(ReadOnlyError):
            reader.delete_checkpoint("one")
        assert reader.checkpoints() == [cp]


def test_a_pin_that_does_not_follow_its_version_is_refused(local_root: Root) -> None:
    with local_root.open(partitions=2, **EXPLICIT_FLUSH) as store:
        store.put("a", "1", sync=True)
        store.put("b", "2", sync=True)
        stale = store.log.version - 1
        commit_id = store.log.new_id()

        def build(version: int) -> Commit:
            info = {"name": "late", "version": stale, "commit_id": "c", "commit_crc": 0, "paths": []}
            return Commit(version, commit_id, 0, "pin", info=info)

        outcome = store.log.commit(build)
        assert outcome.refusal is not None and "pin-follows-its-version" in outcome.refusal.message
        assert store.checkpoints() == []


class HookedStorage(LocalStorage):
    """A real local storage that runs ``hook`` once, just before the next commit is published
    (the swap of the head)."""

    hook: Callable[[], None] | None = None

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        if name == HEAD_NAME:
            hook, self.hook = self.hook, None
            if hook is not None:
                hook()
        return super().swap(name, data, expected, copy_to)


#: Data files of their own (the compaction replaces them and GC deletes them), and commits kept
#: (the default retention): the checkpoint opened at the end is checked against its version's commit.
RACE: dict[str, Any] = dict(FAST_GC, commit_retention_ms=kvlog.StoreConfig().commit_retention_ms,
                            commit_inline_bytes=0)


def test_a_pin_racing_a_compaction_and_gc_in_another_process_keeps_what_it_pins(tmp_path: Path) -> None:
    root = tmp_path / "root"
    storage = HookedStorage(root, fsync=False)
    other_clock = ManualClock(2_000_000_000_000)
    collected: list[dict[str, int]] = []

    def compact_and_collect() -> None:
        # Between the metadata checkpoint and the pin commit: another process replaces every
        # file live at the version just checkpointed and deletes them at once.
        with kvlog.open(root, cache_dir=tmp_path / "other", clock=other_clock, **RACE) as other:
            other.compact(force=True)
            other_clock.advance(10_000)
            collected.append(other.gc())

    with kvlog.open(storage, cache_dir=tmp_path / "cache", partitions=2, **RACE) as store:
        _write_rounds(store, range(3))
        storage.hook = compact_and_collect
        cp = store.checkpoint("raced")  # loses the version to the compaction: pins a later one
        assert collected[0]["replaced"] > 0
        assert store.refresh() == cp.version + 1
        expected = _state(store)
        assert store.check() == []
        with kvlog.open(root, cache_dir=tmp_path / "other", clock=other_clock, **RACE) as other:
            _write_rounds(other, range(3, 5))
            other.compact(force=True)
            other_clock.advance(10_000)
            other.gc()
    with kvlog.open(root, read_only=True, checkpoint="raced", cache_dir=tmp_path / "fresh") as old:
        assert old.log.version == cp.version
        assert _state(old) == expected
        assert old.check() == []


def test_a_crash_between_the_metadata_checkpoint_and_the_pin_leaves_nothing_pinned(tmp_path: Path) -> None:
    root = tmp_path / "root"
    storage = HookedStorage(root, fsync=False)
    clock = ManualClock()

    class Crash(BaseException):
        pass

    def crash() -> None:
        raise Crash

    with kvlog.open(storage, cache_dir=tmp_path / "cache", partitions=2, clock=clock, **FAST_GC) as store:
        _write_rounds(store, range(2))
        storage.hook = crash
        with pytest.raises(Crash):
            store.checkpoint("half")
        assert store.checkpoints() == []
        store.flush()
    with kvlog.open(root, cache_dir=tmp_path / "cache", clock=clock, **FAST_GC) as store:
        assert store.checkpoints() == []
        files = _live_files(store)
        assert files
        _write_rounds(store, range(2, 4))
        store.compact(force=True)
        clock.advance(10_000)
        store.gc()
        assert not _stored(store, files)  # nothing kept the half-made checkpoint's files
        cp = store.checkpoint("half")  # the name is free
        assert store.checkpoints() == [cp]
