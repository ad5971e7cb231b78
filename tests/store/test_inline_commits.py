"""A small flush travels inside its commit: one object per durable write, read like a data file,
moved into a data file by the compactor, and kept by commit GC while it is live."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH, Root

import kvlog
from kvlog.errors import StorageError
from kvlog.format.identity import IDENTITY_NAME, STORE_FORMAT, decode_identity
from kvlog.log.naming import DATA_PREFIX, LOG_PREFIX, commit_name
from kvlog.storage import LocalStorage
from kvlog.testing import FaultyStorage, fail

FIXTURE = Path(__file__).resolve().parent.parent / "format" / "fixtures" / "store_v1"


def names(store: kvlog.Store, prefix: str) -> set[str]:
    return {info.name for info in store.log.storage.list(prefix)}


def live_paths(store: kvlog.Store) -> set[str]:
    return set(store.log.snapshot(lambda r: [e.path for _fid, e in r.iter_files()]))


def test_a_small_durable_put_is_one_object(root: Root) -> None:
    """(The requests of each are counted in ``tests/log/test_append_requests.py``.)"""
    with root.open(**EXPLICIT_FLUSH) as store:
        store.put("warm", "v", sync=True)
        before = names(store, "")
        for i in range(20):
            store.put(f"k{i}", "v" * 100, sync=True)
        added = names(store, "") - before
        assert {n for n in added if n.startswith(DATA_PREFIX)} == set()
        assert len({n for n in added if n.startswith(LOG_PREFIX) and "checkpoint" not in n}) == 20
        assert all(path.startswith(LOG_PREFIX) for path in live_paths(store))
    with root.open(cache="other", read_only=True) as other:  # another process replays them
        assert [other.get(f"k{i}") for i in range(20)] == [b"v" * 100] * 20


@pytest.mark.parametrize(("limit", "value_bytes", "inline"), [(4096, 100, True), (4096, 20_000, False),
                                                               (0, 1, False)])
def test_a_flush_past_commit_inline_bytes_writes_a_data_file(local_root: Root, limit: int, value_bytes: int,
                                                             inline: bool) -> None:
    with local_root.open(commit_inline_bytes=limit, compression="none", **EXPLICIT_FLUSH) as store:
        store.put("k", "v" * value_bytes, sync=True)
        [path] = live_paths(store)
        assert path.startswith(LOG_PREFIX) is inline
        assert bool(names(store, DATA_PREFIX)) is not inline
    with local_root.open(cache="fresh", read_only=True) as fresh:
        assert fresh.get("k") == b"v" * value_bytes


def test_every_reader_reads_inline_records(root: Root) -> None:
    with root.open(partitions=3, **EXPLICIT_FLUSH) as store:
        with store.batch() as batch:
            for i in range(30):
                batch.put(f"k{i:02d}", f"v{i}")
        store.delete("k05", sync=True)
        expected = {f"k{i:02d}".encode(): f"v{i}".encode() for i in range(30) if i != 5}
        assert dict(store.scan()) == expected
        assert store.check() == []
    with root.open(cache="fresh", read_only=True) as fresh:
        assert dict(fresh.scan()) == expected
        assert len(list(fresh.changes())) == 31  # the tombstone too
        assert fresh.check() == []


def wait_past(store: kvlog.Store, name: str) -> None:
    """Sleep until storage time has moved past the mtime of ``name``."""
    mtime = store.log.storage.stat(name).mtime_ms
    while int(time.time() * 1000) <= mtime + 5:
        time.sleep(0.01)


def test_commit_gc_keeps_a_commit_whose_inline_file_is_live_until_the_compactor_moves_it(local_root: Root) -> None:
    # No cleaning round (the dirty ratio never exceeds 1): only the merge of due inline files.
    settings: dict[str, Any] = dict(EXPLICIT_FLUSH, checkpoint_interval=2, commit_retention_ms=0,
                                    file_delete_delay_ms=1000, min_cleanable_dirty_ratio=1.0)
    with local_root.open(**settings) as store:
        for i in range(6):
            store.put(f"k{i}", f"v{i}", sync=True)
        inline = {p for p in live_paths(store) if p.startswith(LOG_PREFIX)}
        assert len(inline) == 6
        newest = max(n for n in names(store, LOG_PREFIX) if n.endswith(".checkpoint.json"))
        wait_past(store, newest)
        store.log.gc()
        assert inline <= names(store, LOG_PREFIX)  # every commit holding a live file stays
        # The compactor moves the inline files a checkpoint interval old (a merge of their run).
        report = store.compact()
        assert report.kind == "merge"
        moved = inline - live_paths(store)
        assert moved and all(not p.startswith(LOG_PREFIX) or p not in moved for p in live_paths(store))
        for i in range(4):  # new checkpoints past the merge
            store.put(f"n{i}", "x", sync=True)
        newest = max(n for n in names(store, LOG_PREFIX) if n.endswith(".checkpoint.json"))
        wait_past(store, newest)
        store.log.gc(now_ms=int(time.time() * 1000) + 60_000)  # the replaced inline files are due
        left = names(store, LOG_PREFIX)
        assert moved - left, "the commits of moved inline files were collected"
        assert {p for p in live_paths(store) if p.startswith(LOG_PREFIX)} <= left
        assert store.check() == []
    with local_root.open(cache="fresh", read_only=True) as fresh:
        assert dict(fresh.scan()) == {**{f"k{i}".encode(): f"v{i}".encode() for i in range(6)},
                                      **{f"n{i}".encode(): b"x" for i in range(4)}}
        assert fresh.check() == []


def test_a_format_1_store_opens_read_only_as_it_is_and_a_writer_upgrades_it(tmp_path: Path) -> None:
    root = tmp_path / "store"
    shutil.copytree(FIXTURE, root)
    before = (root / IDENTITY_NAME).read_bytes()
    assert decode_identity(before).format_version == 1
    with kvlog.open(root, cache_dir=tmp_path / "ro", read_only=True) as reader:
        assert dict(reader.scan()) == {b"a": b"2", b"b": b"x" * 2000}
    assert (root / IDENTITY_NAME).read_bytes() == before  # a reader changes nothing
    with kvlog.open(root, cache_dir=tmp_path / "rw", background_compaction=False) as store:
        identity = decode_identity((root / IDENTITY_NAME).read_bytes())
        assert identity.format_version == STORE_FORMAT
        assert identity.store_uuid == decode_identity(before).store_uuid
        store.put(b"c", b"3", sync=True)
        version = store.log.version
        header = json.loads((root / commit_name(version)).read_bytes().split(b"\n", 1)[0])
        assert header["format"] == 2  # the put travelled inside its commit
        store.compact(force=True)
        assert store.check() == []
    with kvlog.open(root, cache_dir=tmp_path / "fresh", read_only=True) as fresh:
        assert dict(fresh.scan()) == {b"a": b"2", b"b": b"x" * 2000, b"c": b"3"}


def test_a_commit_storage_keeps_refusing_fails_after_a_few_attempts_not_commit_retries(tmp_path: Path) -> None:
    """A full disk refuses the commit that carries a flush: the write fails in about a second
    (8 attempts), not after ``commit_retries`` pauses of up to a second each; once storage
    takes writes again, the write lands."""
    storage = FaultyStorage(LocalStorage(tmp_path / "store"))
    with kvlog.open(storage, cache_dir=tmp_path / "cache", commit_retries=50, **EXPLICIT_FLUSH) as store:
        store.put("warm", "v", sync=True)
        storage.set_plan([fail("swap", "log/head.json", times=1000)])
        started = time.monotonic()
        with pytest.raises(StorageError, match="8 commit attempts failed"):
            store.put("k", "v", sync=True)
        assert time.monotonic() - started < 20
        refused = [e for e in storage.history if e.fault and e.op == "swap"]
        assert len(refused) == 8
        storage.set_plan(None)
        store.flush()
        assert store.get("k") == b"v"
    with kvlog.open(tmp_path / "store", cache_dir=tmp_path / "fresh", read_only=True) as fresh:
        assert fresh.get("k") == b"v"
