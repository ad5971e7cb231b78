"""The bad arguments the public-surface fuzzer found, each refused with a ``KvlogError`` and no file changed.

Each test names the call and the arguments that raised a plain Python error (or were taken
as something they are not) before the call checked them at its entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kvlog
import kvlog.aio
from kvlog.errors import ConfigError, InvalidRecordError
from tests.fuzz.test_public_surface import QUIET, tree


@pytest.fixture
def store(tmp_path: Path) -> Iterator[kvlog.Store]:
    with kvlog.open(str(tmp_path / "store"), **QUIET) as s:
        for i in range(6):
            s.put(b"k%d" % i, b"v%d" % i)
        s.flush()
        yield s


def _refused(store: kvlog.Store, error: type[Exception], call: Any) -> None:
    root = Path(store.log.storage.uri.removeprefix("file://"))
    before = tree(root)
    with pytest.raises(error):
        result = call()
        if isinstance(result, Iterator):
            list(result)
    assert tree(root) == before


@pytest.mark.parametrize("key", [None, 5, 10**100, 1.5, [b"k"], "\udc80", b""])
def test_partition_for_refuses_what_is_not_a_key(store: kvlog.Store, key: Any) -> None:
    # None, 1.5 and [b"k"] raised TypeError, "\udc80" UnicodeEncodeError, 10**100 OverflowError,
    # and 5 was taken as five NUL bytes (a huge int allocated that many).
    _refused(store, InvalidRecordError, lambda: store.log.partition_for(key))
    assert store.log.partition_for("k1") == store.log.partition_for(b"k1") == store.log.partition_for(bytearray(b"k1"))  # type: ignore[arg-type]


@pytest.mark.parametrize("offset", [None, "1", 1.5, True, -1, [0], 2**64, 10**100])
def test_changes_and_read_refuse_offsets_that_are_not_ints(store: kvlog.Store, offset: Any) -> None:
    # changes(from_offset=None) raised TypeError ('<' between NoneType and int), and only once
    # iterated when no partition was given; read's to_offset was not checked at all; 2**64 raised
    # struct.error from the cache's 64-bit batch key.
    _refused(store, InvalidRecordError, lambda: store.changes(None, offset))
    _refused(store, InvalidRecordError, lambda: store.changes(0, offset))
    _refused(store, InvalidRecordError, lambda: store.log.read(0, offset))
    if offset is not None:  # no to_offset: read to the end
        _refused(store, InvalidRecordError, lambda: store.log.read(0, 0, offset))
    assert [r.offset for r in store.log.read(0, 0, 10**6)] == [r.offset for r in store.changes(0)]


@pytest.mark.parametrize("now_ms", ["", "5", 1.5, float("nan"), True, -1, 2**64])
def test_log_gc_refuses_a_now_ms_that_is_not_milliseconds(store: kvlog.Store, now_ms: Any) -> None:
    # log.gc(now_ms="") raised TypeError from the deletion-delay comparison.
    _refused(store, InvalidRecordError, lambda: store.log.gc(now_ms))
    assert store.log.gc(0) == {"replaced": 0, "orphans": 0, "commits": 0}


@pytest.mark.parametrize("config", [1, 0, "", {"partitions": 3}, object()])
def test_open_refuses_a_config_that_is_not_a_storeconfig(tmp_path: Path, config: Any) -> None:
    # config=1 raised TypeError from dataclasses.replace; config=0 or "" was taken as no config.
    with pytest.raises(ConfigError):
        kvlog.open(str(tmp_path / "store"), config=config)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("partition", [{}, [], {0: 0}, [0]])
def test_aio_changes_refuses_a_partition_that_is_not_an_int(tmp_path: Path, partition: Any) -> None:
    # changes(partition={}) raised TypeError (an unhashable dict key of the cursors).
    async def go() -> None:
        async with kvlog.aio.open(str(tmp_path / "store"), **QUIET) as aio:
            await aio.put(b"k", b"v", sync=True)
            with pytest.raises(InvalidRecordError):
                async for _record in aio.changes(partition):
                    pass
            assert [r.key async for r in aio.changes(None)] == [b"k"]
    asyncio.run(go())


@pytest.mark.parametrize("where", ["uri", "cache_dir"])
def test_open_refuses_a_location_that_is_not_utf8_before_creating_it(tmp_path: Path, where: str) -> None:
    # A path holding "\udc80" (a byte that is not UTF-8, as os.fsdecode gives it) raised
    # UnicodeEncodeError from LMDB after the store directory had been made.
    bad = str(tmp_path / "store\udc80")
    uri, cache_dir = (bad, None) if where == "uri" else (str(tmp_path / "store"), bad)
    with pytest.raises(ConfigError):
        kvlog.open(uri, cache_dir=cache_dir, **QUIET)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("what", ["clock", "ids"])
@pytest.mark.parametrize("value", [[5, None], 7, "clock", object()])
def test_open_refuses_a_clock_or_ids_without_their_methods(tmp_path: Path, what: str, value: Any) -> None:
    # clock=[5, None] raised AttributeError ('list' object has no attribute 'now_ms') after the
    # store directory had been made; ids likewise.
    with pytest.raises(ConfigError):
        kvlog.open(str(tmp_path / "store"), **{what: value}, **QUIET)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("records", [-6.1e16, 7, None, object()])
def test_producer_append_refuses_records_that_are_not_a_sequence(store: kvlog.Store, records: Any) -> None:
    # append(0, -6.1e16, base_sequence=0) raised TypeError ('float' object is not iterable).
    producer = store.log.producer()
    _refused(store, InvalidRecordError, lambda: producer.append(0, records, base_sequence=0))
