"""The head, ``log/head.json``: the one object whose conditional swap publishes a commit.

What these tests try: a swap that succeeded but whose copy at the commit's own name never
came (an object store's writer dying between its two requests), a copy of the newest commit
deleted by hand, and the head alone put back from an older copy of the root.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.errors import StorageBehindError, StorageError
from kvlog.log.head import HEAD_NAME
from kvlog.log.naming import checkpoint_name, commit_name
from kvlog.storage import LocalStorage
from kvlog.storage.base import BytesLike
from tests.commits import head_version

QUIET: dict[str, Any] = {"flush_interval_ms": 0, "background_compaction": False, "partitions": 2}


class _CopyLost(LocalStorage):
    """Swaps the head but, once, leaves out the copy and reports a failure: what an object
    store's writer leaves when it dies (or loses the answer) between the swap and the copy."""

    lose_next_copy = False

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        if not self.lose_next_copy:
            return super().swap(name, data, expected, copy_to)
        self.lose_next_copy = False
        super().swap(name, data, expected)
        raise StorageError("the copy's PUT failed: connection reset")


def test_a_swap_whose_copy_never_came_is_resolved_as_landed_and_the_copy_is_put_back(tmp_path: Path) -> None:
    storage = _CopyLost(tmp_path / "root", fsync=False)
    with kvlog.open(storage, cache_dir=tmp_path / "cache", **QUIET) as store:
        store.put(b"a", b"1", sync=True)
        storage.lose_next_copy = True
        store.put(b"b", b"2", sync=True)  # the lost answer: the head holds our commit, so it landed
        assert store.log.version == head_version(storage) == 2
        assert storage.read(commit_name(2)) == storage.read(HEAD_NAME)  # the writer put the copy back
        store.put(b"c", b"3", sync=True)
        assert store.log.version == 3 and store.check() == []
    with kvlog.open(tmp_path / "root", cache_dir=tmp_path / "fresh", read_only=True) as fresh:
        assert dict(fresh.items()) == {b"a": b"1", b"b": b"2", b"c": b"3"}


def test_a_read_only_reader_waits_for_the_copy_and_the_next_writer_puts_it_back(tmp_path: Path) -> None:
    """The copy of the head's commit is missing: a read-only reader stops before that commit
    (its inline records are read at the copy's name), and the first writer to read the head
    writes the copy from the head's bytes, after which every reader has everything."""
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET) as store:
        store.put(b"a", b"1", sync=True)
        store.put(b"b", b"2", sync=True)
    (root / commit_name(2)).unlink()
    with kvlog.open(root, cache_dir=tmp_path / "reader", read_only=True) as reader:
        assert reader.log.version == 1 and dict(reader.items()) == {b"a": b"1"}
        with kvlog.open(root, cache_dir=tmp_path / "writer", **QUIET) as writer:
            assert writer.log.version == 2 and writer.get(b"b") == b"2"
            assert (root / commit_name(2)).read_bytes() == (root / "log" / "head.json").read_bytes()
        reader.refresh()
        assert reader.log.version == 2 and dict(reader.items()) == {b"a": b"1", b"b": b"2"}


def test_a_damaged_copy_of_the_newest_commit_is_named_by_a_read_only_reader_and_healed_by_a_writer(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET) as store:
        store.put(b"a", b"1", sync=True)
        store.put(b"b", b"2", sync=True)
    copy = root / commit_name(2)
    data = copy.read_bytes()
    copy.unlink()  # a local copy is a second link of the head: damage one name only
    copy.write_bytes(data[:-3])
    with pytest.raises(kvlog.CorruptDataError) as info:
        kvlog.open(root, cache_dir=tmp_path / "reader", read_only=True)
    assert info.value.name == commit_name(2)
    with kvlog.open(root, cache_dir=tmp_path / "writer", **QUIET) as writer:
        assert dict(writer.items()) == {b"a": b"1", b"b": b"2"} and writer.check() == []
    assert copy.read_bytes() == data


