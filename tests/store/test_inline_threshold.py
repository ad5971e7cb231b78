"""``inline_value_bytes`` decides where a value is read from, never what is read.

A value over the threshold has no inline copy in the key index and is read from its data file;
gets and scans answer the same across compaction, a reopen with another threshold, and a
rebuild of the index.
"""

from __future__ import annotations

from pathlib import Path

import kvlog

QUIET = {"background_compaction": False, "flush_interval_ms": 0, "partitions": 2}


def inline_copy(store: kvlog.Store, key: bytes) -> bytes | None:
    """The key index's inline copy of ``key``'s value (None: the value is in a data file)."""
    store.log.settle_index()
    entry = store.log.snapshot(lambda r: r.index_get(key))
    assert entry is not None
    return entry.inline


def expected(i: int, size: int) -> bytes:
    return (b"%06d" % i) * (size // 6)


def test_values_over_the_threshold_are_read_from_their_data_files(tmp_path: Path) -> None:
    root = tmp_path / "root"
    small, large = 48, 300
    values = {b"s%03d" % i: expected(i, small) for i in range(50)} | {b"l%03d" % i: expected(i, large) for i in range(50)}
    with kvlog.open(root, inline_value_bytes=100, **QUIET) as store:
        for key, value in values.items():
            store.put(key, value)
        store.flush()
        assert inline_copy(store, b"s007") == values[b"s007"]
        assert inline_copy(store, b"l007") is None
        assert store.get(b"l007") == values[b"l007"]
        for key, value in values.items():  # rewritten, so compaction has records to remove
            store.put(key, value)
        store.flush()
        store.compact(force=True)
        assert dict(store.scan()) == values
        assert store.log.batch_cache.misses > 0  # the large values came from data files
    with kvlog.open(root, inline_value_bytes=0, **QUIET) as store:
        assert inline_copy(store, b"s007") == values[b"s007"]  # written inline, kept inline
        store.put(b"s007", values[b"s007"])
        store.flush()
        assert inline_copy(store, b"s007") is None  # rewritten under the new threshold
        assert all(store.get(key) == value for key, value in values.items())
        assert dict(store.scan()) == values
        assert store.check() == []
        store.log.rebuild_index()  # rebuilt from the data files under the new threshold
        assert inline_copy(store, b"s008") is None
        assert dict(store.scan()) == values
    with kvlog.open(root, read_only=True) as reader:
        assert dict(reader.scan()) == values
        assert reader.get_many(list(values)) == list(values.values())
