"""Consumer groups in the catalog: committed offsets (database ``offsets``) and each group's
state (database ``groups``).

``offsets`` key: the group's UTF-8 name, a NUL byte, and the partition (2 bytes, big-endian), so
one group's offsets are adjacent and in partition order. Value: the offset, sealed like the other
catalog values. ``groups`` key: the group's UTF-8 name. Value (sealed JSON): when the group last
committed and whether it holds tombstones (:class:`GroupState`). The meta key ``holds_changed``
is the version of the last commit that started a hold or moved one back: a compaction that
read the holds before that version is refused (see :mod:`kvlog.log.group_offsets`).

Both arrive through ``offsets`` commits (:mod:`kvlog.log.group_offsets`) and travel in the
metadata checkpoints, so they outlive the commits that wrote them.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from kvlog.meta.cache import MetaReader, MetaTxn, guard_methods
from kvlog.meta.env import CacheDamage, seal, unseal

__all__ = ["GroupOffsets", "GroupState", "OFFSET_LIMIT", "PARTITION_LIMIT", "holds_of"]

_PART = struct.Struct(">H")
_U64 = struct.Struct(">Q")

#: Committed offsets are below this (record offsets are signed 64-bit integers).
OFFSET_LIMIT = 2**63
#: Partitions are below this (two bytes in the key).
PARTITION_LIMIT = 2**16


@dataclass(frozen=True)
class GroupState:
    """What the catalog keeps of a consumer group besides its offsets."""

    last_commit_ms: int
    """The time of the group's last ``offsets`` commit (the commit's time as replay saw it)."""
    hold_ms: int | None = None
    """The group holds tombstones: compaction keeps every tombstone and expired record at or
    after its committed offsets until ``hold_ms`` after its last commit. None: no hold. The
    commit that asks for a hold records the duration, so every process decides alike."""

    def to_json(self) -> dict[str, int | None]:
        return {"last_commit_ms": self.last_commit_ms, "hold_ms": self.hold_ms}

    @classmethod
    def from_json(cls, obj: object) -> GroupState:
        """The state in ``obj`` (``ValueError`` when it is malformed)."""
        if not isinstance(obj, dict):
            raise ValueError("a consumer group's state is not an object")
        at, hold = obj.get("last_commit_ms"), obj.get("hold_ms")
        if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at < OFFSET_LIMIT:
            raise ValueError("a consumer group's state lacks its last commit time")
        if hold is not None and (not isinstance(hold, int) or isinstance(hold, bool) or not 0 <= hold < OFFSET_LIMIT):
            raise ValueError("a consumer group's hold_ms is an integer in [0, 2**63) or null")
        return cls(at, hold)

    @property
    def hold_expires_ms(self) -> int | None:
        """When the hold lapses unless the group commits again (None: no hold)."""
        return None if self.hold_ms is None else self.last_commit_ms + self.hold_ms

    def holding(self, now_ms: int) -> bool:
        """Whether the hold lasts at ``now_ms``."""
        expires = self.hold_expires_ms
        return expires is not None and now_ms < expires


def holds_of(states: Mapping[str, GroupState], offsets: Mapping[str, Mapping[int, int]],
             now_ms: int) -> dict[int, int]:
    """Per partition, the lowest committed offset of a group whose hold lasts at ``now_ms``:
    compaction removes no tombstone or expired record at or after it."""
    out: dict[int, int] = {}
    for group, state in states.items():
        if state.holding(now_ms):
            for p, offset in offsets.get(group, {}).items():
                out[p] = min(out.get(p, offset), offset)
    return out


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
        self._groups = meta.env.dbs["groups"]

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

    def state(self, group: str) -> GroupState | None:
        """``group``'s state (None: the group never committed, or was deleted)."""
        key = group.encode()
        value = self._meta.txn.get(key, db=self._groups)
        return None if value is None else _state(key, value)

    def states(self) -> dict[str, GroupState]:
        """Every group's state, by name."""
        with self._meta.txn.cursor(db=self._groups) as cur:
            return {bytes(k).decode(): _state(k, v) for k, v in cur}

    def by_group(self) -> dict[str, dict[int, int]]:
        """Every committed offset, by group then partition."""
        out: dict[str, dict[int, int]] = {}
        for group, p, offset in self.every():
            out.setdefault(group, {})[p] = offset
        return out

    def holds(self, now_ms: int) -> dict[int, int]:
        """Per partition, the offset from which on compaction keeps dead records at ``now_ms``."""
        return holds_of(self.states(), self.by_group(), now_ms)

    def holds_changed(self) -> int:
        """The version of the last commit that started a hold or moved one back (0: none)."""
        payload = self._meta.get_meta(_HOLDS_CHANGED)
        if payload is None:
            return 0
        if len(payload) != _U64.size:
            raise CacheDamage("the version of the last hold change has the wrong size", index_only=False)
        return int(_U64.unpack(payload)[0])

    def put_state(self, group: str, state: GroupState) -> None:
        """Record ``group``'s state (a write transaction)."""
        assert isinstance(self._meta, MetaTxn)
        key = group.encode()
        self._meta.txn.put(key, seal(key, json.dumps(state.to_json(), sort_keys=True).encode()), db=self._groups)

    def set_holds_changed(self, version: int) -> None:
        """Record ``version`` as the last commit that started a hold or moved one back
        (``ValueError`` for a version no commit has: a malformed checkpoint's)."""
        assert isinstance(self._meta, MetaTxn)
        if not 0 <= version < OFFSET_LIMIT:
            raise ValueError(f"no commit has version {version!r}")
        self._meta.put_meta(_HOLDS_CHANGED, _U64.pack(version))

    def delete(self, group: str) -> bool:
        """Forget ``group``: its offsets and state (a write transaction). Whether it was known."""
        assert isinstance(self._meta, MetaTxn)
        txn = self._meta.txn
        found = txn.delete(group.encode(), db=self._groups)
        for p in list(self.of_group(group)):
            found = txn.delete(_key(group, p), db=self._db) or found
        return bool(found)


#: The meta key of :meth:`GroupOffsets.holds_changed`.
_HOLDS_CHANGED = "holds_changed"


def _state(key: bytes | memoryview, value: bytes | memoryview) -> GroupState:
    try:
        return GroupState.from_json(json.loads(unseal(key, value)))
    except ValueError:
        raise CacheDamage("a consumer group's state is malformed", index_only=False) from None
