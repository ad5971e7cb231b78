"""Batch reads of the ``kvlog`` data source: the log view and the latest-state view.

Planning happens on the driver at one commit version (the newest, or the one
a named checkpoint keeps: option ``checkpoint``): the driver opens the store,
lists the live batches, leases their files (below), drops those the pushed filters and the
offsets options rule out (:mod:`spark_ext.pushdown`; times of the ``...ByTimestamp``
options are first resolved to offsets, :mod:`spark_ext.by_timestamp`), and hands each input
partition the batches it reads (view ``log``: one input partition per data file, read with
one GET; view ``latest``: one per kvlog partition, since a key's records all
live in one partition, or several key-hash shares of a large one, see
:mod:`spark_ext.latest`). Option ``minPartitions`` asks for more: view ``log`` then cuts the
kvlog partitions' offset ranges into slices, view ``latest`` reads more key-hash shares
(:mod:`spark_ext.splits`). Executors read Arrow batches themselves and yield
``pyarrow.RecordBatch`` of exactly the declared schema, without the rows the
pushed key and offset filters rule out.

A read of the newest version leases the files it lists (:mod:`kvlog.log.leases`): a ``pin``
commit with an expiry, which every process's GC respects, so another process's compaction
and GC during the read never take a file a task has yet to read. Spark gives a batch reader no
call when its job ends, so the lease lasts option ``lease_ms`` (an hour by default) and GC
drops it then. ``lease_ms=0`` takes none (a store the driver cannot write to): a task that
then finds a file collected raises :class:`~kvlog.errors.CorruptDataError` saying so.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from kvlog.clock import SystemClock
from kvlog.errors import CorruptDataError
from kvlog.format.bitmap import decode_offsets
from kvlog.format.datafile import decode_batch
from kvlog.log import LiveBatch, leases, open_log
from kvlog.storage import Storage, open_storage
from spark_ext.by_timestamp import batch_reader, resolve_times
from spark_ext.latest import (
    LATEST_SPLIT_BYTES,
    LatestShare,
    latest_shares,
    read_latest,
    share_count,
)
from spark_ext.options import driver_cache_dir, storage_options_from, store_uri
from spark_ext.pushdown import Pruning, Ranges
from spark_ext.read_options import offset_ranges, parse_read_options
from spark_ext.schemas import LOG_ARROW, LOG_INTERNAL_ARROW, expires_column
from spark_ext.splits import Slice, latest_share_counts, split_ranges

__all__ = ["KvlogPartition", "KvlogReader", "leased_batches", "live_batches", "read_batches"]


def live_batches(uri: str, storage_options: dict[str, Any] | None, cache_dir: str | None = None, *,
                 checkpoint: str | None = None) -> tuple[int, int, list[LiveBatch]]:
    """(version, partitions, every live batch in partition then offset order) at the newest
    version, or at the named ``checkpoint`` (:class:`CheckpointNotFoundError` if there is none)."""
    the_log = open_log(uri, create=False, read_only=True, storage_options=storage_options,
                       cache_dir=driver_cache_dir(uri, cache_dir), maintain_index=False, checkpoint=checkpoint)
    try:
        def collect(r: Any) -> list[LiveBatch]:
            return [b for p in range(the_log.partitions) for b in r.iter_batches(p, 0)]

        return the_log.version, the_log.partitions, the_log.snapshot(collect)
    finally:
        the_log.close()


def leased_batches(uri: str, storage_options: dict[str, Any] | None, cache_dir: str | None,
                   lease_ms: int) -> tuple[int, int, list[LiveBatch], leases.Lease]:
    """:func:`live_batches` at the newest version, with a lease of ``lease_ms`` on their files
    (a commit: the driver opens the store writable)."""
    the_log = open_log(uri, create=False, storage_options=storage_options,
                       cache_dir=driver_cache_dir(uri, cache_dir), maintain_index=False)
    try:
        def collect(r: Any) -> list[LiveBatch]:
            return [b for p in range(the_log.partitions) for b in r.iter_batches(p, 0)]

        lease, batches = leases.take(the_log, lease_ms, collect)
        return lease.version, the_log.partitions, batches, lease
    finally:
        the_log.close()


def _collected(e: FileNotFoundError, lease_ms: int) -> CorruptDataError:
    """What a task raises for a data file it found deleted."""
    name = str(e.filename or (e.args[0] if e.args else "a data file"))
    if lease_ms:
        why = (f"the read's lease (option lease_ms={lease_ms}) expired before this task read it, "
               "and GC in some process deleted it after a compaction replaced it; set a larger lease_ms")
    else:
        why = ("GC in another process deleted it after a compaction replaced it, and the read took "
               "no lease (option lease_ms=0); set lease_ms to keep its files from GC until it ends")
    return CorruptDataError(name, f"data file is missing: {why}")


def _offsets(batch: LiveBatch) -> pa.Array:
    base = batch.base
    if batch.present is None:
        return pa.array(range(base, batch.last + 1), pa.int64())
    bitmap = decode_offsets(batch.path, batch.present)
    return pc.add(pa.array(list(bitmap), pa.int64()), base)


def read_batches(storage: Any, batches: Sequence[LiveBatch], *, whole_file: bool) -> Iterator[
        tuple[LiveBatch, pa.RecordBatch]]:
    """Decode ``batches`` (one GET of the whole file when ``whole_file``, else one ranged GET each)."""
    data: bytes | None = None
    if whole_file and batches:
        data = storage.read(batches[0].path)
    for b in batches:
        loc = b.location
        raw = data[b.position:b.position + b.length] if data is not None else storage.read_range(
            b.path, b.position, b.length)
        yield b, decode_batch(b.path, raw, loc)


class KvlogPartition(InputPartition):
    """The batches one task reads (``value``), and the offsets to read of each partition
    when the read has ``startingOffsets``/``endingOffsets`` (or their ByTimestamp forms), or
    of its one partition when it is a slice of ``minPartitions``."""

    def __init__(self, value: list[LiveBatch] | LatestShare, ranges: Ranges | None = None, whole_file: bool = True,
                 lease_ms: int = 0) -> None:
        super().__init__(value)
        self.ranges = ranges
        #: Whether the task reads every live batch of its file (one GET), or some (a ranged GET each).
        self.whole_file = whole_file
        #: The read's lease (ms; 0: none), named when a file is found missing.
        self.lease_ms = lease_ms


class KvlogReader(DataSourceReader):
    def __init__(self, options: dict[str, str], view: str, internal: bool) -> None:
        self.read_options = parse_read_options(options)
        self.uri = store_uri(options)
        self.storage_options = storage_options_from(options)
        self.view = view
        self.internal = internal
        self.cache_dir = options.get("cache_dir") or None
        self.checkpoint = self.read_options.checkpoint
        #: What the pushed filters prune (:mod:`spark_ext.pushdown`).
        self.pruning = Pruning(view)
        #: The job's time: the latest view hides records expired at it (option ``now_ms``, else
        #: the driver's clock when the read is planned).
        self.now_ms = int(options["now_ms"]) if options.get("now_ms") else SystemClock().now_ms()

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 - Spark's name
        return self.pruning.push(filters)

    def partitions(self) -> list[InputPartition]:
        lease_ms = 0 if self.checkpoint is not None else self.read_options.lease_ms
        if lease_ms:
            _version, count, batches, _lease = leased_batches(self.uri, self.storage_options, self.cache_dir,
                                                              lease_ms)
        else:
            _version, count, batches = live_batches(self.uri, self.storage_options, self.cache_dir,
                                                    checkpoint=self.checkpoint)
        per_file: dict[str, int] = {}
        for b in batches:
            per_file[b.path] = per_file.get(b.path, 0) + 1
        ranges = None
        if self.read_options.has_offsets:
            ends: dict[int, int] = {}
            for b in batches:
                ends[b.partition] = max(ends.get(b.partition, 0), b.last + 1)
            options = self.read_options
            if options.starting_timestamps is not None or options.ending_timestamps is not None:
                storage = self.open_storage()
                try:
                    options = resolve_times(options, count, batches, ends, batch_reader(storage))
                finally:
                    storage.close()
            ranges = offset_ranges(options, count, ends)
        # Pruning comes before the batches are grouped into input partitions.
        batches = self.pruning.batches(batches, count, ranges)
        groups: dict[Any, list[LiveBatch]] = {}
        for b in batches:
            groups.setdefault(b.path if self.view == "log" else b.partition, []).append(b)
        if self.view == "log":
            for items in groups.values():
                items.sort(key=lambda b: b.position)
        ordered = [items for _k, items in sorted(groups.items(), key=lambda kv: str(kv[0]))]
        min_partitions = self.read_options.min_partitions
        if self.view == "latest":
            split = self.read_options.latest_split_bytes or LATEST_SPLIT_BYTES
            shares = {items[0].partition: share_count(items, split) for items in ordered}
            if min_partitions is not None:
                stored = {items[0].partition: sum(b.length for b in items) for items in ordered}
                shares = latest_share_counts(stored, shares, min_partitions)
            return [KvlogPartition(share, ranges, lease_ms=lease_ms) for items in ordered
                    for share in latest_shares(items, split, shares=shares[items[0].partition])
                    ] or [InputPartition(LatestShare(()))]
        parts: list[InputPartition] = [KvlogPartition(items, ranges, len(items) == per_file[items[0].path], lease_ms)
                                       for items in ordered]
        if min_partitions is not None and len(parts) < min_partitions:
            slices = self._slices(batches, ranges, min_partitions)
            if len(slices) > len(parts):
                # A slice's batches come from several files: one ranged read each.
                parts = [KvlogPartition(list(s.batches), {s.partition: (s.first, s.end)}, False, lease_ms)
                         for s in slices]
        return parts or [InputPartition([])]

    def _slices(self, batches: list[LiveBatch], ranges: Ranges | None, min_partitions: int) -> list[Slice]:
        """The log view's read (``batches``, pruned, within ``ranges`` and the pushed offset
        range) cut into at least ``min_partitions`` slices (:mod:`spark_ext.splits`)."""
        by_partition: dict[int, list[LiveBatch]] = {}
        for b in batches:
            by_partition.setdefault(b.partition, []).append(b)
        pushed = self.pruning.offsets
        wanted: dict[int, tuple[int, int, list[LiveBatch]]] = {}
        for p, items in by_partition.items():
            items.sort(key=lambda b: b.base)
            first, end = ranges[p] if ranges is not None else (0, items[-1].last + 1)
            if pushed.low is not None:
                first = max(first, pushed.low)
            if pushed.high is not None:
                end = min(end, pushed.high)
            if first < end:
                wanted[p] = (first, end, items)
        return split_ranges(wanted, min_partitions)

    def open_storage(self) -> Storage:
        """The store's storage, as a task opens it to read data files."""
        return open_storage(self.uri, self.storage_options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        value = partition.value
        if not (value.batches if isinstance(value, LatestShare) else value):
            return
        ranges: Ranges | None = getattr(partition, "ranges", None)
        pruning = self.pruning
        storage = self.open_storage()
        try:
            out = (read_latest(storage, value, self.now_ms) if isinstance(value, LatestShare)
                   else self._read_log(storage, value, getattr(partition, "whole_file", True)))
            if not pruning.filters_rows(ranges):
                yield from out
                return
            for batch in out:
                kept = pruning.rows(batch, ranges)
                if kept.num_rows:
                    yield kept
        except FileNotFoundError as e:
            raise _collected(e, getattr(partition, "lease_ms", 0)) from None
        finally:
            storage.close()

    def _read_log(self, storage: Any, batches: list[LiveBatch], whole_file: bool = True) -> Iterator[pa.RecordBatch]:
        for b, rb in read_batches(storage, batches, whole_file=whole_file):
            offsets = _offsets(b)
            values = rb.column(1)
            n = rb.num_rows
            columns = [pa.array([b.partition] * n, pa.int32()), offsets, rb.column(2), rb.column(0), values,
                       pc.is_null(values), expires_column(rb)]
            schema = LOG_ARROW
            if self.internal:
                columns.append(pa.array([b.horizon_ms] * n, pa.int64()))
                schema = LOG_INTERNAL_ARROW
            yield pa.record_batch(columns, schema=schema)
