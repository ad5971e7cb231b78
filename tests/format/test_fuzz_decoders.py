"""Malformed input to every decoder: random bytes, truncations and bit flips of valid encodings.

A decoder either returns a value or raises ``CorruptDataError`` naming the object; never another
exception type, and never a crash. Data files, commits and checkpoints are checksummed, so
most damage stops at the checksum; the cases that give damaged bytes a matching checksum
(as a collision would) reach the parsers behind it. The index-value decoder must refuse every
flipped bit (CRC32C detects all of them). Examples are few, so the file runs in seconds;
``KVLOG_FUZZ_EXAMPLES=5000`` fuzzes longer.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlog.errors import CorruptDataError
from kvlog.format import (
    BatchEntry,
    BatchLocation,
    Commit,
    DataFileWriter,
    FileEntry,
    Identity,
    crc32c,
    decode_batch,
    decode_commit,
    decode_document,
    decode_identity,
    decode_offsets,
    encode_commit,
    encode_document,
    encode_identity,
    encode_offsets,
    make_record_batch,
    read_data_file,
)
from kvlog.index.entry import decode_index_value, encode_index_value

#: Each test runs against the C extensions and against their Python twins.
pytestmark = pytest.mark.usefixtures("native")

NAME = "fuzzed-object"
#: Examples per test; set KVLOG_FUZZ_EXAMPLES to fuzz longer locally.
EXAMPLES = int(os.environ.get("KVLOG_FUZZ_EXAMPLES", "60"))
FAST = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# JSON values of any shape, for bodies behind a valid envelope.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def damaged(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` truncated, padded, with bits flipped, with bytes overwritten, or replaced whole."""
    how = draw(st.sampled_from(["truncate", "pad", "flip", "overwrite", "random"]))
    data = bytearray(valid)
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, max(len(data) - 1, 0)))])
    if how == "pad":
        return bytes(data) + draw(st.binary(min_size=1, max_size=16))
    if how == "flip" and data:
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(data) - 1))
            data[at] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    if how == "overwrite" and data:
        at = draw(st.integers(0, len(data) - 1))
        patch = draw(st.binary(min_size=1, max_size=32))
        data[at : at + len(patch)] = patch
        return bytes(data)
    return draw(st.binary(max_size=max(64, len(valid))))


def _records() -> pa.RecordBatch:
    keys = [b"key-%03d" % i for i in range(20)]
    values = [None if i % 7 == 3 else b"value-%d" % i * (i % 4) for i in range(20)]
    return make_record_batch(keys, values, list(range(1000, 1020)))


def _data_file(compression: str) -> tuple[bytes, list[BatchLocation]]:
    writer = DataFileWriter(compression)
    writer.add(_records())
    writer.add(make_record_batch([b"x"], [b"y"], [5]))
    return writer.finish()


FILES = {compression: _data_file(compression) for compression in ("zstd", "lz4", "none")}


def _batch_or_corrupt(data: bytes, location: BatchLocation, keys_only: bool) -> None:
    try:
        batch = decode_batch(NAME, data, location, keys_only=keys_only)
    except CorruptDataError as e:
        assert e.name == NAME
        return
    batch.validate(full=True)  # a batch handed out is a valid one
    assert batch.num_rows == location.count


@FAST
@given(st.sampled_from(sorted(FILES)), st.data(), st.booleans(), st.booleans())
def test_decode_batch_of_damaged_bytes(compression: str, data: st.DataObject, keys_only: bool,
                                       matching_crc: bool) -> None:
    whole, locations = FILES[compression]
    location = locations[data.draw(st.integers(0, len(locations) - 1))]
    message = whole[location.position : location.position + location.length]
    bad = data.draw(damaged(message))
    if matching_crc:  # as if the damage collided with the checksum: the IPC parser sees it
        location = BatchLocation(location.position, len(bad), crc32c(bad), location.count,
                                 location.data_bytes, location.min_timestamp, location.max_timestamp)
    _batch_or_corrupt(bad, location, keys_only)


@FAST
@given(st.sampled_from(sorted(FILES)), st.data())
def test_read_data_file_of_damaged_bytes(compression: str, data: st.DataObject) -> None:
    whole, locations = FILES[compression]
    bad = data.draw(damaged(whole))
    try:
        batches = read_data_file(NAME, bad, locations, size=len(whole), crc=crc32c(whole))
    except CorruptDataError as e:
        assert e.name == NAME
        return
    assert bad == whole and len(batches) == len(locations)


@FAST
@given(st.data(), st.sampled_from(["commit", "checkpoint", "identity"]))
def test_decode_document_of_damaged_bytes(data: st.DataObject, kind: str) -> None:
    valid = encode_document(kind, {"a": [1, 2, {"b": "c"}], "n": 7})
    bad = data.draw(damaged(valid))
    try:
        body = decode_document(NAME, bad, kind)
    except CorruptDataError as e:
        assert e.name == NAME
        return
    assert isinstance(body, dict)


@FAST
@given(st.binary(max_size=200), st.text(max_size=12))
def test_decode_document_of_random_bytes(data: bytes, kind: str) -> None:
    try:
        decode_document(NAME, data, kind)
    except CorruptDataError:
        pass


