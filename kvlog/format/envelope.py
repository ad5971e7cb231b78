"""The checksummed, versioned envelope of every JSON document kvlog writes.

A document is two lines of UTF-8 JSON::

    {"kvlog": "<kind>", "format": 1, "length": <body bytes>, "crc32c": <crc of body bytes>}
    <body: one JSON object>

The header is read first: an unknown ``format`` is refused before the body is
interpreted, a wrong kind, a length or checksum mismatch, or a truncation is a
:class:`~kvlog.errors.CorruptDataError` naming the object.
"""

from __future__ import annotations

import json
from typing import Any

from kvlog.errors import CorruptDataError
from kvlog.format.checksum import crc32c

__all__ = ["FORMAT_VERSION", "encode_document", "decode_document", "envelope"]

#: The one format version this code reads and writes.
FORMAT_VERSION = 1


def encode_document(kind: str, body: dict[str, Any]) -> bytes:
    """The envelope bytes of ``body``."""
    return envelope(kind, json.dumps(body, separators=(",", ":"), sort_keys=True).encode("utf-8"))


def envelope(kind: str, payload: bytes) -> bytes:
    """The envelope bytes of a body already encoded: ``payload``, one JSON object in UTF-8."""
    header = json.dumps(
        {"kvlog": kind, "format": FORMAT_VERSION, "length": len(payload), "crc32c": crc32c(payload)},
        separators=(",", ":"),
    ).encode("utf-8")
    return header + b"\n" + payload + b"\n"


def decode_document(name: str, data: bytes, kind: str) -> dict[str, Any]:
    """The body of an envelope, verified; raises ``CorruptDataError`` naming ``name``."""
    newline = data.find(b"\n")
    if newline < 0:
        raise CorruptDataError(name, "truncated: no header line")
    try:
        header = json.loads(data[:newline])
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptDataError(name, f"unreadable header ({e})") from None
    if not isinstance(header, dict) or header.get("kvlog") != kind:
        raise CorruptDataError(name, f"not a kvlog {kind} document")
    fmt = header.get("format")
    if fmt != FORMAT_VERSION:
        raise CorruptDataError(
            name, f"unknown format version {fmt!r} (this kvlog reads version {FORMAT_VERSION}); upgrade kvlog"
        )
    length, expected = header.get("length"), header.get("crc32c")
    if not isinstance(length, int) or not isinstance(expected, int):
        raise CorruptDataError(name, "header lacks length or checksum")
    payload = data[newline + 1 : newline + 1 + length]
    if len(payload) != length or data[newline + 1 + length :] != b"\n":
        raise CorruptDataError(name, f"truncated or padded: expected {length} body bytes")
    if crc32c(payload) != expected:
        raise CorruptDataError(name, "checksum mismatch")
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as e:  # pragma: no cover - the CRC catches this first
        raise CorruptDataError(name, f"unreadable body ({e})") from None
    if not isinstance(body, dict):
        raise CorruptDataError(name, "body is not an object")
    return body
