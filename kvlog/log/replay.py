"""Deterministic replay: applying one commit to the metadata cache.

Every reader applies the same commits in the same order with the same rules,
so every reader computes the same offsets, producer windows and live files.
"Now" for a commit is the largest commit timestamp seen so far, so a writer
with a slow clock cannot move time backwards for the producer rules.

Invariants checked before anything changes (SlateDB-style, named):

* ``offsets-increase``: an appended batch gets the partition's next offsets;
* ``replace-inputs-live``: every input of a replace is still live, else the
  whole replace is refused (it raced another compactor);
* ``replace-ranges-disjoint``: a replace's output batches of a partition do not
  overlap the partition's other live batches;
* ``producer-rules``: see :mod:`kvlog.log.producers`; any refused batch refuses
  the whole append commit (a write batch is all or nothing);
* ``files-not-collected``: a commit that adds a data file a ``gc`` commit
  condemned is refused whole (its writer writes the file again, or discards the
  job), so no commit ever makes live a file that GC deleted;
* ``pin-follows-its-version``: a ``pin`` commit keeps the version just before it, so every
  file it names is live when it lands (see :mod:`kvlog.log.pins_named`); ``pin-name-free``:
  a name is pinned once.

That each commit follows the one before it is not a rule of replay: only published
commits are replayed, and the committer checks their chain (:mod:`kvlog.log.committer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from kvlog.errors import CorruptDataError, KvlogError, ProducerError
from kvlog.format.commit import BatchEntry, Commit, FileEntry
from kvlog.format.producer_state import BatchMeta, ProducerState
from kvlog.index import index_batches
from kvlog.log.group_offsets import apply_offsets, holds_changed_after
from kvlog.log.naming import commit_name
from kvlog.log.pins_named import apply_pin, pinned_paths
from kvlog.log.producers import (
    accept_batch,
    check_batch,
    last_sequence,
    register_epoch,
)
from kvlog.meta.cache import MetaTxn
from kvlog.meta.records import (
    BatchOutcome,
    CleanerState,
    CommitOutcome,
    LiveBatch,
    LiveFile,
    Refusal,
)

__all__ = ["ApplySettings", "FileCollected", "apply_commit", "resolved_batch"]

#: Supplies the records of an appended batch: (file entry, batch index) -> record batch.
BatchSource = Callable[[FileEntry, int], pa.RecordBatch]


@dataclass(frozen=True)
class ApplySettings:
    """The settings replay depends on."""

    producer_id_expiration_ms: int
    file_delete_delay_ms: int
    inline_value_bytes: int
    maintain_index: bool = True
    """False: replay keeps the metadata only (a bulk index load follows)."""
    index_run_limit: int = 0
    """Index runs pending before they are merged (0: write the index itself)."""


def resolved_batch(file: FileEntry, batch: BatchEntry, base: int, last: int) -> LiveBatch:
    """The batch-directory value of a live batch."""
    loc = batch.location
    return LiveBatch(
        file.file_id, file.path, file.level, batch.partition, loc.position, loc.length, loc.crc,
        loc.count, loc.data_bytes, loc.min_timestamp, loc.max_timestamp, base, last,
        batch.present, batch.tombstone_horizon_ms, loc.schema,
    )


def apply_commit(
    txn: MetaTxn, commit: Commit, source: BatchSource, settings: ApplySettings
) -> CommitOutcome:
    """Apply ``commit`` (the next version) and return its outcome, which is also stored."""
    now = max(txn.last_commit_ms(), commit.timestamp_ms)
    try:
        if commit.kind == "append":
            _check_not_collected(txn, commit)
            outcome = CommitOutcome(commit.version, batches=_apply_append(txn, commit, source, settings, now))
        elif commit.kind == "replace":
            _check_not_collected(txn, commit)
            outcome = CommitOutcome(commit.version, batches=_apply_replace(txn, commit, settings, now))
        elif commit.kind == "offsets":
            _refuse_if(apply_offsets(txn, commit, now))
            outcome = CommitOutcome(commit.version)
        elif commit.kind in ("pin", "unpin"):
            _refuse_if(apply_pin(txn, commit))
            outcome = CommitOutcome(commit.version)
        elif commit.kind == "gc":
            condemned, kept = _apply_gc(txn, commit, now)
            outcome = CommitOutcome(commit.version, condemned=condemned, kept=kept)
        else:
            _apply_producer(txn, commit, settings, now)
            outcome = CommitOutcome(commit.version)
    except (ProducerError, _Refused) as e:
        # Only the rules refuse a commit. A corrupt or unreadable data file (CorruptDataError,
        # StorageError) propagates and aborts the transaction: recording it as refused would drop
        # a committed append for this reader only, and its offsets would differ from everyone's.
        outcome = CommitOutcome(commit.version, Refusal(type(e).__name__, str(e)))
    txn.set_version(commit.version)
    txn.set_last_commit_ms(now)
    txn.put_outcome(commit.commit_id, outcome)
    return outcome


class _Refused(KvlogError):
    """A replace whose inputs are gone, or that breaks an invariant."""


def _refuse_if(reason: str | None) -> None:
    if reason is not None:
        raise _Refused(reason)


class FileCollected(_Refused):
    """A commit adds a data file that a ``gc`` commit condemned (GC may have deleted it)."""


def _check_not_collected(txn: MetaTxn, commit: Commit) -> None:
    for file in commit.add:
        if txn.is_condemned(file.path):
            raise FileCollected(
                f"files-not-collected: {file.path} was collected as an orphan before this commit"
            )


def _apply_gc(txn: MetaTxn, commit: Commit, now: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Condemn the orphans a ``gc`` commit names; a file that is live, pending or kept by a
    named checkpoint is left alone.
    Returns the paths condemned and the paths kept."""
    live_paths = {entry.path for _fid, entry in txn.iter_files()}
    pending = {path for path, _due in txn.iter_pending()} | pinned_paths(txn)
    condemned: list[str] = []
    kept: list[str] = []
    for path in commit.remove:
        if path in live_paths or path in pending:
            kept.append(path)
            continue
        txn.put_condemned(path, now)
        condemned.append(path)
    return tuple(condemned), tuple(kept)


