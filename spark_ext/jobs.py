"""Cluster-sized work on Spark: exact compaction, latest-state materialization, bulk index rebuild.

``compact`` deduplicates through Spark's shuffle on the real keys (no map
capacity, no fingerprint collisions) with the local compactor's retention
rules, writes output files from the executors, and commits one ``replace``
that is refused if its inputs changed — so local and Spark compaction work on
the same store and leave the same surviving offsets.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from kvlog.compaction import CompactionReport, Compactor, OutputWriter
from kvlog.config import StoreConfig
from kvlog.errors import KvlogError
from kvlog.format.checksum import crc32c
from kvlog.format.commit import BatchEntry, Commit, FileEntry, file_from_json, file_to_json
from kvlog.format.datafile import EXPIRES_VERSION
from kvlog.index import clear_index, index_put_many
from kvlog.index.write import index_put
from kvlog.log import open_log
from kvlog.log.naming import data_file_name
from kvlog.meta import MetaTxn
from kvlog.storage import open_storage
from kvlog.storage.base import BytesLike
from spark_ext.options import driver_cache_dir

__all__ = ["register", "compact", "materialize", "rebuild_index"]


def register(spark: Any) -> None:
    """Register the ``kvlog`` data source with ``spark``, any session a user built.

    Spark pushes filters into Python data sources only when the runtime setting
    ``spark.sql.python.filterPushdown.enabled`` is true (false by default). Left unset,
    it is set to true on ``spark`` and the data source that prunes with pushed filters is
    registered; set to false by the user, it stays so and the variant without pushdown is
    registered (:mod:`spark_ext.plain_source`). A later registration replaces an earlier
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
    """Exact compaction of the store at ``uri`` on Spark; one ``replace`` commit. See the module doc."""
    from pyspark.sql import functions as F

    config = StoreConfig.from_settings(None, **settings)
    the_log = open_log(uri, create=False, storage_options=storage_options, cache_dir=driver_cache_dir(uri, cache_dir),
                       config=config, maintain_index=False)
    try:
        the_log.refresh()
        now = the_log.clock.now_ms() if now_ms is None else now_ms
        planner = Compactor(the_log)
        plan, batches = planner.plan(now, force=force)
        report = CompactionReport(map_capacity=0)
        if plan is None or plan.kind != "clean":
            return report
        inputs = set(plan.input_files)
        clean = {p: (spec.first_dirty, spec.first_uncleanable) for p, spec in plan.clean.items()}
        compression = the_log.config.compression
        retention = the_log.config.delete_retention_ms
        version = the_log.version
        input_batches = [b for items in batches.values() for b in items if b.file_id in inputs]
        log_df = _reader(spark, uri, storage_options, internal="true", cache_dir=cache_dir or "")
        # Exact dedup over each cleaned partition's dirty range: the latest offset of every real key.
        # Only the plan's inputs: the reader plans at the newest version, and records appended since
        # (offsets past the inputs' last one) would make the outputs overlap their live batches.
        bounds = {p: max(b.last for b in items) + 1 for p, items in batches.items() if items}
        ranges = spark.createDataFrame(
            [(p, *clean.get(p, (None, None)), end) for p, end in bounds.items()] or [(-1, 0, 0, 0)],
            "partition int, first_dirty bigint, first_uncleanable bigint, input_end bigint")
        records = log_df.join(F.broadcast(ranges), "partition").where(F.col("offset") < F.col("input_end"))
        dirty = records.where((F.col("offset") >= F.col("first_dirty")) & (F.col("offset") < F.col("first_uncleanable")))
        latest = dirty.groupBy("partition", "key").agg(F.max("offset").alias("latest"))
        joined = records.join(latest, ["partition", "key"], "left")
        cleaned = F.col("first_uncleanable").isNotNull() & (F.col("offset") < F.col("first_uncleanable"))
        is_latest = F.col("latest").isNull() | (F.col("offset") >= F.col("latest"))
        # Dead records: tombstones, and records expired at the job's time (the same rule as the
        # local cleaner's, see kvlog.compaction.survivors).
        lapsed = F.col("expires_ms").isNotNull() & (F.col("expires_ms") <= F.lit(now))
        dead = F.col("is_tombstone") | lapsed
        expired = dead & F.col("horizon").isNotNull() & (F.col("horizon") <= F.lit(now))
        keep = (~cleaned) | (is_latest & ~expired)
        new_horizon = F.when(cleaned & is_latest & dead & F.col("horizon").isNull(),
                             F.lit(now + retention)).otherwise(F.col("horizon"))
        survivors = (joined.where(keep)
                     .select("partition", "offset", "timestamp", "key", "value", new_horizon.alias("horizon"),
                             "expires_ms")
                     .repartition(max(1, min(the_log.partitions, 64)), "partition")
                     .sortWithinPartitions("partition", "offset"))
        totals = joined.agg(F.count(F.lit(1)).alias("n"),
                             F.sum(F.when(cleaned & F.col("is_tombstone") & ~keep, 1).otherwise(0)).alias("t"),
                             F.sum(F.when(cleaned & lapsed & ~keep, 1).otherwise(0)).alias("e"))
        counts = totals.collect()[0]
        expires = any(b.schema == EXPIRES_VERSION for b in input_batches)
        writer = _OutputTask(uri, storage_options, compression, plan.output_level, expires)
        files_json = survivors.mapInArrow(writer, "file string").collect()
        outputs = [file_from_json("spark output", json.loads(row["file"])) for row in files_json]
        order_outputs = sorted(outputs, key=lambda f: min(b.partition for b in f.batches))
        cleaner = {str(p): {"checkpoint": hi, "last_round_ms": now, "partial": False} for p, (_lo, hi) in clean.items()}
        commit_id = uuid.uuid4().hex
        outcome = the_log.commit(lambda v: Commit(v, commit_id, the_log.clock.now_ms(), "replace",
                                                  add=tuple(order_outputs), remove=plan.input_files,
                                                  info={"cleaner": cleaner, "job": "spark"}))
        written = sum(sum(b.location.count for b in f.batches) for f in outputs)
        report.kind = "spark"
        report.files_in = len(plan.input_files)
        report.partitions = sorted(clean)
        if outcome.refusal is not None:
            storage = the_log.storage
            # Outputs an earlier attempt of this commit made live (its answer lost) stay.
            live = set(the_log.snapshot(lambda r: [file_id for file_id, _entry in r.iter_files()]))
            for f in outputs:
                if f.file_id not in live:
                    storage.delete(f.path)
            report.refused = True
            return report
        report.rounds = 1
        report.version = outcome.version
        report.records_read = int(counts["n"])
        report.records_written = written
        report.records_removed = report.records_read - written
        report.tombstones_removed = int(counts["t"] or 0)
        report.expired_removed = int(counts["e"] or 0)
        report.bytes_read = sum(b.length for b in input_batches)
        report.bytes_written = sum(f.size for f in outputs)
        report.files_out = len(outputs)
        report.checkpoints = {p: hi for p, (_lo, hi) in clean.items()}
        del version
        return report
    finally:
        the_log.close()


