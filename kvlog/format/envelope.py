"""The checksummed, versioned envelope of every JSON document kvlog writes.

A document is two lines of UTF-8 JSON::

    {"kvlog": "<kind>", "format": 1, "length": <body bytes>, "crc32c": <crc of body bytes>}
    <body: one JSON object>

A document in format 2 may carry attached bytes after its body line (a commit carries a
small flush's records there, so a durable write is one object); its header says how many::

    {"kvlog": "<kind>", "format": 2, "length": <body bytes>, "crc32c": <crc>, "data": <bytes>}
    <body: one JSON object>
    <data: the attached bytes>

The header is read first: an unknown ``format`` is refused before the body is
interpreted, a wrong kind, a length or checksum mismatch, or a truncation is a
:class:`~kvlog.errors.CorruptDataError` naming the object. The attached bytes are not
covered by the header's checksum: the body describes them, with checksums of their own.
"""

from __future__ import annotations

import json
from typing import Any

from kvlog.errors import CorruptDataError
from kvlog.format.checksum import crc32c

__all__ = ["ATTACHED_FORMAT", "FORMAT_VERSION", "encode_document", "decode_document", "envelope",
           "split_document"]

#: The format version of a document without attached bytes (every identity and checkpoint).
FORMAT_VERSION = 1
#: The format version of a document with attached bytes after its body line.
ATTACHED_FORMAT = 2


def encode_document(kind: str, body: dict[str, Any], attached: bytes | memoryview | None = None) -> bytes:
    """The envelope bytes of ``body`` (format 2 with ``attached`` bytes after it)."""
    return envelope(kind, json.dumps(body, separators=(",", ":"), sort_keys=True).encode("utf-8"), attached)


def envelope(kind: str, payload: bytes, attached: bytes | memoryview | None = None) -> bytes:
    """The envelope bytes of a body already encoded: ``payload``, one JSON object in UTF-8,
    followed by ``attached`` (format 2) when given."""
    fields: dict[str, Any] = {"kvlog": kind, "format": FORMAT_VERSION, "length": len(payload),
                              "crc32c": crc32c(payload)}
    if attached is not None:
        fields.update(format=ATTACHED_FORMAT, data=len(attached))
    header = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    if attached is None:
        return header + b"\n" + payload + b"\n"
    return b"".join((header, b"\n", payload, b"\n", attached))


def decode_document(name: str, data: bytes, kind: str) -> dict[str, Any]:
    """The body of an envelope without attached bytes, verified; raises ``CorruptDataError``
    naming ``name``."""
    body, _start = split_document(name, data, kind, (FORMAT_VERSION,))
    return body


def split_document(name: str, data: bytes | memoryview, kind: str,
                   formats: tuple[int, ...] = (FORMAT_VERSION, ATTACHED_FORMAT)) -> tuple[dict[str, Any], int]:
    """The body of an envelope of one of ``formats``, verified, and the position its attached
    bytes start at (``len(data)`` when it has none); raises ``CorruptDataError`` naming ``name``."""
    data = bytes(data) if isinstance(data, memoryview) else data
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
    if fmt.__class__ is not int or fmt not in formats:
        known = " and ".join(map(str, formats))
        raise CorruptDataError(
            name, f"unknown format version {fmt!r} (this kvlog reads version {known} of a {kind} "
            "document); upgrade kvlog"
        )
    length, expected = header.get("length"), header.get("crc32c")
    if not isinstance(length, int) or not isinstance(expected, int):
        raise CorruptDataError(name, "header lacks length or checksum")
    attached = header.get("data", 0) if fmt == ATTACHED_FORMAT else 0
    if attached.__class__ is not int or attached < 0 or (fmt == ATTACHED_FORMAT and "data" not in header):
        raise CorruptDataError(name, "header lacks the length of its attached bytes")
    end = newline + 1 + length
    payload = data[newline + 1 : end]
    if len(payload) != length or data[end:end + 1] != b"\n" or len(data) != end + 1 + attached:
        raise CorruptDataError(name, f"truncated or padded: expected {length} body bytes"
                               + (f" and {attached} attached bytes" if attached else ""))
    if crc32c(payload) != expected:
        raise CorruptDataError(name, "checksum mismatch")
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as e:  # pragma: no cover - the CRC catches this first
        raise CorruptDataError(name, f"unreadable body ({e})") from None
    if not isinstance(body, dict):
        raise CorruptDataError(name, "body is not an object")
    return body, end + 1
