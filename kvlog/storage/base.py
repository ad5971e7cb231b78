"""The storage contract every backend fulfils.

Names are ``/``-separated relative paths such as ``log/00000000000000000001.json``.
Keys and values never become names (object names carry no user data). The contract:

* :meth:`Storage.read`, :meth:`Storage.read_range`, :meth:`Storage.stat` raise
  :class:`FileNotFoundError` for a missing object;
* :meth:`Storage.put_if_absent` makes the whole object visible atomically, or raises
  :class:`FileExistsError` when the name exists;
* :meth:`Storage.swap` is the commit point: it replaces an object only while it is the
  version the caller read (a token from :meth:`Storage.read_versioned` or an earlier swap),
  or raises ``SwapConflict`` and changes nothing;
* :meth:`Storage.delete` of a missing object is not an error;
* everything else the backend fails with is a :class:`~kvlog.errors.StorageError`
  that chains the cause. A ``StorageError`` from a write does not say whether
  the write happened: callers that must know read back.
"""

from __future__ import annotations

import mmap
import os
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from kvlog.errors import StorageError
from kvlog.storage.watch import RenameWatch

__all__ = ["ObjectInfo", "ForwardStream", "Storage", "SwapConflict", "check_name", "BytesLike"]

BytesLike = bytes | bytearray | memoryview


class SwapConflict(FileExistsError):
    """``Storage.swap`` found the object at another version than the one expected (or
    present when it expected none): nothing was written."""


@dataclass(frozen=True)
class ObjectInfo:
    """What :meth:`Storage.stat` and :meth:`Storage.list` report of one object."""

    name: str
    size: int
    mtime_ms: int


class ForwardStream(Protocol):
    """A read-only stream over one object that only moves forward (one request on object stores)."""

    @property
    def position(self) -> int:
        """Offset of the next byte :meth:`read` returns."""
        ...

    def read(self, n: int) -> BytesLike:
        """Up to ``n`` bytes; fewer only at the end of the object (a local file's stream returns
        read-only views of a memory mapping, which stay valid after :meth:`close`)."""
        ...

    def skip_to(self, position: int) -> None:
        """Move forward to ``position``; raises ``ValueError`` if it lies behind."""
        ...

    def close(self) -> None:
        """Release the underlying file or connection."""
        ...


