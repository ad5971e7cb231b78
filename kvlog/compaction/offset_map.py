"""The compactor's bounded offset map: key fingerprint -> latest offset, in one preallocated buffer.

Each slot is 16 bytes: a 96-bit fingerprint of the key (the key itself is never
stored) and the offset relative to the round's base as an unsigned 32-bit
integer. ``offset_map_bytes`` of 128 MiB is 8,388,608 slots; filled to at most
``offset_map_load_factor`` (0.9) that holds 7,549,747 distinct keys per pass
(Kafka: 24 bytes per entry, about 5.0 M keys; WarpStream: 41 bytes, about 3.27 M).

Fingerprints are computed for a whole Arrow array at once, by a compiled loop
(:mod:`kvlog.compaction.kernels`, in C) over its buffers: three lanes of NH
(the universal hash of UMAC) over the key's 32-bit words, keyed by
material derived from the store's seed (each lane's key shifted by two words,
the Toeplitz construction), then mixed with the key's length by a 64-bit
finalizer into 64 + 32 bits. For two distinct keys of equal length, each NH lane
collides with probability at most 2^-32 over the seed, so the three lanes
together at most 2^-96; keys of different lengths differ in the length mixed
in. Two distinct keys of one pass thus share a fingerprint with probability
about n^2 / 2^97 (n keys): for 7.5 M keys, 3.6e-16. No fixed set of keys
collides for every seed.

An all-zero fingerprint marks an empty slot (a key whose fingerprint is zero
is stored as 1). Open addressing with linear probing from a home slot that is
the fingerprint's top 32 bits scaled to the slot count; insertion and lookup
take whole Arrow batches, one compiled call each. A slot keeps the highest
offset inserted for its key, whatever the order of insertion. The table lives
in an anonymous memory mapping whose pages :meth:`OffsetMap.release` hands
back.

This module does no I/O.
"""

from __future__ import annotations

import mmap
import sys
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from kvlog.compaction import kernels
from kvlog.format.columns import binary_column, binary_ends

__all__ = ["SLOT_BYTES", "MAX_RELATIVE_OFFSET", "OffsetMap", "fingerprints", "capacity_for"]

SLOT_BYTES = 16
MAX_RELATIVE_OFFSET = 2**32 - 2

U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]
I64 = npt.NDArray[np.int64]

_LANES = 3
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
#: Whether dropping the pages of a private anonymous mapping zeroes them (Linux semantics).
_DROP_PAGES = sys.platform.startswith("linux") and hasattr(mmap, "MADV_DONTNEED")
_MAP_ANONYMOUS: int = getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", 0))


def _u64(values: npt.ArrayLike) -> U64:
    return np.ascontiguousarray(values, dtype=np.uint64)


def _u32(values: npt.ArrayLike) -> U32:
    return np.ascontiguousarray(values, dtype=np.uint32)


