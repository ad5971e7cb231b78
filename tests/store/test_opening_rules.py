"""How a store is opened: where one may be created, which arguments are understood, and what a
cache holding commits the storage root lost does.

A store is created only where its directory is missing or empty, or with ``create=True``; a
URI or argument that is not understood is a :class:`ConfigError` before anything is created;
a reopen whose cache applied commits storage no longer holds raises
:class:`StorageBehindError` naming them, unless ``on_storage_behind="rebuild"`` accepts the loss.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from root_surgery import QUIET, restore_root, write_past_a_backup

import kvlog
import kvlog.aio
from kvlog import ConfigError, KvlogError, StorageBehindError, StoreNotFoundError
from kvlog.storage import LocalStorage
from kvlog.storage.base import ObjectInfo


def listing(root: Path) -> dict[str, tuple[int, int, bytes] | None]:
    """Every path under ``root`` with a file's size, modification time and (up to 1 MB, so
    the cache's sparse LMDB map is not read whole) bytes; None for a directory."""
    def state(p: Path) -> tuple[int, int, bytes] | None:
        if p.is_dir():
            return None
        st = p.stat()
        return st.st_size, st.st_mtime_ns, p.read_bytes() if st.st_size <= 1 << 20 else b""

    return {str(p.relative_to(root)): state(p) for p in sorted(root.rglob("*"))}


@pytest.fixture
def foreign_dir(tmp_path: Path) -> Path:
    """A directory holding files of something else."""
    root = tmp_path / "etc"
    (root / "sub").mkdir(parents=True)
    (root / "hosts").write_text("127.0.0.1 localhost\n")
    return root


def _forms(directory: Path) -> list[str]:
    """Every spelling of ``directory`` kvlog.open takes: a path, one through a missing
    directory and ``..``, and the ``file://`` forms of both."""
    climb = f"{directory}/missing/.."
    return [str(directory), climb, directory.as_uri(), f"file://localhost{directory}", f"file://{climb}"]


def test_open_refuses_a_directory_that_holds_other_files_in_every_spelling(foreign_dir: Path) -> None:
    before = listing(foreign_dir.parent)
    for uri in _forms(foreign_dir):
        for read_only in (False, True):
            with pytest.raises(StoreNotFoundError, match="is not empty and is not a kvlog store|no kvlog store"):
                kvlog.open(uri, read_only=read_only)
        with pytest.raises(StoreNotFoundError, match=r"is not empty and is not a kvlog store \(no kvlog\.json\): "
                                                     "pass create=True"):
            kvlog.open(uri)
        with pytest.raises(StoreNotFoundError):
            kvlog.open(uri, create=False)
    assert listing(foreign_dir.parent) == before  # no kvlog.json, no cache/, no missing/


def test_create_true_makes_a_store_among_other_files(foreign_dir: Path) -> None:
    with kvlog.open(f"{foreign_dir}/missing/..", create=True, **QUIET) as store:
        store.put(b"k", b"v", sync=True)
    assert (foreign_dir / "kvlog.json").is_file() and (foreign_dir / "hosts").is_file()
    assert not (foreign_dir / "missing").exists()
    # Now a store: every spelling opens it without create=True.
    for uri in _forms(foreign_dir):
        with kvlog.open(uri, **QUIET) as store:
            assert store.get(b"k") == b"v"


