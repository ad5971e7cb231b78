"""Appending: one data file of a producer's batches, made live by one ``append`` commit.

A data file of at most ``commit_inline_bytes`` travels inside its commit (one object to
write, so a small durable flush costs one file and one directory fsync, or one PUT). A
larger one is written first under a fresh name nobody references; the commit then names
it. Replay decides each batch by the producer rules: accepted batches take their
partition's next offsets, a repeat of a remembered batch returns the original offsets,
and any refused batch refuses the whole commit (a write batch is all or nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn

import pyarrow as pa

from kvlog.errors import (
    OutOfOrderSequenceError,
    ProducerError,
    ProducerFencedError,
    ReadOnlyError,
    StorageError,
)
from kvlog.format.checksum import crc32c
from kvlog.format.commit import BatchEntry, Commit, FileEntry
from kvlog.format.datafile import DataFileWriter, batch_expires, content_digest, make_record_batch
from kvlog.log.naming import commit_name, data_file_name
from kvlog.log.producers import check_batch
from kvlog.log.records import AppendResult, ValidRecords
from kvlog.log.replay import FileCollected
from kvlog.meta import CommitOutcome, Refusal

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["PendingBatch", "append_batches", "raise_refusal", "to_record_batch", "write_data_file"]

log = logging.getLogger("kvlog.log")

#: How many times an append writes its data file again after GC collected it before its commit.
_COLLECTED_RETRIES = 5

_ERRORS: dict[str, type[ProducerError]] = {
    "ProducerFencedError": ProducerFencedError,
    "OutOfOrderSequenceError": OutOfOrderSequenceError,
}

#: A batch to write: (partition, records, the batch entry's producer fields).
_FileBatch = tuple[int, pa.RecordBatch, dict[str, Any]]


class PendingBatch:
    """A batch to append: a partition, its records, and its producer sequence."""

    __slots__ = ("partition", "records", "base_sequence")

    def __init__(self, partition: int, records: pa.RecordBatch, base_sequence: int) -> None:
        self.partition = partition
        self.records = records
        self.base_sequence = base_sequence


def to_record_batch(valid: ValidRecords) -> pa.RecordBatch:
    """The Arrow batch of validated records."""
    return make_record_batch(valid.keys, valid.values, valid.timestamps, valid.expires)


def raise_refusal(refusal: Refusal) -> NoReturn:
    """Raise the producer error a refused commit's outcome names."""
    raise _ERRORS.get(refusal.kind, ProducerError)(refusal.message)


def write_data_file(the_log: Log, level: int, batches: Sequence[_FileBatch], *,
                    inline_limit: int = 0) -> tuple[FileEntry, memoryview, bool]:
    """Write one data file of ``(partition, records, batch fields)`` (sorted by partition);
    returns its entry, its bytes (a read-only view) and whether it was kept to travel inside
    its commit instead (at most ``inline_limit`` bytes: nothing written, no path yet)."""
    the_log.check_open()
    if the_log.read_only:
        raise ReadOnlyError("the store is open read-only")
    expires = any(batch_expires(records) is not None for _p, records, _f in batches)
    # A file small enough to travel inside its commit is not compressed: zstd's setup costs about
    # 40 us a column of a batch (0.6 ms for a flush of 16 records over 6 partitions, five times
    # the rest of the file's encoding), and compaction compresses the records when it moves them.
    small = sum(records.nbytes for _p, records, _f in batches) <= inline_limit
    writer = DataFileWriter("none" if small else the_log.config.compression, expires=expires)
    order = sorted(range(len(batches)), key=lambda i: batches[i][0])
    for i in order:
        writer.add(batches[i][1])
    data, locations = writer.finish_view()  # the writer's own buffer, not a copy
    file_id = the_log.new_id()
    inline = len(data) <= inline_limit
    path = "" if inline else data_file_name(level, file_id)
    entries = []
    for i, loc in zip(order, locations, strict=True):
        partition, _records, fields = batches[i]
        entries.append(BatchEntry(partition=partition, location=loc, **fields))
    entry = FileEntry(file_id, path, level, len(data), crc32c(data), tuple(entries))
    if not inline:
        the_log.storage.put(path, data)
    return entry, data, inline


