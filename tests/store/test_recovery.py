"""Crash recovery: a writer process killed with SIGKILL in the middle of a write stream.

Guarantee 1 (docs/guarantees.rst): every acknowledged write survives. The writer prints
each key once its write is acknowledged (after a batch exits, a sync put
returns or flush() returns); after the kill every printed key must be readable
with its value, no batch of 10 keys may be half visible (acknowledged or not),
and ``check()`` must be clean, both through the killed writer's own metadata
cache (an LMDB environment it was writing when it died) and through a fresh
cache rebuilt from storage. Each round starts the writer again on the same
store, so later rounds also recover from a store that already survived kills.
"""

from __future__ import annotations

import os
import random
import re
import select
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from store_support import Root, child_env, python_script
from writer_proc import BATCH_SIZE, value_for

from kvlog.log.checkpoints import newest_checkpoint
from kvlog.log.naming import LOG_PREFIX, parse_log_name
from kvlog.meta import MetaReader
from kvlog.storage import LocalStorage

#: The writer flushes in the background too (the default interval, small buffers).
WRITER_SETTINGS = {"flush_interval_ms": 20, "flush_bytes": 64 * 1024, "partitions": 4,
                   "background_compaction": False}

_BATCH_KEY = re.compile(r"^r(\d+)-b(\d+)-(\d+)$")


#: A checkpoint every other commit and compaction in the background: kills land in the middle of
#: checkpoints, and the files and batches checkpoints hold change between them.
CHECKPOINTING = dict(WRITER_SETTINGS, checkpoint_interval=2, background_compaction=True,
                     compaction_interval_ms=100)


def _run_and_kill(root: Root, run: int, kill_after: int, rng: random.Random, log_path: str,
                  threads: int = 0, settings: dict[str, Any] | None = None) -> list[str]:
    """Start a writer (``threads`` threads of durable puts if given), let it acknowledge
    ``kill_after`` keys, SIGKILL it, return every acknowledged key."""
    spec = root.spec(run=run, seed=rng.randrange(2**32), settings=settings or WRITER_SETTINGS,
                     threads=threads)
    with open(log_path, "wb") as errors:
        proc = subprocess.Popen(python_script("writer_proc.py"), env=child_env(spec),
                                stdout=subprocess.PIPE, stderr=errors)
    assert proc.stdout is not None
    acked: list[str] = []
    buffer = b""
    deadline = time.monotonic() + 60
    ready = False
    try:
        while len(acked) < kill_after:
            assert time.monotonic() < deadline, f"the writer is too slow: {len(acked)} acknowledged"
            readable, _, _ = select.select([proc.stdout], [], [], 1.0)
            if not readable:
                assert proc.poll() is None, f"the writer died early:\n{open(log_path).read()[-3000:]}"
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"the writer closed its output:\n{open(log_path).read()[-3000:]}"
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line == b"ready":
                    ready = True
                else:
                    acked.append(line.decode())
        time.sleep(rng.random() * 0.05)  # land the kill anywhere in a write, a flush or a commit
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # Lines written before the kill are acknowledged too; a line cut short is not a whole key.
    buffer += proc.stdout.read()
    proc.stdout.close()
    *lines, _partial = buffer.split(b"\n")
    acked.extend(line.decode() for line in lines if line != b"ready")
    assert ready
    assert proc.returncode == -signal.SIGKILL, "the writer must still be writing when it is killed"
    return acked


def _verify(root: Root, acked: set[str], cache: str | None, read_only: bool) -> dict[bytes, bytes]:
    store = root.open(cache=cache, read_only=read_only)
    try:
        assert store.check() == []
        contents = dict(store.scan())
        assert len(store) == len(contents)
        missing = sorted(k for k in acked if contents.get(k.encode()) != value_for(k))
        assert not missing, f"{len(missing)} acknowledged writes lost or wrong, e.g. {missing[:5]}"
        batches: dict[tuple[str, str], set[str]] = defaultdict(set)
        for key, value in contents.items():
            text = key.decode()
            assert value == value_for(text), f"{text} holds a value it was never given"
            match = _BATCH_KEY.match(text)
            if match:
                batches[(match[1], match[2])].add(match[3])
        half = {b: sorted(members) for b, members in batches.items() if len(members) != BATCH_SIZE}
        assert not half, f"half-visible batches: {half}"
        for key in list(acked)[:50]:
            assert store.get(key) == value_for(key)
        return contents
    finally:
        store.close()