class _OutputTask:
    """Executor side of ``compact``: sorted survivors in, output data files out (one row per file)."""

    def __init__(self, uri: str, storage_options: dict[str, Any] | None, compression: str, level: int,
                 expires: bool) -> None:
        self.uri = uri
        self.storage_options = storage_options
        self.compression = compression
        self.level = level
        self.expires = expires  # an input has the expires column: so do the outputs

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        storage = open_storage(self.uri, self.storage_options)
        files: list[str] = []
        level = self.level

        def write_file(data: BytesLike, entries: list[BatchEntry], spill: Path | None) -> FileEntry:
            # The writer below builds files in memory: ``spill`` is always None.
            file_id = uuid.uuid4().hex
            path = data_file_name(level, file_id)
            storage.put(path, data)
            entry = FileEntry(file_id, path, level, len(data), crc32c(data), tuple(entries))
            files.append(json.dumps(file_to_json(entry)))
            return entry

        try:
            output = OutputWriter(write_file, StoreConfig(compression=self.compression), 64 * 2**20,
                                  expires=self.expires)
            for batch in batches:
                cols = batch.to_pydict()
                _feed(output, cols["partition"], cols["offset"], cols["timestamp"], cols["key"], cols["value"],
                      cols["horizon"], cols["expires_ms"])
            output.finish()
        finally:
            storage.close()
        yield pa.record_batch([pa.array(files, pa.string())], names=["file"])


