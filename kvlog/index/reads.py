"""Read transactions that gets reuse while they hold the newest LMDB snapshot.

Beginning and ending a py-lmdb read transaction costs about as much as the lookup itself, so
:meth:`kvlog.index.KeyIndex.lookup` keeps its read transactions in a :class:`ReadPool` and
reuses one for as long as no commit has landed since it began. A get must see every commit
applied before it was called, by this process or by another one sharing the cache, so before
reusing a transaction a get reads the id of the newest commit from the two meta pages of the
LMDB data file (a mapping of its first two pages: one 8-byte read each, in C,
``_runs.lmdb_txnid``) and reuses the transaction only if that id is its own. LMDB writes a
meta page's id last, before its commit returns; a commit in progress meanwhile is not yet
applied, and the next get takes the newer snapshot.

A data file whose meta pages are not of the layout read here (another LMDB format) is not
watched: :attr:`ReadPool.newest` then answers -1, never an id, and every get takes a read
transaction of its own.

The common case of a get (a short key, not in the memtable, a pooled transaction still the
newest) runs in one call of ``_runs.Getter`` (:meth:`ReadPool.getter`), which hands every other
case to :meth:`~kvlog.index.KeyIndex.lookup`. A store's ``get`` is one call too
(:func:`bound_get`): ``_runs.StoreGet`` checks the key and the store's state and calls the
getter without a Python frame between them.

A pooled transaction pins its snapshot: LMDB cannot reuse the pages later commits free while it
is open. The index empties the pool before each commit it applies and each settle
(:meth:`ReadPool.release`), so its own writes are never held back; a commit of another process
is held back from reusing pages only until this process's next get.

The runs of a pooled transaction are views of the LMDB map, which a resize of the map unmaps:
they are read only while their tag is current in the environment's gate
(:mod:`kvlog.meta.map_gate`), and a resize empties the pool.

Each transaction is used by one thread at a time: a get takes one out of the pool (``pop``)
and puts it back after (``append``), both atomic; threads that meet an empty pool begin their
own. In a child made by ``fork()`` the parent's pooled transactions are never used and never
ended (ending one would clear the parent's reader slot, which the child shares), so that the
parent's snapshots stay protected: they are kept aside for the child's lifetime.
"""

from __future__ import annotations

import mmap
import os
import struct
import weakref
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from kvlog._native import load
from kvlog.meta.env import LmdbEnv

if TYPE_CHECKING:
    from kvlog.index import _runs
else:
    _runs = load("kvlog.index._runs", "kvlog.index._runs_py")

__all__ = ["ReadPool", "Snap", "bound_get"]

#: A pooled read transaction: (its snapshot id, its bound ``get``, the index runs of its
#: snapshot newest first, empty when it has none, and the tag of the runs' views in the map's
#: gate, see :mod:`kvlog.meta.map_gate`). The bound ``get`` keeps it open.
Snap = tuple[int, Callable[[bytes], Any], Any, int]

_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_VERSION = 1
_P_META = 0x08
#: A meta page: page number (8 bytes), padding, flags, bounds; then magic and version.
_PAGE_HEAD = struct.Struct("=QHHI")
_META_HEAD = struct.Struct("=II")
#: Where page 0 holds the page size (the free-page database's ``md_pad``).
_PAGE_SIZE_AT = 40


def _unwatched() -> int:
    return -1


def _map_meta_pages(data: str) -> tuple[mmap.mmap, int] | None:
    """The first two pages of LMDB data file ``data`` mapped read-only, and the page size; None
    if the file does not start with two meta pages of the layout read here."""
    try:
        with open(data, "rb") as f:
            first = f.read(_PAGE_SIZE_AT + 4)
            if len(first) < _PAGE_SIZE_AT + 4:
                return None
            (page,) = struct.unpack_from("=I", first, _PAGE_SIZE_AT)
            if page < 512 or page > 1 << 16 or page % 8:
                return None
            view = mmap.mmap(f.fileno(), 2 * page, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    for number in (0, 1):
        pgno, _pad, flags, _bounds = _PAGE_HEAD.unpack_from(view, number * page)
        magic, version = _META_HEAD.unpack_from(view, number * page + _PAGE_HEAD.size)
        if pgno != number or not flags & _P_META or magic != _LMDB_MAGIC or version != _LMDB_VERSION:
            view.close()
            return None
    return view, page


class ReadPool:
    """The read transactions gets reuse (see the module's docstring): ``snaps`` is the pool
    itself, ``newest`` answers the id of the newest commit of ``env`` (what a read transaction
    begun now would read), or always -1 if the data file's meta pages (``meta``, ``page``
    bytes each) cannot be watched."""

    def __init__(self, env: LmdbEnv) -> None:
        self.snaps: list[Snap] = []
        self.gate = env.gate
        self.meta: mmap.mmap | None = None
        self.page = 0
        self.newest: Callable[[], int] = _unwatched
        mapped = _map_meta_pages(os.path.join(env.path, "data.mdb"))
        if mapped is not None:
            view, page = mapped
            newest: Callable[[], int] = partial(_runs.lmdb_txnid, view, page)
            for _attempt in range(3):  # a transaction's id, unless a commit lands between
                with env.env.begin() as txn:
                    if txn.id() == newest():
                        self.meta, self.page, self.newest = view, page, newest
                        break
        _pools.add(self)

    def release(self) -> None:
        """End the pooled transactions (those in use end when their gets are done)."""
        self.snaps.clear()

    def getter(self, memtable: object, clock: Callable[[], float], index: object,
               slow: Callable[..., Any], decoded: Callable[[bytes, bytes], Any]) -> _runs.Getter:
        """The common case of ``index``'s lookup in one call (``_runs.Getter``), reading this
        pool; ``slow`` is the lookup itself, ``decoded`` decodes an entry not inline."""
        getter = _runs.Getter(memtable, clock, index, slow, decoded)
        self.watch(getter)
        return getter

    def watch(self, getter: _runs.Getter) -> None:
        """Make ``getter`` read this pool."""
        getter.watch(self.snaps, self.meta, self.page, self.gate)


def bound_get(owner: object, lookup: Callable[..., Any], fallback: Callable[..., Any],
              found: Callable[[bytes, Any, Any], Any], key_limit: int) -> Callable[..., Any]:
    """A store's ``get`` with its common case in one call (``_runs.StoreGet``, no Python frame):
    a bytes key of 1 to ``key_limit`` bytes while ``owner._closed`` is False is looked up as
    ``lookup(key, owner._refresh_at)`` (the store's refresh deadline), its bytes returned,
    None read as the default, and any other answer handed to ``found(key, answer, default)``;
    every other call is ``fallback``'s (the store's own ``get``, with the same arguments)."""
    return _runs.StoreGet(owner, lookup, fallback, found, key_limit)


_pools: weakref.WeakSet[ReadPool] = weakref.WeakSet()
#: The parent's pooled transactions, in a child made by fork(): never ended (see above).
_left_by_fork: list[list[Snap]] = []


def _after_fork_in_child() -> None:
    for pool in list(_pools):
        _left_by_fork.append(list(pool.snaps))
        pool.snaps.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
