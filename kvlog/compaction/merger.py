"""The merger: executes a :class:`~kvlog.compaction.planner.Plan` and writes the output files.

Per partition, in ascending order, over the inputs in commit order:

* pass 1 (cleaned partitions only) reads the keys of the dirty range through
  stream A of each input file and builds the offset map; if the map fills, the
  round ends at the last mapped offset + 1 (a partial round; later rounds
  continue). The offsets the map then holds, the latest record of every key of
  the round, go into a roaring bitmap;
* pass 2 reads every batch of the partition through stream B and keeps a
  record iff it lies at or beyond the round's end, or it is the latest for its
  key (and, for a tombstone, its delete horizon has not passed): a record of
  the clean section is looked up in the map, one of the dirty range in the
  bitmap, so only the clean section's keys are fingerprinted twice. A
  tombstone that survives without a horizon is stamped
  ``now + delete_retention_ms``. The clean section comes first; once it is
  done, the next partition's pass 1 may take the map over (after the last
  cleaned partition, its memory is handed back to the system).

Records move through both passes as Arrow arrays: fingerprints and map
operations are compiled loops over whole arrays (:mod:`kvlog.compaction.kernels`),
the keep mask is numpy, and survivors are Arrow filters of the input batches.
Partitions go through two stages, which may overlap (``run_job(overlap=True)``):
the calling thread runs pass 1 of a partition while a writer thread runs pass 2
(or the copy) of the one before, as soon as that pass 2 no longer reads the
map. In both passes a worker thread reads, checks and decodes the batches (and
fingerprints the keys in pass 1, selects the survivors in pass 2) while the
pass's thread inserts into the map (pass 1) or writes the output (pass 2); the
batches read ahead are bounded in bytes (:data:`PASS_ONE_AHEAD_BYTES`,
:data:`PASS_TWO_AHEAD_BYTES`).

Each input file is read through at most two forward-only streams, A and B:
on object storage, exactly two GETs per input file per job, however many
partitions it holds. Outputs hold partitions in ascending order, carry
explicit offsets, and a roaring bitmap of the present offsets where records
were removed.
"""

from __future__ import annotations

import array
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from kvlog.compaction.offset_map import MAX_RELATIVE_OFFSET, OffsetMap, fingerprints
from kvlog.compaction.planner import Plan
from kvlog.compaction.survivors import Kept, select
from kvlog.config import StoreConfig
from kvlog.errors import CorruptDataError, KvlogError
from kvlog.format.bitmap import decode_offsets, encode_offsets, offsets_of
from kvlog.format.commit import BatchEntry, FileEntry
from kvlog.format.datafile import (
    EXPIRES_VERSION,
    DataFileWriter,
    batch_expires,
    decode_batch,
    make_record_batch,
    with_schema,
)
from kvlog.memory import COMPACTION_POOL, release_unused_memory
from kvlog.meta import LiveBatch
from kvlog.storage.base import BytesLike, ForwardStream, Storage

__all__ = ["JobResult", "OutputWriter", "PartitionFailure", "WriteFile", "run_job", "OUTPUT_BATCH_RECORDS"]

#: Records per output batch at most.
OUTPUT_BATCH_RECORDS = 16_384
#: Stored bytes of input batches that pass 1 reads ahead of the batch whose keys are being
#: mapped (what it keeps of a batch is its keys, a small fraction of the batch).
PASS_ONE_AHEAD_BYTES = 8 * 2**20
#: Stored bytes of input batches that pass 2 (and a copy) reads ahead of the batch being
#: written: a batch larger than this is read only once the one before it is written, so at
#: most one decoded batch of that size is held at a time.
PASS_TWO_AHEAD_BYTES = 4 * 2**20

_T = TypeVar("_T")

#: Writes one output file: ``(its bytes, its batches, the local file holding those bytes or
#: None)``; the local file is a scratch file the callee may move into place.
WriteFile = Callable[[BytesLike, list[BatchEntry], Path | None], FileEntry]


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
    expired_removed: int = 0