_UNSET = object()


def _feed(output: OutputWriter, partitions: list[int], offsets: list[int], stamps: list[int], keys: list[bytes],
          values: list[bytes | None], horizons: list[int | None], expires: list[int | None]) -> None:
    """Add sorted survivors in runs of one partition whose records that may be dead (tombstones,
    records with an expiry) share one delete horizon."""
    n = len(keys)
    i = 0
    while i < n:
        partition = partitions[i]
        run_horizon: object = _UNSET
        j = i
        while j < n and partitions[j] == partition:
            if values[j] is None or expires[j] is not None:
                if run_horizon is _UNSET:
                    run_horizon = horizons[j]
                elif horizons[j] != run_horizon:
                    break
            j += 1
        horizon = None if run_horizon is _UNSET else run_horizon
        output.add(partition, keys[i:j], values[i:j], stamps[i:j], offsets[i:j],
                   horizon if isinstance(horizon, int) else None, expires[i:j])
        i = j


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

    The metadata is replayed without the index (cheap: no data is read), Spark computes
    every live key's latest (partition, offset, value), and the driver streams the sorted
    rows into a fresh LMDB index. ``kvlog.open(uri, cache_dir=cache_dir)`` then uses it
    without a replay of the data.
    """
    from pyspark.sql import functions as F

    config = StoreConfig.from_settings(None, **settings)
    the_log = open_log(uri, create=False, read_only=True, storage_options=storage_options,
                       cache_dir=cache_dir, config=config, maintain_index=False)
    try:
        the_log.env.write(lambda txn: clear_index(MetaTxn(the_log.env, txn)))
        version = the_log.version
        # Every key's latest record, expired or not (a time before every expiry): as a replay, the
        # index keeps an expiring entry with its expiry and hides it at read time.
        latest = _reader(spark, uri, storage_options, view="latest", cache_dir=os.fspath(cache_dir),
                         now_ms=str(-(2**63) + 1))
        rows = latest.select("key", "partition", "offset", "value", "expires_ms").orderBy(F.col("key"))
        inline = the_log.config.inline_value_bytes
        loaded = 0
        pending: list[tuple[bytes, int, int, bytes, int | None]] = []

        def load(items: list[tuple[bytes, int, int, bytes, int | None]]) -> None:
            def work(txn: Any) -> None:
                meta = MetaTxn(the_log.env, txn)
                index_put_many(meta, [(k, p, o, v) for k, p, o, v, e in items if e is None], inline)
                for k, p, o, v, e in items:
                    if e is not None:  # an expiring entry carries its expiry
                        index_put(meta, k, p, o, v if len(v) <= inline else None, e)

            the_log.env.write(work)

        for row in rows.toLocalIterator():
            expires_ms = row["expires_ms"]
            pending.append((bytes(row["key"]), int(row["partition"]), int(row["offset"]), bytes(row["value"]),
                            None if expires_ms is None else int(expires_ms)))
            if len(pending) >= 50_000:
                load(pending)
                loaded += len(pending)
                pending = []
        if pending:
            load(pending)
            loaded += len(pending)
        if the_log.version != version:
            raise KvlogError("the store changed during the rebuild; run it again")
        the_log.env.write(lambda txn: MetaTxn(the_log.env, txn).put_meta("index_ready", b"1"))
        return {"cache_dir": os.fspath(cache_dir), "keys": loaded, "version": version}
    finally:
        the_log.close()
