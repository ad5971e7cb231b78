"""Injectable time and randomness.

No other kvlog module reads the system clock or a random source directly (a
lint rule enforces it): they receive a :class:`Clock` and an :class:`IdSource`,
so tests can drive time by hand and replay runs exactly.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "ManualClock", "IdSource", "SystemIdSource", "SeededIdSource"]


class Clock(Protocol):
    """A source of wall-clock milliseconds and a monotonic timer for durations."""

    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes back, for measuring durations and waits."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    #: Nanoseconds since the Unix epoch (optional in a :class:`Clock`; the write path's stamps).
    now_ns = staticmethod(time.time_ns)

    #: Seconds on a clock that never goes back (the C function itself: called on every get).
    monotonic_s = staticmethod(time.monotonic)

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to; for tests and simulations."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def now_ns(self) -> int:
        """The current time in nanoseconds (whole milliseconds)."""
        return self.now_ms() * 1_000_000

    def monotonic_s(self) -> float:
        with self._lock:
            return self._now / 1000.0

    def advance(self, ms: int) -> int:
        """Move the clock forward by ``ms`` and return the new time."""
        if ms < 0:
            raise ValueError("a clock never goes back")
        with self._lock:
            self._now += ms
            return self._now

    def set(self, now_ms: int) -> None:
        """Jump to ``now_ms`` (not earlier than the current time)."""
        with self._lock:
            if now_ms < self._now:
                raise ValueError("a clock never goes back")
            self._now = now_ms

    def __repr__(self) -> str:
        return f"ManualClock({self._now})"


class IdSource(Protocol):
    """A source of unique identifiers and random seeds."""

    def token(self, nbytes: int = 16) -> bytes:
        """``nbytes`` unpredictable bytes."""
        ...


class SystemIdSource:
    """Identifiers from the operating system's random source."""

    def token(self, nbytes: int = 16) -> bytes:
        return os.urandom(nbytes)

    def __repr__(self) -> str:
        return "SystemIdSource()"


class SeededIdSource:
    """Deterministic identifiers from a seed; for reproducible tests."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def token(self, nbytes: int = 16) -> bytes:
        with self._lock:
            return self._random.getrandbits(8 * nbytes).to_bytes(nbytes, "big")

    def __repr__(self) -> str:
        return "SeededIdSource(...)"