def test_open_creates_a_store_in_a_missing_or_empty_directory_only_unless_create_false(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (empty, tmp_path / "not" / "yet", tmp_path / "absent"):
        with pytest.raises(StoreNotFoundError):
            kvlog.open(target, create=False)
        assert sorted(tmp_path.rglob("*")) == sorted({empty, tmp_path / "not"} & set(tmp_path.rglob("*")))
    for target in (empty, tmp_path / "not" / "yet"):
        with kvlog.open(target, **QUIET) as store:
            store.put(b"k", b"v", sync=True)
        with kvlog.open(target, create=False, read_only=True) as store:
            assert store.get(b"k") == b"v"


def test_open_refuses_a_file_as_the_store_directory(foreign_dir: Path) -> None:
    before = listing(foreign_dir)
    for create in (None, True, False):
        with pytest.raises(StoreNotFoundError, match="not a directory"):
            kvlog.open(foreign_dir / "hosts", create=create)
    assert listing(foreign_dir) == before


def test_the_asyncio_open_takes_the_same_rule_and_arguments(foreign_dir: Path, tmp_path: Path) -> None:
    before = listing(foreign_dir)

    async def main() -> None:
        with pytest.raises(StoreNotFoundError, match="not empty"):
            await kvlog.aio.open(foreign_dir)
        with pytest.raises(ConfigError, match="on_storage_behind"):
            await kvlog.aio.open(tmp_path / "new", on_storage_behind="ignore")
        async with kvlog.aio.open(foreign_dir, create=True, on_storage_behind="rebuild", **QUIET) as store:
            await store.put(b"k", b"v", sync=True)

    asyncio.run(main())
    assert (foreign_dir / "kvlog.json").is_file() and not (tmp_path / "new").exists()
    assert set(before) <= set(listing(foreign_dir))


def test_an_object_store_prefix_is_the_store(s3_root: tuple[str, dict[str, Any]]) -> None:
    """An ``s3://`` prefix is created by default (the prefix is the store), never with create=False."""
    uri, options = s3_root
    with pytest.raises(StoreNotFoundError):
        kvlog.open(uri, create=False, storage_options=options)
    with kvlog.open(uri, storage_options=options, **QUIET) as store:
        store.put(b"k", b"v", sync=True)
    with kvlog.open(uri, create=False, read_only=True, storage_options=options) as store:
        assert store.get(b"k") == b"v"


# -- what open does not understand ----------------------------------------------------------------

def _bad_uris(tmp: Path) -> list[object]:
    return [
        "\x00", f"{tmp}/s\x00", 123, None, b"/tmp/x", 1.5, ["a"],
        f"{tmp.as_uri()}/s?partitions=3", f"{tmp.as_uri()}/s#frag", f"{tmp.as_uri()}/s?",
        f"file://otherhost{tmp}/s", "file:relative/dir", f"{tmp.as_uri()}/%ff", f"{tmp.as_uri()}/%00",
        "s3:///prefix", "s3://", "ftp://host/dir", "http://host/dir", "mystore:dir",
        f"{tmp}/\udcff", f"{tmp.as_uri()}/\udcff",
    ]


def test_open_refuses_a_uri_it_does_not_understand_before_anything_is_created(tmp_path: Path) -> None:
    tmp = tmp_path / "t"
    tmp.mkdir()
    for uri in _bad_uris(tmp):
        for create in (None, True):
            with pytest.raises(ConfigError):
                kvlog.open(uri, create=create)  # type: ignore[arg-type]
    assert list(tmp.iterdir()) == [] and sorted(os.listdir(tmp_path)) == ["t"]


BAD_ARGUMENTS: list[tuple[str, object]] = [
    ("partitions", "3"), ("partitions", 0), ("partitions", -1), ("partitions", 1.5), ("partitions", True),
    ("create", "yes"), ("create", 1),
    ("read_only", "no"), ("read_only", None), ("read_only", 1),
    ("cache_dir", 123), ("cache_dir", "c\x00"), ("cache_dir", "c\udcff"), ("cache_dir", b"c"),
    ("storage_options", "x"), ("storage_options", {1: 2}), ("storage_options", {"region": "x"}),
    ("storage_options", [("region", "x")]),
    ("clock", 5), ("clock", "x"), ("config", {}), ("config", "x"), ("ids", 5), ("ids", "token"),
    ("producer_id", "x"), ("producer_id", -1), ("producer_id", 1.5), ("producer_id", True),
    ("producer_id", 2**64),
    ("checkpoint", 5), ("checkpoint", ""), ("checkpoint", "nightly"),
    ("on_storage_behind", "ignore"), ("on_storage_behind", None), ("on_storage_behind", True),
    ("no_such_setting", 1), ("cache_bytes", -5),
]


@pytest.mark.parametrize(("name", "value"), BAD_ARGUMENTS, ids=[f"{n}={v!r}" for n, v in BAD_ARGUMENTS])
def test_every_argument_of_open_is_checked_before_anything_is_created(
        tmp_path: Path, name: str, value: object) -> None:
    target = tmp_path / "store"
    existing = tmp_path / "existing"
    with kvlog.open(existing, **QUIET) as store:
        store.put(b"k", b"v", sync=True)
    if name == "cache_dir" and isinstance(value, str):
        value = f"{tmp_path}/{value}"  # where a wrongly accepted cache would show
    before = listing(tmp_path)
    for uri in (target, existing):
        with pytest.raises(KvlogError):
            kvlog.open(uri, **{name: value})
    assert listing(tmp_path) == before  # nothing created, no file of the store changed
    with kvlog.open(existing, read_only=True) as store:
        assert store.get(b"k") == b"v"


# -- a cache of commits storage lost ----------------------------------------------------------------

def test_a_reopen_names_the_commits_storage_lost_and_changes_nothing_until_the_loss_is_accepted(
        tmp_path: Path) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    # data files of their own: restore_root puts back the data directory of the backup
    with kvlog.open(root, cache_dir=cache, commit_inline_bytes=0, **QUIET) as store:
        write_past_a_backup(store, root, tmp_path / "backup")  # b and c land after the backup
        lost = sorted(p.name for p in (root / "log").glob("*[0-9].json"))
    restore_root(root, tmp_path / "backup")
    kept = sorted(p.name for p in (root / "log").glob("*[0-9].json"))
    missing = [n for n in lost if n not in kept]
    assert missing
    stored = listing(root)
    for read_only in (False, True):
        with pytest.raises(StorageBehindError) as raised:
            kvlog.open(root, cache_dir=cache, read_only=read_only, **QUIET)
        message = str(raised.value)
        assert f"log/{missing[0]}" in message and f"log/{missing[-1]}" in message, message
        assert 'on_storage_behind="rebuild"' in message, message
    assert listing(root) == stored  # nothing written to the store
    with pytest.raises(ConfigError):
        kvlog.open(root, cache_dir=cache, on_storage_behind="rebuilt", **QUIET)
    with kvlog.open(root, cache_dir=cache, on_storage_behind="rebuild", **QUIET) as store:
        assert store.get(b"a") == b"1" and store.get(b"b") is None and store.get(b"c") is None
        store.put(b"d", b"4", sync=True)
        assert store.check() == []
    with kvlog.open(root, cache_dir=cache, **QUIET) as store:  # rebuilt: the default opens again
        assert store.get(b"d") == b"4"


def test_check_of_an_open_store_names_every_commit_storage_lost(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # data files of their own: restore_root puts back the data directory of the backup
    with kvlog.open(root, cache_dir=tmp_path / "cache", commit_inline_bytes=0, **QUIET) as store:
        write_past_a_backup(store, root, tmp_path / "backup")
        lost = sorted(p.name for p in (root / "log").glob("*[0-9].json"))
        restore_root(root, tmp_path / "backup")
        kept = {p.name for p in (root / "log").glob("*[0-9].json")}
        missing = [n for n in lost if n not in kept]
        findings = store.check()
        assert any(f"commits log/{missing[0]} to log/{missing[-1]}" in f and "missing" in f
                   for f in findings), findings


def test_a_cache_behind_commit_gc_and_a_fresh_cache_open_without_rebuild(tmp_path: Path) -> None:
    """Neither is a loss: a cache that slept while commits were collected after a checkpoint
    catches up from the checkpoint, and a fresh cache replays storage."""
    root = tmp_path / "root"
    # data files of their own: commit GC keeps a commit whose inline file is live
    settings = {**QUIET, "checkpoint_interval": 2, "commit_retention_ms": 0, "commit_inline_bytes": 0}
    with kvlog.open(root, cache_dir=tmp_path / "sleeper", **settings) as store:
        store.put(b"a", b"1", sync=True)
    with kvlog.open(root, cache_dir=tmp_path / "busy", **settings) as store:
        for i in range(8):
            store.put(f"k{i}".encode(), b"v", sync=True)
        store.gc()
    assert not (root / "log" / f"{2:020d}.json").exists(), "commit GC collected nothing"
    for cache in ("sleeper", "fresh"):
        with kvlog.open(root, cache_dir=tmp_path / cache, **settings) as store:
            assert store.get(b"a") == b"1" and store.get(b"k7") == b"v"
            assert store.check() == []


def test_a_directory_another_process_is_creating_a_store_in_is_opened(tmp_path: Path) -> None:
    """Two processes open one new directory at the same instant: the second may look while the
    first has written only the temporary file of the store's identity; it opens the store."""
    root = tmp_path / "s"
    root.mkdir()
    (root / ".tmp-kvlog.kvlog.json.4242.1.0").write_bytes(b"{")
    with kvlog.open(root, flush_interval_ms=0, background_compaction=False) as store:
        store.put(b"k", b"v", sync=True)
    with kvlog.open(root, read_only=True) as again:
        assert again.get(b"k") == b"v"


class ListsAnOlderCheckpointOnce(LocalStorage):
    """Its first listing of ``log/`` shows the log as an opener saw it just before another
    process wrote a newer checkpoint and collected the commits below it: ``hide`` is left out
    and ``show`` put in."""

    hide: set[str] = set()
    show: set[str] = set()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        listed = super().list(prefix)
        hidden, shown, self.hide, self.show = self.hide, self.show, set(), set()
        return [info for info in listed if info.name not in hidden] + [
            ObjectInfo(name, 1, 0) for name in sorted(shown)]


def test_an_opener_whose_checkpoint_lost_its_commit_meanwhile_loads_the_newer_one(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # data files of their own: commit GC keeps a commit whose inline file is live
    settings = {"flush_interval_ms": 0, "background_compaction": False, "commit_retention_ms": 0,
                "checkpoint_interval": 1_000_000, "commit_inline_bytes": 0}
    with kvlog.open(root, **settings) as store:
        for i in range(3):
            store.put(f"k{i}", "v", sync=True)
        first = store.log.write_checkpoint()
        kept = (root / "log" / f"{first:020d}.checkpoint.json").read_bytes()
        for i in range(3, 6):
            store.put(f"k{i}", "v", sync=True)
        time.sleep(0.01)
        newest = store.log.write_checkpoint()
        store.gc()
    assert not (root / "log" / f"{first:020d}.json").exists()
    # The older checkpoint is read before commit GC deleted it, its commit after.
    (root / "log" / f"{first:020d}.checkpoint.json").write_bytes(kept)
    storage = ListsAnOlderCheckpointOnce(root, fsync=False)
    storage.hide = {f"log/{newest:020d}.checkpoint.json"}
    storage.show = {f"log/{first:020d}.json"}
    with kvlog.open(storage, cache_dir=tmp_path / "fresh", read_only=True) as fresh:
        assert [fresh.get(f"k{i}") for i in range(6)] == [b"v"] * 6
        assert fresh.log.version >= newest
