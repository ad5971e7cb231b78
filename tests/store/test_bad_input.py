"""Bad input gets the documented error and changes nothing (guarantee 8).

Every rejected call is checked against a fingerprint of the store taken before
it: the visible items, len(), the applied version, the unflushed bytes and,
after a flush, the durable items seen by a second handle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH, Root

import kvlog
from kvlog.errors import InvalidRecordError, KvlogError, ReadOnlyError, StoreClosedError
from kvlog.log import open_log

MAX_RECORD = 10_000

BAD_KEYS = [
    pytest.param(b"", id="empty-bytes"),
    pytest.param("", id="empty-str"),
    pytest.param(bytearray(), id="empty-bytearray"),
    pytest.param(None, id="None"),
    pytest.param(0, id="int-0"),
    pytest.param(7, id="int"),
    pytest.param(1.5, id="float"),
    pytest.param(True, id="bool"),
    pytest.param([b"a"], id="list"),
    pytest.param((b"a",), id="tuple"),
    pytest.param(object(), id="object"),
    pytest.param(b"k" * 4097, id="too-long"),
    pytest.param("\ud800", id="lone-high-surrogate"),
    pytest.param("key-\udfff", id="lone-low-surrogate"),
]

BAD_VALUES = [
    pytest.param(None, id="None"),
    pytest.param(0, id="int"),
    pytest.param(2.5, id="float"),
    pytest.param([b"v"], id="list"),
    pytest.param({"v": 1}, id="dict"),
    pytest.param(b"v" * MAX_RECORD, id="oversize"),
    pytest.param("\udfff", id="lone-low-surrogate"),
    pytest.param("value-\ud800-end", id="lone-high-surrogate"),
]


@pytest.fixture
def store(local_root: Root, opened: list[Any]) -> kvlog.Store:
    """A store with some flushed and some unflushed data."""
    s = local_root.open(partitions=3, max_record_bytes=MAX_RECORD, **EXPLICIT_FLUSH)
    opened.append(s)
    for i in range(5):
        s.put(b"flushed-%d" % i, b"v%d" % i)
    s.flush()
    s.put(b"pending", b"p")
    s.delete(b"flushed-0")
    return s


def _fingerprint(store: kvlog.Store) -> tuple[Any, ...]:
    return (list(store.scan()), list(store.scan(reverse=True)), len(store), store.log.version,
            store.stats()["unflushed_bytes"], store.stats()["memtable_keys"])


def _rejected(store: kvlog.Store, error: type[Exception], call: Callable[[], Any]) -> None:
    before = _fingerprint(store)
    with pytest.raises(error):
        call()
    assert _fingerprint(store) == before


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_rejected(store: kvlog.Store, local_root: Root, opened: list[Any], key: Any) -> None:
    too_long = isinstance(key, bytes) and len(key) > 4096
    for call in (
        lambda: store.put(key, b"v"),
        lambda: store.put(key, b"v", sync=True),
        lambda: store.delete(key),
        lambda: store.delete(key, sync=True),
        lambda: store.__setitem__(key, b"v"),
    ):
        _rejected(store, InvalidRecordError, call)
    if too_long:
        # Reads take any key a store may hold (max_key_bytes may have been lowered since it was
        # written): a longer key that is not there is simply not found.
        assert store.get(key) is None
        _rejected(store, KeyError, lambda: store[key])
        _rejected(store, KeyError, lambda: store.__delitem__(key))
    else:
        for call in (lambda: store.get(key), lambda: store[key], lambda: store.__delitem__(key)):
            _rejected(store, InvalidRecordError, call)
    _rejected(store, InvalidRecordError, lambda: _batch(store, [("put", b"good", b"v"), ("put", key, b"v")]))
    _rejected(store, InvalidRecordError, lambda: _batch(store, [("put", b"good", b"v"), ("delete", key, None)]))
    # Nothing of it reached storage either.
    version = store.flush()
    reader = local_root.open(cache="reader", read_only=True)
    opened.append(reader)
    assert reader.log.version == version
    assert list(reader.scan()) == list(store.scan())
    assert store.check() == []


def _batch(store: kvlog.Store, ops: list[tuple[str, Any, Any]]) -> None:
    with store.batch() as b:
        for op, key, value in ops:
            if op == "delete":
                b.delete(key)
            else:
                b.put(key, value)


@pytest.mark.parametrize("value", BAD_VALUES)
def test_bad_values_are_rejected(store: kvlog.Store, value: Any) -> None:
    for call in (
        lambda: store.put(b"k", value),
        lambda: store.put(b"k", value, sync=True),
        lambda: store.__setitem__(b"k", value),
        lambda: store.put(b"pending", value),
        lambda: _batch(store, [("put", b"good", b"v"), ("put", b"k", value)]),
        lambda: _batch(store, [("put", b"k", value), ("delete", b"good", None)]),
    ):
        _rejected(store, InvalidRecordError, call)
    assert store.get(b"k") is None and store.get(b"pending") == b"p"


LONE_SURROGATES = [
    pytest.param("\ud800", id="high"),
    pytest.param("\udfff", id="low"),
    pytest.param("a\udcffb", id="escaped-byte-inside"),
    pytest.param("\udbff\udbff", id="two-highs"),
]


@pytest.mark.parametrize("text", LONE_SURROGATES)
def test_str_with_a_lone_surrogate_is_an_invalid_record(store: kvlog.Store, text: str) -> None:
    """A str that is not valid Unicode text has no UTF-8 form: InvalidRecordError, never UnicodeEncodeError.

    Checked on every way a key or value comes in (put, get, delete, the mapping methods,
    a write batch), and the error is both a KvlogError and a ValueError.
    """
    for call in (
        lambda: store.put(text, b"v"),
        lambda: store.put(b"k", text),
        lambda: store.put(text, text, sync=True),
        lambda: store.get(text),
        lambda: store.get(text, b"default"),
        lambda: store.delete(text),
        lambda: store.delete(text, sync=True),
        lambda: store.__setitem__(b"k", text),
        lambda: store[text],
        lambda: store.__delitem__(text),
        lambda: _batch(store, [("put", b"good", b"v"), ("put", text, b"v")]),
        lambda: _batch(store, [("put", b"good", b"v"), ("put", b"k", text)]),
        lambda: _batch(store, [("put", b"good", b"v"), ("delete", text, None)]),
    ):
        _rejected(store, InvalidRecordError, call)
    with pytest.raises(ValueError, match="UTF-8"):
        store.put(text, b"v")
    assert text not in store
    assert store.get(b"good") is None and store.get(b"k") is None


@pytest.mark.parametrize("text", LONE_SURROGATES)
def test_a_producer_batch_with_a_lone_surrogate_is_rejected_whole(tmp_path: Path, text: str) -> None:
    """``Producer.append`` validates every record first: one bad str rejects the batch, nothing is appended."""
    the_log = open_log(tmp_path / "log", partitions=2)
    try:
        producer = the_log.producer(5)
        producer.append(0, [(b"first", b"1")], base_sequence=0)
        version, end = the_log.version, the_log.end_offset(0)
        for batch in ([(b"good", b"v"), (text, b"v")], [(b"good", b"v"), (b"k", text)],
                      [(b"good", b"v"), (text, None, 7)]):
            with pytest.raises(InvalidRecordError):
                producer.append(0, batch, base_sequence=1)
        assert (the_log.version, the_log.end_offset(0)) == (version, end)
        assert producer.append(0, [(b"next", b"2")], base_sequence=1).base_offset == end
        assert [(r.key, r.value) for r in the_log.read(0)] == [(b"first", b"1"), (b"next", b"2")]
    finally:
        the_log.close()


def test_record_size_limit_is_key_plus_value(store: kvlog.Store) -> None:
    key = b"sized"
    _rejected(store, InvalidRecordError, lambda: store.put(key, b"v" * (MAX_RECORD - len(key) + 1)))
    store.put(key, b"v" * (MAX_RECORD - len(key)), sync=True)  # exactly at the limit is fine
    assert store.get(key) == b"v" * (MAX_RECORD - len(key))


@pytest.mark.parametrize("bound", [1, 2.0, [b"a"], object()])
def test_bad_scan_bounds(store: kvlog.Store, bound: Any) -> None:
    for call in (
        lambda: list(store.scan(bound)),
        lambda: list(store.scan(None, bound)),
        lambda: list(store.scan(prefix=bound)),
    ):
        _rejected(store, InvalidRecordError, call)


def test_bad_changes_arguments(store: kvlog.Store) -> None:
    for call in (
        lambda: list(store.changes(partition=3)),
        lambda: list(store.changes(partition=-1)),
        lambda: list(store.changes(partition="0")),  # type: ignore[arg-type]
        lambda: list(store.changes(partition=0, from_offset=-1)),
        lambda: list(store.changes(from_offset=-1)),
    ):
        _rejected(store, InvalidRecordError, call)


def test_errors_are_value_errors_and_kvlog_errors(store: kvlog.Store) -> None:
    with pytest.raises(ValueError):
        store.put(None, b"v")  # type: ignore[arg-type]
    with pytest.raises(KvlogError):
        store.put(b"k", None)  # type: ignore[arg-type]


def test_writes_on_a_read_only_store_change_nothing(local_root: Root, opened: list[Any]) -> None:
    with local_root.open(**EXPLICIT_FLUSH) as writer:
        writer.put(b"a", b"1")
        writer.put(b"b", b"2")
    reader = local_root.open(cache="reader", read_only=True)
    opened.append(reader)
    for call in (
        lambda: reader.put(b"a", b"x"),
        lambda: reader.put(b"c", b"x", sync=True),
        lambda: reader.delete(b"a"),
        lambda: reader.__setitem__(b"c", b"x"),
        lambda: reader.__delitem__(b"a"),
        lambda: reader.__delitem__(b"missing"),
        lambda: _batch(reader, [("put", b"c", b"x")]),
    ):
        _rejected(reader, ReadOnlyError, call)
    with local_root.open(**EXPLICIT_FLUSH) as writer:
        assert list(writer.scan()) == [(b"a", b"1"), (b"b", b"2")]


def test_calls_on_a_closed_store_change_nothing(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    store.put(b"a", b"1", sync=True)
    store.put(b"lost", b"dropped by the crash")
    store.close(flush=False)
    for call in (
        lambda: store.put(b"b", b"2"),
        lambda: store.put(b"b", b"2", sync=True),
        lambda: store.delete(b"a"),
        lambda: store.__delitem__(b"a"),
        lambda: store.__setitem__(b"b", b"2"),
        lambda: store.get(b"a"),
        lambda: store.flush(),
        lambda: store.batch(),
        lambda: list(store.scan()),
        lambda: len(store),
    ):
        with pytest.raises(StoreClosedError):
            call()
    again = local_root.open(**EXPLICIT_FLUSH)
    opened.append(again)
    assert list(again.scan()) == [(b"a", b"1")]
    assert again.check() == []
