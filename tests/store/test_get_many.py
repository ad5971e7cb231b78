"""``store.get_many``: many keys in one snapshot, in the order asked, on local disk and SeaweedFS.

Keys are spread over every place a value can be: the memtable (unflushed), the pending index
runs (flushed, not merged), the B-tree (merged), inline in an entry or in a data file
(``inline_value_bytes=0``), under short and long (> 511 bytes) keys, deleted in any of those
places. Each answer is compared with ``get`` of the same key; a batch holding several of the
keys is read once; bad input raises before anything is read.
"""

from __future__ import annotations

from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH, Root

import kvlog
from kvlog.config import KEY_BYTES_LIMIT
from kvlog.errors import InvalidRecordError, StoreClosedError

LONG = b"L" * 600  # longer than an LMDB key (511 bytes): stored under its first bytes and a hash


def _layered(store: kvlog.Store) -> dict[bytes, bytes]:
    """Writes landing in the B-tree, in pending runs and in the memtable; the expected state."""
    model: dict[bytes, bytes] = {}

    def put(key: bytes, value: bytes) -> None:
        store.put(key, value)
        model[key] = value

    def delete(key: bytes) -> None:
        store.delete(key)
        model.pop(key, None)

    for i in range(20):
        put(b"tree-%02d" % i, b"t%d" % i)
        put(LONG + b"tree-%02d" % i, b"lt%d" % i)
    put(b"gone-in-run", b"x")
    put(b"gone-in-memtable", b"x")
    store.flush()
    store.log.settle_index()
    assert store.log.snapshot(lambda r: r.runs_pending()) == 0
    for i in range(0, 20, 3):
        put(LONG + b"tree-%02d" % i, b"over-long-%d" % i)  # a commit with long keys: the B-tree
    store.flush()
    for i in range(0, 20, 3):
        put(b"run-%02d" % i, b"r%d" % i)
        put(b"tree-%02d" % i, b"over-run-%d" % i)
    delete(b"gone-in-run")
    store.flush()  # short keys only: one pending index run
    assert store.log.snapshot(lambda r: r.runs_pending()) >= 1
    put(b"mem", b"m")
    put(b"tree-01", b"over-memtable")
    put(LONG + b"mem", b"lm")
    delete(b"gone-in-memtable")
    delete(b"tree-02")
    return model


@pytest.mark.parametrize("inline", [1024, 0], ids=["inline", "in-data-files"])
def test_get_many_matches_get_in_every_layer(root: Root, opened: list[Any], inline: int) -> None:
    store = root.open(partitions=3, inline_value_bytes=inline, index_run_limit=64, **EXPLICIT_FLUSH)
    opened.append(store)
    model = _layered(store)
    asked = sorted(model) + [b"gone-in-run", b"gone-in-memtable", b"tree-02", b"never", LONG + b"never"]
    asked = asked[::-1] + asked[:5]  # not in key order, duplicates
    expected = [model.get(k) for k in asked]
    assert store.get_many(asked) == expected
    assert [store.get(k) for k in asked] == expected
    assert store.get_many(k.decode() for k in asked) == expected  # str keys, a generator
    assert store.get_many([]) == []
    assert store.get_many((bytearray(b"mem"), memoryview(b"run-03"))) == [b"m", b"r3"]


def test_get_many_on_a_read_only_handle(root: Root, opened: list[Any]) -> None:
    writer = root.open(partitions=2, inline_value_bytes=0, **EXPLICIT_FLUSH)
    opened.append(writer)
    model = _layered(writer)
    writer.flush()
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    asked = sorted(model) + [b"never"]
    assert reader.get_many(asked) == [model.get(k) for k in asked]


def test_each_batch_is_read_once(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(partitions=1, inline_value_bytes=0, cache_bytes=1, **EXPLICIT_FLUSH)
    opened.append(store)
    store.update((b"k%02d" % i, b"v%d" % i) for i in range(30))
    store.flush()  # one data file, one batch (one partition)
    cache = store.log.batch_cache
    before = cache.hits + cache.misses
    assert store.get_many([b"k%02d" % i for i in range(30)]) == [b"v%d" % i for i in range(30)]
    # cache_bytes=1 keeps no batch: a second read of the batch would be a second miss.
    assert cache.hits + cache.misses - before == 1


def test_get_many_is_one_snapshot_across_a_commit(local_root: Root, opened: list[Any]) -> None:
    """Commits landing while a call runs cannot split its answer: the index part and the values
    are read in one read transaction, so the batches its entries point at are found even after
    a compaction removed them from the newer catalog."""
    store = local_root.open(partitions=2, inline_value_bytes=0, **EXPLICIT_FLUSH)
    opened.append(store)
    store.update({b"a": b"1", b"b": b"1"})
    store.flush()
    other = local_root.open(cache="other", producer_id=99, **EXPLICIT_FLUSH)
    opened.append(other)
    original = store.log.values_of
    landed = []

    def values_then_commit(pairs: Any, reader: Any) -> list[bytes]:
        if not landed:  # after the index part was read: new values, then a compaction
            other.update({b"a": b"2", b"b": b"2"})  # that removes the offsets it found
            other.flush()
            store.refresh()
            store.compact(force=True)
            landed.append(True)
        return original(pairs, reader)

    store.log.values_of = values_then_commit  # type: ignore[method-assign]
    assert store.get_many([b"a", b"b"]) == [b"1", b"1"]
    del store.log.values_of
    assert store.get_many([b"a", b"b"]) == [b"2", b"2"]


BAD = [
    pytest.param([b"a", b""], id="an-empty-key"),
    pytest.param([b"a", None], id="a-None-key"),
    pytest.param([b"a", 7], id="an-int-key"),
    pytest.param([b"a", b"k" * (KEY_BYTES_LIMIT + 1)], id="a-too-long-key"),
    pytest.param([b"a", "\ud800"], id="a-lone-surrogate"),
    pytest.param(None, id="None"),
    pytest.param(7, id="not-iterable"),
    pytest.param(b"ab", id="one-bytes-key"),
    pytest.param("ab", id="one-str-key"),
]


@pytest.mark.parametrize("keys", BAD)
def test_bad_input_raises_before_reading(local_root: Root, opened: list[Any], keys: Any) -> None:
    store = local_root.open(inline_value_bytes=0, **EXPLICIT_FLUSH)
    opened.append(store)
    store.put(b"a", b"1", sync=True)
    cache = store.log.batch_cache
    before = (cache.hits, cache.misses, store.log.version)
    with pytest.raises(InvalidRecordError):
        store.get_many(keys)
    assert (cache.hits, cache.misses, store.log.version) == before
    snap = store.snapshot()
    with pytest.raises(InvalidRecordError):
        snap.get_many(keys)
    assert (cache.hits, cache.misses) == before[:2]
    snap.close()


def test_closed_store(local_root: Root) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    store.close()
    with pytest.raises(StoreClosedError):
        store.get_many([b"a"])
