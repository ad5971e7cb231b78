"""The offset map's loops in numpy: the twin of the compiled ``_kernels`` (same functions,
results, table layout and errors); :mod:`kvlog._native` picks one of them and
:mod:`kvlog.compaction.kernels` wraps them.

Fingerprints are whole-array steps over the keys' 8-byte chunks. A probe of the
open-addressing table is a loop whose length depends on the data: it runs as rounds of
whole-array steps (gather each record's current row, compare, keep the records still
probing). Insertion places each new fingerprint where inserting the records one by one, in
order, would (first come, first served): every new key claims the first empty row of its
probe sequence; where several claim one row the earliest keeps it and the others probe on,
one by one in record order, taking a row from a later key whenever they reach it first.
:mod:`kvlog.compaction.offset_map` documents the hash and the layout.

This module does no I/O.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["insert_rows", "lookup_rows", "mapped_values", "nh_fingerprints"]

#: Any object with the buffer protocol: bytes, memoryview, a numpy array, an Arrow buffer.
Buffer = Any

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def _view(buffer: Buffer, dtype: type[np.generic], *, writable: bool = False) -> npt.NDArray[Any]:
    """The whole items of ``dtype`` in a buffer (a trailing part item is ignored)."""
    raw = memoryview(buffer)
    if writable and raw.readonly:
        raise TypeError("a read-write bytes-like object is required")
    raw = raw.cast("B")
    itemsize = np.dtype(dtype).itemsize
    return np.frombuffer(raw, dtype=dtype, count=len(raw) // itemsize)


def _fmix64(x: U64) -> U64:
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


def nh_fingerprints(data: Buffer, ends: Buffer, material: Buffer, first_mix: int, second_mix: int,
                    hi_out: Buffer, lo_out: Buffer, /) -> None:
    """Fingerprints of the keys ``data[ends[i]:ends[i + 1]]`` into ``hi_out``, ``lo_out``."""
    raw = memoryview(data).cast("B")
    end = _view(ends, np.int64)
    key = _view(material, np.uint32)
    first = np.uint64(int(first_mix) & (2**64 - 1))
    second = np.uint64(int(second_mix) & (2**64 - 1))
    hi = _view(hi_out, np.uint64, writable=True)
    lo = _view(lo_out, np.uint32, writable=True)
    n = len(end) - 1
    if n < 0 or len(hi) < n or len(lo) < n:
        raise ValueError("an output or the offsets is too small")
    if n == 0:
        return
    start, stop = end[:-1], end[1:]
    if (start < 0).any() or (stop < start).any() or (stop > len(raw)).any():
        raise ValueError("key offsets outside the key data")
    lengths = stop - start
    chunks = (lengths + 7) // 8
    if (2 * chunks + 4 > len(key)).any():
        raise ValueError("the key material is too small")
    bytes_ = np.frombuffer(raw, dtype=np.uint8)
    total = int(chunks.sum())
    sums = np.zeros((3, n), dtype=np.uint64)
    if total:
        owner = np.repeat(np.arange(n), chunks)
        first_chunk = np.cumsum(chunks) - chunks
        index = np.arange(total, dtype=np.int64) - first_chunk[owner]  # the chunk's number in its key
        at = start[owner] + 8 * index
        padded = np.zeros(len(bytes_) + 8, dtype=np.uint8)  # every chunk's 8 bytes readable
        padded[: len(bytes_)] = bytes_
        chunk_bytes = np.lib.stride_tricks.sliding_window_view(padded, 8)[at]
        inside = np.arange(8, dtype=np.int64) < (stop[owner] - at)[:, None]  # zero past the key
        chunk_bytes = np.where(inside, chunk_bytes, np.uint8(0))
        words = np.ascontiguousarray(chunk_bytes, dtype=np.uint8).view("<u4").astype(np.uint64)
        w0, w1 = words[:, 0], words[:, 1]
        keyed = key.astype(np.uint64)
        nonempty = chunks > 0
        for lane in range(3):
            a = (w0 + keyed[2 * index + 2 * lane]) & _LOW32
            b = (w1 + keyed[2 * index + 2 * lane + 1]) & _LOW32
            sums[lane, nonempty] = np.add.reduceat(a * b, first_chunk[nonempty])
    length = lengths.astype(np.uint64)
    s0, s1, s2 = sums
    s1 = s1 ^ _fmix64(length ^ first)
    s2 = s2 ^ _fmix64(length ^ second)
    s0 = s0 + _fmix64(s1)
    hi[:n] = _fmix64(s0)
    lo[:n] = (_fmix64(s2) >> _SHIFT32).astype(np.uint32)


def _table(table: Buffer, slots: int, *, writable: bool) -> U64:
    rows = _view(table, np.uint64, writable=writable)
    if slots < 1 or len(rows) // 2 < slots:
        raise ValueError("the table or an input is too small")
    return rows[: 2 * slots].reshape(slots, 2)


def _probe(rows: U64, hi: U64, tag: U64) -> tuple[I64, npt.NDArray[np.bool_]]:
    """For each fingerprint (``hi``, ``tag``): its row, or the first empty row of its probe
    sequence (-1 when every row holds another fingerprint), and whether that row is empty."""
    slots = len(rows)
    n = len(hi)
    position = (((hi >> _SHIFT32) * np.uint64(slots)) >> _SHIFT32).astype(np.int64)
    result = np.full(n, -1, dtype=np.int64)
    empty = np.zeros(n, dtype=bool)
    pending = np.arange(n)
    for _ in range(slots):
        if not len(pending):
            break
        here = rows[position[pending]]
        is_empty = (here[:, 0] == 0) & (here[:, 1] == 0)
        is_match = ~is_empty & (here[:, 0] == hi[pending]) & ((here[:, 1] >> _SHIFT32) == tag[pending])
        done = is_empty | is_match
        result[pending[done]] = position[pending[done]]
        empty[pending[is_empty]] = True
        pending = pending[~done]
        position[pending] += 1
        position[pending[position[pending] == slots]] = 0
    return result, empty


def insert_rows(table: Buffer, slots: int, hi: Buffer, lo: Buffer, relative: Buffer, size: int,
                capacity: int, /) -> tuple[int, int]:
    """Insert records in order, keeping each fingerprint's highest value; returns (records
    mapped, new size). Stops before the first new fingerprint when ``size`` is ``capacity``
    or no row is empty."""
    rows = _table(table, slots, writable=True)
    h = _view(hi, np.uint64)
    n = len(h)
    lows = _view(lo, np.uint32)
    rel = _view(relative, np.int64)
    if len(lows) < n or len(rel) < n:
        raise ValueError("the table or an input is too small")
    if n == 0:
        return 0, size
    value = (lows[:n].astype(np.uint64) << _SHIFT32) | rel[:n].astype(np.uint64)
    tag = value >> _SHIFT32
    position, empty = _probe(rows, h, tag)
    # Group the records by fingerprint; a group's first record is its earliest (stable sort).
    order = np.lexsort((tag, h))
    boundary = np.ones(n, dtype=bool)
    boundary[1:] = (h[order][1:] != h[order][:-1]) | (tag[order][1:] != tag[order][:-1])
    starts = np.flatnonzero(boundary)
    group = np.empty(n, dtype=np.int64)
    group[order] = np.cumsum(boundary) - 1
    first = order[starts]  # each group's first record
    new = position[first] < 0
    new |= empty[first]
    new_groups = np.flatnonzero(new)
    new_groups = new_groups[np.argsort(first[new_groups], kind="stable")]  # in record order
    room = max(0, min(capacity - size, len(new_groups)))
    slot_of, room = _place(rows, position[first[new_groups[:room]]], room)
    mapped = n if room == len(new_groups) else int(first[new_groups[room]])
    kept = group[:mapped]
    best = np.zeros(len(starts), dtype=np.uint64)
    np.maximum.at(best, kept, value[:mapped])
    touched = np.zeros(len(starts), dtype=bool)
    touched[kept] = True
    old = touched & ~new
    old_rows = position[first[old]]
    rows[old_rows, 1] = np.maximum(rows[old_rows, 1], best[old])
    placed = new_groups[:room]
    rows[slot_of[:room], 0] = h[first[placed]]
    rows[slot_of[:room], 1] = best[placed]
    return mapped, size + room


def _place(rows: U64, candidate: I64, count: int) -> tuple[I64, int]:
    """Rows for ``count`` new fingerprints, in record order, whose probe sequences first reach
    an empty row at ``candidate``: where inserting them one by one would put them. Returns the
    rows and how many fit (all of them unless the table runs out of empty rows)."""
    slots = len(rows)
    if count == 0:
        return candidate, 0
    if (candidate < 0).any():  # no empty row at all
        return candidate[:0], 0
    winner = np.ones(count, dtype=bool)
    sorted_by_row = np.argsort(candidate, kind="stable")
    same = candidate[sorted_by_row][1:] == candidate[sorted_by_row][:-1]
    winner[sorted_by_row[1:][same]] = False  # the earliest claimant of a row keeps it
    if winner.all():
        return candidate, count
    slot_of = candidate.copy()
    holder = {int(row): k for k, row in enumerate(candidate.tolist()) if winner[k]}
    waiting = [(k, (int(candidate[k]) + 1) % slots) for k in np.flatnonzero(~winner).tolist()]
    heapq.heapify(waiting)
    homeless: list[int] = []
    while waiting:
        k, row = heapq.heappop(waiting)
        for _ in range(slots):
            other = holder.get(row)
            if other is None:
                if rows[row, 0] == 0 and rows[row, 1] == 0:
                    holder[row] = k
                    slot_of[k] = row
                    break
            elif other > k:  # a later key took the row: it probes on
                holder[row] = k
                slot_of[k] = row
                heapq.heappush(waiting, (other, (row + 1) % slots))
                break
            row = (row + 1) % slots
        else:
            homeless.append(k)
    if homeless:  # the latest keys found no empty row: the earliest of them is where it stops
        return slot_of, min(homeless)
    return slot_of, count


def lookup_rows(table: Buffer, slots: int, hi: Buffer, lo: Buffer, out: Buffer, /) -> None:
    """The relative offset mapped for each fingerprint into ``out``, -1 where absent."""
    rows = _table(table, slots, writable=False)
    h = _view(hi, np.uint64)
    n = len(h)
    tag = _view(lo, np.uint32)
    found = _view(out, np.int64, writable=True)
    if len(tag) < n or len(found) < n:
        raise ValueError("the table or an input is too small")
    position, empty = _probe(rows, h, tag[:n].astype(np.uint64))
    hit = (position >= 0) & ~empty
    result = np.full(n, -1, dtype=np.int64)
    result[hit] = (rows[position[hit], 1] & _LOW32).astype(np.int64)
    found[:n] = result


def mapped_values(table: Buffer, out: Buffer, /) -> int:
    """The low 32 bits of every occupied row's value, in row order, into ``out``; how many."""
    flat = _view(table, np.uint64)
    slots = len(flat) // 2
    values = _view(out, np.uint32, writable=True)
    if len(values) < slots:
        raise ValueError("the output is too small")
    rows = flat[: 2 * slots].reshape(slots, 2)
    occupied = (rows[:, 0] != 0) | (rows[:, 1] != 0)
    taken = (rows[occupied, 1] & _LOW32).astype(np.uint32)
    values[: len(taken)] = taken
    return len(taken)
