"""Present offsets of a compacted batch as a portable roaring bitmap (base64 in JSON)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable

from pyroaring import BitMap

from kvlog.errors import CorruptDataError

__all__ = ["encode_offsets", "decode_offsets"]


def encode_offsets(relative_offsets: Iterable[int]) -> str:
    """Offsets relative to a batch's base offset, as base64 of the portable roaring format."""
    bitmap = BitMap(relative_offsets)
    bitmap.run_optimize()
    return base64.b64encode(bitmap.serialize()).decode("ascii")


def decode_offsets(name: str, text: str) -> BitMap:
    """The bitmap of :func:`encode_offsets`; raises ``CorruptDataError`` naming ``name``."""
    try:
        return BitMap.deserialize(base64.b64decode(text.encode("ascii"), validate=True))
    # pyroaring raises IndexError (not ValueError) for an empty buffer.
    except (ValueError, IndexError, binascii.Error, UnicodeEncodeError) as e:
        raise CorruptDataError(name, f"unreadable offset bitmap ({e})") from None
