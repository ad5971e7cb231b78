"""``store.snapshot()``: a read view pinned at one commit, on local disk and SeaweedFS.

A snapshot sees the commit applied when it was taken and this process's writes made before
it, never later writes of any process; compaction and GC (with the shortest delete delay,
on a clock moved past it, so GC would really delete) never break its reads, including of
values in data files the compaction replaced; it is released by ``close``, its ``with``
block, ``store.close()`` or garbage collection, and its reads then raise
``StoreClosedError``. Bad input gets ``InvalidRecordError``.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH, Root

import kvlog
from kvlog.config import KEY_BYTES_LIMIT
from kvlog.errors import InvalidRecordError, StoreClosedError
from kvlog.log.pins import PinRegistry

DELAY = 1_000  # the shortest file_delete_delay_ms


def _data_files(store: kvlog.Store) -> set[str]:
    return {info.name for info in store.log.storage.list("data/")}


def _open(root: Root, clock: kvlog.ManualClock, **extra: Any) -> kvlog.Store:
    return root.open(partitions=2, clock=clock, inline_value_bytes=0, file_delete_delay_ms=DELAY,
                     **{**EXPLICIT_FLUSH, **extra})


def test_a_snapshot_sees_what_was_there_when_taken(root: Root, opened: list[Any]) -> None:
    clock = kvlog.ManualClock()
    store = _open(root, clock)
    opened.append(store)
    store.update({b"a": b"1", b"b": b"2", b"gone": b"x"})
    store.flush()
    store.put(b"c", b"3")  # unflushed: in the memtable
    store.delete(b"gone")
    with store.snapshot() as snap:
        assert isinstance(snap, kvlog.Snapshot)
        assert snap.version == store.log.version
        store.put(b"a", b"changed")
        store.put(b"d", b"new")
        store.delete(b"b")
        store.flush()
        other = root.open(cache="other", producer_id=77, **EXPLICIT_FLUSH)
        opened.append(other)
        other.put(b"e", b"from another process", sync=True)
        store.refresh()
        expected = {b"a": b"1", b"b": b"2", b"c": b"3"}
        assert dict(snap.scan()) == expected
        assert list(snap.scan(reverse=True)) == sorted(expected.items(), reverse=True)
        assert list(snap.scan(b"b", b"c")) == [(b"b", b"2")]
        assert list(snap.scan(prefix="a")) == [(b"a", b"1")]
        assert snap.get(b"a") == b"1" and snap.get("c") == b"3"
        assert snap.get(b"d") is None and snap.get(b"e", b"dflt") == b"dflt"
        assert snap.get(b"gone") is None
        assert snap[b"b"] == b"2"
        with pytest.raises(KeyError):
            snap[b"d"]
        assert b"a" in snap and b"d" not in snap and b"gone" not in snap and 7 not in snap
        assert b"" not in snap
        assert snap.get_many([b"d", b"a", b"c", b"b", b"a"]) == [None, b"1", b"3", b"2", b"1"]
        assert dict(store.items()) == {b"a": b"changed", b"c": b"3", b"d": b"new",
                                       b"e": b"from another process"}
    assert snap.closed


def test_a_snapshot_survives_compaction_and_gc(root: Root, opened: list[Any]) -> None:
    clock = kvlog.ManualClock()
    store = _open(root, clock)
    opened.append(store)
    old = {b"k%03d" % i: b"old-%d" % i + b"v" * 200 for i in range(200)}
    store.update(old)
    store.flush()
    first_files = _data_files(store)
    snap = store.snapshot()
    store.update({k: b"new" for k in old})  # every record of the first files is overwritten
    store.flush()
    report = store.compact(force=True)
    assert report.files_in >= len(first_files)
    clock.advance(DELAY * 10)
    store.gc()
    assert first_files <= _data_files(store), "GC deleted a file the open snapshot reads"
    # Values not inline, in files the compaction replaced: read from those files.
    assert snap.get(b"k007") == old[b"k007"]
    assert snap.get_many(sorted(old)) == [old[k] for k in sorted(old)]
    assert dict(snap.scan()) == old
    assert store.get(b"k007") == b"new"
    snap.close()
    store.gc()
    assert not first_files & _data_files(store), "the replaced files go once the snapshot is closed"
    assert store.log.pins.held() == 0
    assert store.check() == []


def test_gc_deletes_files_replaced_before_the_snapshot(local_root: Root, opened: list[Any]) -> None:
    clock = kvlog.ManualClock()
    store = _open(local_root, clock)
    opened.append(store)
    store.update({b"a": b"1" * 100, b"b": b"2" * 100})
    store.flush()
    first_files = _data_files(store)
    store.update({b"a": b"3" * 100, b"b": b"4" * 100})
    store.flush()
    store.compact(force=True)  # replaces the first files before the snapshot is taken
    with store.snapshot() as snap:
        clock.advance(DELAY * 10)
        store.gc()
        assert not first_files & _data_files(store)  # never read by the snapshot: deleted
        assert snap.get_many([b"a", b"b"]) == [b"3" * 100, b"4" * 100]


def test_store_close_releases_its_snapshots(root: Root) -> None:
    store = root.open(**EXPLICIT_FLUSH)
    store.put(b"a", b"1", sync=True)
    snap = store.snapshot()
    items = snap.scan()
    assert next(items) == (b"a", b"1")
    store.close()
    assert snap.closed and store.log.pins.held() == 0
    for call in (lambda: snap.get(b"a"), lambda: snap.get_many([b"a"]), lambda: snap[b"a"],
                 lambda: b"a" in snap, lambda: list(snap.scan())):
        with pytest.raises(StoreClosedError):
            call()
    with pytest.raises(StoreClosedError):
        list(items)
    snap.close()  # idempotent
    assert "closed" in repr(snap)


def test_a_scan_in_progress_stops_when_the_snapshot_closes(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    store.update((b"k%04d" % i, b"v") for i in range(3000))
    store.flush()
    snap = store.snapshot()
    items = snap.scan()
    assert next(items) == (b"k0000", b"v")
    snap.close()
    with pytest.raises(StoreClosedError):
        list(items)


def test_a_snapshot_garbage_collected_unclosed_is_released(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    store.put(b"a", b"1", sync=True)
    snap = store.snapshot()
    assert store.log.pins.held() == 1
    del snap
    gc.collect()
    assert store.log.pins.held() == 0


def test_snapshots_on_a_read_only_handle(root: Root, opened: list[Any]) -> None:
    with root.open(**EXPLICIT_FLUSH) as writer:
        writer.update({b"a": b"1", b"b": b"2"})
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    with reader.snapshot() as snap:
        with root.open(**EXPLICIT_FLUSH) as writer:
            writer.put(b"a", b"later")
        reader.refresh()
        assert snap.get_many([b"a", b"b"]) == [b"1", b"2"]
        assert reader.get(b"a") == b"later"


def test_a_read_only_snapshot_survives_gc_by_a_writer_of_the_same_process(root: Root, opened: list[Any]) -> None:
    # The pins are the process's: GC by another handle of the same store in this process keeps
    # the files a read-only handle's snapshot reads, as it does for its own handle's snapshots.
    clock = kvlog.ManualClock()
    writer = _open(root, clock)
    opened.append(writer)
    old = {b"k%03d" % i: b"old-%d" % i + b"v" * 200 for i in range(50)}
    writer.update(old)
    writer.put(b"t", b"expiring" * 100, ttl_ms=10)
    writer.flush()
    first_files = _data_files(writer)
    reader = root.open(cache="reader", read_only=True, clock=clock)
    opened.append(reader)
    snap = reader.snapshot()
    writer.update({k: b"new" for k in old})
    writer.flush()
    writer.compact(force=True)
    clock.advance(DELAY * 10)
    writer.compact(force=True)
    writer.gc()
    assert first_files <= _data_files(writer), "GC deleted a file a read-only handle's snapshot reads"
    reader.log.batch_cache.clear()
    assert snap.get_many(sorted(old)) == [old[k] for k in sorted(old)]
    assert snap.get(b"t") == b"expiring" * 100  # expired since, but not at the snapshot's time
    assert dict(snap.scan()) == {**old, b"t": b"expiring" * 100}
    snap.close()
    writer.gc()
    assert not first_files & _data_files(writer), "the replaced files go once the snapshot is closed"
    assert reader.log.pins.held() == writer.log.pins.held() == 0


@pytest.mark.parametrize("bad", [b"", None, 7, b"k" * (KEY_BYTES_LIMIT + 1), "\ud800"])
def test_bad_input(local_root: Root, opened: list[Any], bad: Any) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    store.put(b"a", b"1")
    with store.snapshot() as snap:
        with pytest.raises(InvalidRecordError):
            snap.get(bad)
        with pytest.raises(InvalidRecordError):
            snap[bad]
        if bad is not None and not isinstance(bad, bytes | str):
            with pytest.raises(InvalidRecordError):
                list(snap.scan(bad))
            with pytest.raises(InvalidRecordError):
                list(snap.scan(prefix=bad))
        assert bad not in snap
        assert dict(snap.scan()) == {b"a": b"1"}


def test_pins_keep_files_replaced_after_them() -> None:
    pins = PinRegistry()
    assert not pins.protects("data/x") and pins.oldest_version() is None
    pin = pins.pin()
    assert pins.protects("data/any")  # not settled: every replaced file is kept
    pin.settle(7, frozenset({"data/replaced-before"}))
    assert not pins.protects("data/replaced-before") and pins.protects("data/replaced-after")
    later = pins.pin()
    later.settle(9, frozenset({"data/replaced-before", "data/replaced-after"}))
    assert pins.protects("data/replaced-after") and pins.oldest_version() == 7
    pin.release()
    pin.release()  # idempotent
    assert not pins.protects("data/replaced-after") and pins.held() == 1
    later.release()
    assert pins.held() == 0


def test_snapshot_is_exported(tmp_path: Path) -> None:
    assert kvlog.Snapshot.__module__ == "kvlog.snapshot" and "Snapshot" in kvlog.__all__
