"""A Spark batch read while another process compacts and collects: the read's lease.

The read's tasks open their storage through :class:`BarrierReader`: before their first read of
a data file they mark that they started and wait for a barrier file the test creates. So the
driver has planned (and leased the files it listed) and no task has read a file yet when
another real process overwrites every key, compacts and runs GC with a 1 s delete delay (its
clock moved past it). Then the barrier opens and the tasks read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql.datasource import DataSourceReader
from pyspark.sql.types import StructType

import kvlog
from kvlog.storage.base import Storage
from spark_ext.datasource import KvlogDataSource
from spark_ext.reader import KvlogReader

pytestmark = pytest.mark.spark
# The classes below travel to the executors by value: this module is not importable there.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(kvlog.__file__).resolve().parent.parent
COMPACT_GC = REPO / "tests" / "store" / "compact_gc_proc.py"
PAD = "x" * 1100
#: How long a task waits for the barrier at most (the test opens it far sooner).
BARRIER_WAIT_S = 300.0


class BarrierStorage:
    """The real storage; the first read marks ``started`` and waits for ``barrier``."""

    def __init__(self, inner: Storage, started: str, barrier: str) -> None:
        self.inner = inner
        self.started = started
        self.barrier = barrier
        self.waited = False

    def _wait(self) -> None:
        if self.waited:
            return
        self.waited = True
        Path(self.started).touch()
        deadline = time.monotonic() + BARRIER_WAIT_S
        while not Path(self.barrier).exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def read(self, path: str) -> bytes:
        self._wait()
        return self.inner.read(path)

    def read_range(self, path: str, start: int, length: int) -> bytes:
        self._wait()
        return self.inner.read_range(path, start, length)

    def close(self) -> None:
        self.inner.close()


class BarrierReader(KvlogReader):
    started = ""
    barrier = ""

    def open_storage(self) -> Any:
        return BarrierStorage(super().open_storage(), self.started, self.barrier)


def barrier_source(started: Path, barrier: Path) -> type[KvlogDataSource]:
    class BarrierSource(KvlogDataSource):
        @classmethod
        def name(cls) -> str:
            return "kvlog_barrier"

        def reader(self, schema: StructType) -> DataSourceReader:
            r = BarrierReader(dict(self.options), self._view(), self._internal())
            r.started, r.barrier = str(started), str(barrier)
            return r

    return BarrierSource


def _build(path: str) -> tuple[list[str], dict[bytes, bytes]]:
    names = [f"k{i:03d}" for i in range(40)]
    # data files of their own: GC deletes the replaced ones from under the read
    with kvlog.open(path, partitions=2, flush_interval_ms=0, background_compaction=False,
                    commit_inline_bytes=0) as store:
        for n, key in enumerate(names):
            store.put(key, f"old-{key}|{PAD}")
            if n % 10 == 9:
                store.flush()
        return names, dict(store.scan())


def _compact_and_collect(path: str, cache: Path, names: list[str]) -> dict[str, int]:
    spec = {"uri": path, "storage_options": None, "cache_dir": str(cache), "keys": names,
            # its flush in a data file of its own: GC deletes it once compacted, whatever the read leased
            "settings": {"file_delete_delay_ms": 1000, "background_compaction": False, "commit_inline_bytes": 0}}
    env = {**os.environ, "KVLOG_TEST_SPEC": json.dumps(spec),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, str(COMPACT_GC)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    counts: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
    return counts


def _read_during_compaction(spark: Any, tmp_path: Path, options: dict[str, str]) -> tuple[Any, Any, list[str]]:
    """Run a read of ``options``; compact and collect in another process once its tasks wait;
    return (the rows or None, the read's error or None, the store's keys)."""
    path = str(tmp_path / "store")
    names, _state = _build(path)
    started, barrier = tmp_path / "started", tmp_path / "barrier"
    spark.dataSource.register(barrier_source(started, barrier))
    out: dict[str, Any] = {}

    def read() -> None:
        reader = spark.read.format("kvlog_barrier")
        for key, value in options.items():
            reader = reader.option(key, value)
        try:
            out["rows"] = reader.load(path).collect()
        except Exception as e:  # noqa: BLE001 - handed to the test thread
            out["error"] = e

    thread = threading.Thread(target=read)
    thread.start()
    try:
        while not started.exists() and thread.is_alive():  # planned; a task waits at the barrier
            time.sleep(0.02)
        assert started.exists(), out
        counts = _compact_and_collect(path, tmp_path / "other-cache", names)
        assert counts["replaced"] > 0
    finally:
        barrier.touch()
        thread.join()
    return out.get("rows"), out.get("error"), names


@pytest.mark.parametrize("view", ["latest", "log"])
def test_a_read_keeps_its_files_while_another_process_compacts_and_collects(
        spark: Any, tmp_path: Path, view: str) -> None:
    path = str(tmp_path / "store")
    rows, error, names = _read_during_compaction(spark, tmp_path, {"view": view})
    assert error is None, error
    # The read answers at the version it planned: the values before the other process's writes.
    assert sorted((bytes(r["key"]), bytes(r["value"])) for r in rows) == sorted(
        (k.encode(), f"old-{k}|{PAD}".encode()) for k in names)
    # Its lease expires in an hour: the files stay, and once released GC takes them.
    with kvlog.open(path, background_compaction=False) as store:
        assert store.checkpoints() == []


def test_a_read_whose_lease_expired_says_what_to_set(spark: Any, tmp_path: Path) -> None:
    _rows, error, _names = _read_during_compaction(spark, tmp_path, {"view": "latest", "lease_ms": "1"})
    assert error is not None and "data file is missing" in str(error)
    assert "lease (option lease_ms=1) expired" in str(error) and "set a larger lease_ms" in str(error)


def test_a_read_without_a_lease_says_what_to_set(spark: Any, tmp_path: Path) -> None:
    _rows, error, _names = _read_during_compaction(spark, tmp_path, {"view": "log", "lease_ms": "0"})
    assert error is not None and "data file is missing" in str(error)
    assert "no lease (option lease_ms=0)" in str(error)
