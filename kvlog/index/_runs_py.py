"""The key index's loops in Python: the twin of the compiled ``_runs`` (same functions, results
and errors); :mod:`kvlog._native` picks one of them. :mod:`kvlog.index.runs` documents the
layout of an index run, :mod:`kvlog.index.entry` that of an index value.

- index runs: :func:`build` packs rows of two Arrow binary columns into a run; :func:`find`
  and :func:`find_first` look one key up by binary search; :func:`entries` lists the pairs of
  a key range. A run is read in place (a view of an LMDB value): only what is returned is
  copied.
- index values: :func:`decode` and :func:`inline` check an entry's
  CRC32C and take it apart.
- :func:`lmdb_txnid` reads the id of an LMDB file's newest commit from its meta pages (a get's
  check that the read transaction it reuses is still the newest snapshot); :class:`Getter` is
  the common case of a get in one call, with a read transaction reused while it is the newest;
  :class:`StoreGet` is a store's whole get in one call for a valid bytes key of an open store.

Nothing here trusts its input: every offset read from a run or an index value is checked
before it is followed, and damage raises ``ValueError``.

This module does no I/O.
"""

from __future__ import annotations

import operator
import struct
from typing import Any

import crc32c as _crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlog.index._run_merge_py import RunMerge
from kvlog.index._store_get_py import StoreGet

__all__ = ["build", "crc32c", "decode", "entries", "find", "find_first", "inline", "lmdb_txnid",
           "Getter", "RunMerge", "ScanWalk", "StoreGet"]

#: Any object with the buffer protocol: bytes, memoryview, a numpy array, an Arrow buffer.
Buffer = Any

RUN_MAGIC = 0x3252564B  # b"KVR2" read as a little-endian u32
HEAD_BYTES = 15
FLAG_INLINE = 1
FLAG_LONG = 2
FLAG_EXPIRES = 4
EXPIRES_BYTES = 8
DELETION_BYTES = 4
MAX_DIRECT_KEY = 480
BAD_RUN = "not an index run"
BAD_ENTRY = "an index entry is malformed or fails its checksum"

_U32 = struct.Struct("<I")
_HEADER = struct.Struct("<II")
_BODY = struct.Struct(">HQB")
_crc = _crc32c.crc32c


def crc32c(data: Buffer, value: int = 0, portable: bool = False, /) -> int:
    """The CRC32C of ``data`` continuing from ``value`` (``portable`` changes nothing here)."""
    return int(_crc(memoryview(data).cast("B"), operator.index(value) & 0xFFFFFFFF))


#: Where an LMDB meta page holds its transaction id: the page header (16 bytes), then the magic,
#: version, map address, map size, the two core databases (48 bytes each) and the last page.
LMDB_TXNID_AT = 144
_TXNID = struct.Struct("=Q")


def lmdb_txnid(meta: Buffer, page_size: int, /) -> int:
    """The id of the newest commit of an LMDB data file whose first two pages (its meta pages,
    ``page_size`` bytes each) ``meta`` maps: the larger of their transaction ids."""
    page = operator.index(page_size)
    view = memoryview(meta).cast("B")
    if page < LMDB_TXNID_AT + 8 or page % 8 or len(view) < page + LMDB_TXNID_AT + 8:
        raise ValueError("not an LMDB file's meta pages")
    return int(max(_TXNID.unpack_from(view, LMDB_TXNID_AT)[0], _TXNID.unpack_from(view, page + LMDB_TXNID_AT)[0]))


