"""The write buffer's put in Python: the twin of the compiled ``_writebuffer`` (same interface,
same results and errors); :mod:`kvlog._native` picks one of them.

A :class:`WriteBuffer` holds the three columns of buffered records (lists of keys, values and
timestamps), the count of buffered bytes and the trigger past which a put needs the flusher's
attention; :meth:`WriteBuffer.put` appends one record and sets it in the memtable's ``front``
dict under the memtable's lock. :mod:`kvlog.log.flusher` owns the buffer and documents it.

This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["WriteBuffer"]


class WriteBuffer:
    """Columns of buffered records and the put (see kvlog.log.flusher)."""

    __slots__ = ("keys", "values", "stamps", "fatal", "buffered_bytes", "trigger",
                 "_memtable", "_acquire", "_release", "_now_ns", "_overhead")

    def __init__(self, memtable: Any, lock: Any, now_ns: Callable[[], int], overhead: int) -> None:
        self._acquire: Callable[[], object] = lock.acquire
        self._release: Callable[[], object] = lock.release
        self.keys: list[bytes] = []
        self.values: list[bytes | None] = []
        self.stamps: list[int] = []
        self._memtable = memtable
        self._now_ns = now_ns
        self.fatal: BaseException | None = None
        self.buffered_bytes = 0
        self.trigger = 0
        self._overhead = int(overhead)

    def put(self, key: bytes, value: bytes, /) -> bool:
        """Buffer one put of a validated key and value; returns whether the trigger was reached."""
        try:
            now_ns, acquire, release, memtable = self._now_ns, self._acquire, self._release, self._memtable
        except AttributeError:
            raise RuntimeError("the write buffer was not initialised") from None
        if type(key) is not bytes or type(value) is not bytes:
            raise TypeError("put() takes bytes (validated by the caller)")
        fatal = getattr(self, "fatal", None)
        if fatal is not None:
            if isinstance(fatal, BaseException):
                raise fatal
            raise RuntimeError("the write buffer is failed")
        stamp = now_ns()
        acquire()
        try:
            try:
                keys, values, stamps = self.keys, self.values, self.stamps
            except AttributeError:
                raise TypeError("the write buffer's columns must be lists") from None
            if type(keys) is not list or type(values) is not list or type(stamps) is not list:
                raise TypeError("the write buffer's columns must be lists")
            lengths = len(keys), len(values), len(stamps)
            try:
                keys.append(key)
                values.append(value)
                stamps.append(stamp)
                memtable.front[key] = value
            except BaseException:
                # The record is taken back from each column it reached (an interrupt may come
                # between two appends): the columns stay aligned.
                del keys[lengths[0]:], values[lengths[1]:], stamps[lengths[2]:]
                raise
            self.buffered_bytes += len(key) + len(value) + self._overhead
        finally:
            release()
        return self.buffered_bytes >= self.trigger
