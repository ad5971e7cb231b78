"""The write buffer (compiled, and its Python twin): one put appends a record, sets the memtable, counts its bytes."""

from __future__ import annotations

import threading
from itertools import count

import pytest

from kvlog.index import MemTable
from kvlog.log import flusher

#: Each test runs against the C extensions and against their Python twins.
pytestmark = pytest.mark.usefixtures("native")


def _buffer(memtable: object | None = None, overhead: int = 10) -> tuple[flusher.WriteBuffer, MemTable]:
    table = MemTable()
    ticks = count(1_000)
    buffer = flusher.WriteBuffer(memtable if memtable is not None else table, table.lock, lambda: next(ticks), overhead)
    return buffer, table


def test_put_appends_sets_the_front_and_counts_bytes() -> None:
    buffer, table = _buffer()
    buffer.trigger = 40
    assert buffer.put(b"k1", b"v") is False  # 2 + 1 + 10 bytes
    assert buffer.put(b"k2", b"value") is False  # 13 + 17 = 30
    assert buffer.put(b"k1", b"w") is True  # 43 >= 40
    assert buffer.keys == [b"k1", b"k2", b"k1"]
    assert buffer.values == [b"v", b"value", b"w"]
    assert buffer.stamps == [1_000, 1_001, 1_002]
    assert table.front == {b"k1": b"w", b"k2": b"value"}
    assert buffer.buffered_bytes == 43
    assert not table.lock.locked()


def test_put_follows_replaced_columns_and_front() -> None:
    buffer, table = _buffer()
    buffer.put(b"a", b"1")
    taken = buffer.keys
    buffer.keys, buffer.values, buffer.stamps = [], [], []
    table.freeze()
    buffer.put(b"b", b"2")
    assert taken == [b"a"] and buffer.keys == [b"b"]
    assert table.front == {b"b": b"2"} and table.frozen == {b"a": b"1"}


def test_fatal_error_is_raised_and_nothing_changes() -> None:
    buffer, table = _buffer()
    buffer.fatal = RuntimeError("fenced")
    with pytest.raises(RuntimeError, match="fenced"):
        buffer.put(b"a", b"1")
    assert buffer.keys == [] and table.front == {} and buffer.buffered_bytes == 0


@pytest.mark.parametrize("key, value", [("a", b"1"), (b"a", "1"), (bytearray(b"a"), b"1"), (b"a", None)])
def test_put_takes_exact_bytes_only(key: object, value: object) -> None:
    buffer, table = _buffer()
    with pytest.raises(TypeError):
        buffer.put(key, value)  # type: ignore[arg-type]
    assert buffer.keys == [] and table.front == {}


def test_a_failed_put_releases_the_lock_and_takes_the_record_back() -> None:
    class NoFront:
        pass

    table = MemTable()
    buffer = flusher.WriteBuffer(NoFront(), table.lock, lambda: 1, 0)
    with pytest.raises(AttributeError):
        buffer.put(b"a", b"1")
    assert not table.lock.locked()
    assert buffer.keys == [] and buffer.values == [] and buffer.stamps == [] and buffer.buffered_bytes == 0
    buffer.keys = None  # type: ignore[assignment]
    with pytest.raises(TypeError, match="lists"):
        buffer.put(b"a", b"1")
    assert not table.lock.locked()


def test_a_failing_clock_changes_nothing() -> None:
    table = MemTable()

    def broken() -> int:
        raise OSError("no clock")

    buffer = flusher.WriteBuffer(table, table.lock, broken, 0)
    with pytest.raises(OSError, match="no clock"):
        buffer.put(b"a", b"1")
    assert buffer.keys == [] and not table.lock.locked()


def test_put_waits_for_the_lock() -> None:
    buffer, table = _buffer()
    done = threading.Event()
    with table.lock:
        writer = threading.Thread(target=lambda: (buffer.put(b"a", b"1"), done.set()))
        writer.start()
        assert not done.wait(0.2)  # held out while the flusher holds the lock
        assert buffer.keys == []
    writer.join(5)
    assert done.is_set() and buffer.keys == [b"a"]


def test_an_uninitialised_buffer_refuses_puts() -> None:
    buffer = flusher.WriteBuffer.__new__(flusher.WriteBuffer)
    with pytest.raises(RuntimeError, match="not initialised"):
        buffer.put(b"a", b"1")
