"""A commit that carries a small flush's data file inside itself (format 2 of the envelope)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.errors import CorruptDataError, InvalidRecordError
from kvlog.format import (
    BatchEntry,
    Commit,
    DataFileWriter,
    FileEntry,
    crc32c,
    decode_batch,
    decode_commit,
    decode_document,
    encode_commit,
    encode_document,
    make_record_batch,
)
from kvlog.format.commit import attached_bytes
from kvlog.format.envelope import split_document

NAME = "log/00000000000000000007.json"


def inline_commit(rows: list[list[tuple[bytes, bytes | None]]], kind: str = "append") -> Commit:
    """An append commit carrying one data file of ``rows`` (one batch per list, partition i)."""
    writer = DataFileWriter("zstd")
    for batch in rows:
        writer.add(make_record_batch([k for k, _ in batch], [v for _, v in batch], [1] * len(batch)))
    data, locations = writer.finish()
    entries = tuple(BatchEntry(partition=i, location=loc, producer_id=7, base_sequence=3 * i)
                    for i, loc in enumerate(locations))
    entry = FileEntry("f1", NAME, 0, len(data), crc32c(data), entries)
    other = FileEntry("f2", "data/0/f2.arrow", 0, 10, 5, ())
    return Commit(7, "c1", 1000, kind, add=(entry, other), previous_id="c0", attached=data)


def test_a_decoded_inline_file_is_the_first_added_file_read_in_the_commit_object() -> None:
    rows = [[(b"a", b"1"), (b"b", None)], [(b"c", b"3")]]
    commit = inline_commit(rows)
    data = encode_commit(commit)
    decoded = decode_commit(NAME, data)
    entry = decoded.add[0]
    assert (entry.file_id, entry.path, entry.size, entry.crc) == ("f1", NAME, commit.add[0].size, commit.add[0].crc)
    assert decoded.add[1] == commit.add[1]
    assert (decoded.commit_id, decoded.previous_id, decoded.version) == ("c1", "c0", 7)
    _body, start = split_document(NAME, data, "commit")
    assert bytes(attached_bytes(NAME, data)) == bytes(commit.attached or b"")
    for batch, original, want in zip(entry.batches, commit.add[0].batches, rows, strict=True):
        loc = batch.location
        assert loc.position == original.location.position + start  # counted from the object's start
        records = decode_batch(NAME, data[loc.position:loc.position + loc.length], loc)
        assert list(zip(records.column("key").to_pylist(), records.column("value").to_pylist(),
                        strict=True)) == want
        assert (batch.producer_id, batch.base_sequence) == (original.producer_id, original.base_sequence)


def test_the_header_says_format_2_and_how_many_bytes_are_attached() -> None:
    commit = inline_commit([[(b"k", b"v")]])
    data = encode_commit(commit)
    header = json.loads(data.split(b"\n", 1)[0])
    assert list(header) == ["kvlog", "format", "length", "crc32c", "data"]
    assert header["format"] == 2 and header["data"] == commit.add[0].size
    assert data.endswith(bytes(commit.attached or b""))


def test_a_commit_without_attached_bytes_keeps_format_1() -> None:
    data = encode_commit(Commit(3, "c", 1, "offsets", info={"group": "g", "offsets": {}}))
    assert json.loads(data.split(b"\n", 1)[0])["format"] == 1


@settings(max_examples=40, deadline=None)
@given(index=st.integers(0, 10**6), mask=st.integers(1, 255))
def test_any_damaged_attached_byte_is_refused_when_the_commit_is_read(index: int, mask: int) -> None:
    data = encode_commit(inline_commit([[(b"key", b"value" * 10)]]))
    _body, start = split_document(NAME, data, "commit")
    at = start + index % (len(data) - start)
    damaged = data[:at] + bytes([data[at] ^ mask]) + data[at + 1:]
    with pytest.raises(CorruptDataError, match="inline file fails its size or checksum") as caught:
        decode_commit(NAME, damaged)
    assert caught.value.name == NAME


@pytest.mark.parametrize("cut", [1, 100])
def test_truncated_or_padded_attached_bytes_are_refused(cut: int) -> None:
    data = encode_commit(inline_commit([[(b"key", b"value")]]))
    for damaged in (data[:-cut], data + b"\x00" * cut):
        with pytest.raises(CorruptDataError, match="truncated or padded"):
            decode_commit(NAME, damaged)


def test_format_2_without_the_attached_length_is_refused() -> None:
    data = encode_commit(inline_commit([[(b"key", b"value")]]))
    header_line, rest = data.split(b"\n", 1)
    header = json.loads(header_line)
    del header["data"]
    with pytest.raises(CorruptDataError, match="length of its attached bytes"):
        decode_commit(NAME, json.dumps(header).encode() + b"\n" + rest)


def test_attached_bytes_without_an_inline_file_are_refused() -> None:
    body = {"version": 7, "id": "c", "ts": 1, "kind": "append", "add": [], "remove": [], "info": {}}
    with pytest.raises(CorruptDataError, match="attached bytes without the inline file"):
        decode_commit(NAME, encode_document("commit", body, b"stray bytes"))


def test_an_inline_batch_outside_the_attached_bytes_is_refused() -> None:
    commit = inline_commit([[(b"key", b"value")]])
    data = encode_commit(commit)
    _header, body_line, _rest = data.split(b"\n", 2)
    body = json.loads(body_line)
    body["inline"]["batches"][0]["pos"] = commit.add[0].size
    attached = bytes(commit.attached or b"")
    with pytest.raises(CorruptDataError, match="outside the attached bytes"):
        decode_commit(NAME, encode_document("commit", body, attached))


@pytest.mark.parametrize("kind", ["replace", "producer", "gc", "offsets"])
def test_only_an_append_carries_an_inline_file(kind: str) -> None:
    commit = inline_commit([[(b"key", b"value")]], kind=kind)
    with pytest.raises(InvalidRecordError, match="only an append commit"):
        encode_commit(commit)
    data = encode_commit(replace(commit, kind="append"))
    _header, body_line, _rest = data.split(b"\n", 2)
    body = json.loads(body_line)
    body["kind"] = kind
    with pytest.raises(CorruptDataError, match="malformed inline file"):
        decode_commit(NAME, encode_document("commit", body, attached_bytes(NAME, data)))


def test_attached_bytes_that_are_not_the_first_files_bytes_are_not_written() -> None:
    commit = inline_commit([[(b"key", b"value")]])
    with pytest.raises(InvalidRecordError):
        encode_commit(replace(commit, attached=bytes(commit.attached or b"") + b"x"))


@pytest.mark.parametrize("kind", ["identity", "checkpoint"])
def test_other_documents_carry_no_attached_bytes(kind: str) -> None:
    with pytest.raises(CorruptDataError, match="unknown format version 2"):
        decode_document("x", encode_document(kind, {"a": 1}, b"data"), kind)
