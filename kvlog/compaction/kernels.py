"""The offset map's per-record loops, compiled: fingerprints, insertion, lookup, the mapped values.

A probe of an open-addressing table is a loop whose length depends on the data;
numpy can only run it as a sequence of whole-array steps (gather the home
slots, compare, compact the records still probing, scatter, read back), about
twenty passes over every batch, 110 to 150 ns per record. These loops are a C
extension of kvlog's own (``_kernels.c``, built when kvlog is installed; where
it was not, :mod:`kvlog._native` picks its numpy twin ``_kernels_py``): one
call per Arrow batch, about 30 ns per record, the GIL released while they run.
numba does the same at the same speed, but costs a process about 40 MiB of
compiler and a few tenths of a second on its first job, which a store that
bounds its memory cannot spend. The functions here check types and sizes and
keep no state: :mod:`kvlog.compaction.offset_map` owns the table and documents
the hash and the layout.

This module does no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from kvlog._native import load

if TYPE_CHECKING:
    from kvlog.compaction import _kernels
else:
    _kernels = load("kvlog.compaction._kernels", "kvlog.compaction._kernels_py")

__all__ = ["nh_fingerprints", "insert_rows", "lookup_rows", "mapped_values"]

U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]
I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]


def _checked(array: npt.NDArray[np.generic], dtype: type[np.generic], name: str) -> npt.NDArray[np.generic]:
    if array.dtype != dtype or not array.flags.c_contiguous:
        raise TypeError(f"{name} must be a C-contiguous {np.dtype(dtype).name} array, not {array.dtype}")
    return array


def nh_fingerprints(data: U8, ends: I64, material: U32, first_mix: np.uint64, second_mix: np.uint64,
                    hi_out: U64, lo_out: U32) -> None:
    """Key ``i`` is ``data[ends[i]:ends[i + 1]]``; writes its fingerprint to ``hi_out[i]``, ``lo_out[i]``.

    ``material`` holds at least ``2 * ceil(longest / 8) + 4`` 32-bit words of key material.
    """
    _kernels.nh_fingerprints(_checked(data, np.uint8, "data"), _checked(ends, np.int64, "ends"),
                             _checked(material, np.uint32, "material"), int(first_mix), int(second_mix),
                             _checked(hi_out, np.uint64, "hi_out"), _checked(lo_out, np.uint32, "lo_out"))


def insert_rows(table: U64, slots: int, hi: U64, lo: U32, relative: I64, size: int,
                capacity: int) -> tuple[int, int]:
    """Insert records in order into the first ``slots`` rows of ``table``, keeping the highest
    relative offset of each fingerprint; returns (records mapped, new size).

    Stops before the first record whose fingerprint is new while ``size`` is ``capacity``.
    """
    if not len(lo) == len(relative) == len(hi):
        raise ValueError("hi, lo and relative must have one entry per record")
    mapped, new_size = _kernels.insert_rows(_checked(table, np.uint64, "table"), slots, _checked(hi, np.uint64, "hi"),
                                            _checked(lo, np.uint32, "lo"), _checked(relative, np.int64, "relative"),
                                            size, capacity)
    return int(mapped), int(new_size)


def lookup_rows(table: U64, slots: int, hi: U64, lo: U32, out: I64) -> None:
    """The relative offset mapped for each fingerprint into ``out``, -1 where absent."""
    if len(lo) != len(hi):
        raise ValueError("hi and lo must have one entry per fingerprint")
    _kernels.lookup_rows(_checked(table, np.uint64, "table"), slots, _checked(hi, np.uint64, "hi"),
                         _checked(lo, np.uint32, "lo"), _checked(out, np.int64, "out"))


def mapped_values(table: U64, out: U32) -> int:
    """The low 32 bits of the value of every occupied row of ``table``, in row order, into
    ``out``; returns how many."""
    return int(_kernels.mapped_values(_checked(table, np.uint64, "table"), _checked(out, np.uint32, "out")))
