"""``startingOffsetsByTimestamp`` and ``endingOffsetsByTimestamp``: a time per partition resolved to an offset.

As Kafka's ``offsetsForTimes``, a time ``T`` (milliseconds since the epoch) resolves, in a
kvlog partition, to the offset of its **first record in offset order whose timestamp is at
or after T**; when no record is, to the partition's end (the next offset it will assign).
A starting offset so resolved is inclusive (a start at the end reads nothing yet), an ending
one exclusive (the read stops just before that record; an end at the end reads to the end).

Record timestamps need not grow with offsets (a writer's clock may step back, and a Spark
append or a stream sink writes the timestamps it is given). The offset is then the first
one from which on the running maximum of the timestamps reaches ``T``: records after it may
be older than ``T``, and they are read (a starting offset) or left (an ending one) with it,
as Kafka does. Offsets compaction removed hold no record: the answer is a surviving record's
offset.

The catalog keeps each live batch's least and greatest record timestamp
(``LiveBatch.min_timestamp``/``max_timestamp``), so the batches are walked in offset order
from the catalog alone: a batch whose greatest timestamp is before ``T`` is skipped unread;
one whose least is at or after ``T`` answers with its first offset, unread; only a batch
with timestamps on both sides of ``T`` is read (one ranged read) and decoded. That is at most
one batch per partition and option, on the driver, when the read is planned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlog.format.datafile import decode_batch
from kvlog.log import LiveBatch
from kvlog.storage import Storage
from spark_ext.read_options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    ReadOptions,
    TimestampSpec,
    check_partitions,
)
from spark_ext.splits import batch_offsets

__all__ = ["batch_reader", "first_offset_at", "resolve_times"]

#: Reads and decodes one live batch (its records, with their ``timestamp`` column).
BatchRead = Callable[[LiveBatch], pa.RecordBatch]


def batch_reader(storage: Storage) -> BatchRead:
    """A :data:`BatchRead` that reads a batch's bytes from ``storage`` (one ranged read) and decodes them."""
    def read(batch: LiveBatch) -> pa.RecordBatch:
        return decode_batch(batch.path, storage.read_range(batch.path, batch.position, batch.length), batch.location)

    return read


def first_offset_at(batches: Iterable[LiveBatch], time_ms: int, end: int, read: BatchRead) -> int:
    """The offset of the first record of ``batches`` (one partition's live batches, in offset
    order) whose timestamp is at or after ``time_ms``; ``end`` when there is none. Reads only
    a batch whose catalog timestamps straddle ``time_ms`` (see the module doc)."""
    for batch in batches:
        if batch.max_timestamp < time_ms:
            continue
        offsets = batch_offsets(batch)
        if not len(offsets):
            continue
        if batch.min_timestamp >= time_ms:
            return int(offsets[0])
        stamps = read(batch).column("timestamp")
        at_or_after = pc.fill_null(pc.greater_equal(stamps, pa.scalar(time_ms, pa.int64())), False)
        hits = np.flatnonzero(at_or_after.to_numpy(zero_copy_only=False))
        if len(hits):
            return int(offsets[hits[0]])
    return end


def _resolved(spec: TimestampSpec, default: int, by_partition: Mapping[int, Sequence[LiveBatch]],
              ends: Mapping[int, int], read: BatchRead) -> OffsetSpec:
    return OffsetSpec(default, tuple(
        (p, first_offset_at(by_partition.get(p, ()), time_ms, ends.get(p, 0), read)) for p, time_ms in spec.partitions))


def resolve_times(options: ReadOptions, partitions: int, batches: Sequence[LiveBatch], ends: Mapping[int, int],
                  read: BatchRead) -> ReadOptions:
    """``options`` with ``startingOffsetsByTimestamp``/``endingOffsetsByTimestamp`` replaced by
    the offsets they resolve to among ``batches`` (every live batch of a store of
    ``partitions`` partitions whose ends are ``ends``, in partition then offset order): the
    partitions they leave out start at the earliest offset and end at the latest.
    :class:`~kvlog.errors.ConfigError` for a partition the store does not have."""
    starting, ending = options.starting_timestamps, options.ending_timestamps
    if starting is None and ending is None:
        return options
    check_partitions(options, partitions)
    named = {p for spec in (starting, ending) if spec is not None for p, _t in spec.partitions}
    by_partition: dict[int, list[LiveBatch]] = {}
    for batch in batches:
        if batch.partition in named:
            by_partition.setdefault(batch.partition, []).append(batch)
    for items in by_partition.values():
        items.sort(key=lambda b: b.base)
    out = options
    if starting is not None:
        out = replace(out, starting_offsets=_resolved(starting, EARLIEST, by_partition, ends, read),
                      starting_timestamps=None)
    if ending is not None:
        out = replace(out, ending_offsets=_resolved(ending, LATEST, by_partition, ends, read), ending_timestamps=None)
    return out
