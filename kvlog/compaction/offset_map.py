"""The compactor's bounded offset map: key fingerprint -> latest offset, in one preallocated buffer.

Each slot is 16 bytes: a 96-bit fingerprint of the key (the key itself is never
stored) and the offset relative to the round's base as an unsigned 32-bit
integer. ``offset_map_bytes`` of 128 MiB is 8,388,608 slots; filled to at most
``offset_map_load_factor`` (0.9) that holds 7,549,747 distinct keys per pass
(Kafka: 24 bytes per entry, about 5.0 M keys; WarpStream: 41 bytes, about 3.27 M).

Fingerprints are computed for a whole Arrow array at once with numpy: three
lanes of NH (the universal hash of UMAC) over the key's 32-bit words, keyed by
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
are vectorised with numpy over whole Arrow batches. Pass 1 inserts offsets in
ascending order, so an insertion simply overwrites its key's slot; other
orders keep the highest offset of each key. The table lives in an anonymous
memory mapping whose pages :meth:`OffsetMap.release` hands back.

This module does no I/O.
"""

from __future__ import annotations

import mmap
import sys
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["SLOT_BYTES", "MAX_RELATIVE_OFFSET", "OffsetMap", "fingerprints", "capacity_for"]

SLOT_BYTES = 16
MAX_RELATIVE_OFFSET = 2**32 - 2

U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]
I64 = npt.NDArray[np.int64]

_LANES = 3
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_S32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)
_HIGH32 = np.uint64(0xFFFFFFFF00000000)
#: Elements of the padded key matrix built at once (bounds the memory of long keys).
_MATRIX_ELEMENTS = 1 << 21
#: Whether dropping the pages of a private anonymous mapping zeroes them (Linux semantics).
_DROP_PAGES = sys.platform.startswith("linux") and hasattr(mmap, "MADV_DONTNEED")
_MAP_ANONYMOUS: int = getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", 0))


