"""One LMDB environment per directory per process, with map growth handled inside.

LMDB forbids opening the same environment twice in one process, so handles
are shared through a registry and reference-counted. ``MapFullError`` doubles
the map and retries the transaction function; ``writemap`` makes write
transactions modify the memory map directly, so dirty pages are page cache,
never heap that grows with the size of a transaction (a sparse file on disk); ``MapResizedError`` (another
process grew it) adopts the new size. Stale reader slots of dead processes are
cleared on open.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import lmdb

from kvlog.errors import StorageError

__all__ = ["LmdbEnv", "acquire_env", "release_env", "DB_NAMES"]

T = TypeVar("T")

DB_NAMES = ("meta", "files", "batches", "parts", "producers", "outcomes", "pending", "index", "cleaner")

_registry: dict[str, tuple[LmdbEnv, int]] = {}
_registry_lock = threading.Lock()


class LmdbEnv:
    """An open LMDB environment and its named databases."""

    def __init__(self, path: Path, map_size: int) -> None:
        self.path = path
        self._resize_lock = threading.RLock()
        try:
            path.mkdir(parents=True, exist_ok=True)
            self.env = lmdb.open(
                str(path), map_size=map_size, max_dbs=len(DB_NAMES) + 2, max_readers=1024,
                metasync=False, readahead=False, subdir=True, writemap=True,
            )
            self.env.reader_check()
            self.dbs = {name: self.env.open_db(name.encode()) for name in DB_NAMES}
        except lmdb.Error as e:
            raise StorageError(f"cannot open the metadata cache at {path}: {e}") from e

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
            env.env.close()
        else:
            _registry[key] = (env, count)
