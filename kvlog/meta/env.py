"""One LMDB environment per directory per process, with map growth handled inside.

LMDB forbids opening the same environment twice in one process, so handles
are shared through a registry and reference-counted. ``MapFullError`` doubles
the map and retries the transaction function; ``writemap`` makes write
transactions modify the memory map directly, so dirty pages are page cache,
never heap that grows with the size of a transaction (a sparse file on disk); ``MapResizedError`` (another
process grew it) adopts the new size. Stale reader slots of dead processes are
cleared on open.

Commits are not fsynced: the cache is rebuildable, and a process crash loses
nothing (its pages are in the page cache). Only a machine crash can leave a
torn file, so while processes have the cache open, a marker file holds the
boot id; the first process to open the cache after a reboot finds an old boot
id there and deletes the cache, which is then rebuilt from the storage root.
The last process to close it syncs it and removes the marker. Where boot ids
or ``flock`` are unavailable, every commit is synced instead.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import lmdb

from kvlog.errors import StorageError

__all__ = ["LmdbEnv", "acquire_env", "release_env", "DB_NAMES"]

T = TypeVar("T")

DB_NAMES = (
    "meta", "files", "batches", "parts", "producers", "outcomes", "pending", "index", "runs", "cleaner",
)

_registry: dict[str, tuple[LmdbEnv, int]] = {}
_registry_lock = threading.Lock()

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_LOCK_NAME = "kvlog-cache.lock"
_MARKER_NAME = "kvlog-unsynced"
_LMDB_FILES = ("data.mdb", "lock.mdb")


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


def _claim_unsynced(path: Path) -> int | None:
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
                    for name in _LMDB_FILES:
                        (path / name).unlink(missing_ok=True)
                _write_durably(marker, boot)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd
    except OSError:
        os.close(fd)
        return None


class LmdbEnv:
    """An open LMDB environment and its named databases."""

    def __init__(self, path: Path, map_size: int) -> None:
        self.path = path
        self._resize_lock = threading.RLock()
        self._held: int | None = None
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._held = _claim_unsynced(path)
            self.env = lmdb.open(
                str(path), map_size=map_size, max_dbs=len(DB_NAMES) + 2, max_readers=1024,
                metasync=False, sync=self._held is None, readahead=False, subdir=True, writemap=True,
            )
            self.env.reader_check()
            self.dbs = {name: self.env.open_db(name.encode()) for name in DB_NAMES}
        except lmdb.Error as e:
            self._release_hold(synced=False)
            raise StorageError(f"cannot open the metadata cache at {path}: {e}") from e
        except BaseException:
            self._release_hold(synced=False)
            raise

    def close(self) -> None:
        """Sync and close the environment; the last process to close it removes the boot marker."""
        synced = False
        if self._held is not None:
            try:
                self.env.sync(True)
                synced = True
            except lmdb.Error:
                pass
        self.env.close()
        self._release_hold(synced=synced)

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
                (self.path / _MARKER_NAME).unlink(missing_ok=True)
                _sync_dir(self.path)
        except OSError:
            pass
        finally:
            os.close(fd)

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``fn`` in a write transaction, growing the map and retrying when it is full.

        ``fn`` must only touch LMDB, since it may run more than once.
        """
        while True:
            try:
                with self._resize_lock:
                    with self.env.begin(write=True) as txn:
                        return fn(txn)
            except lmdb.MapFullError:
                self._grow()
            except lmdb.MapResizedError:
                self._adopt_size()
            except lmdb.Error as e:
                raise StorageError(f"metadata cache {self.path}: {e}") from e

    def read(self) -> lmdb.Transaction:
        """A read transaction (a snapshot); the caller aborts it when done."""
        while True:
            try:
                return self.env.begin(write=False, buffers=False)
            except lmdb.MapResizedError:
                self._adopt_size()
            except lmdb.Error as e:
                raise StorageError(f"metadata cache {self.path}: {e}") from e

    def _grow(self) -> None:
        with self._resize_lock:
            size = self.env.info()["map_size"]
            self.env.set_mapsize(size * 2)

    def _adopt_size(self) -> None:
        with self._resize_lock:
            self.env.set_mapsize(0)

    def map_size(self) -> int:
        """The current map size in bytes."""
        return int(self.env.info()["map_size"])

    def disk_bytes(self) -> int:
        """Bytes the environment's data file uses on disk."""
        try:
            return os.stat(self.path / "data.mdb").st_blocks * 512  # the file is sparse (writemap)
        except OSError:
            return 0


def acquire_env(path: str | os.PathLike[str], map_size: int = 1 << 30) -> LmdbEnv:
    """The process's shared environment at ``path``, opened on first use."""
    key = os.path.realpath(path)
    with _registry_lock:
        entry = _registry.get(key)
        if entry is None:
            env = LmdbEnv(Path(key), map_size)
            _registry[key] = (env, 1)
            return env
        env, count = entry
        _registry[key] = (env, count + 1)
        return env


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
