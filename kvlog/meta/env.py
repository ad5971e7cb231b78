"""One LMDB environment per directory per process, with map growth handled inside.

LMDB forbids opening the same environment twice in one process, so handles are shared through
a registry and reference-counted. ``MapFullError`` doubles the map and retries the transaction
function; ``MapResizedError`` (another process grew it) adopts the new size. Stale reader slots
of dead processes are cleared on open. ``writemap`` makes write transactions modify the map
directly, so dirty pages are page cache, never heap that grows with a transaction; the file is
sparse, and the pages a transaction may add get their disk blocks first
(:mod:`kvlog.meta.reserve`): a full disk is a ``StorageError`` before it, not a SIGBUS inside.

Commits are not fsynced: the cache is rebuildable, and a process crash loses nothing (its pages
are in the page cache). Only a machine crash can leave a torn file, so while processes have the
cache open, a marker file holds the boot id; the first process to open the cache after a reboot
finds an old boot id there and deletes the cache, which is then rebuilt from the storage root.
The last process to close it syncs it and removes the marker (without boot ids or ``flock``,
every commit is synced).

The cache is derived data, so damage costs a rebuild, never a wrong answer. LMDB trusts its
pages (garbage in one can crash the process), so before LMDB reads a cache that was changed
since the last process closed it cleanly (a crash, another program, the disk), the first
process to open it checks the file's structure (:func:`check_lmdb_file`, with the key index's
walker of the file: :func:`kvlog.index.check_cache_file`) and deletes a damaged cache. Every LMDB error becomes a :class:`~kvlog.errors.KvlogError`: damage
(``CorruptedError``, ``PageNotFoundError``, ...) is a ``CorruptDataError`` naming the cache,
anything else a ``StorageError``. Damage found while the cache is in use is recorded (the key
index is marked for rebuild, or a marker file makes the next opener delete the whole cache),
and a cache that cannot be opened is deleted and rebuilt at once when no other process uses it.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import lmdb

from kvlog.errors import CorruptDataError, KvlogError, StorageError
from kvlog.format.checksum import crc32c
from kvlog.meta.map_gate import MapGate
from kvlog.meta.reserve import PageReserve

__all__ = [
    "CACHE_LAYOUT", "CacheDamage", "DB_NAMES", "FileWalker", "LMDB_ERROR", "SEALED_DBS", "LmdbEnv", "acquire_env",
    "release_env", "reset_env", "seal", "unseal",
]

log = logging.getLogger("kvlog.log")

T = TypeVar("T")

DB_NAMES = (
    "meta", "files", "batches", "parts", "producers", "outcomes", "pending", "index", "runs", "cleaner",
    "condemned", "expiries",
    "offsets", "groups", "pins",
)

_registry: dict[str, tuple[LmdbEnv, int]] = {}
_registry_lock = threading.Lock()

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_LOCK_NAME = "kvlog-cache.lock"
_MARKER_NAME = "kvlog-unsynced"
#: ``data.mdb``'s size, modification time and inode when the last process closed it cleanly.
_CLEAN_NAME = "kvlog-clean"
#: Damage a reader found: ``index`` (rebuild the key index) or ``cache`` (delete the cache).
_DAMAGED_NAME = "kvlog-damaged"
_LMDB_FILES = ("data.mdb", "lock.mdb")

#: The layout of the cache's values (meta key ``cache_layout``): index entries with their
#: CRC32C (see kvlog.meta.cache) and the values of :data:`SEALED_DBS` sealed (:func:`seal`);
#: index entries may carry an expiry, with a sealed row in ``expiries`` (see
#: kvlog.index.expiries). A cache of another layout is emptied when it is opened and rebuilt
#: from storage.
CACHE_LAYOUT = b"5"
#: Databases whose values are sealed: checked by every read and by the check at open.
SEALED_DBS = ("meta", "files", "batches", "parts", "producers", "outcomes", "cleaner",
              "offsets", "groups", "pins", "expiries")
_SEAL = struct.Struct(">I")
#: Checks the structure of a whole cache file mapped in memory: every page of its B-trees and
#: every value it can check; None if whole, else the first damage found.
FileWalker = Callable[[mmap.mmap], str | None]
#: The base class of py-lmdb's errors, for callers that read LMDB through the environment and
#: turn them into kvlog errors with :meth:`LmdbEnv.failure`.
LMDB_ERROR = lmdb.Error
#: LMDB errors that mean the files are damaged (``BadValsizeError``: a stored size is impossible).
_DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.VersionMismatchError,
           lmdb.PanicError, lmdb.IncompatibleError, lmdb.PageFullError, lmdb.BadValsizeError)


def seal(key: bytes, payload: bytes) -> bytes:
    """The stored value of ``payload`` under ``key`` in a sealed database: the big-endian CRC32C
    of the key followed by the payload, then the payload (a damaged value, or a value moved to
    another key, fails :func:`unseal`)."""
    return _SEAL.pack(crc32c(payload, crc32c(key))) + payload


def unseal(key: bytes | memoryview, value: bytes | memoryview) -> bytes:
    """The payload of a value :func:`seal` made for ``key``; ``CacheDamage`` if it fails."""
    if len(value) < _SEAL.size or _SEAL.unpack_from(value)[0] != crc32c(value[_SEAL.size:], crc32c(key)):
        raise CacheDamage(f"the metadata value of {bytes(key)[:40]!r} fails its checksum", index_only=False)
    return bytes(value[_SEAL.size:])


class CacheDamage(ValueError):
    """Damage found in the cache's contents (an index entry failing its checksum, a value that
    does not parse): raised inside kvlog.meta, and turned into a ``CorruptDataError`` naming the
    cache by :meth:`LmdbEnv.damaged` (``index_only``: only the key index needs a rebuild)."""

    def __init__(self, reason: str, *, index_only: bool) -> None:
        super().__init__(reason)
        self.index_only = index_only


def _boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def _write_durably(path: Path, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    _sync_dir(path.parent)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _claim_unsynced(path: Path, walk: FileWalker) -> int | None:
    """Hold the cache (a shared ``flock`` kept open) for unsynced commits; None: sync every commit.

    Opening it alone, a marker from another boot means a machine crash may have torn the
    cache: it is deleted (and rebuilt by the caller's catch-up).
    """
    boot = _boot_id()
    if boot is None:
        return None
    try:
        fd = os.open(path / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False  # live processes of this boot hold it: the cache is as they left it
        if alone:
            marker = path / _MARKER_NAME
            try:
                seen: str | None = marker.read_text().strip()
            except FileNotFoundError:
                seen = None
            if seen != boot:
                if seen is not None:
                    _delete_cache(path)
                _write_durably(marker, boot)
            _repair(path, walk)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd
    except OSError:
        os.close(fd)
        return None


def _delete_cache(path: Path) -> None:
    """Delete the LMDB files (the caller holds the cache alone); it is rebuilt from storage."""
    for name in _LMDB_FILES:
        (path / name).unlink(missing_ok=True)
    (path / _CLEAN_NAME).unlink(missing_ok=True)


def _file_stamp(data: Path) -> str | None:
    try:
        st = os.stat(data)
    except OSError:
        return None
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino}"


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _repair(path: Path, walk: FileWalker) -> None:
    """Opening the cache alone: delete it if a reader found it damaged, or if it changed since
    its last clean close and its structure is damaged (LMDB must never read a damaged page).

    After a process crash on this boot (no clean-close stamp) the file is not walked: LMDB's
    own commit protocol leaves it whole (an interrupted transaction's pages are never
    referenced), and walking a large cache would make recovery slow. A machine crash is caught
    by the boot marker (the cache is deleted); damage found later by a read is reported as
    :class:`~kvlog.errors.CorruptDataError` and marks the cache to be rebuilt at the next open.
    """
    data = path / "data.mdb"
    stamp = _read_text(path / _CLEAN_NAME)
    (path / _CLEAN_NAME).unlink(missing_ok=True)  # from now on the file may change
    reason = None
    if _read_text(path / _DAMAGED_NAME) == "cache":
        reason = "damage found by an earlier reader"
    elif stamp is not None and stamp != _file_stamp(data):
        reason = check_lmdb_file(data, walk)
    if reason is not None:
        log.warning("metadata cache at %s is damaged (%s): deleted, rebuilt from storage", path, reason)
        _delete_cache(path)
        (path / _DAMAGED_NAME).unlink(missing_ok=True)


def check_lmdb_file(data: Path, walk: FileWalker) -> str | None:
    """None if the LMDB data file ``data`` is missing, new or whole; else the first damage
    found. Reads every page of the B-trees and checks every key-index entry, index run and
    sealed value (their checksums: a damaged key would hide its entry from lookups); nobody may
    write the file meanwhile. About 0.2 s for a cache of a million keys with 100-byte values."""
    try:
        with open(data, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return None
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                return walk(view)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"unreadable: {e}"


class LmdbEnv:
    """An open LMDB environment and its named databases."""

    def __init__(self, path: Path, map_size: int, walk: FileWalker) -> None:
        self.path = path
        #: The name damage to this cache is reported under (``CorruptDataError.name``).
        self.name = f"metadata cache {path}"
        self._map_size = map_size
        self._reserve = PageReserve(path / "data.mdb")
        self._resize_lock = threading.RLock()
        #: Keeps reads of the map's views and resizes of the map apart.
        self.gate = MapGate()
        self._held: int | None = None
        self._local = threading.local()
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._held = _claim_unsynced(path, walk)
            try:
                self._open()
            except _DAMAGE as e:
                if not self._delete_alone(str(e)):
                    raise
                self._open()
        except lmdb.Error as e:
            self._release_hold(synced=False)
            if isinstance(e, _DAMAGE):
                raise CorruptDataError(self.name, f"cannot be opened ({e}); it is in use by another "
                                       "process: delete it once none is") from e
            raise StorageError(f"cannot open the metadata cache at {path}: {e}") from e
        except BaseException:
            self._release_hold(synced=False)
            raise

    def _open(self) -> None:
        """Open the environment and its databases, read the meta database through (damage
        there raises), and apply a reader's damage report or an index layout change."""
        env = lmdb.open(
            str(self.path), map_size=self._map_size, max_dbs=len(DB_NAMES) + 2, max_readers=1024,
            metasync=False, sync=self._held is None, readahead=False, subdir=True, writemap=True,
        )
        try:
            env.reader_check()
            dbs = {name: env.open_db(name.encode()) for name in DB_NAMES}
            with env.begin(buffers=True) as txn:
                for db in dbs.values():
                    txn.stat(db)
                for _key, _value in txn.cursor(db=dbs["meta"]):
                    pass
            self.env, self.dbs = env, dbs
            self._prepare()
        except BaseException:
            env.close()
            raise

    def _prepare(self) -> None:
        """Empty a cache of another layout (it is rebuilt from storage), and mark the key index
        for rebuild (meta ``index_ready``) if a reader found it damaged."""
        marker = self.path / _DAMAGED_NAME
        damaged = _read_text(marker) == "index"
        meta = self.dbs["meta"]
        layout = seal(b"cache_layout", CACHE_LAYOUT)
        with self.env.begin() as reading:
            current = reading.get(b"cache_layout", db=meta) == layout
            empty = reading.stat(meta)["entries"] == 0
        if damaged or not current:
            with self.env.begin(write=True) as txn:
                if not current:
                    if not empty:
                        log.warning("metadata cache at %s is of another layout: emptied, rebuilt from storage",
                                    self.path)
                        for db in self.dbs.values():
                            txn.drop(db, delete=False)
                    txn.put(b"cache_layout", layout, db=meta)
                if damaged:
                    txn.put(b"index_ready", seal(b"index_ready", b"0"), db=meta)
        if damaged:
            marker.unlink(missing_ok=True)

    def _delete_alone(self, reason: str) -> bool:
        """Delete the cache's files if no other process has the cache open (True), after LMDB
        refused to open it or found damage: it is rebuilt from storage."""
        fd = self._held
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fcntl.flock(fd, fcntl.LOCK_SH)  # a failed conversion may have dropped the shared lock
            return False
        try:
            log.warning("metadata cache at %s is damaged (%s): deleted, rebuilt from storage",
                        self.path, reason)
            _delete_cache(self.path)
            (self.path / _DAMAGED_NAME).unlink(missing_ok=True)
        finally:
            fcntl.flock(fd, fcntl.LOCK_SH)
        return True

    def reset(self) -> bool:
        """Delete the cache and open it empty, if no other process has it open; False if one
        has (the caller must not share this environment with other users in the process)."""
        alone: list[bool] = []

        def reopen() -> None:
            self.env.close()
            alone.append(self._delete_alone("found while catching up"))
            self._open()

        with self._resize_lock:
            self.gate.remap(reopen)  # views of the closed environment die with it
        return alone[0]

    def failure(self, error: lmdb.Error) -> KvlogError:
        """The kvlog error for an LMDB error: damage is a ``CorruptDataError`` naming the cache
        (recorded, so the next process to open the cache alone deletes it), anything else a
        ``StorageError``."""
        if isinstance(error, _DAMAGE):
            if not isinstance(error, lmdb.BadValsizeError):
                self.mark_damaged(f"LMDB: {error}", index_only=False)
            return CorruptDataError(self.name, f"LMDB reports damage ({error}); the cache is rebuilt "
                                    "from storage when it is next opened by one process alone")
        return StorageError(f"{self.name}: {error}")

    def damaged(self, reason: str, *, index_only: bool) -> CorruptDataError:
        """Record damage found in the cache (see :meth:`mark_damaged`); the error to raise."""
        self.mark_damaged(reason, index_only=index_only)
        what = "the key index is rebuilt" if index_only else "the cache is rebuilt"
        return CorruptDataError(self.name, f"{reason}; {what} from storage when it is next opened")

    def mark_damaged(self, reason: str, *, index_only: bool) -> None:
        """Record damage: the key index marked for rebuild (meta ``index_ready`` = 0, written
        at once unless this thread is inside a write transaction), else a marker file that the
        next opener acts on (``cache``: it deletes the whole cache when it opens it alone)."""
        log.warning("metadata cache at %s: %s", self.path, reason)
        if index_only and not getattr(self._local, "writing", False):
            try:
                self.write(lambda txn: txn.put(b"index_ready", seal(b"index_ready", b"0"), db=self.dbs["meta"]))
                return
            except KvlogError:
                index_only = False  # the meta database itself fails: the whole cache goes
        marker = self.path / _DAMAGED_NAME
        if index_only and _read_text(marker) == "cache":
            return
        try:
            marker.write_text("index" if index_only else "cache")
        except OSError:
            pass

    def close(self) -> None:
        """Sync and close the environment; the last process to close it removes the boot marker."""
        synced = False
        if self._held is not None:
            try:
                self.env.sync(True)
                synced = True
            except lmdb.Error:
                pass
        with self._resize_lock:
            self.gate.remap(self.env.close)  # no read of its views is under way
        self._release_hold(synced=synced)

    def _stamp_clean(self) -> None:
        """The last process closing the cache, synced: record the file as it leaves it."""
        stamp = _file_stamp(self.path / "data.mdb")
        if stamp is not None and not (self.path / _DAMAGED_NAME).exists():
            (self.path / _CLEAN_NAME).write_text(stamp)

    def _release_hold(self, *, synced: bool) -> None:
        fd, self._held = self._held, None
        if fd is None:
            return
        try:
            if synced:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # others still have it open; the last of them removes the marker
                self._stamp_clean()
                (self.path / _MARKER_NAME).unlink(missing_ok=True)
                _sync_dir(self.path)
        except OSError:
            pass
        finally:
            os.close(fd)

    def write(self, fn: Callable[[lmdb.Transaction], T], grows: int = 0) -> T:
        """Run ``fn`` in a write transaction, growing the map and retrying when it is full.

        ``fn`` must only touch LMDB, since it may run more than once; ``grows``: the bytes of
        pages it may add at most, when it knows (see :mod:`kvlog.meta.reserve`)."""
        while True:
            try:
                with self._resize_lock:
                    used = self._reserve.before(self.env, grows)
                    with self.env.begin(write=True) as txn:
                        self._local.writing = True
                        try:
                            result = fn(txn)
                        finally:
                            self._local.writing = False
                    self._reserve.after(self.env, used)
                    return result
            except lmdb.MapFullError:
                self._grow()
            except lmdb.MapResizedError:
                self._adopt_size()
            except lmdb.Error as e:
                raise self.failure(e) from e
            except CacheDamage as e:
                raise self.damaged(str(e), index_only=e.index_only) from None

    def read(self) -> lmdb.Transaction:
        """A read transaction (a snapshot); the caller aborts it when done."""
        while True:
            try:
                return self.begin(buffers=False)
            except lmdb.MapResizedError:
                self._adopt_size()
            except lmdb.Error as e:
                raise self.failure(e) from e

    def begin(self, db: lmdb._Database | None = None, *, buffers: bool) -> lmdb.Transaction:
        """``env.begin`` of a read transaction, never while the map is being resized (LMDB
        cannot begin one meanwhile); raises what py-lmdb raises."""
        gate = self.gate
        gate.enter()
        try:
            txn: lmdb.Transaction = self.env.begin(db=db, buffers=buffers)  # type: ignore[call-overload]
            return txn
        finally:
            gate.leave()

    def begin_views(self, db: lmdb._Database | None = None) -> tuple[lmdb.Transaction, int]:
        """A read transaction making views of the map (``buffers=True``), and the tag of its
        views: the epoch of the map it began on (see :mod:`kvlog.meta.map_gate`)."""
        gate = self.gate
        gate.enter()
        try:
            return self.env.begin(db=db, buffers=True), gate.epoch
        finally:
            gate.leave()

    def _grow(self) -> None:
        with self._resize_lock:
            try:
                size = self.env.info()["map_size"]
            except lmdb.Error as e:
                raise self.failure(e) from e
            self._remap(size * 2)

    def _adopt_size(self) -> None:
        self._remap(0)

    def _remap(self, size: int) -> None:
        """Resize the map to ``size`` bytes (0: the size another process gave it), through the
        gate that keeps readers of views out (see :mod:`kvlog.meta.map_gate`)."""
        with self._resize_lock:
            try:
                self.gate.remap(lambda: self.env.set_mapsize(size))
            except lmdb.Error as e:
                raise self.failure(e) from e

    def map_size(self) -> int:
        """The current map size in bytes."""
        try:
            return int(self.env.info()["map_size"])
        except lmdb.Error as e:
            raise self.failure(e) from e

    def disk_bytes(self) -> int:
        """Bytes the environment's data file uses on disk."""
        try:
            return os.stat(self.path / "data.mdb").st_blocks * 512  # the file is sparse
        except OSError:
            return 0

    def files_bytes(self) -> int:
        """Bytes every file of the cache directory (the data file, LMDB's lock file, kvlog's
        markers) takes on disk: allocated blocks, since the data file is sparse."""
        total = 0
        try:
            entries = list(os.scandir(self.path))
        except OSError:
            return 0
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue  # removed meanwhile
        return total

    def page_bytes(self) -> dict[str, int]:
        """Bytes of the data file's pages up to the last one used, by what holds them: ``index``
        (the key index's B-tree), ``runs`` (index runs pending), ``catalog`` (every other
        table and LMDB's two meta pages) and ``free`` (every other page: freed by earlier
        transactions and reused by later ones, still on disk, with LMDB's list of them). They
        add up to the file's used extent (a writer committing meanwhile may shift a few pages
        between ``free`` and the others)."""
        try:
            psize = int(self.env.stat()["psize"])
            with self.begin(buffers=False) as txn:
                last = int(self.env.info()["last_pgno"])
                held: dict[str, int] = {}
                for name, db in self.dbs.items():
                    s = txn.stat(db)
                    held[name] = int(s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"])
                main = txn.stat()
        except lmdb.Error as e:
            raise self.failure(e) from e
        pages = last + 1
        index, runs = held.pop("index"), held.pop("runs")
        # The unnamed main table (the names of the others) and the two meta pages.
        catalog = sum(held.values()) + int(main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]) + 2
        free = max(0, pages - index - runs - catalog)
        return {"index": index * psize, "runs": runs * psize, "catalog": catalog * psize, "free": free * psize}


def acquire_env(path: str | os.PathLike[str], walk: FileWalker, map_size: int = 1 << 30) -> LmdbEnv:
    """The process's shared environment at ``path``, opened on first use (``walk`` checks the
    structure of a file that was not closed cleanly: see :func:`check_lmdb_file`)."""
    key = os.path.realpath(path)
    with _registry_lock:
        entry = _registry.get(key)
        if entry is None:
            env = LmdbEnv(Path(key), map_size, walk)
            _registry[key] = (env, 1)
            return env
        env, count = entry
        _registry[key] = (env, count + 1)
        return env


def reset_env(env: LmdbEnv) -> bool:
    """Delete a damaged cache and open it empty (see :meth:`LmdbEnv.reset`), if nothing else in
    this process or on this machine uses it; False otherwise."""
    with _registry_lock:
        entry = _registry.get(str(env.path))
        if entry is None or entry[0] is not env or entry[1] != 1:
            return False
        return env.reset()


def release_env(env: LmdbEnv) -> None:
    """Drop one reference; the last one closes the environment."""
    key = str(env.path)
    with _registry_lock:
        entry = _registry.get(key)
        if entry is None:
            return
        count = entry[1] - 1
        if count <= 0:
            del _registry[key]
            env.close()
        else:
            _registry[key] = (env, count)
