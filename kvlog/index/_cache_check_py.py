"""The structural check of kvlog's LMDB cache file in Python: the twin of the compiled
``_cache_check`` (same result for every input); :mod:`kvlog._native` picks one of them. It
reads index entries and index runs with :mod:`kvlog.index._runs_py`'s readers.

LMDB trusts its pages and may crash on garbage, and a damaged key would hide its entry from
lookups: before LMDB reads a cache that may have been damaged, this walks LMDB 0.9's on-disk
layout (64-bit, little-endian): pages of ``psize`` bytes, each with a 16-byte header (page
number u64, pad u16, flags u16, then lower and upper u16, or an overflow page's page count
u32); two meta pages first; B-trees of branch and leaf pages whose nodes are (lo u16, hi u16,
flags u16, key size u16, key, data). Every page is reached at most once, every offset is
checked before it is followed, and the values of kvlog's key index, index runs and sealed
databases are checked whole.

This module does no I/O.
"""

from __future__ import annotations

import struct
from typing import Any

import crc32c as _crc32c

from kvlog.index._runs_py import Run, open_entry

__all__ = ["check_lmdb"]

MDB_MAGIC = 0xBEEFC0DE
MDB_DATA_VERSION = 1
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
MDB_DUPSORT = 0x04
MDB_PERSISTENT_FLAGS = 0x7E
PAGEHDRSZ = 16
NODESIZE = 8
DB_BYTES = 48
MAX_DEPTH = 32
NO_PAGE = 2**64 - 1
MAX_SEALED = 16
KIND_PLAIN, KIND_FREE, KIND_INDEX, KIND_RUNS, KIND_SEALED = range(5)

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_NODE = struct.Struct("<HHHH")
_crc = _crc32c.crc32c


class _Damage(Exception):
    """What is damaged, raised to the top of the walk."""


