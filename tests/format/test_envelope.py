"""The two-line, versioned, checksummed JSON envelope of commits, checkpoints and identity."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.errors import CorruptDataError
from kvlog.format import FORMAT_VERSION, crc32c, decode_document, encode_document

NAME = "log/00000000000000000042.json"

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
bodies = st.dictionaries(st.text(max_size=8), json_values, max_size=6)
kinds = st.sampled_from(["commit", "checkpoint", "identity"])
masks = st.integers(1, 255)

_DROP = object()


def handmade(kind: Any, fmt: Any, payload: bytes, **header_changes: Any) -> bytes:
    """An envelope built by hand, with a correct length and CRC unless changed."""
    header: dict[str, Any] = {"kvlog": kind, "format": fmt, "length": len(payload), "crc32c": crc32c(payload)}
    header.update(header_changes)
    header = {k: v for k, v in header.items() if v is not _DROP}
    return json.dumps(header).encode() + b"\n" + payload + b"\n"



@settings(max_examples=60, deadline=None)
@given(kind=kinds, body=bodies)
def test_round_trip(kind: str, body: dict[str, Any]) -> None:
    data = encode_document(kind, body)
    assert decode_document(NAME, data, kind) == body
    assert encode_document(kind, decode_document(NAME, data, kind)) == data


@settings(max_examples=30, deadline=None)
@given(kind=kinds, body=bodies)
def test_layout_is_a_header_line_and_a_body_line(kind: str, body: dict[str, Any]) -> None:
    data = encode_document(kind, body)
    assert data.endswith(b"\n")
    header_line, payload, tail = data.split(b"\n", 2)
    assert tail == b""
    header = json.loads(header_line)
    assert header == {
        "kvlog": kind, "format": FORMAT_VERSION, "length": len(payload), "crc32c": crc32c(payload),
    }
    assert list(header) == ["kvlog", "format", "length", "crc32c"]
    assert json.loads(payload) == body
    assert payload.isascii()  # non-ASCII text is escaped, so the file is plain ASCII


def test_format_version_is_one() -> None:
    assert FORMAT_VERSION == 1


def test_checksum_is_crc32c_castagnoli() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"") == 0
    assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283  # continues from a value


@settings(max_examples=25, deadline=None)
@given(kind=kinds, body=bodies, mask=masks, name=st.text(min_size=1, max_size=30))
def test_any_flipped_byte_is_detected(kind: str, body: dict[str, Any], mask: int, name: str) -> None:
    data = encode_document(kind, body)
    for index in range(len(data)):
        damaged = bytearray(data)
        damaged[index] ^= mask
        with pytest.raises(CorruptDataError) as caught:
            decode_document(name, bytes(damaged), kind)
        assert caught.value.name == name


@settings(max_examples=25, deadline=None)
@given(kind=kinds, body=bodies, name=st.text(min_size=1, max_size=30))
def test_any_truncation_or_padding_is_detected(kind: str, body: dict[str, Any], name: str) -> None:
    data = encode_document(kind, body)
    for length in range(len(data)):
        with pytest.raises(CorruptDataError) as caught:
            decode_document(name, data[:length], kind)
        assert caught.value.name == name
    for extra in (b"\n", b" ", b"{}\n", data):
        with pytest.raises(CorruptDataError):
            decode_document(name, data + extra, kind)


@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=200), kind=kinds)
def test_garbage_is_corrupt(data: bytes, kind: str) -> None:
    with pytest.raises(CorruptDataError) as caught:
        decode_document(NAME, data, kind)
    assert caught.value.name == NAME


@pytest.mark.parametrize("fmt", [0, 3, 99, -1, "1", None, 1.5, [1], True])
def test_unknown_format_version_is_refused(fmt: Any) -> None:
    data = handmade("commit", fmt, b'{"a":1}')
    with pytest.raises(CorruptDataError, match="unknown format version") as caught:
        decode_document(NAME, data, "commit")
    assert caught.value.name == NAME


def test_missing_format_version_is_refused() -> None:
    data = handmade("commit", 1, b'{"a":1}', format=_DROP)
    with pytest.raises(CorruptDataError, match="unknown format version"):
        decode_document(NAME, data, "commit")


def test_the_version_is_checked_before_the_body() -> None:
    # A future version may change the body completely (even the checksum):
    # the refusal names the version, not a checksum error.
    data = handmade("commit", 3, b"\x00 not json at all", crc32c=0)
    with pytest.raises(CorruptDataError, match="unknown format version 3"):
        decode_document(NAME, data, "commit")


def test_handmade_version_one_is_accepted() -> None:
    assert decode_document(NAME, handmade("commit", 1, b'{"a":[1,2]}'), "commit") == {"a": [1, 2]}


def test_wrong_kind_is_refused() -> None:
    data = encode_document("identity", {"uuid": "x"})
    with pytest.raises(CorruptDataError, match="not a kvlog commit") as caught:
        decode_document(NAME, data, "commit")
    assert caught.value.name == NAME


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "no header line"),
        (b'{"kvlog":"commit","format":1}', "no header line"),
        (b"[1,2]\n{}\n", "not a kvlog commit"),
        (b"not json\n{}\n", "unreadable header"),
        (b"\xff\xfe\n{}\n", "unreadable header"),
        (handmade("commit", 1, b"{}", length=_DROP), "lacks length or checksum"),
        (handmade("commit", 1, b"{}", crc32c="0"), "lacks length or checksum"),
        (handmade("commit", 1, b"{}", crc32c=crc32c(b"{}") ^ 1), "checksum mismatch"),
        (handmade("commit", 1, b"{}", length=1), "truncated or padded"),
        (handmade("commit", 1, b"{}", length=-1), "truncated or padded"),
        (handmade("commit", 1, b"{"), "unreadable body"),
        (handmade("commit", 1, b"\xff\xfe\xfd"), "unreadable body"),
        (handmade("commit", 1, b"[1]"), "body is not an object"),
        (handmade("commit", 1, b'"text"'), "body is not an object"),
    ],
)
def test_malformed_envelopes(data: bytes, reason: str) -> None:
    with pytest.raises(CorruptDataError, match=reason) as caught:
        decode_document(NAME, data, "commit")
    assert caught.value.name == NAME
    assert caught.value.reason
    assert str(caught.value).startswith(NAME + ": ")
