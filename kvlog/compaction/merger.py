"""The merger: executes a :class:`~kvlog.compaction.planner.Plan` and writes the output files.

Per partition, in ascending order, over the inputs in commit order:

* pass 1 (cleaned partitions only) reads the dirty range through stream A of
  each input file and builds the offset map; if the map fills, the round ends
  at the last mapped offset + 1 (a partial round; later rounds continue);
* pass 2 reads every batch of the partition through stream B and keeps a
  record iff it lies at or beyond the round's end, or it is the latest for its
  key (and, for a tombstone, its delete horizon has not passed). A tombstone
  that survives without a horizon is stamped ``now + delete_retention_ms``.

Each input file is read through at most two forward-only streams, A and B:
on object storage, exactly two GETs per input file per job, however many
partitions it holds. Outputs hold partitions in ascending order, carry
explicit offsets, and a roaring bitmap of the present offsets where records
were removed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from kvlog.compaction.offset_map import MAX_RELATIVE_OFFSET, OffsetMap, fingerprints
from kvlog.compaction.planner import Plan
from kvlog.config import StoreConfig
from kvlog.errors import CorruptDataError, KvlogError
from kvlog.format.bitmap import decode_offsets, encode_offsets
from kvlog.format.commit import BatchEntry, FileEntry
from kvlog.format.datafile import BatchLocation, DataFileWriter, decode_batch, make_record_batch
from kvlog.storage.base import ForwardStream, Storage

__all__ = ["JobResult", "OutputWriter", "PartitionFailure", "run_job", "OUTPUT_BATCH_RECORDS"]

#: Records per output batch at most.
OUTPUT_BATCH_RECORDS = 65_536


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

    def close(self) -> None:
        for stream in self._open.values():
            stream.close()
        self._open.clear()


def _offsets(batch: Mapping[str, Any]) -> np.ndarray:
    base = int(batch["base"])
    present = batch.get("present")
    if present is None:
        return np.arange(base, int(batch["last"]) + 1, dtype=np.int64)
    bitmap = decode_offsets(batch["path"], present)
    return np.fromiter(bitmap, dtype=np.int64, count=len(bitmap)) + base


class OutputWriter:
    """Accumulates kept records into batches and batches into output files (of about ``target_bytes``)."""

    def __init__(self, write_file: Callable[[bytes, list[BatchEntry]], FileEntry], config: StoreConfig,
                 target_bytes: int) -> None:
        self._write_file = write_file
        self._config = config
        self._target = target_bytes
        self._writer: DataFileWriter | None = None
        self._entries: list[tuple[int, int, int, str | None, int | None]] = []
        self._written_bytes = 0
        self.files: list[FileEntry] = []
        self._reset_batch(-1)

    def _reset_batch(self, partition: int) -> None:
        self._partition = partition
        self._keys: list[bytes] = []
        self._values: list[bytes | None] = []
        self._stamps: list[int] = []
        self._offs: list[int] = []
        self._horizon: int | None = None
        self._has_tombstone = False

    def add(self, partition: int, keys: Sequence[bytes], values: Sequence[bytes | None],
            stamps: Sequence[int], offsets: Sequence[int], horizon: int | None) -> None:
        """Add records of ``partition``; ``horizon`` is their tombstones' delete horizon.

        A batch's horizon applies to all its tombstones, so tombstones of different
        horizons (or none) never share a batch.
        """
        room = OUTPUT_BATCH_RECORDS - len(self._keys)
        if len(keys) > room > 0:  # no output batch holds more than OUTPUT_BATCH_RECORDS records
            self.add(partition, keys[:room], values[:room], stamps[:room], offsets[:room], horizon)
            self.add(partition, keys[room:], values[room:], stamps[room:], offsets[room:], horizon)
            return
        has_tombstone = any(v is None for v in values)
        if partition != self._partition or (
            has_tombstone and self._has_tombstone and horizon != self._horizon
        ):
            self.end_batch()
            self._partition = partition
        if has_tombstone:
            self._has_tombstone = True
            self._horizon = horizon
        self._keys.extend(keys)
        self._values.extend(values)
        self._stamps.extend(stamps)
        self._offs.extend(offsets)
        if len(self._keys) >= OUTPUT_BATCH_RECORDS:
            self.end_batch()

    def end_batch(self) -> None:
        if self._keys:
            if self._writer is None:
                self._writer = DataFileWriter(self._config.compression)
            record_batch = make_record_batch(self._keys, self._values, self._stamps)
            self._writer.add(record_batch)
            base, last = self._offs[0], self._offs[-1]
            dense = last - base + 1 == len(self._offs)
            present = None if dense else encode_offsets(o - base for o in self._offs)
            self._entries.append((self._partition, base, last, present, self._horizon))
            self._written_bytes += record_batch.nbytes
        self._reset_batch(self._partition)
        if self._written_bytes >= self._target:
            self.end_file()

    def end_file(self) -> None:
        if self._writer is None:
            return
        data, locations = self._writer.finish()
        entries = [
            BatchEntry(partition=p, location=loc, base_offset=base, last_offset=last, present=present,
                       tombstone_horizon_ms=horizon)
            for (p, base, last, present, horizon), loc in zip(self._entries, locations, strict=True)
        ]
        self.files.append(self._write_file(data, entries))
        self._writer = None
        self._entries = []
        self._written_bytes = 0

    def finish(self) -> list[FileEntry]:
        self.end_batch()
        self.end_file()
        return self.files


def run_job(
    plan: Plan,
    batches_by_partition: Mapping[int, Sequence[Mapping[str, Any]]],
    storage: Storage,
    write_file: Callable[[bytes, list[BatchEntry]], FileEntry],
    offset_map: OffsetMap | None,
    seed: int,
    config: StoreConfig,
    now_ms: int,
    *,
    target_file_bytes: int = 64 * 2**20,
    progress: Callable[[int], None] | None = None,
) -> JobResult:
    """Run ``plan`` over the live batches of its input files; write outputs through ``write_file``."""
    result = JobResult(map_capacity=offset_map.capacity if offset_map is not None else 0)
    streams = _Streams(storage)
    output = OutputWriter(write_file, config, target_file_bytes)
    try:
        for partition in sorted(batches_by_partition):
            batches = batches_by_partition[partition]
            try:
                spec = plan.clean.get(partition)
                if spec is not None and offset_map is not None:
                    round_end = _pass_one(spec.first_dirty, spec.first_uncleanable, batches, streams,
                                          offset_map, seed)
                    if round_end < spec.first_uncleanable:
                        result.partial = True
                    result.checkpoints[partition] = round_end
                    _pass_two(partition, batches, streams, output, offset_map, seed, round_end, config,
                              now_ms, result)
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
        streams.close()
    result.bytes_read = streams.bytes_read
    result.bytes_written = sum(f.size for f in result.outputs)
    return result


def _pass_one(first_dirty: int, first_uncleanable: int, batches: Sequence[Mapping[str, Any]],
              streams: _Streams, offset_map: OffsetMap, seed: int) -> int:
    """Build the map over the dirty range; return the round's end."""
    offset_map.clear(base=first_dirty)
    limit = min(first_uncleanable, first_dirty + MAX_RELATIVE_OFFSET + 1)
    last_mapped = first_dirty - 1
    for batch in batches:
        if batch["last"] < first_dirty or batch["base"] >= limit:
            continue
        record_batch = streams.read("A", batch)
        offsets = _offsets(batch)
        chosen = (offsets >= first_dirty) & (offsets < limit)
        if not chosen.any():
            continue
        keys = record_batch.column(0).filter(pa.array(chosen)).to_pylist()
        hi, lo = fingerprints(keys, seed)
        selected = offsets[chosen]
        mapped = offset_map.insert(hi, lo, selected)
        if mapped:
            last_mapped = int(selected[mapped - 1])
        if mapped < len(selected):
            return last_mapped + 1
    return limit


