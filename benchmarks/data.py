"""Benchmark data and statistics: deterministic keys and values, medians and percentiles.

Keys are 16 bytes: two SplitMix64 outputs of the record's index (big-endian),
so any record's key can be recomputed without keeping the others in memory and
keys are distinct (SplitMix64 is a bijection on 64-bit integers). Values are
100 bytes from ``numpy.random.default_rng(seed)``: incompressible, so
compression cannot flatter the store.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["KEY_BYTES", "VALUE_BYTES", "key_bytes", "keys_at", "make_keys", "make_values", "percentiles", "median"]

KEY_BYTES = 16
VALUE_BYTES = 100

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SALT = np.uint64(0xD6E8FEB86659FD93)


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    # Array arithmetic on uint64 wraps modulo 2^64 without warnings, as SplitMix64 needs.
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def make_keys(start: int, count: int, seed: int = 0) -> list[bytes]:
    """Keys of records ``start .. start + count - 1`` (16 bytes each, distinct, random-looking)."""
    return keys_at(np.arange(start, start + count, dtype=np.uint64), seed)


def key_bytes(indices: npt.NDArray[np.uint64], seed: int = 0) -> bytes:
    """The keys of the records at ``indices`` back to back, ``KEY_BYTES`` each."""
    idx = indices.astype(np.uint64) ^ np.uint64(seed)
    words = np.empty((len(idx), 2), dtype=">u8")
    words[:, 0] = _splitmix64(idx)
    words[:, 1] = _splitmix64(idx ^ _SALT)
    return words.tobytes()


def keys_at(indices: npt.NDArray[np.uint64], seed: int = 0) -> list[bytes]:
    """Keys of the records at ``indices`` (the same keys :func:`make_keys` gives them)."""
    raw = key_bytes(indices, seed)
    return [raw[i : i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES)]


def make_values(start: int, count: int, seed: int = 0, size: int = VALUE_BYTES) -> list[bytes]:
    """Values of records ``start .. start + count - 1`` (``size`` random bytes each)."""
    raw = np.random.default_rng([seed, start]).bytes(count * size)
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def median(runs: Sequence[float]) -> float:
    """The median of ``runs`` (0.0 when empty)."""
    return float(statistics.median(runs)) if runs else 0.0


def percentiles(samples_s: Sequence[float]) -> dict[str, float]:
    """Latency summary in milliseconds: p50, p90, p99, mean, min, max and the sample count."""
    if not samples_s:
        return {"samples": 0}
    ms = np.asarray(samples_s, dtype=np.float64) * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {
        "samples": len(samples_s),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "mean": float(ms.mean()),
        "min": float(ms.min()),
        "max": float(ms.max()),
    }
