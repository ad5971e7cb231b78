"""Disk blocks for the pages the metadata cache's next write transaction may add.

The cache is opened with ``writemap``: write transactions change the memory map itself, so
their dirty pages are page cache, never heap that grows with the size of a transaction. The
data file is sparse, though, and a store through the map into a page the filesystem has no
block for, on a full disk, is a SIGBUS that ends the process. So before each write transaction
the pages past the last one in use get their blocks with ``posix_fallocate``: a disk too full
for them is an ``ENOSPC`` there, a :class:`~kvlog.errors.StorageError` raised before the
transaction starts, and the cache stays as its last commit left it.

How far ahead: a megabyte, an eighth of the pages in use, twice the most a transaction of this
process has added, and what the transaction says it may add (an index merge rewrites the trees
it merges: :func:`tree_bytes`), whichever is most. When the disk cannot hold that much, the
transaction runs if it can hold what the transaction said, and twice the most any transaction
added, at least 64 KiB; else it is refused. Only a transaction adding more than all of that,
on a disk that fills at that very moment, can still fault. The blocks reserved are counted in
the cache's disk usage (the next transactions use them).
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import lmdb

from kvlog.errors import StorageError

__all__ = ["PageReserve", "tree_bytes"]

log = logging.getLogger("kvlog.log")

_MIN_AHEAD = 1 << 20
_FLOOR = 64 << 10
_FULL = (errno.ENOSPC, errno.EDQUOT)


class PageReserve:
    """The blocks ahead of the pages in use of one LMDB data file (see the module docstring)."""

    def __init__(self, data_file: Path) -> None:
        self._data_file = data_file
        self._reserved_to = 0  # bytes from the start of the file known to have blocks
        self._largest_growth = 0  # the most bytes one write transaction of this process added
        self._working = True  # False once the filesystem refused for another reason than space

    def before(self, env: lmdb.Environment, grows: int = 0) -> int:
        """Reserve blocks ahead of the pages ``env`` uses before a write transaction that may
        add ``grows`` bytes of pages; the bytes in use, for :meth:`after`. A disk too full for
        the least the transaction may need is a :class:`StorageError`."""
        used = _used_bytes(env)
        if not self._working:
            return used
        size = int(env.info()["map_size"])
        least = max(_FLOOR, 2 * self._largest_growth, grows)
        for ahead in (max(_MIN_AHEAD, used // 8, least), least):
            want = min(used + ahead, size)
            if want <= self._reserved_to:
                return used
            try:
                self._allocate(used, want)
            except OSError as e:
                if e.errno in _FULL and ahead != least:
                    continue  # try with the least the transaction may need
                if e.errno in _FULL:
                    raise StorageError(f"no room on the disk under the metadata cache "
                                       f"{self._data_file.parent} for {want - used} bytes of pages: "
                                       "free space, then write again") from e
                log.debug("blocks of %s cannot be reserved (%s): writing without a reserve",
                          self._data_file, e)
                self._working = False
                return used
            self._reserved_to = want
            return used
        return used

    def _allocate(self, start: int, end: int) -> None:
        fd = os.open(self._data_file, os.O_RDWR)
        try:
            os.posix_fallocate(fd, start, end - start)
        finally:
            os.close(fd)

    def after(self, env: lmdb.Environment, used_before: int) -> None:
        """Remember how much the write transaction that just committed added."""
        self._largest_growth = max(self._largest_growth, _used_bytes(env) - used_before)


def _used_bytes(env: lmdb.Environment) -> int:
    """Bytes of the data file up to the last page in use."""
    return (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])


def tree_bytes(env: lmdb.Environment, dbs: list[lmdb._Database]) -> int:
    """Bytes of the pages the databases ``dbs`` hold: what a transaction rewriting them adds at
    most (copy on write)."""
    psize = int(env.stat()["psize"])
    with env.begin() as txn:
        pages = 0
        for db in dbs:
            stat = txn.stat(db)
            pages += int(stat["branch_pages"]) + int(stat["leaf_pages"]) + int(stat["overflow_pages"])
    return pages * psize
