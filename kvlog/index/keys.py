"""How user keys become LMDB keys in the key index, and the key ranges of scans.

LMDB keys are at most 511 bytes. Keys of up to :data:`DIRECT_KEY_BYTES` (480)
bytes are stored as they are, so the index sorts in key order. A longer key is
stored as its first 480 bytes followed by the 16-byte XXH3-128 of the whole key
(496 bytes, and only long keys have that length), with the full key kept in
the value. Long keys that share their first 480 bytes therefore sit next to
each other, ordered by hash; scans collect such a run and sort it by the real
keys, so every scan returns true key order.
"""

from __future__ import annotations

import xxhash

__all__ = [
    "DIRECT_KEY_BYTES", "LONG_KEY_BYTES", "encode_index_key", "is_long_encoded", "prefix_successor",
    "scan_bounds",
]

DIRECT_KEY_BYTES = 480
LONG_KEY_BYTES = DIRECT_KEY_BYTES + 16


def encode_index_key(key: bytes) -> bytes:
    """The LMDB key of ``key``."""
    if len(key) <= DIRECT_KEY_BYTES:
        return key
    return key[:DIRECT_KEY_BYTES] + xxhash.xxh3_128_digest(key)


def is_long_encoded(lmdb_key: bytes) -> bool:
    """Whether an LMDB index key stands for a long key."""
    return len(lmdb_key) == LONG_KEY_BYTES


def prefix_successor(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def scan_bounds(start: bytes | None, stop: bytes | None, prefix: bytes | None) -> tuple[bytes | None, bytes | None]:
    """The key range ``[lower, upper)`` of a scan from ``start`` to ``stop`` within ``prefix``."""
    lower, upper = start, stop
    if prefix:
        lower = prefix if lower is None or lower < prefix else lower
        successor = prefix_successor(prefix)
        if successor is not None and (upper is None or successor < upper):
            upper = successor
    return lower, upper
