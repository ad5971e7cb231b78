"""Per-record time to live through the store: writes, every read, len, compaction, reopening.

The clock is a :class:`kvlog.ManualClock`: a record written at ``t`` with ``ttl_ms=d`` is seen
while the clock is below ``t + d`` and hidden from then on, whichever layer answers (the
memtable, an index run, the B-tree, an inline value or one read from a data file).
"""

from __future__ import annotations

import mmap
import shutil
from pathlib import Path
from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH

import kvlog
from kvlog.errors import InvalidRecordError
from kvlog.index.expiries import row_key

pytestmark = pytest.mark.usefixtures("native")

BIG = b"x" * 2000  # larger than inline_value_bytes: read from its data file


def _open(path: Path, clock: kvlog.ManualClock, **settings: Any) -> kvlog.Store:
    return kvlog.open(path / "store", cache_dir=path / "cache", clock=clock,
                      **{**EXPLICIT_FLUSH, "partitions": 2, **settings})


def _reads(store: kvlog.Store, key: bytes) -> tuple[Any, bool, int, list[bytes]]:
    return store.get(key), key in store, len(store), [k for k, _v in store.scan()]


@pytest.mark.parametrize("run_limit", [0, 4])
@pytest.mark.parametrize("value", [b"small", BIG])
@pytest.mark.parametrize("key", [b"k", b"L" * 600])
def test_every_read_hides_an_expired_record_in_every_layer(tmp_path: Path, run_limit: int, value: bytes,
                                                           key: bytes) -> None:
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock, index_run_limit=run_limit)
    store.put(b"other", b"stays")
    store.put(key, value, ttl_ms=100)
    for layer in ("memtable", "flushed", "settled"):
        if layer == "flushed":
            store.flush()
        elif layer == "settled":
            store.log.settle_index()
        assert _reads(store, key) == (value, True, 2, sorted([b"other", key])), layer
        assert store[key] == value
    clock.advance(99)
    assert store.get(key) == value
    clock.advance(1)  # the expiry reached: hidden at once
    assert _reads(store, key) == (None, False, 1, [b"other"])
    with pytest.raises(KeyError):
        store[key]
    store.close()
    store = _open(tmp_path, clock, index_run_limit=run_limit)
    assert _reads(store, key) == (None, False, 1, [b"other"])
    shutil.rmtree(tmp_path / "cache")  # the index rebuilt from storage hides it too
    store.close()
    store = _open(tmp_path, clock, index_run_limit=run_limit)
    assert _reads(store, key) == (None, False, 1, [b"other"])
    store.close()


def test_unflushed_expiring_write_is_hidden_from_the_memtable(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock)
    store.put(b"k", b"old", sync=True)
    store.put(b"k", b"new", ttl_ms=10)
    assert _reads(store, b"k") == (b"new", True, 1, [b"k"])
    clock.advance(10)
    # The newer write expired: the key is gone, never the older value.
    assert _reads(store, b"k") == (None, False, 0, [])
    assert list(store.scan(reverse=True)) == []
    store.flush()
    assert _reads(store, b"k") == (None, False, 0, [])
    store.close()


def test_rewrites_change_the_expiry_and_len_follows(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock, index_run_limit=2)
    store.put(b"a", b"1", ttl_ms=100, sync=True)
    store.put(b"a", b"2", ttl_ms=500, sync=True)  # a later expiry replaces the first
    store.put(b"b", b"1", ttl_ms=100, sync=True)
    store.put(b"b", b"2", sync=True)  # no expiry any more
    store.put(b"c", b"1", ttl_ms=100, sync=True)
    store.delete(b"c", sync=True)
    store.put(b"d", b"1", sync=True)
    store.put(b"d", b"2", ttl_ms=100, sync=True)  # an expiry added
    clock.advance(200)
    assert len(store) == 2
    assert dict(store.scan()) == {b"a": b"2", b"b": b"2"}
    store.log.settle_index()
    assert len(store) == 2
    clock.advance(300)
    assert len(store) == 1 and dict(store.scan()) == {b"b": b"2"}
    store.close()


