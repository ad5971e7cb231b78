"""Index runs: one commit's key-index entries, written as a single sorted LMDB value.

A commit writes its index entries as a run in the commit's own LMDB transaction: one value
of a few MiB instead of one B-tree insertion per key, which would copy nearly every leaf page
of the index at every commit. Readers look a key up in the pending runs, newest first, then in
the B-tree; merging the runs into the B-tree (settling) happens later, in one transaction for
all of them (see :func:`kvlog.index.write.settle_runs`).

Layout (native little-endian ``u32``): the magic ``KVR2``, the entry count, ``key_end[count]``,
``value_end[count]``, the keys, the values. Entry ``i`` spans ``keys[key_end[i-1]:key_end[i]]``
(``key_end[-1]`` is 0), likewise its value. Keys are strictly increasing in LMDB's order and are
their own LMDB keys (at most ``DIRECT_KEY_BYTES``); a value is an index value (the head with its
CRC32C, then the inline value if any; see :mod:`kvlog.index.entry`) or, for a deletion, the
4-byte big-endian CRC32C of the key, so that no damaged entry reads as a deletion either.

A run is read in place and may be damaged like any cache page: every function that reads one
checks the offsets it follows and the checksum of every entry it returns, and raises
``ValueError`` for a damaged run (the cache turns that into a ``CorruptDataError``). A lookup
checks the O(log n) entries its binary search visits, never the whole run.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from kvlog._native import load
from kvlog.format.columns import binary_ends

if TYPE_CHECKING:
    from kvlog.index import _runs
else:
    _runs = load("kvlog.index._runs", "kvlog.index._runs_py")

__all__ = ["Buffer", "RUN_ID", "WALK_CHUNK", "build_run", "run_entries", "run_find", "run_length", "runs_find", "walk_run"]

#: The LMDB key of a run in the ``runs`` database: its number, big-endian (oldest first).
RUN_ID = struct.Struct(">Q")
_HEADER = struct.Struct("<II")
_MAGIC = 0x3252564B  # b"KVR2" read as a little-endian u32
#: A run read in place (a view of an LMDB value) or copied.
Buffer = bytes | memoryview
#: Entries one call of :func:`walk_run` turns into Python objects.
WALK_CHUNK = 4096


def build_run(keys: pa.Array, values: pa.Array, rows: npt.NDArray[np.int64],
              partitions: npt.NDArray[np.uint16], positions: npt.NDArray[np.int64],
              live: npt.NDArray[np.bool_], inline_limit: int,
              expires: npt.NDArray[np.int64] | None = None, expiring: npt.NDArray[np.bool_] | None = None) -> bytes:
    """The run of ``rows`` of two binary columns (rows in strictly increasing key order): row
    ``i`` points its key at ``(partitions[i], positions[i])``, with its value inline when it is
    at most ``inline_limit`` bytes, or deletes it where ``live[i]`` is false; where
    ``expiring[i]`` is set, the entry expires at ``expires[i]``.

    Raises ``ValueError`` for rows out of order, out of the columns, or of other lengths.
    """
    key_ends, key_data = binary_ends(keys)
    value_ends, value_data = binary_ends(values)
    run: bytes = _runs.build(
        key_ends, key_data, value_ends, value_data, np.ascontiguousarray(rows, dtype=np.int64),
        np.ascontiguousarray(partitions, dtype=np.uint16), np.ascontiguousarray(positions, dtype=np.int64),
        np.ascontiguousarray(live, dtype=np.uint8), int(inline_limit),
        *(() if expires is None or expiring is None else
          (np.ascontiguousarray(expires, dtype=np.int64), np.ascontiguousarray(expiring, dtype=np.uint8))),
    )
    return run


def run_find(run: Buffer, key: bytes) -> bytes | None:
    """``key``'s entry in ``run``: its index value, ``b""`` for a deletion, None for no entry.

    Raises ``ValueError`` if the run is damaged where the search reads it."""
    found: bytes | None = _runs.find(run, key)
    return found


def runs_find(runs: list[Buffer], key: bytes) -> bytes | None:
    """``key``'s entry in the first of ``runs`` holding one (as :func:`run_find`), in one call."""
    found: bytes | None = _runs.find_first(runs, key)
    return found


def run_entries(run: Buffer, lower: bytes | None = None, upper: bytes | None = None,
                limit: int = -1, reverse: bool = False) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` entries with ``lower <= key < upper``: at most ``limit`` (-1: all) of
    them from the low end, or from the high end in descending order when ``reverse``."""
    found: list[tuple[bytes, bytes]] = _runs.entries(run, lower, upper, limit, reverse)
    return found


def walk_run(run: Buffer, lower: bytes | None, upper: bytes | None, *,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
    """The entries of :func:`run_entries` one at a time, made :data:`WALK_CHUNK` at a time."""
    while True:
        chunk = run_entries(run, lower, upper, WALK_CHUNK, reverse)
        yield from chunk
        if len(chunk) < WALK_CHUNK:
            return
        if reverse:
            upper = chunk[-1][0]
        else:
            lower = chunk[-1][0] + b"\x00"


def run_length(run: Buffer) -> int:
    """The number of entries of ``run`` (``ValueError`` if it does not start as a run does)."""
    if len(run) < _HEADER.size:
        raise ValueError("not an index run")
    magic, count = _HEADER.unpack_from(run)
    if magic != _MAGIC or _HEADER.size + 8 * count > len(run):
        raise ValueError("not an index run")
    return int(count)