def _known_duplicates(
    the_log: Log, producer_id: int, epoch: int, batches: Sequence[PendingBatch], digests: Sequence[int]
) -> list[AppendResult] | None:
    """The original offsets if every batch repeats one the log already holds, else None.

    Offsets never change, so a duplicate seen in the cache is final. Checked on the cache, then
    once more after a refresh (a newer epoch may have fenced us; the refresh also checks the
    cache against the head); anything else is written and decided at replay as usual. A cache
    applies only published commits, so a duplicate it knows is of a commit every reader sees.
    """
    if the_log.read_only:
        return None
    results: list[AppendResult] = []
    expiration_ms = the_log.config.producer_id_expiration_ms
    for fresh in (False, True):
        if fresh:
            the_log.refresh()
        state, last_ms = the_log.snapshot(lambda r: (r.get_producer(producer_id), r.last_commit_ms()))
        if state is None:
            return None
        now = max(the_log.clock.now_ms(), last_ms)
        results = []
        for b, digest in zip(batches, digests, strict=True):
            try:
                decision = check_batch(state, b.partition, epoch, b.base_sequence, b.records.num_rows,
                                       now, expiration_ms, digest)
            except ProducerError:
                return None
            if decision.duplicate_of is None:
                return None
            results.append(AppendResult(decision.duplicate_of.first_offset,
                                        decision.duplicate_of.last_offset, True))
    return results


def append_batches(
    the_log: Log, producer_id: int, epoch: int, batches: Sequence[PendingBatch], *, resend: bool = True,
) -> list[AppendResult]:
    """Append batches of one producer in one data file and one commit, all or nothing; durable on return.

    ``resend=False`` says the batches were never sent before (a flush's first attempt): the
    cache is then not searched for them first (replay still decides, as for any batch).
    """
    if not batches:
        return []
    digests = [content_digest(b.records) for b in batches]
    known = _known_duplicates(the_log, producer_id, epoch, batches, digests) if resend else None
    if known is not None:
        return known  # a duplicate returns the original offsets and writes nothing
    fields: list[_FileBatch] = [
        (b.partition, b.records, {"producer_id": producer_id, "epoch": epoch,
                                  "base_sequence": b.base_sequence, "digest": digest})
        for b, digest in zip(batches, digests, strict=True)
    ]
    # The file's batch order is by partition; map each input batch to its position in the file.
    order = sorted(range(len(batches)), key=lambda i: batches[i].partition)
    position = {i: pos for pos, i in enumerate(order)}
    for _attempt in range(_COLLECTED_RETRIES):
        outcome = _append_file(the_log, fields, batches, position)
        if outcome.refusal is None or outcome.refusal.kind != FileCollected.__name__:
            break
        # GC condemned the file while the commit was on its way (a writer slower than
        # file_delete_delay_ms): nothing of it became live; write it again under a new name.
        log.warning("an append's data file was collected before its commit; writing it again")
    else:
        raise StorageError(
            f"garbage collection took this append's data file {_COLLECTED_RETRIES} times before "
            "its commit landed; nothing was written (raise file_delete_delay_ms)"
        )
    if outcome.refusal is not None:
        raise_refusal(outcome.refusal)
    by_position = {b.index: b for b in outcome.batches}
    results = []
    for i in range(len(batches)):
        b = by_position[position[i]]
        results.append(AppendResult(b.base, b.last, b.duplicate))
    return results


def _append_file(
    the_log: Log, fields: list[_FileBatch], batches: Sequence[PendingBatch], position: dict[int, int],
) -> CommitOutcome:
    """Write one data file of ``fields`` (or keep it to travel inside the commit) and commit
    it; the commit's outcome."""
    entry, data, inline = write_data_file(the_log, 0, fields, inline_limit=the_log.config.commit_inline_bytes)
    clock, delay_ms = the_log.clock, the_log.config.file_delete_delay_ms
    written_ms = clock.now_ms()
    commit_id = the_log.new_id()
    own = {(entry.file_id, position[i]): batches[i].records for i in range(len(batches))}

    def build(version: int) -> Commit:
        nonlocal written_ms
        now = clock.now_ms()
        if inline:
            # The file is the commit's attached bytes, at the commit's own name.
            return Commit(version, commit_id, now, "append", add=(replace(entry, path=commit_name(version)),),
                          attached=data)
        if now - written_ms > delay_ms // 2:
            # Long retries: refresh the file so orphan GC is unlikely to condemn it meanwhile
            # (if it does, the commit is refused and the caller writes a new file).
            the_log.storage.put(entry.path, data)
            written_ms = now
        return Commit(version, commit_id, now, "append", add=(entry,))

    return the_log.commit(build, own)
