"""The memtable keeps the writes of a flush in flight readable until the flush is applied."""

from __future__ import annotations

from kvlog.index import TOMBSTONE, MemTable


def test_frozen_writes_stay_readable_until_retired() -> None:
    table = MemTable()
    table.put(b"a", b"1")
    table.put(b"b", None)
    table.freeze()  # a flush took them
    table.put(b"a", b"2")  # a newer write wins over the frozen one
    table.put(b"c", b"3")
    assert table.get(b"a") == b"2"
    assert table.get(b"b") is TOMBSTONE
    assert table.get(b"c") == b"3"
    assert len(table) == 3
    assert table.items_in_range(None, None, None) == [(b"a", b"2"), (b"b", TOMBSTONE), (b"c", b"3")]
    assert table.items_in_range(b"b", None, None) == [(b"b", TOMBSTONE), (b"c", b"3")]
    table.retire()  # the flush is applied: the index answers for a and b now
    assert table.get(b"b") is None
    assert table.get(b"a") == b"2"
    assert len(table) == 2
    table.clear()
    assert len(table) == 0 and table.get(b"a") is None