class _Streams:
    """Stream A and stream B of every input file, opened on first use."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._open: dict[tuple[str, str], ForwardStream] = {}
        self.bytes_read = 0
        self._count_lock = threading.Lock()  # pass 1 and pass 2 of different partitions read at once

    def read(self, which: str, batch: LiveBatch, *, keys_only: bool = False) -> pa.RecordBatch:
        """The records of ``batch`` read through stream ``which`` (its keys alone with ``keys_only``)."""
        key = (which, batch.path)
        stream = self._open.get(key)
        if stream is None:
            try:
                stream = self._storage.open_stream(batch.path, batch.position)
            except FileNotFoundError:
                raise CorruptDataError(batch.path, "input data file is missing") from None
            self._open[key] = stream
        stream.skip_to(batch.position)
        data = stream.read(batch.length)
        with self._count_lock:
            self.bytes_read += len(data)
        return decode_batch(batch.path, data, batch.location, keys_only=keys_only, memory_pool=COMPACTION_POOL)

    def process(self, which: str, batches: Sequence[LiveBatch],
                prepare: Callable[[LiveBatch, pa.RecordBatch], _T], consume: Callable[[_T], bool],
                *, ahead_bytes: int, keys_only: bool = False) -> None:
        """``consume(prepare(batch, records))`` for each of ``batches`` in order, until ``consume``
        returns False.

        A worker thread reads each batch through stream ``which``, decodes it (its keys alone
        with ``keys_only``) and runs ``prepare``, while this thread consumes earlier results:
        reading, checksumming, decoding and numpy release the GIL, so the two overlap. While a
        result is consumed, the worker goes ahead by at most ``ahead_bytes`` of stored batches
        (always at least one batch when nothing is being consumed), which bounds the memory of
        batches in flight; a result is dropped before the batch after it is waited for.
        """
        if not batches:
            return
        queued: deque[tuple[Future[_T], int]] = deque()
        queued_bytes = 0
        following = 0

        def work(batch: LiveBatch) -> _T:
            return prepare(batch, self.read(which, batch, keys_only=keys_only))

        with ThreadPoolExecutor(1, thread_name_prefix="kvlog-compaction-read") as pool:

            def submit(limit: int) -> None:
                """Queue batches while those queued fit in ``limit`` bytes, or one if none is (limit 0)."""
                nonlocal queued_bytes, following
                while following < len(batches) and (
                    (not queued and not limit) or queued_bytes + batches[following].length <= limit
                ):
                    size = batches[following].length
                    queued.append((pool.submit(work, batches[following]), size))
                    queued_bytes += size
                    following += 1

            try:
                submit(0)
                while queued:
                    future, size = queued.popleft()
                    queued_bytes -= size
                    result = future.result()
                    submit(ahead_bytes)
                    going_on = consume(result)
                    del result
                    if not going_on:
                        break
                    submit(0)
            finally:
                for future, _size in queued:
                    future.cancel()
                # Arrow's allocator keeps freed memory in the heap of the thread that allocated
                # it, and the worker allocated the decoded batches: it hands them back before it
                # ends (an ended thread's heap would keep them). Within the pass the memory is
                # reused; handing it back after every batch would make each new batch fault its
                # pages in again.
                pool.submit(release_unused_memory).result()
        release_unused_memory()

    def close(self) -> None:
        for stream in self._open.values():
            stream.close()
        self._open.clear()


def _offsets(batch: LiveBatch) -> np.ndarray:
    """The present offsets of ``batch``, ascending."""
    base = batch.base
    present = batch.present
    if present is None:
        return np.arange(base, batch.last + 1, dtype=np.int64)
    return offsets_of(decode_offsets(batch.path, present)).astype(np.int64) + base


class OutputWriter:
    """Accumulates kept records into batches and batches into output files (of about ``target_bytes``)."""

    def __init__(self, write_file: WriteFile, config: StoreConfig,
                 target_bytes: int, spill_dir: Path | None = None, *, expires: bool = False) -> None:
        """With ``spill_dir`` (a local directory) output files are built there, not in memory.
        With ``expires`` the outputs have the ``expires`` column (data-file format 2): some
        input has it."""
        self._write_file = write_file
        self._expires = expires
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

        ``horizon`` is their dead records' delete horizon (tombstones and expired records): a
        batch's horizon applies to all of them, so records that may be dead with different
        horizons (or none) never share a batch.
        """
        n = records.num_rows
        if n == 0:
            return
        if self._expires and records.num_columns < 4:
            records = with_schema(records, EXPIRES_VERSION)  # one schema for every piece of a batch
        room = OUTPUT_BATCH_RECORDS - self._rows
        if n > room > 0:  # no output batch holds more than OUTPUT_BATCH_RECORDS records
            self.add_records(partition, records.slice(0, room), offsets[:room], horizon)
            self.add_records(partition, records.slice(room), offsets[room:], horizon)
            return
        # Records that may be dead: tombstones, and records with an expiry (which share the
        # tombstones' horizon rule, see kvlog.compaction.survivors).
        has_tombstone = records.column(1).null_count > 0 or batch_expires(records) is not None
        if partition != self._partition or (
            has_tombstone and self._has_tombstone and horizon != self._horizon
        ):
            self.end_batch()
            self._partition = partition
        if has_tombstone:
            self._has_tombstone = True
            self._horizon = horizon
        self._rows += n
        if self._rows < OUTPUT_BATCH_RECORDS and records.get_total_buffer_size() > 2 * records.nbytes + 2**16:
            # Kept past this call, a small slice of a large input batch would keep all of that
            # batch in memory while the next ones are read: keep a copy of the slice instead.
            records = pa.concat_batches([records], memory_pool=COMPACTION_POOL)
        self._pieces.append(records)
        self._offsets.append(np.asarray(offsets, dtype=np.int64))
        if self._rows >= OUTPUT_BATCH_RECORDS:
            self.end_batch()

    def add(self, partition: int, keys: Sequence[bytes], values: Sequence[bytes | None],
            stamps: Sequence[int], offsets: Sequence[int], horizon: int | None,
            expires: Sequence[int | None] | None = None) -> None:
        """Add records of ``partition`` given as Python sequences, with their expiries when given
        (see :meth:`add_records`)."""
        if keys:
            self.add_records(partition, make_record_batch(keys, values, stamps, expires),
                             np.asarray(offsets, dtype=np.int64), horizon)

    def end_batch(self) -> None:
        if self._rows:
            if self._writer is None:
                spill = None
                if self._spill_dir is not None:
                    spill = self._spill_dir / f"output-{len(self.files)}.arrow"
                self._writer = DataFileWriter(self._config.compression, spill, expires=self._expires)
            pieces = self._pieces
            record_batch = pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces, memory_pool=COMPACTION_POOL)
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
            self.files.append(self._write_file(data, entries, self._writer.spill_path))
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
    batches_by_partition: Mapping[int, Sequence[LiveBatch]],
    storage: Storage,
    write_file: WriteFile,
    offset_map: OffsetMap | None,
    seed: int,
    config: StoreConfig,
    now_ms: int,
    *,
    target_file_bytes: int = 64 * 2**20,
    progress: Callable[[int], None] | None = None,
    spill_dir: Path | None = None,
    overlap: bool = True,
) -> JobResult:
    """Run ``plan`` over the live batches of its input files; write outputs through ``write_file``
    (built in ``spill_dir``, a local directory, when given).

    Partitions go in ascending order through two stages: this thread runs pass 1 (the map),
    a writer thread runs pass 2 or the copy (the outputs). With ``overlap``, pass 1 of a
    partition starts as soon as pass 2 of the one before no longer needs the map, so the stages
    overlap while outputs stay in partition order; without it, a stage starts once the one
    before has ended (half the memory in flight). The first failing
    partition (lowest first) fails the job, once every stage already started has ended.
    """
    result = JobResult(map_capacity=offset_map.capacity if offset_map is not None else 0)
    streams = _Streams(storage)
    expires = any(b.schema == EXPIRES_VERSION for bs in batches_by_partition.values() for b in bs)
    output = OutputWriter(write_file, config, target_file_bytes, spill_dir, expires=expires)
    writes: deque[Future[None]] = deque()
    map_in_use: threading.Event | None = None  # set once the last round's pass 2 is done with the map
    cleaned = [p for p in batches_by_partition if p in plan.clean] if offset_map is not None else []
    last_cleaned = max(cleaned, default=None)

    def write_stage(partition: int, batches: Sequence[LiveBatch], cleaning: _Round | None) -> None:
        try:
            if cleaning is not None:
                _pass_two(partition, batches, streams, output, cleaning, config, now_ms, result)
            else:
                _copy(partition, batches, streams, output, result)
        except PartitionFailure:
            raise
        except KvlogError as e:
            raise PartitionFailure(partition, e) from e
        finally:
            if cleaning is not None:
                cleaning.map_free.set()
        if progress is not None:
            progress(len(batches))

    def raise_failed(*, wait: bool) -> None:
        """Raise the failure of the earliest write stage that failed (waiting for all with ``wait``)."""
        while writes and (wait or writes[0].done()):
            future = writes.popleft()
            if not future.cancelled():
                future.result()

    try:
        with ThreadPoolExecutor(1, thread_name_prefix="kvlog-compaction-write") as writer:
            try:
                for partition in sorted(batches_by_partition):
                    batches = batches_by_partition[partition]
                    spec = plan.clean.get(partition)
                    cleaning = None
                    if spec is not None and offset_map is not None:
                        if map_in_use is not None:
                            map_in_use.wait()
                        raise_failed(wait=False)
                        if len(writes) > 1:  # one stage writing and one waiting are enough
                            wait_futures([writes[0]])
                            raise_failed(wait=False)
                        try:
                            round_end, latest = _pass_one(spec.first_dirty, spec.first_uncleanable, batches,
                                                          streams, offset_map, seed)
                        except KvlogError as e:
                            raise PartitionFailure(partition, e) from e
                        if round_end < spec.first_uncleanable:
                            result.partial = True
                        result.checkpoints[partition] = round_end
                        cleaning = _Round(spec.first_dirty, round_end, latest, offset_map, seed,
                                          reused=partition != last_cleaned, hold=spec.hold)
                        if cleaning.reused and not any(b.base < spec.first_dirty for b in batches):
                            cleaning.map_free.set()  # no clean section: pass 2 never reads the map
                        map_in_use = cleaning.map_free
                    writes.append(writer.submit(write_stage, partition, batches, cleaning))
                    if not overlap:
                        raise_failed(wait=True)
                raise_failed(wait=True)
            except BaseException:
                for future in writes:
                    future.cancel()
                # An earlier partition's failure comes first; then this one.
                raise_failed(wait=True)
                raise
        result.outputs = output.finish()
    finally:
        output.abandon()
        streams.close()
    result.bytes_read = streams.bytes_read
    result.bytes_written = sum(f.size for f in result.outputs)
    return result


