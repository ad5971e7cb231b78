"""Reading the key index's B-tree (the LMDB ``index`` database) in key order.

Long keys are stored under their first bytes and a hash (see :mod:`kvlog.index.keys`), so the
walks here collect each group of long keys sharing their first bytes and sort it by the real
keys: every walk yields true key order. :func:`overlay` puts the pending runs' entries over the
B-tree's. These are the entry-by-entry path of scans (:mod:`kvlog.index.merged` is the chunked one).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator

import lmdb

from kvlog.index.entry import IndexEntry, decode_entry
from kvlog.index.keys import DIRECT_KEY_BYTES, is_long_encoded

__all__ = ["overlay", "walk_forward", "walk_reverse"]



def walk_forward(cur: lmdb.Cursor, lower: bytes | None) -> Iterator[tuple[bytes, IndexEntry]]:
    """Entries from the first that may be ``>= lower`` on, in key order (the caller filters)."""
    if lower is None:
        found = cur.first()
    else:
        found = cur.set_range(lower[:DIRECT_KEY_BYTES])
    if not found:
        return
    yield from _sorted_groups(cur, forward=True)


def walk_reverse(cur: lmdb.Cursor, upper: bytes | None) -> Iterator[tuple[bytes, IndexEntry]]:
    """Entries from the last that may be ``< upper`` down, in reverse key order (the caller
    filters)."""
    if upper is None:
        found = cur.last()
    elif not cur.set_range(upper[:DIRECT_KEY_BYTES]):
        found = cur.last()
    elif len(upper) <= DIRECT_KEY_BYTES:
        found = cur.prev()
    else:
        # Long keys sharing the first bytes of ``upper`` may sort on either side of it:
        # start past all of them; the caller filters by the real keys.
        probe = upper[:DIRECT_KEY_BYTES]
        while True:
            k = bytes(cur.key())
            if not (k == probe or (is_long_encoded(k) and k.startswith(probe))):
                found = cur.prev()
                break
            if not cur.next():
                found = cur.last()
                break
    if not found:
        return
    yield from _sorted_groups(cur, forward=False)


def _sorted_groups(cur: lmdb.Cursor, *, forward: bool) -> Iterator[tuple[bytes, IndexEntry]]:
    """Entries from the cursor's position onward, with groups of long keys sorted by real key."""
    step = cur.next if forward else cur.prev
    group: list[tuple[bytes, IndexEntry]] = []
    group_prefix = b""
    while True:
        lmdb_key = bytes(cur.key())
        key, entry = decode_entry(lmdb_key, bytes(cur.value()))
        if is_long_encoded(lmdb_key):
            head = lmdb_key[:DIRECT_KEY_BYTES]
            if group and head != group_prefix:
                yield from sorted(group, reverse=not forward)
                group = []
            group_prefix = head
            group.append((key, entry))
        else:
            if group:
                yield from sorted(group, reverse=not forward)
                group = []
            yield key, entry
        if not step():
            break
    if group:
        yield from sorted(group, reverse=not forward)


def overlay(indexed: Iterator[tuple[bytes, IndexEntry]], pending: Iterator[tuple[bytes, bytes]], *,
            reverse: bool) -> Iterator[tuple[bytes, IndexEntry]]:
    """Index entries with the runs' entries (which win) merged in; deletions removed."""
    before = operator.gt if reverse else operator.lt
    ahead = next(pending, None)
    for key, entry in indexed:
        while ahead is not None and before(ahead[0], key):
            if ahead[1]:
                yield ahead[0], decode_entry(ahead[0], ahead[1])[1]
            ahead = next(pending, None)
        if ahead is not None and ahead[0] == key:
            if ahead[1]:
                yield key, decode_entry(key, ahead[1])[1]
            ahead = next(pending, None)
            continue
        yield key, entry
    while ahead is not None:
        if ahead[1]:
            yield ahead[0], decode_entry(ahead[0], ahead[1])[1]
        ahead = next(pending, None)
