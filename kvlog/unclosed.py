"""Handles a program never closed: flushed and closed at interpreter exit, or when freed.

A Python user expects what a file object does: buffered writes reach storage when the
interpreter exits normally and when the handle is garbage-collected, with a
:class:`ResourceWarning`; only a crash loses them. :func:`opened` registers a handle in a
weak set (the set keeps no handle alive), and an ``atexit`` hook closes what is still open
there. A handle the collector frees unclosed is closed in a thread of its own, because the
collector may run anywhere (in the handle's own flusher thread holding its buffer's lock, or
inside another LMDB write transaction); :func:`wait_for_background_closes`, which opening a
store calls, lets those flushes land before a new handle writes. None of this happens in a
forked child for its parent's handles: each handle records the process that opened it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import warnings
import weakref
from typing import Protocol

__all__ = ["Closable", "close_when_freed", "closed", "opened", "wait_for_background_closes"]

log = logging.getLogger("kvlog")


class Closable(Protocol):
    """What this module needs of a handle: its name, whether it is closed, and ``close()``."""

    _owner_pid: int
    _closed: bool

    def close(self) -> None: ...

    def _name(self) -> str: ...


#: The handles opened in this process and not closed yet (weak references).
_open: weakref.WeakSet[Closable] = weakref.WeakSet()
_exiting = False  # set once the exit hook runs: a handle freed after it closes in the freeing thread
#: The threads closing handles the collector freed; opening a store waits for them.
_closing: set[threading.Thread] = set()
_closing_lock = threading.Lock()


def opened(handle: Closable) -> None:
    """Record an open handle of this process."""
    _open.add(handle)


def closed(handle: Closable) -> None:
    """Forget a handle that was closed."""
    _open.discard(handle)


def close_when_freed(handle: Closable) -> None:
    """Warn about and close a handle the collector is freeing unclosed (see the module docstring)."""
    _warn(handle)
    if _exiting:
        _close(handle)
        return
    try:
        # Not a daemon: a normal exit waits for the close, so the writes are flushed.
        closer = threading.Thread(target=_close_in_background, args=(handle,), name="kvlog-close-unclosed")
        with _closing_lock:
            _closing.add(closer)
        closer.start()
    except RuntimeError:  # no new thread at this point of the shutdown
        with _closing_lock:
            _closing.discard(closer)
        _close(handle)


def wait_for_background_closes() -> None:
    """Wait for the closes of handles the collector freed unclosed."""
    with _closing_lock:
        pending = [t for t in _closing if t is not threading.current_thread()]
    for closer in pending:
        closer.join()


def _close(handle: Closable) -> None:
    """Close a handle its program never closed, flushing its buffered writes. A failure is
    logged (logger ``kvlog``) and warned about (:class:`RuntimeWarning`), never raised: this
    runs at interpreter exit or in a thread of its own, where nobody could catch it."""
    try:
        handle.close()
    except BaseException as exc:  # noqa: BLE001 - reported below; raising here reaches nobody
        message = (f"kvlog store {handle._name()}: closing the unclosed handle failed, its "
                   f"unflushed writes are lost: {type(exc).__name__}: {exc}")
        log.error(message)
        try:
            warnings.warn(message, RuntimeWarning, stacklevel=1)
        except Exception:  # noqa: BLE001 - warnings turned into errors: the log has it
            log.debug("the warning about %s was refused", handle._name())


def _close_in_background(handle: Closable) -> None:
    try:
        _close(handle)
    finally:
        with _closing_lock:
            _closing.discard(threading.current_thread())


def _warn(handle: Closable) -> None:
    try:
        warnings.warn(f"unclosed kvlog store {handle._name()} (closed and flushed for you; close it, "
                      "or use it in a with block)", ResourceWarning, source=handle, stacklevel=3)
    except Exception:  # noqa: BLE001 - warnings turned into errors must not stop the close
        log.debug("the warning about unclosed %s was refused", handle._name())


def _close_open_at_exit() -> None:
    """At interpreter exit: close (flush) every handle this process opened and left open; the
    copies of its parent's handles a forked child holds are left alone."""
    global _exiting
    _exiting = True
    pid = os.getpid()
    for handle in list(_open):
        if handle._owner_pid == pid and not handle._closed:
            _warn(handle)
            _close(handle)


atexit.register(_close_open_at_exit)
