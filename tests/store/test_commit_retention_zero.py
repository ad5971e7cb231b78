"""Commit GC with ``commit_retention_ms=0`` while other processes write: history, not a restore.

With retention 0, ``gc()`` collects every commit below the newest checkpoint but the one
right below it. A process (its own ``cache_dir``: its own LMDB cache, as a second process has)
whose head commit was collected while the commit after it remains writes on: that commit
names its head, so its history was collected, not restored. One that fell further behind (the
commits after its head were collected too) is told to reopen, with nothing written, and the
reopen catches up from the checkpoint. The interleavings are driven step by step; the last
test lets two real processes race.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from root_surgery import QUIET, is_commit

import kvlog
from kvlog.errors import StorageBehindError
from kvlog.log.naming import commit_name
from kvlog.storage import LocalStorage
from kvlog.storage.base import BytesLike

SETTINGS: dict[str, Any] = {**QUIET, "commit_retention_ms": 0, "checkpoint_interval": 1000}
HERE = Path(__file__).parent


def _commit_up_to(store: kvlog.Store, version: int, prefix: str) -> list[bytes]:
    """Write keys (each acknowledged) until ``store`` is at ``version``; the keys written."""
    keys: list[bytes] = []
    while store.log.version < version:
        key = f"{prefix}{len(keys)}".encode()
        store.put(key, key, sync=True)
        keys.append(key)
    assert store.log.version == version
    return keys


def _checkpoint_and_collect(store: kvlog.Store) -> dict[str, int]:
    """Checkpoint ``store`` at its head, then collect the commits below it (retention 0)."""
    time.sleep(0.01)  # the commits below are older than the checkpoint in storage time
    store.log.write_checkpoint()
    return store.gc()


def _holds(store: kvlog.Store, keys: list[bytes]) -> None:
    assert [store.get(k) for k in keys] == keys


def _reopen_and_check(root: Path, cache: Path, keys: list[bytes]) -> None:
    with kvlog.open(root, cache_dir=cache, **SETTINGS) as again:
        _holds(again, keys)
        again.put(b"after-reopen", b"x", sync=True)
        assert again.get(b"after-reopen") == b"x"
        assert again.check() == []


def _behind_under_successor(tmp_path: Path, own_head: bool) -> tuple[kvlog.Store, list[bytes]]:
    """Handle A at version v (its own commit, or another's it applied by refreshing); then
    another handle commits v+1 and v+2, checkpoints at v+2 and collects: A's head is gone,
    commit v+1 (which names it) stays."""
    root = tmp_path / "root"
    a = kvlog.open(root, cache_dir=tmp_path / "a", **SETTINGS)
    keys = _commit_up_to(a, a.log.version + 1, "a")
    with kvlog.open(root, cache_dir=tmp_path / "b", **SETTINGS) as b:
        if not own_head:
            keys += _commit_up_to(b, b.log.version + 1, "b-head")
            a.log.refresh()
        head = a.log.version
        keys += _commit_up_to(b, head + 2, "b")
        assert _checkpoint_and_collect(b)["commits"] > 0
    assert not (root / commit_name(head)).exists() and (root / commit_name(head + 1)).exists()
    return a, keys


STEPS: dict[str, Callable[[kvlog.Store], object]] = {
    "put": lambda s: s.put(b"next", b"next", sync=True),
    "checkpoint": lambda s: s.log.write_checkpoint(),
    "gc": lambda s: s.gc(),
}


@pytest.mark.parametrize("own_head", [True, False], ids=["own-head", "head-applied-by-refresh"])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_cache_whose_head_was_collected_under_the_commit_naming_it_goes_on(
        tmp_path: Path, step: str, own_head: bool) -> None:
    """Commit GC took the head commit this cache applied, but the commit after it (which names
    it as its ``prev``) is still there: a commit, a checkpoint and a gc succeed, lose nothing,
    and the cache reopens as it is."""
    a, keys = _behind_under_successor(tmp_path, own_head)
    try:
        STEPS[step](a)
        STEPS[step](a)
        a.put(b"last", b"last", sync=True)
        _holds(a, [*keys, b"last"])
    finally:
        a.close()
    _reopen_and_check(tmp_path / "root", tmp_path / "a", [*keys, b"last"])
    _reopen_and_check(tmp_path / "root", tmp_path / "fresh", [*keys, b"last"])


def _far_behind(tmp_path: Path, own_head: bool, storage: LocalStorage | None = None
                ) -> tuple[kvlog.Store, list[bytes], int]:
    """Handle A at version v; another handle commits up to v+3, checkpoints there and collects:
    commits v and v+1 are gone, so A cannot reach the checkpoint by replaying commits."""
    root = tmp_path / "root"
    a = kvlog.open(storage or root, cache_dir=tmp_path / "a", **SETTINGS)
    keys = _commit_up_to(a, a.log.version + 1, "a")
    with kvlog.open(root, cache_dir=tmp_path / "b", **SETTINGS) as b:
        if not own_head:
            keys += _commit_up_to(b, b.log.version + 1, "b-head")
            a.log.refresh()
        head = a.log.version
        keys += _commit_up_to(b, head + 3, "b")
        assert _checkpoint_and_collect(b)["commits"] > 0
    assert not (root / commit_name(head + 1)).exists() and (root / commit_name(head + 2)).exists()
    return a, keys, head


def _told_to_reopen(e: StorageBehindError) -> None:
    message = str(e)
    assert "restored" not in message, message
    assert "fell behind the commit retention window" in message, message
    assert "reopen the store" in message and "commit_retention_ms" in message, message


@pytest.mark.parametrize("own_head", [True, False], ids=["own-head", "head-applied-by-refresh"])
def test_a_cache_behind_the_retention_window_is_told_to_reopen_and_the_reopen_loses_nothing(
        tmp_path: Path, own_head: bool) -> None:
    """The commits after this cache's head were collected too: a write is refused with nothing
    written (a commit it put in a version GC freed is taken back), the error says to reopen or
    to keep commits longer and never that the root was restored, reads stay right, and the
    reopen catches up from the checkpoint with every acknowledged write."""
    a, keys, head = _far_behind(tmp_path, own_head)
    root = tmp_path / "root"
    freed = commit_name(head + 1)
    try:
        for step in ("put", "gc", "checkpoint"):
            with pytest.raises(StorageBehindError) as caught:
                STEPS[step](a)
            _told_to_reopen(caught.value)
            assert not (root / freed).exists()  # nothing was written in the freed version
        _holds(a, keys[:1])
    finally:
        a.close(flush=False)
    _reopen_and_check(root, tmp_path / "a", keys)
    with kvlog.open(root, cache_dir=tmp_path / "a", **SETTINGS) as again:
        assert again.get(b"next") is None  # refused, never acknowledged


class HookAfterCommit(LocalStorage):
    """Runs ``hook`` once, just after the next commit landed (before its writer checks it)."""

    hook: Callable[[], None] | None = None

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        super().put_if_absent(name, data)
        if self.hook is not None and is_commit(name):
            hook, self.hook = self.hook, None
            hook()


@pytest.mark.parametrize("taken_back", [True, False], ids=["taken-back", "left-by-a-crash"])
def test_a_cache_that_applied_a_commit_written_in_a_freed_version_is_told_to_reopen_and_reopens(
        tmp_path: Path, taken_back: bool) -> None:
    """Handles A and C sit at the same version behind the retention window. A writes its commit
    in a version GC freed; C applies it before A takes it back (or A dies before it can). C
    never applies the history's commit after it as if that followed a gap: it is told to
    reopen (never that the root was restored), and its reopen rebuilds from the checkpoint
    with every acknowledged write and without A's commit."""
    root = tmp_path / "root"
    root.mkdir()
    hooked = HookAfterCommit(root, fsync=False)
    a = kvlog.open(hooked, cache_dir=tmp_path / "a", **SETTINGS)
    c = kvlog.open(root, cache_dir=tmp_path / "c", **SETTINGS)
    # Two commits of A's own, so that A's head is a commit it checked after landing it (it then
    # skips reading its head before its next commit).
    a.put(b"a0", b"a0", sync=True)
    a.put(b"a1", b"a1", sync=True)
    keys = [b"a0", b"a1"]
    head = a.log.version
    assert c.log.refresh() == head
    with kvlog.open(root, cache_dir=tmp_path / "b", **SETTINGS) as b:
        keys += _commit_up_to(b, head + 3, "b")
        assert _checkpoint_and_collect(b)["commits"] > 0
    stray = root / commit_name(head + 1)
    assert not stray.exists()
    left: list[bytes] = []
    refused: list[StorageBehindError] = []

    def c_applies_it() -> None:
        left.append(stray.read_bytes())
        try:
            c.log.refresh()  # applies A's commit, then meets the history's next commit
        except StorageBehindError as e:
            refused.append(e)

    hooked.hook = c_applies_it
    try:
        with pytest.raises(StorageBehindError) as caught:
            a.put(b"stray", b"stray", sync=True)
        _told_to_reopen(caught.value)
        assert left and not stray.exists()  # C read it; A took it back
        assert len(refused) == 1 and c.log.version == head + 1
        _told_to_reopen(refused[0])
        if not taken_back:
            stray.write_bytes(left[0])  # A died before taking it back
        with pytest.raises(StorageBehindError) as caught:
            c.put(b"next", b"next", sync=True)
        _told_to_reopen(caught.value)
        with pytest.raises(StorageBehindError):
            c.get(b"stray")  # C's cache holds A's commit: it never answers from it
    finally:
        a.close(flush=False)
        c.close(flush=False)
    for cache in ("c", "a", "fresh"):
        _reopen_and_check(root, tmp_path / cache, keys)
        with kvlog.open(root, cache_dir=tmp_path / cache, **SETTINGS) as again:
            assert again.get(b"stray") is None and again.get(b"next") is None


def _soak(tmp_path: Path, seconds: float) -> list[dict[str, Any]]:
    """Two processes write, checkpoint and collect with retention 0 for ``seconds``; each
    one's report (:mod:`retention_proc`)."""
    root = tmp_path / "root"
    kvlog.open(root, cache_dir=tmp_path / "setup", **SETTINGS).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(HERE / "retention_proc.py"), str(root),
                               str(tmp_path / f"cache-{name}"), name, str(seconds)],
                              stdout=subprocess.PIPE, env=env, text=True) for name in ("a", "b")]
    reports: list[dict[str, Any]] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120 + seconds)
        assert proc.returncode == 0
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def test_two_processes_writing_checkpointing_and_collecting_with_retention_zero_lose_nothing(
        tmp_path: Path) -> None:
    """Two real processes (each its own cache) write, checkpoint and run ``gc()`` with
    ``commit_retention_ms=0`` as fast as they can: no error ever says the root was restored,
    every reopen works, and every acknowledged write is there after reopening each cache and
    from a fresh one."""
    reports = _soak(tmp_path, 3.0)
    for report in reports:
        assert report["failed_reopens"] == []
        for error in report["errors"]:
            assert "restored" not in error and "commit_retention_ms" in error, error
        assert report["acked"]
    acked = [key.encode() for report in reports for key in report["acked"]]
    for cache in ("cache-a", "cache-b", "fresh"):
        with kvlog.open(tmp_path / "root", cache_dir=tmp_path / cache, **SETTINGS) as again:
            missing = [k for k in acked if again.get(k) != k]
            assert missing == []
            assert again.check() == []