def capacity_for(map_bytes: int, load_factor: float) -> int:
    """Distinct keys an offset map of ``map_bytes`` holds in one pass."""
    return int((map_bytes // SLOT_BYTES) * load_factor)


def _splitmix64(state: int, count: int) -> U64:
    """``count`` SplitMix64 outputs from ``state``."""
    x = np.arange(1, count + 1, dtype=np.uint64) * _GOLDEN + np.uint64(state & (2**64 - 1))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _fmix64(x: U64) -> U64:
    """MurmurHash3's 64-bit finalizer (a bijection), in place."""
    x ^= x >> _S33
    x *= _MIX1
    x ^= x >> _S33
    x *= _MIX2
    x ^= x >> _S33
    return x


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
        keys = pa.array(keys, type=pa.binary())
    if keys.type != pa.binary():
        keys = keys.cast(pa.binary())
    if keys.null_count:
        raise ValueError("keys must not be null")
    return keys


def _word_rows(keys: pa.BinaryArray, start: int, stop: int) -> tuple[U32, U64]:
    """Keys ``start:stop`` as zero-padded rows of 32-bit words (two-word multiples), and their lengths."""
    buffers = keys.buffers()
    ends = np.frombuffer(buffers[1], dtype=np.int32, count=len(keys) + 1, offset=4 * keys.offset)
    ends = ends[start : stop + 1].astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    lengths = np.diff(ends)
    n = stop - start
    width = int(lengths.max()) if n else 0
    width = max(8, (width + 7) // 8 * 8)
    matrix = np.zeros((n, width), dtype=np.uint8)
    if n and int(lengths.min()) == int(lengths.max()):
        length = int(lengths[0])
        first = int(ends[0])
        matrix[:, :length] = data[first : first + n * length].reshape(n, length)
    elif n:
        columns = np.arange(width)
        inside = columns[None, :] < lengths[:, None]
        matrix[inside] = data[(ends[:-1, None] + columns[None, :])[inside]]
    return matrix.view("<u4"), lengths.astype(np.uint64)


def _nh_lanes(words: U32, lengths: U64, material: U32) -> list[U64]:
    """The NH sums of every row of ``words`` under each lane's shifted key material.

    A row's padding beyond its own 8-byte chunks adds nothing, so a key's sums do not depend
    on the other keys of the array.
    """
    columns = np.ascontiguousarray(words.T)
    count, n = columns.shape
    chunks = (lengths + np.uint64(7)) // np.uint64(8)
    ragged = n > 0 and int(chunks.min()) != count // 2
    left = np.empty(n, dtype=np.uint32)
    right = np.empty(n, dtype=np.uint32)
    wide_left = np.empty(n, dtype=np.uint64)
    wide_right = np.empty(n, dtype=np.uint64)
    sums = []
    for lane in range(_LANES):
        total = np.zeros(n, dtype=np.uint64)
        for i in range(0, count, 2):
            np.add(columns[i], material[2 * lane + i], out=left)
            np.add(columns[i + 1], material[2 * lane + i + 1], out=right)
            wide_left[:] = left
            wide_right[:] = right
            np.multiply(wide_left, wide_right, out=wide_left)
            if ragged:
                wide_left[chunks <= i // 2] = 0
            total += wide_left
        sums.append(total)
    return sums


def _fold(lanes: list[U64], lengths: U64, keying: _Keying) -> tuple[U64, U64]:
    """Three NH lanes and the key lengths mixed into 64 + 32 bits."""
    s0, s1, s2 = lanes
    first_mix, second_mix = keying.length_mix
    if len(lengths) and lengths.min() == lengths.max():  # one length: mix it once
        one = lengths[:1]
        s1 ^= _fmix64(one ^ first_mix)[0]
        s2 ^= _fmix64(one ^ second_mix)[0]
    else:
        s1 ^= _fmix64(lengths ^ first_mix)
        s2 ^= _fmix64(lengths ^ second_mix)
    s0 += _fmix64(s1)
    return _fmix64(s0), _fmix64(s2) >> _S32


def fingerprints(keys: pa.Array | pa.ChunkedArray | Sequence[bytes], seed: int) -> tuple[U64, U32]:
    """The 96-bit fingerprints of ``keys`` as (high 64 bits, next 32 bits); never all zero."""
    binary = _binary(keys)
    n = len(binary)
    hi = np.empty(n, dtype=np.uint64)
    lo = np.empty(n, dtype=np.uint32)
    if n == 0:
        return hi, lo
    keying = _Keying.of(seed)
    buffers = binary.buffers()
    ends = np.frombuffer(buffers[1], dtype=np.int32, count=n + 1, offset=4 * binary.offset)
    widest = max(8, int(np.diff(ends).max()))
    rows = max(1, _MATRIX_ELEMENTS // widest)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        words, lengths = _word_rows(binary, start, stop)
        lanes = _nh_lanes(words, lengths, keying.material(words.shape[1]))
        hi[start:stop], lo[start:stop] = _fold(lanes, lengths, keying)
    zero = (hi == 0) & (lo == 0)
    if zero.any():
        hi[zero] = 1
    return hi, lo


def _groups_of_equal_fingerprints(hi: U64, lo: U32) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
    """An order grouping equal fingerprints (each group in input order) and where each group ends."""
    n = len(hi)
    index_bits = max(1, int(n - 1).bit_length())
    if index_bits <= 24:
        # Sort (high bits of the fingerprint | position) as one uint64: a group of equal
        # fingerprints is then contiguous and in position order.
        mask = np.uint64((1 << index_bits) - 1)
        packed = (hi & ~mask) | np.arange(n, dtype=np.uint64)
        packed.sort()
        order = (packed & mask).astype(np.intp)
        top_equal = (packed[1:] >> np.uint64(index_bits)) == (packed[:-1] >> np.uint64(index_bits))
        sh, sl = hi[order], lo[order]
        equal = (sh[1:] == sh[:-1]) & (sl[1:] == sl[:-1])
        if np.array_equal(equal, top_equal):
            ends = np.ones(n, dtype=bool)
            ends[:-1] = ~equal
            return order, ends
    order = np.lexsort((np.arange(n), lo, hi))
    sh, sl = hi[order], lo[order]
    ends = np.ones(n, dtype=bool)
    ends[:-1] = (sh[1:] != sh[:-1]) | (sl[1:] != sl[:-1])
    return order, ends


class OffsetMap:
    """A fixed-size fingerprint -> relative offset table, allocated once and reused across rounds."""

    def __init__(self, map_bytes: int, load_factor: float = 0.9) -> None:
        slots = map_bytes // SLOT_BYTES
        if slots < 1 or int(slots * load_factor) < 1:
            raise ValueError(f"an offset map of {map_bytes} bytes cannot hold a single key")
        if slots >= 2**32:
            raise ValueError(f"an offset map of {map_bytes} bytes has more than 2**32 slots")
        self.slots = slots
        self._slots64 = np.uint64(slots)
        self.capacity = int(slots * load_factor)
        # One 16-byte row per slot, so a probe touches one cache line: the fingerprint's high
        # 64 bits, then its low 32 bits above the 32-bit relative offset. The rows live in an
        # anonymous mapping (zero-filled, resident only once written) whose pages can be handed
        # back to the system when the table is emptied.
        self._buffer = mmap.mmap(-1, slots * SLOT_BYTES, flags=mmap.MAP_PRIVATE | _MAP_ANONYMOUS)
        self._table: U64 = np.frombuffer(self._buffer, dtype=np.uint64).reshape(slots, 2)
        self._flat: U64 = self._table.reshape(-1)
        self.size = 0
        self.base = 0
        self._top = -1  # the highest relative offset mapped since the last clear

    @property
    def nbytes(self) -> int:
        """Bytes of the table's buffer."""
        return int(self._table.nbytes)

    def clear(self, base: int = 0) -> None:
        """Empty the table for a new pass whose offsets start at ``base``."""
        if self.size:
            self.release()
        self.size = 0
        self.base = base
        self._top = -1

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
        self._top = -1

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    def _home(self, hi: U64) -> npt.NDArray[np.int64]:
        """Each fingerprint's home slot: its top 32 bits scaled to the slot count (a multiply
        and a shift, not a division)."""
        pos = hi >> _S32
        pos *= self._slots64
        pos >>= _S32
        return pos.view(np.int64)

    def _next(self, pos: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The slots after ``pos`` (linear probing, wrapping around), in place."""
        pos += 1
        pos[pos == self.slots] = 0
        return pos

    def lookup(self, hi: U64, lo: U32) -> I64:
        """The absolute offset mapped for each fingerprint, -1 where absent."""
        n = len(hi)
        out = np.full(n, -1, dtype=np.int64)
        pos = self._home(hi)
        tag = lo.astype(np.uint64)
        tag <<= _S32
        todo = np.arange(n)
        # At most ``slots`` probes: with load factor 1.0 a full table has no empty slot to stop at.
        for _probe in range(self.slots):
            if not len(todo):
                break
            rows = np.take(self._table, pos, axis=0)
            r0, r1 = rows[:, 0], rows[:, 1]
            match = (r1 & _HIGH32) == tag
            match &= r0 == hi
            found = todo[match]
            out[found] = (r1[match] & _LOW32).view(np.int64) + self.base
            go_on = (r0 | r1) != 0
            go_on &= ~match
            if not go_on.all():
                todo, pos, hi, tag = todo[go_on], pos[go_on], hi[go_on], tag[go_on]
            pos = self._next(pos)
        return out

    def insert(self, hi: U64, lo: U32, offsets: I64) -> int:
        """Map fingerprints to offsets, in order (a later offset of the same key wins).

        Stops before the first record whose key would exceed the capacity and returns how
        many records (a prefix) were mapped.
        """
        n = len(hi)
        if n == 0:
            return 0
        rel = np.asarray(offsets, dtype=np.int64) - self.base
        if rel.min() < 0 or rel.max() > MAX_RELATIVE_OFFSET:
            raise ValueError("offsets outside the pass's 32-bit relative range")
        if self.size + n > self.capacity:
            # Near capacity: count the keys that are new, in record order, to find the prefix.
            order, ends = _groups_of_equal_fingerprints(hi, lo)
            starts = np.ones(n, dtype=bool)
            starts[1:] = ends[:-1]
            first = order[starts]
            new_key = np.zeros(n, dtype=bool)
            new_key[first[self.lookup(hi[first], lo[first]) < 0]] = True
            cumulative = np.cumsum(new_key)
            if cumulative[-1] > self.capacity - self.size:
                take = int(np.searchsorted(cumulative, self.capacity - self.size, side="right"))
                return self.insert(hi[:take], lo[:take], offsets[:take]) if take else 0
        value = lo.astype(np.uint64)
        value <<= _S32
        value |= rel.view(np.uint64)
        if int(rel[0]) > self._top and (n == 1 or bool((rel[1:] > rel[:-1]).all())):
            self._place_ascending(hi, value)
        else:
            self._place(hi, value)
        self._top = max(self._top, int(rel.max()))
        return n

    def _place(self, hi: U64, value: U64) -> None:
        """Insert fingerprints (``value``: low fingerprint bits above the relative offset),
        keeping the highest offset of each.

        Fingerprints may repeat: slots keep the maximum (``np.maximum.at``), so the outcome does
        not depend on the order in which equal fingerprints are applied.
        """
        pos = self._home(hi)
        todo = np.arange(len(hi))
        while len(todo):
            p = pos[todo]
            rows = np.take(self._table, p, axis=0)
            tags = rows[:, 1] & _HIGH32
            match = (rows[:, 0] == hi[todo]) & (tags == value[todo] & _HIGH32)
            if match.any():
                np.maximum.at(self._flat, 2 * p[match] + 1, value[todo[match]])
            empty = (rows[:, 0] == 0) & (tags == 0)
            settled = match
            if empty.any():
                # Several fingerprints may want one empty slot: all write it, one write wins,
                # and the others stay to meet it on the next step (as a match or a collision).
                claim = todo[empty]
                slots = p[empty]
                self._flat[2 * slots] = hi[claim]
                self._flat[2 * slots + 1] = value[claim]
                written = np.take(self._table, slots, axis=0)
                won = (written[:, 0] == hi[claim]) & (written[:, 1] == value[claim])
                self.size += int(np.count_nonzero(won))
                settled = match.copy()
                settled[np.nonzero(empty)[0][won]] = True
            occupied = ~match & ~empty
            pos[todo[occupied]] = self._next(pos[todo[occupied]])
            todo = todo[~settled]

    def _place_ascending(self, hi: U64, value: U64) -> None:
        """:meth:`_place` for offsets that ascend and exceed every offset already mapped (pass 1's
        order): each record then replaces what its key's slot holds, and among records of one key
        the last wins, so slots are simply overwritten.

        Records that write one slot at once (equal fingerprints, or new keys claiming one empty
        slot) all write it; reading it back tells which write landed. A record of the same key
        with a lower offset is then done (replaced); one with a higher offset, or of another
        key, goes on to the next step, so the result does not depend on the order of numpy's
        writes.
        """
        pos = self._home(hi)
        table = self._table
        while len(pos):
            rows = np.take(table, pos, axis=0)
            r0, r1 = rows[:, 0], rows[:, 1]
            empty = (r0 | r1) == 0
            r1 ^= value
            free = r1 <= _LOW32  # the slot holds this fingerprint's low bits ...
            free &= r0 == hi  # ... and its high bits
            free |= empty
            if free.all():
                fpos, fhi, fvalue, fempty = pos, hi, value, empty
                pos, hi, value = pos[:0], hi[:0], value[:0]
            else:
                fpos, fhi, fvalue, fempty = pos[free], hi[free], value[free], empty[free]
                busy = ~free
                pos, hi, value = self._next(pos[busy]), hi[busy], value[busy]
            table[fpos, 0] = fhi
            table[fpos, 1] = fvalue
            landed = np.take(table, fpos, axis=0)
            l0, l1 = landed[:, 0], landed[:, 1]
            won = l1 == fvalue
            won &= l0 == fhi
            if won.all():
                self.size += int(np.count_nonzero(fempty))
                continue
            fempty &= won
            self.size += int(np.count_nonzero(fempty))
            # Not landed: done if a later record of this key landed, else try again.
            replaced = (l1 ^ fvalue) <= _LOW32
            replaced &= l0 == fhi
            replaced &= fvalue < l1
            again = ~(won | replaced)
            if again.any():
                pos = np.concatenate((pos, fpos[again]))
                hi = np.concatenate((hi, fhi[again]))
                value = np.concatenate((value, fvalue[again]))

    def mapped_offsets(self, rows: int = 1 << 19) -> Iterator[U32]:
        """The offsets, relative to the base, that the table maps keys to (one per key: each
        key's latest), ``rows`` slots at a time, in slot order."""
        for start in range(0, self.slots, rows):
            chunk = self._table[start : start + rows]
            occupied = (chunk[:, 0] | chunk[:, 1]) != 0
            yield (chunk[occupied, 1] & _LOW32).astype(np.uint32)