@pytest.mark.parametrize("ttl", [0, -1, True, False, 1.5, "10", 2**63, b"1"])
def test_a_bad_ttl_is_refused_and_nothing_is_written(tmp_path: Path, ttl: Any) -> None:
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock)
    version = store.flush()
    with pytest.raises(InvalidRecordError):
        store.put(b"k", b"v", ttl_ms=ttl)
    with pytest.raises(InvalidRecordError):
        store.put(b"k", b"v", ttl_ms=ttl, sync=True)
    with store.batch() as batch:
        batch.put(b"a", b"1")
        with pytest.raises(InvalidRecordError):
            batch.put(b"k", b"v", ttl_ms=ttl)
        assert len(batch) == 1
    assert store.get(b"k") is None and len(store) == 1
    assert store.flush() == version + 1
    assert [r.key for r in store.changes()] == [b"a"]
    store.close()


def test_a_write_batch_mixes_expiring_and_lasting_puts(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock)
    with store.batch() as batch:
        batch.put(b"a", b"1")
        batch.put(b"b", b"2", ttl_ms=50)
        batch.delete(b"c")
        batch.put(b"d", b"4", ttl_ms=80)
    start = clock.now_ms()
    records = {r.key: r for r in store.changes()}
    assert records[b"a"].expires_ms is None and records[b"c"].expires_ms is None
    assert records[b"b"].expires_ms == start + 50 and records[b"d"].expires_ms == start + 80
    assert records[b"b"].timestamp_ms == start
    clock.advance(60)
    assert dict(store.scan()) == {b"a": b"1", b"d": b"4"}
    clock.advance(20)
    assert dict(store.scan()) == {b"a": b"1"}
    # changes() still yields the expired records: expiry writes nothing to the changelog.
    assert sorted(r.key for r in store.changes()) == [b"a", b"b", b"c", b"d"]
    store.close()


def test_record_keeps_its_positional_fields() -> None:
    record = kvlog.Record(0, 5, 1000, b"k", b"v")
    assert record.expires_ms is None
    assert kvlog.Record(0, 5, 1000, b"k", b"v", 2000).expires_ms == 2000


def test_producer_appends_four_tuples(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock)
    producer = store.log.producer(77)
    producer.append(0, [(b"a", b"1"), (b"b", b"2", 5), (b"c", b"3", 5, clock.now_ms() + 10),
                        (b"d", None, 5, None)], base_sequence=0)
    store.refresh()
    got = [(r.key, r.timestamp_ms, r.expires_ms) for r in store.changes(0)]
    assert got == [(b"a", clock.now_ms(), None), (b"b", 5, None), (b"c", 5, clock.now_ms() + 10), (b"d", 5, None)]
    assert store.get(b"c") == b"3"
    clock.advance(10)
    assert store.get(b"c") is None and len(store) == 2
    store.close()


def _older_values_never_return(store: kvlog.Store, expected: dict[bytes, bytes]) -> None:
    assert dict(store.scan()) == expected
    assert len(store) == len(expected)
    for key in (b"k", b"j"):
        assert store.get(key) == expected.get(key)
    assert store.check() == []