def test_the_head_alone_put_back_from_an_older_copy_is_the_store_s_state(tmp_path: Path) -> None:
    """Restoring only ``log/head.json`` from a backup restores the store to the backup's
    version: a cache past it is refused until rebuilt, the newer commits left beyond the head
    are never read, and the writes that follow take their versions (and names) again."""
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET) as store:
        store.put(b"a", b"1", sync=True)
        old_head = (root / "log" / "head.json").read_bytes()
        store.put(b"b", b"2", sync=True)
        store.put(b"c", b"3", sync=True)
    (root / "log" / "head.json").unlink()
    (root / "log" / "head.json").write_bytes(old_head)
    with pytest.raises(StorageBehindError, match="commits log/0+2.json to log/0+3.json"):
        kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET)
    with kvlog.open(root, cache_dir=tmp_path / "cache", on_storage_behind="rebuild", **QUIET) as store:
        assert dict(store.items()) == {b"a": b"1"}
        store.put(b"d", b"4", sync=True)  # takes version 2: its copy replaces the one left beyond
        assert store.log.version == 2
        assert store.check() == []
    with kvlog.open(root, cache_dir=tmp_path / "fresh", read_only=True) as fresh:
        assert dict(fresh.items()) == {b"a": b"1", b"d": b"4"} and fresh.log.version == 2


def test_a_root_restored_without_its_head_is_refused_until_the_head_comes_back(tmp_path: Path) -> None:
    """Everything but ``log/head.json`` put back from an older copy leaves a hole below the head
    (the commits after the copy are gone) that no checkpoint spans. Every open refuses it,
    naming the first missing commit, even with the writer's own cache at the head (which
    replays nothing) and with ``on_storage_behind="rebuild"``; nothing is changed. Once the
    copy's head is put back too, the rebuild opens the copy's state, a stale checkpoint past
    it is deleted, and the store writes on from there for every opener."""
    root, backup = tmp_path / "root", tmp_path / "backup"
    with kvlog.open(root, cache_dir=tmp_path / "cache", **QUIET) as store:
        store.put(b"a", b"1", sync=True)
        store.put(b"b", b"2", sync=True)
        shutil.copytree(root, backup)
        for i in range(3):
            store.put(b"c%d" % i, b"3", sync=True)
        store.log.write_checkpoint()  # at version 5: past the hole, of the history it loses
    head = (root / "log" / "head.json").read_bytes()
    shutil.rmtree(root)
    shutil.copytree(backup, root)
    (root / "log" / "head.json").write_bytes(head)  # the head stayed at version 5
    (root / "log" / Path(checkpoint_name(5)).name).write_bytes(b"left behind")
    listing = sorted(p.name for p in (root / "log").iterdir())

    hole = r"log/0+3\.json: is missing .* below its head \(version 5\).* put back the copy with its log/head.json"
    for cache, options in (("cache", {}), ("fresh", {}), ("cache", {"on_storage_behind": "rebuild"}),
                           ("ro", {"read_only": True, "on_storage_behind": "rebuild"})):
        with pytest.raises(StorageBehindError, match=hole):
            kvlog.open(root, cache_dir=tmp_path / cache, **QUIET, **options)
    assert sorted(p.name for p in (root / "log").iterdir()) == listing  # nothing changed

    shutil.copy(backup / "log" / "head.json", root / "log" / "head.json")
    with kvlog.open(root, cache_dir=tmp_path / "cache", on_storage_behind="rebuild", **QUIET) as store:
        assert dict(store.items()) == {b"a": b"1", b"b": b"2"}
        assert not (root / checkpoint_name(5)).exists()  # past the head: deleted by the rebuild
        store.put(b"d", b"4", sync=True)
        assert store.log.version == 3 and store.check() == []
    with kvlog.open(root, cache_dir=tmp_path / "other", read_only=True) as other:
        assert dict(other.items()) == {b"a": b"1", b"b": b"2", b"d": b"4"} and other.log.version == 3


def test_the_head_s_copy_is_put_back_from_the_head_only_while_its_data_file_is_there(tmp_path: Path) -> None:
    """The newest commit alone lost with the rest of a restore: the head holds its bytes, so its
    copy could be put back, but the data file it adds is gone too: that commit is the hole,
    named at open, and its copy is not written."""
    root, backup = tmp_path / "root", tmp_path / "backup"
    files = dict(QUIET, commit_inline_bytes=0)  # every flush writes a data file
    with kvlog.open(root, cache_dir=tmp_path / "cache", **files) as store:
        store.put(b"a", b"1", sync=True)
        shutil.copytree(root, backup)
        store.put(b"b", b"2", sync=True)
    head = (root / "log" / "head.json").read_bytes()
    shutil.rmtree(root)
    shutil.copytree(backup, root)
    (root / "log" / "head.json").write_bytes(head)
    with pytest.raises(StorageBehindError, match=r"log/0+2\.json: is missing .* below its head \(version 2\)"):
        kvlog.open(root, cache_dir=tmp_path / "cache", on_storage_behind="rebuild", **files)
    assert not (root / commit_name(2)).exists()  # not put back from the head
