"""Bad input gets InvalidRecordError and changes nothing: a rejected batch is rejected whole (§10.8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.errors import InvalidRecordError, KvlogError
from kvlog.log import Log

PARTS = 4
MAX_KEY = 64
MAX_RECORD = 256
SETTINGS = {"max_key_bytes": MAX_KEY, "max_record_bytes": MAX_RECORD}


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for sub in ("log", "data") if (root / sub).is_dir()
                  for p in (root / sub).rglob("*") if p.is_file())


def _snapshot(the_log: Log, root: Path) -> tuple[Any, ...]:
    return (the_log.version, [the_log.end_offset(p) for p in range(PARTS)],
            [[(r.offset, r.key, r.value) for r in the_log.read(p)] for p in range(PARTS)], _files(root))


GOOD = (b"good", b"value")

BAD_BATCHES: dict[str, list[Any]] = {
    "none-key": [(None, b"v")],
    "empty-bytes-key": [(b"", b"v")],
    "empty-str-key": [("", b"v")],
    "int-key": [(5, b"v")],
    "float-key": [(1.5, b"v")],
    "bool-key": [(True, b"v")],
    "tuple-key": [((b"k",), b"v")],
    "int-value": [(b"k", 5)],
    "float-value": [(b"k", 1.5)],
    "list-value": [(b"k", [b"x"])],
    "dict-value": [(b"k", {"a": 1})],
    "bool-value": [(b"k", False)],
    "str-timestamp": [(b"k", b"v", "123")],
    "bool-timestamp": [(b"k", b"v", True)],
    "float-timestamp": [(b"k", b"v", 1.0)],
    "huge-timestamp": [(b"k", b"v", 2**63)],
    "one-field": [(b"k",)],
    "five-fields": [(b"k", b"v", 1, 2, 3)],
    "float-expiry": [(b"k", b"v", 1, 2.0)],
    "bool-expiry": [(b"k", b"v", 1, True)],
    "huge-expiry": [(b"k", b"v", 1, 2**63)],
    "lowest-expiry": [(b"k", b"v", 1, -(2**63))],
    "expiring-tombstone": [(b"k", None, 1, 2)],
    "bytes-not-a-record": [b"kv"],
    "dict-not-a-record": [{"key": b"k", "value": b"v"}],
    "empty-batch": [],
    "key-too-long": [(b"k" * (MAX_KEY + 1), b"v")],
    "record-too-large": [(b"k", b"v" * MAX_RECORD)],
    "str-record-too-large": [("ké", "é" * (MAX_RECORD // 2))],
    "good-then-bad": [GOOD, GOOD, (None, b"v")],
    "bad-then-good": [(b"", b"v"), GOOD],
    "good-then-oversize": [GOOD, (b"k", b"x" * (MAX_RECORD + 1))],
}


@pytest.fixture
def loaded(tmp_path: Path, make_log: Any) -> tuple[Log, Path, Any]:
    root = tmp_path / "root"
    the_log = make_log(root, tmp_path / "cache", **SETTINGS)
    producer = the_log.producer(3)
    producer.append(0, [GOOD], base_sequence=0)
    return the_log, root, producer


@pytest.mark.parametrize("name", list(BAD_BATCHES))
def test_a_bad_batch_is_rejected_whole_by_the_producer(loaded: tuple[Log, Path, Any], name: str) -> None:
    the_log, root, producer = loaded
    before = _snapshot(the_log, root)
    with pytest.raises(InvalidRecordError) as info:
        producer.append(0, BAD_BATCHES[name], base_sequence=1)
    assert isinstance(info.value, ValueError) and isinstance(info.value, KvlogError)
    assert _snapshot(the_log, root) == before  # no offsets, no commit, no data file
    # The producer goes on at the sequence it would have used: nothing was consumed.
    assert producer.append(0, [GOOD], base_sequence=1).base_offset == 1


def test_the_limits_are_inclusive(loaded: tuple[Log, Path, Any]) -> None:
    the_log, _root, producer = loaded
    producer.append(1, [(b"k" * MAX_KEY, b"")], base_sequence=0)
    producer.append(1, [(b"k", b"v" * (MAX_RECORD - 1))], base_sequence=1)
    producer.append(1, [(b"k" * MAX_KEY, None)], base_sequence=2)  # a tombstone carries no value
    assert the_log.end_offset(1) == 3


@pytest.mark.parametrize("partition", [-1, PARTS, 2**16, "0", 1.0, True, None])
def test_a_partition_out_of_range_is_rejected(loaded: tuple[Log, Path, Any], partition: Any) -> None:
    the_log, root, producer = loaded
    before = _snapshot(the_log, root)
    with pytest.raises(InvalidRecordError):
        producer.append(partition, [GOOD], base_sequence=0)
    for read in (the_log.end_offset, the_log.start_offset, lambda p: list(the_log.read(p))):
        with pytest.raises(InvalidRecordError):
            read(partition)
    assert _snapshot(the_log, root) == before


def test_bad_read_bounds_and_producer_ids_are_rejected(loaded: tuple[Log, Path, Any]) -> None:
    the_log, root, _producer = loaded
    before = _snapshot(the_log, root)
    with pytest.raises(InvalidRecordError):
        list(the_log.read(0, -1))
    for pid in (-1, 2**63, "7", 1.0, True):
        with pytest.raises(InvalidRecordError):
            the_log.producer(pid)
    assert _snapshot(the_log, root) == before


# ---------------------------------------------------------------------------------------------
# Through the Store
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path: Path) -> Any:
    with kvlog.open(tmp_path / "store", partitions=PARTS, flush_interval_ms=0, background_compaction=False,
                    **SETTINGS) as s:
        s.put("kept", "value", sync=True)
        yield s


def _store_state(s: Any, root: Path) -> tuple[Any, ...]:
    s.flush()
    return (s.log.version, [s.log.end_offset(p) for p in range(PARTS)], list(s.scan()), len(s), _files(root))


BAD_CALLS: dict[str, Any] = {
    "put-none-key": lambda s: s.put(None, "v"),
    "put-empty-key": lambda s: s.put(b"", "v"),
    "put-int-key": lambda s: s.put(5, "v"),
    "put-int-value": lambda s: s.put("k", 5),
    "put-none-value": lambda s: s.put("k", None),
    "put-list-value": lambda s: s.put("k", ["v"]),
    "put-key-too-long": lambda s: s.put("k" * (MAX_KEY + 1), "v"),
    "put-record-too-large": lambda s: s.put("k", "v" * MAX_RECORD),
    "put-sync-too-large": lambda s: s.put("k", "v" * MAX_RECORD, sync=True),
    "delete-none-key": lambda s: s.delete(None),
    "delete-empty-key": lambda s: s.delete(""),
    "delete-float-key": lambda s: s.delete(2.5),
    "setitem-int-key": lambda s: s.__setitem__(1, "v"),
    "get-none-key": lambda s: s.get(None),
    "get-int-key": lambda s: s.get(7),
    "scan-int-bound": lambda s: list(s.scan(start=3)),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_store_calls_raise_and_change_nothing(store: Any, tmp_path: Path, name: str) -> None:
    root = tmp_path / "store"
    before = _store_state(store, root)
    with pytest.raises(InvalidRecordError):
        BAD_CALLS[name](store)
    assert _store_state(store, root) == before
    assert store.stats()["unflushed_bytes"] == 0


def test_a_write_batch_with_a_bad_record_writes_nothing(store: Any, tmp_path: Path) -> None:
    root = tmp_path / "store"
    before = _store_state(store, root)
    with pytest.raises(InvalidRecordError):
        with store.batch() as batch:
            batch.put("a", "1")
            batch.delete("kept")
            batch.put("b", 2)
    assert _store_state(store, root) == before
    assert store.get("a") is None and store.get("kept") == b"value"


def test_a_refused_record_is_not_added_and_the_rest_of_the_batch_commits(store: Any, tmp_path: Path) -> None:
    """A caller that catches a refused record inside ``with store.batch()`` keeps the rest of
    the batch: the refused record changes nothing, the others commit on exit."""
    with store.batch() as batch:
        batch.put("a", "1")
        with pytest.raises(InvalidRecordError):
            batch.put(None, "2")
        with pytest.raises(InvalidRecordError):
            batch.put("c", b"x" * MAX_RECORD)
        with pytest.raises(InvalidRecordError):
            batch.put("e", "\ud800")
        batch.put("d", "4")
        assert len(batch) == 2
    assert store.get("a") == b"1" and store.get("d") == b"4"
    assert store.get("c") is None and store.get("e") is None
    reopened = kvlog.open(tmp_path / "store", read_only=True, cache_dir=tmp_path / "fresh-cache")
    try:
        assert reopened.get("a") == b"1" and reopened.get("d") == b"4"
    finally:
        reopened.close()