def _recovery_rounds(root: Root, tmp_path: os.PathLike[str], rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    acked: set[str] = set()
    for run in range(rounds):
        kill_after = rng.randint(30, 150)
        got = _run_and_kill(root, run, kill_after, rng, os.path.join(tmp_path, f"writer-{run}.log"))
        assert len(got) >= kill_after
        acked.update(got)
        # The killed writer's own cache first (catch-up after an interrupted LMDB write) ...
        own = _verify(root, acked, cache=None, read_only=False)
        # ... then a brand-new cache, rebuilt from the storage root alone.
        fresh = _verify(root, acked, cache=f"fresh-{run}", read_only=True)
        assert own == fresh


def test_sigkill_loses_no_acknowledged_write_local(local_root: Root, tmp_path: os.PathLike[str]) -> None:
    _recovery_rounds(local_root, tmp_path, rounds=3, seed=1)


@pytest.mark.s3
def test_sigkill_loses_no_acknowledged_write_s3(s3_store_root: Root, tmp_path: os.PathLike[str]) -> None:
    _recovery_rounds(s3_store_root, tmp_path, rounds=2, seed=2)


def test_sigkill_of_sixteen_durable_writers_loses_no_acknowledged_put(
    local_root: Root, tmp_path: os.PathLike[str],
) -> None:
    """16 threads of ``put(sync=True)`` share group commits; the process is killed while they
    write: every put that returned is there, through the killed writer's cache and a fresh one."""
    rng = random.Random(3)
    acked: set[str] = set()
    for run in range(2):
        kill_after = rng.randint(200, 400)
        got = _run_and_kill(local_root, run, kill_after, rng, os.path.join(tmp_path, f"writer-{run}.log"),
                            threads=16)
        assert len(got) >= kill_after
        assert len({key.split("-")[1] for key in got}) == 16  # every thread was acknowledged
        acked.update(got)
        own = _verify(local_root, acked, cache=None, read_only=False)
        fresh = _verify(local_root, acked, cache=f"fresh-{run}", read_only=True)
        assert own == fresh


def test_reopening_never_merges_pending_index_runs(tmp_path: Path) -> None:
    """Opening applies what other writers committed meanwhile but leaves the key index's runs
    pending (reads search them): reopening after a crash never waits for a merge, however
    many runs the crashed writer and the others left."""
    import kvlog

    settings = {"background_compaction": False, "flush_interval_ms": 0, "partitions": 2,
                "index_run_limit": 8}
    root = tmp_path / "root"
    crashed = kvlog.open(root, cache_dir=tmp_path / "cache", **settings)
    for i in range(8):
        crashed.put(f"a{i}".encode(), b"x", sync=True)
    assert crashed.stats()["index_runs"] == 8
    crashed.close(flush=False)  # as a crash leaves it: nothing merged
    with kvlog.open(root, cache_dir=tmp_path / "other", **settings) as other:
        for i in range(3):
            other.put(f"b{i}".encode(), b"y", sync=True)
    with kvlog.open(root, cache_dir=tmp_path / "cache", **settings) as reopened:
        assert reopened.stats()["index_runs"] > 8  # applied, not merged
        assert all(reopened.get(f"a{i}".encode()) == b"x" for i in range(8))
        assert all(reopened.get(f"b{i}".encode()) == b"y" for i in range(3))
        reopened.put(b"c", b"z", sync=True)  # the writer's own next commit merges them
        assert reopened.stats()["index_runs"] == 0
        assert reopened.check() == []


def _catalog(r: MetaReader) -> dict[str, Any]:
    """The live files and batches, partition ends and producers a cache holds."""
    return {"version": r.version(), "files": dict(r.iter_files()),
            "batches": {p: list(r.iter_batches(p)) for p, _end in r.iter_partitions()},
            "ends": dict(r.iter_partitions()), "producers": sorted(p.producer_id for p in r.iter_producers())}


def test_sigkill_in_the_middle_of_checkpoints_then_a_fresh_cache_from_the_newest(
    local_root: Root, tmp_path: os.PathLike[str],
) -> None:
    """A writer checkpointing every other commit, compacting meanwhile, is killed (often in the
    middle of a checkpoint): a fresh cache starts from the newest checkpoint it wrote and holds
    what the killed writer's own cache holds, every acknowledged write included."""
    rng = random.Random(5)
    acked: set[str] = set()
    loaded = []
    for run in range(3):
        kill_after = rng.randint(60, 200)
        got = _run_and_kill(local_root, run, kill_after, rng, os.path.join(tmp_path, f"writer-{run}.log"),
                            settings=CHECKPOINTING)
        assert len(got) >= kill_after
        acked.update(got)
        storage = LocalStorage(local_root.uri)
        parsed = [parse_log_name(info.name) for info in storage.list(LOG_PREFIX)]
        written = max(p[0] for p in parsed if p is not None and p[1] == "commit")
        loaded.append(newest_checkpoint(storage))
        assert loaded[-1] >= written - 3  # one of the last commits' checkpoints
        own = _verify(local_root, acked, cache=None, read_only=False)
        with local_root.open() as store:
            own_catalog = store.log.snapshot(_catalog)
        fresh = _verify(local_root, acked, cache=f"fresh-{run}", read_only=True)
        assert own == fresh
        with local_root.open(cache=f"fresh-{run}", read_only=True) as store:
            assert store.log.snapshot(_catalog) == own_catalog
    assert loaded == sorted(set(loaded))