class _Walk:
    def __init__(self, data: memoryview, psize: int, pages: int, names: dict[bytes, int]) -> None:
        self.map = data
        self.psize = psize
        self.pages = pages
        self.seen = bytearray(pages)
        self.names = names

    def claim(self, pgno: int, count: int) -> None:
        """Claim pages [pgno, pgno + count) for one use: in range and not reached before."""
        if pgno < 2 or count == 0 or pgno >= self.pages or count > self.pages - pgno:
            raise _Damage("a page number outside the file")
        if any(self.seen[pgno:pgno + count]):
            raise _Damage("a page reached twice")
        self.seen[pgno:pgno + count] = b"\x01" * count

    def node_data(self, page: int, at: int, node_flags: int, dsize: int, ksize: int) -> tuple[int, int]:
        """(start, size) in the file of a leaf node's data, inline or on overflow pages (claimed)."""
        start = at + NODESIZE + ksize
        if node_flags & F_BIGDATA:
            if start + 8 > self.psize:
                raise _Damage("a node outside its page")
            pgno = _U64.unpack_from(self.map, page + start)[0]
            count = (PAGEHDRSZ - 1 + dsize) // self.psize + 1
            if pgno < 2 or pgno >= self.pages:
                raise _Damage("an overflow page outside the file")
            first = pgno * self.psize
            held = _U32.unpack_from(self.map, first + 12)[0]
            if (_U64.unpack_from(self.map, first)[0] != pgno or _U16.unpack_from(self.map, first + 10)[0] != P_OVERFLOW
                    or held < count):
                raise _Damage("a damaged overflow page")
            self.claim(pgno, held)
            return first + PAGEHDRSZ, dsize
        if start + dsize > self.psize:
            raise _Damage("a node outside its page")
        return page + start, dsize

    def walk_db(self, db: int, kind: int, depth_left: int) -> None:
        """Check the database whose record (MDB_db, 48 bytes) is at ``db``."""
        flags, depth = struct.unpack_from("<HH", self.map, db + 4)
        root = _U64.unpack_from(self.map, db + 40)[0]
        if depth_left <= 0:
            raise _Damage("databases nested too deep")
        if kind != KIND_FREE and flags & ~MDB_PERSISTENT_FLAGS:  # the free one's holds the env's
            raise _Damage("a database of unknown flags")
        if root == NO_PAGE:
            if depth != 0:
                raise _Damage("an empty database with a depth")
            return
        if depth < 1 or depth > MAX_DEPTH:
            raise _Damage("a database of impossible depth")
        self.walk_page(root, 1, depth, 0 if kind == KIND_FREE else flags, kind, depth_left)

    def walk_page(self, pgno: int, level: int, depth: int, db_flags: int, kind: int, depth_left: int) -> None:
        """Check the subtree at ``pgno``, at ``level`` (1: the root) of a tree of ``depth`` levels."""
        self.claim(pgno, 1)
        data, psize = self.map, self.psize
        page = pgno * psize
        flags, lower, upper = struct.unpack_from("<HHH", data, page + 10)
        leaf = level == depth
        ordered = db_flags == 0 and kind != KIND_FREE  # memcmp order
        if _U64.unpack_from(data, page)[0] != pgno or flags != (P_LEAF if leaf else P_BRANCH):
            raise _Damage("a page of the wrong number or kind")
        if lower < PAGEHDRSZ + 2 or (lower - PAGEHDRSZ) % 2 or lower > upper or upper > psize:
            raise _Damage("a page's free space out of bounds")
        previous = b""
        for i in range((lower - PAGEHDRSZ) // 2):
            at = _U16.unpack_from(data, page + PAGEHDRSZ + 2 * i)[0]
            if at < upper or at + NODESIZE > psize:
                raise _Damage("a node outside its page")
            lo, hi, node_flags, ksize = _NODE.unpack_from(data, page + at)
            if at + NODESIZE + ksize > psize:
                raise _Damage("a key outside its page")
            key = data[page + at + NODESIZE:page + at + NODESIZE + ksize].tobytes()
            if ordered and (i > 0 if leaf else i > 1) and previous >= key:  # a branch's first key is empty
                raise _Damage("keys out of order")
            previous = key
            if not leaf:
                self.walk_page(lo | (hi << 16) | (node_flags << 32), level + 1, depth, db_flags, kind, depth_left)
                continue
            if node_flags & ~(F_BIGDATA | F_SUBDATA | F_DUPDATA):
                raise _Damage("a node of unknown kind")
            start, size = self.node_data(page, at, node_flags, lo | (hi << 16), ksize)
            if node_flags & F_DUPDATA:
                if not db_flags & MDB_DUPSORT or node_flags & F_BIGDATA or kind != KIND_PLAIN:
                    raise _Damage("duplicates in a database without them")
                if node_flags & F_SUBDATA:
                    if size != DB_BYTES:
                        raise _Damage("a damaged database record")
                    self.walk_db(start, KIND_PLAIN, depth_left - 1)
                continue  # a sub-page of duplicates lies within the node, checked above
            if node_flags & F_SUBDATA:
                if size != DB_BYTES or node_flags & F_BIGDATA or kind != KIND_PLAIN:
                    raise _Damage("a damaged database record")
                self.walk_db(start, self.names.get(key, KIND_PLAIN), depth_left - 1)
            elif kind == KIND_FREE:  # a list of free pages: count, then the page numbers
                if size < 8 or size % 8 or _U64.unpack_from(data, start)[0] != size // 8 - 1:
                    raise _Damage("a damaged free-page list")
                for (free_page,) in struct.iter_unpack("<Q", data[start + 8:start + size]):
                    if free_page < 2 or free_page >= self.pages:
                        raise _Damage("a free page outside the file")
            elif kind == KIND_INDEX:
                if open_entry(key, data[start:start + size].tobytes()) is None:
                    raise _Damage("a key index entry that fails its checksum")
            elif kind == KIND_RUNS:
                if not _run_whole(data[start:start + size]):
                    raise _Damage("a damaged index run")
            elif kind == KIND_SEALED:
                if size < 4 or _crc(data[start + 4:start + size].tobytes(), _crc(key)) != int.from_bytes(
                        data[start:start + 4], "big"):
                    raise _Damage("a metadata value that fails its checksum")


def _run_whole(run: memoryview) -> bool:
    """Whether ``run`` is a whole index run: every entry in bounds, in order and checked."""
    try:
        opened = Run(run)
        previous = b""
        for i in range(opened.count):
            key, _value = opened.entry(i)
            if i and previous >= key:
                return False
            previous = key
    except ValueError:
        return False
    return True


def check_lmdb(data: Any, index_name: Any, runs_name: Any, sealed_names: tuple[bytes, ...], /) -> str | None:
    """None if an LMDB data file is whole (its B-trees' structure, and every value of the named
    key index, index runs and sealed databases), else the first damage found."""
    whole = memoryview(data).cast("B")
    index, runs = memoryview(index_name).tobytes(), memoryview(runs_name).tobytes()
    if not isinstance(sealed_names, tuple):
        raise TypeError("check_lmdb() takes a tuple of sealed database names")
    if len(sealed_names) > MAX_SEALED:
        raise ValueError("check_lmdb: at most 16 sealed databases")
    names: dict[bytes, int] = {}
    for name in sealed_names:
        if not isinstance(name, bytes):
            raise TypeError("check_lmdb: sealed database names are bytes")
        names.setdefault(bytes(name), KIND_SEALED)
    names[runs] = KIND_RUNS  # the index's name wins over the others', then the runs'
    names[index] = KIND_INDEX
    try:
        return _check(whole, names)
    except _Damage as damage:
        return str(damage)


def _check(data: memoryview, names: dict[bytes, int]) -> str | None:
    size = len(data)
    if size < PAGEHDRSZ + 136:
        return "too short for a meta page"
    psize = _U16.unpack_from(data, PAGEHDRSZ + 24)[0] | (_U16.unpack_from(data, PAGEHDRSZ + 26)[0] << 16)
    if psize < 256 or psize > 65536 or psize & (psize - 1) or size < 2 * psize:
        return "an impossible page size"
    metas = []
    for m in range(2):
        page = m * psize
        magic, version = struct.unpack_from("<II", data, page + PAGEHDRSZ)
        if not _U16.unpack_from(data, page + 10)[0] & P_META or magic != MDB_MAGIC or version != MDB_DATA_VERSION:
            return "a damaged meta page"
        metas.append(page + PAGEHDRSZ)
    # LMDB reads the meta page of the newer transaction: magic, version, address, map size, the
    # free and main databases' records, the last page, the transaction id.
    meta = metas[1] if _U64.unpack_from(data, metas[0] + 128)[0] < _U64.unpack_from(data, metas[1] + 128)[0] else metas[0]
    last = _U64.unpack_from(data, meta + 120)[0]
    if last < 1 or last >= size // psize:
        return "a last page outside the file"
    walk = _Walk(data, psize, last + 1, names)
    walk.walk_db(meta + 24, KIND_FREE, 3)
    walk.walk_db(meta + 24 + DB_BYTES, KIND_PLAIN, 3)  # the main database: records of named ones
    return None
