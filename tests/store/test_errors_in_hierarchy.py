"""Every failure a caller can see is a KvlogError of the documented kind."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.errors import ConfigError, InvalidRecordError, StoreClosedError

QUIET = {"background_compaction": False, "flush_interval_ms": 0, "partitions": 2}


def _filled(path: Path, **settings: Any) -> kvlog.Store:
    store = kvlog.open(path, **{**QUIET, **settings})
    for i in range(1500):  # more than one scan chunk, inline and not
        store.put(f"k{i:05d}".encode(), (b"v" * (2000 if i % 7 == 0 else 10)))
    store.flush()
    return store


ITERATORS: dict[str, Callable[[kvlog.Store], Iterator[Any]]] = {
    "scan": lambda s: s.scan(),
    "scan-reverse": lambda s: s.scan(reverse=True),
    "scan-prefix": lambda s: s.scan(prefix=b"k0"),
    "iter": lambda s: iter(s),
    "changes-all": lambda s: s.changes(),
    "changes-one": lambda s: s.changes(0),
}


@pytest.mark.parametrize("name", sorted(ITERATORS))
def test_an_iterator_used_after_close_raises_store_closed(tmp_path: Path, name: str) -> None:
    store = _filled(tmp_path / "root")
    iterator = ITERATORS[name](store)
    next(iterator)
    store.close()
    with pytest.raises(StoreClosedError):
        for _item in iterator:
            pass


def test_an_iterator_with_unflushed_writes_after_close_raises_store_closed(tmp_path: Path) -> None:
    store = _filled(tmp_path / "root")
    store.put(b"k00000x", b"unflushed")
    iterator = store.scan()
    next(iterator)
    store.close()
    with pytest.raises(StoreClosedError):
        list(iterator)


def test_a_cache_dir_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "cache-file"
    not_a_dir.write_bytes(b"something")
    with pytest.raises(ConfigError, match="cache_dir"):
        kvlog.open(tmp_path / "root", cache_dir=not_a_dir, **QUIET)
    assert not_a_dir.read_bytes() == b"something"


def test_lowering_max_key_bytes_keeps_existing_keys_readable_and_deletable(tmp_path: Path) -> None:
    long_key = b"L" * 3000
    with kvlog.open(tmp_path / "root", **QUIET) as store:
        store.put(long_key, b"long", sync=True)
        store.put(b"short", b"s", sync=True)
    with kvlog.open(tmp_path / "root", max_key_bytes=100, **QUIET) as store:
        assert store.get(long_key) == b"long"
        assert store[long_key] == b"long"
        assert long_key in store
        with pytest.raises(InvalidRecordError):
            store.put(long_key, b"new")  # writes follow the new limit
        del store[long_key]
        store.flush()
        assert store.get(long_key) is None
        assert dict(store.scan()) == {b"short": b"s"}


@pytest.mark.parametrize("bound", ["start", "stop", "prefix"])
def test_a_scan_bound_with_a_lone_surrogate_is_an_invalid_record(tmp_path: Path, bound: str) -> None:
    with kvlog.open(tmp_path / "root", **QUIET) as store:
        with pytest.raises(InvalidRecordError):
            store.scan(**{bound: "\ud800"})
