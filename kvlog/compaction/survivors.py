"""Pass 2's choice of survivors: which records of a batch a cleaning round keeps.

A record of the cleaned range stays iff it is the latest of its key (looked up in the offset
map for the clean section, in the round's bitmap for the dirty range) and it is not a dead
record past its batch's delete horizon. Dead records are tombstones and records whose expiry
the round's time has reached: both still supersede every older record of their key, which the
same pass removes, so they are kept, stamped with ``now + delete_retention_ms`` the first time a
round keeps them, and removed by a round at or after that horizon. Records at or beyond the
round's end are kept as they are.

A consumer group that holds tombstones (``store.consumer(group, hold_tombstones=True)``) keeps
every dead record at or after its committed offset whatever the horizon: a group that lags
behind ``delete_retention_ms`` still reads every delete. A batch whose horizon has passed but
that keeps such a record is stamped again (``now + delete_retention_ms``), so it is looked at
once a retention period, not by every round: a held record goes by the first round after the
hold has moved past it and its new horizon has passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlog.compaction.offset_map import fingerprints
from kvlog.config import StoreConfig
from kvlog.format.columns import bool_column, valid_mask
from kvlog.format.datafile import batch_expires
from kvlog.memory import COMPACTION_POOL
from kvlog.meta import LiveBatch

if TYPE_CHECKING:
    from kvlog.compaction.merger import _Round

__all__ = ["Kept", "expired_rows", "retain", "select"]


@dataclass
class Kept:
    """What pass 2 keeps of one input batch: pieces of records to write, and counts."""

    pieces: list[tuple[pa.RecordBatch, np.ndarray, int | None]]
    """(records, their offsets, their dead records' horizon), in offset order."""
    read: int
    written: int
    tombstones_removed: int = 0
    expired_removed: int = 0


def select(batch: LiveBatch, record_batch: pa.RecordBatch, offsets: np.ndarray, cleaning: _Round,
           config: StoreConfig, now_ms: int) -> Kept:
    """The survivors of one batch (its records at ``offsets``) in pass 2 (reads the map and the
    bitmap, changes neither)."""
    n = len(offsets)
    horizon = batch.horizon_ms
    prefix_end, cleaned_end = (int(i) for i in np.searchsorted(offsets, [cleaning.first_dirty, cleaning.end]))
    if cleaned_end == 0:  # wholly beyond the round: kept as it is
        return Kept([(record_batch, offsets, horizon)], n, n)
    keep = np.ones(cleaned_end, dtype=bool)
    if prefix_end:  # the clean section: a record goes when the dirty range has its key
        hi, lo = fingerprints(record_batch.column(0).slice(0, prefix_end), cleaning.seed)
        keep[:prefix_end] = cleaning.offset_map.lookup(hi, lo) < 0
    if cleaned_end > prefix_end:  # the dirty range: a record stays when it is the latest of its key
        alive = cleaning.latest_in(int(offsets[prefix_end]), int(offsets[cleaned_end - 1]))
        keep[prefix_end:] = False
        if len(alive):
            dense = int(offsets[-1]) - int(offsets[0]) + 1 == n
            keep[alive - int(offsets[0]) if dense else np.searchsorted(offsets[:cleaned_end], alive)] = True
    return retain(batch, record_batch, offsets, keep, config, now_ms, cleaning.hold)


def retain(batch: LiveBatch, record_batch: pa.RecordBatch, offsets: np.ndarray, keep: np.ndarray,
           config: StoreConfig, now_ms: int, hold: int | None = None) -> Kept:
    """The survivors of one batch given which records of its cleaned range are the latest of
    their key: ``keep`` covers the first ``len(keep)`` records (those below the round's end) and
    is narrowed here, in place, by the delete-horizon rule, except dead records at or after
    ``hold`` (a consumer group's tombstone hold); the records after them are kept as they are.

    The one home of the retention rule: the local cleaner's pass 2 (:func:`select`) and Spark's
    exact compaction (which finds the latest records through a shuffle on the real keys) both
    end here.
    """
    n = len(offsets)
    cleaned_end = len(keep)
    horizon = batch.horizon_ms
    if cleaned_end == 0:  # wholly beyond the round: kept as it is
        return Kept([(record_batch, offsets, horizon)], n, n)
    new_horizon = horizon
    tombstones_removed = expired_removed = 0
    values = record_batch.column(1)
    # A record expired at the round's time is dead like a tombstone: it still supersedes the
    # older records of its key (which the map removes in this same pass), is kept while it is
    # the latest of its key, and goes once its batch's delete horizon has passed.
    tombstone = ~valid_mask(values)[:cleaned_end] if values.null_count else None
    expired = expired_rows(record_batch, cleaned_end, now_ms)
    dead = tombstone if expired is None else expired if tombstone is None else tombstone | expired
    # The latest time a commit records: a horizon past it never passes either.
    stamp = min(now_ms + config.delete_retention_ms, 2**63 - 1)
    if dead is not None:
        if (dead & keep).any():
            if horizon is not None and now_ms >= horizon:
                held = int(np.searchsorted(offsets[:cleaned_end], hold)) if hold is not None else cleaned_end
                keep[:held] &= ~dead[:held]
                if (dead[held:] & keep[held:]).any():
                    new_horizon = stamp  # held past the horizon: stamped again, not looked at for a while
            elif horizon is None:
                new_horizon = stamp
        if tombstone is not None:
            tombstones_removed = int(np.count_nonzero(tombstone & ~keep))
        if expired is not None:
            expired_removed = int(np.count_nonzero(expired & ~keep))
    pieces: list[tuple[pa.RecordBatch, np.ndarray, int | None]] = []
    cleaned = record_batch.slice(0, cleaned_end)
    kept = int(np.count_nonzero(keep))
    if kept == cleaned_end:
        pieces.append((cleaned, offsets[:cleaned_end], new_horizon))
    elif kept:
        pieces.append((pc.filter(cleaned, bool_column(keep), memory_pool=COMPACTION_POOL), offsets[:cleaned_end][keep],
                       new_horizon))
    if cleaned_end < n:
        pieces.append((record_batch.slice(cleaned_end), offsets[cleaned_end:], horizon))
    return Kept(pieces, n, kept + n - cleaned_end, tombstones_removed, expired_removed)


def expired_rows(record_batch: pa.RecordBatch, rows: int, now_ms: int) -> np.ndarray | None:
    """Which of the first ``rows`` records have expired at ``now_ms`` (None: none has)."""
    expires = batch_expires(record_batch)
    if expires is None:
        return None
    head = expires.slice(0, rows)
    when = head.fill_null(np.iinfo(np.int64).max).to_numpy(zero_copy_only=False)
    expired: np.ndarray = valid_mask(head) & (when <= now_ms)
    return expired if expired.any() else None
