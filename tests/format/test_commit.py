"""Commits: append, replace and producer entries of the commit log."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.errors import CorruptDataError
from kvlog.format import (
    COMMIT_KINDS,
    BatchEntry,
    BatchLocation,
    Commit,
    FileEntry,
    crc32c,
    decode_commit,
    decode_document,
    decode_offsets,
    encode_commit,
    encode_document,
    encode_offsets,
    file_from_json,
    file_to_json,
)

NAME = "log/00000000000000000007.json"
INT64 = st.integers(-(2**63), 2**63 - 1)
UINT = st.integers(0, 2**63 - 1)
U32 = st.integers(0, 2**32 - 1)
masks = st.integers(1, 255)
#: Ids and paths the metadata cache can key a row by: 1 to 511 bytes of UTF-8.
key_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)

locations = st.builds(
    BatchLocation,
    position=UINT, length=UINT, crc=U32, count=UINT, data_bytes=UINT,
    min_timestamp=INT64, max_timestamp=INT64,
)


@st.composite
def batch_entries(draw: st.DrawFn) -> BatchEntry:
    producer = draw(st.none() | st.tuples(UINT, st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1)))
    offsets = draw(st.none() | st.tuples(UINT, UINT))
    present = draw(st.none() | st.lists(st.integers(0, 2**20), max_size=20).map(encode_offsets))
    pid, epoch, seq = producer if producer is not None else (None, 0, 0)
    base, last = offsets if offsets is not None else (None, None)
    return BatchEntry(
        partition=draw(st.integers(0, 65535)),
        location=draw(locations),
        producer_id=pid,
        epoch=epoch,
        base_sequence=seq,
        base_offset=base,
        last_offset=last,
        present=present,
        tombstone_horizon_ms=draw(st.none() | INT64),
    )


file_entries = st.builds(
    FileEntry,
    file_id=key_text,
    path=key_text,
    level=st.integers(0, 4),
    size=UINT,
    crc=U32,
    batches=st.lists(batch_entries(), max_size=4).map(tuple),
)

json_values = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def commits(draw: st.DrawFn, kind: str | None = None) -> Commit:
    producer = draw(st.none() | st.tuples(UINT, st.none() | st.integers(0, 2**15 - 1)))
    pid, epoch = producer if producer is not None else (None, None)
    return Commit(
        version=draw(UINT),
        commit_id=draw(key_text),
        timestamp_ms=draw(INT64),
        kind=kind if kind is not None else draw(st.sampled_from(COMMIT_KINDS)),
        add=tuple(draw(st.lists(file_entries, max_size=3))),
        remove=tuple(draw(st.lists(key_text, max_size=3))),
        producer_id=pid,
        epoch=epoch,
        info=draw(st.dictionaries(st.text(max_size=8).filter(lambda k: k != "cleaner"), json_values,
                                  max_size=4)),
    )


def small_commit(**changes: Any) -> Commit:
    fields: dict[str, Any] = {
        "version": 3, "commit_id": "c3", "timestamp_ms": 1_700_000_000_000, "kind": "append",
        "add": (
            FileEntry(
                "f1", "data/0/f1.arrow", 0, 1234, 99,
                (BatchEntry(2, BatchLocation(312, 448, 7, 2, 18, -5, 9), producer_id=11, epoch=1),),
            ),
        ),
    }
    fields.update(changes)
    return Commit(**fields)


def reencode_body(data: bytes, change: Any) -> bytes:
    """The commit in ``data`` with its body changed by ``change`` and a valid envelope."""
    body = decode_document(NAME, data, "commit")
    change(body)
    return encode_document("commit", body)


# --- round trips --------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(commit=commits())
def test_commits_round_trip(commit: Commit) -> None:
    data = encode_commit(commit)
    assert decode_commit(NAME, data) == commit
    assert encode_commit(decode_commit(NAME, data)) == data  # deterministic bytes


@pytest.mark.parametrize("kind", COMMIT_KINDS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_every_kind_round_trips(kind: str, data: st.DataObject) -> None:
    commit = data.draw(commits(kind=kind))
    assert decode_commit(NAME, encode_commit(commit)) == commit


@settings(max_examples=60, deadline=None)
@given(entry=file_entries)
def test_file_entries_round_trip_through_json(entry: FileEntry) -> None:
    obj = file_to_json(entry)
    assert file_from_json(NAME, json.loads(json.dumps(obj))) == entry


def test_commit_kinds() -> None:
    assert COMMIT_KINDS == ("append", "replace", "producer", "gc", "offsets", "pin", "unpin")


def test_short_field_names_of_a_batch_entry() -> None:
    full = BatchEntry(
        partition=5, location=BatchLocation(100, 200, 300, 4, 50, -1, 8),
        producer_id=77, epoch=2, base_sequence=40, base_offset=1000, last_offset=1003,
        present=encode_offsets([0, 1, 3]), tombstone_horizon_ms=123,
    )
    obj = file_to_json(FileEntry("id", "data/1/id.arrow", 1, 10, 20, (full,)))
    assert obj == {
        "id": "id", "path": "data/1/id.arrow", "level": 1, "size": 10, "crc": 20,
        "batches": [{
            "p": 5, "pos": 100, "len": 200, "crc": 300, "n": 4, "bytes": 50, "ts": [-1, 8],
            "pid": 77, "epoch": 2, "seq": 40, "base": 1000, "last": 1003,
            "present": full.present, "horizon": 123,
        }],
    }
    assert list(decode_offsets(NAME, obj["batches"][0]["present"])) == [0, 1, 3]
    bare = BatchEntry(partition=0, location=BatchLocation(1, 2, 3, 4, 5, 6, 7))
    assert file_to_json(FileEntry("i", "p", 0, 1, 2, (bare,)))["batches"] == [
        {"p": 0, "pos": 1, "len": 2, "crc": 3, "n": 4, "bytes": 5, "ts": [6, 7]}
    ]


def test_commit_body_fields() -> None:
    body = decode_document(NAME, encode_commit(small_commit()), "commit")
    assert set(body) == {"version", "id", "ts", "kind", "add", "remove", "info"}
    producer = decode_document(
        NAME, encode_commit(small_commit(kind="producer", add=(), producer_id=9, epoch=4)), "commit"
    )
    assert (producer["pid"], producer["epoch"]) == (9, 4)


def test_an_append_commit_carries_no_offsets() -> None:
    # Offsets of appended batches are assigned by replay, never written.
    body = decode_document(NAME, encode_commit(small_commit()), "commit")
    (batch,) = body["add"][0]["batches"]
    assert "base" not in batch and "last" not in batch


# --- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["merge", "", "APPEND", "checkpoint"])
def test_unknown_commit_kind_is_refused(kind: str) -> None:
    with pytest.raises(ValueError, match="unknown commit kind"):
        encode_commit(small_commit(kind=kind))
    data = reencode_body(encode_commit(small_commit()), lambda body: body.update(kind=kind))
    with pytest.raises(CorruptDataError, match="unknown commit kind") as caught:
        decode_commit(NAME, data)
    assert caught.value.name == NAME


def test_missing_commit_kind_is_refused() -> None:
    data = reencode_body(encode_commit(small_commit()), lambda body: body.pop("kind"))
    with pytest.raises(CorruptDataError, match="unknown commit kind"):
        decode_commit(NAME, data)


@pytest.mark.parametrize("fmt", [0, 3, "1", None])
def test_unknown_format_version_is_refused(fmt: Any) -> None:
    data = encode_commit(small_commit())
    header_line, payload, _ = data.split(b"\n")
    header = json.loads(header_line)
    header["format"] = fmt
    damaged = json.dumps(header).encode() + b"\n" + payload + b"\n"
    with pytest.raises(CorruptDataError, match="unknown format version") as caught:
        decode_commit(NAME, damaged)
    assert caught.value.name == NAME


def test_another_kind_of_document_is_refused() -> None:
    data = encode_document("checkpoint", {"kind": "append", "add": [], "remove": [], "info": {}})
    with pytest.raises(CorruptDataError, match="not a kvlog commit"):
        decode_commit(NAME, data)


def _set_batch(key: str, value: Any) -> Any:
    def change(body: dict[str, Any]) -> None:
        body["add"][0]["batches"][0][key] = value
    return change


def _drop_batch(key: str) -> Any:
    def change(body: dict[str, Any]) -> None:
        del body["add"][0]["batches"][0][key]
    return change


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.pop("add"),
        lambda b: b.update(add={}),
        lambda b: b.update(remove="f1"),
        lambda b: b.update(remove=[1]),
        lambda b: b.update(info=[]),
        lambda b: b.update(id=5),
        lambda b: b.update(version="3"),
        lambda b: b.update(version=True),
        lambda b: b.update(ts=1.5),
        lambda b: b.update(pid="x"),
        lambda b: b["add"].append("f2"),
        lambda b: b["add"][0].pop("id"),
        lambda b: b["add"][0].update(path=None),
        lambda b: b["add"][0].update(batches={}),
        lambda b: b["add"][0].update(level=None),
        lambda b: b["add"][0]["batches"].append([1, 2]),
        _drop_batch("ts"),
        _set_batch("ts", [1]),
        _set_batch("ts", [1, "2"]),
        _drop_batch("p"),
        _set_batch("pos", 1.0),
        _set_batch("crc", None),
        _set_batch("present", 5),
        _set_batch("base", "0"),
        _set_batch("horizon", [1]),
        _set_batch("epoch", None),
    ],
)
def test_malformed_commit_bodies_are_corrupt(change: Any) -> None:
    data = reencode_body(encode_commit(small_commit()), change)
    with pytest.raises(CorruptDataError) as caught:
        decode_commit(NAME, data)
    assert caught.value.name == NAME


@settings(max_examples=60, deadline=None)
@given(body=st.dictionaries(st.sampled_from(["version", "id", "ts", "kind", "add", "remove", "info",
                                             "pid", "epoch"]), json_values))
def test_any_json_body_decodes_or_is_corrupt(body: dict[str, Any]) -> None:
    # A well-formed envelope around any JSON object never raises anything else.
    try:
        decode_commit(NAME, encode_document("commit", body))
    except CorruptDataError as e:
        assert e.name == NAME


# --- corruption ---------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(commit=commits(), mask=masks, name=st.text(min_size=1, max_size=30))
def test_any_flipped_byte_is_detected(commit: Commit, mask: int, name: str) -> None:
    data = encode_commit(commit)
    for index in range(len(data)):
        damaged = bytearray(data)
        damaged[index] ^= mask
        with pytest.raises(CorruptDataError) as caught:
            decode_commit(name, bytes(damaged))
        assert caught.value.name == name


@settings(max_examples=20, deadline=None)
@given(commit=commits(), name=st.text(min_size=1, max_size=30))
def test_any_truncation_is_detected(commit: Commit, name: str) -> None:
    data = encode_commit(commit)
    for length in range(len(data)):
        with pytest.raises(CorruptDataError) as caught:
            decode_commit(name, data[:length])
        assert caught.value.name == name


def test_a_flip_that_keeps_the_json_valid_is_caught_by_the_checksum() -> None:
    data = encode_commit(small_commit())
    damaged = data.replace(b'"p":2', b'"p":3')
    assert damaged != data
    header_line, payload, _ = damaged.split(b"\n")
    json.loads(payload)  # still valid JSON
    assert json.loads(header_line)["crc32c"] != crc32c(payload)
    with pytest.raises(CorruptDataError, match="checksum mismatch"):
        decode_commit(NAME, damaged)
