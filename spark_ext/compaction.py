"""The two Spark stages of exact compaction (:func:`spark_ext.jobs.compact` plans and commits).

Stage 1 finds, exactly, the records a cleaning round removes because a newer record of their
key exists. Its tasks read the keys alone of every batch below a cleaned partition's first
uncleanable offset (only the key buffers are decompressed, no value crosses to the JVM) and
emit narrow rows (partition, key, offset, dirty); Spark shuffles them by (partition, key) and
each shuffle task finds, per real key, the latest offset of the dirty range and removes every
older record of the key. The removed offsets go back to the driver as roaring bitmaps (one
per partition and 2**32 offsets), which are broadcast.

Stage 2 rewrites: one task per run of input batches of about :func:`task_bytes` (in the
inputs' commit order, so a partition's outputs of task ``i`` precede those of task ``i + 1``
in offsets, and no sort or shuffle is needed). A task reads its byte range of each input file
once, and for each batch keeps the records the bitmap does not name, then applies the
retention rule of :func:`kvlog.compaction.survivors.retain` (dead records past their batch's
delete horizon go; dead records kept without one are stamped ``now + delete_retention_ms``),
the function the local cleaner's pass 2 ends in. The local cleaner removes a clean-section
record whose key the dirty range has (its offset map) and a dirty record that is not the
latest of its key (its bitmap); a record older than its key's latest dirty record is exactly
one of those two, so the shuffle's answer is the same set, and the rest of the rule is the
same code. Outputs are written through
:class:`kvlog.compaction.OutputWriter` with file ids derived from the job id, the task and a
sequence number: a retried task writes the very same files, and the driver deletes any file
of the job that its commit does not name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

from kvlog.compaction import OutputWriter
from kvlog.compaction.survivors import Kept, retain
from kvlog.config import StoreConfig
from kvlog.format.bitmap import bitmap_of, decode_offsets, offsets_of
from kvlog.format.checksum import crc32c
from kvlog.format.commit import BatchEntry, FileEntry, file_to_json
from kvlog.format.datafile import decode_batch
from kvlog.log import LiveBatch
from kvlog.log.naming import DATA_PREFIX, data_file_name
from kvlog.storage import open_storage
from kvlog.storage.base import BytesLike

__all__ = ["Round", "task_bytes", "group_batches", "KeysTask", "removed_bitmaps", "RewriteTask", "job_files",
           "NARROW_SCHEMA", "BITMAP_SCHEMA", "REWRITE_SCHEMA", "SHUFFLE_TASK_ROWS", "union_bitmaps",
           "stage_one", "REMOVED"]

NARROW_SCHEMA = "partition int, key binary, offset bigint, dirty boolean"
BITMAP_SCHEMA = "kind int, partition int, high bigint, bitmap binary"
#: The kind of stage 1's bitmaps: the offsets removed.
REMOVED = 0
REWRITE_SCHEMA = "result string"
#: Bounds of a stage task's share of the inputs (stored bytes).
MIN_TASK_BYTES = 4 * 2**20
MAX_TASK_BYTES = 128 * 2**20
#: Narrow rows per stage-1 shuffle task (each task holds its rows in one Arrow table).
SHUFFLE_TASK_ROWS = 1_000_000
#: Output files of about this size.
OUTPUT_FILE_BYTES = 64 * 2**20
_LOW = (1 << 32) - 1


@dataclass(frozen=True)
class Round:
    """One cleaned partition's range: [first_dirty, first_uncleanable)."""

    first_dirty: int
    first_uncleanable: int
    hold: int | None = None
    """The offset from which on consumer groups hold dead records (kept past their horizon)."""


