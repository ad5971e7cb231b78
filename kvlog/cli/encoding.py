"""How the command line takes bytes in and writes them out.

Input: a key, value or key bound is the bytes of its argument (``os.fsencode`` undoes
Python's ``surrogateescape`` decoding of ``argv``, so arguments that are not UTF-8 are
taken as given), or hex digits with ``--hex``, or a file's raw bytes (``--key-file`` /
``--value-file``; ``-`` is stdin).

Output formats, each decodable back to the exact bytes:

* **raw** (``get``): the value's bytes as stored.
* **hex** (``--hex``): lowercase hex digits.
* **tsv** (``scan``): ``key<TAB>value`` lines; see :func:`escape_tsv`.
* **json** (``get``, ``scan``): one JSON object a line; see :func:`json_record`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

__all__ = [
    "InputError", "arg_bytes", "from_hex", "read_source", "escape_tsv", "unescape_tsv",
    "json_record", "record_from_json", "write_bytes",
]


class InputError(Exception):
    """An argument that names no bytes: bad hex, an unreadable file (a usage error, exit 2)."""


def arg_bytes(arg: str) -> bytes:
    """The bytes given on the command line for ``arg``.

    Python decodes ``argv`` with ``surrogateescape``; ``os.fsencode`` gives the original bytes
    back, so a key that is not UTF-8 is stored as given rather than failing to encode.
    """
    try:
        return os.fsencode(arg)
    except UnicodeEncodeError as e:
        raise InputError(f"{arg!r} has no byte form ({e.reason})") from None


def from_hex(arg: str, what: str) -> bytes:
    """``arg`` read as hex digits (``--hex``); spaces between bytes are allowed."""
    try:
        return bytes.fromhex(arg)
    except ValueError:
        raise InputError(f"{what} is not hex: {arg!r} (two hex digits per byte)") from None


def read_source(name: str, what: str) -> bytes:
    """The raw bytes of file ``name``, or of stdin when ``name`` is ``-``."""
    if name == "-":
        stream = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else None
        if stream is None:
            raise InputError(f"{what} -: stdin is not a byte stream")
        return stream.read()
    try:
        with open(name, "rb") as f:
            return f.read()
    except OSError as e:
        raise InputError(f"{what} {name!r}: {e.strerror or e}") from None


#: The TSV escapes other than ``\xNN``.
_TSV_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_TSV_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


def escape_tsv(data: bytes) -> str:
    """``data`` as one TSV field: printable UTF-8 text as it is, everything else escaped.

    Backslash, tab, newline and carriage return become ``\\\\``, ``\\t``, ``\\n``, ``\\r``;
    every other byte that is not part of a printable UTF-8 character (invalid UTF-8, control
    characters, and non-printable characters such as U+0085 or U+2028) becomes ``\\xNN``
    per byte. A field therefore never holds a tab or a line break, and :func:`unescape_tsv`
    gives the bytes back.
    """
    out: list[str] = []
    text = data.decode("utf-8", errors="surrogateescape")
    for char in text:
        if char in _TSV_ESCAPES:
            out.append(_TSV_ESCAPES[char])
        elif char.isprintable() and not 0xDC80 <= ord(char) <= 0xDCFF:
            out.append(char)
        else:
            raw = char.encode("utf-8", errors="surrogateescape")
            out.append("".join(f"\\x{b:02x}" for b in raw))
    return "".join(out)


def unescape_tsv(field: str) -> bytes:
    """The bytes :func:`escape_tsv` wrote as ``field``."""
    out = bytearray()
    i = 0
    while i < len(field):
        char = field[i]
        if char != "\\":
            out += char.encode("utf-8")
            i += 1
            continue
        code = field[i + 1:i + 2]
        if code in _TSV_UNESCAPES:
            out += _TSV_UNESCAPES[code].encode()
            i += 2
        elif code == "x" and len(field) >= i + 4:
            out.append(int(field[i + 2:i + 4], 16))
            i += 4
        else:
            raise ValueError(f"bad escape at {i} of {field!r}")
    return bytes(out)


def _json_field(name: str, data: bytes, as_hex: bool) -> tuple[str, str]:
    if not as_hex:
        try:
            return name, data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return f"{name}_hex", data.hex()


def json_record(key: bytes, value: bytes, *, as_hex: bool = False) -> str:
    """One JSON object for a key and its value, on one line.

    Each of key and value is ``"key": text`` when it is valid UTF-8 and ``"key_hex": "..."``
    (lowercase hex of the bytes) otherwise, or always with ``as_hex``; exactly one of the
    two names is present. Text is written as it is (``ensure_ascii`` off): the line is UTF-8.
    """
    obj = dict((_json_field("key", key, as_hex), _json_field("value", value, as_hex)))
    return json.dumps(obj, ensure_ascii=False)


def record_from_json(obj: Mapping[str, str]) -> tuple[bytes, bytes]:
    """The key and value bytes of an object :func:`json_record` wrote."""

    def field(name: str) -> bytes:
        if f"{name}_hex" in obj:
            return bytes.fromhex(obj[f"{name}_hex"])
        return obj[name].encode("utf-8")

    return field("key"), field("value")


def write_bytes(data: bytes, *, flush: bool = False) -> None:
    """Write ``data`` to stdout as bytes; with ``flush``, all of it has left this process
    (a closed pipe raises :class:`BrokenPipeError`) when this returns.

    A text-only stdout (one with no ``buffer``, such as ``io.StringIO`` in a doctest) gets
    the bytes decoded as UTF-8, with ``\\xNN`` for bytes that are not.
    """
    stream = sys.stdout
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        stream.write(data.decode("utf-8", errors="backslashreplace"))
        if flush:
            stream.flush()
        return
    stream.flush()
    buffer.write(data)
    if flush:
        buffer.flush()
