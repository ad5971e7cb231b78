"""Reading many keys in one snapshot: the memtable's writes first, then the pending index runs,
then the B-tree, all in one LMDB read transaction.

Each distinct key is looked up once, in key order (the B-tree's pages are read in order, and
its remaining keys with one cursor call); the values not inline are handed to the caller's
``resolve`` together, so it can read each batch once however many of the keys it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kvlog.index.entry import IndexEntry
from kvlog.index.memtable import Tombstone
from kvlog.index.snapshot import IndexReader

__all__ = ["ResolveMany", "lookup_many"]

#: Reads the values that index entries point at (not inline), in the snapshot of the reader
#: given: ``(pairs of key and entry, reader)`` -> their values, in the order of the pairs.
ResolveMany = Callable[[list[tuple[bytes, IndexEntry]], IndexReader], list[bytes]]


def lookup_many(reader: IndexReader, front: Mapping[bytes, bytes | Tombstone], keys: Sequence[bytes],
                resolve: ResolveMany) -> list[bytes | None]:
    """The values of ``keys`` (valid keys; duplicates allowed) in the order given, None for a
    key without one: ``front`` (unapplied writes) first, then ``reader``'s index."""
    found: dict[bytes, bytes | None] = {}
    ask: list[bytes] = []
    for key in sorted(set(keys)):
        value = front.get(key)
        if value is None:
            ask.append(key)
        else:
            found[key] = value if type(value) is bytes else None  # else a tombstone
    if ask:
        pending: list[tuple[bytes, IndexEntry]] = []
        for key, entry in zip(ask, reader.index_get_many(ask), strict=True):
            if entry is None:
                found[key] = None
            elif entry.inline is not None:
                found[key] = entry.inline
            else:
                pending.append((key, entry))
        if pending:
            for (key, _entry), value in zip(pending, resolve(pending, reader), strict=True):
                found[key] = value
    return [found[key] for key in keys]
