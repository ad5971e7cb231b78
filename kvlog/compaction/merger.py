"""The merger: executes a :class:`~kvlog.compaction.planner.Plan` and writes the output files.

Per partition, in ascending order, over the inputs in commit order:

* pass 1 (cleaned partitions only) reads the dirty range through stream A of
  each input file and builds the offset map; if the map fills, the round ends
  at the last mapped offset + 1 (a partial round; later rounds continue). It
  also notes, in a roaring bitmap, every record of the dirty range that a
  later record of its key replaces;
* pass 2 reads every batch of the partition through stream B and keeps a
  record iff it lies at or beyond the round's end, or it is the latest for its
  key (and, for a tombstone, its delete horizon has not passed): a record of
  the clean section is looked up in the map, one of the dirty range in the
  bitmap, so only the clean section's keys are fingerprinted twice. A
  tombstone that survives without a horizon is stamped
  ``now + delete_retention_ms``.

Records move through both passes as Arrow arrays: fingerprints, map
operations and the keep mask are numpy, and survivors are Arrow filters of the
input batches.

Each input file is read through at most two forward-only streams, A and B:
on object storage, exactly two GETs per input file per job, however many
partitions it holds. Outputs hold partitions in ascending order, carry
explicit offsets, and a roaring bitmap of the present offsets where records
were removed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from kvlog.compaction.offset_map import MAX_RELATIVE_OFFSET, OffsetMap, fingerprints
from kvlog.compaction.planner import Plan
from kvlog.config import StoreConfig
from kvlog.errors import CorruptDataError, KvlogError
from kvlog.format.bitmap import decode_offsets, encode_offsets, offsets_of
from kvlog.format.commit import BatchEntry, FileEntry
from kvlog.format.datafile import BatchLocation, DataFileWriter, decode_batch, make_record_batch
from kvlog.storage.base import BytesLike, ForwardStream, Storage

__all__ = ["JobResult", "OutputWriter", "PartitionFailure", "run_job", "OUTPUT_BATCH_RECORDS"]

#: Records per output batch at most.
OUTPUT_BATCH_RECORDS = 65_536
#: Records fingerprinted and mapped at once.
MAP_CHUNK_RECORDS = 65_536
#: Decoded input bytes between two returns of unused Arrow memory to the system.
RELEASE_EVERY_BYTES = 16 * 2**20


class PartitionFailure(KvlogError):
    """Compacting one partition failed; ``partition`` says which, the cause is chained."""

    def __init__(self, partition: int, cause: BaseException) -> None:
        super().__init__(f"partition {partition}: {type(cause).__name__}: {cause}")
        self.partition = partition


@dataclass
class JobResult:
    """What a job wrote and what it saw."""

    outputs: list[FileEntry] = field(default_factory=list)
    checkpoints: dict[int, int] = field(default_factory=dict)
    partial: bool = False
    records_read: int = 0
    records_written: int = 0
    tombstones_removed: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    map_capacity: int = 0


class _Streams:
    """Stream A and stream B of every input file, opened on first use."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._open: dict[tuple[str, str], ForwardStream] = {}
        self.bytes_read = 0
        self._since_release = 0

    def read(self, which: str, batch: Mapping[str, Any]) -> pa.RecordBatch:
        key = (which, batch["path"])
        stream = self._open.get(key)
        if stream is None:
            try:
                stream = self._storage.open_stream(batch["path"], int(batch["pos"]))
            except FileNotFoundError:
                raise CorruptDataError(batch["path"], "input data file is missing") from None
            self._open[key] = stream
        stream.skip_to(int(batch["pos"]))
        data = stream.read(int(batch["len"]))
        self.bytes_read += len(data)
        location = BatchLocation(batch["pos"], batch["len"], batch["crc"], batch["n"], batch["bytes"],
                                 batch["ts"][0], batch["ts"][1])
        return decode_batch(batch["path"], data, location)

    def read_ahead(self, which: str, batches: Sequence[Mapping[str, Any]]
                   ) -> Iterator[tuple[Mapping[str, Any], pa.RecordBatch]]:
        """Each of ``batches`` with its records, read through stream ``which`` one batch ahead
        in a second thread (reading, checksumming and decoding release the GIL)."""
        if not batches:
            return
        with ThreadPoolExecutor(1, thread_name_prefix="kvlog-compaction-read") as pool:
            pending = pool.submit(self.read, which, batches[0])
            for i, batch in enumerate(batches):
                current = pending
                if i + 1 < len(batches):
                    pending = pool.submit(self.read, which, batches[i + 1])
                records = current.result()
                yield batch, records
                # Decoded batches are allocated by the reading thread and freed by this one: every
                # RELEASE_EVERY_BYTES, let Arrow's allocator hand such memory back rather than keep it.
                self._since_release += records.nbytes
                if self._since_release >= RELEASE_EVERY_BYTES:
                    self._since_release = 0
                    pa.default_memory_pool().release_unused()

    def close(self) -> None:
        for stream in self._open.values():
            stream.close()
        self._open.clear()