def open_entry(lmdb_key: bytes, value: bytes) -> tuple[bytes, int, int, int, bytes | None, int | None] | None:
    """``value`` checked against its LMDB key and taken apart: (user key, partition, offset,
    flags, inline value or None, expiry or None); None if it is malformed or fails its CRC32C."""
    n = len(value)
    if n < HEAD_BYTES:
        return None
    flags = value[14]
    if flags & ~(FLAG_INLINE | FLAG_LONG | FLAG_EXPIRES):
        return None
    pos = HEAD_BYTES
    key = lmdb_key
    expires: int | None = None
    if flags & FLAG_EXPIRES:
        if n - pos < EXPIRES_BYTES:
            return None
        expires = int.from_bytes(value[pos:pos + EXPIRES_BYTES], "big", signed=True)
        pos += EXPIRES_BYTES
    if flags & FLAG_LONG:
        if n - pos < 4:
            return None
        long_len = int.from_bytes(value[pos:pos + 4], "big")
        pos += 4
        if long_len > n - pos:
            return None
        key = value[pos:pos + long_len]
        pos += long_len
    inline_value: bytes | None = None
    if flags & FLAG_INLINE:
        inline_value = value[pos:]
    elif pos != n:
        return None
    if _crc(value[4:], _crc(lmdb_key)) != int.from_bytes(value[:4], "big"):
        return None
    partition, offset, _flags = _BODY.unpack_from(value, 4)
    return key, partition, offset, flags, inline_value, expires


def _bytes(obj: Buffer) -> bytes:
    return obj if type(obj) is bytes else memoryview(obj).tobytes()


def decode(lmdb_key: Buffer, value: Buffer, /) -> tuple[bytes, int, int, bytes | None, int | None]:
    """An index value checked and taken apart: (key, partition, offset, inline value or None,
    expiry or None)."""
    entry = open_entry(_bytes(lmdb_key), _bytes(value))
    if entry is None:
        raise ValueError(BAD_ENTRY)
    key, partition, offset, _flags, inline_value, expires = entry
    return key, partition, offset, inline_value, expires


def inline(lmdb_key: Buffer, value: Buffer, /) -> bytes | None:
    """An index value checked: its inline value, or None when the value is in a data file or
    the entry expires (the caller checks its expiry: :func:`decode`)."""
    entry = open_entry(_bytes(lmdb_key), _bytes(value))
    if entry is None:
        raise ValueError(BAD_ENTRY)
    return None if entry[3] & FLAG_EXPIRES else entry[4]


WALK_RUNNING, WALK_END, WALK_TREE, WALK_OVERLAY, WALK_REFILL, WALK_ERROR, WALK_RESUME, WALK_CLEARED = range(8)


