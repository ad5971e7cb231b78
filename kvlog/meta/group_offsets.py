"""Consumer groups' committed offsets in the catalog (database ``offsets``).

Key: the group's UTF-8 name, a NUL byte, and the partition (2 bytes, big-endian), so one
group's offsets are adjacent and in partition order. Value: the offset, sealed like the other
catalog values. The offsets arrive through ``offsets`` commits (:mod:`kvlog.log.group_offsets`)
and travel in the metadata checkpoints, so they outlive the commits that wrote them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from kvlog.meta.cache import MetaReader, MetaTxn, guard_methods
from kvlog.meta.env import CacheDamage, seal, unseal

__all__ = ["GroupOffsets", "OFFSET_LIMIT", "PARTITION_LIMIT"]

_PART = struct.Struct(">H")
_U64 = struct.Struct(">Q")

#: Committed offsets are below this (record offsets are signed 64-bit integers).
OFFSET_LIMIT = 2**63
#: Partitions are below this (two bytes in the key).
PARTITION_LIMIT = 2**16


def _key(group: str, partition: int) -> bytes:
    return group.encode() + b"\x00" + _PART.pack(partition)


def _offset(key: bytes | memoryview, value: bytes | memoryview) -> int:
    payload = unseal(key, value)
    if len(payload) != _U64.size:
        raise CacheDamage("a committed offset has the wrong size", index_only=False)
    return int(_U64.unpack(payload)[0])


@guard_methods
class GroupOffsets:
    """The committed offsets in one snapshot (or write transaction) of the catalog."""

    def __init__(self, meta: MetaReader) -> None:
        self._env = meta.env
        self._meta = meta
        self._db = meta.env.dbs["offsets"]

    def get(self, group: str, partition: int) -> int | None:
        """The offset ``group`` committed for ``partition`` (None: never committed)."""
        key = _key(group, partition)
        value = self._meta.txn.get(key, db=self._db)
        return None if value is None else _offset(key, value)

    def of_group(self, group: str) -> dict[int, int]:
        """Every partition's committed offset of ``group``."""
        prefix = group.encode() + b"\x00"
        out: dict[int, int] = {}
        with self._meta.txn.cursor(db=self._db) as cur:
            if not cur.set_range(prefix):
                return out
            for k, v in cur:
                key = bytes(k)
                if not key.startswith(prefix) or len(key) != len(prefix) + _PART.size:
                    break
                out[_PART.unpack(key[len(prefix):])[0]] = _offset(k, v)
        return out

    def every(self) -> Iterator[tuple[str, int, int]]:
        """``(group, partition, offset)`` for every committed offset."""
        with self._meta.txn.cursor(db=self._db) as cur:
            for k, v in cur:
                key = bytes(k)
                name, sep, part = key[:-_PART.size - 1], key[-_PART.size - 1:-_PART.size], key[-_PART.size:]
                if sep != b"\x00":
                    raise CacheDamage("a committed offset's key is malformed", index_only=False)
                yield name.decode(), _PART.unpack(part)[0], _offset(k, v)

    def put(self, group: str, partition: int, offset: int) -> None:
        """Record ``offset`` as ``group``'s committed offset of ``partition`` (a write
        transaction); ``ValueError`` when the group, partition or offset cannot be stored."""
        assert isinstance(self._meta, MetaTxn)
        if not group or "\x00" in group or not 0 <= partition < PARTITION_LIMIT or not 0 <= offset < OFFSET_LIMIT:
            raise ValueError(f"no committed offset {offset!r} of partition {partition!r} for group {group!r}")
        key = _key(group, partition)
        self._meta.txn.put(key, seal(key, _U64.pack(offset)), db=self._db)
