"""The key index of one open log: where each key's latest value is.

Three layers answer for a key, the first that holds it winning: the memtable (this process's
writes not applied yet: :mod:`kvlog.index.memtable`), the index runs pending in LMDB (newest
first: :mod:`kvlog.index.pending`), and the B-tree (:mod:`kvlog.index.tree`). :class:`KeyIndex`
is the one interface the log and the store use: lookups, scans, counts, snapshots, merging the
runs into the B-tree (settling) and rebuilding. Commits write their entries inside the log's
own write transaction (:mod:`kvlog.index.write`), so a commit's index changes are atomic with
its catalog changes.

The index owns one lock, its memtable's (``lock``): the flusher enters writes into the memtable
and its write buffer under it, and writing the B-tree record by record (settling, or applying a
commit with ``index_run_limit`` 0) holds it, pausing writers meanwhile. py-lmdb releases the GIL
around every record it writes, so a writer thread running meanwhile would make each of those
records wait for the GIL; pausing writers is several times faster for both. (A commit's run is
one LMDB write and pauses nobody.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from itertools import chain
from typing import Any

import lmdb
import pyarrow as pa

from kvlog.errors import KvlogError, StorageError
from kvlog.index.entry import (
    IndexEntry,
    decode_entry,
    decode_index_value,
    index_damage,
    index_inline,
)
from kvlog.index.keys import DIRECT_KEY_BYTES, encode_index_key
from kvlog.index.many import ResolveMany, lookup_many
from kvlog.index.memtable import MemTable, live_value
from kvlog.index.pending import PinnedRuns, find_in_runs_checked, runs_newest_first
from kvlog.index.reads import ReadPool, Snap, bound_get
from kvlog.index.runs import runs_find
from kvlog.index.scan import Resolve, scan_pairs
from kvlog.index.snapshot import IndexReader
from kvlog.index.view import IndexView
from kvlog.index.write import clear_index, index_batch, settle_runs
from kvlog.meta.cache import MetaTxn
from kvlog.meta.env import CacheDamage, LmdbEnv
from kvlog.meta.reserve import tree_bytes

__all__ = ["STALE", "KeyIndex", "RebuildChunk", "Stale"]

#: One batch to index while rebuilding: partition, base offset, records, each record's offset.
RebuildChunk = list[tuple[int, int, pa.RecordBatch, list[int]]]


class Stale:
    """The type of :data:`STALE`."""

    def __repr__(self) -> str:
        return "STALE"


#: :meth:`KeyIndex.lookup`'s answer when the memtable does not hold the key and the caller's
#: freshness deadline has passed: bring the index up to date, then look again.
STALE = Stale()


def _never_expired() -> int:
    """The time of an index without an expiry clock: before every expiry."""
    return -(2**63)


class KeyIndex:
    """The key index of a log's metadata cache ``env``, with this process's memtable in front.

    ``apply_lock`` is held by whoever applies commits to the cache: a scan takes the memtable
    and its LMDB snapshot under it, with no apply in between. ``monotonic_s`` is the clock of
    :meth:`lookup`'s freshness deadline; ``now_ms`` the clock that decides which records have
    expired (every answer hides them).
    """

    def __init__(self, env: LmdbEnv, *, run_limit: int, apply_lock: AbstractContextManager[object],
                 monotonic_s: Callable[[], float], now_ms: Callable[[], int] | None = None) -> None:
        self._env = env
        #: The clock of expiries: a record whose expiry it has reached is hidden from every read
        #: (without one, no record expires).
        self.now_ms: Callable[[], int] = now_ms if now_ms is not None else _never_expired
        self.run_limit = run_limit
        self._apply_lock = apply_lock
        self._monotonic_s = monotonic_s
        #: This process's writes not applied to the index yet (see :class:`MemTable`).
        self.memtable = MemTable()
        #: The memtable's lock, held while the B-tree is written record by record.
        self.lock: threading.Lock = self.memtable.lock
        #: Merge the runs when an apply leaves more than ``run_limit`` pending (:meth:`settle_due`).
        #: Off while opening, so that reopening after a crash never waits for a merge.
        self.settle_on_apply = True
        #: Held while :meth:`rebuild` empties and refills the index: reads past the memtable
        #: wait for it (:meth:`_await_rebuild`), never answering from a half-filled index.
        self._rebuilding = threading.Lock()
        #: False from the start of a rebuild until one completes: the index misses entries.
        self._complete = True
        #: Why the last rebuild stopped before completing (raised to readers), or None.
        self._rebuild_failure: str | None = None
        self.reopened()
        env.gate.on_remap(self.release)  # the pooled and pinned views die with the old map

    def reopened(self) -> None:
        """Take the environment's handles afresh: at construction, and after the environment
        was reopened (a damaged cache deleted and opened empty, filled again by catching up:
        complete, whatever a rebuild of the deleted one left)."""
        self._complete = True
        self._rebuild_failure = None
        env = self._env
        self._index_db = env.dbs["index"]
        self._runs_db = env.dbs["runs"]
        self._pinned_runs = PinnedRuns(env)
        # The id of the newest LMDB snapshot seen without index runs: a scan of it reads no runs.
        self._runless_snapshot = -1
        previous = getattr(self, "_reads", None)
        if previous is not None:
            previous.release()
        #: The read transactions lookups reuse, and the id of the newest commit they check.
        self._reads = ReadPool(env)
        self._snaps = self._reads.snaps
        self._newest = self._reads.newest
        if previous is None:
            #: :meth:`lookup` with its common case in one call (``_runs.Getter``): the store's.
            self.fast_lookup = self._reads.getter(self.memtable, self._monotonic_s, self, self.lookup, self._decoded)
        else:
            self._reads.watch(self.fast_lookup)

    # -- lookups ----------------------------------------------------------------------------------
    def bind_get(self, owner: object, fallback: Callable[..., Any], found: Callable[[bytes, Any, Any], Any],
                 key_limit: int) -> Callable[..., Any]:
        """``owner``'s ``get`` with its common case in one call over :attr:`fast_lookup` (see
        :func:`kvlog.index.reads.bound_get`): ``fallback`` answers every other call."""
        return bound_get(owner, self.fast_lookup, fallback, found, key_limit)

    def lookup(self, key: bytes, fresh_until: float = float("inf")) -> bytes | IndexEntry | Stale | None:
        """``key``'s latest value (bytes: from the memtable, or inline in its entry), its entry
        (the value is in a data file), or None (no such key, or deleted). A valid ``key``.

        When the memtable does not hold it and the clock has reached ``fresh_until``, returns
        :data:`STALE` instead, without reading LMDB. An entry failing its checks raises
        ``CorruptDataError`` (the index is marked for rebuild), never returns a value. A record
        whose expiry ``now_ms`` has reached is None, before its value is ever read.
        """
        memtable = self.memtable
        front = memtable.front.get(key)
        if front is None:
            frozen = memtable.frozen
            if frozen is not None:
                front = frozen.get(key)
        if front is not None:
            if type(front) is bytes:
                return front
            return live_value(front, self.now_ms())  # a tombstone, or a value with a time to live
        if self._monotonic_s() >= fresh_until:
            return STALE
        if not self._complete:
            self._await_rebuild()
        if len(key) > DIRECT_KEY_BYTES:
            return self._read_entry(key)
        # The common case in one frame: a short key (its own LMDB key), in a read transaction
        # reused while no commit has landed since it began (kvlog.index.reads).
        snaps = self._snaps
        try:
            snap = snaps.pop()
        except IndexError:
            snap = None
        if snap is None or snap[0] != self._newest():
            snap = self._snap()
            if snap is None:
                return self._read_entry(key)  # a commit landed meanwhile, or the map grew
        gate = self._env.gate
        damaged = False
        gate.enter()  # the runs are views of the map: no resize while they are read (nor a call out)
        try:
            if not gate.valid(snap[3]):
                raw = None  # its views died with a resize of the map: read afresh, below
            else:
                runs = snap[2]
                raw = runs_find(runs, key) if runs else None  # pending index runs, newest first
                if raw is None:
                    raw = snap[1](key)
                    if raw is None:
                        snaps.append(snap)
                        return None
                elif not raw:
                    snaps.append(snap)
                    return None  # deleted in a run
                # Checked against its CRC32C: a damaged entry raises, never returns a value.
                inline = index_inline(key, raw)
        except lmdb.Error:
            raw = None  # its transaction ended (the map was resized): afresh, below
        except ValueError:  # raised by the index's checks alone: the key is valid
            damaged = True
        finally:
            gate.leave()
        if damaged:
            raise index_damage(self._env, key) from None
        if raw is None:
            return self._read_entry(key)
        snaps.append(snap)
        if inline is not None:
            return inline
        return self._decoded(key, raw)

    def _snap(self) -> Snap | None:
        """A read transaction of the newest snapshot, with its pending runs pinned, for
        :meth:`lookup` to pool; None if a commit landed meanwhile or the map grew."""
        try:
            txn = self._env.begin(self._index_db, buffers=False)
        except lmdb.MapResizedError:
            return None
        except lmdb.Error as e:
            raise self._env.failure(e) from e
        snapshot = txn.id()
        found = self._pinned_runs.runs(snapshot)
        if found is None:
            txn.abort()
            return None
        runs, tag = found
        if not runs:
            self._pinned_runs.release()
        return (snapshot, txn.get, runs, tag)

    def _await_complete(self) -> None:
        """Before answering from the index: :meth:`_await_rebuild` unless it is complete."""
        if not self._complete:
            self._await_rebuild()

    def _await_rebuild(self) -> None:
        """Wait for a rebuild under way; raise ``StorageError`` if the index stays incomplete
        (its last rebuild failed): a key missing from it must not read as absent."""
        with self._rebuilding:
            if not self._complete:
                raise StorageError(f"{self._env.name}: the key index is incomplete, its rebuild failed "
                                   f"({self._rebuild_failure}); the next refresh rebuilds it again")

    def _read_entry(self, key: bytes) -> bytes | IndexEntry | None:
        """:meth:`lookup` past the memtable, in a read transaction of its own (any key)."""
        raw = self._read_raw(encode_index_key(key))
        return None if raw is None else self._decoded(key, raw)

    def _decoded(self, key: bytes, raw: bytes) -> bytes | IndexEntry | None:
        try:
            entry = decode_index_value(key, raw)  # its CRC32C checked
        except ValueError:
            raise index_damage(self._env, encode_index_key(key)) from None
        if entry.expires_ms is not None and self.now_ms() >= entry.expires_ms:
            return None  # expired: hidden, its value never read
        return entry if entry.inline is None else entry.inline

    def _read_raw(self, lmdb_key: bytes) -> bytes | None:
        """One raw index value by LMDB key, in a short read transaction of its own: from the
        newest index run holding the key, else from the B-tree."""
        env = self._env
        while True:
            try:
                txn, tag = env.begin_views(self._index_db)
            except lmdb.MapResizedError:
                env._adopt_size()
                continue
            except lmdb.Error as e:
                raise env.failure(e) from e
            try:
                env.gate.enter()
                try:
                    if not env.gate.valid(tag):
                        continue  # the map was resized since: its views are dead
                    found = find_in_runs_checked(runs_newest_first(txn, self._runs_db), lmdb_key)
                    if found is not None:
                        return found or None
                    view = txn.get(lmdb_key)
                    if view is None:
                        return None
                    value = bytes(view)
                finally:
                    env.gate.leave()
                decode_entry(lmdb_key, value)  # its checksum
                return value
            except lmdb.Error as e:
                raise env.failure(e) from e
            except CacheDamage as e:
                raise env.damaged(str(e), index_only=e.index_only) from None
            finally:
                txn.abort()

    # -- snapshots, scans, counts -----------------------------------------------------------------
    def reader(self) -> IndexReader:
        """A consistent snapshot of the catalog and the index, hiding the records expired at the
        clock's time when it is taken; ``close()`` it when done."""
        env = self._env
        now_ms = self.now_ms()
        for _attempt in range(4):
            txn = env.read()
            try:
                snapshot = txn.id()
                if snapshot == self._runless_snapshot:
                    return IndexReader(env, txn, now_ms, [])  # seen without runs: no need to look again
                # Its index runs read in place, not copied, through the pin shared with lookups.
                pinned = self._pinned_runs.pinned(snapshot)
            except lmdb.Error as e:
                txn.abort()
                raise env.failure(e) from e
            if pinned is not None:
                if not pinned[2]:
                    self._runless_snapshot = snapshot
                    self._pinned_runs.release()
                    return IndexReader(env, txn, now_ms, [])
                return IndexReader(env, txn, now_ms, pinned[2], pinned, pinned[3])
            txn.abort()  # a commit landed in between: take the newer snapshot
        return IndexReader(env, env.read(), now_ms)

    def scan(self, start: bytes | None, stop: bytes | None, prefix: bytes | None, reverse: bool,
             resolve: Resolve) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order (or reverse), ``start <= key < stop`` with
        ``prefix``, over one snapshot: the memtable's writes over the index's entries,
        deletions left out. ``resolve`` reads a value that is not inline (in the snapshot)."""
        return chain.from_iterable(self.scan_parts(start, stop, prefix, reverse, resolve))

    def scan_parts(self, start: bytes | None, stop: bytes | None, prefix: bytes | None, reverse: bool,
                   resolve: Resolve) -> Iterator[list[tuple[bytes, bytes]] | Iterator[tuple[bytes, bytes]]]:
        """:meth:`scan`'s pairs as the parts they are made in, to chain: lists of pairs (each a
        list of its own, which the caller may empty) or iterators. The snapshot is taken now."""
        self._await_complete()
        with self._apply_lock:
            front = self.memtable.items_in_range(start, stop, prefix)
            reader = self.reader()
        assert reader.now_ms is not None
        return scan_pairs(reader, front, start, stop, prefix, reverse, resolve, reader.now_ms)

    def get_many(self, keys: Sequence[bytes], resolve: ResolveMany) -> list[bytes | None]:
        """The latest values of ``keys`` (valid keys) in the order given, None where a key has
        none, all from one snapshot: the memtable's writes, then the pending runs, then the
        B-tree, in one read transaction; ``resolve`` reads the values that are not inline, in
        that transaction (see :mod:`kvlog.index.many`)."""
        self._await_complete()
        with self._apply_lock:
            front = self.memtable.pick(keys)
            reader = self.reader()
        try:
            return lookup_many(reader, front, keys, resolve)
        finally:
            reader.close()

    def view(self) -> IndexView:
        """A read view held open until closed: this snapshot of the index, and a copy of the
        memtable taken with it (see :mod:`kvlog.index.view`)."""
        self._await_complete()
        with self._apply_lock:
            memtable = self.memtable.copy()
            reader = self.reader()
        try:
            return IndexView(memtable, reader)
        except BaseException:
            reader.close()
            raise

    def count(self) -> int:
        """Live keys: the index's, with the memtable's writes applied."""
        self._await_complete()
        with self._apply_lock:
            front = self.memtable.items_in_range(None, None, None)
            reader = self.reader()
        now_ms = reader.now_ms
        assert now_ms is not None
        try:
            count = reader.live_count(now_ms)
            for key, value in front:
                present = reader.index_get(key) is not None  # None when expired
                live = live_value(value, now_ms) is not None
                count += live - present
            return count
        finally:
            reader.close()

    def release(self) -> None:
        """Let go of the snapshot lookups pinned (before the environment closes)."""
        self._reads.release()
        self._pinned_runs.release()

    # -- applying, settling, rebuilding -----------------------------------------------------------
    def applying(self) -> AbstractContextManager[object]:
        """Held while a commit is applied: the lock when it writes the B-tree record by record."""
        self._reads.release()  # the commit may reuse the pages the pooled snapshots pin
        return self.lock if self.run_limit == 0 else nullcontext()

    def settle_due(self, runs: int) -> bool:
        """Whether an apply that left ``runs`` runs pending should settle them now."""
        return runs > self.run_limit > 0 and self.settle_on_apply

    def settle(self) -> int:
        """Merge the pending runs into the B-tree (writers paused), deleting the entries expired
        at the clock's time; return how many runs."""
        reader = self.reader()
        try:
            if not reader.runs_pending():
                return 0
        finally:
            reader.close()
        now_ms = self.now_ms()  # entries expired by then go too: reads hide them anyway
        self._reads.release()
        with self.lock:
            # A merge rewrites the B-tree and the runs it merges, its new pages half full at worst
            # (page splits), and the free-page lists LMDB writes for what it replaced.
            grows = 2 * tree_bytes(self._env.env, [self._env.dbs["index"], self._env.dbs["runs"]]) + (1 << 20)
            return int(self._env.write(lambda txn: settle_runs(MetaTxn(self._env, txn), now_ms), grows))

    @contextmanager
    def settle_deferred(self) -> Iterator[None]:
        """Within the block, applying commits never merges the pending runs."""
        previous, self.settle_on_apply = self.settle_on_apply, False
        try:
            yield
        finally:
            self.settle_on_apply = previous

    def rebuild(self, chunks: Iterable[RebuildChunk], inline_limit: int) -> None:
        """Empty the index and mark it not ready (meta ``index_ready``), index every batch of
        ``chunks`` as an index run (one write transaction per chunk, in order: later batches
        win), merge the runs into the empty B-tree (appended in key order), then mark it ready.

        The index is incomplete between the emptying and the end: reads past the memtable wait
        meanwhile, and if the rebuild raises they raise ``StorageError`` until a rebuild
        completes (:meth:`_await_rebuild`), rather than answer None for a key it misses."""
        def clear(txn: lmdb.Transaction) -> None:
            meta = MetaTxn(self._env, txn)
            clear_index(meta)
            meta.put_meta("index_ready", b"0")

        with self._rebuilding:
            self._complete = False
            try:
                self._env.write(clear)
                for chunk in chunks:
                    def work(txn: lmdb.Transaction, chunk: RebuildChunk = chunk) -> None:
                        meta = MetaTxn(self._env, txn)
                        for partition, base, records, offsets in chunk:
                            # One sorted run per batch; merged into the empty B-tree at the end.
                            index_batch(meta, partition, base, records, inline_limit, offsets, run_limit=1)

                    self._env.write(work)
                self._env.write(lambda txn: settle_runs(MetaTxn(self._env, txn)))
                self._env.write(lambda txn: MetaTxn(self._env, txn).put_meta("index_ready", b"1"))
            except KvlogError as e:
                self._rebuild_failure = f"{type(e).__name__}: {e}"
                raise
            except BaseException:
                self._rebuild_failure = "interrupted"
                raise
            self._rebuild_failure = None
            self._complete = True