class ScanWalk:
    """An iterator of a forward scan's ``(key, value)`` pairs, merging the B-tree's entries
    (``source``: an iterator of ``(lmdb_key, index value)`` pairs from a cursor, or None) with
    the ``overlay`` (a sorted list of ``(key, item)`` from the memtable and the pending runs,
    read from position ``at``; item: the value, None for a key hidden, anything else for the
    caller to read), the overlay winning a key. It stops, :attr:`state` set, at the end of the
    range (``WALK_END``), at a B-tree pair to decode by the caller, damaged or with its value
    in a data file (``WALK_TREE``: :attr:`held`), at an overlay item that is not a value
    (``WALK_OVERLAY``: :attr:`item`), when the overlay list is consumed and more may follow
    (``WALK_REFILL``), at an error of the source (``WALK_ERROR``: :attr:`error`), at the B-tree's
    first long key (``WALK_RESUME``: :attr:`resume`, the bound to read on from), or when
    cleared (``WALK_CLEARED``). It never raises while iterating."""

    def __init__(self, source: Any, overlay: list[tuple[bytes, Any]], at: int, overlay_done: bool,
                 upper: bytes | None, resume: bytes | None, now_ms: int, held: tuple[bytes, bytes] | None, /
                 ) -> None:
        if (not isinstance(overlay, list) or (upper is not None and not isinstance(upper, bytes))
                or (resume is not None and not isinstance(resume, bytes))
                or (held is not None and (not isinstance(held, tuple) or len(held) != 2))
                or (source is not None and not hasattr(source, "__next__")) or operator.index(at) < 0):
            raise TypeError("ScanWalk() takes an iterator or None, a list, a position, a flag, "
                            "bytes or None twice, a time and a pair or None")
        self.source = source
        self.overlay = overlay
        self.at = operator.index(at)
        self.overlay_done = bool(overlay_done)
        self.upper = upper
        self.resume = resume
        self.now_ms = operator.index(now_ms)
        self.held = held
        self.item: tuple[bytes, Any] | None = None
        self.error: BaseException | None = None
        self.state = WALK_RUNNING

    def __iter__(self) -> ScanWalk:
        return self

    def clear(self) -> None:
        """Stop: the next step ends the iteration."""
        self.state = WALK_CLEARED
        self.source = None

    def _fail(self, error: BaseException) -> None:
        self.error = error
        self.state = WALK_ERROR

    def _pull(self) -> None:
        try:
            pair = next(self.source)
        except StopIteration:
            self.source = None
            return
        except Exception as e:  # the source's error, for the caller to raise
            self._fail(e)
            return
        if (not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], bytes)
                or not isinstance(pair[1], bytes)):
            self._fail(TypeError("a scan's source yields (bytes, bytes) pairs"))
            return
        key = pair[0]
        if self.upper is not None and key >= self.upper:
            self.source = None
        elif len(key) > MAX_DIRECT_KEY:
            # A long key's group: every real key of it is > its first bytes + b"\0".
            self.resume = self.upper = key[:MAX_DIRECT_KEY] + b"\x00"
            self.source = None
        else:
            self.held = pair

    def __next__(self) -> tuple[bytes, Any]:
        while True:
            if self.state != WALK_RUNNING:
                raise StopIteration
            if self.held is None and self.source is not None:
                self._pull()
                if self.state != WALK_RUNNING:
                    raise StopIteration
            following: tuple[bytes, Any] | None = None
            if self.at < len(self.overlay):
                following = self.overlay[self.at]
                if not isinstance(following, tuple) or len(following) != 2 or not isinstance(following[0], bytes):
                    self._fail(TypeError("a scan's overlay holds (bytes, item) pairs"))
                    raise StopIteration
                if self.upper is not None and following[0] >= self.upper:
                    following = None  # past the range: the overlay is done
            elif not self.overlay_done:
                self.state = WALK_REFILL
                raise StopIteration
            held = self.held
            if held is None and following is None:
                self.state = WALK_RESUME if self.resume is not None else WALK_END
                raise StopIteration
            if held is not None and (following is None or held[0] < following[0]):
                entry = open_entry(held[0], held[1])
                if entry is None:
                    self.state = WALK_TREE  # damaged: for the caller to raise
                    raise StopIteration
                _key, _partition, _offset, _flags, inline_value, expires = entry
                if expires is not None and self.now_ms >= expires:
                    self.held = None
                    continue
                if inline_value is None:
                    self.state = WALK_TREE  # its value is in a data file
                    raise StopIteration
                self.held = None
                return held[0], inline_value
            assert following is not None
            if held is not None and held[0] == following[0]:
                self.held = None  # the overlay's entry is newer
            self.at += 1
            item = following[1]
            if item is None:
                continue
            if type(item) is bytes:
                return following
            self.item = following
            self.state = WALK_OVERLAY
            raise StopIteration


# ---- index runs --------------------------------------------------------------------------------

class Run:
    """An index run's header checked: its tables and data fill the buffer exactly."""

    __slots__ = ("data", "count", "key_bytes", "value_bytes", "keys_at", "values_at")

    def __init__(self, buffer: Buffer) -> None:
        data = memoryview(buffer).cast("B")
        if len(data) < 8:
            raise ValueError(BAD_RUN)
        magic, count = _HEADER.unpack_from(data)
        tables = 8 + 8 * count
        if magic != RUN_MAGIC or tables > len(data):
            raise ValueError(BAD_RUN)
        self.data = data
        self.count = count
        self.key_bytes = _U32.unpack_from(data, 8 + 4 * (count - 1))[0] if count else 0
        self.value_bytes = _U32.unpack_from(data, 8 + 4 * count + 4 * (count - 1))[0] if count else 0
        if tables + self.key_bytes + self.value_bytes != len(data):
            raise ValueError(BAD_RUN)
        self.keys_at = tables
        self.values_at = tables + self.key_bytes

    def _span(self, table_at: int, i: int, total: int) -> tuple[int, int]:
        start = _U32.unpack_from(self.data, table_at + 4 * (i - 1))[0] if i else 0
        stop = _U32.unpack_from(self.data, table_at + 4 * i)[0]
        if start > stop or stop > total:
            raise ValueError(BAD_RUN)
        return start, stop

    def key(self, i: int) -> bytes:
        start, stop = self._span(8, i, self.key_bytes)
        return self.data[self.keys_at + start:self.keys_at + stop].tobytes()

    def lower_bound(self, key: bytes) -> int:
        """The first entry whose key is >= ``key`` (``count`` if none)."""
        lo, hi = 0, self.count
        while lo < hi:
            mid = lo + (hi - lo) // 2
            if self.key(mid) < key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def entry(self, i: int) -> tuple[bytes, bytes]:
        """Entry ``i``: its key and its checked value (``b""`` for a deletion)."""
        key = self.key(i)
        start, stop = self._span(8 + 4 * self.count, i, self.value_bytes)
        value = self.data[self.values_at + start:self.values_at + stop].tobytes()
        if not key or len(key) > MAX_DIRECT_KEY:
            raise ValueError(BAD_RUN)
        if len(value) == DELETION_BYTES:
            if _crc(key) != int.from_bytes(value, "big"):
                raise ValueError(BAD_ENTRY)
            return key, b""
        entry = open_entry(key, value)
        if entry is None or entry[3] & FLAG_LONG:
            raise ValueError(BAD_ENTRY)
        return key, value

    def lookup(self, key: bytes) -> bytes | None:
        i = self.lower_bound(key)
        if i < self.count and self.key(i) == key:
            return self.entry(i)[1]
        return None


