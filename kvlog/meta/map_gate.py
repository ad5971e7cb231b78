"""Reading views of the LMDB map safely while the map may be resized.

A read transaction begun with ``buffers=True`` hands out views (memoryviews) that point into
LMDB's memory map. Resizing the map (``set_mapsize``: the map grew, here or in another process)
unmaps it and maps it again, usually at another address: a view taken before then points at
memory that is gone, and reading it crashes the process or reads other pages. py-lmdb ends
every transaction of the environment when it resizes, but cannot reach the views already
handed out, and it releases the GIL while it remaps.

:class:`MapGate` makes a resize and the reading of views exclude each other:

- the transaction that makes views is begun inside the gate, and the epoch it began at is the
  views' *tag* (:meth:`kvlog.meta.env.LmdbEnv.begin_views`);
- every read of views happens between :meth:`MapGate.enter` and :meth:`MapGate.leave`, and
  only if :meth:`MapGate.valid` says the tag is still current (else the views are dead: the
  reader takes new ones, or reports the snapshot ended);
- a resize (:meth:`MapGate.remap`) moves the epoch to an odd value, waits for the readers
  inside to leave (those arriving meanwhile wait for it), remaps, and moves the epoch to the
  next even value.

LMDB also cannot begin a transaction, nor use one that the resize ends, while it remaps: read
transactions are begun inside the gate (:meth:`kvlog.meta.env.LmdbEnv.begin`), and the pooled
transactions gets reuse are used inside it. A tag read by a reader that entered just before a
resize began (odd) matches no epoch after the remap that follows: its views are never read
again. ``_runs.Getter`` enters in C (an item appended to
:attr:`MapGate.inside`, the epoch then checked even, as :meth:`MapGate.enter` does) and reads
views only with a tag equal to the epoch.

Sections between enter and leave never take a lock, begin a transaction or call out to
storage, so a resize waits only for reads already under way.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from types import TracebackType

from kvlog.errors import StorageError

__all__ = ["MapGate", "Views"]

#: How long a resize sleeps between looks at the readers still inside, in seconds.
_DRAIN_POLL_S = 0.0002


class MapGate:
    """The epoch of an LMDB environment's map and the readers of its views (see the module)."""

    __slots__ = ("epoch", "inside", "_lock", "_pause", "_mapped", "_hooks")

    def __init__(self) -> None:
        #: Even while the map is in place; odd while a resize is under way.
        self.epoch = 0
        #: One item per reader inside: list append and pop are atomic under the GIL.
        self.inside: list[None] = []
        self._lock = threading.Lock()
        self._pause = threading.Event()
        self._mapped = threading.Event()  # set while no resize is under way
        self._mapped.set()
        self._hooks: list[weakref.WeakMethod[Callable[[], None]]] = []

    def on_remap(self, hook: Callable[[], None]) -> None:
        """Call the bound method ``hook`` at every resize, once no reader is inside and before
        the map moves: to drop the views a cache keeps. Held weakly: it ends with its object."""
        self._hooks = [ref for ref in self._hooks if ref() is not None]  # those of closed stores go
        self._hooks.append(weakref.WeakMethod(hook))

    def enter(self) -> None:
        """Begin reading views (pair with :meth:`leave`, in ``try``/``finally``); waits for a
        resize under way to end."""
        inside = self.inside
        while True:
            inside.append(None)
            if not self.epoch & 1:
                return
            inside.pop()  # a resize is under way: it waits for no one who came after it
            self._mapped.wait()

    def leave(self) -> None:
        """End reading views."""
        self.inside.pop()

    def views(self, tag: int | None) -> Views:
        """A context in which views tagged ``tag`` are read (None: copies, always readable);
        entering it raises ``StorageError`` if they died with a resize."""
        return Views(self, tag)

    def valid(self, tag: int) -> bool:
        """Whether views tagged ``tag`` may be read now (call between enter and leave)."""
        return tag == self.epoch

    def remap(self, resize: Callable[[], None]) -> None:
        """Run ``resize`` (the map's ``set_mapsize``) once no reader of views is inside, with
        every tag taken before it made invalid."""
        with self._lock:
            self._mapped.clear()
            self.epoch += 1
            try:
                while self.inside:
                    self._pause.wait(_DRAIN_POLL_S)
                for ref in self._hooks:
                    hook = ref()
                    if hook is not None:
                        hook()
                resize()
            finally:
                self.epoch += 1
                self._mapped.set()


class Views:
    """``with views:`` reads the views of one tag inside their gate (see :meth:`MapGate.views`)."""

    __slots__ = ("_gate", "_tag")

    def __init__(self, gate: MapGate, tag: int | None) -> None:
        self._gate = gate
        self._tag = tag

    def __enter__(self) -> None:
        if self._tag is None:
            return
        gate = self._gate
        gate.enter()
        if gate.epoch != self._tag:
            gate.leave()
            raise StorageError("a read's snapshot ended: the metadata cache's map was resized while "
                               "it was open (it doubles as the cache grows); start the read again")

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._tag is not None:
            self._gate.leave()
