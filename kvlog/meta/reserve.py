"""Disk blocks for the pages the metadata cache's next write transaction may add.

The cache is opened with ``writemap``: write transactions change the memory map itself, so
their dirty pages are page cache, never heap that grows with the size of a transaction. The
data file is sparse, though, and a store through the map into a page the filesystem has no
block for, on a full disk, is a SIGBUS that ends the process. So before each write transaction
the pages past the last one in use get their blocks with ``posix_fallocate``: a disk too full
for them is an ``ENOSPC`` there, a :class:`~kvlog.errors.StorageError` raised before the
transaction starts, and the cache stays as its last commit left it.

How far ahead: as far as the pages in use reach (a transaction that rewrites every page of the
file, as an index merge may, fits), at least a megabyte, and twice the most a transaction of
this process has added. Only a transaction that adds more than all the pages before it, on a
disk that fills at that very moment, can still fault. The cost is disk: the data file holds
blocks for up to twice its pages in use, and the cache's disk usage counts them.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import lmdb

from kvlog.errors import StorageError

__all__ = ["PageReserve"]

log = logging.getLogger("kvlog.log")

_MIN_AHEAD = 1 << 20
_FULL = (errno.ENOSPC, errno.EDQUOT)


class PageReserve:
    """The blocks ahead of the pages in use of one LMDB data file (see the module docstring)."""

    def __init__(self, data_file: Path) -> None:
        self._data_file = data_file
        self._reserved_to = 0  # bytes from the start of the file known to have blocks
        self._largest_growth = 0  # the most bytes one write transaction of this process added
        self._working = True  # False once the filesystem refused for another reason than space

    def before(self, env: lmdb.Environment) -> int:
        """Reserve blocks ahead of the pages ``env`` uses before a write transaction; the bytes
        in use, for :meth:`after`. A full disk is a :class:`StorageError`."""
        used = _used_bytes(env)
        if not self._working:
            return used
        ahead = max(_MIN_AHEAD, used, 2 * self._largest_growth)
        want = min(used + ahead, int(env.info()["map_size"]))
        if want <= self._reserved_to:
            return used
        try:
            fd = os.open(self._data_file, os.O_RDWR)
            try:
                os.posix_fallocate(fd, used, want - used)
            finally:
                os.close(fd)
        except OSError as e:
            if e.errno in _FULL:
                raise StorageError(f"no room on the disk under the metadata cache {self._data_file.parent} "
                                   f"for {want - used} bytes of pages: free space, then write again") from e
            log.debug("blocks of %s cannot be reserved (%s): writing without a reserve", self._data_file, e)
            self._working = False
            return used
        self._reserved_to = want
        return used

    def after(self, env: lmdb.Environment, used_before: int) -> None:
        """Remember how much the write transaction that just committed added."""
        self._largest_growth = max(self._largest_growth, _used_bytes(env) - used_before)


def _used_bytes(env: lmdb.Environment) -> int:
    """Bytes of the data file up to the last page in use."""
    return (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])
