"""Named checkpoints in the catalog (database ``pins``).

A named checkpoint pins one version of the store: the data files live at that version and
the metadata needed to open it are kept from garbage collection in every process, until the
checkpoint is deleted. Key: the checkpoint's UTF-8 name. Value (sealed JSON): the version,
the commit time that created it, and the paths of the data files live at that version; a
read lease (``kvlog.log.leases``) also its expiry time.
They arrive through ``pin`` and ``unpin`` commits (:mod:`kvlog.log.pins_named`) and travel in
the metadata checkpoints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvlog.meta.cache import MetaReader, MetaTxn, guard_methods
from kvlog.meta.env import CacheDamage, seal, unseal

__all__ = ["NamedPin", "NamedPins"]


@dataclass(frozen=True)
class NamedPin:
    """A named checkpoint as the catalog holds it."""

    name: str
    version: int
    created_ms: int
    paths: tuple[str, ...]
    commit_id: str
    """The id of the commit at ``version``."""
    commit_crc: int
    """The CRC32C of that commit's bytes."""
    expires_ms: int | None = None
    """A read lease's expiry (ms since the epoch): from it on, GC keeps none of its files and
    drops it. None: a named checkpoint, kept until deleted."""

    @property
    def is_lease(self) -> bool:
        """Whether this is a read lease (``kvlog.log.leases``) rather than a named checkpoint."""
        return self.expires_ms is not None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "created_ms": self.created_ms,
                               "paths": list(self.paths), "commit_id": self.commit_id,
                               "commit_crc": self.commit_crc}
        if self.expires_ms is not None:
            out["expires_ms"] = self.expires_ms
        return out

    @classmethod
    def from_json(cls, name: str, obj: Any) -> NamedPin:
        """The pin in ``obj`` (``ValueError`` when it is malformed)."""
        if not isinstance(obj, dict):
            raise ValueError("a named checkpoint is not an object")
        version, created, paths = obj.get("version"), obj.get("created_ms"), obj.get("paths")
        commit_id, crc = obj.get("commit_id"), obj.get("commit_crc")
        if (not isinstance(version, int) or isinstance(version, bool) or version < 0
                or not isinstance(created, int) or isinstance(created, bool)
                or not isinstance(paths, list) or not all(isinstance(p, str) for p in paths)
                or not isinstance(commit_id, str) or not commit_id
                or not isinstance(crc, int) or isinstance(crc, bool) or not 0 <= crc < 2**32):
            raise ValueError("a named checkpoint lacks its version, commit, time or paths")
        expires = obj.get("expires_ms")
        if expires is not None and (not isinstance(expires, int) or isinstance(expires, bool)):
            raise ValueError("a read lease's expires_ms is an integer")
        return cls(name, version, created, tuple(paths), commit_id, crc, expires)


def _pin(key: bytes | memoryview, value: bytes | memoryview) -> NamedPin:
    try:
        return NamedPin.from_json(bytes(key).decode(), json.loads(unseal(key, value)))
    except ValueError:
        raise CacheDamage("a named checkpoint is malformed", index_only=False) from None


@guard_methods
class NamedPins:
    """The named checkpoints in one snapshot (or write transaction) of the catalog."""

    def __init__(self, meta: MetaReader) -> None:
        self._env = meta.env
        self._meta = meta
        self._db = meta.env.dbs["pins"]

    def get(self, name: str) -> NamedPin | None:
        key = name.encode()
        value = self._meta.txn.get(key, db=self._db)
        return None if value is None else _pin(key, value)

    def every(self) -> Iterator[NamedPin]:
        """Every named checkpoint, by name."""
        with self._meta.txn.cursor(db=self._db) as cur:
            for k, v in cur:
                yield _pin(k, v)

    def put(self, pin: NamedPin) -> None:
        """Record ``pin`` (a write transaction)."""
        assert isinstance(self._meta, MetaTxn)
        key = pin.name.encode()
        self._meta.txn.put(key, seal(key, json.dumps(pin.to_json()).encode()), db=self._db)

    def delete(self, name: str) -> bool:
        """Forget the checkpoint ``name``; whether it existed (a write transaction)."""
        assert isinstance(self._meta, MetaTxn)
        return bool(self._meta.txn.delete(name.encode(), db=self._db))
