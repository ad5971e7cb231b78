"""A read snapshot of the metadata cache with its key index: the catalog and the index as of
one LMDB transaction, so an index entry and the batch it points at are read consistently.

The index of a snapshot is its B-tree with the snapshot's pending runs over it (newest first).
LMDB errors and damage found are raised as kvlog errors, the damage recorded, as in every
:class:`~kvlog.meta.cache.MetaReader` method.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

import lmdb

from kvlog.index.entry import IndexEntry, decode_entry, entry_damage, index_inline
from kvlog.index.expiries import expired_entries
from kvlog.index.keys import DIRECT_KEY_BYTES, encode_index_key, scan_bounds
from kvlog.index.pending import find_in_runs_checked, guarded, merge_runs, runs_newest_first
from kvlog.index.runs import Buffer
from kvlog.index.tree import overlay, walk_forward, walk_reverse
from kvlog.meta.cache import MetaReader, guard_methods
from kvlog.meta.env import CacheDamage, LmdbEnv
from kvlog.meta.map_gate import Views

__all__ = ["IndexReader", "end_reader", "read_failure", "runs_pending", "scan_sources"]


def read_failure(reader: MetaReader, error: lmdb.Error | CacheDamage) -> Exception:
    """The kvlog error to raise for ``error`` met reading through ``reader`` outside its
    methods, as its methods raise them (the damage recorded)."""
    if isinstance(error, CacheDamage):
        return reader.env.damaged(str(error), index_only=error.index_only)
    return reader.env.failure(error)


def scan_sources(reader: IndexReader) -> tuple[lmdb.Cursor, list[Buffer], Views]:
    """What a forward scan of ``reader``'s snapshot reads: a cursor of its B-tree, its pending
    runs (newest first) and the context they are read in. LMDB errors and damage are raised as
    they are: the scan's generator turns them into kvlog errors (:func:`read_failure`)."""
    runs = reader._run_cache  # noqa: SLF001 - the common case without a method's guard
    if runs is None:
        runs = reader._runs()  # noqa: SLF001
    return reader.txn.cursor(db=reader._db["index"]), runs, reader._views  # noqa: SLF001


def end_reader(reader: IndexReader) -> None:
    """End ``reader``'s snapshot (:meth:`IndexReader.close`, called where a scan ends)."""
    reader.txn.abort()
    views = reader._run_views  # noqa: SLF001
    if views is not None:
        reader._run_views = None  # noqa: SLF001
        views.abort()
    reader._run_cache = None  # noqa: SLF001
    reader._run_held = None  # noqa: SLF001


def runs_pending(reader: MetaReader) -> int:
    """Index runs of ``reader``'s snapshot not merged into the B-tree yet."""
    return int(reader.txn.stat(reader.env.dbs["runs"])["entries"])


