"""Handing freed memory back to the operating system after bursts of work.

A flush and a compaction round allocate tens of MiB of short-lived buffers
(Arrow arrays, IPC and compression buffers, numpy temporaries) and free them
when they end. Allocators keep such memory for reuse: Arrow's default pool
(mimalloc) keeps it in the heap of the thread that allocated it, and glibc's
``malloc`` keeps it in per-thread arenas, where fragmentation stops it from
shrinking. Neither returns it promptly on its own, so a long-running process
that flushes and compacts on several threads would hold the high-water mark of
every thread at once, and that grows with how long (and so how many keys) the
store has been written.

:func:`release_unused_memory` is called by the thread that did the work, at
the end of each flush and after each partition of a compaction job: it asks
Arrow's pool to return what the calling thread's heap no longer uses, and
glibc to trim its arenas (``malloc_trim``, which releases free pages inside
the heaps too, not only at their tops). Both calls only return memory that is
free; they cost about a millisecond, small beside a flush or a round. On a C
library without ``malloc_trim`` the second step is skipped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

import pyarrow as pa

__all__ = ["release_unused_memory"]


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_MALLOC_TRIM = _load_malloc_trim()


def release_unused_memory() -> None:
    """Return the calling thread's unused Arrow memory and glibc's free heap pages to the system."""
    pa.default_memory_pool().release_unused()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
