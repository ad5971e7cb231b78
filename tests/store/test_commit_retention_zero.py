"""Commit GC with ``commit_retention_ms=0`` while other processes write: history, not a restore.

With retention 0, ``gc()`` collects every commit below the newest checkpoint but the one
right below it. A process (its own ``cache_dir``: its own LMDB cache, as a second process has)
whose head commit was collected while the commit after it remains writes on: that commit
names its head, so its history was collected, not restored. One that fell further behind (the
commits after its head were collected too) catches up from the checkpoint in place, and what it
was doing goes on from there. The interleavings are driven step by step; the last test lets two
real processes race.
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

# Data files of their own: commit GC collects a commit only once no live file is inside it,
# and these tests need it to collect the commits they write.
SETTINGS: dict[str, Any] = {**QUIET, "commit_retention_ms": 0, "checkpoint_interval": 1000,
                            "commit_inline_bytes": 0}
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


def _records_of(store: kvlog.Store, key: bytes) -> int:
    """How many records of ``key`` the log holds."""
    return sum(1 for p in range(store.log.partitions) for r in store.log.read(p) if r.key == key)


@pytest.mark.parametrize("own_head", [True, False], ids=["own-head", "head-applied-by-refresh"])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_cache_behind_the_retention_window_catches_up_in_place_and_loses_nothing(
        tmp_path: Path, step: str, own_head: bool) -> None:
    """The commits after this cache's head were collected too: the cache catches up from the
    checkpoint in place (nothing is written in the version GC freed), the step it was taking
    succeeds, every acknowledged write of either handle reads back, and the cache reopens as
    it is."""
    a, keys, head = _far_behind(tmp_path, own_head)
    root = tmp_path / "root"
    freed = commit_name(head + 1)
    try:
        STEPS[step](a)
        assert a.log.version >= head + 3  # caught up (and went on)
        assert not (root / freed).exists()  # nothing was written in the freed version
        a.put(b"last", b"last", sync=True)
        _holds(a, [*keys, b"last"])
        assert a.check() == []
        assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith("catch-up.")]
    finally:
        a.close()
    _reopen_and_check(root, tmp_path / "a", [*keys, b"last"])
    _reopen_and_check(root, tmp_path / "fresh", [*keys, b"last"])


class HookAfterCommit(LocalStorage):
    """Runs ``hook`` once, just after the next commit landed (before its writer checks it)."""

    hook: Callable[[], None] | None = None

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        super().put_if_absent(name, data)
        if self.hook is not None and is_commit(name):
            hook, self.hook = self.hook, None
            hook()


@pytest.mark.parametrize("taken_back", [True, False], ids=["taken-back", "left-by-a-crash"])
def test_a_cache_that_applied_a_commit_written_in_a_freed_version_catches_up_and_it_is_written_again(
        tmp_path: Path, taken_back: bool) -> None:
    """Handles A and C sit at the same version behind the retention window. A writes its commit
    in a version GC freed; C applies it before A takes it back (or A dies before it can). C
    never applies the history's commit after it as if that followed a gap: it catches up from
    the checkpoint past both. A takes its commit back, catches up and writes it again at the
    head, once; every cache, reopened or fresh, holds every acknowledged write."""
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
        a.put(b"stray", b"stray", sync=True)
        assert left and not stray.exists()  # C read it; A took it back
        assert refused == [] and c.log.version >= head + 3  # C caught up past it
        assert a.log.version > head + 3
        if not taken_back:
            stray.write_bytes(left[0])  # A died before taking it back
        c.put(b"next", b"next", sync=True)
        assert c.get(b"stray") == b"stray" and a.get(b"stray") == b"stray"
    finally:
        a.close()
        c.close()
    keys += [b"stray", b"next"]
    for cache in ("c", "a", "fresh"):
        _reopen_and_check(root, tmp_path / cache, keys)
        with kvlog.open(root, cache_dir=tmp_path / cache, **SETTINGS) as again:
            assert _records_of(again, b"stray") == 1  # written again once, at the head


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


def test_a_handle_opened_on_an_empty_store_writes_into_the_history_after_commit_gc(tmp_path: Path) -> None:
    """A handle opens a store with no commit yet; another writes, checkpoints and collects
    commit 1 (retention 0). The first handle's first commit, put at version 1 (free again),
    follows nothing it can read: it is found outside the history (a checkpoint exists and no
    commit names it), taken back, and written again at the head, so a fresh reader sees it."""
    root = tmp_path / "root"
    a = kvlog.open(root, cache_dir=tmp_path / "a", **SETTINGS)
    try:
        assert a.log.version == 0
        with kvlog.open(root, cache_dir=tmp_path / "b", **SETTINGS) as b:
            keys = _commit_up_to(b, 3, "b")
            assert _checkpoint_and_collect(b)["commits"] > 0
        assert not (root / commit_name(1)).exists()
        a.put(b"first", b"first", sync=True)
        assert a.log.version > 3
        _holds(a, [*keys])
    finally:
        a.close()
    _reopen_and_check(root, tmp_path / "fresh", [*keys, b"first"])
    _reopen_and_check(root, tmp_path / "a", [*keys, b"first"])
