"""Pins: this process's read views that GC must not take files from.

A read view (:class:`kvlog.Snapshot`) reads the data files live at the commit it is pinned
at. Compaction replaces files, and GC (:mod:`kvlog.log.gc`) deletes a replaced file once its
delay has passed; while a view is open, that file may still be one it reads. The rule GC
follows: **a replaced file is not deleted while a pin is held that was taken before the file
was replaced.** A pin records the replaced files pending deletion in its own snapshot (the
files replaced at or before its commit, which it never reads); any other replaced file may
have been live at its commit, so GC keeps it until the pin is released.

A pin is registered *before* its view's read snapshot begins and protects every replaced
file until it has recorded its own set (:meth:`Pin.settle`). So whatever GC checked before
the pin existed was pending in a snapshot no newer than the view's: a file GC deleted then
was already replaced at the view's commit, and the view never reads it.

Pins are per process: every handle of one store in a process (a writer, read-only handles,
each with its own cache) shares one registry (:func:`registry_for`, keyed by the store's
UUID), so GC by any of them keeps the files replaced after the commit of a snapshot of any
of them (data file paths are the same in every handle of a store). A handle whose cache lags
behind the one that runs GC reads, as any reader does, within ``file_delete_delay_ms`` of
the replacements it has not applied yet. GC in another process does not see them: there a replaced file waits
``file_delete_delay_ms`` after its replacement, and named checkpoints are the pins that hold
across processes.
"""

from __future__ import annotations

import threading
import weakref

__all__ = ["Pin", "PinRegistry", "registry_for"]


class Pin:
    """One held pin; :meth:`release` it when its view closes."""

    def __init__(self, registry: PinRegistry) -> None:
        self._registry = registry
        #: The replaced files pending deletion in the pinned snapshot; None until settled (every
        #: replaced file is protected meanwhile).
        self.replaced: frozenset[str] | None = None
        #: The commit version pinned (-1 until settled).
        self.version = -1

    def settle(self, version: int, replaced: frozenset[str]) -> None:
        """Record the pinned commit and the files already replaced in its snapshot."""
        self.replaced = replaced
        self.version = version

    def protects(self, path: str) -> bool:
        """Whether the pinned snapshot may read the replaced file ``path``."""
        replaced = self.replaced
        return replaced is None or path not in replaced

    def release(self) -> None:
        """Let GC take this pin's files (idempotent)."""
        self._registry._forget(self)


class PinRegistry:
    """The pins held in this process on one store (shared by its open logs, see :func:`registry_for`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pins: set[Pin] = set()

    def pin(self) -> Pin:
        """A new pin protecting every replaced file until it is settled."""
        pin = Pin(self)
        with self._lock:
            self._pins.add(pin)
        return pin

    def protects(self, path: str) -> bool:
        """Whether a held pin keeps the replaced file ``path`` from deletion."""
        with self._lock:
            pins = list(self._pins)
        return any(pin.protects(path) for pin in pins)

    def held(self) -> int:
        """How many pins are held."""
        with self._lock:
            return len(self._pins)

    def oldest_version(self) -> int | None:
        """The oldest commit version a settled pin holds (None: none held)."""
        with self._lock:
            versions = [pin.version for pin in self._pins if pin.version >= 0]
        return min(versions, default=None)

    def _forget(self, pin: Pin) -> None:
        with self._lock:
            self._pins.discard(pin)


_registries: weakref.WeakValueDictionary[str, PinRegistry] = weakref.WeakValueDictionary()
_registries_lock = threading.Lock()


def registry_for(store_uuid: str) -> PinRegistry:
    """The registry of this process's pins on the store ``store_uuid``: one while any open log
    of that store holds it."""
    with _registries_lock:
        registry = _registries.get(store_uuid)
        if registry is None:
            registry = _registries[store_uuid] = PinRegistry()
        return registry
