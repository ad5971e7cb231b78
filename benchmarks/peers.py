"""The stores a user choosing an embedded key-value store compares kvlog with, behind one interface.

One small class per store, each written the way a user of that store writes it, with the
durability of its writes stated in :attr:`Peer.durability` (the peer suite copies it into every
figure's method):

:class:`KvlogPeer`
    ``kvlog.open`` with the default ``StoreConfig``: buffered ``put`` (durable at the next
    flush: every ``flush_interval_ms`` or ``flush_bytes``, or ``flush()``).
:class:`LmdbPeer`
    py-lmdb, one transaction per operation; ``sync=False`` for the workloads (a commit reaches
    the operating system, ``env.sync()`` makes it durable), its defaults for the bulk load.
:class:`RocksdictPeer`
    rocksdict (RocksDB) in raw mode with its default options: the write-ahead log is written
    on every put and not synced (``flush_wal(sync=True)`` makes it durable).
:class:`SqlitePeer`
    stdlib sqlite3, a ``WITHOUT ROWID`` table, ``journal_mode=WAL``, ``synchronous=NORMAL``,
    a transaction per write; a checkpoint makes the writes durable.

The one hook beyond kvlog's public API is :func:`settle_index`: it merges the key index's
pending runs now, so that a figure can count that deferred work.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import lmdb

from benchmarks.ycsb import patched

if TYPE_CHECKING:
    import kvlog

# kvlog and rocksdict are imported by their adapters only: the space figures' child processes
# measure one store's memory each, without the others' modules.

__all__ = ["PEERS", "KvlogPeer", "LmdbPeer", "Peer", "RocksdictPeer", "SqlitePeer", "disk_bytes",
           "settle_index"]

MiB = 1024 * 1024


def settle_index(store: kvlog.Store) -> int:
    """Merge ``store``'s pending key-index runs into its B-tree now; return how many it merged.

    A commit writes its index entries as one sorted run and the store merges the runs later
    (when its writers are quiet, at ``close()``, or past ``index_run_limit``); a figure that
    counts that work calls this inside its timer. It is the suite's one use of kvlog's
    internals: ``Store.log.settle_index()``.
    """
    return int(store.log.settle_index())


def disk_bytes(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks, as ``du`` counts them)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile (a GC'd file)
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


class Peer:
    """A store under one interface: writes, reads, scans, a read-modify-write, durability."""

    key: ClassVar[str]
    name: ClassVar[str]
    durability: ClassVar[str]

    def __init__(self, path: Path) -> None:
        self.path = path

    def put(self, key: bytes, value: bytes) -> None:
        raise NotImplementedError

    def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def scan(self, start: bytes, count: int) -> list[tuple[bytes, bytes]]:
        """The first ``count`` pairs from ``start`` on, in key order."""
        raise NotImplementedError

    def read_modify_write(self, key: bytes, patch: bytes) -> bytes | None:
        """Read ``key``, write :func:`~benchmarks.ycsb.patched` of its value; the new value
        (None, and nothing written, when the key is missing)."""
        raise NotImplementedError

    def load(self, records: Iterable[tuple[bytes, bytes]]) -> None:
        """Bulk load: put every record, then :meth:`durable` (each store's usual bulk path)."""
        for key, value in records:
            self.put(key, value)
        self.durable()

    def durable(self) -> None:
        """Make every earlier write durable."""
        raise NotImplementedError

    def scan_all(self) -> Iterable[tuple[bytes, bytes]]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class KvlogPeer(Peer):
    key = "kvlog"
    name = "kvlog"
    durability = ("kvlog: default StoreConfig; store.put is buffered and durable at the next flush "
                  "(every flush_interval_ms = 200 ms, every flush_bytes = 16 MiB, or flush()); a "
                  "process crash loses the puts not flushed yet, a flush survives a power loss "
                  "(fsynced data file and commit)")

    def __init__(self, path: Path, **settings: Any) -> None:
        import kvlog

        super().__init__(path)
        self.store = kvlog.open(path, **settings)
        self.put = self.store.put  # type: ignore[method-assign]
        self.get = self.store.get  # type: ignore[method-assign]

    def scan(self, start: bytes, count: int) -> list[tuple[bytes, bytes]]:
        return list(islice(self.store.scan(start), count))

    def read_modify_write(self, key: bytes, patch: bytes) -> bytes | None:
        old = self.store.get(key)
        if old is None:
            return None
        new = patched(old, patch)
        self.store.put(key, new)
        return new

    def load(self, records: Iterable[tuple[bytes, bytes]]) -> None:
        """Puts, ``flush()``, and the index merge (:func:`settle_index`) counted."""
        put = self.store.put
        for key, value in records:
            put(key, value)
        self.store.flush()
        settle_index(self.store)

    def durable(self) -> None:
        self.store.flush()

    def scan_all(self) -> Iterable[tuple[bytes, bytes]]:
        return self.store.scan()

    def close(self) -> None:
        self.store.close()


class LmdbPeer(Peer):
    key = "lmdb"
    name = "py-lmdb"
    durability = ("py-lmdb: one write transaction per write with sync=False: a commit reaches the "
                  "operating system (it survives a process crash, not a power loss) and env.sync() "
                  "makes it durable; reads in a read transaction each")

    def __init__(self, path: Path, *, map_size: int, sync: bool = False) -> None:
        super().__init__(path)
        self.env = lmdb.open(str(path), map_size=map_size, sync=sync, max_spare_txns=16)

    def put(self, key: bytes, value: bytes) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(key, value)

    def get(self, key: bytes) -> bytes | None:
        with self.env.begin() as txn:
            return txn.get(key)

    def scan(self, start: bytes, count: int) -> list[tuple[bytes, bytes]]:
        with self.env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(start):
                return []
            return list(islice(cursor.iternext(), count))

    def read_modify_write(self, key: bytes, patch: bytes) -> bytes | None:
        with self.env.begin(write=True) as txn:
            old = txn.get(key)
            if old is None:
                return None
            new = patched(old, patch)
            txn.put(key, new)
            return new

    def load(self, records: Iterable[tuple[bytes, bytes]]) -> None:
        """Every record in one write transaction, then ``env.sync()``."""
        with self.env.begin(write=True) as txn:
            put = txn.put
            for key, value in records:
                put(key, value)
        self.env.sync(True)

    def durable(self) -> None:
        self.env.sync(True)

    def scan_all(self) -> Iterable[tuple[bytes, bytes]]:
        with self.env.begin() as txn:
            yield from txn.cursor()

    def close(self) -> None:
        self.env.close()


class RocksdictPeer(Peer):
    key = "rocksdict"
    name = "rocksdict"
    durability = ("rocksdict: raw mode, default options: every put is written to its write-ahead "
                  "log, not synced (it survives a process crash, not a power loss); "
                  "flush_wal(sync=True) makes the writes durable")

    def __init__(self, path: Path) -> None:
        from rocksdict import Options, Rdict

        super().__init__(path)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.db = Rdict(str(path), options)
        self.put = self.db.put  # type: ignore[method-assign]
        self.get = self.db.get  # type: ignore[method-assign]

    def scan(self, start: bytes, count: int) -> list[tuple[bytes, bytes]]:
        return list(islice(cast("Iterable[tuple[bytes, bytes]]", self.db.items(from_key=start)), count))

    def read_modify_write(self, key: bytes, patch: bytes) -> bytes | None:
        old = self.db.get(key)
        if old is None:
            return None
        new = patched(old, patch)
        self.db.put(key, new)
        return new

    def load(self, records: Iterable[tuple[bytes, bytes]]) -> None:
        """Puts, then ``flush()`` (its memtables written to synced table files)."""
        put = self.db.put
        for key, value in records:
            put(key, value)
        self.db.flush()

    def durable(self) -> None:
        self.db.flush_wal(True)

    def scan_all(self) -> Iterable[tuple[bytes, bytes]]:
        return cast("Iterable[tuple[bytes, bytes]]", self.db.items())

    def close(self) -> None:
        self.db.close()


class SqlitePeer(Peer):
    key = "sqlite"
    name = "sqlite3"
    durability = ("sqlite3: a WITHOUT ROWID table with a BLOB primary key, journal_mode=WAL, "
                  "synchronous=NORMAL, a transaction per write (a commit reaches the operating "
                  "system: it survives a process crash, not a power loss); a checkpoint "
                  "(wal_checkpoint(FULL)) makes the writes durable")

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        path.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(path / "kv.db", isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")

    def put(self, key: bytes, value: bytes) -> None:
        self.conn.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (key, value))

    def get(self, key: bytes) -> bytes | None:
        row = self.conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def scan(self, start: bytes, count: int) -> list[tuple[bytes, bytes]]:
        return self.conn.execute("SELECT k, v FROM kv WHERE k >= ? ORDER BY k LIMIT ?",
                                 (start, count)).fetchall()

    def read_modify_write(self, key: bytes, patch: bytes) -> bytes | None:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            old = self.get(key)
            new = None if old is None else patched(old, patch)
            if new is not None:
                self.put(key, new)
        finally:
            self.conn.execute("COMMIT")
        return new

    def load(self, records: Iterable[tuple[bytes, bytes]]) -> None:
        """``executemany`` in one transaction, then a checkpoint."""
        self.conn.execute("BEGIN")
        self.conn.executemany("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", records)
        self.conn.execute("COMMIT")
        self.durable()

    def durable(self) -> None:
        self.conn.execute("PRAGMA wal_checkpoint(FULL)")

    def scan_all(self) -> Iterable[tuple[bytes, bytes]]:
        return self.conn.execute("SELECT k, v FROM kv ORDER BY k")

    def close(self) -> None:
        self.conn.close()


PEERS: dict[str, type[Peer]] = {p.key: p for p in (KvlogPeer, LmdbPeer, RocksdictPeer, SqlitePeer)}