def find(run: Buffer, key: Buffer, /) -> bytes | None:
    """The entry's value (``b""``: a deletion), or None when the run has no entry for ``key``."""
    wanted = _bytes(key)
    return Run(run).lookup(wanted)


def find_first(runs: list[Any], key: Buffer, /) -> bytes | None:
    """The entry of the first run (in list order) holding ``key``, or None."""
    if not isinstance(runs, list):
        raise TypeError("find_first() takes a list of runs")
    wanted = _bytes(key)
    for run in runs:
        found = Run(run).lookup(wanted)
        if found is not None:
            return found
    return None


def _bound(bound: Buffer | None) -> bytes | None:
    if bound is None:
        return None
    if isinstance(bound, str):
        return bound.encode()
    return _bytes(bound)


def entries(run: Buffer, lower: Buffer | None, upper: Buffer | None, limit: int, reverse: bool, /
            ) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` with ``lower <= key < upper`` (None: unbounded): at most ``limit``
    (< 0: all) from the low end, or from the high end in descending order when ``reverse``."""
    opened = Run(run)
    low, high = _bound(lower), _bound(upper)
    limit = operator.index(limit)
    backwards = bool(reverse)
    first = opened.lower_bound(low) if low is not None else 0
    stop = opened.lower_bound(high) if high is not None else opened.count
    stop = max(stop, first)
    n = stop - first
    if 0 <= limit < n:
        n = limit
    out: list[tuple[bytes, bytes]] = []
    previous: bytes | None = None
    for j in range(n):
        key, value = opened.entry(stop - 1 - j if backwards else first + j)
        if previous is not None and (previous <= key if backwards else previous >= key):
            raise ValueError(BAD_RUN)
        out.append((key, value))
        previous = key
    return out


def _rows_in_bounds(ends: np.ndarray, rows: np.ndarray, size: int) -> np.ndarray:
    start, stop = ends[rows], ends[rows + 1]
    return (start >= 0) & (stop >= start) & (stop <= size)  # type: ignore[no-any-return]


def build(key_ends: Buffer, key_data: Buffer, value_ends: Buffer, value_data: Buffer, rows: Buffer,
          partitions: Buffer, positions: Buffer, live: Buffer, inline_limit: int,
          expires: Buffer | None = None, expiring: Buffer | None = None, /) -> bytes:
    """A run of ``rows`` of two binary columns, in strictly increasing key order, row ``i``
    expiring at ``expires[i]`` where ``expiring[i]`` is set; see kvlog.index.runs."""
    if (expires is None) != (expiring is None):
        raise TypeError("build: expires and expiring go together")
    raw = [memoryview(b).cast("B") for b in (key_ends, key_data, value_ends, value_data, rows, partitions,
                                                positions, live)]
    kend_raw, kdata, vend_raw, vdata, rows_raw, parts_raw, pos_raw, live_raw = raw
    limit = operator.index(inline_limit)
    records = len(kend_raw) // 4 - 1
    n = len(rows_raw) // 8
    if (records < 0 or len(kend_raw) % 4 or len(vend_raw) % 4 or len(rows_raw) % 8
            or len(vend_raw) // 4 - 1 != records or len(pos_raw) != 8 * n or len(parts_raw) != 2 * n
            or len(live_raw) != n):
        raise ValueError("build: buffers of different lengths")
    expiry_at: list[int] = [0] * n
    expiry_set: list[bool] = [False] * n
    if expires is not None and expiring is not None:
        expires_raw, expiring_raw = memoryview(expires).cast("B"), memoryview(expiring).cast("B")
        if len(expires_raw) != 8 * n or len(expiring_raw) != n:
            raise ValueError("build: buffers of different lengths")
        expiry_at = np.frombuffer(expires_raw, dtype=np.int64).tolist()
        expiry_set = (np.frombuffer(expiring_raw, dtype=np.uint8) != 0).tolist()
    kend = np.frombuffer(kend_raw, dtype=np.int32)
    vend = np.frombuffer(vend_raw, dtype=np.int32)
    row = np.frombuffer(rows_raw, dtype=np.int64)
    inside = (row >= 0) & (row < records)
    safe = np.where(inside, row, 0)
    inside &= _rows_in_bounds(kend, safe, len(kdata)) & _rows_in_bounds(vend, safe, len(vdata))
    klen = np.where(inside, kend[safe + 1].astype(np.int64) - kend[safe], 0)
    good_len = (klen > 0) & (klen <= MAX_DIRECT_KEY)
    bad = ~(inside & good_len)
    checked = int(bad.argmax()) if bad.any() else n  # rows before the first bad one
    if checked > 1:
        keys = pa.Array.from_buffers(pa.binary(), records, [None, pa.py_buffer(kend_raw), pa.py_buffer(kdata)])
        taken = keys.take(pa.array(row[:checked]))
        ascending = pc.less(taken.slice(0, checked - 1), taken.slice(1))
        if not ascending.to_numpy(zero_copy_only=False).all():
            raise ValueError("build: keys not in strictly increasing order")
    if checked < n:
        if not inside[checked]:
            raise ValueError("build: a row outside the columns")
        raise ValueError("build: an empty key or a key longer than 480 bytes")
    alive = np.frombuffer(live_raw, dtype=np.uint8) != 0
    vlen = np.where(alive, vend[safe + 1].astype(np.int64) - vend[safe], 0) if n else np.zeros(0, np.int64)
    inline_here = vlen <= limit
    key_bytes = int(klen.sum())
    value_bytes = int(np.where(alive, HEAD_BYTES + np.where(inline_here, vlen, 0), DELETION_BYTES).sum())
    value_bytes += EXPIRES_BYTES * sum(1 for a, e in zip(alive.tolist(), expiry_set, strict=True) if a and e)
    if key_bytes > 0xFFFFFFFF or value_bytes > 0xFFFFFFFF or n > 0xFFFFFFFF:
        raise OverflowError("build: a run holds at most 4 GiB of keys and of values")
    all_keys = kdata.tobytes()
    all_values = vdata.tobytes()
    key_parts: list[bytes] = []
    value_parts: list[bytes] = []
    for ks, ke, vs, ve, is_alive, is_inline, partition, offset, when, expiry in zip(
            kend[row].tolist(), kend[row + 1].tolist(), vend[row].tolist(), vend[row + 1].tolist(),
            alive.tolist(), inline_here.tolist(), np.frombuffer(parts_raw, dtype=np.uint16).tolist(),
            np.frombuffer(pos_raw, dtype=np.uint64).tolist(), expiry_at, expiry_set, strict=True):
        key = all_keys[ks:ke]
        key_parts.append(key)
        if is_alive:
            flags = (FLAG_INLINE if is_inline else 0) | (FLAG_EXPIRES if expiry else 0)
            body = _BODY.pack(partition, offset, flags)
            if expiry:
                body += when.to_bytes(EXPIRES_BYTES, "big", signed=True)
            if is_inline:
                body += all_values[vs:ve]
            value_parts.append(_crc(body, _crc(key)).to_bytes(4, "big") + body)
        else:
            value_parts.append(_crc(key).to_bytes(4, "big"))
    key_end = np.cumsum([len(k) for k in key_parts], dtype=np.uint64).astype("<u4")
    value_end = np.cumsum([len(v) for v in value_parts], dtype=np.uint64).astype("<u4")
    return b"".join([_HEADER.pack(RUN_MAGIC, n), key_end.tobytes(), value_end.tobytes(), *key_parts,
                     *value_parts])


#: Getter's call without a freshness deadline.
_NO_DEADLINE: Any = object()


class Getter:
    """``KeyIndex.lookup``'s common case in one call (see :mod:`kvlog.index.reads`): a bytes key
    of at most 480 bytes that the memtable does not hold, before the freshness deadline, in a
    complete index, read with a pooled read transaction whose snapshot is still the newest
    (:meth:`watch` names the pool, the data file's meta pages and the map's gate: runs are read
    only while their tag is current, see :mod:`kvlog.meta.map_gate`). Every other case, and any
    error on the way, is ``slow(key, fresh_until)``'s: the Python path, which gives every
    answer and raises every error. A value not inline in its entry is ``decoded(key, raw)``'s."""

    def __init__(self, memtable: Any, clock: Any, index: Any, slow: Any, decoded: Any, /) -> None:
        self._memtable = memtable
        self._clock = clock
        self._index = index
        self._slow = slow
        self._decoded = decoded
        self._snaps: list[Any] = []
        self._meta: Buffer | None = None
        self._page = 0
        self._gate: Any = None

    def watch(self, snaps: list[Any], meta: Buffer | None, page_size: int, gate: Any, /) -> None:
        """The pool to take transactions from, the meta pages to check them against (meta
        None: none are watched, every get takes the slow path) and the gate of the map's
        views (its ``epoch``, ``enter`` and ``leave``)."""
        if type(snaps) is not list:
            raise TypeError("watch() takes a list")
        self._meta = None
        self._snaps = snaps
        self._gate = gate
        if meta is not None:
            lmdb_txnid(meta, page_size)  # ValueError unless it holds two meta pages
            self._meta, self._page = meta, operator.index(page_size)

    def _call_slow(self, key: Any, fresh: Any) -> Any:
        return self._slow(key) if fresh is _NO_DEADLINE else self._slow(key, fresh)

    def __call__(self, key: Any, fresh_until: Any = _NO_DEADLINE, /) -> Any:
        fresh = fresh_until
        snaps, meta = self._snaps, self._meta
        if type(key) is not bytes or not 0 < len(key) <= MAX_DIRECT_KEY or meta is None or not snaps:
            return self._call_slow(key, fresh)
        memtable = self._memtable
        for table in (memtable.front, memtable.frozen):
            if type(table) is dict:
                if key in table:
                    return self._call_slow(key, fresh)
            elif table is not None:
                return self._call_slow(key, fresh)
        if fresh is not _NO_DEADLINE and float(self._clock()) >= float(fresh):
            return self._call_slow(key, fresh)
        if self._index._complete is not True:
            return self._call_slow(key, fresh)
        try:
            snap = snaps.pop()
        except IndexError:
            return self._call_slow(key, fresh)
        if type(snap) is not tuple or len(snap) != 4 or type(snap[2]) is not list:
            return self._call_slow(key, fresh)
        if snap[0] != lmdb_txnid(meta, self._page):
            return self._call_slow(key, fresh)  # a commit landed since it began
        gate = self._gate
        gate.enter()  # the pooled transaction and its views are used inside the gate, never calling out
        try:
            if snap[3] != gate.epoch:
                raw = None  # its views died with a resize of the map: the slow path, below
            else:
                raw = find_first(snap[2], key) if snap[2] else None
                if raw is None:
                    raw = snap[1](key)  # raises if its transaction ended (the map was resized)
                    if raw is None:
                        snaps.append(snap)
                        return None  # no such key
                if type(raw) is bytes and not raw:
                    snaps.append(snap)
                    return None  # deleted in a run
                value = inline(key, raw)
        except Exception:  # noqa: BLE001 - the slow path reads it again and raises what is wrong
            raw = None
        finally:
            gate.leave()
        if raw is None:
            return self._call_slow(key, fresh)
        snaps.append(snap)
        if value is None:
            return self._decoded(key, raw)
        return value

