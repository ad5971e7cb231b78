"""A small durable flush in the steady state costs two requests on S3: the conditional swap of
the head to the commit that carries its records inline, and the PUT of the commit's copy at its
own name; on a local root one swap (the copy is linked with it). A flush past
``commit_inline_bytes`` adds the PUT of its data file.

The writer neither asks storage for the head before writing (the head it swapped last is its
guess; a refused swap is how it learns another writer won) nor reads back the commit it
published (the swap's success proves the head holds those bytes). A checkpoint every
``checkpoint_interval`` commits adds its PUT; it is counted apart.

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

    def read_versioned(self, name: str, unless: str | None = None) -> tuple[bytes, str] | None:
        self.noted.note("get", name)
        return super().read_versioned(name, unless)  # type: ignore[safe-super,no-any-return]

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        self.noted.note("swap", name)
        return super().swap(name, data, expected, copy_to)  # type: ignore[safe-super,no-any-return]

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
                       if kind == "put" and name.endswith(".checkpoint.json")]
        # A checkpoint every ``interval`` commits, counted apart.
        assert len(checkpoints) == sum(1 for v in range(first, first + appends)
                                       if (v - checkpoints[0]) % interval == 0) if checkpoints else interval > appends
        assert all(b - a == interval for a, b in zip(checkpoints, checkpoints[1:], strict=False))
        kinds = Counter(kind for kind, _name in noted.seen)
        data_puts = [name for kind, name in noted.seen if kind == "put" and name.startswith("data/")]
        assert len(data_puts) == (0 if inline else appends)
        swaps = [name for kind, name in noted.seen if kind == "swap"]
        assert swaps == ["log/head.json"] * appends
        # An object store PUTs each commit's copy after the swap; a local root links it in the swap.
        copies = [name for kind, name in noted.seen if kind == "put" and name.startswith("log/")
                  and not name.endswith(".checkpoint.json")]
        local = isinstance(storage, LocalStorage)
        assert copies == ([] if local else [commit_name(v) for v in range(first, first + appends)])
        per_append = (1 if local else 2) + (0 if inline else 1)
        assert sum(kinds.values()) == per_append * appends + len(checkpoints), noted.seen
        assert set(kinds) <= {"put", "swap"}, kinds
        for i in range(appends):
            assert store.get(f"key-{i:04}".encode()) == b"v" * 100
        assert store.check() == []


@pytest.mark.parametrize("inline", [True, False])
def test_a_local_append_is_one_swap_and_reads_nothing(tmp_path: Path, inline: bool) -> None:
    storage = _NotingLocal(tmp_path / "root")
    _steady_appends(storage, storage.noted, tmp_path / "cache", interval=1000, appends=20, inline=inline)


@pytest.mark.parametrize("interval", [1000, 7])
def test_a_small_s3_append_costs_a_conditional_swap_and_the_put_of_its_copy(
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
    """Two writers on one root: the one whose head is stale gets a refused swap, reads the head,
    applies the winner's commit and lands at the version after it."""
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
        swaps = [name for kind, name in storage.noted.seen if kind == "swap"]
        assert swaps == ["log/head.json"] * 2  # refused, then published at the version after b's
        assert ("get", "log/head.json") in storage.noted.seen and ("get", commit_name(taken)) in storage.noted.seen
        assert a.log.version == taken + 1
        b.log.refresh()
        assert b.get(b"a1") == b"2" and a.get(b"b0") == b"1"
        assert a.check() == []