def _offsets(batch: Mapping[str, Any]) -> np.ndarray:
    """The present offsets of ``batch``, ascending."""
    base = int(batch["base"])
    present = batch.get("present")
    if present is None:
        return np.arange(base, int(batch["last"]) + 1, dtype=np.int64)
    return offsets_of(decode_offsets(batch["path"], present)).astype(np.int64) + base


class OutputWriter:
    """Accumulates kept records into batches and batches into output files (of about ``target_bytes``)."""

    def __init__(self, write_file: Callable[[BytesLike, list[BatchEntry]], FileEntry], config: StoreConfig,
                 target_bytes: int, spill_dir: Path | None = None) -> None:
        """With ``spill_dir`` (a local directory) output files are built there, not in memory."""
        self._write_file = write_file
        self._config = config
        self._target = target_bytes
        self._spill_dir = spill_dir
        self._writer: DataFileWriter | None = None
        self._entries: list[tuple[int, int, int, str | None, int | None]] = []
        self._written_bytes = 0
        self.files: list[FileEntry] = []
        self._reset_batch(-1)

    def _reset_batch(self, partition: int) -> None:
        self._partition = partition
        self._pieces: list[pa.RecordBatch] = []
        self._offsets: list[np.ndarray] = []
        self._rows = 0
        self._horizon: int | None = None
        self._has_tombstone = False

    def add_records(self, partition: int, records: pa.RecordBatch, offsets: np.ndarray,
                    horizon: int | None) -> None:
        """Add ``records`` (of the data-file schema) of ``partition`` at ``offsets``.

        ``horizon`` is their tombstones' delete horizon: a batch's horizon applies to all its
        tombstones, so tombstones of different horizons (or none) never share a batch.
        """
        n = records.num_rows
        if n == 0:
            return
        room = OUTPUT_BATCH_RECORDS - self._rows
        if n > room > 0:  # no output batch holds more than OUTPUT_BATCH_RECORDS records
            self.add_records(partition, records.slice(0, room), offsets[:room], horizon)
            self.add_records(partition, records.slice(room), offsets[room:], horizon)
            return
        has_tombstone = records.column(1).null_count > 0
        if partition != self._partition or (
            has_tombstone and self._has_tombstone and horizon != self._horizon
        ):
            self.end_batch()
            self._partition = partition
        if has_tombstone:
            self._has_tombstone = True
            self._horizon = horizon
        self._pieces.append(records)
        self._offsets.append(np.asarray(offsets, dtype=np.int64))
        self._rows += n
        if self._rows >= OUTPUT_BATCH_RECORDS:
            self.end_batch()

    def add(self, partition: int, keys: Sequence[bytes], values: Sequence[bytes | None],
            stamps: Sequence[int], offsets: Sequence[int], horizon: int | None) -> None:
        """Add records of ``partition`` given as Python sequences (see :meth:`add_records`)."""
        if keys:
            self.add_records(partition, make_record_batch(keys, values, stamps),
                             np.asarray(offsets, dtype=np.int64), horizon)

    def end_batch(self) -> None:
        if self._rows:
            if self._writer is None:
                spill = None
                if self._spill_dir is not None:
                    spill = self._spill_dir / f"output-{len(self.files)}.arrow"
                self._writer = DataFileWriter(self._config.compression, spill)
            pieces = self._pieces
            record_batch = pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)
            self._writer.add(record_batch)
            offsets = self._offsets[0] if len(self._offsets) == 1 else np.concatenate(self._offsets)
            base, last = int(offsets[0]), int(offsets[-1])
            dense = last - base + 1 == len(offsets)
            present = None if dense else encode_offsets(offsets - base)
            self._entries.append((self._partition, base, last, present, self._horizon))
            self._written_bytes += record_batch.nbytes
        self._reset_batch(self._partition)
        if self._written_bytes >= self._target:
            self.end_file()

    def end_file(self) -> None:
        if self._writer is None:
            return
        try:
            data, locations = self._writer.finish_view()
            entries = [
                BatchEntry(partition=p, location=loc, base_offset=base, last_offset=last, present=present,
                           tombstone_horizon_ms=horizon)
                for (p, base, last, present, horizon), loc in zip(self._entries, locations, strict=True)
            ]
            self.files.append(self._write_file(data, entries))
            del data
        finally:
            self._writer.close()
        self._writer = None
        self._entries = []
        self._written_bytes = 0

    def finish(self) -> list[FileEntry]:
        self.end_batch()
        self.end_file()
        return self.files

    def abandon(self) -> None:
        """Drop the file being built (after a failure)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def run_job(
    plan: Plan,
    batches_by_partition: Mapping[int, Sequence[Mapping[str, Any]]],
    storage: Storage,
    write_file: Callable[[BytesLike, list[BatchEntry]], FileEntry],
    offset_map: OffsetMap | None,
    seed: int,
    config: StoreConfig,
    now_ms: int,
    *,
    target_file_bytes: int = 64 * 2**20,
    progress: Callable[[int], None] | None = None,
    spill_dir: Path | None = None,
) -> JobResult:
    """Run ``plan`` over the live batches of its input files; write outputs through ``write_file``
    (built in ``spill_dir``, a local directory, when given)."""
    result = JobResult(map_capacity=offset_map.capacity if offset_map is not None else 0)
    streams = _Streams(storage)
    output = OutputWriter(write_file, config, target_file_bytes, spill_dir)
    try:
        for partition in sorted(batches_by_partition):
            batches = batches_by_partition[partition]
            try:
                spec = plan.clean.get(partition)
                if spec is not None and offset_map is not None:
                    superseded = BitMap()
                    round_end = _pass_one(spec.first_dirty, spec.first_uncleanable, batches, streams,
                                          offset_map, seed, superseded)
                    if round_end < spec.first_uncleanable:
                        result.partial = True
                    result.checkpoints[partition] = round_end
                    cleaning = _Round(spec.first_dirty, round_end, superseded, offset_map, seed)
                    _pass_two(partition, batches, streams, output, cleaning, config, now_ms, result)
                else:
                    _copy(partition, batches, streams, output, result)
            except KvlogError as e:
                if isinstance(e, PartitionFailure):
                    raise
                raise PartitionFailure(partition, e) from e
            if progress is not None:
                progress(len(batches))
        result.outputs = output.finish()
    finally:
        output.abandon()
        streams.close()
    result.bytes_read = streams.bytes_read
    result.bytes_written = sum(f.size for f in result.outputs)
    return result


@dataclass
class _Round:
    """What pass 1 of a partition learnt: the cleaned range and its superseded records."""

    first_dirty: int
    end: int
    superseded: BitMap
    """Offsets relative to ``first_dirty`` of records in the dirty range that a later record of
    the same key replaces (at most one bit per record of the dirty range)."""
    offset_map: OffsetMap
    seed: int

    def superseded_in(self, first: int, last: int) -> np.ndarray:
        """The superseded absolute offsets within ``first..last`` (both in the dirty range)."""
        bitmap = self.superseded
        low = bitmap.rank(first - self.first_dirty - 1) if first > self.first_dirty else 0
        high = bitmap.rank(last - self.first_dirty)
        if high <= low:
            return np.zeros(0, dtype=np.int64)
        return offsets_of(bitmap[low:high]).astype(np.int64) + self.first_dirty


def _pass_one(first_dirty: int, first_uncleanable: int, batches: Sequence[Mapping[str, Any]],
              streams: _Streams, offset_map: OffsetMap, seed: int, superseded: BitMap) -> int:
    """Build the map over the dirty range, noting superseded records; return the round's end."""
    offset_map.clear(base=first_dirty)
    limit = min(first_uncleanable, first_dirty + MAX_RELATIVE_OFFSET + 1)
    last_mapped = first_dirty - 1
    dirty = [b for b in batches if b["last"] >= first_dirty and b["base"] < limit]
    for batch, record_batch in streams.read_ahead("A", dirty):
        offsets = _offsets(batch)
        start, stop = (int(i) for i in np.searchsorted(offsets, [first_dirty, limit]))
        keys = record_batch.column(0)
        for chunk in range(start, stop, MAP_CHUNK_RECORDS):  # bounds the temporaries of large batches
            end = min(stop, chunk + MAP_CHUNK_RECORDS)
            selected = offsets[chunk:end]
            hi, lo = fingerprints(keys.slice(chunk, end - chunk), seed)
            mapped = offset_map.insert(hi, lo, selected, superseded)
            if mapped:
                last_mapped = int(selected[mapped - 1])
            if mapped < len(selected):
                return last_mapped + 1
    return limit