def test_compaction_removes_expired_records_and_never_resurrects(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    settings = {"delete_retention_ms": 1000, "l0_merge_files": 100}
    store = _open(tmp_path, clock, **settings)
    store.put(b"k", b"old-k", sync=True)
    store.put(b"j", BIG + b"old-j", sync=True)
    store.put(b"k", b"new-k", ttl_ms=100, sync=True)
    store.put(b"j", BIG, ttl_ms=100, sync=True)
    store.put(b"stay", b"1", sync=True)
    clock.advance(100)
    _older_values_never_return(store, {b"stay": b"1"})
    first = store.compact(force=True)
    # The older records go; the expired ones stay as long as their horizon (they hide nothing
    # any more, but a later round must know the older ones are gone).
    assert first.records_removed == 2 and first.expired_removed == 0
    _older_values_never_return(store, {b"stay": b"1"})
    clock.advance(1000)
    second = store.compact(force=True)
    assert second.expired_removed == 2
    assert [r.key for r in store.changes()] == [b"stay"]
    _older_values_never_return(store, {b"stay": b"1"})
    store.close()
    store = _open(tmp_path, clock, **settings)
    _older_values_never_return(store, {b"stay": b"1"})
    store.close()
    shutil.rmtree(tmp_path / "cache")
    store = _open(tmp_path, clock, **settings)
    _older_values_never_return(store, {b"stay": b"1"})
    store.put(b"k", b"again", sync=True)  # the key is writable as any other
    assert store.get(b"k") == b"again"
    store.close()


def test_a_record_not_yet_expired_survives_compaction(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock, delete_retention_ms=10)
    store.put(b"k", b"v", ttl_ms=10_000, sync=True)
    clock.advance(5000)
    report = store.compact(force=True)
    assert report.expired_removed == 0 and store.get(b"k") == b"v"
    clock.advance(5000)
    assert store.get(b"k") is None
    store.compact(force=True)
    clock.advance(10)
    assert store.compact(force=True).expired_removed == 1
    assert list(store.changes()) == []
    store.close()


def test_partial_rounds_never_resurrect_an_older_value(tmp_path: Path) -> None:
    """A small offset map splits the dirty range into partial rounds; the older values of
    expired keys sit in earlier files than the expired records."""
    clock = kvlog.ManualClock()
    settings = {"delete_retention_ms": 50, "offset_map_bytes": 4096, "l0_merge_files": 1000}
    store = _open(tmp_path, clock, partitions=1, **settings)
    keys = [f"key{i:05d}".encode() for i in range(600)]
    with store.batch() as batch:
        for key in keys:
            batch.put(key, b"old")
    with store.batch() as batch:
        for i, key in enumerate(keys):
            batch.put(key, b"new", ttl_ms=10 if i % 2 else None)
    clock.advance(10)
    expected = {k: b"new" for i, k in enumerate(keys) if i % 2 == 0}
    partial = 0
    for _round in range(40):
        report = store.compact(force=True)
        partial += report.partial
        assert dict(store.scan()) == expected
        assert len(store) == len(expected)
        clock.advance(30)
    assert partial > 0
    assert sorted(r.key for r in store.changes()) == sorted(expected)
    store.close()
    store = _open(tmp_path, clock, partitions=1, **settings)
    assert dict(store.scan()) == expected
    store.close()


def test_a_compaction_ahead_of_the_readers_clock_hides_the_removed_record(tmp_path: Path) -> None:
    """Compaction run with a later time than the store's clock removes a record the store still
    sees as live: the store then reads the key as absent, never an error."""
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock, delete_retention_ms=0)
    store.put(b"k", BIG, ttl_ms=100, sync=True)
    store.put(b"s", b"small", ttl_ms=100, sync=True)
    later = clock.now_ms() + 200
    store.compact(force=True, now_ms=later)
    assert store.compact(force=True, now_ms=later).expired_removed == 2
    assert store.get(b"k") is None and b"k" not in store
    assert dict(store.scan()) == {b"s": b"small"}  # inline: its value is in the index entry
    assert store.check() == []
    store.close()


def test_store_clock_is_the_injected_clock(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock)
    assert store.clock is clock
    store.close()