@guard_methods
class IndexReader(MetaReader):
    """Reads of the catalog and the key index within one LMDB transaction.

    With ``now_ms`` the index hides the entries of records expired at that time: :meth:`index_get`
    answers None for them and :meth:`index_scan` skips them (None: every entry, as stored)."""

    def __init__(self, env: LmdbEnv, txn: lmdb.Transaction, now_ms: int | None = None,
                 runs: list[Buffer] | None = None, runs_held: object = None,
                 runs_tag: int | None = None) -> None:
        super().__init__(env, txn)
        self.now_ms = now_ms
        #: The snapshot's runs when the caller knows them (views kept valid by ``runs_held``,
        #: another reader's transaction of the same snapshot, held as long as this reader, and
        #: read inside the map's gate with their tag ``runs_tag``).
        self._run_cache: list[Buffer] | None = runs
        self._run_held = runs_held
        self._run_views: lmdb.Transaction | None = None
        #: Where the runs are read: inside the gate while they are views of the map (a resize
        #: of the map ends this snapshot, see kvlog.meta.map_gate).
        self._views: Views = env.gate.views(runs_tag)

    def close(self) -> None:
        """End this snapshot (its transaction and the one its index runs are read through)."""
        end_reader(self)

    def index_get(self, key: bytes) -> IndexEntry | None:
        """``key``'s entry: the newest pending run's, else the B-tree's (None: no entry, or its
        record expired at :attr:`now_ms`)."""
        entry = self._entry_at(encode_index_key(key))
        if entry is not None and self.now_ms is not None and entry.expired(self.now_ms):
            return None
        return entry

    def _entry_at(self, lmdb_key: bytes) -> IndexEntry | None:
        """The entry stored for ``lmdb_key`` (expired or not), checked."""
        runs = self._runs()
        with self._views:
            found = find_in_runs_checked(runs, lmdb_key)
        if found is not None:
            return decode_entry(lmdb_key, found)[1] if found else None
        value = self.txn.get(lmdb_key, db=self._db["index"])
        if value is None:
            return None
        return decode_entry(lmdb_key, bytes(value))[1]

    def index_get_many(self, keys: list[bytes]) -> list[bytes | IndexEntry | None]:
        """What the index holds for each of ``keys`` (in that order): the inline value (bytes),
        the entry (the value is in a data file), or None (no entry, or deleted). Each is the
        newest pending run's entry, else the B-tree's, its checksum checked."""
        runs = self._runs()
        cursor = self.txn.cursor(db=self._db["index"])
        # Positional: much cheaper per call than txn.get(key, db=...); bytes, as the reader's
        # transaction makes no buffers.
        get = cast(Callable[[bytes], bytes | None], cursor.get)
        out: list[bytes | IndexEntry | None] = []
        for key in keys:
            if len(key) > DIRECT_KEY_BYTES:  # a long key: under its first bytes and a hash
                entry = self.index_get(key)
                out.append(entry if entry is None or entry.inline is None else entry.inline)
                continue
            raw: bytes | None = None
            if runs:
                with self._views:
                    raw = find_in_runs_checked(runs, key)
            if raw is None:
                raw = get(key)
                if raw is None:
                    out.append(None)
                    continue
            elif not raw:
                out.append(None)  # deleted in a run
                continue
            try:
                inline = index_inline(key, raw)  # its CRC32C checked
            except ValueError:
                raise entry_damage(key) from None
            if inline is not None:
                out.append(inline)
                continue
            entry = decode_entry(key, raw)[1]
            if self.now_ms is not None and entry.expired(self.now_ms):
                out.append(None)  # expired: hidden, its value never read
            else:
                out.append(entry if entry.inline is None else entry.inline)
        cursor.close()
        return out

    def live_count(self, now_ms: int) -> int:
        """Keys in the index whose records have not expired at ``now_ms``: :meth:`index_count`
        minus the expired entries, found through the ``expiries`` rows (never every entry)."""
        def expiry_of(lmdb_key: bytes) -> int | None:
            entry = self._entry_at(lmdb_key)
            return None if entry is None else entry.expires_ms

        return self.index_count() - expired_entries(self.txn, self._db["expiries"], now_ms, expiry_of)

    def index_count(self) -> int:
        """Keys in the index (its pending runs applied)."""
        count = int(self.txn.stat(self._db["index"])["entries"])
        runs = self._runs()
        if runs:
            index_db = self._db["index"]
            for key, value in guarded(self._views, merge_runs(runs, None, None, reverse=False)):
                present = self.txn.get(key, db=index_db) is not None
                if value and not present:
                    count += 1
                elif not value and present:
                    count -= 1
        return count

    def runs_pending(self) -> int:
        """Index runs of this snapshot not merged into the index yet."""
        return runs_pending(self)

    def _runs(self) -> list[Buffer]:
        """This snapshot's index runs, newest first (read once per reader)."""
        if self._run_cache is None and not self.pin_runs():
            # A commit landed between this reader's transaction and the second one: read copies
            # (this transaction makes bytes), at most index_run_limit runs of one flush each.
            self._run_cache = runs_newest_first(self.txn, self._db["runs"])
            self._views = self._env.gate.views(None)
        assert self._run_cache is not None
        return self._run_cache

    def runless(self) -> bool:
        """Whether this snapshot is known to have no index runs pending."""
        return self._run_cache == []

    def no_runs(self) -> None:
        """Take it as known that this snapshot has no index runs pending (its caller saw so)."""
        self._run_cache = []

    def pin_runs(self) -> bool:
        """Find this snapshot's index runs (if any) as views of the LMDB map, through a second read
        transaction of the same snapshot kept as long as this reader; False if a commit landed
        since this reader began (the second transaction would see another snapshot)."""
        if self._run_cache is not None:
            return True
        if not self.runs_pending():
            self._run_cache = []
            return True
        try:
            views, tag = self._env.begin_views()
        except lmdb.Error:
            return False
        if views.id() != self.txn.id():
            views.abort()
            return False
        self._run_views = views
        self._run_cache = runs_newest_first(views, self._db["runs"])
        self._views = self._env.gate.views(tag)
        return True

    def index_scan(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        prefix: bytes | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, IndexEntry]]:
        """Index entries in true key order (or reverse), ``start <= key < stop``, with ``prefix``."""
        lower, upper = scan_bounds(start, stop, prefix)
        if lower is not None and upper is not None and lower >= upper:
            return
        runs = self._runs()
        now_ms = self.now_ms
        with self.txn.cursor(db=self._db["index"]) as cur:
            entries = walk_reverse(cur, upper) if reverse else walk_forward(cur, lower)
            if runs:
                merged = guarded(self._views, merge_runs(runs, lower, upper, reverse=reverse))
                entries = overlay(entries, merged, reverse=reverse)
            for key, entry in entries:
                if reverse:
                    if upper is not None and key >= upper:
                        continue
                    if lower is not None and key < lower:
                        return
                else:
                    if lower is not None and key < lower:
                        continue
                    if upper is not None and key >= upper:
                        return
                if prefix and not key.startswith(prefix):
                    continue
                if now_ms is not None and entry.expires_ms is not None and now_ms >= entry.expires_ms:
                    continue
                yield key, entry
