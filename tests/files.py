"""Copying and comparing stores in tests without filling the disk or reading gigabytes.

A store's metadata cache is an LMDB data file the size of its map (1 GiB), sparse: only the
pages written take disk space. ``shutil.copytree`` writes the holes out, so a test copying a
store case by case would write a gigabyte per copy; :func:`copy_store` keeps them holes.
:func:`content_digest` reads only the extents that hold data.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

__all__ = ["content_digest", "copy_store"]

_PAGE = 4096


def copy_store(source: Path, target: Path) -> Path:
    """Copy the directory ``source`` to ``target`` (which must not exist), sparse files kept
    sparse, modes and times kept."""
    if target.exists():
        raise FileExistsError(target)
    subprocess.run(["cp", "-a", "--sparse=always", str(source), str(target)], check=True)
    return target


def content_digest(path: Path) -> str:
    """A digest of the bytes of ``path`` as a reader sees them: its size and every page that
    is not all zeros, with its offset.

    Only the extents ``SEEK_DATA``/``SEEK_HOLE`` report are read, but where they start and end
    is not part of the digest: the cache reserves blocks ahead with ``posix_fallocate``, and
    ext4 reports such a block as data or as a hole depending on whether its zero page happens
    to be in the page cache. Zero pages and holes hash alike, so the digest changes only when
    a byte does.
    """
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        h.update(size.to_bytes(8, "big"))
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            page = max(pos, start - start % _PAGE)
            while page < end:
                chunk = os.pread(fd, _PAGE, page)
                if not chunk:
                    break
                if chunk.strip(b"\0"):
                    h.update(page.to_bytes(8, "big"))
                    h.update(chunk)
                page += _PAGE
            pos = max(end, page)
    return h.hexdigest()
