"""Arrow binary columns from Python bytes, and LMDB index pairs from Arrow binary columns.

A flush turns a million buffered ``bytes`` objects into Arrow columns, and the
commit turns them back into a million ``(key, index value)`` pairs for LMDB.
Done with Arrow compute (``take``, ``binary_join_element_wise``,
``to_pylist``) each step copies every byte once more and hands the GIL back
and forth; these loops are a C extension of kvlog's own (``_columns.c``, built
when kvlog is installed; where it was not, :mod:`kvlog._native` picks its twin
``_columns_py``) that make each column or list in one pass. They hold
the GIL, since they read or create Python objects. The commit also needs each
key's last row in key order (:func:`latest_rows`), a compiled sort that runs
without the GIL.

This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from kvlog._native import load

if TYPE_CHECKING:
    from kvlog.format import _columns
else:
    _columns = load("kvlog.format._columns", "kvlog.format._columns_py")

__all__ = [
    "INDEX_HEAD_BYTES", "binary_column", "bool_column", "binary_ends", "index_pairs", "int64_column",
    "latest_rows", "nullable_int64_column", "valid_mask",
]

#: Bytes before the inline value in an index value: CRC32C (big-endian u32, over the LMDB key
#: then the rest of the value, so a damaged entry is never taken for a value), partition
#: (big-endian u16), offset (big-endian u64), flags (u8: 1 = the value follows inline).
INDEX_HEAD_BYTES = 15

I64 = npt.NDArray[np.int64]


def binary_column(items: Sequence[Any], order: I64 | None = None) -> pa.Array:
    """A binary array of ``items`` (``None`` is null), taken in ``order`` when given.

    ``bytes`` items take the compiled path; any other item (``bytearray`` from Spark rows, for
    instance) and more than 2 GiB of bytes take Arrow's own conversion, with its errors.
    Raises ``IndexError`` for a position of ``order`` outside ``items``.
    """
    if order is not None and (order.dtype != np.int64 or not order.flags.c_contiguous):
        raise TypeError("order must be a C-contiguous int64 array")
    if not isinstance(items, list):
        items = list(items)
    try:
        offsets, data, validity, nulls = _columns.pack_binary(items, order)
    except (TypeError, OverflowError):
        picked = items if order is None else [items[i] for i in order.tolist()]
        return pa.array(picked, type=pa.binary())
    n = len(items) if order is None else len(order)
    buffers = [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), n, buffers, null_count=nulls)


def int64_column(values: I64) -> pa.Array:
    """An int64 array sharing ``values``' memory (``pa.array`` would import pandas to check)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def nullable_int64_column(values: I64, valid: npt.NDArray[np.bool_]) -> pa.Array:
    """An int64 array of ``values``, null where ``valid`` is false."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    nulls = int(len(valid) - np.count_nonzero(valid))
    bits = None if nulls == 0 else pa.py_buffer(np.packbits(np.asarray(valid, dtype=bool), bitorder="little"))
    return pa.Array.from_buffers(pa.int64(), len(values), [bits, pa.py_buffer(values)], null_count=nulls)


def bool_column(mask: npt.NDArray[np.bool_]) -> pa.Array:
    """A boolean array of ``mask`` (its bits packed; no pandas import as with ``pa.array``)."""
    bits = np.packbits(np.asarray(mask, dtype=bool), bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(bits)])


def valid_mask(array: pa.Array) -> npt.NDArray[np.bool_]:
    """Whether each element of ``array`` is not null, from its validity bitmap."""
    n = len(array)
    bitmap = array.buffers()[0]
    if bitmap is None or array.null_count == 0:
        return np.ones(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[array.offset:array.offset + n].astype(bool)


def binary_ends(array: pa.Array) -> tuple[npt.NDArray[np.int32], pa.Buffer]:
    """The ``len + 1`` offsets of a binary array (its slice applied) and its data buffer."""
    _validity, offsets, data = array.buffers()
    ends = np.frombuffer(offsets, dtype=np.int32, count=len(array) + 1, offset=4 * array.offset)
    return ends, data if data is not None else pa.py_buffer(b"")


def index_pairs(keys: pa.Array, values: pa.Array, rows: I64, partitions: npt.NDArray[np.uint16],
                positions: I64, inline_limit: int) -> list[tuple[bytes, bytes]]:
    """``(key, index value)`` for each row of ``rows``: the head (its CRC32C, ``partitions[i]``,
    ``positions[i]``, flags) then the value when it is at most ``inline_limit`` bytes.

    ``keys`` and ``values`` are binary arrays of one length; rows must not be null values.
    """
    if not (len(rows) == len(partitions) == len(positions)):
        raise ValueError("rows, partitions and positions must have one entry per pair")
    key_ends, key_data = binary_ends(keys)
    value_ends, value_data = binary_ends(values)
    pairs: list[tuple[bytes, bytes]] = _columns.index_values(
        key_ends, key_data, value_ends, value_data,
        np.ascontiguousarray(rows, dtype=np.int64), np.ascontiguousarray(partitions, dtype=np.uint16),
        np.ascontiguousarray(positions, dtype=np.int64), int(inline_limit),
    )
    return pairs


def latest_rows(keys: pa.Array) -> I64:
    """The row of the last occurrence of each distinct key of ``keys`` (binary, no nulls), in
    key order (bytes order, LMDB's): the rows a batch's index entries come from.

    Sorting is a compiled radix sort on the 8 bytes that follow the prefix all keys share, then
    a merge sort of the keys those bytes leave tied; the GIL is released meanwhile.
    Raises ``ValueError`` for a column with nulls.
    """
    if keys.null_count:
        raise ValueError("keys must not be null")
    ends, data = binary_ends(keys)
    return np.frombuffer(_columns.latest_rows(ends, data), dtype=np.int64)
