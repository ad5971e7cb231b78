"""Local-directory storage: durable writes with fsync, atomic creation with ``link``.

``put`` writes a temporary file, fsyncs it, renames it over the name and fsyncs
the directory, so a crash leaves the old or the new object. ``put_if_absent``
writes and fsyncs a temporary file and then hard-links it to the name: ``link``
fails with ``EEXIST`` atomically when the name exists, and the object appears
whole or not at all (``O_EXCL`` alone could expose a half-written file). ``swap``
compares and replaces under an exclusive ``flock`` of the object's directory (every
process and thread takes it on its own descriptor), and links its copy from the same
temporary file before the rename, so both names need one file fsync and one directory
fsync.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import mmap
import os
import threading
from pathlib import Path
from typing import BinaryIO

import xxhash

from kvlog.errors import StorageError
from kvlog.storage.base import BytesLike, ObjectInfo, Storage, SwapConflict, check_name
from kvlog.storage.watch import RenameWatch, watch_renames

__all__ = ["LocalStorage", "LocalStream", "is_temporary"]

_TMP_MARK = ".tmp-kvlog."


def _token(data: BytesLike) -> str:
    """The version token of a local object: its length and 64-bit content hash (a root
    restored with the same bytes is the same version, which is what a swap compares)."""
    return f"{len(memoryview(data).cast('B'))}-{xxhash.xxh3_64_hexdigest(data)}"


class LocalStream:
    """A forward-only stream over a local file, read through a read-only memory mapping.

    :meth:`read` returns views of the mapping, not copies: the file's pages come straight from
    the page cache, and what a caller decodes from a view stays valid after :meth:`close` (the
    mapping goes once no view of it is left). Data files are immutable and only ever deleted
    whole, which leaves a mapping intact.
    """

    def __init__(self, handle: BinaryIO, start: int) -> None:
        try:
            size = os.fstat(handle.fileno()).st_size
            self._mapping = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ) if size else None
        finally:
            handle.close()
        self._view = memoryview(self._mapping) if self._mapping is not None else memoryview(b"")
        self._size = size
        self._position = min(start, size)

    @property
    def position(self) -> int:
        return self._position

    def read(self, n: int) -> memoryview:
        end = min(self._size, self._position + n)
        data = self._view[self._position : end]
        self._position = end
        return data

    def skip_to(self, position: int) -> None:
        if position < self._position:
            raise ValueError(f"stream is at {self._position}, cannot go back to {position}")
        self._position = min(position, self._size)

    def close(self) -> None:
        self._view.release()
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # views of it are still in use: it is unmapped when the last one goes


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a file a write of this backend makes before it links the real name:
    another process creating a store has made the directory and is writing its identity."""
    return name.startswith(_TMP_MARK)


