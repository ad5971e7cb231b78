"""Cluster-sized work on Spark: exact compaction, latest-state materialization, bulk index rebuild.

``compact`` deduplicates through Spark's shuffle on the real keys (no map
capacity, no fingerprint collisions) with the local compactor's retention
rules, writes output files from the executors, and commits one ``replace``
that is refused if its inputs changed — so local and Spark compaction work on
the same store and leave the same surviving offsets. Each input is read twice:
its keys in stage 1, its records in stage 2 (``spark_ext.compaction``).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from kvlog.compaction import CompactionReport, Compactor, Plan, check_compact_args
from kvlog.config import StoreConfig
from kvlog.errors import KvlogError
from kvlog.format.commit import FileEntry, file_from_json
from kvlog.format.datafile import EXPIRES_VERSION
from kvlog.log import BulkIndexLoad, IndexRow, LiveBatch, commit_files, open_log, unchanged_since
from spark_ext.compaction import (
    NARROW_SCHEMA,
    REWRITE_SCHEMA,
    KeysTask,
    RewriteTask,
    Round,
    group_batches,
    job_files,
    stage_one,
    task_bytes,
)
from spark_ext.options import driver_cache_dir

__all__ = ["register", "compact", "materialize", "rebuild_index"]


def register(spark: Any) -> None:
    """Register the ``kvlog`` data source with ``spark``, any Spark session a user built.

    Spark pushes filters into Python data sources only when the runtime setting
    ``spark.sql.python.filterPushdown.enabled`` is true (false by default). Left unset,
    it is set to true on ``spark`` and the data source that prunes with pushed filters is
    registered; set to false by the user, it stays so and the variant without pushdown is
    registered (``spark_ext.plain_source``). A later registration replaces an earlier
    one, and the one PySpark finds on its own (``pyspark_kvlog``).
    """
    from spark_ext.datasource import KvlogDataSource
    from spark_ext.plain_source import PUSHDOWN_CONF, KvlogPlainDataSource

    setting = spark.conf.get(PUSHDOWN_CONF, None)
    if setting is None:
        spark.conf.set(PUSHDOWN_CONF, "true")
    elif str(setting).strip().lower() != "true":
        spark.dataSource.register(KvlogPlainDataSource)
        return
    spark.dataSource.register(KvlogDataSource)


def _reader(spark: Any, uri: str, storage_options: dict[str, Any] | None, **options: str) -> Any:
    register(spark)
    reader = spark.read.format("kvlog")
    for key, value in (storage_options or {}).items():
        reader = reader.option(f"storage.{key}", str(value))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(uri)


def compact(spark: Any, uri: str, *, storage_options: dict[str, Any] | None = None, force: bool = False,
            now_ms: int | None = None, cache_dir: str | None = None, **settings: Any) -> CompactionReport:
    """Exact compaction of the store at ``uri`` on Spark; one ``replace`` commit. See the module doc
    and ``spark_ext.compaction`` for the two stages."""
    check_compact_args(force, now_ms)
    config = StoreConfig.from_settings(None, **settings)
    the_log = open_log(uri, create=False, storage_options=storage_options, cache_dir=driver_cache_dir(uri, cache_dir),
                       config=config, maintain_index=False)
    try:
        began = the_log.clock.monotonic_s()
        report = CompactionReport(map_capacity=0)
        try:
            the_log.refresh()
            now = the_log.clock.now_ms() if now_ms is None else now_ms
            plan, batches = Compactor(the_log).plan(now, force=force)
            if plan is not None and plan.kind == "clean":
                _compact(spark, the_log, uri, storage_options, plan, batches, now, report)
        finally:
            report.duration_s = the_log.clock.monotonic_s() - began
        return report
    finally:
        the_log.close()


def _compact(spark: Any, the_log: Any, uri: str, storage_options: dict[str, Any] | None, plan: Plan,
             batches: dict[int, list[LiveBatch]], now: int, report: CompactionReport) -> None:
    """Run the two stages of ``plan`` and commit their outputs (fills ``report``)."""
    inputs = set(plan.input_files)
    # Only the plan's inputs: records appended since planning stay live as they are.
    input_batches = [b for items in batches.values() for b in items if b.file_id in inputs]
    rounds = {p: Round(spec.first_dirty, spec.first_uncleanable, spec.hold) for p, spec in plan.clean.items()}
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    report.kind = "spark"
    report.files_in = len(plan.input_files)
    report.partitions = sorted(rounds)
    report.records_read = sum(b.count for b in input_batches)
    report.bytes_read = sum(b.length for b in input_batches)
    job_id = uuid.uuid4().hex

    # Stage 1: the removed offsets, from the keys of the cleaned ranges.
    cleaned = [b for b in input_batches if b.partition in rounds and b.base < rounds[b.partition].first_uncleanable]
    key_groups = group_batches(plan.input_files, cleaned, task_bytes(sum(b.length for b in cleaned), cores))
    removed: dict[tuple[int, int, int], bytes] = {}
    if key_groups:
        narrow = spark.range(len(key_groups), numPartitions=len(key_groups)).mapInArrow(
            KeysTask(uri, storage_options, key_groups, rounds), NARROW_SCHEMA)
        removed = stage_one(narrow, sum(b.count for b in cleaned), cores)

    # Stage 2: every input batch rewritten without them, in runs of the inputs' commit order.
    groups = group_batches(plan.input_files, input_batches, task_bytes(report.bytes_read, cores))
    expires = any(b.schema == EXPIRES_VERSION for b in input_batches)
    broadcast = spark.sparkContext.broadcast(removed)
    outcome = None
    outputs: list[FileEntry] = []
    try:
        task = RewriteTask(uri, storage_options, groups, rounds, broadcast, the_log.config, now, plan.output_level,
                           expires, job_id)
        results = [json.loads(row["result"]) for row in spark.range(len(groups), numPartitions=max(1, len(groups)))
                   .mapInArrow(task, REWRITE_SCHEMA).collect()]
        results.sort(key=lambda r: r["task"])
        outputs = [file_from_json("spark output", f) for r in results for f in r["files"]]
        cleaner = {str(p): {"checkpoint": spec.first_uncleanable, "last_round_ms": now, "partial": False}
                   for p, spec in rounds.items()}
        outcome = commit_files(the_log, "replace", outputs, remove=plan.input_files,
                               info={"cleaner": cleaner, "job": "spark", "holds_at": plan.holds_at})
    finally:
        broadcast.destroy()
        # The job's files its commit does not make live (all of them when the commit is refused
        # or never made, a failed attempt's extra ones otherwise) are deleted.
        committed = set() if outcome is None or outcome.refusal is not None else {f.path for f in outputs}
        _delete_uncommitted(the_log, plan.output_level, job_id, committed)
    if outcome.refusal is not None:
        report.refused = True
        return
    report.rounds = 1
    report.version = outcome.version
    report.records_written = sum(r["written"] for r in results)
    report.records_removed = report.records_read - report.records_written
    report.tombstones_removed = sum(r["tombstones"] for r in results)
    report.expired_removed = sum(r["expired"] for r in results)
    report.bytes_written = sum(f.size for f in outputs)
    report.files_out = len(outputs)
    report.checkpoints = {p: spec.first_uncleanable for p, spec in rounds.items()}


def _delete_uncommitted(the_log: Any, level: int, job_id: str, committed: set[str]) -> None:
    # Outputs an earlier attempt of this commit made live (its answer lost) stay.
    live = set(the_log.snapshot(lambda r: [entry.path for _file_id, entry in r.iter_files()]))
    storage = the_log.storage
    for name in job_files(storage, level, job_id):
        if name not in committed and name not in live:
            storage.delete(name)


def materialize(spark: Any, uri: str, output_path: str, *, storage_options: dict[str, Any] | None = None,
                cache_dir: str | None = None, mode: str = "overwrite", now_ms: int | None = None) -> dict[str, Any]:
    """Write the latest state (key, value, partition, offset, timestamp, expires_ms) as Parquet at
    ``output_path``, without the records expired at ``now_ms`` (default: the driver's clock)."""
    # Open the store on the driver first: a missing store or a bad URI is then kvlog's own
    # StoreNotFoundError / ConfigError, not a Spark AnalysisException wrapping it.
    open_log(uri, create=False, read_only=True, storage_options=storage_options,
             cache_dir=driver_cache_dir(uri, cache_dir), maintain_index=False).close()
    options = {} if now_ms is None else {"now_ms": str(now_ms)}
    df = _reader(spark, uri, storage_options, view="latest", cache_dir=cache_dir or "", **options)
    df.write.mode(mode).parquet(output_path)
    written = spark.read.parquet(output_path)
    return {"path": output_path, "rows": written.count(), "columns": written.columns}


def rebuild_index(spark: Any, uri: str, cache_dir: str | os.PathLike[str], *,
                  storage_options: dict[str, Any] | None = None, **settings: Any) -> dict[str, Any]:
    """Build the store's key index on Spark and bulk-load it, sorted, into the cache at ``cache_dir``.

    The metadata is replayed without the index (the commits are read, no data file), Spark
    computes every live key's latest (partition, offset, value), and the driver streams the
    sorted rows into a fresh LMDB index. ``kvlog.open(uri, cache_dir=cache_dir)`` then uses it
    without a replay of the data.
    """
    from pyspark.sql import functions as F

    config = StoreConfig.from_settings(None, **settings)
    the_log = open_log(uri, create=False, read_only=True, storage_options=storage_options,
                       cache_dir=cache_dir, config=config, maintain_index=False)
    try:
        index = BulkIndexLoad(the_log)
        index.clear()
        version = the_log.version
        # Every key's latest record, expired or not (a time before every expiry): as a replay, the
        # index keeps an expiring entry with its expiry and hides it at read time.
        latest = _reader(spark, uri, storage_options, view="latest", cache_dir=os.fspath(cache_dir),
                         now_ms=str(-(2**63) + 1))
        rows = latest.select("key", "partition", "offset", "value", "expires_ms").orderBy(F.col("key"))
        loaded = 0
        pending: list[IndexRow] = []
        for row in rows.toLocalIterator():
            expires_ms = row["expires_ms"]
            pending.append((bytes(row["key"]), int(row["partition"]), int(row["offset"]), bytes(row["value"]),
                            None if expires_ms is None else int(expires_ms)))
            if len(pending) >= 50_000:
                index.load(pending)
                loaded += len(pending)
                pending = []
        if pending:
            index.load(pending)
            loaded += len(pending)
        if not unchanged_since(the_log, version):
            raise KvlogError("the store changed during the rebuild; run it again")
        index.finish()
        return {"cache_dir": os.fspath(cache_dir), "keys": loaded, "version": version}
    finally:
        the_log.close()
