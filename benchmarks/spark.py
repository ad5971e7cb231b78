"""Spark benchmarks: exact compaction at scale, materialization, and the data source's read rate.

Each figure sits next to an anchor measured in the same run and is reported
as a ratio (the shape of :mod:`benchmarks.compaction`'s entries):

``spark.compact`` / ``spark.compact_memory`` (a)
    ``spark_ext.compact(force=True)`` of a store of R records over K distinct
    keys (every key at least once, the rest drawn uniformly; 16-byte keys,
    100-byte values, 8 partitions) against the hand-written Spark dedup of the
    same records in Parquet (``row_number`` over (partition, key) by offset
    descending, written as Parquet), alternating run by run, each kvlog run on
    a fresh copy of the store (:mod:`benchmarks.spark_compact`). Exact: the
    survivors equal the hand-written job's. Memory: the peak of ``RssAnon``
    summed over this process and every descendant (the driver JVM, which is
    also the executor in local mode, and the Python workers), sampled every
    0.5 s, against the same peak during the hand-written job.
``spark.materialize`` (b)
    ``spark_ext.materialize`` of a store of M records over N keys against the
    best of three hand-written Spark SQL pipelines over the same records
    already in Parquet (the log view written with ``df.write.parquet`` first,
    not timed): window ``row_number`` over key ordered by offset desc,
    ``max_by(struct, offset)`` per key, and ``max(struct(offset, ...))`` per
    key, each dropping tombstones and writing Parquet, interleaved with kvlog.
``spark.read`` (c)
    rows per second of ``spark.read.format("kvlog")`` (view=log) written to
    Spark's ``noop`` sink (every column materialized) against
    ``spark.read.parquet`` of the same rows to the same sink.

Stores are loaded with :func:`benchmarks.compaction.bulk_load` (what the
flusher would write, from numpy buffers) through a metadata-only log (no key
index: nothing here reads through one). Run ``python -m benchmarks.spark
[--quick | --mid] [--out-dir DIR]``; :func:`run_spark_benchmarks` is the entry point.
This module imports pyspark and ``spark_ext`` only inside functions, so
importing it costs nothing (kvlog itself never imports them).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

import kvlog
from benchmarks.compaction import bulk_load, live_files, loadavg, measure, partition_table
from benchmarks.compaction import make_entry as compaction_entry
from benchmarks.machine import machine_info
from benchmarks.report import save_results, text_table
from kvlog.log import open_log

__all__ = ["Sizes", "FULL", "MID", "QUICK", "TINY", "SCHEMA", "run_spark_benchmarks", "format_table", "main"]

SCHEMA = "kvlog-bench-spark/1"
MiB = 1024 * 1024
#: (b): materialize in at most this many times the best hand-written Spark SQL pipeline's time.
MATERIALIZE_LIMIT = 0.5
RSS_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Sizes:
    """The sizes of one run."""

    mode: str
    compact_records: int
    """(a) records of the store compacted on Spark."""
    compact_keys: int
    """(a) distinct keys among them."""
    materialize_records: int
    """(b) and (c) records of the store materialized and read."""
    materialize_keys: int
    value_bytes: int = 100
    partitions: int = 8
    records_per_file: int = 500_000
    repeats: int = 3
    """Runs of each figure of (b) and (c)."""
    compact_repeats: int = 3
    """Runs of (a), each on a fresh copy of the store."""
    master: str = "local[2]"
    shuffle_partitions: int = 16
    driver_memory: str = "6g"
    seed: int = 0


FULL = Sizes("full", compact_records=20_000_000, compact_keys=10_000_000, materialize_records=5_000_000,
             materialize_keys=1_000_000)
MID = Sizes("mid", compact_records=2_000_000, compact_keys=1_000_000, materialize_records=2_000_000,
            materialize_keys=1_000_000, shuffle_partitions=8)
QUICK = Sizes("quick", compact_records=400_000, compact_keys=200_000, materialize_records=200_000,
              materialize_keys=40_000, records_per_file=50_000, shuffle_partitions=4)
TINY = Sizes("tiny", compact_records=20_000, compact_keys=10_000, materialize_records=20_000,
             materialize_keys=4_000, records_per_file=5_000, shuffle_partitions=4, repeats=1, compact_repeats=1)

METHOD = (
    "Durations from time.perf_counter around the Spark call alone (the Spark session is started and "
    "warmed by a small job first). Keys are 16 bytes (SplitMix64 of the key index, as in the "
    "compaction benchmarks), values `value_bytes` random bytes; the key indices are a permutation "
    "of all K keys followed by R-K uniform draws, shuffled, so every key occurs and K survive. "
    "Stores are on the local disk of the work directory. (a)'s memory is the peak of RssAnon "
    "summed over this process and all its descendants, sampled every 0.5 s, minus that sum just "
    "before the call; RssAnon leaves out memory-mapped and page-cache pages. Spark runs in local "
    "mode in this process (`master`), `shuffle_partitions` shuffle partitions, driver memory "
    "`driver_memory` (unless a Spark session was given). The machine may be shared: the load average "
    "before and after each benchmark is recorded (`loadavg`)."
)


# -- helpers -----------------------------------------------------------------------------------

def make_entry(bench_id: str, title: str, method: str, subject: dict[str, Any], anchors: list[dict[str, Any]],
           *, higher_is_better: bool, seconds: float, target: dict[str, Any] | None = None,
           **extra: Any) -> dict[str, Any]:
    return compaction_entry(bench_id, title, method, subject, anchors, higher_is_better=higher_is_better,
                            seconds=seconds, target=target, group="spark", **extra)


def _failed(bench_id: str, title: str, status: str, reason: str) -> dict[str, Any]:
    return {"id": bench_id, "group": "spark", "title": title, "status": status, "reason": reason,
            "subject": None, "anchors": [], "ratios": {}}


def _tree_rss_kib(root: int) -> int:
    """RssAnon (KiB) of ``root`` and all its descendants."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("PPid:"):
                        parents[pid] = int(line.split()[1])
                    elif line.startswith("RssAnon:"):
                        rss[pid] = int(line.split()[1])
        except OSError:
            continue
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, ()))
    return total


