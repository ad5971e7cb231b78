"""The Store API of docs/api.rst, method by method, on local disk and (where marked) on SeaweedFS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH, Root

import kvlog
from kvlog.errors import (
    ConfigError,
    InvalidRecordError,
    KvlogError,
    ProducerFencedError,
    ReadOnlyError,
    StoreClosedError,
    StoreNotFoundError,
)

# -- basic reads and writes -----------------------------------------------------------------------


def test_put_get_delete(root: Root, opened: list[Any]) -> None:
    store = root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    assert store.get(b"a") is None
    assert store.get(b"a", b"dflt") == b"dflt"
    assert store.get(b"a", 7) == 7
    store.put(b"a", b"1")
    store.put(b"b", b"")  # an empty value is a value, not a delete
    assert store.get(b"a") == b"1"
    assert store.get(b"b") == b""
    assert b"b" in store
    store.put(b"a", b"2")
    assert store.get(b"a") == b"2"
    store.delete(b"a")
    assert store.get(b"a") is None
    store.delete(b"never-written")  # deleting a missing key is not an error
    assert store.get(b"never-written") is None
    store.flush()
    assert store.get(b"a") is None and store.get(b"b") == b""
    assert list(store.scan()) == [(b"b", b"")]
    store.close()
    again = root.open()
    opened.append(again)
    assert list(again.scan()) == [(b"b", b"")]


def test_str_keys_and_values_are_utf8(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    store.put("clé", "välue")
    assert store.get("clé") == "välue".encode()
    assert store.get("clé".encode()) == "välue".encode()
    assert store["clé".encode()] == "välue".encode()
    store.put(bytearray(b"ba"), bytearray(b"x"))
    store.put(memoryview(b"mv"), memoryview(b"y"))
    assert store.get(b"ba") == b"x" and store.get(memoryview(b"mv")) == b"y"
    store.flush()
    assert list(store.scan()) == [(b"ba", b"x"), ("clé".encode(), "välue".encode()), (b"mv", b"y")]
    assert list(store.scan(prefix="cl")) == [("clé".encode(), "välue".encode())]
    assert list(store.scan(start="c", stop="m")) == [("clé".encode(), "välue".encode())]
    store.delete("clé")
    assert "clé" not in store and store.get("clé".encode()) is None


def test_dict_protocol(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    with pytest.raises(KeyError):
        store[b"missing"]
    with pytest.raises(KeyError):
        del store[b"missing"]
    store[b"k2"] = b"v2"
    store["k1"] = "v1"
    store[b"k3"] = b"v3"
    assert store[b"k1"] == b"v1" and store["k2"] == b"v2"
    assert b"k1" in store and "k3" in store and b"k4" not in store
    assert 5 not in store and None not in store  # like a dict: a key of another type is absent
    assert len(store) == 3
    assert list(store) == [b"k1", b"k2", b"k3"]
    del store[b"k2"]
    assert b"k2" not in store and len(store) == 2
    with pytest.raises(KeyError):
        store[b"k2"]
    with pytest.raises(KeyError):
        del store[b"k2"]
    store.flush()
    assert len(store) == 2 and list(store) == [b"k1", b"k3"]
    del store[b"k1"]  # a delete of a flushed key, unflushed: len and iteration see it
    assert len(store) == 1 and list(store) == [b"k3"]
    store[b"k1"] = b"again"
    assert len(store) == 2 and list(store) == [b"k1", b"k3"]


def test_scan_bounds_prefix_reverse(root: Root, opened: list[Any]) -> None:
    store = root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    model = {b"a": b"1", b"ab": b"2", b"abc": b"3", b"b": b"4", b"b\xff": b"5", b"c": b"6"}
    for i, (k, v) in enumerate(model.items()):
        store.put(k, v)
        if i == 2:
            store.flush()  # half in the index, half in the memtable
    items = sorted(model.items())
    assert list(store.scan()) == items
    assert list(store.scan(reverse=True)) == items[::-1]
    assert list(store.scan(b"ab", b"b\xff")) == [(b"ab", b"2"), (b"abc", b"3"), (b"b", b"4")]
    assert list(store.scan(b"ab", b"b\xff", reverse=True)) == [(b"b", b"4"), (b"abc", b"3"), (b"ab", b"2")]
    assert list(store.scan(prefix=b"ab")) == [(b"ab", b"2"), (b"abc", b"3")]
    assert list(store.scan(prefix=b"b")) == [(b"b", b"4"), (b"b\xff", b"5")]
    assert list(store.scan(prefix=b"b\xff", reverse=True)) == [(b"b\xff", b"5")]
    assert list(store.scan(start=b"abc", prefix=b"a")) == [(b"abc", b"3")]
    assert list(store.scan(b"c", b"a")) == []
    assert list(store.scan(prefix=b"zz")) == []


def test_scan_is_one_snapshot(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    for i in range(10):
        store.put(b"k%d" % i, b"old")
    store.flush()
    it = store.scan()
    first = next(it)
    for i in range(10):
        store.put(b"k%d" % i, b"new")
    store.put(b"k55", b"new")
    store.flush()
    rest = list(it)
    assert [first, *rest] == [(b"k%d" % i, b"old") for i in range(10)]


# -- durability ------------------------------------------------------------------------------------


def test_sync_put_is_durable_at_once(root: Root, opened: list[Any]) -> None:
    store = root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    version = store.log.version
    store.put(b"lazy", b"1")
    store.put(b"synced", b"2", sync=True)
    store.put(b"after", b"3")
    assert store.log.version == version + 1
    reader.refresh()
    # The sync write made it and every earlier write durable; the later one is not.
    assert dict(reader.scan()) == {b"lazy": b"1", b"synced": b"2"}
    store.delete(b"lazy", sync=True)
    reader.refresh()
    assert dict(reader.scan()) == {b"synced": b"2", b"after": b"3"}
    store.put(b"lost", b"4")
    store.close(flush=False)
    again = root.open(**EXPLICIT_FLUSH)
    opened.append(again)
    assert dict(again.scan()) == {b"synced": b"2", b"after": b"3"}


def test_flush_returns_the_commit_version(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    v0 = store.flush()
    assert v0 == store.log.version == store.stats()["version"]
    assert store.flush() == v0  # nothing to flush: no commit (an idle store writes no commits)
    store.put(b"a", b"1")
    v1 = store.flush()
    assert v1 == v0 + 1
    store.put(b"b", b"2")
    store.put(b"c", b"3")
    assert store.flush() == v1 + 1  # one group commit for both


def test_close_flushes_and_context_manager(root: Root, opened: list[Any]) -> None:
    with root.open(**EXPLICIT_FLUSH) as store:
        store.put(b"a", b"1")
        assert "open" in repr(store)
    assert "closed" in repr(store)
    with pytest.raises(StoreClosedError):
        store.get(b"a")
    store.close()  # closing twice is harmless
    with root.open(**EXPLICIT_FLUSH) as again:
        assert again.get(b"a") == b"1"
        again.put(b"b", b"2")
        with pytest.raises(RuntimeError):
            with again.batch() as b:
                b.put(b"c", b"3")
                raise RuntimeError("boom")
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    assert dict(reader.scan()) == {b"a": b"1", b"b": b"2"}


# -- batches ---------------------------------------------------------------------------------------


def test_batch_is_atomic_and_durable_on_exit(root: Root, opened: list[Any]) -> None:
    store = root.open(partitions=4, **EXPLICIT_FLUSH)
    opened.append(store)
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    store.put(b"gone", b"x", sync=True)
    keys = [b"key-%03d" % i for i in range(40)]
    assert len({store.log.partition_for(k) for k in keys}) == 4  # the batch spans every partition
    version = store.log.version
    with store.batch() as b:
        for k in keys:
            b.put(k, k + b"-value")
        b.delete(b"gone")
        reader.refresh()
        assert reader.get(b"gone") == b"x" and reader.get(keys[0]) is None  # nothing before exit
    assert store.log.version == version + 1  # one commit
    reader.refresh()
    assert dict(reader.scan()) == {k: k + b"-value" for k in keys}
    store.close(flush=False)  # a crash right after the batch: it is durable
    again = root.open(**EXPLICIT_FLUSH)
    opened.append(again)
    assert dict(again.scan()) == {k: k + b"-value" for k in keys}


def test_batch_exception_writes_nothing(root: Root, opened: list[Any]) -> None:
    store = root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    store.put(b"keep", b"1", sync=True)
    before = (list(store.scan()), len(store), store.log.version)
    with pytest.raises(ZeroDivisionError):
        with store.batch() as b:
            b.put(b"x", b"1")
            b.delete(b"keep")
            _ = 1 / 0
    assert (list(store.scan()), len(store), store.log.version) == before
    assert store.get(b"x") is None and store.get(b"keep") == b"1"
    with pytest.raises(StoreClosedError):
        b.put(b"late", b"1")  # a finished batch takes no more writes
    # A bad record inside the batch rejects the whole batch when its error leaves the block.
    with pytest.raises(InvalidRecordError):
        with store.batch() as b:
            b.put(b"y", b"1")
            b.put(b"", b"empty key")
    assert store.flush() == before[2]
    assert (list(store.scan()), len(store), store.log.version) == before
    store.close()
    again = root.open(**EXPLICIT_FLUSH)
    opened.append(again)
    assert list(again.scan()) == before[0]


def test_empty_batch_writes_nothing(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    version = store.log.version
    with store.batch() as b:
        assert len(b) == 0
    assert store.log.version == version


# -- the changelog ---------------------------------------------------------------------------------


def test_changes_in_offset_order_partition_by_partition(root: Root, opened: list[Any]) -> None:
    clock = kvlog.ManualClock(1_800_000_000_000)
    store = root.open(partitions=3, clock=clock, **EXPLICIT_FLUSH)
    opened.append(store)
    written: list[tuple[bytes, bytes | None, int]] = []
    for i in range(30):
        key = b"k%d" % (i % 12)
        clock.advance(5)
        if i % 7 == 6:
            store.delete(key)
            written.append((key, None, clock.now_ms()))
        else:
            store.put(key, b"v%d" % i)
            written.append((key, b"v%d" % i, clock.now_ms()))
        if i % 5 == 4:
            store.flush()
    store.put(b"unflushed", b"x")
    assert all(r.key != b"unflushed" for r in store.changes())  # the changelog is durable records only
    store.flush()
    written.append((b"unflushed", b"x", clock.now_ms()))
    records = list(store.changes())
    assert all(isinstance(r, kvlog.Record) for r in records)
    assert [r.partition for r in records] == sorted(r.partition for r in records)
    for p in range(3):
        mine = [r for r in records if r.partition == p]
        assert [r.offset for r in mine] == list(range(len(mine)))
        assert list(store.changes(p)) == mine
        assert list(store.changes(partition=p, from_offset=2)) == mine[2:]
        expected = [(k, v, t) for k, v, t in written if store.log.partition_for(k) == p]
        assert [(r.key, r.value, r.timestamp_ms) for r in mine] == expected
        assert [r.is_tombstone for r in mine] == [v is None for _k, v, _t in expected]
        assert store.log.end_offset(p) == len(mine)
    assert len(records) == len(written)
    assert list(store.changes(from_offset=10**6)) == []


# -- compaction ------------------------------------------------------------------------------------


def test_compact_keeps_the_latest_value_of_every_key(root: Root, opened: list[Any]) -> None:
    store = root.open(partitions=2, offset_map_bytes=1 << 20, **EXPLICIT_FLUSH)
    opened.append(store)
    for round_ in range(4):
        for i in range(20):
            store.put(b"k%02d" % i, b"r%d" % round_)
        store.flush()
    store.delete(b"k00")
    store.flush()
    before = list(store.scan())
    latest = {(r.partition, r.key): r.offset for r in store.changes()}
    report = store.compact(force=True)
    assert isinstance(report, kvlog.CompactionReport)
    for name in ("rounds", "partial", "records_read", "records_written", "records_removed",
                 "tombstones_removed", "bytes_read", "bytes_written", "files_in", "files_out",
                 "map_capacity", "checkpoints", "duration_s"):
        assert hasattr(report, name), name
    assert report.rounds >= 1 and report.partial is False
    assert report.records_removed >= 3 * 20 - 1  # three superseded rounds; k00's tombstone stays
    assert report.records_read == report.records_written + report.records_removed
    assert report.files_in >= 5 and report.files_out >= 1 and report.map_capacity > 0
    assert list(store.scan()) == before
    records = list(store.changes())
    # The survivors are exactly the latest record of each key, at their original offsets.
    assert {(r.partition, r.key): r.offset for r in records} == latest
    assert [r.value for r in records if r.key == b"k00"] == [None]
    assert store.check() == []
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    assert list(reader.scan()) == before
    with pytest.raises(ReadOnlyError):
        reader.compact()


# -- statistics ------------------------------------------------------------------------------------


def test_stats_fields(root: Root, opened: list[Any]) -> None:
    store = root.open(partitions=2, **EXPLICIT_FLUSH)
    opened.append(store)
    for i in range(10):
        store.put(b"k%d" % i, b"v" * 2000)
    store.delete(b"k0")
    store.flush()
    store.put(b"pending", b"x")
    stats = store.stats()
    assert stats["partitions"] == 2
    assert stats["version"] == store.log.version
    assert stats["live_keys"] == 9
    assert stats["records"] == 11
    assert stats["files"] == 1 and stats["file_bytes"] > 0
    assert stats["levels"]["0"]["files"] == 1
    assert len(stats["partition_stats"]) == 2
    assert sum(p["records"] for p in stats["partition_stats"]) == 11
    assert [p["end_offset"] for p in stats["partition_stats"]] == [store.log.end_offset(p) for p in range(2)]
    assert stats["memtable_keys"] == 1
    assert stats["unflushed_bytes"] > 0
    assert stats["flushes"] == 1
    assert stats["flush_error"] is None
    assert stats["read_only"] is False
    assert isinstance(stats["producer_id"], int) and isinstance(stats["producer_epoch"], int)
    store.flush()
    after = store.stats()
    assert after["unflushed_bytes"] == 0 and after["memtable_keys"] == 0 and after["flushes"] == 2
    assert after["live_keys"] == 10 and after["records"] == 12
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    ro = reader.stats()
    assert ro["read_only"] is True and ro["producer_id"] is None and ro["live_keys"] == 10
    if root.storage_options:  # credentials never appear in stats or repr (they never leave the process)
        secret = str(root.storage_options["secret_key"])
        assert secret not in repr(after) and secret not in repr(store) and secret not in repr(ro)


def test_log_property(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(partitions=5, **EXPLICIT_FLUSH)
    opened.append(store)
    assert isinstance(store.log, kvlog.Log)
    assert store.log.partitions == 5
    assert 0 <= store.log.partition_for(b"x") < 5
    assert store.log.partition_for("x") == store.log.partition_for(b"x")


# -- read-only and closed stores -------------------------------------------------------------------


def test_read_only_store_refuses_writes(root: Root, opened: list[Any]) -> None:
    with root.open(**EXPLICIT_FLUSH) as store:
        store.put(b"a", b"1")
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    version = reader.log.version
    for write in (
        lambda: reader.put(b"a", b"2"),
        lambda: reader.put(b"b", b"2", sync=True),
        lambda: reader.delete(b"a"),
        lambda: reader.__setitem__(b"a", b"2"),
        lambda: reader.__delitem__(b"a"),
        lambda: reader.batch(),
    ):
        with pytest.raises(ReadOnlyError):
            write()
    assert reader.get(b"a") == b"1" and len(reader) == 1 and reader[b"a"] == b"1"
    assert reader.log.version == version
    assert reader.flush() == version  # nothing to make durable
    assert reader.check() == []


def test_read_only_open_of_a_missing_store(root: Root) -> None:
    with pytest.raises(StoreNotFoundError):
        root.open(read_only=True)


def test_closed_store_raises(root: Root) -> None:
    store = root.open(**EXPLICIT_FLUSH)
    store.put(b"a", b"1")
    store.close()
    calls = [
        lambda: store.get(b"a"),
        lambda: store.put(b"a", b"2"),
        lambda: store.delete(b"a"),
        lambda: store[b"a"],
        lambda: store.__setitem__(b"a", b"2"),
        lambda: store.__delitem__(b"a"),
        lambda: b"a" in store,
        lambda: len(store),
        lambda: list(store),
        lambda: store.scan(),
        lambda: store.batch(),
        lambda: store.flush(),
        lambda: store.refresh(),
        lambda: store.changes(),
        lambda: store.check(),
        lambda: store.stats(),
        lambda: store.compact(),
    ]
    for call in calls:
        with pytest.raises(StoreClosedError):
            call()


# -- opening ---------------------------------------------------------------------------------------


def test_reopen_with_other_partitions_is_config_error(root: Root) -> None:
    with root.open(partitions=4, **EXPLICIT_FLUSH) as store:
        store.put(b"a", b"1")
    with pytest.raises(ConfigError):
        root.open(partitions=8)
    with root.open() as store:  # no partitions given: the store's own
        assert store.log.partitions == 4 and store.get(b"a") == b"1"
    with root.open(partitions=4) as store:
        assert store.log.partitions == 4


def test_create_false_on_a_missing_store(root: Root) -> None:
    with pytest.raises(StoreNotFoundError):
        root.open(create=False)
    with root.open(**EXPLICIT_FLUSH) as store:
        store.put(b"a", b"1")
    with root.open(create=False) as store:
        assert store.get(b"a") == b"1"


@pytest.mark.parametrize(
    "settings",
    [
        {"no_such_setting": 1},
        {"flush_interval_ms": -1},
        {"partitions": 0},
        {"compression": "gzip"},
        {"max_key_bytes": 0},
        {"background_compaction": "yes"},
    ],
)
def test_bad_settings_are_config_errors(local_root: Root, settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        local_root.open(**settings)
    assert not Path(local_root.uri, "kvlog.json").exists()  # nothing was created


def test_config_object_is_equivalent_to_keywords(local_root: Root, opened: list[Any]) -> None:
    config = kvlog.StoreConfig(partitions=3, flush_interval_ms=0, max_key_bytes=100)
    store = local_root.open(config=config)
    opened.append(store)
    assert store.log.partitions == 3 and store.config.max_key_bytes == 100
    with pytest.raises(InvalidRecordError):
        store.put(b"k" * 101, b"v")


# -- several handles -------------------------------------------------------------------------------


def test_second_default_writer_fences_nobody(root: Root, opened: list[Any]) -> None:
    first = root.open(**EXPLICIT_FLUSH)
    opened.append(first)
    first.put(b"a", b"1", sync=True)
    first.put(b"b", b"2")
    second = root.open(**EXPLICIT_FLUSH)  # same cache, no producer_id: a producer of its own
    opened.append(second)
    assert second.stats()["producer_id"] != first.stats()["producer_id"]
    assert first.stats()["producer_epoch"] == second.stats()["producer_epoch"] == 0
    second.put(b"d", b"4", sync=True)
    first.put(b"c", b"3", sync=True)  # the first keeps writing: nothing fenced it
    first.close()
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    assert dict(reader.scan()) == {b"a": b"1", b"b": b"2", b"c": b"3", b"d": b"4"}
    assert second.check() == []


def test_reused_producer_id_fences_the_earlier_holder(root: Root, opened: list[Any]) -> None:
    first = root.open(producer_id=41, **EXPLICIT_FLUSH)
    opened.append(first)
    first.put(b"a", b"1", sync=True)
    first.put(b"b", b"2")
    second = root.open(producer_id=41, **EXPLICIT_FLUSH)  # the same identity: the next epoch
    opened.append(second)
    assert second.stats()["producer_id"] == first.stats()["producer_id"] == 41
    assert second.stats()["producer_epoch"] > first.stats()["producer_epoch"]
    with pytest.raises(ProducerFencedError) as fenced:
        first.flush()
    # The error names what fenced the handle and how to run several writers.
    assert "producer 41 epoch 0 is older than the current epoch 1" in str(fenced.value)
    assert "without producer_id" in str(fenced.value) and "producer_id of its own" in str(fenced.value)
    with pytest.raises(ProducerFencedError):
        first.put(b"c", b"3", sync=True)
    assert first.stats()["flush_error"] is not None
    second.put(b"d", b"4", sync=True)
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    assert dict(reader.scan()) == {b"a": b"1", b"d": b"4"}  # nothing of the fenced writer's after fencing
    assert second.check() == []


def test_refresh_follows_another_writer(root: Root, opened: list[Any]) -> None:
    mine = root.open(**EXPLICIT_FLUSH)
    opened.append(mine)
    theirs = root.open(cache="theirs", **EXPLICIT_FLUSH)  # another process: its own cache and producer
    opened.append(theirs)
    assert theirs.stats()["producer_id"] != mine.stats()["producer_id"]
    mine.put(b"mine", b"1", sync=True)
    theirs.put(b"theirs", b"2")
    theirs.put(b"shared", b"from-them")
    version = theirs.flush()
    assert mine.refresh() == version
    assert mine.get(b"theirs") == b"2" and mine.get(b"mine") == b"1"
    assert dict(mine.scan()) == {b"mine": b"1", b"shared": b"from-them", b"theirs": b"2"}
    theirs.delete(b"theirs", sync=True)
    mine.refresh()
    assert b"theirs" not in mine and len(mine) == 2
    mine.put(b"shared", b"from-me", sync=True)  # both keep writing: neither is fenced
    theirs.refresh()
    assert theirs.get(b"shared") == b"from-me"
    assert mine.check() == [] and theirs.check() == []


def test_errors_are_kvlog_errors() -> None:
    for kind in (ConfigError, InvalidRecordError, ProducerFencedError, ReadOnlyError,
                 StoreClosedError, StoreNotFoundError):
        assert issubclass(kind, KvlogError) and getattr(kvlog, kind.__name__) is kind
    assert issubclass(InvalidRecordError, ValueError)