class LocalStorage(Storage):
    """Objects as files under a root directory."""

    _transient = (*Storage._transient, "_tmp_counter", "_tmp_lock")

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        super().__init__()
        self.root = Path(root).absolute()
        self.uri = self.root.as_uri()
        self.fsync = fsync
        self._tmp_counter = itertools.count()
        self._tmp_lock = threading.Lock()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create the store directory {self.root}: {e}") from e

    def _rebuild(self) -> None:
        super()._rebuild()
        self._tmp_counter = itertools.count()
        self._tmp_lock = threading.Lock()

    def _path(self, name: str) -> Path:
        return self.root / check_name(name)

    def _tmp_path(self, final: Path) -> Path:
        with self._tmp_lock:
            n = next(self._tmp_counter)
        return final.with_name(f"{_TMP_MARK}{final.name}.{os.getpid()}.{threading.get_ident()}.{n}")

    def _make_dirs(self, directory: Path) -> None:
        """Create ``directory`` and its missing parents, each made durable: a new directory's
        entry lives in its parent, which is fsynced after the creation, so a file created in it
        and fsynced with its directory cannot lose its path in a crash."""
        if directory.is_dir():
            return
        missing: list[Path] = []
        while not directory.exists():
            missing.append(directory)
            directory = directory.parent
        for new in reversed(missing):
            with contextlib.suppress(FileExistsError):  # another writer made it at the same instant
                new.mkdir()
            self._sync_dir(new.parent)

    def _write_tmp(self, final: Path, data: BytesLike) -> Path:
        self._make_dirs(final.parent)
        tmp = self._tmp_path(final)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data).cast("B")
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(fd)
                self._fsynced()
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return tmp

    def _sync_dir(self, directory: Path) -> None:
        if not self.fsync:
            return
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
            self._fsynced()
        finally:
            os.close(fd)

    def read(self, name: str) -> bytes:
        self._count("get")
        try:
            return self._received(self._path(name).read_bytes())
        except FileNotFoundError:
            raise
        except OSError as e:
            raise StorageError(f"cannot read {name}: {e}") from e

    def read_range(self, name: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError("start and length must be >= 0")
        self._count("range_get")
        try:
            with open(self._path(name), "rb") as f:
                f.seek(start)
                return self._received(f.read(length))
        except FileNotFoundError:
            raise
        except OSError as e:
            raise StorageError(f"cannot read {name}: {e}") from e

    def open_stream(self, name: str, start: int = 0) -> LocalStream:
        self._count("stream")
        try:
            return LocalStream(open(self._path(name), "rb"), start)  # noqa: SIM115
        except FileNotFoundError:
            raise
        except OSError as e:
            raise StorageError(f"cannot open {name}: {e}") from e

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        self._count("put_if_absent", memoryview(data).nbytes)
        final = self._path(name)
        try:
            if final.exists():
                raise FileExistsError(name)
            tmp = self._write_tmp(final, data)
            try:
                os.link(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
            self._sync_dir(final.parent)
        except FileExistsError:
            raise FileExistsError(name) from None
        except OSError as e:
            raise StorageError(f"cannot create {name}: {e}") from e

    def read_versioned(self, name: str, unless: str | None = None) -> tuple[bytes, str] | None:
        data = self.read(name)
        token = _token(data)
        return None if token == unless else (data, token)

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        self._count("swap", memoryview(data).nbytes)
        final = self._path(name)
        copy = self._path(copy_to) if copy_to is not None else None
        try:
            self._make_dirs(final.parent)
            lock = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    current = _token(final.read_bytes())
                except FileNotFoundError:
                    current = None
                if current != expected:
                    raise SwapConflict(errno.EEXIST, "another version", name)
                tmp = self._write_tmp(final, data)
                try:
                    if copy is not None:
                        self._link_over(tmp, copy)
                    os.replace(tmp, final)
                finally:
                    tmp.unlink(missing_ok=True)
                if self.fsync:
                    os.fsync(lock)  # the lock is held on the directory: its fsync makes both names durable
                    self._fsynced()
                if copy is not None and copy.parent != final.parent:
                    self._sync_dir(copy.parent)
            finally:
                os.close(lock)  # releases the lock
        except SwapConflict:
            raise
        except OSError as e:
            raise StorageError(f"cannot swap {name}: {e}") from e
        return _token(data)

    def watch_swaps(self, name: str) -> RenameWatch | None:
        """A swap renames a new file over the name: the kernel reports it (inotify)."""
        final = self._path(name)
        return watch_renames(final) if final.parent.is_dir() else None

    def _link_over(self, source: Path, target: Path) -> None:
        """Make ``target`` a second name of ``source`` (replacing what it named)."""
        self._make_dirs(target.parent)
        try:
            os.link(source, target)
        except FileExistsError:
            spare = self._tmp_path(target)
            os.link(source, spare)
            os.replace(spare, target)

    def put(self, name: str, data: BytesLike) -> None:
        self._count("put", memoryview(data).nbytes)
        final = self._path(name)
        try:
            tmp = self._write_tmp(final, data)
            os.replace(tmp, final)
            self._sync_dir(final.parent)
        except OSError as e:
            raise StorageError(f"cannot write {name}: {e}") from e

    def put_file(self, name: str, path: Path) -> None:
        """As :meth:`put`, but moves ``path`` into place (fsynced first, as :meth:`put` syncs its
        temporary file) when it lies on the store's file system; otherwise copies it."""
        final = self._path(name)
        try:
            self._make_dirs(final.parent)
            if self.fsync:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    self._fsynced()
                finally:
                    os.close(fd)
            os.replace(path, final)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise StorageError(f"cannot write {name}: {e}") from e
            super().put_file(name, path)  # another file system: copy
            return
        self._count("put", final.stat().st_size)
        try:
            self._sync_dir(final.parent)
        except OSError as e:
            raise StorageError(f"cannot write {name}: {e}") from e

    def stat(self, name: str) -> ObjectInfo:
        self._count("stat")
        try:
            st = self._path(name).stat()
        except FileNotFoundError:
            raise
        except OSError as e:
            raise StorageError(f"cannot stat {name}: {e}") from e
        return ObjectInfo(name, st.st_size, st.st_mtime_ns // 1_000_000)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self._count("list")
        # Walk only the deepest directory the prefix names.
        directory, _, _ = prefix.rpartition("/")
        base = self.root / directory if directory else self.root
        out: list[ObjectInfo] = []
        if not base.is_dir():
            return out
        try:
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames.sort()
                rel_dir = os.path.relpath(dirpath, self.root)
                for fname in filenames:
                    if fname.startswith(_TMP_MARK):
                        continue
                    rel = fname if rel_dir == "." else f"{rel_dir}/{fname}".replace(os.sep, "/")
                    if not rel.startswith(prefix):
                        continue
                    try:
                        st = os.stat(os.path.join(dirpath, fname))
                    except FileNotFoundError:
                        continue
                    out.append(ObjectInfo(rel, st.st_size, st.st_mtime_ns // 1_000_000))
        except OSError as e:
            raise StorageError(f"cannot list {prefix!r}: {e}") from e
        out.sort(key=lambda info: info.name)
        return out

    def delete(self, name: str) -> None:
        self._count("delete")
        try:
            self._path(name).unlink(missing_ok=True)
        except OSError as e:
            raise StorageError(f"cannot delete {name}: {e}") from e