def _pass_two(partition: int, batches: Sequence[Mapping[str, Any]], streams: _Streams, output: OutputWriter,
              offset_map: OffsetMap, seed: int, round_end: int, config: StoreConfig, now_ms: int,
              result: JobResult) -> None:
    for batch in batches:
        record_batch = streams.read("B", batch)
        offsets = _offsets(batch)
        keys = record_batch.column(0).to_pylist()
        values = record_batch.column(1).to_pylist()
        stamps = record_batch.column(2).to_pylist()
        result.records_read += len(keys)
        cleaned = offsets < round_end
        keep = np.ones(len(keys), dtype=bool)
        horizon = batch.get("horizon")
        stamp_new = False
        if cleaned.any():
            idx = np.nonzero(cleaned)[0]
            hi, lo = fingerprints([keys[i] for i in idx], seed)
            latest = offset_map.lookup(hi, lo)
            keep[idx] = (latest < 0) | (offsets[idx] >= latest)
            for i in idx[keep[idx]]:
                if values[i] is None:
                    if horizon is not None and now_ms >= horizon:
                        keep[i] = False
                    elif horizon is None:
                        stamp_new = True
            result.tombstones_removed += sum(1 for i in idx if values[i] is None and not keep[i])
        kept = np.nonzero(keep)[0]
        if not len(kept):
            continue
        new_horizon = horizon
        if stamp_new:
            new_horizon = now_ms + config.delete_retention_ms
        for start, stop, run_horizon in _horizon_runs(kept, values, offsets, round_end, horizon, new_horizon):
            sel = kept[start:stop]
            output.add(partition, [keys[i] for i in sel], [values[i] for i in sel],
                       [stamps[i] for i in sel], offsets[sel].tolist(), run_horizon)
        result.records_written += len(kept)


def _horizon_runs(kept: np.ndarray, values: Sequence[bytes | None], offsets: np.ndarray, round_end: int,
                  old: int | None, new: int | None) -> Iterator[tuple[int, int, int | None]]:
    """Split kept records into runs by the horizon their tombstones carry (cleaned ones get ``new``)."""
    start = 0
    current: int | None = None
    for j, i in enumerate(kept):
        if values[i] is not None:
            continue
        h = new if offsets[i] < round_end else old
        if current is None:
            current = h
        elif h != current:
            yield start, j, current
            start, current = j, h
    yield start, len(kept), current


def _copy(partition: int, batches: Sequence[Mapping[str, Any]], streams: _Streams, output: OutputWriter,
          result: JobResult) -> None:
    for batch in batches:
        record_batch = streams.read("B", batch)
        offsets = _offsets(batch)
        result.records_read += record_batch.num_rows
        result.records_written += record_batch.num_rows
        output.add(partition, record_batch.column(0).to_pylist(), record_batch.column(1).to_pylist(),
                   record_batch.column(2).to_pylist(), offsets.tolist(), batch.get("horizon"))
