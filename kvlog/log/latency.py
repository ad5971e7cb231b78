"""A latency histogram a hot path can afford: fixed buckets, counted under a lock.

The committer records how long each commit took (from the call to its outcome, retries
included); ``stats()`` shows it and :mod:`kvlog.metrics` exports it as a Prometheus histogram.
An observation is one bisection and three additions: far below a commit's own cost.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

__all__ = ["BOUNDS_S", "Histogram", "HistogramSnapshot"]

#: Upper bounds of the buckets, in seconds (a last, unbounded bucket follows): a local fsync
#: is a fraction of a millisecond, an S3 request a few to tens, a stalled one seconds.
BOUNDS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                               1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class HistogramSnapshot:
    """Counts per bucket (not cumulative; one more than the bounds), their sum and count."""

    bounds_s: tuple[float, ...]
    counts: tuple[int, ...]
    sum_s: float
    count: int

    def to_json(self) -> dict[str, object]:
        return {"bounds_s": list(self.bounds_s), "counts": list(self.counts), "sum_s": self.sum_s,
                "count": self.count}


class Histogram:
    """Observations in the buckets of :data:`BOUNDS_S`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(BOUNDS_S) + 1)
        self._sum = 0.0
        self._count = 0

    def observe(self, seconds: float) -> None:
        """Count one observation."""
        slot = bisect.bisect_left(BOUNDS_S, seconds)
        with self._lock:
            self._counts[slot] += 1
            self._sum += seconds
            self._count += 1

    def snapshot(self) -> HistogramSnapshot:
        """The counts so far."""
        with self._lock:
            return HistogramSnapshot(BOUNDS_S, tuple(self._counts), self._sum, self._count)
