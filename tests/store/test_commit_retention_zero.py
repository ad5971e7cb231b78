"""Commit GC with ``commit_retention_ms=0`` while other processes write: history, not a restore.

With retention 0, ``gc()`` collects every commit below the newest checkpoint, in any order
(the checkpoint's own commit and the head stay). A process (its own ``cache_dir``: its own
LMDB cache, as a second process has) whose newest applied commit was collected while the
commit after it remains replays on: that commit names the one the cache applied. One that fell
further behind (the next commit it needs was collected too) catches up from the checkpoint in
place, and what it was doing goes on from there. A writer behind swaps the head from a version
the head no longer is: the swap is refused, nothing is written in a version GC freed, and the
commit lands at the head once the writer caught up. The interleavings are driven step by step;
the last test lets two real processes race.
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
from root_surgery import QUIET

import kvlog
from kvlog.log.head import HEAD_NAME
from kvlog.log.naming import commit_name
from kvlog.storage import LocalStorage, SwapConflict
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


def _commits_left(root: Path, upto: int) -> list[int]:
    """The versions up to ``upto`` whose commits ``root`` holds."""
    return [v for v in range(1, upto + 1) if (root / commit_name(v)).exists()]


def _behind_under_successor(tmp_path: Path, own_head: bool) -> tuple[kvlog.Store, list[bytes]]:
    """Handle A at version v (its own commit, or another's it applied by refreshing); then
    another handle commits v+1, checkpoints there, commits v+2 and collects: A's newest commit
    is gone, commit v+1 (which names it) stays."""
    root = tmp_path / "root"
    a = kvlog.open(root, cache_dir=tmp_path / "a", **SETTINGS)
    keys = _commit_up_to(a, a.log.version + 1, "a")
    with kvlog.open(root, cache_dir=tmp_path / "b", **SETTINGS) as b:
        if not own_head:
            keys += _commit_up_to(b, b.log.version + 1, "b-head")
            a.log.refresh()
        head = a.log.version
        keys += _commit_up_to(b, head + 1, "b")
        time.sleep(0.01)  # the commits below are older than the checkpoint in storage time
        b.log.write_checkpoint()
        keys += _commit_up_to(b, head + 2, "b-after")
        assert b.gc()["commits"] > 0
    assert _commits_left(root, head + 2) == [head + 1, head + 2]
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
    """Commit GC took the newest commit this cache applied, but the commit after it (which
    names it as its ``prev``) is still there: a commit, a checkpoint and a gc succeed, lose
    nothing, and the cache reopens as it is."""
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


def _far_behind(tmp_path: Path, own_head: bool) -> tuple[kvlog.Store, list[bytes], int]:
    """Handle A at version v; another handle commits up to v+3, checkpoints there and collects:
    commits v to v+2 are gone, so A cannot reach the checkpoint by replaying commits."""
    root = tmp_path / "root"
    a = kvlog.open(root, cache_dir=tmp_path / "a", **SETTINGS)
    keys = _commit_up_to(a, a.log.version + 1, "a")
    with kvlog.open(root, cache_dir=tmp_path / "b", **SETTINGS) as b:
        if not own_head:
            keys += _commit_up_to(b, b.log.version + 1, "b-head")
            a.log.refresh()
        head = a.log.version
        keys += _commit_up_to(b, head + 3, "b")
        assert _checkpoint_and_collect(b)["commits"] > 0
    assert _commits_left(root, head + 3) == [head + 3]
    return a, keys, head


def _records_of(store: kvlog.Store, key: bytes) -> int:
    """How many records of ``key`` the log holds."""
    return sum(1 for p in range(store.log.partitions) for r in store.log.read(p) if r.key == key)


@pytest.mark.parametrize("own_head", [True, False], ids=["own-head", "head-applied-by-refresh"])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_cache_behind_the_retention_window_catches_up_in_place_and_loses_nothing(
        tmp_path: Path, step: str, own_head: bool) -> None:
    """The commits after this cache's newest one were collected too: the step it takes
    succeeds, nothing is written in a version GC freed, the cache catches up from the
    checkpoint in place (at the latest by its next commit, which lands at the head), every
    acknowledged write of either handle reads back, and the cache reopens as it is."""
    a, keys, head = _far_behind(tmp_path, own_head)
    root = tmp_path / "root"
    try:
        STEPS[step](a)
        assert _commits_left(root, head + 3) == [head + 3]  # nothing written in a freed version
        a.put(b"last", b"last", sync=True)
        assert _commits_left(root, head + 3) == [head + 3]
        assert a.log.version > head + 3  # caught up, then committed at the head
        _holds(a, [*keys, b"last"])
        assert a.check() == []
        assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith("catch-up.")]
    finally:
        a.close()
    _reopen_and_check(root, tmp_path / "a", [*keys, b"last"])
    _reopen_and_check(root, tmp_path / "fresh", [*keys, b"last"])


class Crash(BaseException):
    """The writer's process dies."""


class HookAfterSwap(LocalStorage):
    """Runs ``hook`` once, just after the next swap of the head was tried (refused or not),
    before its writer learns the answer; records every swap's outcome in ``swaps``."""

    hook: Callable[[], None] | None = None

    def __init__(self, root: Path, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.swaps: list[str] = []

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        try:
            token = super().swap(name, data, expected, copy_to)
        except SwapConflict:
            self.swaps.append("refused")
            self._run_hook(name)
            raise
        self.swaps.append("landed")
        self._run_hook(name)
        return token

    def _run_hook(self, name: str) -> None:
        if self.hook is not None and name == HEAD_NAME:
            hook, self.hook = self.hook, None
            hook()


@pytest.mark.parametrize("dies", [False, True], ids=["retried", "died-after-the-refusal"])
def test_a_writer_behind_the_retention_window_is_refused_and_its_commit_lands_at_the_head(
        tmp_path: Path, dies: bool) -> None:
    """Handles A and C sit at the same version behind the retention window; A's last swap of
    the head was its own, so its next one is conditional on that head without reading it. A's
    next commit is refused (the head moved on), and nothing is written in the version GC freed:
    C, catching up meanwhile, never applies anything outside the history. A catches up and
    writes its commit again at the head, once; or, dying right after the refusal, leaves
    nothing any reader applies. Every cache, reopened or fresh, holds every acknowledged write."""
    root = tmp_path / "root"
    root.mkdir()
    hooked = HookAfterSwap(root, fsync=False)
    a = kvlog.open(hooked, cache_dir=tmp_path / "a", **SETTINGS)
    c = kvlog.open(root, cache_dir=tmp_path / "c", **SETTINGS)
    try:
        a.put(b"a0", b"a0", sync=True)
        a.put(b"a1", b"a1", sync=True)
        keys = [b"a0", b"a1"]
        head = a.log.version
        assert c.log.refresh() == head
        with kvlog.open(root, cache_dir=tmp_path / "b", **SETTINGS) as b:
            keys += _commit_up_to(b, head + 3, "b")
            assert _checkpoint_and_collect(b)["commits"] > 0
        assert _commits_left(root, head + 3) == [head + 3]
        seen: list[list[int]] = []

        def c_catches_up() -> None:
            seen.append(_commits_left(root, head + 3))
            assert c.log.refresh() == head + 3  # in place, past the freed versions
            if dies:
                raise Crash

        hooked.swaps.clear()
        hooked.hook = c_catches_up
        if dies:
            with pytest.raises(Crash):
                a.put(b"stray", b"stray", sync=True)
            a.close(flush=False)  # the process is gone: its unacknowledged write with it
            assert hooked.swaps == ["refused"]
        else:
            a.put(b"stray", b"stray", sync=True)
            assert hooked.swaps == ["refused", "landed"]
            assert a.log.version == head + 4
            keys.append(b"stray")
        assert seen == [[head + 3]]  # the refused swap left nothing in the freed version
        assert _commits_left(root, head + 3) == [head + 3]
        c.put(b"next", b"next", sync=True)
        keys.append(b"next")
        assert c.get(b"stray") == (None if dies else b"stray")
        if not dies:
            assert a.get(b"next") == b"next"
    finally:
        a.close()
        c.close()
    for cache in ("c", "a", "fresh"):
        _reopen_and_check(root, tmp_path / cache, keys)
        with kvlog.open(root, cache_dir=tmp_path / cache, **SETTINGS) as again:
            assert _records_of(again, b"stray") == (0 if dies else 1)  # written once, at the head


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
    ``commit_retention_ms=0`` as fast as they can: no step ever fails (a process behind the
    other's GC catches up in place), and every acknowledged write is there after reopening
    each cache and from a fresh one."""
    reports = _soak(tmp_path, 3.0)
    for report in reports:
        assert report["errors"] == [] and report["failed_reopens"] == []
        assert report["acked"]
    acked = [key.encode() for report in reports for key in report["acked"]]
    for cache in ("cache-a", "cache-b", "fresh"):
        with kvlog.open(tmp_path / "root", cache_dir=tmp_path / cache, **SETTINGS) as again:
            missing = [k for k in acked if again.get(k) != k]
            assert missing == []
            assert again.check() == []


def test_a_handle_opened_on_an_empty_store_writes_into_the_history_after_commit_gc(tmp_path: Path) -> None:
    """A handle opens a store with no commit yet; another writes, checkpoints and collects
    commit 1 (retention 0). The first handle's first commit, conditional on the store having
    no head, is refused: nothing is written at version 1 (free again); the handle catches up
    from the checkpoint and writes it at the head, so a fresh reader sees it."""
    root = tmp_path / "root"
    a = kvlog.open(root, cache_dir=tmp_path / "a", **SETTINGS)
    try:
        assert a.log.version == 0
        with kvlog.open(root, cache_dir=tmp_path / "b", **SETTINGS) as b:
            keys = _commit_up_to(b, 3, "b")
            assert _checkpoint_and_collect(b)["commits"] > 0
        assert _commits_left(root, 3) == [3]
        a.put(b"first", b"first", sync=True)
        assert _commits_left(root, 3) == [3]
        assert a.log.version == 4
        _holds(a, [*keys, b"first"])
    finally:
        a.close()
    _reopen_and_check(root, tmp_path / "fresh", [*keys, b"first"])
    _reopen_and_check(root, tmp_path / "a", [*keys, b"first"])
