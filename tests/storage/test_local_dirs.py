"""Local storage makes a new directory durable before a file in it can be acknowledged.

A file's name lives in its directory, and a new directory's name in its parent: fsyncing the file
and its directory is not enough after a crash unless the parent of every directory created on the
way was fsynced too. The real ``os.fsync`` runs; the test records which directories it was given.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvlog.storage.local import LocalStorage


def _synced_dirs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    synced: list[Path] = []
    real = os.fsync

    def recording_fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.is_dir():
            synced.append(path)
        real(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return synced


@pytest.mark.parametrize("how", ["put", "put_if_absent", "put_file"])
def test_every_directory_created_for_a_file_has_its_parent_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    storage = LocalStorage(tmp_path / "root")
    synced = _synced_dirs(monkeypatch)
    name = "data/7/deep/f.arrow"
    if how == "put":
        storage.put(name, b"x")
    elif how == "put_if_absent":
        storage.put_if_absent(name, b"x")
    else:
        source = tmp_path / "root" / "staged"
        source.write_bytes(b"x")
        storage.put_file(name, source)
    root = (tmp_path / "root").resolve()
    for created in (root / "data", root / "data/7", root / "data/7/deep"):
        assert created.parent in synced, f"{created} was created but its parent was never synced"
    assert root / "data/7/deep" in synced  # the file's own entry
    assert storage.read(name) == b"x"


def test_an_existing_directory_costs_no_extra_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = LocalStorage(tmp_path / "root")
    storage.put("log/a", b"1")
    synced = _synced_dirs(monkeypatch)
    storage.put("log/b", b"2")
    assert synced == [(tmp_path / "root" / "log").resolve()]
