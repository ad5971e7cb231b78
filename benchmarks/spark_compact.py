"""(a) of :mod:`benchmarks.spark`: exact Spark compaction against a hand-written Spark dedup.

Each repeat compacts a fresh copy of one store (``spark_ext.compact(force=True)``) and runs
the hand-written job over the same records already in Parquet (the log view written once
with ``df.write.parquet``, not timed): ``row_number`` over (partition, key) ordered by offset
descending, the first row kept, written as Parquet. The two alternate (kvlog first in even
repeats, the hand-written job first in odd ones), so neither always runs on the JVM heap the
other grew. Exactness: the survivors' (partition, offset) pairs equal the hand-written
job's, and no (partition, key) survives twice.
"""

from __future__ import annotations

import gc
import shutil
from pathlib import Path
from statistics import median
from time import perf_counter
from typing import Any

from benchmarks.compaction import loadavg, measure

__all__ = ["bench_compact", "COMPACT_LIMIT", "MEMORY_LIMIT"]

#: kvlog's compaction takes at most this many times the hand-written dedup...
COMPACT_LIMIT = 1.0
#: ... and its peak memory is at most this many times the hand-written job's.
MEMORY_LIMIT = 1.1


def _hand_written(spark: Any, log_parquet: str, out: str) -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("partition", "key").orderBy(F.col("offset").desc())
    (spark.read.parquet(log_parquet).withColumn("rn", F.row_number().over(w)).where("rn = 1").drop("rn")
     .write.mode("overwrite").parquet(out))


def _same_survivors(spark: Any, uri: str, out: str) -> dict[str, int]:
    """Pairs (partition, offset) only one side has, each way."""
    ours = spark.read.format("kvlog").load(uri).select("partition", "offset")
    theirs = spark.read.parquet(out).select("partition", "offset")
    return {"only_kvlog": ours.exceptAll(theirs).count(), "only_hand_written": theirs.exceptAll(ours).count()}


def _timed(run: Any) -> tuple[float, int, int]:
    """(seconds, peak tree RssAnon KiB, that peak minus the sum just before) of ``run()``."""
    from benchmarks.spark import TreeRssSampler

    gc.collect()
    sampler = TreeRssSampler()
    baseline = sampler.sample()
    sampler.start()
    t0 = perf_counter()
    run()
    seconds = perf_counter() - t0
    peak = sampler.stop()
    return seconds, peak, peak - baseline


