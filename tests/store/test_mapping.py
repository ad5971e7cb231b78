"""The Store as a ``collections.abc.MutableMapping``, side by side with a dict.

Every mapping method is checked against the same call on a dict holding the same items:
``dict(store)``, ``reversed``, the views (their length, membership and iteration, each
iteration one snapshot), ``update``, ``pop``, ``setdefault``, ``popitem`` and ``clear``; bad
input gets :class:`~kvlog.errors.InvalidRecordError` and changes nothing; a read-only or
closed store refuses the writing methods.
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, KeysView, Mapping, MutableMapping, ValuesView
from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH, Root

import kvlog
from kvlog.config import KEY_BYTES_LIMIT
from kvlog.errors import InvalidRecordError, ReadOnlyError, StoreClosedError

ITEMS = {b"b": b"2", b"a": b"1", b"d": b"4", b"c": b"3"}


@pytest.fixture
def store(root: Root, opened: list[Any]) -> kvlog.Store:
    """A store holding ITEMS: some flushed (in the index), some only in the memtable."""
    s = root.open(partitions=2, max_record_bytes=10_000, **EXPLICIT_FLUSH)
    opened.append(s)
    s.put(b"a", b"1")
    s.put(b"b", b"2")
    s.put(b"gone", b"x")
    s.flush()
    s.put(b"c", b"3")
    s.put(b"d", b"4")
    s.delete(b"gone")
    return s


def _fingerprint(store: kvlog.Store) -> tuple[Any, ...]:
    return list(store.scan()), len(store), store.log.version, store.stats()["unflushed_bytes"]


def _rejected(store: kvlog.Store, error: type[Exception], call: Callable[[], Any]) -> None:
    before = _fingerprint(store)
    with pytest.raises(error):
        call()
    assert _fingerprint(store) == before


def test_a_store_is_a_mutable_mapping(store: kvlog.Store) -> None:
    assert isinstance(store, MutableMapping) and isinstance(store, Mapping)
    assert isinstance(store.keys(), KeysView) and isinstance(store.values(), ValuesView)
    assert isinstance(store.items(), ItemsView)


def test_dict_and_reversed_match_a_dict(store: kvlog.Store) -> None:
    model = dict(sorted(ITEMS.items()))
    assert dict(store) == model
    assert list(store) == list(model)
    assert list(reversed(store)) == list(reversed(model))
    assert dict(store.items()) == model
    assert list(store.keys()) == list(model.keys())
    assert list(store.values()) == list(model.values())
    assert list(store.items()) == list(model.items())
    assert list(reversed(store.keys())) == list(reversed(model.keys()))
    assert list(reversed(store.values())) == list(reversed(model.values()))
    assert list(reversed(store.items())) == list(reversed(model.items()))


def test_views_len_contains_and_set_operations(store: kvlog.Store) -> None:
    keys, values, items = store.keys(), store.values(), store.items()
    assert len(keys) == len(values) == len(items) == 4
    assert b"a" in keys and "a" in keys and b"gone" not in keys and 7 not in keys
    assert b"3" in values and b"x" not in values
    assert (b"a", b"1") in items and (b"a", b"2") not in items and (b"gone", b"x") not in items
    assert ("a", b"1") in items  # a str key is its UTF-8 bytes, as in store["a"]
    assert (b"", b"1") not in items and (7, b"1") not in items and b"a" not in items
    assert keys & {b"a", b"z"} == {b"a"}
    assert keys == {b"a", b"b", b"c", b"d"}
    # The views are live: they read the store when used.
    store.put(b"e", b"5")
    assert len(keys) == 5 and b"e" in keys and (b"e", b"5") in items


def test_each_iteration_of_a_view_is_one_snapshot(store: kvlog.Store) -> None:
    """Writes made while a view is iterated do not show in that iteration (one scan), and a
    value deleted meanwhile is still read (never a lookup per key after the listing)."""
    seen = []
    for key, value in store.items():
        if key == b"a":
            store.delete(b"c")
            store.put(b"bb", b"new")
            store.put(b"d", b"changed")
            store.flush()
        seen.append((key, value))
    assert seen == sorted(ITEMS.items())
    values = []
    for value in store.values():
        if not values:
            store.clear()
        values.append(value)
    assert values == [b"1", b"2", b"new", b"changed"]
    assert dict(store) == {}


def test_eq_and_hash_are_identity(store: kvlog.Store, root: Root, opened: list[Any]) -> None:
    other = root.open(cache="other", read_only=True)
    opened.append(other)
    assert store == store and store != other
    assert store != dict(store.items())  # a handle, not its content
    assert hash(store) == hash(store) and {store: 1}[store] == 1
    assert len({store, other, store}) == 2


def test_update_matches_a_dict(store: kvlog.Store) -> None:
    model = dict(ITEMS)
    for args, kwargs, expected in (
        (({b"a": b"10", "x": "24"},), {}, {b"a": b"10", b"x": b"24"}),
        (([(b"y", b"25"), ("y", "26"), (bytearray(b"z"), memoryview(b"27"))],), {},
         {b"y": b"26", b"z": b"27"}),
        ((), {"kw": "v"}, {b"kw": b"v"}),
        (({b"a": b"11"},), {"a": "12"}, {b"a": b"12"}),  # keywords come last, as in a dict
        ((iter([(b"g", b"7")]),), {}, {b"g": b"7"}),
        ((), {}, {}),
    ):
        store.update(*args, **kwargs)
        model.update(expected)
        assert dict(store.items()) == model
    # Another store, and an object with keys() and [] (a dict's rule for a mapping).
    class KeysAndItems:
        def keys(self) -> list[bytes]:
            return [b"k1", b"k2"]

        def __getitem__(self, key: bytes) -> bytes:
            return key + b"!"

    store.update(KeysAndItems())
    model.update({b"k1": b"k1!", b"k2": b"k2!"})
    assert dict(store.items()) == model


def test_update_from_another_store(store: kvlog.Store, tmp_path: Any, opened: list[Any]) -> None:
    target = kvlog.open(tmp_path / "target", **EXPLICIT_FLUSH)
    opened.append(target)
    target.update(store)
    assert dict(target.items()) == dict(store.items()) == ITEMS


@pytest.mark.parametrize("bad", [
    pytest.param(({b"a": None},), id="None-value"),
    pytest.param(({b"": b"v"},), id="empty-key"),
    pytest.param(([(b"ok", b"v"), (7, b"v")],), id="int-key-after-a-good-pair"),
    pytest.param(([(b"ok", b"v"), b"ab"],), id="not-a-pair"),
    pytest.param(([(b"a", b"1", b"x")],), id="a-triple"),
    pytest.param((7,), id="not-iterable"),
    pytest.param((None,), id="None"),
    pytest.param(({b"k": b"v" * 20_000},), id="oversize"),
])
def test_bad_update_changes_nothing(store: kvlog.Store, bad: tuple[Any, ...]) -> None:
    _rejected(store, InvalidRecordError, lambda: store.update(*bad, ok="fine"))


def test_pop_matches_a_dict(store: kvlog.Store) -> None:
    assert store.pop(b"a") == b"1"
    assert b"a" not in store
    assert store.pop("c") == b"3"  # from the memtable
    assert store.pop(b"a", None) is None and store.pop(b"a", b"dflt") == b"dflt"
    with pytest.raises(KeyError):
        store.pop(b"a")
    with pytest.raises(KeyError):
        store.pop(b"gone")
    assert dict(store.items()) == {b"b": b"2", b"d": b"4"}
    for bad in (b"", None, 7, b"k" * (KEY_BYTES_LIMIT + 1)):
        _rejected(store, InvalidRecordError, lambda bad=bad: store.pop(bad))
        _rejected(store, InvalidRecordError, lambda bad=bad: store.pop(bad, None))


def test_setdefault_matches_a_dict(store: kvlog.Store) -> None:
    assert store.setdefault(b"a", b"other") == b"1"
    assert store.setdefault(b"new", "v") == b"v"
    assert store.setdefault(b"new", b"w") == b"v"
    assert store[b"new"] == b"v"
    assert store.setdefault(b"a") == b"1"  # present: the default is not needed
    _rejected(store, InvalidRecordError, lambda: store.setdefault(b"absent"))  # None is no value
    _rejected(store, InvalidRecordError, lambda: store.setdefault(b"absent", 5))
    _rejected(store, InvalidRecordError, lambda: store.setdefault(b"", b"v"))
    _rejected(store, InvalidRecordError, lambda: store.setdefault(None, b"v"))


def test_popitem_takes_the_smallest_key(store: kvlog.Store) -> None:
    taken = [store.popitem() for _ in range(4)]
    assert taken == sorted(ITEMS.items())
    with pytest.raises(KeyError):
        store.popitem()
    assert len(store) == 0


def test_clear_deletes_everything_in_batches(root: Root, opened: list[Any]) -> None:
    store = root.open(partitions=2, **EXPLICIT_FLUSH)
    opened.append(store)
    n = 10_000  # more than one batch of deletions
    store.update((b"k%05d" % i, b"v") for i in range(n))
    store.flush()
    store.put(b"memtable-only", b"v")
    version = store.log.version
    store.clear()
    assert len(store) == 0 and dict(store) == {} and list(reversed(store)) == []
    assert store.log.version == version  # buffered deletions, no commit per key
    store.flush()
    assert store.log.version == version + 1  # one flush commits them all
    assert len(store) == 0
    store.clear()  # an empty store
    assert len(store) == 0


def test_getitem_len_in_keep_dict_semantics(store: kvlog.Store) -> None:
    with pytest.raises(KeyError):
        store[b"gone"]
    with pytest.raises(InvalidRecordError):
        store[b""]
    assert len(store) == 4 and b"gone" not in store and None not in store and 7 not in store


def test_read_only_store_refuses_the_writing_methods(root: Root, opened: list[Any]) -> None:
    with root.open(**EXPLICIT_FLUSH) as writer:
        writer.update(ITEMS)
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    assert dict(reader) == ITEMS and list(reversed(reader)) == sorted(ITEMS, reverse=True)
    for call in (
        lambda: reader.update({b"x": b"1"}),
        lambda: reader.pop(b"a"),
        lambda: reader.pop(b"missing", None),
        lambda: reader.setdefault(b"a", b"1"),
        lambda: reader.setdefault(b"x", b"1"),
        lambda: reader.popitem(),
        lambda: reader.clear(),
    ):
        _rejected(reader, ReadOnlyError, call)


def test_closed_store_refuses_every_mapping_method(store: kvlog.Store) -> None:
    store.close()
    for call in (
        lambda: dict(store), lambda: list(reversed(store)), lambda: list(store.keys()),
        lambda: list(store.values()), lambda: list(store.items()), lambda: len(store.keys()),
        lambda: store.update({b"x": b"1"}), lambda: store.pop(b"a"), lambda: store.popitem(),
        lambda: store.setdefault(b"a", b"1"), lambda: store.clear(),
        lambda: store.get_many([b"a"]), lambda: store.snapshot(),
    ):
        with pytest.raises(StoreClosedError):
            call()
