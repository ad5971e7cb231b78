"""The compactor's bounded offset map: key fingerprint -> latest offset, in one preallocated buffer.

Each slot is 16 bytes: a 96-bit fingerprint of the key (the first 96 bits of
its seeded XXH3-128; the key itself is never stored) and the offset relative
to the round's base as an unsigned 32-bit integer. ``offset_map_bytes`` of
128 MiB is 8,388,608 slots; filled to at most ``offset_map_load_factor``
(0.9) that holds 7,549,747 distinct keys per pass (Kafka: 24 bytes per entry,
about 5.0 M keys; WarpStream: 41 bytes, about 3.27 M).

An all-zero fingerprint marks an empty slot (a key whose fingerprint is zero
is stored as 1). Open addressing with linear probing; insertion and lookup are
vectorised with numpy over whole Arrow batches. Two distinct keys collide with
probability about n^2 / 2^97 per pass (n keys): for 7.5 M keys, 3.6e-16.

This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import xxhash

__all__ = ["SLOT_BYTES", "MAX_RELATIVE_OFFSET", "OffsetMap", "fingerprints", "capacity_for"]

SLOT_BYTES = 16
MAX_RELATIVE_OFFSET = 2**32 - 2
_NONE = np.uint32(0xFFFFFFFF)

U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]


def capacity_for(map_bytes: int, load_factor: float) -> int:
    """Distinct keys an offset map of ``map_bytes`` holds in one pass."""
    return int((map_bytes // SLOT_BYTES) * load_factor)


def fingerprints(keys: Sequence[bytes], seed: int) -> tuple[U64, U32]:
    """The 96-bit fingerprints of ``keys`` as (high 64 bits, next 32 bits); never all zero."""
    seed &= 2**64 - 1
    digest = b"".join([xxhash.xxh3_128_digest(k, seed=seed) for k in keys])
    words = np.frombuffer(digest, dtype=">u8").reshape(-1, 2)
    hi = words[:, 0].astype(np.uint64)
    lo = (words[:, 1] >> np.uint64(32)).astype(np.uint32)
    zero = (hi == 0) & (lo == 0)
    if zero.any():
        hi[zero] = 1
    return hi, lo


class OffsetMap:
    """A fixed-size fingerprint -> relative offset table, allocated once and reused across rounds."""

    def __init__(self, map_bytes: int, load_factor: float = 0.9) -> None:
        slots = map_bytes // SLOT_BYTES
        if slots < 1 or int(slots * load_factor) < 1:
            raise ValueError(f"an offset map of {map_bytes} bytes cannot hold a single key")
        self.slots = slots
        self.capacity = int(slots * load_factor)
        self._hi: U64 = np.zeros(slots, dtype=np.uint64)
        self._lo: U32 = np.zeros(slots, dtype=np.uint32)
        self._off: U32 = np.zeros(slots, dtype=np.uint32)
        self.size = 0
        self.base = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the table's buffers."""
        return int(self._hi.nbytes + self._lo.nbytes + self._off.nbytes)

    def clear(self, base: int = 0) -> None:
        """Empty the table for a new pass whose offsets start at ``base``."""
        self._hi.fill(0)
        self._lo.fill(0)
        self.size = 0
        self.base = base

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    def _home(self, hi: U64) -> npt.NDArray[np.int64]:
        return (hi % np.uint64(self.slots)).astype(np.int64)

    def lookup(self, hi: U64, lo: U32) -> npt.NDArray[np.int64]:
        """The absolute offset mapped for each fingerprint, -1 where absent."""
        n = len(hi)
        out = np.full(n, -1, dtype=np.int64)
        pos = self._home(hi)
        todo = np.arange(n)
        # At most ``slots`` probes: with load factor 1.0 a full table has no empty slot to stop at.
        for _probe in range(self.slots):
            if not len(todo):
                break
            p = pos[todo]
            th, tl = self._hi[p], self._lo[p]
            empty = (th == 0) & (tl == 0)
            match = (th == hi[todo]) & (tl == lo[todo])
            out[todo[match]] = self._off[p[match]].astype(np.int64) + self.base
            keep = ~(empty | match)
            todo = todo[keep]
            pos[todo] = (pos[todo] + 1) % self.slots
        return out

    def insert(self, hi: U64, lo: U32, offsets: npt.NDArray[np.int64]) -> int:
        """Map fingerprints to offsets, in order (a later offset of the same key wins).

        Stops before the first record whose key would exceed the capacity and returns how
        many records (a prefix) were mapped.
        """
        n = len(hi)
        if n == 0:
            return 0
        rel = offsets - self.base
        if rel.min() < 0 or rel.max() > MAX_RELATIVE_OFFSET:
            raise ValueError("offsets outside the pass's 32-bit relative range")
        # Group equal fingerprints: a stable sort keeps each group's records in offset order.
        order = np.lexsort((lo, hi))
        shi, slo = hi[order], lo[order]
        starts = np.ones(n, dtype=bool)
        starts[1:] = (shi[1:] != shi[:-1]) | (slo[1:] != slo[:-1])
        ends = np.ones(n, dtype=bool)
        ends[:-1] = starts[1:]
        first = order[starts]
        last = order[ends]
        new_key = np.zeros(n, dtype=bool)
        new_key[first] = True
        new_key[first[self.lookup(hi[first], lo[first]) >= 0]] = False
        room = self.capacity - self.size
        cumulative = np.cumsum(new_key)
        if cumulative[-1] > room:
            take = int(np.searchsorted(cumulative, room, side="right"))
            return self.insert(hi[:take], lo[:take], offsets[:take]) if take else 0
        self._place(hi[last], lo[last], rel[last].astype(np.uint32))
        return n

    def _place(self, hi: U64, lo: U32, rel: U32) -> None:
        """Insert distinct fingerprints (overwriting the offset of ones already present)."""
        pos = self._home(hi)
        todo = np.arange(len(hi))
        while len(todo):
            p = pos[todo]
            th, tl = self._hi[p], self._lo[p]
            match = (th == hi[todo]) & (tl == lo[todo])
            if match.any():
                self._off[p[match]] = rel[todo[match]]
            empty = (th == 0) & (tl == 0)
            done = match.copy()
            if empty.any():
                empty_local = np.nonzero(empty)[0]
                # Several fingerprints may want one empty slot: the first takes it, the others
                # stay put and see it occupied on the next step.
                _, winners = np.unique(p[empty_local], return_index=True)
                won_local = empty_local[winners]
                won = todo[won_local]
                wp = pos[won]
                self._hi[wp], self._lo[wp], self._off[wp] = hi[won], lo[won], rel[won]
                self.size += len(won)
                done[won_local] = True
            advance = ~match & ~empty
            pos[todo[advance]] = (pos[todo[advance]] + 1) % self.slots
            todo = todo[~done]
