"""Present offsets of a compacted batch as a portable roaring bitmap (base64 in JSON)."""

from __future__ import annotations

import array
import base64
import binascii
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from kvlog.errors import CorruptDataError

__all__ = ["encode_offsets", "decode_offsets", "bitmap_of", "offsets_of"]


def bitmap_of(values: Iterable[int] | npt.NDArray[np.integer]) -> BitMap:
    """A bitmap of unsigned 32-bit ``values`` (a numpy array is taken whole, not element by element)."""
    if isinstance(values, np.ndarray):
        bitmap = BitMap()
        bitmap.update(array.array("I", values.astype(np.uint32).tobytes()))
        return bitmap
    return BitMap(values)


def offsets_of(bitmap: BitMap) -> npt.NDArray[np.uint32]:
    """The values of ``bitmap``, ascending, as a numpy array."""
    return np.frombuffer(bitmap.to_array(), dtype=np.uint32)


def encode_offsets(relative_offsets: Iterable[int] | npt.NDArray[np.integer]) -> str:
    """Offsets relative to a batch's base offset, as base64 of the portable roaring format."""
    bitmap = bitmap_of(relative_offsets)
    bitmap.run_optimize()
    return base64.b64encode(bitmap.serialize()).decode("ascii")


def decode_offsets(name: str, text: str) -> BitMap:
    """The bitmap of :func:`encode_offsets`; raises ``CorruptDataError`` naming ``name``."""
    try:
        return BitMap.deserialize(base64.b64decode(text.encode("ascii"), validate=True))
    # pyroaring raises IndexError (not ValueError) for an empty buffer.
    except (ValueError, IndexError, binascii.Error, UnicodeEncodeError) as e:
        raise CorruptDataError(name, f"unreadable offset bitmap ({e})") from None