def test_a_cache_of_the_layout_before_expiries_is_rebuilt(tmp_path: Path) -> None:
    """A cache of layout 2 (index entries without expiries, no ``expiries`` rows) is emptied when
    opened and rebuilt from storage: the rebuilt index hides the expired records and counts right."""
    from kvlog.index import encode_index_value
    from kvlog.meta.env import seal

    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock)
    store.put(b"k", b"v", ttl_ms=100)
    store.put(b"j", b"w", sync=True)
    store.log.settle_index()
    env = store.log.env

    def old_layout(txn: Any) -> None:
        dbs = env.dbs
        entry = store.log.snapshot(lambda r: r.index_get(b"k"))
        # What a cache of layout 2 holds: the entry without its expiry, no expiries rows.
        txn.put(b"k", encode_index_value(b"k", entry.partition, entry.offset, entry.inline), db=dbs["index"])
        txn.drop(dbs["expiries"], delete=False)
        txn.put(b"cache_layout", seal(b"cache_layout", b"2"), db=dbs["meta"])

    env.write(old_layout)
    store.close(flush=False)
    store = _open(tmp_path, clock)
    assert dict(store.scan()) == {b"j": b"w", b"k": b"v"} and len(store) == 2
    clock.advance(100)
    assert dict(store.scan()) == {b"j": b"w"} and len(store) == 1
    store.close()


def test_rows_of_replaced_expiring_entries_are_pruned_when_the_runs_settle(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock, index_run_limit=100)
    keys = [b"key-%05d" % i for i in range(1500)]
    with store.batch() as batch:
        for key in keys:
            batch.put(key, b"v", ttl_ms=1000)
    with store.batch() as batch:
        for key in keys[:1200]:
            batch.put(key, b"w")  # no expiry any more: their rows are stale
    env = store.log.env

    def rows() -> int:
        return int(store.log.snapshot(lambda r: r.txn.stat(env.dbs["expiries"])["entries"]))

    assert rows() == 1500
    store.log.settle_index()
    assert rows() == 300
    clock.advance(1000)
    assert len(store) == 1200
    store.close()


def test_settling_deletes_the_entries_of_expired_records(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock, index_run_limit=100)
    store.put(b"gone", b"v", ttl_ms=100, sync=True)
    store.put(b"later", b"v", ttl_ms=10_000, sync=True)
    clock.advance(100)
    store.put(b"new", b"v", sync=True)  # a run pending: the next settle runs
    store.log.settle_index()
    assert store.log.snapshot(lambda r: r._entry_at(b"gone")) is None  # the entry itself went
    assert store.log.snapshot(lambda r: r._entry_at(b"later")) is not None
    assert len(store) == 2 and dict(store.scan()) == {b"later": b"v", b"new": b"v"}
    assert store.get(b"gone") is None and store.check() == []
    assert [r.key for r in store.changes() if r.key == b"gone"] == [b"gone"]  # the log keeps it
    store.close()


@pytest.mark.parametrize("bit", range(8))
def test_a_flipped_bit_in_an_expiries_row_never_miscounts_len(tmp_path: Path, bit: int) -> None:
    # A row names an expiring entry by its expiry: one moved by damage would leave the entry
    # uncounted once it expires (len too high) unless the damage is found. The row is sealed, so
    # the check of a cache changed since its clean close finds it and the cache is rebuilt.
    clock = kvlog.ManualClock()
    store = _open(tmp_path, clock, index_run_limit=0)
    store.put(b"a", b"1", ttl_ms=100)
    store.put(b"b", b"2")
    store.flush()
    row = row_key(clock.now_ms() + 100, b"a")
    store.close()
    data = tmp_path / "cache" / "data.mdb"
    with open(data, "r+b") as f, mmap.mmap(f.fileno(), 0) as raw:
        at = raw.find(row)
        assert at >= 0 and raw.find(row, at + 1) < 0
        raw[at + 6] ^= 1 << bit  # inside the row's expiry
    store = _open(tmp_path, clock, index_run_limit=0)
    assert len(store) == len(list(store.scan())) == 2
    clock.advance(100)
    assert len(store) == len(list(store.scan())) == 1
    assert sum(1 for k in (b"a", b"b") if k in store) == 1
    store.close()