def task_bytes(total: int, cores: int) -> int:
    """Stored bytes per stage task: about three tasks per core, within the bounds above."""
    return max(MIN_TASK_BYTES, min(MAX_TASK_BYTES, total // max(1, 3 * cores)))


def group_batches(files: Sequence[str], batches: Sequence[LiveBatch], target: int) -> list[list[LiveBatch]]:
    """``batches`` in runs of about ``target`` stored bytes, taken in the commit order of their
    ``files`` and by position within a file; a run never splits a batch."""
    by_file: dict[str, list[LiveBatch]] = {}
    for b in batches:
        by_file.setdefault(b.file_id, []).append(b)
    groups: list[list[LiveBatch]] = [[]]
    size = 0
    for file_id in files:
        for b in sorted(by_file.get(file_id, ()), key=lambda b: b.position):
            if size >= target:
                groups.append([])
                size = 0
            groups[-1].append(b)
            size += b.length
    return [g for g in groups if g]


def _read_spans(storage: Any, batches: Sequence[LiveBatch]) -> dict[str, tuple[int, bytes]]:
    """One ranged read per file: the bytes from its first to its last batch of ``batches``."""
    spans: dict[str, tuple[int, int]] = {}
    for b in batches:
        lo, hi = spans.get(b.path, (b.position, b.position + b.length))
        spans[b.path] = (min(lo, b.position), max(hi, b.position + b.length))
    return {path: (lo, storage.read_range(path, lo, hi - lo)) for path, (lo, hi) in spans.items()}


def _slice(spans: Mapping[str, tuple[int, bytes]], b: LiveBatch) -> memoryview:
    start, data = spans[b.path]
    return memoryview(data)[b.position - start:b.position - start + b.length]


def _offsets(b: LiveBatch) -> np.ndarray:
    if b.present is None:
        return np.arange(b.base, b.last + 1, dtype=np.int64)
    return offsets_of(decode_offsets(b.path, b.present)).astype(np.int64) + b.base


def _task_index(batches: Iterator[pa.RecordBatch]) -> int | None:
    """The id of ``spark.range(n, numPartitions=n)``'s one row in this task (None: no row)."""
    for rb in batches:
        if rb.num_rows:
            return int(rb.column(0)[0].as_py())
    return None


class KeysTask:
    """Stage 1's reading side: the narrow rows of one run of batches."""

    def __init__(self, uri: str, storage_options: dict[str, Any] | None, groups: list[list[LiveBatch]],
                 rounds: Mapping[int, Round]) -> None:
        self.uri = uri
        self.storage_options = storage_options
        self.groups = groups
        self.rounds = dict(rounds)

    def __call__(self, ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        index = _task_index(ids)
        if index is None:
            return
        batches = self.groups[index]
        storage = open_storage(self.uri, self.storage_options)
        try:
            spans = _read_spans(storage, batches)
        finally:
            storage.close()
        for b in batches:
            spec = self.rounds[b.partition]
            rb = decode_batch(b.path, _slice(spans, b), b.location, keys_only=True)
            offsets = _offsets(b)
            end = int(np.searchsorted(offsets, spec.first_uncleanable))
            if end == 0:
                continue
            head = offsets[:end]
            yield pa.record_batch([
                pa.array(np.full(end, b.partition, dtype=np.int32)), rb.column(0).slice(0, end), pa.array(head),
                pa.array(head >= spec.first_dirty),
            ], names=["partition", "key", "offset", "dirty"])


def _bitmap_rows(kind: int, partitions: np.ndarray, offsets: np.ndarray) -> Iterator[tuple[int, int, int, bytes]]:
    """(kind, partition, offset >> 32, roaring bitmap of the low 32 bits) of ``offsets``."""
    order = np.lexsort((offsets, partitions))
    partitions, offsets = partitions[order], offsets[order]
    highs = offsets >> 32
    cuts = np.flatnonzero((np.diff(partitions) != 0) | (np.diff(highs) != 0)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(offsets)], strict=True):
        if hi > lo:
            bitmap = bitmap_of(offsets[lo:hi] & _LOW)
            bitmap.run_optimize()
            yield kind, int(partitions[lo]), int(highs[lo]), bitmap.serialize()


def removed_bitmaps(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Stage 1's shuffle side, on the rows of whole (partition, key) groups: every record older
    than its key's latest dirty record is removed; the removed offsets as bitmaps."""
    received = [rb for rb in batches if rb.num_rows]
    if not received:
        return
    table = pa.Table.from_batches(received)
    dirty = pc.if_else(table.column("dirty"), table.column("offset"), pa.scalar(None, pa.int64()))
    narrow = table.select(["partition", "key", "offset"]).append_column("dirty_offset", dirty)
    latest = narrow.group_by(["partition", "key"], use_threads=False).aggregate([("dirty_offset", "max")])
    joined = narrow.select(["partition", "key", "offset"]).join(latest, ["partition", "key"], use_threads=False)
    removed = joined.filter(pc.less(joined.column("offset"), joined.column("dirty_offset_max")))
    del table, narrow, joined
    yield from _bitmap_batches(list(_bitmap_rows(REMOVED, removed.column("partition").to_numpy(),
                                                 removed.column("offset").to_numpy())))


def _bitmap_batches(rows: list[tuple[int, int, int, bytes]]) -> Iterator[pa.RecordBatch]:
    if rows:
        k, p, h, m = zip(*rows, strict=True)
        yield pa.record_batch([pa.array(k, pa.int32()), pa.array(p, pa.int32()), pa.array(h, pa.int64()),
                               pa.array(m, pa.binary())], names=["kind", "partition", "high", "bitmap"])


def stage_one(narrow: Any, rows: int, cores: int) -> dict[tuple[int, int, int], bytes]:
    """The bitmaps of the removed offsets, from the narrow rows: shuffled by (partition, key)
    into tasks of about :data:`SHUFFLE_TASK_ROWS` rows, each deduplicated by
    :func:`removed_bitmaps`."""
    shuffled = narrow.repartition(max(cores, -(-rows // SHUFFLE_TASK_ROWS)), "partition", "key")
    return union_bitmaps(shuffled.mapInArrow(removed_bitmaps, BITMAP_SCHEMA).collect())


def union_bitmaps(rows: Sequence[Any]) -> dict[tuple[int, int, int], bytes]:
    """The collected bitmap rows merged per (kind, partition, high), serialized for the broadcast."""
    merged: dict[tuple[int, int, int], BitMap] = {}
    for row in rows:
        key = (int(row["kind"]), int(row["partition"]), int(row["high"]))
        bitmap = BitMap.deserialize(bytes(row["bitmap"])) if row["bitmap"] else BitMap()
        if key in merged:
            merged[key] |= bitmap
        else:
            merged[key] = bitmap
    return {key: bitmap.serialize() for key, bitmap in merged.items()}


class _Marks:
    """The broadcast bitmaps, deserialized on first use in a task."""

    def __init__(self, serialized: Mapping[tuple[int, int, int], bytes]) -> None:
        self._serialized = serialized
        self._maps: dict[tuple[int, int, int], BitMap] = {}

    def between(self, kind: int, partition: int, first: int, last: int) -> np.ndarray:
        """The offsets of ``kind`` of ``partition`` in [first, last], ascending."""
        found = []
        for high in range(first >> 32, (last >> 32) + 1):
            key = (kind, partition, high)
            if key not in self._maps:
                data = self._serialized.get(key)
                self._maps[key] = BitMap.deserialize(data) if data is not None else BitMap()
            bitmap = self._maps[key]
            lo, hi = max(first - (high << 32), 0), min(last - (high << 32), _LOW)
            start = bitmap.rank(lo) - (1 if lo in bitmap else 0)
            part = offsets_of(bitmap[start:bitmap.rank(hi)]).astype(np.int64)
            found.append(part + (high << 32))
        return np.concatenate(found) if found else np.empty(0, np.int64)


class RewriteTask:
    """Stage 2: one run of input batches in, the survivors' output files out (one JSON row)."""

    def __init__(self, uri: str, storage_options: dict[str, Any] | None, groups: list[list[LiveBatch]],
                 rounds: Mapping[int, Round], removed: Any, config: StoreConfig, now_ms: int, level: int,
                 expires: bool, job_id: str) -> None:
        self.uri = uri
        self.storage_options = storage_options
        self.groups = groups
        self.rounds = dict(rounds)
        self.removed = removed  # a Spark broadcast of union_bitmaps' answer
        self.config = config
        self.now_ms = now_ms
        self.level = level
        self.expires = expires  # an input has the expires column: so do the outputs
        self.job_id = job_id

    def survivors(self, b: LiveBatch, data: BytesLike, marks: _Marks) -> Kept:
        """The survivors of batch ``b`` (its stored bytes ``data``)."""
        rb = decode_batch(b.path, data, b.location)
        offsets = _offsets(b)
        spec = self.rounds.get(b.partition)
        if spec is None:  # a partition this round does not clean: copied as it is
            return Kept([(rb, offsets, b.horizon_ms)], len(offsets), len(offsets))
        end = int(np.searchsorted(offsets, spec.first_uncleanable))
        keep = np.ones(end, dtype=bool)
        if end:
            head = offsets[:end]
            gone = marks.between(REMOVED, b.partition, int(head[0]), int(head[-1]))
            if len(gone):
                keep[np.searchsorted(head, gone)] = False
        return retain(b, rb, offsets, keep, self.config, self.now_ms, spec.hold)

    def __call__(self, ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        index = _task_index(ids)
        if index is None:
            return
        batches = sorted(self.groups[index], key=lambda b: (b.partition, b.base))
        marks = _Marks(self.removed.value)
        storage = open_storage(self.uri, self.storage_options)
        files: list[dict[str, Any]] = []
        counts = {"written": 0, "tombstones": 0, "expired": 0}

        def write_file(data: BytesLike, entries: list[BatchEntry], spill: Path | None) -> FileEntry:
            # The writer builds files in memory (``spill`` is None). Deterministic names: a retried
            # attempt of this task rewrites the same files.
            file_id = f"{self.job_id[:16]}{index:08x}{len(files):08x}"
            path = data_file_name(self.level, file_id)
            storage.put(path, data)
            entry = FileEntry(file_id, path, self.level, len(data), crc32c(data), tuple(entries))
            files.append(file_to_json(entry))
            return entry

        try:
            spans = _read_spans(storage, batches)
            output = OutputWriter(write_file, self.config, OUTPUT_FILE_BYTES, expires=self.expires)
            for b in batches:
                kept = self.survivors(b, _slice(spans, b), marks)
                counts["written"] += kept.written
                counts["tombstones"] += kept.tombstones_removed
                counts["expired"] += kept.expired_removed
                for records, offsets, horizon in kept.pieces:
                    output.add_records(b.partition, records, offsets, horizon)
            del spans
            output.finish()
        finally:
            storage.close()
        result = {"task": index, "files": files, **counts}
        yield pa.record_batch([pa.array([json.dumps(result)], pa.string())], names=["result"])


def job_files(storage: Any, level: int, job_id: str) -> list[str]:
    """The data files a job's tasks wrote (every attempt's)."""
    prefix = f"{DATA_PREFIX}{level}/{job_id[:16]}"
    return [name for name in storage.iter_names(prefix)]
