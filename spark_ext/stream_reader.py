"""The ``kvlog`` streaming source: micro-batches of the log view, in offset order.

An offset of the source is the position of every partition, as Spark stores it in the
query's checkpoint: ``{"<partition>": next_offset}`` (the offset of the partition's next
record to read, as in Kafka). A micro-batch reads, for each partition, the records with
``start <= offset < end``; offsets compaction removed are simply absent, so a start offset
whose record was compacted away resumes at the next surviving record.

The driver plans from the store's metadata alone (it never reads a data file):

* ``latestOffset(start, limit)`` answers each partition's end, or with a
  ``ReadMaxRows(maxRecordsPerTrigger)`` limit, at most that many *existing* records in all,
  shared across the partitions in proportion to their backlog (largest remainder, so the
  shares add up to the limit exactly and a partition with a backlog is never starved
  forever: what it is not given in one trigger stays its backlog in the next);
* ``prepareForTriggerAvailableNow`` fixes the ends at the partitions' ends when the query
  starts, so ``trigger(availableNow=True)`` reads what was there and stops;
* ``partitions(start, end)`` gives one input partition per kvlog partition with records in
  the range: the live batches holding them, read by the executors with one ranged read each.

Spark keeps the offsets of every planned micro-batch in its checkpoint before running it, so
a query restarted from its checkpoint re-runs an unfinished micro-batch over the same offsets
and then continues from its end: nothing is read twice and nothing skipped. (A re-run reads
the records that survive when it runs: compaction may have removed superseded ones since.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from kvlog.errors import ConfigError
from kvlog.format.bitmap import decode_offsets
from kvlog.log import LiveBatch, Log, open_log
from kvlog.storage import open_storage
from spark_ext.options import driver_cache_dir
from spark_ext.read_options import EARLIEST, LATEST
from spark_ext.reader import read_batches
from spark_ext.schemas import LOG_ARROW, expires_column
from spark_ext.stream_options import StreamReadOptions

__all__ = ["KvlogStreamReader", "share_limit"]

Offsets = dict[int, int]


def share_limit(backlog: dict[int, int], limit: int) -> dict[int, int]:
    """How many of its ``backlog`` records each partition may read when ``limit`` are allowed.

    Proportional to the backlog, rounded down, and the records left over by the rounding go
    to the largest remainders (ties: the lower partition), so the shares add up to
    ``min(limit, sum(backlog))`` and no share exceeds its backlog."""
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    shares = {p: limit * n // total for p, n in backlog.items()}
    left = limit - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda p: (-(limit * backlog[p] % total), p))
    for p in by_remainder[:left]:
        shares[p] += 1
    return shares


def _batch_offsets(batch: LiveBatch) -> list[int]:
    """The offsets of the records a live batch holds (compaction may have left gaps)."""
    if batch.present is None:
        return list(range(batch.base, batch.last + 1))
    return [batch.base + i for i in decode_offsets(batch.path, batch.present)]


def _count(r: Any, partition: int, start: int, end: int) -> int:
    """Records of ``partition`` that exist with ``start <= offset < end``."""
    n = 0
    for b in r.iter_batches(partition, start):
        if b.base >= end:
            break
        if start <= b.base and b.last < end:
            n += b.count
        else:
            n += sum(1 for o in _batch_offsets(b) if start <= o < end)
    return n


def _advance(r: Any, partition: int, start: int, end: int, records: int) -> int:
    """The offset just after the ``records``-th existing record from ``start`` (``end`` at most)."""
    if records <= 0:
        return start
    left = records
    for b in r.iter_batches(partition, start):
        if b.base >= end:
            break
        if start <= b.base and b.last < end and b.count < left:
            left -= b.count
            continue
        for o in _batch_offsets(b):
            if start <= o < end:
                left -= 1
                if left == 0:
                    return o + 1
    return end


def _as_offsets(value: dict[str, Any]) -> Offsets:
    return {int(p): int(o) for p, o in value.items()}


def _as_json(offsets: Offsets) -> dict[str, int]:
    return {str(p): o for p, o in sorted(offsets.items())}


class KvlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("kvlog")``: see the module's docstring."""

    def __init__(self, options: StreamReadOptions) -> None:
        self.options = options
        self.target: Offsets | None = None
        """The ends fixed by ``prepareForTriggerAvailableNow`` (None: follow the store)."""
        the_log = self._open()  # a missing store fails here, before the query plans anything
        try:
            self.partition_count = the_log.partitions
        finally:
            the_log.close()

    def _open(self) -> Log:
        o = self.options
        return open_log(o.uri, create=False, read_only=True, storage_options=o.storage_options,
                        cache_dir=driver_cache_dir(o.uri, o.cache_dir), maintain_index=False)

    def _ends(self) -> Offsets:
        the_log = self._open()
        try:
            ends: Offsets = the_log.snapshot(
                lambda r: {p: r.partition_end(p) for p in range(the_log.partitions)})
            return ends
        finally:
            the_log.close()

    # -- offsets ----------------------------------------------------------------------------------
    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
        ends = self._ends()
        starting = self.options.starting
        out: Offsets = {p: 0 if starting.default == EARLIEST else ends[p] for p in ends}
        for p, offset in starting.partitions:
            if p not in ends:
                raise ConfigError(f"startingOffsets names partition {p}; the store has partitions "
                                  f"0..{self.partition_count - 1}")
            if offset > ends[p]:
                raise ConfigError(f"startingOffsets: partition {p} starts at {offset}, after its end "
                                  f"{ends[p]} (the next offset it will assign)")
            out[p] = 0 if offset == EARLIEST else ends[p] if offset == LATEST else offset
        return _as_json(out)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        n = self.options.max_records_per_trigger
        return ReadMaxRows(n) if n is not None else super().getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        self.target = self._ends()

    def reportLatestOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
        return _as_json(self._ends())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        begin = _as_offsets(start)
        the_log = self._open()
        try:
            ends = self.target if self.target is not None else the_log.snapshot(
                lambda r: {p: r.partition_end(p) for p in range(the_log.partitions)})
            ends = {p: max(end, begin.get(p, 0)) for p, end in ends.items()}
            if not isinstance(limit, ReadMaxRows):
                return _as_json(ends)

            def limited(r: Any) -> Offsets:
                backlog = {p: _count(r, p, begin.get(p, 0), end) for p, end in ends.items()}
                shares = share_limit(backlog, limit.max_rows)
                return {p: _advance(r, p, begin.get(p, 0), ends[p], shares[p]) if shares[p] < backlog[p]
                        else ends[p] for p in ends}

            return _as_json(the_log.snapshot(limited))
        finally:
            the_log.close()

    # -- planning and reading ---------------------------------------------------------------------
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = _as_offsets(start), _as_offsets(end)
        wanted = {p: (begin.get(p, 0), hi) for p, hi in stop.items() if hi > begin.get(p, 0)}
        if not wanted:
            return []
        the_log = self._open()
        try:
            def collect(r: Any) -> list[InputPartition]:
                parts = []
                for p, (lo, hi) in sorted(wanted.items()):
                    batches = []
                    for b in r.iter_batches(p, lo):
                        if b.base >= hi:
                            break
                        batches.append(b)
                    if batches:
                        parts.append(InputPartition((p, lo, hi, batches)))
                return parts

            parts: list[InputPartition] = the_log.snapshot(collect)
            return parts
        finally:
            the_log.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        p, lo, hi, batches = partition.value
        storage = open_storage(self.options.uri, self.options.storage_options)
        try:
            for b, rb in read_batches(storage, batches, whole_file=False):
                offsets = pa.array(_batch_offsets(b), pa.int64())
                values = rb.column(1)
                n = rb.num_rows
                out = pa.record_batch([pa.array([p] * n, pa.int32()), offsets, rb.column(2), rb.column(0), values,
                                       pc.is_null(values), expires_column(rb)], schema=LOG_ARROW)
                if b.base < lo or b.last >= hi:
                    out = out.filter(pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi)))
                if out.num_rows:
                    yield out
        finally:
            storage.close()
