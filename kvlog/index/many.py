"""Reading many keys in one snapshot: the memtable's writes first, then the pending index runs,
then the B-tree, all in one LMDB read transaction.

The keys are looked up in the order given; the values not inline are handed to the caller's
``resolve`` together, so it can read each batch once however many of the keys it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import cast

from kvlog.index.entry import IndexEntry
from kvlog.index.memtable import Entry, live_value
from kvlog.index.snapshot import IndexReader

__all__ = ["ResolveMany", "lookup_many"]

#: Reads the values that index entries point at (not inline), in the snapshot of the reader
#: given: ``(pairs of key and entry, reader)`` -> their values, in the order of the pairs (None
#: for an expiring record compaction removed).
#: The time of a reader that hides nothing: before every expiry.
NEVER = -(2**63)

ResolveMany = Callable[[list[tuple[bytes, IndexEntry]], IndexReader], list[bytes | None]]


def lookup_many(reader: IndexReader, front: Mapping[bytes, Entry], keys: Sequence[bytes],
                resolve: ResolveMany) -> list[bytes | None]:
    """The values of ``keys`` (valid keys; duplicates allowed) in the order given, None for a
    key without one: ``front`` (unapplied writes) first, then ``reader``'s index; records
    expired at the reader's time are None, as the reader's own entries are."""
    ask = list(keys) if not front else [key for key in keys if key not in front]
    held = reader.index_get_many(ask)
    pending = [(key, h) for key, h in zip(ask, held, strict=True) if isinstance(h, IndexEntry)]
    if not front and not pending:
        return cast("list[bytes | None]", held)  # the common case: only values and None
    found: dict[bytes, bytes | IndexEntry | None] = dict(zip(ask, held, strict=True))
    if pending:  # values in data files, each batch read once
        found.update(zip([key for key, _entry in pending], resolve(pending, reader), strict=True))
    out: list[bytes | None] = []
    now_ms = NEVER if reader.now_ms is None else reader.now_ms
    for key in keys:
        value = front.get(key)
        if value is None:
            answer = found[key]
            assert not isinstance(answer, IndexEntry)
            out.append(answer)
        else:
            out.append(value if type(value) is bytes else live_value(value, now_ms))
    return out