def _apply_append(
    txn: MetaTxn, commit: Commit, source: BatchSource, settings: ApplySettings, now: int
) -> tuple[BatchOutcome, ...]:
    exp = settings.producer_id_expiration_ms
    producers: dict[int, ProducerState | None] = {}
    ends: dict[int, int] = {}
    plan: list[tuple[FileEntry, int, BatchEntry, int, int, bool]] = []
    # Decide every batch first: one refused batch refuses the whole commit.
    for file in commit.add:
        for i, batch in enumerate(file.batches):
            p = batch.partition
            if p not in ends:
                ends[p] = txn.partition_end(p)
            count = batch.location.count
            pid = batch.producer_id
            if pid is None:
                base = ends[p]
                ends[p] = base + count
                plan.append((file, i, batch, base, base + count - 1, True))
                continue
            if pid not in producers:
                producers[pid] = txn.get_producer(pid)
            decision = check_batch(producers[pid], p, batch.epoch, batch.base_sequence, count, now, exp,
                                   batch.digest)
            if decision.accept:
                base = ends[p]
                ends[p] = base + count
                meta = BatchMeta(batch.base_sequence, last_sequence(batch.base_sequence, count),
                                 base, base + count - 1, now, batch.digest)
                producers[pid] = accept_batch(producers[pid], pid, p, batch.epoch, meta, now, exp)
                plan.append((file, i, batch, base, base + count - 1, True))
            else:
                dup = decision.duplicate_of
                assert dup is not None
                plan.append((file, i, batch, dup.first_offset, dup.last_offset, False))
    # Then write.
    results: list[BatchOutcome] = []
    live_batches: dict[str, list[tuple[int, int]]] = {}
    to_index: list[tuple[int, int, pa.RecordBatch]] = []
    for file, i, batch, base, last, accepted in plan:
        results.append(BatchOutcome(file.file_id, i, not accepted, base, last))
        if not accepted:
            continue
        txn.put_batch(resolved_batch(file, batch, base, last))
        live_batches.setdefault(file.file_id, []).append((batch.partition, last))
        if settings.maintain_index:
            to_index.append((batch.partition, base, source(file, i)))
    index_batches(txn, to_index, settings.inline_value_bytes, settings.index_run_limit)
    for file in commit.add:
        if file.file_id in live_batches:
            txn.put_file(file.file_id, _live_file(file, live_batches[file.file_id], commit.version,
                                                  (commit.version, 0)))
    for p, end in ends.items():
        txn.put_partition_end(p, end)
    for state in producers.values():
        if state is not None:
            txn.put_producer(state)
    return tuple(results)