@dataclass
class _Round:
    """What pass 1 of a partition learnt: the cleaned range and the records that survive it."""

    first_dirty: int
    end: int
    latest: BitMap
    """Offsets relative to ``first_dirty`` of the records of the dirty range that are the latest
    of their key (what the map holds: one per key); the others are superseded."""
    offset_map: OffsetMap
    seed: int
    reused: bool = False
    """Whether a later partition's pass 1 takes the map over (its pages then stay resident)."""
    map_free: threading.Event = field(default_factory=threading.Event)
    """Set once pass 2 no longer reads the map (the next partition's pass 1 may then use it)."""
    hold: int | None = None
    """The offset from which on consumer groups hold dead records (see :mod:`kvlog.compaction.survivors`)."""

    def latest_in(self, first: int, last: int) -> np.ndarray:
        """The absolute offsets of latest records within ``first..last`` (both in the dirty range)."""
        bitmap = self.latest
        low = bitmap.rank(first - self.first_dirty - 1) if first > self.first_dirty else 0
        high = bitmap.rank(last - self.first_dirty)
        if high <= low:
            return np.zeros(0, dtype=np.int64)
        return offsets_of(bitmap[low:high]).astype(np.int64) + self.first_dirty

    def release_map(self) -> None:
        """Let the next partition's pass 1 have the map, or hand its memory back after the last."""
        if not self.reused:
            self.offset_map.release()
        self.map_free.set()


