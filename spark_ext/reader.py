"""Batch reads of the ``kvlog`` data source: the log view and the latest-state view.

Planning happens on the driver at one commit version: the driver opens the
store read-only, lists the live batches, and hands each input partition the
batches it reads (view ``log``: one input partition per data file, read with
one GET; view ``latest``: one per kvlog partition, since a key's records all
live in one partition, or several key-hash shares of a large one, see
:mod:`spark_ext.latest`). Executors read Arrow batches themselves and yield
``pyarrow.RecordBatch`` of exactly the declared schema.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from kvlog.clock import SystemClock
from kvlog.errors import ConfigError
from kvlog.format.bitmap import decode_offsets
from kvlog.format.datafile import decode_batch
from kvlog.log import open_log
from kvlog.meta import LiveBatch
from kvlog.storage import open_storage
from spark_ext.latest import LATEST_SPLIT_BYTES, LatestShare, latest_shares, read_latest
from spark_ext.options import driver_cache_dir, storage_options_from, store_uri
from spark_ext.schemas import LOG_ARROW, LOG_INTERNAL_ARROW, expires_column

__all__ = ["KvlogReader", "live_batches", "read_batches"]


def live_batches(uri: str, storage_options: dict[str, Any] | None, cache_dir: str | None = None
                 ) -> tuple[int, int, list[LiveBatch]]:
    """(version, partitions, every live batch in partition then offset order) at the newest version."""
    the_log = open_log(uri, create=False, read_only=True, storage_options=storage_options,
                       cache_dir=driver_cache_dir(uri, cache_dir), maintain_index=False)
    try:
        def collect(r: Any) -> list[LiveBatch]:
            return [b for p in range(the_log.partitions) for b in r.iter_batches(p, 0)]

        return the_log.version, the_log.partitions, the_log.snapshot(collect)
    finally:
        the_log.close()


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


def _positive(options: dict[str, str], name: str, default: int) -> int:
    text = options.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"option {name} must be a positive integer, got {text!r}")
    return value


class KvlogReader(DataSourceReader):
    def __init__(self, options: dict[str, str], view: str, internal: bool) -> None:
        self.uri = store_uri(options)
        self.storage_options = storage_options_from(options)
        self.view = view
        self.internal = internal
        self.cache_dir = options.get("cache_dir") or None
        self.partitions_wanted: set[int] | None = None
        self.offset_min: int | None = None
        self.offset_max: int | None = None  # exclusive
        #: The job's time: the latest view hides records expired at it (option ``now_ms``, else
        #: the driver's clock when the read is planned).
        self.now_ms = int(options["now_ms"]) if options.get("now_ms") else SystemClock().now_ms()
        #: View ``latest``: a kvlog partition of more stored bytes is read by several tasks.
        self.latest_split_bytes = _positive(options, "latest_split_bytes", LATEST_SPLIT_BYTES)

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:  # noqa: N802 - Spark's name
        for f in filters:
            attribute = getattr(f, "attribute", None)
            column = attribute[0] if attribute else None
            if self.view == "log" and column == "partition" and isinstance(f, EqualTo | In):
                values = {int(v) for v in (f.value if isinstance(f, In) else (f.value,))}
                self.partitions_wanted = values if self.partitions_wanted is None else self.partitions_wanted & values
            elif self.view == "log" and column == "offset" and isinstance(
                    f, GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual):
                v = int(f.value)
                if isinstance(f, GreaterThan | GreaterThanOrEqual):
                    lo = v + 1 if isinstance(f, GreaterThan) else v
                    self.offset_min = lo if self.offset_min is None else max(self.offset_min, lo)
                else:
                    hi = v if isinstance(f, LessThan) else v + 1
                    self.offset_max = hi if self.offset_max is None else min(self.offset_max, hi)
            else:
                yield f

    def partitions(self) -> list[InputPartition]:
        _version, _n, batches = live_batches(self.uri, self.storage_options, self.cache_dir)
        if self.partitions_wanted is not None:
            batches = [b for b in batches if b.partition in self.partitions_wanted]
        if self.offset_min is not None:
            batches = [b for b in batches if b.last >= self.offset_min]
        if self.offset_max is not None:
            batches = [b for b in batches if b.base < self.offset_max]
        groups: dict[Any, list[LiveBatch]] = {}
        for b in batches:
            groups.setdefault(b.path if self.view == "log" else b.partition, []).append(b)
        if self.view == "log":
            for items in groups.values():
                items.sort(key=lambda b: b.position)
        ordered = [items for _k, items in sorted(groups.items(), key=lambda kv: str(kv[0]))]
        if self.view == "latest":
            return [InputPartition(share) for items in ordered for share in latest_shares(items, self.latest_split_bytes)] or [
                InputPartition(LatestShare(()))]
        return [InputPartition(items) for items in ordered] or [InputPartition([])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        value = partition.value
        if not (value.batches if isinstance(value, LatestShare) else value):
            return
        storage = open_storage(self.uri, self.storage_options)
        try:
            if isinstance(value, LatestShare):
                yield from read_latest(storage, value, self.now_ms)
            else:
                yield from self._read_log(storage, value)
        finally:
            storage.close()

    def _read_log(self, storage: Any, batches: list[LiveBatch]) -> Iterator[pa.RecordBatch]:
        for b, rb in read_batches(storage, batches, whole_file=True):
            offsets = _offsets(b)
            values = rb.column(1)
            n = rb.num_rows
            columns = [pa.array([b.partition] * n, pa.int32()), offsets, rb.column(2), rb.column(0), values,
                       pc.is_null(values), expires_column(rb)]
            schema = LOG_ARROW
            if self.internal:
                columns.append(pa.array([b.horizon_ms] * n, pa.int64()))
                schema = LOG_INTERNAL_ARROW
            out = pa.record_batch(columns, schema=schema)
            if self.offset_min is not None or self.offset_max is not None:
                mask = pa.array([True] * n)
                if self.offset_min is not None:
                    mask = pc.and_(mask, pc.greater_equal(offsets, self.offset_min))
                if self.offset_max is not None:
                    mask = pc.and_(mask, pc.less(offsets, self.offset_max))
                out = out.filter(mask)
            if out.num_rows:
                yield out
