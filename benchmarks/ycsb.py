"""YCSB-style workloads: the request distributions, the six core mixes and a runner.

The Yahoo! Cloud Serving Benchmark's core workloads, over the suite's records (16-byte keys,
100-byte values, :mod:`benchmarks.data`):

=====  ==========================================  ==========================
name   operations                                   key chosen by
=====  ==========================================  ==========================
A      50 % reads, 50 % updates                     scrambled zipfian
B      95 % reads, 5 % updates                      scrambled zipfian
C      100 % reads                                  scrambled zipfian
D      95 % reads, 5 % inserts                      latest (newest most often)
E      95 % short scans (1..100 keys), 5 % inserts  scrambled zipfian start
F      50 % reads, 50 % read-modify-writes          scrambled zipfian
=====  ==========================================  ==========================

The zipfian distribution has YCSB's constant 0.99: rank ``r`` (0 = most popular) is drawn
with probability proportional to ``1 / (r + 1) ** 0.99`` by the rejection-free method of Gray
et al. ("Quickly generating billion-record synthetic databases", 1994). *Scrambled*: ranks
are drawn over 10^10 items and hashed (64-bit FNV-1a of the rank's eight bytes) onto the
records, so the popular records are spread over the key space instead of being the first
loaded. *Latest*: the rank counts back from the newest record. Inserts add records
``count, count + 1, ...``, whose keys land at random places of the key order.

A workload's operations are drawn beforehand into a :class:`Stream` (plain lists, so the
timed loop only indexes them), the same stream for every store, and :func:`run_stream`
applies it to a store adapter (:mod:`benchmarks.peers`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from benchmarks.data import VALUE_BYTES, keys_at

__all__ = [
    "INSERT", "READ", "RMW", "SCAN", "UPDATE", "WORKLOADS", "ZIPFIAN_CONSTANT", "Adapter", "Stream",
    "Workload", "fnv1a64", "make_stream", "run_stream", "zeta", "zipfian_ranks",
]

READ, UPDATE, INSERT, SCAN, RMW = 0, 1, 2, 3, 4
ZIPFIAN_CONSTANT = 0.99
#: Items the scrambled zipfian draws its ranks over before hashing them onto the records.
SCRAMBLED_ITEMS = 10_000_000_000
#: Longest short scan (lengths are uniform in 1 .. this).
MAX_SCAN_LENGTH = 100
#: Bytes of a read-modify-write's new value taken from the operation (the rest is the old value's).
RMW_PATCH_BYTES = VALUE_BYTES // 2
#: Terms of the zeta sum added exactly; the rest is the Euler-Maclaurin estimate of the tail.
_EXACT_TERMS = 1 << 20


@dataclass(frozen=True)
class Workload:
    """One mix: operation proportions (read, update, insert, scan, read-modify-write) and the
    key distribution ("zipfian" or "latest")."""

    name: str
    title: str
    read: float = 0.0
    update: float = 0.0
    insert: float = 0.0
    scan: float = 0.0
    rmw: float = 0.0
    distribution: str = "zipfian"


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("A", "update heavy: 50 % reads, 50 % updates", read=0.5, update=0.5),
    Workload("B", "read mostly: 95 % reads, 5 % updates", read=0.95, update=0.05),
    Workload("C", "read only", read=1.0),
    Workload("D", "read latest: 95 % reads, 5 % inserts", read=0.95, insert=0.05, distribution="latest"),
    Workload("E", "short scans: 95 % scans of 1..100 keys, 5 % inserts", scan=0.95, insert=0.05),
    Workload("F", "read-modify-write: 50 % reads, 50 % read-modify-writes", read=0.5, rmw=0.5),
)}


# -- distributions -------------------------------------------------------------------------------

def _zeta_table(m: int, theta: float) -> npt.NDArray[np.float64]:
    """``table[i] = sum_{j=1..i} j ** -theta`` for i = 0 .. m."""
    table = np.zeros(m + 1, dtype=np.float64)
    np.cumsum(np.arange(1, m + 1, dtype=np.float64) ** -theta, out=table[1:])
    return table


def zeta(n: npt.ArrayLike, theta: float = ZIPFIAN_CONSTANT) -> npt.NDArray[np.float64]:
    """``sum_{i=1..n} i ** -theta`` for each ``n``: the first 2^20 terms exactly, the tail by
    Euler-Maclaurin (integral, end-point and first derivative terms; error far below 1e-9)."""
    counts = np.asarray(n, dtype=np.float64)
    m = int(min(_EXACT_TERMS, max(1.0, float(counts.max(initial=1.0)))))
    table = _zeta_table(m, theta)
    small = counts <= m
    out = np.empty_like(counts)
    out[small] = table[counts[small].astype(np.int64)]
    big = counts[~small]
    if big.size:
        mf = float(m)
        tail = ((big ** (1 - theta) - mf ** (1 - theta)) / (1 - theta)
                + (big ** -theta - mf ** -theta) / 2
                - theta / 12 * (big ** (-theta - 1) - mf ** (-theta - 1)))
        out[~small] = table[m] + tail
    return out


def zipfian_ranks(u: npt.NDArray[np.float64], items: npt.ArrayLike, zetan: npt.ArrayLike,
                  theta: float = ZIPFIAN_CONSTANT) -> npt.NDArray[np.int64]:
    """Ranks in ``0 .. items - 1`` (0 most often) for uniform draws ``u`` in [0, 1), given
    ``zetan = zeta(items)`` (both scalars or one per draw)."""
    n = np.asarray(items, dtype=np.float64)
    zn = np.asarray(zetan, dtype=np.float64)
    alpha = 1.0 / (1.0 - theta)
    half = 0.5 ** theta
    eta = (1.0 - (2.0 / n) ** (1.0 - theta)) / (1.0 - (1.0 + half) / zn)
    ranks = np.floor(n * (eta * u - eta + 1.0) ** alpha)
    uz = u * zn
    ranks = np.where(uz < 1.0 + half, 1.0, ranks)
    ranks = np.where(uz < 1.0, 0.0, ranks)
    return np.minimum(ranks, n - 1).astype(np.int64)


def fnv1a64(values: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """64-bit FNV-1a of each value's eight little-endian bytes."""
    x = values.astype(np.uint64)
    h = np.full(x.shape, 0xCBF29CE484222325, dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
    for shift in range(0, 64, 8):
        h ^= (x >> np.uint64(shift)) & np.uint64(0xFF)
        h *= prime  # wraps modulo 2^64, as FNV needs
    return h


# -- streams -------------------------------------------------------------------------------------

@dataclass
class Stream:
    """A workload's operations, drawn beforehand: ``codes[i]`` on ``keys[i]`` with ``values[i]``
    (updates, inserts, read-modify-writes) or ``lengths[i]`` keys (scans)."""

    workload: Workload
    codes: list[int]
    keys: list[bytes]
    values: list[bytes | None]
    lengths: list[int]
    records_before: int
    """Records the stores hold before the stream (its inserts add records from this index on)."""

    @property
    def inserts(self) -> int:
        return self.codes.count(INSERT)

    def __len__(self) -> int:
        return len(self.codes)


def make_stream(workload: Workload, records: int, ops: int, seed: int) -> Stream:
    """``ops`` operations of ``workload`` on stores holding records ``0 .. records - 1``."""
    rng = np.random.default_rng([seed, ord(workload.name), records])
    shares = np.array([workload.read, workload.update, workload.insert, workload.scan, workload.rmw])
    bounds = np.cumsum(shares / shares.sum())
    codes = np.minimum(np.searchsorted(bounds, rng.random(ops), side="right"), RMW).astype(np.int64)
    inserting = codes == INSERT
    before = records + np.cumsum(inserting) - inserting  # records when each operation runs
    u = rng.random(ops)
    if workload.distribution == "latest":
        ranks = zipfian_ranks(u, before, zeta(before))
        chosen = before - 1 - ranks
    else:
        ranks = zipfian_ranks(u, SCRAMBLED_ITEMS, zeta(SCRAMBLED_ITEMS))
        chosen = (fnv1a64(ranks) % before.astype(np.uint64)).astype(np.int64)
    chosen = np.where(inserting, before, chosen)  # an insert writes the next new record
    lengths = np.where(codes == SCAN, rng.integers(1, MAX_SCAN_LENGTH + 1, size=ops), 0)
    writes = np.flatnonzero((codes == UPDATE) | inserting | (codes == RMW))
    raw = rng.bytes(len(writes) * VALUE_BYTES)
    values: list[bytes | None] = [None] * ops
    for j, i in enumerate(writes.tolist()):
        values[i] = raw[j * VALUE_BYTES:(j + 1) * VALUE_BYTES]
    return Stream(workload, codes.tolist(), keys_at(chosen.astype(np.uint64)), values,
                  lengths.tolist(), records)


# -- running -------------------------------------------------------------------------------------

class Adapter(Protocol):
    """What :func:`run_stream` calls on a store (see :mod:`benchmarks.peers`)."""

    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, value: bytes) -> None: ...
    def scan(self, start: bytes, count: int) -> list[tuple[bytes, bytes]]: ...
    def read_modify_write(self, key: bytes, patch: bytes) -> bytes | None: ...