def bench_compact(spark: Any, sizes: Any, work: Path) -> list[dict[str, Any]]:
    import spark_ext
    from benchmarks.spark import FULL, check_exact, load_store, make_entry

    began = perf_counter()
    load = [loadavg()]
    source = work / "compact-source"
    loaded = load_store(source, sizes.compact_records, sizes.compact_keys, sizes)
    log_parquet = str(work / "compact-log.parquet")
    spark.read.format("kvlog").load(str(source)).write.mode("overwrite").parquet(log_parquet)
    runs: dict[str, list[tuple[float, int, int]]] = {"kvlog": [], "hand_written": []}
    reports, exact, same = [], {}, {}
    repeats = max(1, sizes.compact_repeats)
    for r in range(repeats):
        path = work / f"compact-{r}"
        shutil.copytree(source, path)
        out = str(work / f"dedup-{r}")
        order = ["kvlog", "hand_written"] if r % 2 == 0 else ["hand_written", "kvlog"]
        for who in order:
            if who == "kvlog":
                holder: list[Any] = []
                runs[who].append(_timed(lambda p=path, h=holder: h.append(
                    spark_ext.compact(spark, str(p), force=True))))
                reports.append(holder[0])
            else:
                runs[who].append(_timed(lambda o=out: _hand_written(spark, log_parquet, o)))
        if r == 0:
            exact = check_exact(spark, str(path))
            same = _same_survivors(spark, str(path), out)
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        load.append(loadavg())
    shutil.rmtree(source, ignore_errors=True)
    shutil.rmtree(log_parquet, ignore_errors=True)
    keys = sizes.compact_keys
    is_exact = bool(exact["max_n"] == 1 and exact["keys"] == keys and exact["rows"] == keys
                    and not any(same.values()) and all(rep.rounds == 1 and not rep.refused for rep in reports))
    seconds = {who: [s for s, _p, _g in items] for who, items in runs.items()}
    peaks = {who: [p / 1024 for _s, p, _g in items] for who, items in runs.items()}
    growths = {who: [g / 1024 for _s, _p, g in items] for who, items in runs.items()}
    time_ratios = [a / b for a, b in zip(seconds["kvlog"], seconds["hand_written"], strict=True)]
    memory_ratios = [a / b for a, b in zip(peaks["kvlog"], peaks["hand_written"], strict=True)]
    n = sizes.compact_records
    extrapolated = None
    if n < FULL.compact_records:
        extrapolated = {"records": FULL.compact_records,
                        "seconds_linear": median(seconds["kvlog"]) * FULL.compact_records / n,
                        "note": f"measured at {n:,} records; linear in records"}
    facts = {"records": n, "keys": keys, "files": loaded["files"], "data_bytes": loaded["data_bytes"],
             "load_s": loaded["load_s"], "repeats": repeats, "loadavg": load}
    ratio = median(time_ratios)
    time_entry = make_entry(
        "spark.compact", f"exact Spark compaction, {n:,} records over {keys:,} keys", (
            f"spark_ext.compact(force=True) of a fresh copy of a {sizes.partitions}-partition store of "
            f"{n:,} records ({loaded['files']} L0 files of {sizes.records_per_file:,} records) over "
            f"{keys:,} distinct keys, median of {repeats}. Anchor: the hand-written Spark dedup over "
            "the same records in Parquet (row_number over (partition, key) by offset descending, the "
            "first row kept, written as Parquet), alternating with kvlog run by run. Exact: the "
            "survivors' (partition, offset) pairs equal the hand-written job's, no (partition, key) "
            "twice, one row per key."),
        measure("kvlog", "spark_ext.compact(force=True)", "s", seconds["kvlog"], records_per_s=n / median(
            seconds["kvlog"]), report=reports[0].to_dict()),
        [measure("hand_written", "Spark row_number dedup over Parquet + write", "s", seconds["hand_written"])],
        higher_is_better=False, seconds=perf_counter() - began,
        target={"text": "exact: the hand-written job's survivors, no duplicate key, every key kept",
              "met": is_exact, "value": exact},
        survivors_compared=same, paired_ratios=time_ratios,
        ratio_range=[min(time_ratios), max(time_ratios)], limit=COMPACT_LIMIT,
        within_limit=bool(ratio <= COMPACT_LIMIT), extrapolation=extrapolated, **facts,
    )
    memory_ratio = median(memory_ratios)
    memory_entry = make_entry(
        "spark.compact_memory", f"peak RssAnon of the process tree during (a), {n:,} records", (
            "Peak of RssAnon summed over this process and its descendants (driver JVM = executor in "
            "local mode, Python workers), sampled every 0.5 s during each run of (a), median over "
            f"the runs (driver memory {sizes.driver_memory}); anchor: the same during the "
            "hand-written dedup's runs. `growth_mib` is each peak minus the sum just before."),
        measure("kvlog", "peak RssAnon of the process tree", "MiB", peaks["kvlog"], growth_mib=growths["kvlog"]),
        [measure("hand_written", "the same, hand-written dedup", "MiB", peaks["hand_written"],
                 growth_mib=growths["hand_written"])],
        higher_is_better=False, seconds=0.0, paired_ratios=memory_ratios,
        ratio_range=[min(memory_ratios), max(memory_ratios)], limit=MEMORY_LIMIT,
        within_limit=bool(memory_ratio <= MEMORY_LIMIT), **facts,
    )
    return [time_entry, memory_entry]