class TreeRssSampler:
    """Samples the process tree's RssAnon in a thread; ``peak_kib`` after :meth:`stop`."""

    def __init__(self, interval_s: float = RSS_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.samples = 0
        self.peak_kib = 0
        self._root = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-rss", daemon=True)

    def sample(self) -> int:
        value = _tree_rss_kib(self._root)
        self.samples += 1
        self.peak_kib = max(self.peak_kib, value)
        return value

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> TreeRssSampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.sample()
        return self.peak_kib


def _key_indices(records: int, keys: int, seed: int) -> np.ndarray:
    """Every key index once, then uniform draws; shuffled."""
    rng = np.random.default_rng([seed, records, keys])
    out = np.concatenate([np.arange(keys, dtype=np.uint64),
                          rng.integers(0, keys, size=records - keys, dtype=np.uint64)])
    rng.shuffle(out)
    return out


def load_store(path: Path, records: int, keys: int, sizes: Sizes) -> dict[str, Any]:
    """A store at ``path`` of ``records`` records over ``keys`` keys; returns what was loaded."""
    if records < keys:
        raise ValueError("records must be at least keys")
    began = perf_counter()
    indices = _key_indices(records, keys, sizes.seed)
    partition_of = partition_table(keys, sizes.partitions, sizes.seed)
    # A metadata-only log: nothing here reads through the key index, and loading one of
    # 10 M keys would dominate the load.
    the_log = open_log(str(path), partitions=sizes.partitions, maintain_index=False)
    try:
        loaded = bulk_load(the_log, indices, sizes.records_per_file, seed=sizes.seed,
                           value_bytes=sizes.value_bytes, partition_of=partition_of)
        files = [path / entry.path for entry in live_files(the_log)]
        compression = the_log.config.compression
    finally:
        the_log.close()
    loaded.update(keys=keys, data_bytes=sum(p.stat().st_size for p in files), inputs=[str(p) for p in files],
                  compression=compression, load_s=perf_counter() - began)
    return loaded


def _live_paths(path: Path) -> list[Path]:
    the_log = open_log(str(path), create=False, read_only=True, maintain_index=False)
    try:
        return [path / entry.path for entry in live_files(the_log)]
    finally:
        the_log.close()


def _session(sizes: Sizes) -> Any:
    import spark_ext

    spark = spark_ext.get_session(sizes.master, app_name="kvlog-bench-spark", **{
        "spark.sql.shuffle.partitions": str(sizes.shuffle_partitions),
        "spark.driver.memory": sizes.driver_memory,
    })
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _warm_up(spark: Any, work: Path) -> float:
    """One tiny read through the data source, so no figure pays for starting Python workers."""
    import spark_ext

    path = work / "warm-up"
    load_store(path, 1000, 500, replace(TINY, records_per_file=1000))
    spark_ext.register(spark)
    t0 = perf_counter()
    spark.read.format("kvlog").load(str(path)).write.format("noop").mode("overwrite").save()
    shutil.rmtree(path, ignore_errors=True)
    return perf_counter() - t0


# -- (a) exact compaction at scale ---------------------------------------------------------------

def check_exact(spark: Any, uri: str) -> dict[str, int]:
    """Rows, distinct (partition, key) and the largest count of one (partition, key) among survivors."""
    from pyspark.sql import functions as F

    df = spark.read.format("kvlog").load(uri)
    row = (df.groupBy("partition", "key").agg(F.count(F.lit(1)).alias("n"))
           .agg(F.count(F.lit(1)).alias("keys"), F.sum("n").alias("rows"), F.max("n").alias("max_n"))
           .collect()[0])
    return {"rows": int(row["rows"] or 0), "keys": int(row["keys"] or 0), "max_n": int(row["max_n"] or 0)}


# -- (b) materialization and (c) the read rate ---------------------------------------------------

def _sql_pipelines(spark: Any) -> dict[str, Callable[[Any], Any]]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    columns = ["key", "value", "partition", "offset", "timestamp"]

    def row_number(df: Any) -> Any:
        w = Window.partitionBy("key").orderBy(F.col("offset").desc())
        return (df.withColumn("rn", F.row_number().over(w)).where("rn = 1 AND NOT is_tombstone")
                .select(*columns))

    def max_by(df: Any) -> Any:
        latest = F.max_by(F.struct("value", "partition", "offset", "timestamp", "is_tombstone"), "offset")
        return (df.groupBy("key").agg(latest.alias("r")).where("NOT r.is_tombstone")
                .select("key", "r.value", "r.partition", "r.offset", "r.timestamp"))

    def max_struct(df: Any) -> Any:
        latest = F.max(F.struct("offset", "value", "partition", "timestamp", "is_tombstone"))
        return (df.groupBy("key").agg(latest.alias("r")).where("NOT r.is_tombstone")
                .select("key", "r.value", "r.partition", "r.offset", "r.timestamp"))

    return {"window_row_number": row_number, "max_by": max_by, "max_struct": max_struct}


def bench_materialize_and_read(spark: Any, sizes: Sizes, work: Path) -> list[dict[str, Any]]:
    import spark_ext

    began = perf_counter()
    load = [loadavg()]
    path = work / "materialize"
    n, keys = sizes.materialize_records, sizes.materialize_keys
    loaded = load_store(path, n, keys, sizes)
    uri = str(path)
    log_parquet = str(work / "log.parquet")
    t0 = perf_counter()
    spark.read.format("kvlog").load(uri).write.mode("overwrite").parquet(log_parquet)
    to_parquet_s = perf_counter() - t0

    # Interleaved: each repeat runs kvlog, then each hand-written pipeline, so drifting load
    # hits them all.
    subject_runs: list[float] = []
    pipelines = _sql_pipelines(spark)
    anchor_runs: dict[str, list[float]] = {name: [] for name in pipelines}
    rows = 0
    counts = {}
    for r in range(sizes.repeats):
        out = str(work / f"materialized-{r}")
        t0 = perf_counter()
        rows = spark_ext.materialize(spark, uri, out)["rows"]
        subject_runs.append(perf_counter() - t0)
        shutil.rmtree(out, ignore_errors=True)
        for name, pipeline in pipelines.items():
            out = str(work / f"{name}-{r}")
            t0 = perf_counter()
            pipeline(spark.read.parquet(log_parquet)).write.mode("overwrite").parquet(out)
            anchor_runs[name].append(perf_counter() - t0)
            if r == 0:
                counts[name] = spark.read.parquet(out).count()
            shutil.rmtree(out, ignore_errors=True)
    anchors = [measure(name, f"Spark SQL {name} over Parquet + write", "s", runs)
               for name, runs in anchor_runs.items()]
    paired = [subject_runs[r] / min(runs[r] for runs in anchor_runs.values()) for r in range(sizes.repeats)]
    best = min(anchors, key=lambda a: a["value"])
    correct = bool(rows == keys and all(c == keys for c in counts.values()))
    subject = measure("kvlog", "spark_ext.materialize", "s", subject_runs, rows=rows)
    ratio = subject["value"] / best["value"]
    load.append(loadavg())
    materialize_entry = make_entry(
        "spark.materialize", f"materialize {n:,} records over {keys:,} keys", (
            f"spark_ext.materialize (view=latest read, Parquet write, and its row count) of a "
            f"{sizes.partitions}-partition store of {n:,} records over {keys:,} keys, median of "
            f"{sizes.repeats}. Anchors: hand-written Spark SQL pipelines over the same records as "
            f"Parquet (the log view written once beforehand, {to_parquet_s:.1f} s, not counted), each "
            "deduplicating by key, dropping tombstones and writing Parquet, interleaved with kvlog "
            "repeat by repeat; the limit compares with the best of them (paired_ratios: each "
            "repeat's kvlog time over that repeat's best pipeline)."),
        subject, anchors, higher_is_better=False, seconds=perf_counter() - began,
        target={"text": f"at most {MATERIALIZE_LIMIT}x the best hand-written pipeline ({best['key']})",
              "value": ratio, "met": bool(ratio <= MATERIALIZE_LIMIT and correct)},
        paired_ratios=paired, ratio_range=[min(paired), max(paired)], limit=MATERIALIZE_LIMIT,
        rows=rows, anchor_rows=counts, correct=correct, log_to_parquet_s=to_parquet_s,
        files=loaded["files"], data_bytes=loaded["data_bytes"], loadavg=load,
    )

    began = perf_counter()
    read_runs, parquet_runs = [], []
    for _r in range(sizes.repeats):
        t0 = perf_counter()
        spark.read.format("kvlog").load(uri).write.format("noop").mode("overwrite").save()
        read_runs.append(n / (perf_counter() - t0))
        t0 = perf_counter()
        spark.read.parquet(log_parquet).write.format("noop").mode("overwrite").save()
        parquet_runs.append(n / (perf_counter() - t0))
    read_entry = make_entry(
        "spark.read", f"data source read rate, view=log, {n:,} rows", (
            f"Rows per second of spark.read.format('kvlog').load(uri) (view=log, all six columns) "
            f"written to Spark's noop sink, median of {sizes.repeats}; anchor: spark.read.parquet of "
            "the same rows (the log view written as Parquet) to the same sink, interleaved run by run."),
        measure("kvlog", "kvlog data source, view=log", "rows/s", read_runs),
        [measure("parquet", "spark.read.parquet, same rows", "rows/s", parquet_runs)],
        higher_is_better=True, seconds=perf_counter() - began, loadavg=[loadavg()],
    )
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(log_parquet, ignore_errors=True)
    return [materialize_entry, read_entry]


# -- the run -------------------------------------------------------------------------------------

def run_spark_benchmarks(
    quick: bool, out_dir: Path, *, sizes: Sizes | None = None, spark: Any | None = None,
    work_dir: str | os.PathLike[str] | None = None, progress: Callable[[str], None] | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """Run the Spark benchmarks; write ``out_dir/spark.json`` (quick: ``spark-quick.json``).

    ``sizes`` overrides the preset (FULL, or QUICK when ``quick``); ``spark`` is a Spark session to
    use (else one is started with the sizes' master, shuffle partitions and driver memory, and
    stopped at the end); ``progress`` is called with a line before and after each benchmark.
    Returns the JSON-able document.
    """
    from benchmarks.spark_compact import bench_compact

    chosen = sizes or (QUICK if quick else FULL)
    began = perf_counter()
    started = datetime.fromtimestamp(kvlog.SystemClock().now_ms() / 1000, UTC)
    say = progress or (lambda _line: None)
    work = Path(tempfile.mkdtemp(prefix="kvlog-bench-spark-", dir=work_dir))
    info = machine_info(work)
    info["loadavg_start"] = loadavg()
    own = spark is None
    entries: list[dict[str, Any]] = []
    spark_session: Any = None
    try:
        t0 = perf_counter()
        spark_session = _session(chosen) if spark is None else spark
        info["session_start_s"] = perf_counter() - t0 if own else None
        info["spark"] = {"version": spark_session.version, "master": spark_session.sparkContext.master,
                         "shuffle_partitions": spark_session.conf.get("spark.sql.shuffle.partitions"),
                         "driver_memory": spark_session.conf.get("spark.driver.memory", "1g"),
                         "own_session": own}
        info["warm_up_s"] = _warm_up(spark_session, work)
        steps: list[tuple[str, str, Callable[[], list[dict[str, Any]]]]] = [
            ("spark.compact", "(a) exact compaction", lambda: bench_compact(spark_session, chosen, work)),
            ("spark.materialize", "(b) materialize + (c) read rate",
             lambda: bench_materialize_and_read(spark_session, chosen, work)),
        ]
        for step_id, title, fn in steps:
            say(f"{title} ...")
            t1 = perf_counter()
            try:
                entries.extend(fn())
            except Exception as e:
                entry = _failed(step_id, title, "error", f"{type(e).__name__}: {e}")
                entry["traceback"] = traceback.format_exc()
                entries.append(entry)
            say(f"{title}: {perf_counter() - t1:.1f} s")
            gc.collect()
    finally:
        if own and spark_session is not None:
            spark_session.stop()
        shutil.rmtree(work, ignore_errors=True)
    info["loadavg_end"] = loadavg()
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "mode": chosen.mode,
        "date": started.isoformat(timespec="seconds"),
        "wall_seconds": perf_counter() - began,
        "machine": info,
        "sizes": {**asdict(chosen), "requested": asdict(QUICK if quick else FULL)},
        "method": METHOD,
        "benchmarks": entries,
    }
    if write:
        out = Path(out_dir)
        save_results(document, out / ("spark.json" if chosen.mode == "full" else f"spark-{chosen.mode}.json"))
    return document


# -- the table -----------------------------------------------------------------------------------

def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "rows/s":
        return f"{value:,.0f} {unit}"
    return f"{value:,.2f} {unit}"


def _notes(e: dict[str, Any]) -> list[str]:
    x = e.get("extrapolation")
    return [f"extrapolated to {x['records']:,} records: {x['seconds_linear']:,.0f} s"] if x else []


def format_table(document: dict[str, Any]) -> str:
    """The results as a plain-text table: figure, anchors, ratios, target."""
    return text_table(document, "kvlog Spark benchmarks", _fmt, id_width=22, anchor_width=50, name_width=34,
                      notes=_notes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    parser.add_argument("--mid", action="store_true", help="2 M records over 1 M keys for (a) and (b)")
    parser.add_argument("--out-dir", default="benchmarks/results", help="where spark.json goes")
    parser.add_argument("--work-dir", help="where the temporary stores go (default: the system temp)")
    parser.add_argument("--compact-records", type=int, help="override (a)'s records")
    parser.add_argument("--compact-keys", type=int, help="override (a)'s distinct keys")
    parser.add_argument("--repeats", type=int, help="override the runs of (a), (b) and (c)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else MID if args.mid else FULL
    overrides: dict[str, Any] = {}
    if args.compact_records:
        overrides["compact_records"] = args.compact_records
    if args.compact_keys:
        overrides["compact_keys"] = args.compact_keys
    if args.repeats:
        overrides["repeats"] = args.repeats
        overrides["compact_repeats"] = args.repeats
    sizes = replace(sizes, **overrides)
    document = run_spark_benchmarks(args.quick, Path(args.out_dir), sizes=sizes, work_dir=args.work_dir,
                                    progress=lambda line: print(line, flush=True))
    print(format_table(document))
    print(f"results: {document.get('path')}")
    return 0 if all(e["status"] == "ok" for e in document["benchmarks"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
