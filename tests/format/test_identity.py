"""The identity file kvlog.json, written once when a store is created."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.errors import CorruptDataError
from kvlog.format import (
    FORMAT_VERSION,
    IDENTITY_NAME,
    STORE_FORMAT,
    Identity,
    decode_document,
    decode_identity,
    encode_document,
    encode_identity,
)

identities = st.builds(
    Identity,
    store_uuid=st.uuids().map(str),
    partitions=st.integers(1, 65535),
    created_ms=st.integers(0, 2**63 - 1),
    fingerprint_seed=st.integers(0, 2**64 - 1),
)
masks = st.integers(1, 255)

SAMPLE = Identity("0f8e4c2a-5b9d-4e3f-8a1b-2c3d4e5f6a7b", 8, 1_700_000_000_000, 12345)


def with_body(change: Any) -> bytes:
    body = decode_document(IDENTITY_NAME, encode_identity(SAMPLE), "identity")
    change(body)
    return encode_document("identity", body)


@settings(max_examples=60, deadline=None)
@given(identity=identities)
def test_round_trip(identity: Identity) -> None:
    assert identity.format_version == STORE_FORMAT == 2
    data = encode_identity(identity)
    assert decode_identity(data) == identity
    assert encode_identity(decode_identity(data)) == data


def test_name_and_body() -> None:
    assert IDENTITY_NAME == "kvlog.json"
    header_line, payload, _ = encode_identity(SAMPLE).split(b"\n")
    assert json.loads(header_line)["kvlog"] == "identity"
    assert json.loads(payload) == {
        "uuid": SAMPLE.store_uuid, "partitions": 8, "created_ms": 1_700_000_000_000,
        "fingerprint_seed": 12345, "format_version": STORE_FORMAT,
    }
    assert json.loads(header_line)["format"] == FORMAT_VERSION == 1  # the envelope's own version


@pytest.mark.parametrize("version", [1, 2])
def test_both_store_formats_are_read(version: int) -> None:
    assert decode_identity(with_body(lambda body: body.update(format_version=version))).format_version == version


@settings(max_examples=15, deadline=None)
@given(identity=identities, mask=masks, name=st.text(min_size=1, max_size=30))
def test_any_flipped_byte_is_detected(identity: Identity, mask: int, name: str) -> None:
    data = encode_identity(identity)
    for index in range(len(data)):
        damaged = bytearray(data)
        damaged[index] ^= mask
        with pytest.raises(CorruptDataError) as caught:
            decode_identity(bytes(damaged), name)
        assert caught.value.name == name


@settings(max_examples=15, deadline=None)
@given(identity=identities, name=st.text(min_size=1, max_size=30))
def test_any_truncation_is_detected(identity: Identity, name: str) -> None:
    data = encode_identity(identity)
    for length in range(len(data)):
        with pytest.raises(CorruptDataError) as caught:
            decode_identity(data[:length], name)
        assert caught.value.name == name


def test_errors_name_kvlog_json_by_default() -> None:
    with pytest.raises(CorruptDataError) as caught:
        decode_identity(encode_identity(SAMPLE)[:-2])
    assert caught.value.name == "kvlog.json"


@pytest.mark.parametrize("fmt", [0, 2, "1", None])
def test_unknown_envelope_format_version_is_refused(fmt: Any) -> None:
    header_line, payload, _ = encode_identity(SAMPLE).split(b"\n")
    header = json.loads(header_line)
    header["format"] = fmt
    data = json.dumps(header).encode() + b"\n" + payload + b"\n"
    with pytest.raises(CorruptDataError, match="unknown format version") as caught:
        decode_identity(data)
    assert caught.value.name == IDENTITY_NAME


@pytest.mark.parametrize("version", [0, 3, 17])
def test_unknown_store_format_version_is_refused(version: int) -> None:
    # The store's format version inside the body is checked too: a store created by
    # a newer kvlog is refused rather than misread, even if its envelope is readable.
    data = with_body(lambda body: body.update(format_version=version))
    with pytest.raises(CorruptDataError, match="unknown format version") as caught:
        decode_identity(data)
    assert caught.value.name == IDENTITY_NAME


def test_a_commit_is_not_an_identity() -> None:
    with pytest.raises(CorruptDataError, match="not a kvlog identity"):
        decode_identity(encode_document("commit", {"uuid": "x"}))


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.pop("uuid"),
        lambda b: b.pop("partitions"),
        lambda b: b.pop("created_ms"),
        lambda b: b.pop("fingerprint_seed"),
        lambda b: b.pop("format_version"),
        lambda b: b.update(partitions=0),
        lambda b: b.update(partitions=-3),
        lambda b: b.update(partitions="eight"),
        lambda b: b.update(partitions=None),
        lambda b: b.update(created_ms=[1]),
        lambda b: b.update(fingerprint_seed=float("inf")),
        lambda b: b.update(fingerprint_seed=float("nan")),
        lambda b: b.update(format_version={}),
    ],
)
def test_malformed_identity_bodies_are_corrupt(change: Any) -> None:
    with pytest.raises(CorruptDataError) as caught:
        decode_identity(with_body(change), "root/kvlog.json")
    assert caught.value.name == "root/kvlog.json"


@settings(max_examples=60, deadline=None)
@given(
    body=st.dictionaries(
        st.sampled_from(["uuid", "partitions", "created_ms", "fingerprint_seed", "format_version"]),
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
        | st.lists(st.integers(), max_size=2),
    )
)
def test_any_json_body_decodes_or_is_corrupt(body: dict[str, Any]) -> None:
    try:
        identity = decode_identity(encode_document("identity", body))
    except CorruptDataError as e:
        assert e.name == IDENTITY_NAME
    else:
        assert identity.partitions >= 1
        assert identity.format_version in (1, 2)
