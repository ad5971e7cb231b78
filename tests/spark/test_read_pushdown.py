"""Pushdown prunes what the executors read, and never changes an answer.

The reads are counted where they happen: a data source whose reader hands its
tasks the real storage wrapped in a counter that appends each GET (path and
bytes) to a file, from the executors' Python workers.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSourceReader
from pyspark.sql.types import StructType

import spark_ext
from kvlog.log.records import partition_for_key
from kvlog.storage import Storage
from spark_ext.datasource import KvlogDataSource
from spark_ext.plain_source import PUSHDOWN_CONF
from spark_ext.reader import KvlogReader

pytestmark = [pytest.mark.spark, pytest.mark.slow]

LOG_COLUMNS = ["partition", "offset", "timestamp", "key", "value"]
# The classes below travel to the executors by value: this module is not importable there.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class CountingStorage:
    """The real storage, with every read appended to ``log`` as ``path bytes``."""

    def __init__(self, inner: Storage, log: str) -> None:
        self.inner = inner
        self.log = log

    def _note(self, path: str, n: int) -> None:
        with open(self.log, "a") as f:
            f.write(f"{path} {n}\n")

    def read(self, path: str) -> bytes:
        data = self.inner.read(path)
        self._note(path, len(data))
        return data

    def read_range(self, path: str, start: int, length: int) -> bytes:
        data = self.inner.read_range(path, start, length)
        self._note(path, len(data))
        return data

    def close(self) -> None:
        self.inner.close()


class CountingReader(KvlogReader):
    log = ""

    def open_storage(self) -> Any:
        return CountingStorage(super().open_storage(), self.log)


def counting_source(log: Path) -> type[KvlogDataSource]:
    class CountingSource(KvlogDataSource):
        @classmethod
        def name(cls) -> str:
            return "kvlog_counted"

        def reader(self, schema: StructType) -> DataSourceReader:
            r = CountingReader(dict(self.options), self._view(), self._internal())
            r.log = str(log)
            return r

    return CountingSource


def reads(log: Path) -> tuple[int, int, int]:
    """(files opened, GETs, bytes) since the log was last emptied; empties it."""
    lines = log.read_text().split("\n")[:-1] if log.exists() else []
    log.write_text("")
    return len({line.split()[0] for line in lines}), len(lines), sum(int(line.split()[1]) for line in lines)


def build(kv: Any, path: str) -> list[tuple[Any, ...]]:
    """A store whose flushes each hold one partition's keys, so data files are per partition."""
    with kv.open_store(path) as store:
        keys = [b"key-%03d" % i for i in range(80)]
        by_partition = {p: [k for k in keys if partition_for_key(k, 4) == p] for p in range(4)}
        for round_ in range(5):
            for ks in by_partition.values():
                for k in ks:
                    store.put(k, b"v%d-" % round_ + k)
                store.flush()
        return kv.log_rows(store)


def test_filters_prune_the_files_read_and_leave_the_answer(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    everything = build(kv, path)
    log = tmp_path / "reads.log"
    spark.dataSource.register(counting_source(log))

    def run(condition: Any, view: str = "log") -> tuple[list[tuple[Any, ...]], tuple[int, int, int]]:
        df = spark.read.format("kvlog_counted").option("view", view).load(path).where(condition)
        columns = LOG_COLUMNS if view == "log" else ["key", "value", "partition", "offset"]
        rows = sorted(kv.table_rows(df.toArrow(), columns))
        return rows, reads(log)

    rows, full = run(F.lit(True))
    assert rows == sorted(everything) and full[0] == 20
    key = b"key-007"
    home = partition_for_key(key, 4)
    cases = {
        "partition = 2": (F.col("partition") == 2, lambda r: r[0] == 2),
        "partition IN (0, 3)": (F.col("partition").isin(0, 3), lambda r: r[0] in (0, 3)),
        "offset < 20": (F.col("offset") < 20, lambda r: r[1] < 20),
        "key = key-007": (F.col("key") == F.lit(key), lambda r: r[3] == key),
        "key IN": (F.col("key").isin(key, b"key-008") & (F.col("partition") >= home),
                   lambda r: r[3] in (key, b"key-008") and r[0] >= home),
    }
    for name, (condition, keep) in cases.items():
        rows, counted = run(condition)
        assert rows == sorted(r for r in everything if keep(r)), name
        assert counted[0] < full[0] and counted[2] < full[2], (name, counted, full)
    # Key ranges are applied in the tasks: the same files, fewer rows reach Spark, same answer.
    rows, counted = run(F.col("key") >= F.lit(b"key-070"))
    assert rows == sorted(r for r in everything if r[3] >= b"key-070") and counted[0] == full[0]
    # The latest view prunes partitions, and keys by their partition.
    with kv.open_store(path, read_only=True) as store:
        latest = {k: v for k, v in store.items()}
    rows, latest_full = run(F.lit(True), "latest")
    assert {r[0]: r[1] for r in rows} == latest
    rows, counted = run(F.col("key") == F.lit(key), "latest")
    assert [(r[0], r[1], r[2]) for r in rows] == [(key, latest[key], home)]
    assert counted[0] == latest_full[0] // 4 and counted[1] < latest_full[1]


def test_register_respects_a_session_whose_user_turned_pushdown_off(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    everything = build(kv, path)
    assert spark.conf.get(PUSHDOWN_CONF) == "true"
    spark.conf.set(PUSHDOWN_CONF, "false")
    try:
        spark_ext.register(spark)
        assert spark.conf.get(PUSHDOWN_CONF) == "false"  # the user's setting stays
        df = spark.read.format("kvlog").option("startingOffsets", '{"1": 10}').load(path).where("partition = 1")
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert "(partition#" in plan and " = 1)" in plan, plan  # Spark applies the filter itself
        rows = sorted(kv.table_rows(df.toArrow(), LOG_COLUMNS))
        assert rows == sorted(r for r in everything if r[0] == 1 and r[1] >= 10)
    finally:
        spark.conf.set(PUSHDOWN_CONF, "true")
        spark_ext.register(spark)
    pushed = spark.read.format("kvlog").load(path).where("partition = 1")
    assert " = 1)" not in pushed._jdf.queryExecution().executedPlan().toString()

