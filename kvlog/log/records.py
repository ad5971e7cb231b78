"""Records, append results, and the validation every write goes through."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from kvlog.errors import InvalidRecordError

__all__ = [
    "Record",
    "AppendResult",
    "partition_for_key",
    "to_key",
    "to_value",
    "check_ttl",
    "validate_records",
    "ValidRecords",
]


@dataclass(frozen=True)
class Record:
    """One record of the log; ``value`` None is a tombstone. ``expires_ms`` is when a record
    written with a time to live expires (ms since the epoch; None: never)."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes | None
    expires_ms: int | None = None

    @property
    def is_tombstone(self) -> bool:
        """Whether the record deletes its key."""
        return self.value is None


@dataclass(frozen=True)
class AppendResult:
    """Offsets a producer append got; ``duplicate`` when it repeated an earlier batch."""

    base_offset: int
    last_offset: int
    duplicate: bool = False


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of ``key``: XXH3-64 of the key bytes (seed 0) modulo the partition count.

    Stable across processes, machines and versions; documented in the format spec.
    """
    return xxhash.xxh3_64_intdigest(key) % partitions


def _utf8(text: str, what: str) -> bytes:
    """``text`` as UTF-8; a str with a lone surrogate has no UTF-8 form, so it is ``InvalidRecordError``.

    Such a str is not Unicode text (it comes from ``surrogateescape`` decoding, or from
    slicing a pair apart): refusing it keeps a bad key out of the batch with the one error
    every bad record gets, instead of a ``UnicodeEncodeError`` halfway through a write.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRecordError(
            f"a str {what} must encode as UTF-8: {e.reason} at index {e.start} "
            f"({text[e.start:e.end]!r}); give bytes for binary data"
        ) from None


def to_key(key: Any, max_key_bytes: int) -> bytes:
    """``key`` as bytes, or ``InvalidRecordError``: not None, bytes-like or str (valid UTF-8), not empty, not too long."""
    if isinstance(key, bytes):
        out = key
    elif isinstance(key, str):
        out = _utf8(key, "key")
    elif isinstance(key, bytearray | memoryview):
        out = bytes(key)
    elif key is None:
        raise InvalidRecordError("a key may not be None")
    else:
        raise InvalidRecordError(f"a key must be bytes or str, not {type(key).__name__}")
    if not out:
        raise InvalidRecordError("a key may not be empty")
    if len(out) > max_key_bytes:
        raise InvalidRecordError(f"a key of {len(out)} bytes is larger than max_key_bytes={max_key_bytes}")
    return out


def to_value(value: Any) -> bytes:
    """``value`` as bytes, or ``InvalidRecordError``: bytes-like or str (valid UTF-8); None is not a value (use delete)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return _utf8(value, "value")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if value is None:
        raise InvalidRecordError("a value may not be None (use delete to remove a key)")
    raise InvalidRecordError(f"a value must be bytes or str, not {type(value).__name__}")


@dataclass(frozen=True)
class ValidRecords:
    """A validated batch: parallel lists of keys, values (None = tombstone) and timestamps,
    and of expiry times when a record has one (None: no record of the batch expires)."""

    keys: list[bytes]
    values: list[bytes | None]
    timestamps: list[int]
    expires: list[int | None] | None = None

    def __len__(self) -> int:
        return len(self.keys)


def validate_records(
    records: Iterable[Sequence[Any]], *, default_timestamp: int, max_key_bytes: int, max_record_bytes: int
) -> ValidRecords:
    """Validate ``(key, value_or_None[, timestamp_ms[, expires_ms_or_None]])`` tuples; the
    first bad one rejects all. A tombstone never expires (its ``expires_ms`` must be None)."""
    keys: list[bytes] = []
    values: list[bytes | None] = []
    stamps: list[int] = []
    expiries: list[int | None] = []
    for i, item in enumerate(records):
        if not isinstance(item, tuple | list) or len(item) not in (2, 3, 4):
            raise InvalidRecordError(
                f"record {i}: expected (key, value), (key, value, timestamp_ms) or "
                "(key, value, timestamp_ms, expires_ms)"
            )
        key = to_key(item[0], max_key_bytes)
        value = None if item[1] is None else to_value(item[1])
        ts = item[2] if len(item) >= 3 else default_timestamp
        if not _is_int64(ts):
            raise InvalidRecordError(f"record {i}: timestamp_ms must be a 64-bit integer")
        expires = item[3] if len(item) == 4 else None
        if expires is not None:
            if not _is_int64(expires) or expires == -(2**63):
                raise InvalidRecordError(
                    f"record {i}: expires_ms must be a 64-bit integer above -2**63, or None"
                )
            if value is None:
                raise InvalidRecordError(f"record {i}: a tombstone has no expiry")
        size = len(key) + (len(value) if value is not None else 0)
        if size > max_record_bytes:
            raise InvalidRecordError(
                f"record {i}: {size} bytes is larger than max_record_bytes={max_record_bytes}"
            )
        keys.append(key)
        values.append(value)
        stamps.append(ts)
        expiries.append(expires)
    if not keys:
        raise InvalidRecordError("a batch holds at least one record")
    return ValidRecords(keys, values, stamps, expiries if any(e is not None for e in expiries) else None)


def _is_int64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def check_ttl(ttl_ms: Any) -> int:
    """``ttl_ms`` if it is a positive integer (not a bool) that fits 64 bits, else ``InvalidRecordError``."""
    if not isinstance(ttl_ms, int) or isinstance(ttl_ms, bool) or not 0 < ttl_ms < 2**62:
        raise InvalidRecordError(f"ttl_ms must be a positive integer of milliseconds, not {ttl_ms!r}")
    return ttl_ms
