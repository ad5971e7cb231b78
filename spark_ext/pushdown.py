"""Filter pushdown of the ``kvlog`` data source: which filters prune what, and which Spark re-checks.

Spark offers the reader the filters of a query on its columns; the reader keeps
what it can use and returns the rest, which Spark then applies itself.

* ``partition`` (both views): ``=``, ``IN`` and ranges drop the other partitions'
  batches before any input partition is planned. Exact: not returned.
* ``offset`` (view ``log``): ``=`` and ranges drop the batches outside the range and
  the records outside it in the batches read. Exact: not returned. An ``IN`` list
  prunes to its smallest and largest offsets and is returned.
* ``key`` (both views): ``=`` and ``IN`` keep only the partitions those keys hash
  to (:func:`kvlog.log.records.partition_for_key`), ranges are applied to the rows
  each task reads, before they reach Spark. Returned: Spark checks them again.

The latest view never prunes on offsets: dropping a key's newer batches would
bring back a record they supersede. Filters of any other form are returned as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from kvlog.log import LiveBatch
from kvlog.log.records import partition_for_key

__all__ = ["Pruning", "Ranges"]

#: Offsets to read per partition: ``{partition: (first, end)}``, end exclusive.
Ranges = dict[int, tuple[int, int]]

_RANGES = (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


@dataclass
class _IntRange:
    """A half-open range ``[low, high)`` of integers (None: unbounded) narrowed filter by filter."""

    low: int | None = None
    high: int | None = None

    def narrow(self, low: int | None, high: int | None) -> None:
        if low is not None:
            self.low = low if self.low is None else max(self.low, low)
        if high is not None:
            self.high = high if self.high is None else min(self.high, high)

    def narrow_by(self, f: Filter, value: int) -> None:
        if isinstance(f, EqualTo):
            self.narrow(value, value + 1)
        elif isinstance(f, GreaterThan):
            self.narrow(value + 1, None)
        elif isinstance(f, GreaterThanOrEqual):
            self.narrow(value, None)
        elif isinstance(f, LessThan):
            self.narrow(None, value)
        elif isinstance(f, LessThanOrEqual):
            self.narrow(None, value + 1)

    def overlaps(self, first: int, last: int) -> bool:
        """Whether ``[first, last]`` (inclusive) meets the range."""
        if self.low is not None and self.high is not None and self.low >= self.high:
            return False
        return (self.low is None or last >= self.low) and (self.high is None or first < self.high)

    def contains(self, value: int) -> bool:
        return self.overlaps(value, value)


@dataclass
class Pruning:
    """What the pushed filters of one read let it skip (see the module doc)."""

    view: str = "log"
    partitions: set[int] | None = None
    partition_range: _IntRange = field(default_factory=_IntRange)
    offsets: _IntRange = field(default_factory=_IntRange)
    keys: set[bytes] | None = None
    key_ranges: list[tuple[Filter, bytes]] = field(default_factory=list)

    def push(self, filters: Iterable[Filter]) -> Iterator[Filter]:
        """Take what prunes from ``filters``; yield the filters Spark must still apply."""
        for f in filters:
            if not self._take(f):
                yield f

    def _take(self, f: Filter) -> bool:
        """Record ``f``; True when pruning applies it exactly (Spark need not check it)."""
        attribute = getattr(f, "attribute", None)
        column = attribute[0] if attribute and len(attribute) == 1 else None
        if column == "partition":
            if isinstance(f, In):
                values = {v for v in (_as_int(x) for x in f.value) if v is not None}
                if len(values) != len(f.value):
                    return False
                self.partitions = values if self.partitions is None else self.partitions & values
                return True
            if isinstance(f, (EqualTo, *_RANGES)) and (value := _as_int(f.value)) is not None:
                self.partition_range.narrow_by(f, value)
                return True
        elif column == "offset" and self.view == "log":
            if isinstance(f, (EqualTo, *_RANGES)) and (value := _as_int(f.value)) is not None:
                self.offsets.narrow_by(f, value)
                return True
            if isinstance(f, In):
                listed = [v for v in (_as_int(x) for x in f.value) if v is not None]
                if listed and len(listed) == len(f.value):
                    self.offsets.narrow(min(listed), max(listed) + 1)
        elif column == "key":
            if isinstance(f, EqualTo | In):
                found = {bytes(v) for v in (f.value if isinstance(f, In) else (f.value,))
                         if isinstance(v, bytes | bytearray)}
                self.keys = found if self.keys is None else self.keys & found
            elif isinstance(f, _RANGES) and isinstance(f.value, bytes | bytearray):
                self.key_ranges.append((f, bytes(f.value)))
        return False

    def partition_wanted(self, partition: int, count: int) -> bool:
        """Whether the reads of a store of ``count`` partitions need partition ``partition``."""
        if self.partitions is not None and partition not in self.partitions:
            return False
        if not self.partition_range.contains(partition):
            return False
        return self.keys is None or partition in {partition_for_key(k, count) for k in self.keys}

    def batches(self, batches: Iterable[LiveBatch], count: int, ranges: Ranges | None = None) -> list[LiveBatch]:
        """The batches a read needs, of a store of ``count`` partitions; ``ranges``: the offsets
        options resolved (:func:`spark_ext.read_options.offset_ranges`)."""
        wanted = {p for p in range(count) if self.partition_wanted(p, count)}
        return [b for b in batches if b.partition in wanted and self.offsets.overlaps(b.base, b.last)
                and (ranges is None or _IntRange(*ranges[b.partition]).overlaps(b.base, b.last))]

    def filters_rows(self, ranges: Ranges | None) -> bool:
        """Whether :meth:`rows` can drop anything."""
        return bool(self.key_ranges) or self.keys is not None or self.offsets.low is not None \
            or self.offsets.high is not None or ranges is not None

    def rows(self, batch: pa.RecordBatch, ranges: Ranges | None = None) -> pa.RecordBatch:
        """``batch`` (of one partition, as every batch a task yields) without the rows the
        pushed key and offset filters and the offset options rule out."""
        if not batch.num_rows:
            return batch
        mask = pa.array([True] * batch.num_rows, pa.bool_())
        keys = batch.column("key")
        if self.keys is not None:
            mask = pc.and_(mask, pc.is_in(keys, pa.array(sorted(self.keys), pa.binary())))
        for f, value in self.key_ranges:
            bound = pa.scalar(value, pa.binary())
            compare = {GreaterThan: pc.greater, GreaterThanOrEqual: pc.greater_equal, LessThan: pc.less,
                       LessThanOrEqual: pc.less_equal}[type(f)]
            mask = pc.and_(mask, compare(keys, bound))
        if self.view == "log":
            offsets = batch.column("offset")
            if self.offsets.low is not None:
                mask = pc.and_(mask, pc.greater_equal(offsets, self.offsets.low))
            if self.offsets.high is not None:
                mask = pc.and_(mask, pc.less(offsets, self.offsets.high))
            if ranges is not None:
                first, end = ranges[batch.column("partition")[0].as_py()]
                mask = pc.and_(mask, pc.and_(pc.greater_equal(offsets, first), pc.less(offsets, end)))
        return batch.filter(pc.fill_null(mask, False))
