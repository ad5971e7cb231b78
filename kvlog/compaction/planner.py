"""The planner: metadata in, a :class:`Plan` out. Pure: no I/O, no clock (``now_ms`` is given).

Two kinds of work, as in WarpStream:

merge
    when ``l0_merge_files`` L0 files wait, or an inline L0 file (carried inside its commit)
    is ``checkpoint_interval`` commits old, copy them into fewer L1 files, combining each
    partition's small batches; nothing is removed.
clean
    Kafka's cleaning round for every eligible partition. A partition is
    eligible when its dirty ratio (dirty bytes / (clean + dirty bytes),
    key plus value bytes) is strictly greater than
    ``min_cleanable_dirty_ratio``; or its oldest dirty record is older than
    ``max_compaction_lag_ms``; or a kept tombstone's delete horizon has passed
    (kvlog expires tombstones on idle partitions too). The dirty range starts at
    the partition's cleaner checkpoint and ends at the first uncleanable
    offset: the base of the first batch holding a record newer than
    ``now - min_compaction_lag_ms`` (a batch is cleanable iff its newest record
    is at least ``min_compaction_lag_ms`` old), else the end offset.

A clean job takes every live file, so each partition's inputs hold all of its
live records (prefix-complete: tombstones may be dropped); the files are a
contiguous run in commit order by construction. Partitions that are not
eligible are copied as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvlog.config import StoreConfig

__all__ = ["BatchInfo", "FileInfo", "CleanSpec", "Plan", "plan_compaction", "partition_state"]


@dataclass(frozen=True)
class BatchInfo:
    """What the planner knows of a live batch."""

    partition: int
    file_id: str
    base: int
    last: int
    data_bytes: int
    min_timestamp: int
    max_timestamp: int
    horizon_ms: int | None = None


@dataclass(frozen=True)
class FileInfo:
    """What the planner knows of a live file."""

    file_id: str
    level: int
    size: int
    order: tuple[int, int]
    """Commit order: (version that first made its data live, position among a replace's outputs)."""
    inline_due: bool = False
    """An inline file (inside its commit) old enough to move into a data file: its run of L0
    files is merged however short it is, so commit GC can collect the commit."""


@dataclass(frozen=True)
class CleanSpec:
    """One partition's cleaning round."""

    partition: int
    first_dirty: int
    first_uncleanable: int
    reason: str
    dirty_ratio: float
    hold: int | None = None
    """The offset from which on consumer groups hold dead records (tombstones and expired
    records): the round keeps them whatever their delete horizon. None: no hold."""


@dataclass(frozen=True)
class Plan:
    """A compaction job to run: its inputs (in commit order) and the partitions it cleans."""

    kind: str
    input_files: tuple[str, ...]
    output_level: int
    clean: Mapping[int, CleanSpec] = field(default_factory=dict)
    holds_at: int = 0
    """The version the tombstone holds were read at: the job's commit is refused if a hold
    started or moved back after it."""


def partition_state(
    batches: Sequence[BatchInfo], checkpoint: int, end_offset: int, config: StoreConfig, now_ms: int,
) -> tuple[int, int, int, int, float]:
    """(first dirty, first uncleanable, clean bytes, dirty bytes, dirty ratio) of one partition."""
    first_dirty = checkpoint
    if batches and first_dirty < batches[0].base:
        first_dirty = batches[0].base  # a checkpoint below the log start is raised to it
    if first_dirty > end_offset:
        first_dirty = batches[0].base if batches else end_offset  # beyond the end: re-clean
    lag_limit = now_ms - config.min_compaction_lag_ms
    first_uncleanable = end_offset
    for b in batches:
        if b.last >= first_dirty and b.max_timestamp > lag_limit:
            first_uncleanable = max(first_dirty, b.base)
            break
    clean = sum(b.data_bytes for b in batches if b.last < first_dirty)
    dirty = sum(b.data_bytes for b in batches if b.last >= first_dirty and b.base < first_uncleanable)
    total = clean + dirty
    ratio = dirty / total if total else 0.0
    return first_dirty, first_uncleanable, clean, dirty, ratio


def _eligible(
    partition: int, batches: Sequence[BatchInfo], checkpoint: int, end_offset: int,
    config: StoreConfig, now_ms: int, force: bool, hold: int | None,
) -> CleanSpec | None:
    first_dirty, first_uncleanable, _clean, dirty, ratio = partition_state(
        batches, checkpoint, end_offset, config, now_ms
    )
    has_dirty = dirty > 0 and first_dirty < first_uncleanable

    def spec(reason: str) -> CleanSpec:
        return CleanSpec(partition, first_dirty, first_uncleanable, reason, ratio, hold)

    if has_dirty and ratio > config.min_cleanable_dirty_ratio:
        return spec("dirty_ratio")
    if has_dirty and config.max_compaction_lag_ms is not None:
        oldest = min(b.min_timestamp for b in batches if b.last >= first_dirty and b.base < first_uncleanable)
        if now_ms - oldest > config.max_compaction_lag_ms:
            return spec("max_compaction_lag")
    if any(b.horizon_ms is not None and b.horizon_ms <= now_ms for b in batches):
        return spec("tombstone_horizon")
    if force and batches:
        return spec("forced")
    return None


def plan_compaction(
    files: Iterable[FileInfo],
    batches: Iterable[BatchInfo],
    checkpoints: Mapping[int, int],
    end_offsets: Mapping[int, int],
    config: StoreConfig,
    now_ms: int,
    *,
    force: bool = False,
    skip_partitions: Iterable[int] = (),
    holds: Mapping[int, int] | None = None,
    holds_at: int = 0,
) -> Plan | None:
    """The next job, or None when there is nothing to do.

    ``skip_partitions`` (partitions failing and backing off) are never cleaned, and
    no job takes a file that holds one of their batches. ``holds``: per partition, the offset
    from which on consumer groups hold dead records, as read at version ``holds_at``.
    """
    holds = holds or {}
    ordered = sorted(files, key=lambda f: f.order)
    by_partition: dict[int, list[BatchInfo]] = {}
    for b in batches:
        by_partition.setdefault(b.partition, []).append(b)
    for items in by_partition.values():
        items.sort(key=lambda b: b.base)
    skip = set(skip_partitions)
    blocked = {b.file_id for p in skip for b in by_partition.get(p, [])}
    clean: dict[int, CleanSpec] = {}
    for p, items in sorted(by_partition.items()):
        if p in skip:
            continue
        found = _eligible(p, items, checkpoints.get(p, 0), end_offsets.get(p, 0), config, now_ms, force,
                          holds.get(p))
        if found is not None:
            clean[p] = found
    if clean and not blocked:
        return Plan("clean", tuple(f.file_id for f in ordered), 2, clean, holds_at)
    # A merge takes a contiguous run of L0 files in commit order: skipping a blocked file (or
    # a higher-level one) would interleave the run's offset ranges with the skipped file's.
    runs: list[list[FileInfo]] = [[]]
    for f in ordered:
        if f.level == 0 and f.file_id not in blocked:
            runs[-1].append(f)
        elif runs[-1]:
            runs.append([])
    for level0 in runs:
        if len(level0) >= config.l0_merge_files or any(f.inline_due for f in level0):
            return Plan("merge", tuple(f.file_id for f in level0), 1)
    return None
