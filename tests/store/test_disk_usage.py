"""``Store.disk_usage()``: the bytes of a store and of its metadata cache, by what holds them.

The figures are checked against the directory itself: every file of a local store with its
cache inside is counted once, store files by their size and cache files by their allocated
blocks, and a replaced file moves from ``data_files`` to ``awaiting_deletion`` when
compaction replaces it and leaves the figures when GC deletes it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import kvlog
from kvlog import ManualClock
from kvlog.cli import main as cli_main

QUIET = {"background_compaction": False, "flush_interval_ms": 0}
PARTS = ("data_files", "awaiting_deletion", "unreferenced", "log", "cache")


def on_disk(root: Path) -> tuple[int, int]:
    """(bytes of the store's files by size, bytes of the cache's files by allocated blocks)."""
    store = cache = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            st = os.stat(os.path.join(directory, name))
            if Path(directory) == root / "cache":
                cache += st.st_blocks * 512
            else:
                store += st.st_size
    return store, cache


def fill(store: kvlog.Store, rounds: int, keys: int = 400) -> None:
    for r in range(rounds):
        for i in range(keys):
            store.put(b"key-%05d" % i, os.urandom(60) + bytes([r]))
        store.flush()


def test_the_figures_add_up_to_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    clock = ManualClock(time.time_ns() // 1_000_000)
    with kvlog.open(root, clock=clock, **QUIET) as store:
        fill(store, 3)
        store.compact(force=True)  # three files replaced by one: the three await deletion
        usage = store.disk_usage()
        store_bytes, cache_bytes = on_disk(root)
        assert usage["total"] == sum(usage[part] for part in PARTS) == store_bytes + cache_bytes
        assert usage["cache"] == cache_bytes > 0
        live = store.stats()
        assert usage["data_files"] == live["file_bytes"] > 0
        assert usage["awaiting_deletion"] > 0 and usage["unreferenced"] == 0 and usage["log"] > 0
        pages = [usage[f"cache_{part}"] for part in ("index", "runs", "catalog", "free")]
        assert all(size >= 0 for size in pages) and 0 < sum(pages) <= usage["cache"]


def test_replaced_files_leave_the_figures_when_gc_deletes_them(tmp_path: Path) -> None:
    root = tmp_path / "root"
    clock = ManualClock(time.time_ns() // 1_000_000)
    # Data files of their own: the test has GC delete the replaced ones.
    with kvlog.open(root, clock=clock, file_delete_delay_ms=1_000, commit_inline_bytes=0, **QUIET) as store:
        fill(store, 2)
        before = store.disk_usage()
        assert before["awaiting_deletion"] == 0
        written = before["data_files"]
        store.compact(force=True)
        replaced = store.disk_usage()
        assert replaced["awaiting_deletion"] == written  # both inputs, byte for byte
        assert 0 < replaced["data_files"] < written  # one value per key survives
        store.gc()  # not due yet: kept
        assert store.disk_usage()["awaiting_deletion"] == written
        clock.advance(1_001)
        assert store.gc()["replaced"] == 2
        after = store.disk_usage()
        assert after["awaiting_deletion"] == 0 and after["data_files"] == replaced["data_files"]
        assert after["total"] == sum(after[part] for part in PARTS) == sum(on_disk(root))


def test_an_open_snapshot_keeps_its_files_counted_as_awaiting_deletion(tmp_path: Path) -> None:
    """A replaced file a read view may still read stays, and stays counted, past its delay."""
    root = tmp_path / "root"
    clock = ManualClock(time.time_ns() // 1_000_000)
    # Data files of their own: the test has GC delete the replaced ones once the snapshot closes.
    with kvlog.open(root, clock=clock, file_delete_delay_ms=1_000, commit_inline_bytes=0, **QUIET) as store:
        fill(store, 2)
        snap = store.snapshot()
        store.compact(force=True)
        clock.advance(5_000)
        assert store.gc()["replaced"] == 0
        held = store.disk_usage()["awaiting_deletion"]
        assert held > 0
        assert snap.get(b"key-00007") is not None
        snap.close()
        assert store.gc()["replaced"] == 2
        assert store.disk_usage()["awaiting_deletion"] == 0


def test_a_file_no_commit_references_is_unreferenced(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with kvlog.open(root, **QUIET) as store:
        fill(store, 1)
        stray = root / "data" / "0" / "stray.arrow"
        stray.parent.mkdir(parents=True, exist_ok=True)  # a small flush attaches its file to its commit
        stray.write_bytes(b"x" * 1234)
        usage = store.disk_usage()
        assert usage["unreferenced"] == 1234
        assert usage["total"] == sum(on_disk(root))


def test_the_cache_pages_show_the_runs_merged_into_the_index(tmp_path: Path) -> None:
    with kvlog.open(tmp_path / "root", index_run_limit=32, **QUIET) as store:
        fill(store, 2, keys=3_000)
        pending = store.disk_usage()
        assert pending["cache_runs"] > 0 and pending["cache_index"] == 0
        store.log.settle_index()
        settled = store.disk_usage()
        assert settled["cache_runs"] == 0 and settled["cache_index"] > 0
        assert settled["cache_free"] >= pending["cache_runs"]  # the runs' pages, freed


def test_the_stats_command_prints_the_disk_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    with kvlog.open(root, **QUIET) as store:
        fill(store, 1)
    assert cli_main(["stats", str(root)]) == 0
    out = capsys.readouterr().out
    assert "disk         " in out and "awaiting deletion 0.00 MiB" in out
    assert "  cache pages: index " in out
