"""The column loops in Python: the twin of the compiled ``_columns`` (same functions, results
and errors); :mod:`kvlog._native` picks one of them and :mod:`kvlog.format.columns` wraps them.

:func:`pack_binary` turns a list of bytes objects (None: null) into the three buffers of an
Arrow binary column; :func:`index_values` turns rows of two Arrow binary columns into the
``(key, index value)`` pairs LMDB's putmulti takes, each sealed with its CRC32C;
:func:`latest_rows` keeps each distinct key's last row, in key order (Arrow's stable sort).
Every offset read from a column is checked against its buffer first.

This module does no I/O.
"""

from __future__ import annotations

import struct
from typing import Any

import crc32c as _crc32c
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["index_values", "latest_rows", "pack_binary"]

#: Any object with the buffer protocol: bytes, memoryview, a numpy array, an Arrow buffer.
Buffer = Any

_INT32_MAX = 2**31 - 1
#: An index value's head after its CRC: partition (u16), offset (u64), flags (u8), big-endian.
_BODY = struct.Struct(">HQB")
_FLAG_INLINE = 1


def _view(buffer: Buffer, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """The whole items of ``dtype`` in a readable buffer (a trailing part item is ignored)."""
    raw = memoryview(buffer).cast("B")
    itemsize = np.dtype(dtype).itemsize
    return np.frombuffer(raw, dtype=dtype, count=len(raw) // itemsize)


def pack_binary(items: list[bytes | None], order: Buffer | None, /
                ) -> tuple[bytes, bytes, bytes | None, int]:
    """(offsets, data, validity or None, null count) of a binary column of ``items`` taken in
    ``order`` (int64 positions) when given.

    Raises ``IndexError`` for a position outside ``items``, ``TypeError`` for an item that is
    neither bytes nor None, ``OverflowError`` past 2 GiB of bytes, whichever comes first.
    """
    if not isinstance(items, list):
        raise TypeError(f"pack_binary() takes a list, not {type(items).__name__}")
    count = len(items)
    if order is None:
        picked = items
        first_bad_position = count
    else:
        positions = _view(order, np.int64)
        bad = (positions < 0) | (positions >= count)
        first_bad_position = int(bad.argmax()) if bad.any() else len(positions)
        picked = list(map(items.__getitem__, positions[:first_bad_position].tolist()))
    n = len(picked)
    kinds = set(map(type, picked))
    first_bad_type = n
    if not kinds <= {bytes, type(None)}:
        first_bad_type = next(i for i, item in enumerate(picked) if item is not None and type(item) is not bytes)
    checked = picked[:first_bad_type]
    has_nulls = type(None) in kinds
    if has_nulls:
        null_mask = np.fromiter((item is None for item in checked), dtype=bool, count=len(checked))
        lengths = np.fromiter((0 if item is None else len(item) for item in checked), dtype=np.int64,
                              count=len(checked))
    else:
        null_mask = np.zeros(len(checked), dtype=bool)
        lengths = np.fromiter(map(len, checked), dtype=np.int64, count=len(checked))  # type: ignore[arg-type]
    ends = np.cumsum(lengths)
    over = ends > _INT32_MAX
    if over.any():
        raise OverflowError("more than 2 GiB of bytes for one binary column")
    if first_bad_type < n:
        raise TypeError(f"items must be bytes or None, not {type(picked[first_bad_type]).__name__}")
    if order is not None and first_bad_position < len(positions):
        raise IndexError("order holds a position outside the items")
    offsets = np.zeros(n + 1, dtype=np.int32)
    offsets[1:] = ends
    if has_nulls:
        data = b"".join([item for item in picked if item is not None])
        validity: bytes | None = np.packbits(~null_mask, bitorder="little").tobytes()
        nulls = int(null_mask.sum())
    else:
        data = b"".join(picked)  # type: ignore[arg-type]
        validity = None
        nulls = 0
    return offsets.tobytes(), data, validity, nulls


def _rows_in_bounds(ends: npt.NDArray[np.int32], rows: npt.NDArray[np.int64], size: int) -> bool:
    """Whether ``ends[row]``, ``ends[row + 1]`` ascend within ``size`` bytes at every row."""
    start, stop = ends[rows], ends[rows + 1]
    return bool(((start >= 0) & (stop >= start) & (stop <= size)).all())


def index_values(key_ends: Buffer, key_data: Buffer, value_ends: Buffer, value_data: Buffer,
                 rows: Buffer, partitions: Buffer, positions: Buffer, inline_limit: int, /
                 ) -> list[tuple[bytes, bytes]]:
    """``(key, head + inline value)`` for each row of ``rows``; see kvlog.format.columns."""
    raw = [memoryview(b).cast("B") for b in (key_ends, key_data, value_ends, value_data, rows, partitions,
                                                positions)]
    limit = int(inline_limit)
    kend_raw, kdata, vend_raw, vdata, rows_raw, parts_raw, pos_raw = raw
    records = len(kend_raw) // 4 - 1
    n = len(rows_raw) // 8
    if (records < 0 or len(kend_raw) % 4 or len(vend_raw) % 4 or len(rows_raw) % 8
            or len(vend_raw) // 4 - 1 != records or len(pos_raw) != 8 * n or len(parts_raw) != 2 * n):
        raise ValueError("index_values: buffers of different lengths")
    kend = _view(kend_raw, np.int32)
    vend = _view(vend_raw, np.int32)
    row = _view(rows_raw, np.int64)
    if n and (row.min() < 0 or row.max() >= records or not _rows_in_bounds(kend, row, len(kdata))
              or not _rows_in_bounds(vend, row, len(vdata))):
        raise ValueError("index_values: a row outside the columns")
    keys = bytes(kdata)
    values = bytes(vdata)
    pack = _BODY.pack
    crc = _crc32c.crc32c
    pairs: list[tuple[bytes, bytes]] = []
    append = pairs.append
    for ks, ke, vs, ve, partition, offset in zip(
            kend[row].tolist(), kend[row + 1].tolist(), vend[row].tolist(), vend[row + 1].tolist(),
            _view(parts_raw, np.uint16).tolist(), _view(pos_raw, np.uint64).tolist(), strict=True):
        key = keys[ks:ke]
        if ve - vs <= limit:
            body = pack(partition, offset, _FLAG_INLINE) + values[vs:ve]
        else:
            body = pack(partition, offset, 0)
        append((key, crc(body, crc(key)).to_bytes(4, "big") + body))
    return pairs


def latest_rows(key_ends: Buffer, key_data: Buffer, /) -> bytes:
    """The last row of each distinct key of a binary column (int64, native order), in key order."""
    ends_raw = memoryview(key_ends).cast("B")
    data = memoryview(key_data).cast("B")
    n = len(ends_raw) // 4 - 1
    if n < 0 or n > 2**32 - 1:
        raise ValueError("latest_rows: not the offsets of a binary column")
    ends = _view(ends_raw, np.int32)[: n + 1]
    if n and not _rows_in_bounds(ends, np.arange(n, dtype=np.int64), len(data)):
        raise ValueError("latest_rows: offsets outside the data")
    if n == 0:
        return b""
    keys = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ends.tobytes()), pa.py_buffer(data)])
    order = pc.sort_indices(keys)  # stable: equal keys stay in row order
    ordered = keys.take(order)
    last = np.ones(n, dtype=bool)  # whether each sorted key differs from the next one
    if n > 1:
        same = pc.equal(ordered.slice(0, n - 1), ordered.slice(1)).to_numpy(zero_copy_only=False)
        last[:-1] = ~same
    rows: npt.NDArray[np.int64] = order.to_numpy().astype(np.int64, copy=False)[last]
    return rows.tobytes()
