"""The ``kvlog`` streaming source: micro-batches of the log view, in offset order.

An offset of the source is the position of every partition, as Spark stores it in the
query's checkpoint: ``{"<partition>": next_offset}`` (the offset of the partition's next
record to read, as in Kafka). A micro-batch reads, for each partition, the records with
``start <= offset < end``; offsets compaction removed are simply absent, so a start offset
whose record was compacted away resumes at the next surviving record.

The driver plans from the store's metadata alone (it reads no data file, but for one batch
per partition ``startingOffsetsByTimestamp`` names, once, when a new query starts):

* ``latestOffset(start, limit)`` answers each partition's end, or with a
  ``ReadMaxRows(maxRecordsPerTrigger)`` limit, at most that many *existing* records in all,
  shared across the partitions in proportion to their backlog (largest remainder, so the
  shares add up to the limit exactly and a partition with a backlog is never starved
  forever: what it is not given in one trigger stays its backlog in the next);
* ``initialOffset()`` is where a new query starts: ``startingOffsets``, or
  ``startingOffsetsByTimestamp``, each named partition's first record at or after its time
  (:mod:`spark_ext.by_timestamp`; its end when there is none);
* ``prepareForTriggerAvailableNow`` fixes the ends at the partitions' ends when the query
  starts, so ``trigger(availableNow=True)`` reads what was there and stops;
* ``partitions(start, end)`` gives one input partition per kvlog partition with records in
  the range: the live batches holding them, read by the executors with one ranged read each.
  With ``minPartitions``, a micro-batch of fewer input partitions has its ranges cut into at
  least that many slices instead (:mod:`spark_ext.splits`).

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
from spark_ext.by_timestamp import batch_reader, first_offset_at
from spark_ext.options import driver_cache_dir
from spark_ext.read_options import EARLIEST, LATEST, TimestampSpec
from spark_ext.reader import read_batches
from spark_ext.schemas import LOG_ARROW, expires_column
from spark_ext.splits import split_ranges
from spark_ext.stream_options import StreamReadOptions

__all__ = ["KvlogStreamReader", "share_limit"]

Offsets = dict[int, int]

#: How many times ``startingOffsetsByTimestamp`` lists the batches again when a data file it
#: reads was collected meanwhile.
_RESOLVE_ATTEMPTS = 3


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
        if self.options.starting_times is not None:
            return _as_json(self._offsets_at(self.options.starting_times))
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

    def _offsets_at(self, times: TimestampSpec) -> Offsets:
        """Where a new query starts by ``startingOffsetsByTimestamp``: in a partition it names,
        the offset of the first record at or after its time, or the partition's end when
        there is none (:mod:`spark_ext.by_timestamp`); in the others, the first record.

        A data file that GC in another process deleted, after a compaction replaced it, between
        the listing of the batches and their read, is answered by listing them again."""
        for attempt in range(_RESOLVE_ATTEMPTS):
            the_log = self._open()
            try:
                def collect(r: Any) -> tuple[Offsets, dict[int, list[LiveBatch]]]:
                    ends = {p: r.partition_end(p) for p in range(self.partition_count)}
                    return ends, {p: [b for b in r.iter_batches(p, 0) if b.max_timestamp >= t]
                                  for p, t in times.partitions if p in ends}

                ends, candidates = the_log.snapshot(collect)
                for p, _t in times.partitions:
                    if p not in ends:
                        raise ConfigError(f"startingOffsetsByTimestamp: partition {p} does not exist: the store has "
                                          f"{len(ends)} partitions (0 to {len(ends) - 1})")
                read = batch_reader(the_log.storage)
                out: Offsets = {p: 0 for p in ends}
                try:
                    for p, t in times.partitions:
                        out[p] = first_offset_at(candidates[p], t, ends[p], read)
                except FileNotFoundError:
                    if attempt == _RESOLVE_ATTEMPTS - 1:
                        raise
                    continue
                return out
            finally:
                the_log.close()
        raise AssertionError("unreachable: the last attempt returns or raises")

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
            def collect(r: Any) -> list[tuple[int, int, int, list[LiveBatch]]]:
                parts = []
                for p, (lo, hi) in sorted(wanted.items()):
                    batches = []
                    for b in r.iter_batches(p, lo):
                        if b.base >= hi:
                            break
                        batches.append(b)
                    if batches:
                        parts.append((p, lo, hi, batches))
                return parts

            found: list[tuple[int, int, int, list[LiveBatch]]] = the_log.snapshot(collect)
        finally:
            the_log.close()
        n = self.options.min_partitions
        if n is not None and len(found) < n:
            slices = split_ranges({p: (lo, hi, batches) for p, lo, hi, batches in found}, n)
            if len(slices) > len(found):
                found = [(s.partition, s.first, s.end, list(s.batches)) for s in slices]
        return [InputPartition(item) for item in found]

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