class Storage(ABC):
    """A flat namespace of immutable-by-convention objects under one root.

    Each instance counts its requests by kind in :attr:`requests` (``get``,
    ``range_get``, ``stream``, ``put``, ``put_if_absent``, ``swap``, ``stat``, ``list``,
    ``delete``), so tests and benchmarks can measure I/O instead of assuming it.
    """

    #: The URI this storage was opened from (never with credentials).
    uri: str

    #: Attributes a pickled copy leaves behind (locks, live clients); :meth:`_rebuild`
    #: recreates them. Subclasses extend the tuple and the method.
    _transient: ClassVar[tuple[str, ...]] = ("_count_lock",)

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        #: Bytes sent (``"sent"``: puts and swaps) and received (``"received"``: whole and ranged
        #: reads; streamed reads count as requests only), and, on a local root, ``"fsyncs"``.
        self.traffic: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle cheaply (for Spark executors): no locks or clients; the copy counts its own requests."""
        state = {k: v for k, v in self.__dict__.items() if k not in self._transient}
        state["requests"] = Counter()
        state["traffic"] = Counter()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._rebuild()

    def _rebuild(self) -> None:
        """Recreate the :attr:`_transient` attributes (after unpickling)."""
        self._count_lock = threading.Lock()

    def _count(self, kind: str, sent: int = 0) -> None:
        with self._count_lock:
            self.requests[kind] += 1
            self.traffic["sent"] += sent

    def _received(self, data: bytes) -> bytes:
        """``data``, counted as received."""
        with self._count_lock:
            self.traffic["received"] += len(data)
        return data

    def _fsynced(self) -> None:
        with self._count_lock:
            self.traffic["fsyncs"] += 1

    @abstractmethod
    def read(self, name: str) -> bytes:
        """The whole object. Raises ``FileNotFoundError``."""

    @abstractmethod
    def read_range(self, name: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer at the end of the object). Raises ``FileNotFoundError``."""

    @abstractmethod
    def open_stream(self, name: str, start: int = 0) -> ForwardStream:
        """A forward-only stream from ``start``. Raises ``FileNotFoundError``."""

    @abstractmethod
    def put_if_absent(self, name: str, data: BytesLike) -> None:
        """Create ``name`` atomically; raises ``FileExistsError`` if it exists (then nothing changes)."""

    @abstractmethod
    def put(self, name: str, data: BytesLike) -> None:
        """Create or replace ``name``; readers see the old or the new object whole, never a mix."""

    def put_file(self, name: str, path: Path) -> None:
        """Create or replace ``name`` with the bytes of the local file ``path``, as :meth:`put`.

        ``path`` is the caller's scratch file: a backend may move it into place, so the caller
        must not use it afterwards (it may still be there; deleting it is the caller's). Here
        it is memory-mapped and handed to :meth:`put`; raises ``StorageError``.
        """
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    self.put(name, b"")
                    return
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
                    self.put(name, view)
        except OSError as e:
            raise StorageError(f"cannot read {path} to write {name}: {e}") from e

    @abstractmethod
    def read_versioned(self, name: str, unless: str | None = None) -> tuple[bytes, str] | None:
        """The whole object and a token naming this version of it, for :meth:`swap`; None
        when it is still the version ``unless`` names (an object store then sends no body).
        Raises ``FileNotFoundError``."""

    @abstractmethod
    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        """Replace ``name`` with ``data`` only while it is the version ``expected`` names
        (None: only while ``name`` is absent), atomically; return the new version's token.
        Raises ``SwapConflict`` when ``name`` is another version (nothing changes).

        ``copy_to``: a second name that holds ``data`` too once the swap succeeded, for
        readers that read it by name afterwards. A local root makes the copy with the swap
        (under the same lock, in the same directory fsync); an object store writes it with
        a second request after the swap, so a crash between the two leaves the swap without
        its copy (the caller writes it again). The copy replaces whatever had that name.
        A ``StorageError`` says neither whether the swap happened nor whether the copy did.
        """

    def watch_swaps(self, name: str) -> RenameWatch | None:
        """A watch that wakes when ``name`` is swapped (see :mod:`kvlog.storage.watch`), or
        None: this backend does not tell, and a waiter looks for changes itself."""
        return None

    @abstractmethod
    def stat(self, name: str) -> ObjectInfo:
        """Size and modification time. Raises ``FileNotFoundError``."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose name starts with ``prefix``, sorted by name."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove ``name``; a missing object is not an error."""

    def exists(self, name: str) -> bool:
        """Whether ``name`` exists."""
        try:
            self.stat(name)
        except FileNotFoundError:
            return False
        return True

    def iter_names(self, prefix: str = "") -> Iterator[str]:
        """Names of :meth:`list`, in order."""
        for info in self.list(prefix):
            yield info.name

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release clients and connections; the object may not be used afterwards."""

    def crash_point(self, step: str) -> None:  # noqa: B027 - a hook only FaultyStorage uses
        """Library code reached the named ``step`` of a flow (e.g. ``"after_data_write"``).

        Does nothing here; :class:`kvlog.storage.faulty.FaultyStorage` may raise
        ``SimulatedCrash`` at it, so tests can crash a flow between its steps.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def check_name(name: str) -> str:
    """Validate an object name: relative, ``/``-separated, no empty, ``.`` or ``..`` parts."""
    if not isinstance(name, str) or not name:
        raise StorageError(f"invalid object name {name!r}")
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"invalid object name {name!r}")
    return name
