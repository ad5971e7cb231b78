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
the end of a flush (once the flushes since the last call add up to a megabyte,
``kvlog.log.flusher.RELEASE_AFTER_BYTES``: a durable put's small flush frees a
few KiB, which the next flush reuses) and after each partition of a compaction
job: it asks
Arrow's pool to return what the calling thread's heap no longer uses, and
glibc to trim its arenas (``malloc_trim``, which releases free pages inside
the heaps too, not only at their tops). Both calls only return memory that is
free; they cost about a millisecond, small beside a flush or a round. On a C
library without ``malloc_trim`` the second step is skipped.

kvlog's own data paths allocate from two Arrow pools of their own, and leave
the process's default pool alone. Arrow's default pool (mimalloc) keeps freed
pages of a thread's heap resident, and pages freed by another thread until
their own thread collects them; in compaction, where one thread decodes and
another writes, it held 63 MiB where Arrow counted 10 MiB allocated. Measured
on a forced compaction of 5 M keys, peak ``RssAnon`` was 106 MiB with mimalloc,
70 with jemalloc and 67 with ``malloc``. ``malloc`` made the round slower
(more page faults); jemalloc did not. So :data:`COMPACTION_POOL` (decoding,
filtering and concatenating in compaction jobs) is jemalloc where pyarrow has
it, and :data:`ARROW_POOL` (a flush's batch, decoding for reads) is ``malloc``.
A store loaded with 5 M keys grew 28 to 36 MiB over one with 100 k keys with
``malloc`` for both, 55 to 63 MiB with jemalloc for both, and 38 to 42 MiB as
set here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

import pyarrow as pa

__all__ = ["ARROW_POOL", "COMPACTION_POOL", "release_unused_memory"]

#: The Arrow memory pool of kvlog's data paths (see the module's documentation).
ARROW_POOL: pa.MemoryPool = pa.system_memory_pool()


def _compaction_pool() -> pa.MemoryPool:
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return ARROW_POOL


#: The Arrow memory pool of compaction jobs (see the module's documentation).
COMPACTION_POOL: pa.MemoryPool = _compaction_pool()


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
    function: Callable[[int], int] = trim
    return function


_MALLOC_TRIM = _load_malloc_trim()


def release_unused_memory() -> None:
    """Return the calling thread's unused Arrow memory and glibc's free heap pages to the system."""
    pa.default_memory_pool().release_unused()
    ARROW_POOL.release_unused()
    if COMPACTION_POOL is not ARROW_POOL:
        COMPACTION_POOL.release_unused()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