def _pass_one(first_dirty: int, first_uncleanable: int, batches: Sequence[LiveBatch],
              streams: _Streams, offset_map: OffsetMap, seed: int) -> tuple[int, BitMap]:
    """Build the map over the dirty range; return the round's end and the latest record of
    every key in the round (relative to ``first_dirty``).

    The worker thread reads and decodes each batch's keys and fingerprints those in the dirty
    range; this thread inserts them into the map in offset order.
    """
    offset_map.clear(base=first_dirty)
    limit = min(first_uncleanable, first_dirty + MAX_RELATIVE_OFFSET + 1)
    round_end = limit
    last_mapped = first_dirty - 1
    dirty = [b for b in batches if b.last >= first_dirty and b.base < limit]

    def prepare(batch: LiveBatch, records: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        offsets = _offsets(batch)
        start, stop = (int(i) for i in np.searchsorted(offsets, [first_dirty, limit]))
        hi, lo = fingerprints(records.column(0).slice(start, stop - start), seed)
        return offsets[start:stop], hi, lo

    def consume(prepared: tuple[np.ndarray, np.ndarray, np.ndarray]) -> bool:
        nonlocal last_mapped, round_end
        offsets, hi, lo = prepared
        mapped = offset_map.insert(hi, lo, offsets)  # one compiled call: no temporaries per record
        if mapped:
            last_mapped = int(offsets[mapped - 1])
        if mapped < len(offsets):  # the map is full: the round ends after the last mapped record
            round_end = last_mapped + 1
            return False
        return True

    streams.process("A", dirty, prepare, consume, ahead_bytes=PASS_ONE_AHEAD_BYTES, keys_only=True)
    latest = BitMap()
    for relative in offset_map.mapped_offsets():
        latest.update(array.array("I", relative.tobytes()))
    return round_end, latest


def _pass_two(partition: int, batches: Sequence[LiveBatch], streams: _Streams, output: OutputWriter,
              cleaning: _Round, config: StoreConfig, now_ms: int, result: JobResult) -> None:
    """Rewrite the partition: keep the latest record of every key (tombstones until their horizon).

    The worker thread decodes each batch and selects its survivors; this thread writes them.
    Only the clean section's keys are looked up in the map, and its batches come first: once
    the last of them is selected, the map's memory is handed back for the rest of the pass.
    """
    clean_batches = sum(1 for b in batches if b.base < cleaning.first_dirty)
    selected = 0
    if not clean_batches:
        cleaning.release_map()

    def prepare(batch: LiveBatch, record_batch: pa.RecordBatch) -> Kept:
        nonlocal selected
        kept = select(batch, record_batch, _offsets(batch), cleaning, config, now_ms)
        selected += 1
        if selected == clean_batches:
            cleaning.release_map()
        return kept

    streams.process("B", batches, prepare, _writing(partition, output, result), ahead_bytes=PASS_TWO_AHEAD_BYTES)


def _writing(partition: int, output: OutputWriter, result: JobResult) -> Callable[[Kept], bool]:
    """Pass 2's consumer: write what a batch keeps and count it."""

    def consume(kept: Kept) -> bool:
        for records, offsets, horizon in kept.pieces:
            output.add_records(partition, records, offsets, horizon)
        result.records_read += kept.read
        result.records_written += kept.written
        result.tombstones_removed += kept.tombstones_removed
        result.expired_removed += kept.expired_removed
        return True

    return consume


def _copy(partition: int, batches: Sequence[LiveBatch], streams: _Streams, output: OutputWriter,
          result: JobResult) -> None:
    def prepare(batch: LiveBatch, record_batch: pa.RecordBatch) -> Kept:
        n = record_batch.num_rows
        return Kept([(record_batch, _offsets(batch), batch.horizon_ms)], n, n)

    streams.process("B", batches, prepare, _writing(partition, output, result), ahead_bytes=PASS_TWO_AHEAD_BYTES)
