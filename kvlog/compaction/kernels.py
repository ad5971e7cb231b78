"""The offset map's per-record loops, compiled with numba: fingerprints, insertion, lookup.

A probe of an open-addressing table is a loop whose length depends on the data;
numpy can only run it as a sequence of whole-array steps (gather the home
slots, compare, compact the records still probing, scatter, read back), about
twenty passes over every batch. Compiled, each record costs one probe sequence.
Every kernel takes whole arrays (one call per Arrow batch), releases the GIL
and keeps no state: :mod:`kvlog.compaction.offset_map` owns the table and
documents the hash and the layout. Compiled code is cached on disk (numba's
``cache=True``), so a process pays the compilation once per installation.

This module does no I/O of its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit  # type: ignore[import-untyped]

__all__ = ["nh_fingerprints", "insert_rows", "lookup_rows", "mapped_values", "warm_up"]

_LOW32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_S33 = np.uint64(33)
_MIX1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_ZERO = np.uint64(0)

_compiled = njit(cache=True, nogil=True, boundscheck=False)


@_compiled  # type: ignore[misc]
def _fmix64(x: Any) -> Any:
    x ^= x >> _S33
    x *= _MIX1
    x ^= x >> _S33
    x *= _MIX2
    x ^= x >> _S33
    return x


@_compiled  # type: ignore[misc]
def _word(data: Any, position: int, stop: int) -> Any:
    """The little-endian 32-bit word at ``position``, zero past ``stop``."""
    if position + 4 <= stop:
        return (np.uint64(data[position]) | (np.uint64(data[position + 1]) << np.uint64(8))
                | (np.uint64(data[position + 2]) << np.uint64(16))
                | (np.uint64(data[position + 3]) << np.uint64(24)))
    word = _ZERO
    for i in range(4):
        at = position + i
        if at < stop:
            word |= np.uint64(data[at]) << np.uint64(8 * i)
    return word


@_compiled  # type: ignore[misc]
def nh_fingerprints(data: Any, ends: Any, material: Any, first_mix: Any, second_mix: Any,
                    hi_out: Any, lo_out: Any) -> None:  # pragma: no cover - compiled
    """Key ``i`` is ``data[ends[i]:ends[i + 1]]``; writes its fingerprint to ``hi_out[i]``, ``lo_out[i]``.

    ``material`` holds at least ``2 * ceil(longest / 8) + 4`` 32-bit words of key material.
    """
    for i in range(len(ends) - 1):
        start = ends[i]
        stop = ends[i + 1]
        s0 = _ZERO
        s1 = _ZERO
        s2 = _ZERO
        word_index = 0
        for chunk in range(start, stop, 8):
            w0 = _word(data, chunk, stop)
            w1 = _word(data, chunk + 4, stop)
            s0 += ((w0 + material[word_index]) & _LOW32) * ((w1 + material[word_index + 1]) & _LOW32)
            s1 += ((w0 + material[word_index + 2]) & _LOW32) * ((w1 + material[word_index + 3]) & _LOW32)
            s2 += ((w0 + material[word_index + 4]) & _LOW32) * ((w1 + material[word_index + 5]) & _LOW32)
            word_index += 2
        length = np.uint64(stop - start)
        s1 ^= _fmix64(length ^ first_mix)
        s2 ^= _fmix64(length ^ second_mix)
        s0 += _fmix64(s1)
        hi_out[i] = _fmix64(s0)
        lo_out[i] = np.uint32(_fmix64(s2) >> _S32)


@_compiled  # type: ignore[misc]
def _home(hi: Any, slots: Any) -> Any:
    return np.int64(((hi >> _S32) * slots) >> _S32)


@_compiled  # type: ignore[misc]
def insert_rows(table: Any, slots: int, hi: Any, lo: Any, relative: Any, size: int,
                capacity: int) -> tuple[int, int]:  # pragma: no cover - compiled
    """Insert records in order into the first ``slots`` rows of ``table``, keeping the highest
    relative offset of each fingerprint; returns (records mapped, new size).

    Stops before the first record whose fingerprint is new while ``size`` is ``capacity``.
    """
    wide_slots = np.uint64(slots)
    for i in range(len(hi)):
        h = hi[i]
        value = (np.uint64(lo[i]) << _S32) | np.uint64(relative[i])
        tag = value >> _S32
        position = _home(h, wide_slots)
        placed = False
        for _probe in range(slots):
            r0 = table[position, 0]
            r1 = table[position, 1]
            if r0 == _ZERO and r1 == _ZERO:
                if size >= capacity:
                    return i, size
                table[position, 0] = h
                table[position, 1] = value
                size += 1
                placed = True
                break
            if r0 == h and (r1 >> _S32) == tag:
                if value > r1:
                    table[position, 1] = value
                placed = True
                break
            position += 1
            if position == slots:
                position = 0
        if not placed:  # every slot holds another key: the table is full
            return i, size
    return len(hi), size


@_compiled  # type: ignore[misc]
def lookup_rows(table: Any, slots: int, hi: Any, lo: Any, out: Any) -> None:  # pragma: no cover - compiled
    """The relative offset mapped for each fingerprint into ``out``, -1 where absent."""
    wide_slots = np.uint64(slots)
    for i in range(len(hi)):
        h = hi[i]
        tag = np.uint64(lo[i])
        out[i] = -1
        position = _home(h, wide_slots)
        for _probe in range(slots):
            r0 = table[position, 0]
            r1 = table[position, 1]
            if r0 == _ZERO and r1 == _ZERO:
                break
            if r0 == h and (r1 >> _S32) == tag:
                out[i] = np.int64(r1 & _LOW32)
                break
            position += 1
            if position == slots:
                position = 0


@_compiled  # type: ignore[misc]
def mapped_values(table: Any, out: Any) -> int:  # pragma: no cover - compiled
    """The low 32 bits of the value of every occupied row of ``table``, in row order, into
    ``out``; returns how many."""
    count = 0
    for row in range(table.shape[0]):
        r0 = table[row, 0]
        r1 = table[row, 1]
        if r0 != _ZERO or r1 != _ZERO:
            out[count] = np.uint32(r1 & _LOW32)
            count += 1
    return count


def warm_up() -> None:
    """Load every kernel now (compiling it if no cached copy fits), so that the first batch of a
    job does not pay for it: a process's first call of a kernel takes a few tenths of a second."""
    table = np.zeros((4, 2), dtype=np.uint64)
    hi = np.ones(1, dtype=np.uint64)
    lo = np.ones(1, dtype=np.uint32)
    key = np.frombuffer(bytes(8), dtype=np.uint8)  # read-only, as Arrow's buffers are
    nh_fingerprints(key, np.array([0, 8], dtype=np.int64), np.zeros(8, dtype=np.uint32), np.uint64(1),
                    np.uint64(2), np.empty(1, dtype=np.uint64), np.empty(1, dtype=np.uint32))
    insert_rows(table, 4, hi, lo, np.zeros(1, dtype=np.int64), 0, 3)
    lookup_rows(table, 4, hi, lo, np.empty(1, dtype=np.int64))
    mapped_values(table, np.empty(4, dtype=np.uint32))
