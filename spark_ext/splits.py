"""``minPartitions``: at least that many input partitions (Spark tasks) for a read, as in the Kafka source.

A read plans its own input partitions first (a batch read of the log view: one per data
file; a micro-batch: one per kvlog partition with records in its range). When that plan has
fewer than ``minPartitions``, the kvlog partitions' offset ranges are split instead, as the
Kafka source splits a large topic partition:

* the ``minPartitions`` slices are shared out across the kvlog partitions in proportion to the
  records each has to read (largest remainders get the slices left by rounding down, and a
  partition with records gets at least one), so the shares add up to ``minPartitions`` or, for
  the partitions that round up to one, a little more;
* a partition's share of ``n`` slices cuts its records into ``n`` runs of consecutive offsets
  of (within one) the same number of records. A cut may fall inside a batch: the slices on
  both sides then read that batch, each keeping its own offsets.

Only how the records are divided between tasks changes, never which records are read. The
counting uses the catalog alone (a batch's record count, and its offset bitmap when the cut
falls inside it), no data file. A slice holds at least one record, so a read of fewer records
than ``minPartitions`` has one slice per record: fewer input partitions than asked for.

View ``latest`` is split by key hash, not by offsets (:mod:`spark_ext.latest`): there,
``minPartitions`` raises the number of key-hash shares, which :func:`latest_share_counts`
shares out across the kvlog partitions in proportion to their stored bytes, with at most
:data:`spark_ext.latest.MAX_SHARES` per kvlog partition.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvlog.format.bitmap import decode_offsets, offsets_of
from kvlog.log import LiveBatch
from spark_ext.latest import MAX_SHARES

__all__ = ["Slice", "allocate", "batch_offsets", "latest_share_counts", "records_in", "slice_partition",
           "split_ranges"]


@dataclass(frozen=True)
class Slice:
    """The records of ``partition`` with ``first <= offset < end``, in ``batches`` (offset order)."""

    partition: int
    first: int
    end: int
    batches: tuple[LiveBatch, ...]


def batch_offsets(batch: LiveBatch) -> npt.NDArray[np.int64]:
    """The offsets of the records ``batch`` holds, ascending (compaction may have left gaps),
    from the catalog alone."""
    if batch.present is None:
        return np.arange(batch.base, batch.last + 1, dtype=np.int64)
    return offsets_of(decode_offsets(batch.path, batch.present)).astype(np.int64) + batch.base


def _offsets_in(batch: LiveBatch, first: int, end: int) -> npt.NDArray[np.int64]:
    offsets = batch_offsets(batch)
    return offsets[(offsets >= first) & (offsets < end)]


def records_in(batch: LiveBatch, first: int, end: int) -> int:
    """How many of ``batch``'s records have ``first <= offset < end``."""
    if batch.last < first or batch.base >= end:
        return 0
    if first <= batch.base and batch.last < end:
        return batch.count
    if batch.present is None:
        return min(batch.last + 1, end) - max(batch.base, first)
    return len(_offsets_in(batch, first, end))


def _nth_offset(batch: LiveBatch, first: int, end: int, index: int) -> int:
    """The offset of ``batch``'s ``index``-th record (from 0) with ``first <= offset < end``."""
    if batch.present is None:
        return max(batch.base, first) + index
    return int(_offsets_in(batch, first, end)[index])


def allocate(sizes: Mapping[int, int], parts: int) -> dict[int, int]:
    """How many of ``parts`` slices each key of ``sizes`` (a partition, its records) gets.

    In proportion to the sizes, rounded down, at least one for a non-zero size; the slices
    the rounding leaves go to the largest remainders (ties: the lower key). The shares add up
    to at least ``parts`` (more only when sizes rounded up to one), never exceed their size,
    and add up to the sizes' sum when that is at most ``parts``. Zero sizes get none.
    """
    wanted = {key: size for key, size in sizes.items() if size > 0}
    total = sum(wanted.values())
    if total <= parts:
        return dict(wanted)
    shares = {key: max(1, parts * size // total) for key, size in wanted.items()}
    left = parts - sum(shares.values())
    by_remainder = sorted(wanted, key=lambda key: (-(parts * wanted[key] % total), key))
    for key in by_remainder[:max(0, left)]:
        shares[key] += 1
    return shares


def slice_partition(partition: int, batches: Sequence[LiveBatch], first: int, end: int, parts: int) -> list[Slice]:
    """The records of ``batches`` (one partition's, offset order) with ``first <= offset < end``,
    cut into ``parts`` slices of consecutive offsets and as many records each as can be (fewer
    slices when there are fewer records). Every slice holds at least one record."""
    counts = [records_in(b, first, end) for b in batches]
    holding = [(b, n) for b, n in zip(batches, counts, strict=True) if n]
    total = sum(n for _b, n in holding)
    parts = min(parts, total)
    if parts <= 0:
        return []
    if parts == 1:
        return [Slice(partition, first, end, tuple(b for b, _n in holding))]
    # Slice j starts at the record numbered total * j // parts (strictly increasing: total >= parts).
    cuts = [first]
    index, before = 0, 0
    for j in range(1, parts):
        target = total * j // parts
        while before + holding[index][1] <= target:
            before += holding[index][1]
            index += 1
        cuts.append(_nth_offset(holding[index][0], first, end, target - before))
    cuts.append(end)
    members: list[list[LiveBatch]] = [[] for _ in range(parts)]
    for b, _n in holding:
        low = bisect.bisect_right(cuts, max(b.base, first)) - 1
        high = bisect.bisect_right(cuts, min(b.last, end - 1)) - 1
        for j in range(max(0, low), min(parts - 1, high) + 1):
            members[j].append(b)
    return [Slice(partition, cuts[j], cuts[j + 1], tuple(members[j])) for j in range(parts)]


def split_ranges(ranges: Mapping[int, tuple[int, int, Sequence[LiveBatch]]], min_partitions: int) -> list[Slice]:
    """``{partition: (first, end, batches)}`` cut into at least ``min_partitions`` slices (see the
    module doc), in partition then offset order."""
    sizes = {p: sum(records_in(b, first, end) for b in batches) for p, (first, end, batches) in ranges.items()}
    shares = allocate(sizes, min_partitions)
    return [piece for p in sorted(shares) for piece in slice_partition(p, ranges[p][2], ranges[p][0], ranges[p][1],
                                                                       shares[p])]


def latest_share_counts(stored_bytes: Mapping[int, int], natural: Mapping[int, int],
                        min_partitions: int) -> dict[int, int]:
    """View ``latest``: how many key-hash shares each kvlog partition is read in, given the
    ``natural`` counts (from ``latest_split_bytes``) and ``minPartitions``: the natural ones
    when they add up to at least ``min_partitions``, else at least a share of
    ``min_partitions`` in proportion to the partition's ``stored_bytes``, at most
    :data:`~spark_ext.latest.MAX_SHARES` (each share decodes its whole partition's keys)."""
    if sum(natural.values()) >= min_partitions:
        return dict(natural)
    wanted = allocate(stored_bytes, min_partitions)
    return {p: max(n, min(MAX_SHARES, wanted.get(p, 1))) for p, n in natural.items()}