def _live_file(file: FileEntry, batches: list[tuple[int, int]], version: int, order: tuple[int, int]) -> LiveFile:
    """The ``files`` value; ``order`` is its place in commit order (replace outputs take their inputs')."""
    return LiveFile(file.path, file.level, file.size, file.crc, tuple(batches), version, order)


def _apply_replace(txn: MetaTxn, commit: Commit, settings: ApplySettings, now: int) -> tuple[BatchOutcome, ...]:
    if commit.info.get("cleaner"):  # a cleaning round: it may have removed tombstones
        _refuse_if(holds_changed_after(txn, commit.info))
    inputs = []
    for file_id in commit.remove:
        entry = txn.get_file(file_id)
        if entry is None:
            raise _Refused(f"replace-inputs-live: input file {file_id} is no longer live")
        inputs.append((file_id, entry))
    removed: set[tuple[int, int]] = set()
    for _file_id, entry in inputs:
        removed.update(entry.batches)
    # replace-ranges-disjoint: outputs may not overlap batches that stay live.
    for file in commit.add:
        for batch in file.batches:
            if batch.base_offset is None or batch.last_offset is None:
                raise _Refused("replace output batches carry explicit offsets")
            for other in txn.iter_batches(batch.partition, batch.base_offset):
                if other.base > batch.last_offset:
                    break
                if (batch.partition, other.last) not in removed:
                    raise _Refused(
                        f"replace-ranges-disjoint: partition {batch.partition} offsets "
                        f"{batch.base_offset}..{batch.last_offset} overlap a live batch"
                    )
    first_order = min((e.order[0] for _f, e in inputs), default=commit.version)
    for file_id, entry in inputs:
        for p, last in entry.batches:
            txn.delete_batch(p, last)
        txn.delete_file(file_id)
        txn.put_pending(entry.path, now + settings.file_delete_delay_ms)
    results: list[BatchOutcome] = []
    for position, file in enumerate(commit.add):
        batches = []
        for i, batch in enumerate(file.batches):
            assert batch.base_offset is not None and batch.last_offset is not None
            txn.put_batch(resolved_batch(file, batch, batch.base_offset, batch.last_offset))
            batches.append((batch.partition, batch.last_offset))
            results.append(BatchOutcome(file.file_id, i, False, batch.base_offset, batch.last_offset))
        if batches:
            txn.put_file(file.file_id, _live_file(file, batches, commit.version, (first_order, position)))
    for p, state in (commit.info.get("cleaner") or {}).items():
        try:
            cleaner = CleanerState.from_json(state)
            partition = int(p)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CorruptDataError(commit_name(commit.version), f"malformed cleaner state for partition {p}") from None
        txn.put_cleaner(partition, cleaner)
    return tuple(results)


def _apply_producer(txn: MetaTxn, commit: Commit, settings: ApplySettings, now: int) -> None:
    if commit.producer_id is None or commit.epoch is None:
        raise _Refused("producer commit without producer id and epoch")
    state = register_epoch(
        txn.get_producer(commit.producer_id), commit.producer_id, commit.epoch, now,
        settings.producer_id_expiration_ms,
    )
    txn.put_producer(state)
