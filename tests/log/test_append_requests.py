"""A small durable flush in the steady state costs two requests: the conditional PUT of the
commit that carries its records inline, and one GET of the commit it follows; a flush past
``commit_inline_bytes`` adds the PUT of its data file.

The writer neither asks storage for the head before writing (the applied version is its
guess; a conditional PUT that finds the name taken is how it learns another writer won) nor
reads back the commit it created (the conditional PUT's success proves storage holds those
bytes), nor reads the head it wrote and checked itself. The one GET left is the check after
the commit landed that the commit it follows is still there (a root restored from an older
copy while the commit was on its way): without it such a commit would be acknowledged after a
gap no reader crosses. A checkpoint every ``checkpoint_interval`` commits adds its own GET of
the head and its conditional PUT; it is counted apart.

The counts come from a wrapper over the real backend (SeaweedFS, or a local directory) that
records every request by kind and name.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.log.naming import commit_name
from kvlog.storage import LocalStorage
from kvlog.storage.base import BytesLike, ObjectInfo, Storage
from kvlog.storage.object_store import ObjectStoreStorage

QUIET: dict[str, Any] = {"flush_interval_ms": 60_000, "background_compaction": False}


class _Requests:
    """The requests a storage served, as ``(kind, name)`` in order, while :attr:`on`."""

    def __init__(self) -> None:
        self.on = False
        self.seen: list[tuple[str, str]] = []

    def note(self, kind: str, name: str) -> None:
        if self.on:
            self.seen.append((kind, name))


class _Noting(Storage):
    """Notes every request before the real backend after it in the method order serves it."""

    noted: _Requests

    def read(self, name: str) -> bytes:
        self.noted.note("get", name)
        return super().read(name)  # type: ignore[safe-super]

    def read_range(self, name: str, start: int, length: int) -> bytes:
        self.noted.note("range_get", name)
        return super().read_range(name, start, length)  # type: ignore[safe-super]

    def put(self, name: str, data: BytesLike) -> None:
        self.noted.note("put", name)
        super().put(name, data)  # type: ignore[safe-super]

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        self.noted.note("put_if_absent", name)
        super().put_if_absent(name, data)  # type: ignore[safe-super]

    def stat(self, name: str) -> ObjectInfo:
        self.noted.note("stat", name)
        return super().stat(name)  # type: ignore[safe-super]

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self.noted.note("list", prefix)
        return super().list(prefix)  # type: ignore[safe-super]

    def delete(self, name: str) -> None:
        self.noted.note("delete", name)
        super().delete(name)  # type: ignore[safe-super]


class _NotingLocal(_Noting, LocalStorage):
    """A real local directory whose requests are noted."""

    def __init__(self, root: Path) -> None:
        LocalStorage.__init__(self, root, fsync=False)
        self.noted = _Requests()


class _NotingS3(_Noting, ObjectStoreStorage):
    """A real S3 prefix (SeaweedFS) whose requests are noted."""

    def __init__(self, uri: str, options: dict[str, Any]) -> None:
        ObjectStoreStorage.__init__(self, uri, options)
        self.noted = _Requests()


def _steady_appends(storage: Storage, noted: _Requests, cache: Path, interval: int, appends: int,
                    inline: bool = True) -> None:
    """Warm a store up, then make ``appends`` sync puts and check the requests of each (each
    carried inside its commit when ``inline``, else in a data file of its own)."""
    with kvlog.open(storage, cache_dir=cache, checkpoint_interval=interval, **QUIET,
                    commit_inline_bytes=65536 if inline else 0) as store:
        for i in range(3):
            store.put(f"warm-{i}".encode(), b"w" * 100, sync=True)
        first = store.log.version + 1
        before = Counter(storage.requests)
        noted.on = True
        for i in range(appends):
            store.put(f"key-{i:04}".encode(), b"v" * 100, sync=True)
        noted.on = False
        # The backend's own counter agrees: no request of a kind the wrapper does not see.
        assert Counter(storage.requests) - before == Counter(kind for kind, _name in noted.seen)
        assert store.log.version == first + appends - 1
        checkpoints = [int(name[len("log/"):].split(".")[0]) for kind, name in noted.seen
                       if kind == "put_if_absent" and name.endswith(".checkpoint.json")]
        # A checkpoint every ``interval`` commits, counted apart.
        assert len(checkpoints) == sum(1 for v in range(first, first + appends)
                                       if (v - checkpoints[0]) % interval == 0) if checkpoints else interval > appends
        assert all(b - a == interval for a, b in zip(checkpoints, checkpoints[1:], strict=False))
        kinds = Counter(kind for kind, _name in noted.seen)
        data_puts = [name for kind, name in noted.seen if kind == "put"]
        assert len(data_puts) == (0 if inline else appends) and all(n.startswith("data/") for n in data_puts)
        commits = [name for kind, name in noted.seen if kind == "put_if_absent" and not name.endswith("checkpoint.json")]
        assert commits == [commit_name(v) for v in range(first, first + appends)]
        # One GET after each commit, of the commit it follows; one more per checkpoint (its head).
        gets = [name for kind, name in noted.seen if kind == "get"]
        assert sorted(gets) == sorted([commit_name(v - 1) for v in range(first, first + appends)]
                                      + [commit_name(v) for v in checkpoints])
        assert kinds["put_if_absent"] == appends + len(checkpoints)
        per_append = 2 if inline else 3
        assert sum(kinds.values()) == per_append * appends + 2 * len(checkpoints), noted.seen
        assert set(kinds) <= {"get", "put", "put_if_absent"}, kinds
        for i in range(appends):
            assert store.get(f"key-{i:04}".encode()) == b"v" * 100
        assert store.check() == []


@pytest.mark.parametrize("inline", [True, False])
def test_a_local_append_reads_only_the_commit_it_follows(tmp_path: Path, inline: bool) -> None:
    storage = _NotingLocal(tmp_path / "root")
    _steady_appends(storage, storage.noted, tmp_path / "cache", interval=1000, appends=20, inline=inline)


@pytest.mark.parametrize("interval", [1000, 7])
def test_a_small_s3_append_costs_a_conditional_commit_put_and_one_get(
    s3_root: tuple[str, dict[str, Any]], tmp_path: Path, interval: int,
) -> None:
    uri, options = s3_root
    storage = _NotingS3(uri, options)
    try:
        _steady_appends(storage, storage.noted, tmp_path / "cache", interval=interval, appends=20)
    finally:
        storage.close()


def test_an_s3_append_past_commit_inline_bytes_adds_the_put_of_its_data_file(
    s3_root: tuple[str, dict[str, Any]], tmp_path: Path,
) -> None:
    uri, options = s3_root
    storage = _NotingS3(uri, options)
    try:
        _steady_appends(storage, storage.noted, tmp_path / "cache", interval=1000, appends=10, inline=False)
    finally:
        storage.close()


def test_a_writer_that_lost_the_race_reads_replays_and_retries(tmp_path: Path) -> None:
    """Two writers on one root: the one whose guess of the next version was taken gets a refused
    conditional PUT, applies the winner's commit and lands at the version after it."""
    root = tmp_path / "root"
    storage = _NotingLocal(root)
    with kvlog.open(storage, cache_dir=tmp_path / "a", **QUIET) as a, \
            kvlog.open(root, cache_dir=tmp_path / "b", **QUIET) as b:
        a.put(b"a0", b"1", sync=True)
        b.put(b"b0", b"1", sync=True)  # b applies a's commit, then writes after it
        taken = b.log.version
        storage.noted.on = True
        a.put(b"a1", b"2", sync=True)  # a guesses the version b took
        storage.noted.on = False
        assert ("put_if_absent", commit_name(taken)) in storage.noted.seen
        assert ("put_if_absent", commit_name(taken + 1)) in storage.noted.seen
        assert a.log.version == taken + 1
        b.log.refresh()
        assert b.get(b"a1") == b"2" and a.get(b"b0") == b"1"
        assert a.check() == []
