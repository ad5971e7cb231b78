"""Index runs in a store: commits write sorted runs, readers merge them, settling folds them in."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.index import merge as index_merge
from kvlog.index.keys import DIRECT_KEY_BYTES
from kvlog.index.write import settle_runs
from kvlog.meta.cache import MetaTxn


def runs_pending(store: kvlog.Store) -> int:
    return int(store.log.snapshot(lambda r: r.runs_pending()))


def btree_entries(store: kvlog.Store) -> int:
    env = store.log.env
    with env.env.begin() as txn:
        return int(txn.stat(env.dbs["index"])["entries"])


def assert_reads(store: kvlog.Store, model: dict[bytes, bytes]) -> None:
    """Every read path agrees with the model."""
    for key, value in model.items():
        assert store.get(key) == value
    assert store.get(b"absent") is None
    items = sorted(model.items())
    assert list(store.scan()) == items
    assert list(store.scan(reverse=True)) == items[::-1]
    assert list(store.scan(b"k1", b"k3")) == [kv for kv in items if b"k1" <= kv[0] < b"k3"]
    assert list(store.scan(prefix=b"k2", reverse=True)) == [kv for kv in items if kv[0].startswith(b"k2")][::-1]
    assert store.stats()["live_keys"] == len(model)
    assert store.check() == []


def quiet_store(path: Path, **settings: Any) -> kvlog.Store:
    return kvlog.open(str(path), flush_interval_ms=0, background_compaction=False, **settings)


def test_a_run_per_flush_read_everywhere_then_settled(tmp_path: Path) -> None:
    store = quiet_store(tmp_path / "s")
    model: dict[bytes, bytes] = {}
    for flush in range(4):
        for i in range(300):
            key = b"k%d-%03d" % (i % 4, i + 100 * flush)
            model[key] = b"v%d" % flush
            store.put(key, model[key])
        store.flush()
        assert runs_pending(store) == flush + 1
    assert btree_entries(store) == 0
    assert_reads(store, model)
    assert store.stats()["index_runs"] == 4
    assert store.log.settle_index() == 4
    assert runs_pending(store) == 0
    assert btree_entries(store) == len(model)
    assert_reads(store, model)
    store.close()


def test_newer_runs_win_over_older_runs_and_the_btree(tmp_path: Path) -> None:
    store = quiet_store(tmp_path / "s")
    model: dict[bytes, bytes] = {}
    for i in range(50):
        model[b"k1-%02d" % i] = b"old"
        store.put(b"k1-%02d" % i, b"old")
    store.flush()
    store.log.settle_index()  # the B-tree holds the old values
    for round_ in range(3):
        for i in range(0, 50, 2):
            model[b"k1-%02d" % i] = b"r%d" % round_
            store.put(b"k1-%02d" % i, model[b"k1-%02d" % i])
        for i in range(round_, 50, 7):
            model.pop(b"k1-%02d" % i, None)
            store.delete(b"k1-%02d" % i)
        store.flush()
    assert runs_pending(store) == 3
    assert_reads(store, model)
    store.log.settle_index()
    assert btree_entries(store) == len(model)
    assert_reads(store, model)
    store.close()


def test_another_handle_reads_the_pending_runs(tmp_path: Path) -> None:
    store = quiet_store(tmp_path / "s")
    store.put(b"k1-a", b"1")
    store.flush()
    reader = kvlog.open(str(tmp_path / "s"), read_only=True, refresh_interval_ms=0)
    try:
        assert reader.get(b"k1-a") == b"1"
        store.put(b"k1-a", b"2")
        store.put(b"k2-b", b"3")
        store.flush()
        assert runs_pending(store) == 2
        assert reader.get(b"k1-a") == b"2"  # a new snapshot with a run the last get did not see
        assert list(reader.scan()) == [(b"k1-a", b"2"), (b"k2-b", b"3")]
    finally:
        reader.close()
        store.close()


def test_the_get_fast_path_sees_a_run_added_after_it_looked(tmp_path: Path) -> None:
    store = quiet_store(tmp_path / "s")
    store.put(b"a", b"1")
    store.flush()
    store.log.settle_index()
    assert store.get(b"a") == b"1"  # remembers this snapshot as one without runs
    store.put(b"a", b"2")
    store.flush()  # the memtable no longer holds it: only the new run does
    assert runs_pending(store) == 1
    assert store.get(b"a") == b"2"
    store.delete(b"a")
    store.flush()
    assert store.get(b"a") is None
    store.close()


def test_the_run_limit_settles_and_zero_writes_no_runs(tmp_path: Path) -> None:
    store = quiet_store(tmp_path / "limited", index_run_limit=3)
    for flush in range(7):
        store.put(b"k%d" % flush, b"v")
        store.flush()
        assert runs_pending(store) <= 3
    assert btree_entries(store) > 0
    assert all(store.get(b"k%d" % i) == b"v" for i in range(7))
    store.close()
    direct = quiet_store(tmp_path / "direct", index_run_limit=0)
    for flush in range(3):
        direct.put(b"k%d" % flush, b"v")
        direct.flush()
        assert runs_pending(direct) == 0
    assert btree_entries(direct) == 3
    direct.close()


def test_close_settles_and_a_crash_keeps_the_runs(tmp_path: Path) -> None:
    store = quiet_store(tmp_path / "s")
    store.put(b"a", b"1")
    store.flush()
    store.close()
    store = quiet_store(tmp_path / "s")
    assert runs_pending(store) == 0 and store.get(b"a") == b"1"
    store.put(b"b", b"2")
    store.flush()
    store.close(flush=False)  # as a crash: nothing settles
    store = quiet_store(tmp_path / "s")
    assert runs_pending(store) == 1
    assert_reads(store, {b"a": b"1", b"b": b"2"})
    store.close()


def test_a_long_key_settles_the_runs_in_its_commit(tmp_path: Path) -> None:
    store = quiet_store(tmp_path / "s")
    store.put(b"k1-short", b"1")
    store.flush()
    assert runs_pending(store) == 1
    long_key = b"k1-" + b"x" * DIRECT_KEY_BYTES
    store.put(long_key, b"long")
    store.put(b"k1-short", b"2")
    store.flush()
    assert runs_pending(store) == 0
    assert_reads(store, {b"k1-short": b"2", long_key: b"long"})
    store.close()


def test_the_background_flusher_settles_when_writers_are_quiet(tmp_path: Path) -> None:
    store = kvlog.open(str(tmp_path / "s"), flush_interval_ms=50, background_compaction=False)
    try:
        for i in range(100):
            store.put(b"k%03d" % i, b"v")
        store.flush()
        deadline = time.monotonic() + 20
        while runs_pending(store) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runs_pending(store) == 0
        assert btree_entries(store) == 100
    finally:
        store.close()


def test_a_failed_settle_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = quiet_store(tmp_path / "s")
    model = {}
    for flush in range(3):
        for i in range(20):
            model[b"k2-%02d" % i] = b"%d" % flush
            store.put(b"k2-%02d" % i, model[b"k2-%02d" % i])
        store.flush()
    real = index_merge.merge_runs
    calls = {"n": 0}

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the first chunk is written to the B-tree by then
            raise OSError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(index_merge, "MERGE_CHUNK", 5)
    monkeypatch.setattr(index_merge, "merge_runs", failing)
    with pytest.raises(OSError):
        store.log.env.write(lambda txn: settle_runs(MetaTxn(store.log.env, txn)))
    assert calls["n"] == 2
    monkeypatch.setattr(index_merge, "merge_runs", real)
    assert runs_pending(store) == 3 and btree_entries(store) == 0
    assert_reads(store, model)
    assert store.log.settle_index() == 3
    assert_reads(store, model)
    store.close()


def test_gets_in_threads_while_runs_come_and_go(tmp_path: Path) -> None:
    store = quiet_store(tmp_path / "s", index_run_limit=4)
    keys = [b"k%02d" % i for i in range(50)]
    for key in keys:
        store.put(key, b"0")
    store.flush()
    store.log.settle_index()
    done = threading.Event()
    errors: list[str] = []

    def read() -> None:
        seen = dict.fromkeys(keys, 0)
        while not done.is_set():
            for key in keys:
                value = store.get(key)
                if value is None or int(value) < seen[key]:
                    errors.append(f"{key!r}: {value!r} after {seen[key]}")
                    return
                seen[key] = int(value)
            time.sleep(0.001)  # let the writer have the GIL between passes

    readers = [threading.Thread(target=read) for _ in range(2)]
    for thread in readers:
        thread.start()
    for round_ in range(1, 15):
        for key in keys[round_ % 2::2]:
            store.put(key, b"%d" % round_)
        store.flush()
        if round_ % 7 == 0:
            store.log.settle_index()
    done.set()
    for thread in readers:
        thread.join()
    assert errors == []
    store.close()