def patched(old: bytes, patch: bytes) -> bytes:
    """A read-modify-write's new value: the operation's first half, the old value's second."""
    return patch[:RMW_PATCH_BYTES] + old[RMW_PATCH_BYTES:]


@dataclass
class Outcome:
    """What a stream's reads found: a check that every store answered alike."""

    found: int = 0
    """Reads and read-modify-writes that found their key."""
    scanned: int = 0
    """Pairs the scans returned."""


def run_stream(db: Adapter, stream: Stream,
               answer: Callable[[Any], None] | None = None) -> Outcome:
    """Apply ``stream`` to ``db``; with ``answer``, pass it every operation's answer (a read's
    value, a scan's pairs, a read-modify-write's new value, None for a write)."""
    get, put, scan, rmw = db.get, db.put, db.scan, db.read_modify_write
    found = scanned = 0
    for code, key, value, length in zip(stream.codes, stream.keys, stream.values, stream.lengths,
                                        strict=True):
        got: Any
        if code == READ:
            got = get(key)
            if got is not None:
                found += 1
        elif code == SCAN:
            got = scan(key, length)
            scanned += len(got)
        elif code == RMW:
            assert value is not None
            got = rmw(key, value)
            if got is not None:
                found += 1
        else:
            assert value is not None
            put(key, value)
            got = None
        if answer is not None:
            answer(got)
    return Outcome(found, scanned)
