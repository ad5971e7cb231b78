"""Being told when a local object is replaced, instead of looking for it.

A commit moves the head (``log/head.json``) by renaming a new file over it. On Linux the
kernel reports that rename to whoever watches the directory (inotify, through
``inotify_simple``), so a process waiting for another process's commit wakes when it lands
rather than at its next look. Only renames onto the watched name count (``IN_MOVED_TO``): the
temporary files and commit copies a commit also creates are not renames onto it. A name
written in place (a copy put back with ``cp``) is not reported: waiters still look every
``follow_interval_ms``, which catches it.

Where inotify is missing (another system, a filesystem without it, the per-user limit of
instances reached), or the directory does not exist yet (a store before its first commit has
no ``log/``), :func:`watch_renames` returns None and callers only look.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

try:
    from inotify_simple import INotify, flags
except ImportError:  # not Linux: the dependency is only installed there
    INotify = None

__all__ = ["RenameWatch", "watch_renames"]


class RenameWatch:
    """A watch for renames onto one name in one directory (close it when done)."""

    def __init__(self, inotify: INotify, name: str) -> None:
        self._inotify = inotify
        self._name = name

    def fileno(self) -> int:
        """The descriptor that becomes readable when a rename is reported (an event loop's
        reader: :meth:`drain` it once woken). ``ValueError`` once closed."""
        return int(self._inotify.fileno())

    def drain(self) -> bool:
        """Read every reported rename without waiting; whether one was onto the name."""
        return any(event.name == self._name for event in self._inotify.read(timeout=0))

    def wait(self, timeout_s: float, monotonic_s: Callable[[], float]) -> bool:
        """Sleep until a rename onto the name is reported or ``timeout_s`` passes (by
        ``monotonic_s``, the caller's clock); whether one was. Renames onto other names are
        read and the sleep goes on for what is left of it. ``ValueError`` once closed."""
        if self._inotify.closed:
            raise ValueError("the watch is closed")
        deadline = monotonic_s() + max(timeout_s, 0.0)
        left = max(timeout_s, 0.0)
        while True:
            events = self._inotify.read(timeout=math.ceil(left * 1000))  # poll(), not select()
            if any(event.name == self._name for event in events):
                return True
            left = deadline - monotonic_s()
            if not events or left <= 0:
                return False

    def close(self) -> None:
        """Stop watching (idempotent)."""
        self._inotify.close()

    def __enter__(self) -> RenameWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def watch_renames(path: Path) -> RenameWatch | None:
    """A watch for renames onto ``path`` (whose directory must exist), or None where the
    kernel cannot give one."""
    if INotify is None:
        return None
    try:
        inotify = INotify(nonblocking=True)
    except OSError:  # EMFILE: the per-user limit of instances (fs.inotify.max_user_instances)
        return None
    try:
        inotify.add_watch(path.parent, flags.MOVED_TO)
    except OSError:  # a missing directory, or the per-user limit of watches
        inotify.close()
        return None
    return RenameWatch(inotify, path.name)