def _pass_two(partition: int, batches: Sequence[Mapping[str, Any]], streams: _Streams, output: OutputWriter,
              cleaning: _Round, config: StoreConfig, now_ms: int, result: JobResult) -> None:
    """Rewrite the partition: keep the latest record of every key (tombstones until their horizon)."""
    for batch, record_batch in streams.read_ahead("B", batches):
        offsets = _offsets(batch)
        n = len(offsets)
        result.records_read += n
        horizon = batch.get("horizon")
        prefix_end, cleaned_end = (int(i) for i in np.searchsorted(offsets, [cleaning.first_dirty, cleaning.end]))
        if cleaned_end == 0:  # wholly beyond the round: kept as it is
            output.add_records(partition, record_batch, offsets, horizon)
            result.records_written += n
            continue
        keep = np.ones(cleaned_end, dtype=bool)
        if prefix_end:  # the clean section: a record goes when the dirty range has its key
            hi, lo = fingerprints(record_batch.column(0).slice(0, prefix_end), cleaning.seed)
            keep[:prefix_end] = cleaning.offset_map.lookup(hi, lo) < 0
        if cleaned_end > prefix_end:  # the dirty range: a record goes when a later one replaced it
            dead = cleaning.superseded_in(int(offsets[prefix_end]), int(offsets[cleaned_end - 1]))
            if len(dead):
                dense = int(offsets[-1]) - int(offsets[0]) + 1 == n
                keep[dead - int(offsets[0]) if dense else np.searchsorted(offsets[:cleaned_end], dead)] = False
        new_horizon = horizon
        values = record_batch.column(1)
        if values.null_count:
            tombstone = values.is_null().to_numpy(zero_copy_only=False)[:cleaned_end]
            if (tombstone & keep).any():
                if horizon is not None and now_ms >= horizon:
                    keep &= ~tombstone
                elif horizon is None:
                    new_horizon = now_ms + config.delete_retention_ms
            result.tombstones_removed += int(np.count_nonzero(tombstone & ~keep))
        cleaned = record_batch.slice(0, cleaned_end)
        kept = int(np.count_nonzero(keep))
        if kept == cleaned_end:
            output.add_records(partition, cleaned, offsets[:cleaned_end], new_horizon)
        elif kept:
            output.add_records(partition, cleaned.filter(pa.array(keep)), offsets[:cleaned_end][keep], new_horizon)
        if cleaned_end < n:
            output.add_records(partition, record_batch.slice(cleaned_end), offsets[cleaned_end:], horizon)
        result.records_written += kept + n - cleaned_end


def _copy(partition: int, batches: Sequence[Mapping[str, Any]], streams: _Streams, output: OutputWriter,
          result: JobResult) -> None:
    for batch, record_batch in streams.read_ahead("B", batches):
        result.records_read += record_batch.num_rows
        result.records_written += record_batch.num_rows
        output.add_records(partition, record_batch, _offsets(batch), batch.get("horizon"))