def _valid_commit() -> bytes:
    location = BatchLocation(0, 100, 12345, 3, 40, 1, 2)
    batch = BatchEntry(1, location, producer_id=9, epoch=2, base_sequence=0, base_offset=10,
                       last_offset=12, present=encode_offsets([0, 2]), tombstone_horizon_ms=5)
    add = (FileEntry("f1", "data/1/f1.arrow", 0, 100, 777, (batch,)),)
    return encode_commit(Commit(3, "c0ffee", 1000, "replace", add, ("f0",), 9, 2, {"k": [1]}))


@FAST
@given(st.data())
def test_decode_commit_of_damaged_bytes(data: st.DataObject) -> None:
    bad = data.draw(damaged(_valid_commit()))
    try:
        commit = decode_commit(NAME, bad)
    except CorruptDataError as e:
        assert e.name == NAME
        return
    assert isinstance(commit, Commit)


@FAST
@given(json_values, st.data())
def test_decode_commit_of_any_body(value: Any, data: st.DataObject) -> None:
    """A well-formed envelope around a body of any shape, alone or spliced into a valid body."""
    body = json.loads(_valid_commit().split(b"\n")[1])
    if isinstance(value, dict) and data.draw(st.booleans()):
        body = value
    else:
        path: list[Any] = [body]
        while isinstance(path[-1], dict | list) and path[-1] and data.draw(st.booleans()):
            container = path[-1]
            key = data.draw(st.sampled_from(sorted(container) if isinstance(container, dict)
                                            else list(range(len(container)))))
            path.append(container[key])
            if not isinstance(container[key], dict | list):
                container[key] = value
                break
        else:
            if isinstance(path[-1], dict):
                path[-1][data.draw(st.text(max_size=6))] = value
    try:
        commit = decode_commit(NAME, encode_document("commit", body))
    except CorruptDataError as e:
        assert e.name == NAME
        return
    assert isinstance(commit, Commit)


@FAST
@given(st.data())
def test_decode_identity_of_damaged_bytes(data: st.DataObject) -> None:
    valid = encode_identity(Identity("ab" * 16, 8, 1234, 99))
    bad = data.draw(damaged(valid))
    try:
        identity = decode_identity(bad, NAME)
    except CorruptDataError as e:
        assert e.name == NAME
        return
    assert identity.partitions >= 1


@FAST
@given(st.dictionaries(st.sampled_from(["uuid", "partitions", "created_ms", "fingerprint_seed",
                                        "format_version", "other"]), json_values, max_size=6))
def test_decode_identity_of_any_body(body: dict[str, Any]) -> None:
    try:
        decode_identity(encode_document("identity", body), NAME)
    except CorruptDataError as e:
        assert e.name == NAME


@FAST
@given(st.data())
def test_decode_offsets_of_damaged_text(data: st.DataObject) -> None:
    valid = base64.b64decode(encode_offsets([0, 1, 5, 70000, 70001] + list(range(100, 400))))
    bad = data.draw(damaged(valid))
    text = data.draw(st.sampled_from([base64.b64encode(bad).decode(), bad.decode("latin-1")]))
    try:
        bitmap = decode_offsets(NAME, text)
    except CorruptDataError as e:
        assert e.name == NAME
        return
    assert all(0 <= v < 2**32 for v in bitmap.to_array()[:10])


@FAST
@given(st.text(max_size=40))
def test_decode_offsets_of_random_text(text: str) -> None:
    try:
        decode_offsets(NAME, text)
    except CorruptDataError:
        pass


keys_st = st.one_of(st.binary(min_size=1, max_size=40), st.binary(min_size=481, max_size=600))


@FAST
@given(keys_st, st.integers(0, 65535), st.integers(0, 2**64 - 1), st.none() | st.binary(max_size=50),
       st.data())
def test_index_values_refuse_every_damage(key: bytes, partition: int, offset: int, inline: bytes | None,
                                          data: st.DataObject) -> None:
    valid = encode_index_value(key, partition, offset, inline)
    entry = decode_index_value(key, valid)
    assert (entry.partition, entry.offset, entry.inline) == (partition, offset, inline)
    bad = data.draw(damaged(valid))
    if bad != valid:  # only a CRC32C collision would pass, once in 2**32 damaged values
        with pytest.raises(ValueError):
            decode_index_value(key, bad)


@settings(max_examples=max(200, EXAMPLES), deadline=None)
@given(keys_st, st.integers(0, 65535), st.integers(0, 2**64 - 1), st.none() | st.binary(max_size=50),
       st.data())
def test_a_flipped_bit_in_an_index_value_or_its_key_is_always_refused(
    key: bytes, partition: int, offset: int, inline: bytes | None, data: st.DataObject
) -> None:
    valid = bytearray(encode_index_value(key, partition, offset, inline))
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(valid) - 1))
        valid[at] ^= 1 << data.draw(st.integers(0, 7))
        other_key = key
    else:  # the same value read under another key: a key damaged in the B-tree
        raw = bytearray(key)
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] ^= 1 << data.draw(st.integers(0, 7))
        other_key = bytes(raw)
    with pytest.raises(ValueError):
        decode_index_value(other_key, bytes(valid))


@FAST
@given(st.binary(min_size=1, max_size=40), st.binary(max_size=80))
def test_decode_index_value_of_random_bytes(key: bytes, value: bytes) -> None:
    try:
        decode_index_value(key, value)
    except ValueError:
        pass
