"""The latest-state view's input partitions and their read: vectorized, memory bounded by splitting.

A key's records all live in one kvlog partition, so a partition's latest state needs no
shuffle. A partition of more than :data:`LATEST_SPLIT_BYTES` stored bytes is split into
``n`` shares by a hash of the key (the 96-bit fingerprint the compactor uses, high word
modulo ``n``): each share is one Spark input partition, reads the partition's batches and
keeps the keys that hash to it, so a task holds at most about a split's worth of keys and a
large partition is read by several tasks at once. Option ``minPartitions`` raises the number of
shares (:func:`spark_ext.splits.latest_share_counts`).

A share's read has two passes over its batches. Pass 1 decodes the keys alone (only the key
buffers are decompressed) and finds, with one Arrow hash aggregation over the real keys
(exact: no fingerprint decides equality), the latest offset of each of its keys. Pass 2
decodes only the batches holding one of those offsets and takes those rows; tombstones and
records expired at the job's time hide their key.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlog.compaction.offset_map import fingerprints
from kvlog.format.bitmap import decode_offsets, offsets_of
from kvlog.format.datafile import decode_batch
from kvlog.log import LiveBatch
from spark_ext.schemas import LATEST_ARROW, expires_column

__all__ = ["LATEST_SPLIT_BYTES", "MAX_SHARES", "LatestShare", "latest_shares", "read_latest", "share_count"]

#: A kvlog partition of more stored bytes than this is read by several tasks (key-hash shares).
LATEST_SPLIT_BYTES = 256 * 2**20
#: At most this many shares per partition (each share reads the whole partition's keys).
MAX_SHARES = 64
#: The fingerprint seed of the shares' hash (any fixed value: it only spreads keys).
SHARE_SEED = 0x6B766C6F67


@dataclass(frozen=True)
class LatestShare:
    """The keys of one kvlog partition's ``batches`` (offset order) whose hash is ``index`` modulo ``of``."""

    batches: tuple[LiveBatch, ...]
    index: int = 0
    of: int = 1


def share_count(batches: Sequence[LiveBatch], split_bytes: int = LATEST_SPLIT_BYTES) -> int:
    """How many shares one kvlog partition's live batches are read in: one, or more past ``split_bytes``."""
    total = sum(b.length for b in batches)
    return max(1, min(MAX_SHARES, math.ceil(total / max(1, split_bytes))))


def latest_shares(batches: Sequence[LiveBatch], split_bytes: int = LATEST_SPLIT_BYTES, *,
                  shares: int | None = None) -> list[LatestShare]:
    """The shares of one kvlog partition's live batches: :func:`share_count` of them, or
    ``shares`` (``minPartitions``, :func:`spark_ext.splits.latest_share_counts`)."""
    n = share_count(batches, split_bytes) if shares is None else max(1, min(MAX_SHARES, shares))
    ordered = tuple(sorted(batches, key=lambda b: b.base))
    return [LatestShare(ordered, i, n) for i in range(n)]


def _offsets(b: LiveBatch) -> np.ndarray:
    if b.present is None:
        return np.arange(b.base, b.last + 1, dtype=np.int64)
    return offsets_of(decode_offsets(b.path, b.present)).astype(np.int64) + b.base


def _read(storage: Any, b: LiveBatch, *, keys_only: bool) -> pa.RecordBatch:
    return decode_batch(b.path, storage.read_range(b.path, b.position, b.length), b.location, keys_only=keys_only)


def _latest_offsets(storage: Any, share: LatestShare) -> np.ndarray:
    """Pass 1: the latest offset of each key of the share, ascending."""
    keys: list[pa.Array] = []
    offsets: list[np.ndarray] = []
    for b in share.batches:
        column = _read(storage, b, keys_only=True).column(0)
        at = _offsets(b)
        if share.of > 1:
            hi, _lo = fingerprints(column, SHARE_SEED)
            mine = hi % np.uint64(share.of) == share.index
            column, at = column.filter(pa.array(mine)), at[mine]
        if len(at):
            keys.append(column)
            offsets.append(at)
    if not keys:
        return np.empty(0, np.int64)
    table = pa.table({"key": pa.chunked_array(keys, keys[0].type), "offset": np.concatenate(offsets)})
    del keys, offsets
    latest = table.group_by("key", use_threads=False).aggregate([("offset", "max")]).column("offset_max")
    return np.sort(latest.to_numpy())


def read_latest(storage: Any, share: LatestShare, now_ms: int) -> Iterator[pa.RecordBatch]:
    """The latest record of each key of ``share`` that is live at ``now_ms``."""
    latest = _latest_offsets(storage, share)
    for b in share.batches:
        lo, hi = (int(i) for i in np.searchsorted(latest, [b.base, b.last + 1]))
        if lo == hi:
            continue
        offsets = _offsets(b)
        taken = latest[lo:hi]
        idx = pa.array(np.searchsorted(offsets, taken))
        rb = _read(storage, b, keys_only=False)
        values = rb.column(1).take(idx)
        expires = expires_column(rb).take(idx)
        live = pc.and_(pc.is_valid(values), pc.fill_null(pc.less(pa.scalar(now_ms, pa.int64()), expires), True))
        n = len(taken)
        out = pa.record_batch([
            rb.column(0).take(idx), values, pa.array(np.full(n, b.partition, dtype=np.int32)), pa.array(taken),
            rb.column(2).take(idx), expires,
        ], schema=LATEST_ARROW).filter(live)
        if out.num_rows:
            yield out
