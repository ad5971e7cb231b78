"""How many records one flush holds, as a store's flusher counts them.

A store flushes once its buffered records count ``flush_bytes``; each record counts its key,
its value and a fixed overhead for the memory it holds while buffered. The bulk loaders write
data files of exactly one flush's records, and the recovery writers commit that many records
at a time, so they need that count. It is measured through the public API, from a store's
``stats()["unflushed_bytes"]`` after one buffered put, so it follows the flusher wherever its
accounting goes.
"""

from __future__ import annotations

import functools
import tempfile

__all__ = ["flushed_record_bytes", "records_per_flush"]

#: Large enough that one put never starts a flush, whatever the record's size.
_NEVER = 1 << 50


@functools.cache
def flushed_record_bytes(key_bytes: int, value_bytes: int) -> int:
    """The bytes a store's flusher counts for one buffered record of these sizes."""
    import kvlog

    with tempfile.TemporaryDirectory(prefix="kvlog-bench-sizing-") as path:
        store = kvlog.open(path, flush_bytes=_NEVER, max_unflushed_bytes=_NEVER, flush_interval_ms=0,
                           background_compaction=False)
        try:
            store.put(b"k" * key_bytes, b"v" * value_bytes)
            counted = int(store.stats()["unflushed_bytes"])
        finally:
            store.close(flush=False)
    if counted < key_bytes + value_bytes:
        raise RuntimeError(f"a store counted {counted} bytes for a record of {key_bytes + value_bytes}")
    return counted


def records_per_flush(flush_bytes: int, key_bytes: int, value_bytes: int) -> int:
    """Records of one flush of ``flush_bytes`` (at least one)."""
    return max(1, flush_bytes // flushed_record_bytes(key_bytes, value_bytes))
