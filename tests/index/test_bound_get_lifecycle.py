"""The bound ``get`` of a store (``_runs.StoreGet``) over a store's life: what introspection reads
of it, a copy of the store, a dropped store (the cycle store -> get -> store is collected and its
cache released), a read-only store, an AsyncStore, the map resized and the store closed by other
threads while gets run, in C and in the pure-Python twin."""

from __future__ import annotations

import asyncio
import copy
import gc
import inspect
import os
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from types import MethodType
from typing import Any

import pytest

import kvlog
import kvlog.aio
from kvlog.errors import StoreClosedError
from kvlog.meta import env as meta_env
from kvlog.store import Store
from tests.native import Native

pytestmark = pytest.mark.usefixtures("native")

REPO = Path(kvlog.__file__).resolve().parent.parent
QUIET = {"flush_interval_ms": 0, "background_compaction": False}


def _open(path: Path, **kwargs: Any) -> kvlog.Store:
    return kvlog.open(str(path / "store"), cache_dir=str(path / "cache"), **{**QUIET, **kwargs})


def test_introspection_reads_the_stores_get(tmp_path: Path, native: Native) -> None:
    with _open(tmp_path) as store:
        get = store.get
        assert type(get) is native.runs.StoreGet
        assert get.__name__ == "get" and get.__qualname__ == "Store.get"
        assert get.__doc__ == Store.get.__doc__
        assert get.__self__ is store
        assert inspect.signature(get) == inspect.signature(MethodType(Store.get, store))
        assert inspect.unwrap(get)(b"missing", 3) == 3


def test_a_copy_reads_its_own_state(tmp_path: Path) -> None:
    store = _open(tmp_path)
    store.put(b"a", b"1")
    store.flush()
    twin = copy.copy(store)
    assert twin.get(b"a") == b"1"
    twin.close()  # closes the log both share
    with pytest.raises(StoreClosedError, match="the store is closed"):
        twin.get(b"a")
    with pytest.raises(kvlog.KvlogError):  # its own state says open: its closed log refuses
        store.get(b"a")
    store.close(flush=False)


def test_a_closed_dropped_store_is_freed_and_its_cache_released(tmp_path: Path) -> None:
    store = _open(tmp_path)
    store.put(b"a", b"1")
    store.flush()
    assert store.get(b"a") == b"1"
    cache = str(store.log.env.path)
    assert cache in meta_env._registry
    store.close()
    assert cache not in meta_env._registry
    ref = weakref.ref(store)
    log_ref = weakref.ref(store.log)
    del store
    gc.collect()
    assert ref() is None and log_ref() is None


def test_the_get_alone_keeps_its_store(tmp_path: Path) -> None:
    store = _open(tmp_path)
    store.put(b"a", b"1")
    store.flush()
    get = store.get
    ref = weakref.ref(store)
    del store
    gc.collect()
    assert ref() is not None
    assert get(b"a") == b"1" and get(b"b", 0) == 0
    owner = ref()
    assert owner is not None
    owner.close()
    del owner
    with pytest.raises(StoreClosedError):
        get(b"a")
    del get
    gc.collect()
    assert ref() is None


def test_a_read_only_store(tmp_path: Path) -> None:
    with _open(tmp_path) as writer:
        writer.put(b"a", b"1")
        writer.put(b"big", b"b" * 5000)
        writer.flush()
    with kvlog.open(str(tmp_path / "store"), cache_dir=str(tmp_path / "ro"), read_only=True, **QUIET) as store:
        for _ in range(2):
            for args in ((b"a",), (b"big",), (b"none",), (b"none", 5), ("a",)):
                assert store.get(*args) == Store.get(store, *args)
        assert store.get(b"a") == b"1" and store.get(b"big") == b"b" * 5000


def test_an_async_store_reads_through_it(tmp_path: Path) -> None:
    async def main() -> list[Any]:
        async with await kvlog.aio.open(str(tmp_path / "store"), cache_dir=str(tmp_path / "cache"), **QUIET) as s:
            await s.put(b"a", b"1")
            await s.flush()
            return [await s.get(b"a"), await s.get(b"b", 7), await s.get("a")]

    assert asyncio.run(main()) == [b"1", 7, b"1"]


def test_gets_while_another_thread_resizes_the_map(tmp_path: Path) -> None:
    big = b"v" * 300
    with _open(tmp_path, inline_value_bytes=64) as store:
        expected = {b"k%04d" % i: (b"%d" % i if i % 2 else big + b"%d" % i) for i in range(400)}
        for key, value in expected.items():
            store.put(key, value)
        store.flush()
        store.log.index.settle()
        stop = threading.Event()
        wrong: list[Any] = []

        def reader() -> None:
            while not stop.is_set():
                for key, value in expected.items():
                    got = store.get(key)
                    if got != value:
                        wrong.append((key, got))
                        return

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for _ in range(6):
                store.log.env._grow()
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert wrong == []
        assert all(store.get(k) == v for k, v in expected.items())


CLOSE_UNDER_GETS = r"""
import sys, threading, kvlog
store = kvlog.open(sys.argv[1], cache_dir=sys.argv[2], flush_interval_ms=0, background_compaction=False,
                   inline_value_bytes=64, index_run_limit=8)
for r in range(4):  # runs left pending: gets read them from the map
    for i in range(100):
        store.put(b"k%04d" % i, (b"x" * 200 if i % 3 == 0 else b"") + b"%d-%d" % (r, i))
    store.flush()
results, errors = [], []
go = threading.Event()
def reader():
    go.wait()
    while True:
        try:
            for i in range(100):
                v = store.get(b"k%04d" % i)
                assert v is not None and v.endswith(b"3-%d" % i), v
            results.append(1)
        except kvlog.KvlogError as e:
            errors.append(type(e).__name__)
            return
threads = [threading.Thread(target=reader) for _ in range(4)]
for t in threads:
    t.start()
go.set()
while len(results) < 20:
    pass
store.close()
for t in threads:
    t.join(60)
assert not any(t.is_alive() for t in threads)
assert len(errors) == 4, errors
print("ok", sorted(set(errors)))
"""


@pytest.mark.parametrize("round_", range(3))
def test_closed_by_another_thread_under_gets(tmp_path: Path, native: Native, round_: int) -> None:
    """Four threads read (values inline, in data files, in pending index runs) while the main
    thread closes the store: each get answers right or raises a kvlog error, and the process
    does not crash (run in a child process, which is killed by a fault rather than this one)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if native.name == "python":
        env["KVLOG_PURE_PYTHON"] = "1"
    done = subprocess.run([sys.executable, "-c", CLOSE_UNDER_GETS, str(tmp_path / "store"), str(tmp_path / "cache")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok"), done.stdout
