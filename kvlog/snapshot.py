"""Snapshots: read views of a store pinned at one commit, kept open as long as needed.

:meth:`kvlog.Store.snapshot` opens one. It answers as the store did when it was taken: the
commit applied then (one LMDB read snapshot of the catalog and the key index, held for the
snapshot's life) with this process's writes made before it (a copy of the memtable). Later
writes of any process are not visible. While it is open, GC in this process keeps every data
file it may read (``kvlog.log.pins``), so compaction and GC never break its reads. GC in
another process does not know it: there a file replaced after the snapshot's commit goes once
``file_delete_delay_ms`` has passed, and a read of it then raises
:class:`~kvlog.errors.CorruptDataError` saying so (a snapshot reads one commit and never a
newer one; a named checkpoint is the pin every process's GC keeps).

A snapshot is released by :meth:`Snapshot.close`, by the ``with`` block's end, by
:meth:`kvlog.Store.close`, or when it is garbage-collected unclosed; its reads then raise
:class:`~kvlog.errors.StoreClosedError`. One snapshot is used by one thread at a time.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from types import TracebackType
from typing import Any, Protocol, cast

from kvlog.config import KEY_BYTES_LIMIT
from kvlog.errors import CorruptDataError, InvalidRecordError, StoreClosedError
from kvlog.index import IndexEntry, IndexView, RecordExpired
from kvlog.log import Log
from kvlog.log.pins import Pin
from kvlog.log.reader import DataFileMissing
from kvlog.log.records import to_key
from kvlog.meta import MetaReader

__all__ = ["OpenScans", "Snapshot", "key_bound", "open_snapshot", "to_keys"]

_MISSING = object()


def to_keys(keys: Iterable[bytes | str]) -> list[bytes]:
    """``keys`` as a list of valid keys (of any length a store may hold), or
    ``InvalidRecordError`` before anything is read: not one key, not a non-iterable, no bad key."""
    if isinstance(keys, bytes | str | bytearray | memoryview):
        raise InvalidRecordError("get_many takes an iterable of keys, not one key")
    try:
        items = list(keys)
    except TypeError:
        raise InvalidRecordError(
            f"get_many takes an iterable of keys, not {type(keys).__name__}") from None
    return [key if type(key) is bytes and 0 < len(key) <= KEY_BYTES_LIMIT else to_key(key, KEY_BYTES_LIMIT)
            for key in items]


def key_bound(value: bytes | str) -> bytes:
    """A scan bound or prefix as bytes, or ``InvalidRecordError``."""
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidRecordError(f"a key bound is not valid UTF-8 text: {e.reason}") from None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvalidRecordError(f"a key bound must be bytes or str, not {type(value).__name__}")


class Clearable(Protocol):
    """A part of a scan that stops it once cleared: a list of pairs, or an iterator of the
    index's that hands out nothing more after ``clear()``."""

    def clear(self) -> None: ...


class _Scan:
    """A scan in progress: the part it is handing out that can be cleared (None: none)."""

    __slots__ = ("part", "__weakref__")

    def __init__(self) -> None:
        self.part: Clearable | None = None