def capacity_for(map_bytes: int, load_factor: float) -> int:
    """Distinct keys an offset map of ``map_bytes`` holds in one pass."""
    return int((map_bytes // SLOT_BYTES) * load_factor)


def _splitmix64(state: int, count: int) -> U64:
    """``count`` SplitMix64 outputs from ``state``."""
    x = np.arange(1, count + 1, dtype=np.uint64) * _GOLDEN + np.uint64(state & (2**64 - 1))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class _Keying:
    """The seed's NH key material (grown to the longest key seen) and length mixers."""

    _cache: dict[int, _Keying] = {}

    def __init__(self, seed: int) -> None:
        self.seed = seed & (2**64 - 1)
        self.words: U32 = np.zeros(0, dtype=np.uint32)
        mixers = _splitmix64(self.seed ^ 0x6B766C6F67, 2)
        self.length_mix = (np.uint64(mixers[0]), np.uint64(mixers[1]))

    @classmethod
    def of(cls, seed: int) -> _Keying:
        keying = cls._cache.get(seed)
        if keying is None:
            if len(cls._cache) > 64:
                cls._cache.clear()
            keying = cls._cache[seed] = cls(seed)
        return keying

    def material(self, words: int) -> U32:
        """At least ``words`` + 2 * (lanes - 1) 32-bit key words."""
        need = words + 2 * (_LANES - 1)
        if len(self.words) < need:
            grown = max(need, 2 * len(self.words), 64)
            self.words = _splitmix64(self.seed, (grown + 1) // 2).view(np.uint32)
        return self.words


def _binary(keys: pa.Array | pa.ChunkedArray | Sequence[bytes]) -> pa.BinaryArray:
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not isinstance(keys, pa.Array):
        keys = binary_column(keys)
    if keys.type != pa.binary():
        keys = keys.cast(pa.binary())
    if keys.null_count:
        raise ValueError("keys must not be null")
    return keys


def fingerprints(keys: pa.Array | pa.ChunkedArray | Sequence[bytes], seed: int) -> tuple[U64, U32]:
    """The 96-bit fingerprints of ``keys`` as (high 64 bits, next 32 bits); never all zero."""
    binary = _binary(keys)
    n = len(binary)
    hi = np.empty(n, dtype=np.uint64)
    lo = np.empty(n, dtype=np.uint32)
    if n == 0:
        return hi, lo
    keying = _Keying.of(seed)
    offsets, key_data = binary_ends(binary)
    ends = offsets.astype(np.int64)
    data = np.frombuffer(key_data, dtype=np.uint8)
    widest = int((ends[1:] - ends[:-1]).max())
    material = keying.material(2 * ((widest + 7) // 8))
    first_mix, second_mix = keying.length_mix
    kernels.nh_fingerprints(data, ends, material, first_mix, second_mix, hi, lo)
    zero = (hi == 0) & (lo == 0)  # the empty slot's mark: such a key is stored as 1
    if zero.any():
        hi[zero] = 1
    return hi, lo


class OffsetMap:
    """A fixed-size fingerprint -> relative offset table, allocated once and reused across rounds."""

    def __init__(self, map_bytes: int, load_factor: float = 0.9) -> None:
        slots = map_bytes // SLOT_BYTES
        if slots < 1 or int(slots * load_factor) < 1:
            raise ValueError(f"an offset map of {map_bytes} bytes cannot hold a single key")
        if slots >= 2**32:
            raise ValueError(f"an offset map of {map_bytes} bytes has more than 2**32 slots")
        self.slots = slots
        self.capacity = int(slots * load_factor)
        # One 16-byte row per slot, so a probe touches one cache line: the fingerprint's high
        # 64 bits, then its low 32 bits above the 32-bit relative offset. The rows live in an
        # anonymous mapping (zero-filled, resident only once written) whose pages can be handed
        # back to the system when the table is emptied.
        self._buffer = mmap.mmap(-1, slots * SLOT_BYTES, flags=mmap.MAP_PRIVATE | _MAP_ANONYMOUS)
        self._table: U64 = np.frombuffer(self._buffer, dtype=np.uint64).reshape(slots, 2)
        self.size = 0
        self.base = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the table's buffer."""
        return int(self._table.nbytes)

    def clear(self, base: int = 0) -> None:
        """Empty the table for a new pass whose offsets start at ``base``.

        Every page of the table is written here, before the pass probes it: a page whose first
        access is a read maps the shared zero page, and the write that follows must then copy
        it and flush the TLB of every CPU the process runs on, one page at a time.
        """
        self._table.fill(0)
        self.size = 0
        self.base = base

    def release(self) -> None:
        """Empty the table and hand its memory back to the system until it is written again
        (for when a pass no longer needs what the table holds).

        On Linux the pages are dropped (``MADV_DONTNEED``: a private anonymous page then reads
        as zeros); elsewhere the table is zeroed in place and stays resident.
        """
        if _DROP_PAGES:
            self._buffer.madvise(mmap.MADV_DONTNEED)
        else:
            self._table.fill(0)
        self.size = 0

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    def lookup(self, hi: U64, lo: U32) -> I64:
        """The absolute offset mapped for each fingerprint, -1 where absent."""
        out = np.empty(len(hi), dtype=np.int64)
        kernels.lookup_rows(self._table, self.slots, _u64(hi), _u32(lo), out)
        found = out >= 0
        out[found] += self.base
        return out

    def insert(self, hi: U64, lo: U32, offsets: I64) -> int:
        """Map fingerprints to offsets, in order; a key's slot keeps its highest offset.

        Stops before the first record whose key would exceed the capacity and returns how
        many records (a prefix) were mapped.
        """
        n = len(hi)
        if n == 0:
            return 0
        relative = np.asarray(offsets, dtype=np.int64) - self.base
        if relative.min() < 0 or relative.max() > MAX_RELATIVE_OFFSET:
            raise ValueError("offsets outside the pass's 32-bit relative range")
        mapped, self.size = kernels.insert_rows(self._table, self.slots, _u64(hi), _u32(lo), relative,
                                                   self.size, self.capacity)
        return int(mapped)

    def mapped_offsets(self, rows: int = 1 << 19) -> Iterator[U32]:
        """The offsets, relative to the base, that the table maps keys to (one per key: each
        key's latest), ``rows`` slots at a time, in slot order."""
        out = np.empty(min(rows, self.slots), dtype=np.uint32)
        for start in range(0, self.slots, rows):
            count = kernels.mapped_values(self._table[start : start + rows], out)
            yield out[:count].copy()
