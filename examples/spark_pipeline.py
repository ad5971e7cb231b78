"""A Spark pipeline over a kvlog store: write with kvlog, read both views, materialize, compact.

1. An application writes orders with :func:`kvlog.open` (puts, some deletes, several flushes).
2. Spark reads the log (``view=log``: every record with its partition and offset) and the
   current state (``view=latest``: one row per live key); both are checked against the store.
3. The latest state is written as a Parquet table and read back with plain Spark.
4. An exact compaction runs on Spark; afterwards the log holds one record per key (the
   latest, tombstones included), the surviving offsets are the ones the latest state named,
   and the state read by kvlog and by Spark is unchanged.

Run it as a script (it starts a local Spark session, which takes a while on a small
machine), or call :func:`main` with a Spark session of your own::

    python examples/spark_pipeline.py
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from typing import Any

import pyarrow.parquet as pq

import kvlog

ORDERS = 3000
KEYS = 400


def write_orders(path: str) -> dict[bytes, bytes]:
    """Write ORDERS updates over KEYS orders (every eleventh one a delete); return the state."""
    rng = random.Random(11)
    state: dict[bytes, bytes] = {}
    with kvlog.open(path, partitions=4, background_compaction=False) as store:
        for i in range(ORDERS):
            key = f"order:{rng.randrange(KEYS):04d}".encode()
            if i % 11 == 10:
                store.delete(key)
                state.pop(key, None)
            else:
                value = f"status {i % 5} at {i}".encode()
                store.put(key, value)
                state[key] = value
            if i % 700 == 699:
                store.flush()
    return state


def check(condition: bool, what: str) -> None:
    """Stop the program with ``what`` when ``condition`` does not hold."""
    if not condition:
        sys.exit(f"spark pipeline: FAILED: {what}")
    print(f"  ok: {what}")


def main(spark: Any, workdir: str) -> None:
    """Run the pipeline on ``spark`` with its files under ``workdir``."""
    import spark_ext

    spark_ext.register(spark)
    path = os.path.join(workdir, "orders")
    state = write_orders(path)
    with kvlog.open(path, read_only=True) as store:
        changes = [(r.partition, r.offset, r.key, r.value) for r in store.changes()]
    print(f"wrote {ORDERS} updates: {len(state)} live orders, {len(changes)} records in the log")

    log = spark.read.format("kvlog").load(path)
    rows = log.select("partition", "offset", "key", "value").orderBy("partition", "offset").collect()
    check([(r.partition, r.offset, bytes(r.key), None if r.value is None else bytes(r.value)) for r in rows]
          == changes, "view=log holds every record of the changelog, at its partition and offset")

    latest = spark.read.format("kvlog").option("view", "latest").load(path)
    latest_rows = latest.select("key", "value", "partition", "offset").collect()
    check({bytes(r.key): bytes(r.value) for r in latest_rows} == state, "view=latest equals the state")

    out = os.path.join(workdir, "orders-latest")
    result = spark_ext.materialize(spark, path, out)
    table = pq.read_table(out, columns=["key", "value"]).to_pylist()  # any Parquet reader will do
    check(result["rows"] == len(state) and {row["key"]: row["value"] for row in table} == state,
          f"the Parquet table at {out} has the {result['rows']} live orders")

    report = spark_ext.compact(spark, path, force=True)
    print(f"compaction on Spark removed {report.records_removed} superseded records")
    with kvlog.open(path, read_only=True) as store:
        survivors = {(r.partition, r.offset): r.key for r in store.changes()}
        after = dict(store.items())
    keys = {key for _p, _o, key, _v in changes}
    check(sorted(survivors.values()) == sorted(keys) and not report.refused, "the log holds one record per key")
    check({(r.partition, r.offset) for r in latest_rows} <= set(survivors),
          "every live order kept its offset through compaction")
    again = spark.read.format("kvlog").option("view", "latest").load(path).select("key", "value").collect()
    check(after == state == {bytes(r.key): bytes(r.value) for r in again},
          "kvlog and Spark read the same state after compaction")
    print("spark pipeline: done")


if __name__ == "__main__":
    import spark_ext

    spark = spark_ext.get_session("local[2]", app_name="spark-pipeline")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            main(spark, tmp)
    finally:
        spark.stop()
