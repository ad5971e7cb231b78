"""Gets reuse a read transaction while it holds the newest snapshot (kvlog.index.reads): they
still see every commit applied before they were called, by this process, by another thread,
or by another process sharing the cache, across map growth, close and fork."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import lmdb
import pytest

import kvlog
from kvlog.index.reads import _map_meta_pages
from tests.native import Native

pytestmark = pytest.mark.usefixtures("native")

REPO = Path(kvlog.__file__).resolve().parent.parent
QUIET = {"flush_interval_ms": 0, "background_compaction": False}


def _open(path: Path, **kwargs: object) -> kvlog.Store:
    return kvlog.open(str(path / "store"), cache_dir=str(path / "cache"), **{**QUIET, **kwargs})


def test_lmdb_txnid_is_the_newest_transaction_id(tmp_path: Path, native: Native) -> None:
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 22, writemap=True, metasync=False)
    try:
        mapped = _map_meta_pages(str(tmp_path / "env" / "data.mdb"))
        assert mapped is not None
        view, page = mapped
        for i in range(5):
            with env.begin() as txn:
                assert native.runs.lmdb_txnid(view, page) == txn.id()
            with env.begin(write=True) as txn:
                txn.put(b"k%d" % i, b"v")
        with pytest.raises(ValueError):
            native.runs.lmdb_txnid(view, 100)
        with pytest.raises(ValueError):
            native.runs.lmdb_txnid(b"\0" * 200, page)
        view.close()
    finally:
        env.close()


def test_a_file_that_is_not_lmdb_is_not_watched(tmp_path: Path) -> None:
    (tmp_path / "data.mdb").write_bytes(b"\1" * 16384)
    assert _map_meta_pages(str(tmp_path / "data.mdb")) is None
    assert _map_meta_pages(str(tmp_path / "missing.mdb")) is None


def test_gets_reuse_one_transaction_until_a_commit(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        store.put(b"a", b"1")
        store.flush()
        assert store.get(b"a") == b"1"
        pool = store.log.index._snaps
        assert len(pool) == 1
        first = pool[0]
        assert store.get(b"a") == b"1" and store.get(b"zz") is None
        assert pool == [first]  # the same transaction, reused
        store.put(b"a", b"2")
        store.flush()
        assert store.get(b"a") == b"2"
        assert pool and pool[0][0] > first[0]
        store.delete(b"a")
        store.flush()
        assert store.get(b"a") is None


def test_a_get_sees_a_commit_another_process_applied_to_the_shared_cache(tmp_path: Path) -> None:
    # refresh_interval_ms is long: only the shared cache can make the commit visible.
    with _open(tmp_path, refresh_interval_ms=600_000, producer_id=1) as store:
        store.put(b"mine", b"1")
        store.flush()
        assert store.get(b"theirs") is None and store.get(b"mine") == b"1"
        assert store.log.index._snaps  # a transaction pooled before the other process commits
        for n in range(3):
            code = (
                "import kvlog, sys\n"
                f"with kvlog.open({str(tmp_path / 'store')!r}, cache_dir={str(tmp_path / 'cache')!r}, "
                f"producer_id=2, flush_interval_ms=0, background_compaction=False) as s:\n"
                f"    s.put(b'theirs', b'{n}', sync=True)\n"
            )
            env = dict(os.environ, PYTHONPATH=str(REPO))
            subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
            assert store.get(b"theirs") == str(n).encode()
            assert store.get(b"mine") == b"1"


def test_gets_in_threads_see_every_commit_made_before_them(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        store.put(b"n", b"0")
        store.flush()
        committed = [0]
        errors: list[str] = []
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                floor = committed[0]
                value = store.get(b"n")
                if value is None or int(value) < floor:
                    errors.append(f"read {value!r} after commit {floor}")
                    return
                # Let the writer run: four readers spinning on the GIL stretch each flush by
                # many switch intervals, and the test by a minute, without reading more.
                time.sleep(0)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            for n in range(1, 60):
                store.put(b"n", str(n).encode())
                store.flush()
                committed[0] = n
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert errors == []
        assert store.get(b"n") == b"59"


def test_a_get_after_the_map_grew_reads_afresh(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        store.put(b"a", b"1")
        store.flush()
        assert store.get(b"a") == b"1"
        assert store.log.index._snaps
        store.log.env._grow()  # py-lmdb ends every transaction of the environment
        assert store.get(b"a") == b"1"
        store.put(b"a", b"2")
        store.flush()
        assert store.get(b"a") == b"2"


def test_close_ends_the_pooled_transactions(tmp_path: Path) -> None:
    store = _open(tmp_path)
    store.put(b"a", b"1")
    store.flush()
    assert store.get(b"a") == b"1"
    pool = store.log.index._snaps
    assert pool
    store.close()
    assert pool == []
    with pytest.raises(kvlog.StoreClosedError):
        store.get(b"a")
    with _open(tmp_path) as again:
        assert again.get(b"a") == b"1"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_never_uses_the_parents_transactions(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        store.put(b"a", b"1")
        store.flush()
        assert store.get(b"a") == b"1"
        pool = store.log.index._snaps
        parents = list(pool)
        assert parents
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the pool was set aside at fork, nothing of it is ended
            os.close(read)
            os.write(write, b"empty" if not pool else b"kept")
            os._exit(0)
        os.close(write)
        answer = os.read(read, 16)
        os.close(read)
        os.waitpid(pid, 0)
        assert answer == b"empty"
        assert pool == parents  # the parent's pool is untouched
        assert store.get(b"a") == b"1"
        store.put(b"a", b"2")
        store.flush()
        assert store.get(b"a") == b"2"


def test_pending_runs_are_read_through_the_pooled_transaction(tmp_path: Path) -> None:
    with _open(tmp_path, index_run_limit=64) as store:
        for i in range(50):
            store.put(b"k%03d" % i, b"v%d" % i)
        store.flush()
        store.log.settle_index()
        store.put(b"k001", b"new")
        store.delete(b"k002")
        store.flush()
        store.put(b"k003", b"newer")
        store.flush()
        for _ in range(2):  # the second round reuses the pooled transaction and its runs
            assert store.get(b"k001") == b"new"
            assert store.get(b"k002") is None
            assert store.get(b"k003") == b"newer"
            assert store.get(b"k004") == b"v4"
            assert store.get(b"nope") is None
        assert store.log.index._snaps[0][2]  # the pooled snapshot holds the runs