class OpenScans:
    """The scans of a store (or snapshot) in progress, so that closing it stops them: a scan's
    pairs come in parts (lists made for it, the index's walks, or other iterators), chained
    with no Python frame per pair for the parts that can be cleared (:class:`Clearable`);
    :meth:`close` clears the part each scan is handing out, and the scan raises
    :class:`StoreClosedError` at its next step."""

    def __init__(self, closed: Callable[[], bool], message: str) -> None:
        self._closed = closed
        self._message = message
        # The scans started and not ended: each joins at its first step and leaves when it ends
        # or is abandoned (its generator closed), so a scan never started costs nothing here.
        self._scans: set[_Scan] = set()

    def items(self, parts: Iterator[list[tuple[bytes, bytes]] | Iterator[tuple[bytes, bytes]]]
              ) -> Iterator[tuple[bytes, bytes]]:
        """The pairs of ``parts`` until closed, then :class:`StoreClosedError` (whatever the
        closed snapshot or storage would have raised)."""
        return chain.from_iterable(self._parts(parts))

    def _parts(self, parts: Iterator[list[tuple[bytes, bytes]] | Iterator[tuple[bytes, bytes]]]
               ) -> Iterator[list[tuple[bytes, bytes]] | Iterator[tuple[bytes, bytes]]]:
        closed = self._closed
        scan = _Scan()
        scans = self._scans
        scans.add(scan)
        try:
            while not closed():  # never reads a closed store's storage for the next part
                part = next(parts, None)
                if part is None:
                    scan.part = None
                    if not closed():
                        return
                    break
                if hasattr(part, "clear"):  # Clearable (a runtime-checked isinstance costs more)
                    scan.part = cast(Clearable, part)
                    if closed():  # closed between the check and here: close() missed this part
                        break
                    yield part
                else:
                    scan.part = None
                    yield self._iterated(part)
        except Exception:
            if not closed():
                raise
        finally:
            scans.discard(scan)
        raise StoreClosedError(self._message)

    def _iterated(self, part: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        """An iterator part, checked before each pair (it may read storage for each)."""
        closed = self._closed
        try:
            for item in part:
                if closed():
                    break
                yield item
            else:
                return
        except Exception:
            if not closed():
                raise
        raise StoreClosedError(self._message)

    def close(self) -> None:
        """Stop every scan in progress (call once closed, as ``closed`` says)."""
        for scan in list(self._scans):
            part = scan.part
            if part is not None:
                part.clear()


def _collected(e: DataFileMissing) -> CorruptDataError:
    """The error a snapshot's read of a data file another process's GC deleted raises."""
    return CorruptDataError(e.path, "data file is missing: GC in another process deleted it "
                            "once file_delete_delay_ms passed after a compaction replaced it (a "
                            "snapshot keeps its files from GC in its own process only; a named "
                            "checkpoint, store.checkpoint(name), keeps them from every process's)")


def _release(view: IndexView, pin: Pin) -> None:
    """End a snapshot's read view and drop its pin (its close, or its finalizer)."""
    try:
        view.close()
    finally:
        pin.release()


def open_snapshot(log: Log) -> Snapshot:
    """A snapshot of ``log`` at its applied commit, with this process's unapplied writes."""
    # Pinned before the read snapshot begins: GC then keeps every replaced file until the pin
    # knows which files its commit had already replaced (see kvlog.log.pins).
    pin = log.pins.pin()
    try:
        view = log.index.view()
    except BaseException:
        pin.release()
        raise
    try:
        replaced = frozenset(path for path, _due in view.reader.iter_pending())
    except BaseException:
        _release(view, pin)
        raise
    pin.settle(view.version, replaced)
    return Snapshot(log, view, pin)


class Snapshot:
    """A read view of a store pinned at one commit (see ``kvlog.snapshot``). Create with
    :meth:`kvlog.Store.snapshot`; use as a context manager or :meth:`close` it."""

    def __init__(self, log: Log, view: IndexView, pin: Pin) -> None:
        self._log = log
        self._view = view
        self._release = weakref.finalize(self, _release, view, pin)

    @property
    def version(self) -> int:
        """The commit version the snapshot is pinned at."""
        return self._view.version

    @property
    def closed(self) -> bool:
        """Whether the snapshot is released."""
        return not self._release.alive

    def _check(self) -> IndexView:
        if not self._release.alive:
            raise StoreClosedError("the snapshot is closed")
        return self._view

    def end_offsets(self) -> dict[int, int]:
        """Every partition's next offset at the snapshot's commit: the offsets its state is
        exactly as of. Read the state from the snapshot, then tail from these offsets
        (``consumer.seek_all(snap.end_offsets())``) and nothing is missed or read twice. Writes
        of this process buffered when the snapshot was taken are in its state without an
        offset yet: the tail brings them again, in their place (take the snapshot after a
        ``flush()``, or from another handle, for a state that is exactly the offsets'). A value
        written with a time to live is in the state without its expiry (a scan gives none), so
        a view that must drop it when it expires reads ``expires_ms`` from the changelog; the
        tail's records carry it."""
        view = self._check()
        return {p: view.reader.partition_end(p) for p in range(self._log.partitions)}

    def get(self, key: bytes | str, default: Any = None) -> Any:
        """The value of ``key`` in the snapshot, or ``default``."""
        view = self._check()
        k = key if type(key) is bytes and 0 < len(key) <= KEY_BYTES_LIMIT else to_key(key, KEY_BYTES_LIMIT)
        found = view.get(k)
        if found is None:
            return default
        if isinstance(found, IndexEntry):
            try:
                return self._value_of(k, found, view.reader)
            except RecordExpired:  # removed by a compaction whose clock saw it expired
                return default
        return found

    def _value_of(self, key: bytes, entry: IndexEntry, reader: MetaReader | None = None) -> bytes:
        """The value at ``entry`` in the snapshot's own commit (never a newer one's)."""
        try:
            return self._log.value_in_snapshot(key, entry, reader)
        except DataFileMissing as e:
            raise _collected(e) from None

    def _values_of(self, pairs: list[tuple[bytes, IndexEntry]], reader: MetaReader) -> list[bytes | None]:
        try:
            return self._log.values_in_snapshot(pairs, reader)
        except DataFileMissing as e:
            raise _collected(e) from None

    def get_many(self, keys: Iterable[bytes | str]) -> list[bytes | None]:
        """The values of ``keys`` in the snapshot, in the order given (None: no value)."""
        view = self._check()
        return view.get_many(to_keys(keys), self._values_of)

    def scan(
        self, start: bytes | str | None = None, stop: bytes | str | None = None, *,
        prefix: bytes | str | None = None, reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs of the snapshot in key order (or reverse), ``start <= key < stop``."""
        view = self._check()
        lo = None if start is None else key_bound(start)
        hi = None if stop is None else key_bound(stop)
        pre = None if prefix is None else key_bound(prefix)
        return self._while_open(view.scan(lo, hi, pre, reverse, self._value_of))

    def _while_open(self, items: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        """``items`` while the snapshot is open; once it is released, the next step raises
        :class:`StoreClosedError`, whatever the ended read transaction would have raised."""
        closed = StoreClosedError("the snapshot was closed while this iterator was in use")
        while True:
            if not self._release.alive:
                raise closed
            try:
                item = next(items)
            except StopIteration:
                return
            except Exception:
                if self._release.alive:
                    raise
                raise closed from None
            yield item

    def __getitem__(self, key: bytes | str) -> bytes:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        assert isinstance(value, bytes)
        return value

    def __contains__(self, key: object) -> bool:
        self._check()
        if not isinstance(key, bytes | str | bytearray | memoryview):
            return False
        try:
            return self.get(bytes(key) if isinstance(key, bytearray | memoryview) else key,
                            _MISSING) is not _MISSING
        except InvalidRecordError:
            return False  # like a dict: a key that cannot be stored is simply not there

    def close(self) -> None:
        """Release the snapshot: its read transaction and its pin on files (idempotent)."""
        self._release()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"Snapshot(version={self._view.version}, {state})"
