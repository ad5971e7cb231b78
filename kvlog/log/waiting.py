"""Waiting for commits: block until a commit newer than a version is applied to this cache.

A commit this process writes wakes waiters at once: the committer notifies :class:`CommitSignal`
after every commit it applies. On a local root, so does every other process's commit: the
head (``log/head.json``) moves by a rename, which the kernel reports to a waiter watching it
(:mod:`kvlog.storage.watch`); the waiter then applies what landed
(:meth:`kvlog.log.log.Log.refresh`). Where storage cannot tell (S3, or no inotify), and on a
local root too as a backstop, the waiter reads the head every ``follow_interval_ms``.
Nothing busy-waits: between looks the waiter sleeps on the signal's condition, or on the
watch (which this process's own commits, being renames too, wake as well).

The deadline is read from the injected clock. A clock that does not move by itself (a test's
:class:`~kvlog.clock.ManualClock`) still ends the wait: the slept slices are counted too, and
the wait ends when either says the timeout has passed (a slice a commit cut short is not
counted: it may have lasted a moment).
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

from kvlog.errors import InvalidRecordError
from kvlog.log.head import HEAD_NAME

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["CommitSignal", "check_timeout", "wait_for_commit"]


class CommitSignal:
    """Counts the commits applied to this process's cache and wakes whoever waits for one."""

    def __init__(self) -> None:
        # Held as the lock itself, never as the condition, whose Python-level ``__enter__`` a
        # KeyboardInterrupt can leave with the lock held (see ``kvlog.log.flusher``).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._applied = 0

    def notify(self) -> None:
        """One more commit was applied: wake every waiter."""
        with self._lock:
            self._applied += 1
            self._cond.notify_all()

    @property
    def applied(self) -> int:
        """How many commits were applied since the cache was opened (a waiter's ticket)."""
        with self._lock:
            return self._applied

    def wait(self, seen: int, seconds: float) -> bool:
        """Sleep until a commit is applied after ticket ``seen``, or ``seconds`` pass; whether a
        commit woke it (False: the whole ``seconds`` were slept)."""
        with self._lock:
            return self._cond.wait_for(lambda: self._applied != seen, seconds)


def check_timeout(timeout_s: float) -> float:
    """``timeout_s`` as a float if it is a number >= 0, else :class:`InvalidRecordError`."""
    if (not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool)
            or math.isnan(timeout_s) or timeout_s < 0):
        raise InvalidRecordError(f"timeout_s must be a number >= 0, not {timeout_s!r}")
    return float(timeout_s)


def wait_for_commit(the_log: Log, signal: CommitSignal, after_version: int, timeout_s: float) -> int:
    """Block until a commit newer than ``after_version`` is applied to this cache, or
    ``timeout_s`` passes; return the applied version (``<= after_version`` on a timeout)."""
    if not isinstance(after_version, int) or isinstance(after_version, bool) or after_version < 0:
        raise InvalidRecordError(f"after_version must be an integer >= 0, not {after_version!r}")
    timeout = check_timeout(timeout_s)
    the_log.check_open()
    monotonic_s = the_log.clock.monotonic_s
    deadline = monotonic_s() + timeout
    interval = the_log.config.follow_interval_ms / 1000.0
    slept = 0.0
    # Watching from before the first look: a swap between that look and the sleep wakes it.
    watch = the_log.storage.watch_swaps(HEAD_NAME) if timeout > 0 else None
    try:
        while True:
            seen = signal.applied
            version = the_log.version
            if version <= after_version:
                version = the_log.refresh()  # commits of other processes that landed meanwhile
            if version > after_version:
                return version
            remaining = min(deadline - monotonic_s(), timeout - slept)
            if remaining <= 0:
                return version
            pause = min(interval, remaining)
            woke = watch.wait(pause, monotonic_s) if watch is not None else signal.wait(seen, pause)
            if not woke:
                slept += pause  # a commit that woke it early (short of the version) slept less
    finally:
        if watch is not None:
            watch.close()
