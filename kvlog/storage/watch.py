"""Being told when a local object is replaced, instead of looking for it.

A commit moves the head (``log/head.json``) by renaming a new file over it. On Linux the
kernel reports that rename to whoever watches the directory (inotify), so a process waiting
for another process's commit wakes when it lands rather than at its next look. Only renames
onto the watched name count (``IN_MOVED_TO``): the temporary files and commit copies a commit
also creates are not renames onto it. A name written in place (a copy put back with ``cp``)
is not reported: waiters still look every ``follow_interval_ms``, which catches it.

Where inotify is missing (another system, a filesystem without it, the per-user limit of
instances reached), or the directory does not exist yet (a store before its first commit has
no ``log/``), :func:`watch_renames` returns None and callers only look.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import select
import struct
from collections.abc import Callable
from pathlib import Path

__all__ = ["RenameWatch", "watch_renames"]

_IN_MOVED_TO = 0x00000080
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = 0o2000000
#: ``struct inotify_event`` without its name: watch descriptor, mask, cookie, name length.
_EVENT = struct.Struct("iIII")
#: Enough for every event a burst of renames queues before the reader drains them.
_READ_BYTES = 64 * 1024


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


class RenameWatch:
    """A watch for renames onto one name in one directory (close it when done)."""

    def __init__(self, fd: int, name: bytes) -> None:
        self._fd = fd
        self._name = name

    def wait(self, timeout_s: float, monotonic_s: Callable[[], float]) -> bool:
        """Sleep until a rename onto the name is reported or ``timeout_s`` passes (by
        ``monotonic_s``, the caller's clock); whether one was. Renames onto other names are
        drained and the sleep goes on for what is left of it."""
        if self._fd < 0:
            raise ValueError("the watch is closed")
        deadline = monotonic_s() + max(timeout_s, 0.0)
        left = max(timeout_s, 0.0)
        poller = select.poll()  # not select(): a process may hold descriptors past FD_SETSIZE
        poller.register(self._fd, select.POLLIN)
        while True:
            if not poller.poll(math.ceil(left * 1000)):
                return False
            if self.drain():
                return True
            left = deadline - monotonic_s()
            if left <= 0:
                return False

    def fileno(self) -> int:
        """The descriptor that becomes readable when a rename is reported (an event loop's
        reader: :meth:`drain` it once woken)."""
        return self._fd

    def drain(self) -> bool:
        """Read every reported rename without waiting; whether one was onto the name."""
        seen = False
        while True:
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                return seen
            at = 0
            while at + _EVENT.size <= len(data):
                _wd, _mask, _cookie, length = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size:at + _EVENT.size + length].rstrip(b"\0")
                seen = seen or name == self._name
                at += _EVENT.size + length

    def close(self) -> None:
        """Stop watching (idempotent)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> RenameWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def watch_renames(path: Path) -> RenameWatch | None:
    """A watch for renames onto ``path`` (whose directory must exist), or None where the
    kernel cannot give one."""
    if _LIBC is None:
        return None
    fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return None  # EMFILE: the per-user limit of instances (fs.inotify.max_user_instances)
    if _LIBC.inotify_add_watch(fd, os.fsencode(path.parent), _IN_MOVED_TO) < 0:
        os.close(fd)  # a missing directory, or the per-user limit of watches
        return None
    return RenameWatch(fd, os.fsencode(path.name))
