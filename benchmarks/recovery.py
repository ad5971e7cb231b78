"""Reopening after ``kill -9``: the writer processes, the kills and the timed reopens.

A store's writer may die at any moment, and the next process must answer its first read in
about the same time whatever the writer was doing. This module measures it. For each *state*
a writer subprocess (:mod:`benchmarks.recovery_child`) loads N records into a new local store
(16-byte keys, 100-byte values, ``background_compaction=False``), one commit per
:func:`commit_records_for` records, reports each commit's pending key-index runs on stdout,
and the parent sends it SIGKILL at a chosen point:

``closed``
    after a clean ``close()`` (which merges the pending runs);
``settled``
    after ``log.settle_index()``: no runs pending;
``pending_runs``
    right after the commit that leaves ``index_run_limit`` runs pending (the most a store
    holds at rest: one more commit merges them);
``cache_lost``
    as ``pending_runs``, then the cache is left as a machine crash leaves it (its marker names
    another boot), so the opener deletes it and loads the newest checkpoint from storage: the
    key index is rebuilt from the live data before the first get;
``mid_flush``
    in the middle of the flush after that one, whose commit would leave one run more than the
    limit and so merges them all; the kill comes after half, one and two typical flush times
    in turn (repeat by repeat), so it lands in writing the data file, around the commit, or
    in the merge.

Then a fresh process times ``kvlog.open(path)`` and the first ``get`` of a record acknowledged
before the kill (drawn at random, seeded) and checks its value. Right after each kvlog sample,
the same reopen is timed for py-lmdb (a writer killed inside a write transaction on an
environment holding the same N records; reopen = ``lmdb.open`` + the first get) and, when it
is installed, rocksdict (a writer killed after unsynced puts, so the reopen replays its WAL).
The anchors' databases are loaded once per run; each anchor sample kills a new writer on it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from benchmarks.children import child_env
from benchmarks.data import KEY_BYTES, VALUE_BYTES, make_keys, make_values
from benchmarks.sizing import records_per_flush
from kvlog import StoreConfig

__all__ = ["STATES", "ANCHORS", "COMMITS_BEYOND_LIMIT", "Plan", "min_commits", "commit_records_for",
           "rocksdict_missing", "measure_recovery"]

#: The kill points, in the order they are measured within each repeat.
STATES = ("closed", "settled", "pending_runs", "cache_lost", "mid_flush")
#: The marker file of a cache written by processes of one boot (``kvlog.meta.env``): another
#: boot's id in it makes the next opener delete the cache, as after a machine crash.
CACHE_MARKER = Path("cache") / "kvlog-unsynced"
#: The anchors, in the order they are measured after each kvlog sample.
ANCHORS = ("lmdb", "rocksdict")
#: A load makes at least ``index_run_limit`` + this many commits (40 by default), so that at
#: any N the runs are merged once and ``index_run_limit`` runs are pending at the end.
COMMITS_BEYOND_LIMIT = 8
#: Kill points within the mid-flush state's last flush, in typical flush times, repeat by repeat.
MID_FLUSH_KILL_FRACTIONS = (0.5, 1.0, 2.0)
#: A child still running after this long is killed and its sample fails.
CHILD_TIMEOUT_S = 3600.0

_CHILD_SOURCE = Path(__file__).with_name("recovery_child.py")


@dataclass(frozen=True)
class Plan:
    """What every writer of one run loads, and how the stores are opened."""

    keys: int
    """Records loaded (and acknowledged) before the kill."""
    commit_records: int
    """Records per commit (one ``flush()`` each)."""
    seed: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    """StoreConfig settings of the kvlog stores (the writer adds its own, see the child)."""

    @property
    def commits(self) -> int:
        return -(-self.keys // self.commit_records)

    @property
    def lmdb_map_size(self) -> int:
        """Generous: 1 KiB per record (and a commit's worth more) plus 64 MiB; sparse on disk."""
        return (self.keys + self.commit_records) * 1024 + 64 * 1024 * 1024

    def record(self, index: int) -> tuple[bytes, bytes]:
        """The key and value loaded record ``index`` was written with (values are generated
        one commit's records at a time, so its commit's are generated again)."""
        if not 0 <= index < self.keys:
            raise IndexError(f"record {index} is not one of the {self.keys} loaded")
        start = index - index % self.commit_records
        count = min(self.commit_records, self.keys - start)
        return make_keys(index, 1, self.seed)[0], make_values(start, count, self.seed)[index - start]


def min_commits(settings: dict[str, Any] | None = None) -> int:
    """The fewest commits of a load: ``index_run_limit`` + :data:`COMMITS_BEYOND_LIMIT`."""
    return StoreConfig.from_settings(None, **(settings or {})).index_run_limit + COMMITS_BEYOND_LIMIT


def commit_records_for(keys: int, settings: dict[str, Any] | None = None) -> int:
    """Records per commit: as many as one flush of the store holds (``flush_bytes`` at the
    flusher's count of key + value + overhead bytes: 38,479 for the default 16 MiB), or fewer
    for small N so that the load makes at least :func:`min_commits` commits."""
    config = StoreConfig.from_settings(None, **(settings or {}))
    per_flush = records_per_flush(config.flush_bytes, KEY_BYTES, VALUE_BYTES)
    return max(1, min(per_flush, -(-keys // min_commits(settings))))


def rocksdict_missing() -> str | None:
    """Why the rocksdict anchor cannot run (not installed), or None."""
    if importlib.util.find_spec("rocksdict") is None:
        return "rocksdict is not installed (pip install rocksdict)"
    return None


# -- child processes -----------------------------------------------------------------------------

class Child:
    """A child process of :mod:`benchmarks.recovery_child` and its JSON lines."""

    _started = 0
    """Children started by this process: numbers their stderr files."""

    def __init__(self, role: str, log_dir: Path, **options: Any) -> None:
        command = [sys.executable, "-c", _CHILD_SOURCE.read_text(encoding="utf-8"), role]
        for name, value in options.items():
            if value is not None:
                command += [f"--{name.replace('_', '-')}", str(value)]
        self.role = role
        Child._started += 1
        self._stderr_path = log_dir / f"{Child._started:04d}-{role}.stderr"
        self._stderr: IO[bytes] = open(self._stderr_path, "wb")  # noqa: SIM115 - closed in _reap
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, env=child_env())
        self._watchdog = threading.Timer(CHILD_TIMEOUT_S, self.proc.kill)
        self._watchdog.daemon = True
        self._watchdog.start()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        """A child still running when its sample ends (a failure in the parent) is killed."""
        if self.proc.poll() is None:
            self.proc.kill()
        self._reap()
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()

    def read_until(self, event: str, seen: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Lines up to the first with ``event`` (returned; earlier ones appended to ``seen``)."""
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self._reap()
                raise RuntimeError(f"the {self.role} child ended (exit status {self.proc.returncode}) "
                                   f"before {event!r}:\n{self._stderr_tail()}")
            message: dict[str, Any] = json.loads(line)
            if message.get("event") == event:
                return message
            if seen is not None:
                seen.append(message)

    def kill(self) -> list[dict[str, Any]]:
        """SIGKILL the child, wait for it, and return the lines it printed and were not read."""
        self.proc.send_signal(signal.SIGKILL)
        self._reap()
        assert self.proc.stdout is not None
        rest = [json.loads(line) for line in self.proc.stdout.read().splitlines() if line.strip()]
        self.proc.stdout.close()
        if self.proc.returncode != -signal.SIGKILL:
            raise RuntimeError(f"the {self.role} child was not killed (exit status "
                               f"{self.proc.returncode}):\n{self._stderr_tail()}")
        return rest

    def finish(self) -> None:
        """Wait for a child that exits by itself; it must exit with status 0."""
        self._reap()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        if self.proc.returncode != 0:
            raise RuntimeError(f"the {self.role} child failed (exit status {self.proc.returncode}):\n"
                               f"{self._stderr_tail()}")

    def _reap(self) -> None:
        self.proc.wait()
        self._watchdog.cancel()
        if not self._stderr.closed:
            self._stderr.close()

    def _stderr_tail(self) -> str:
        return self._stderr_path.read_text(encoding="utf-8", errors="replace")[-3000:]


# -- samples -------------------------------------------------------------------------------------

def sync_tree(path: Path) -> None:
    """fsync every file and directory under ``path``: what a killed writer left there reaches
    the disk before a timed reopen, which then does not compete with its writeback."""
    for root, _dirs, files in os.walk(path):
        for name in [*files, "."]:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:  # removed meanwhile, or not readable: nothing of ours to write back
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _reopen(kind: str, path: Path, plan: Plan, key_index: int, log_dir: Path,
            probe: bytes | None = None) -> dict[str, Any]:
    """Time a fresh process's import, open and first get of record ``key_index``; check it."""
    key, value = plan.record(key_index)
    # The killed writer's files are in the page cache, maybe not on disk yet: the timed reopen
    # must not pay for their writeback (nor wait for other processes', as os.sync() would).
    t0 = time.perf_counter()
    sync_tree(path)
    synced = time.perf_counter() - t0
    with Child("reopen", log_dir, kind=kind, dir=path, key=key.hex(), value=value.hex(),
               probe=probe.hex() if probe else None, settings=json.dumps(plan.settings),
               map_size=plan.lmdb_map_size) as child:
        result = child.read_until("reopened")
        result["process_s"] = time.perf_counter() - child.started
        child.finish()
    if not result["value_ok"]:
        raise AssertionError(f"{kind}: the first get after the kill did not return record "
                             f"{key_index}'s acknowledged value")
    out = {"key_index": key_index, "total_ms": (result["open_s"] + result["get_s"]) * 1000.0,
           "sync_ms": synced * 1000.0}
    for name in ("open", "get", "import", "process"):
        out[f"{name}_ms"] = result[f"{name}_s"] * 1000.0
    if "cache_check_s" in result:
        out["cache_check_ms"] = result["cache_check_s"] * 1000.0
    renames = {"index_runs": "index_runs_at_open", "version": "version_at_open",
               "probe_found": "killed_flush_landed", "cache_disk_bytes": "cache_disk_bytes"}
    out.update({new: result[old] for old, new in renames.items() if old in result})
    return out


def kvlog_sample(plan: Plan, work: Path, state: str, repeat: int, key_index: int) -> dict[str, Any]:
    """Load a new store with a writer, kill it in ``state``, time the reopen; remove the store."""
    path = work / f"kvlog-{state}-{repeat}"
    try:
        commits: list[dict[str, Any]] = []
        kill: dict[str, Any] = {}
        with Child("write-kvlog", work, dir=path, keys=plan.keys, commit_records=plan.commit_records,
                   seed=plan.seed, state=state, settings=json.dumps(plan.settings)) as writer:
            if state == "mid_flush":
                facts = writer.read_until("flushing", commits)
                fraction = MID_FLUSH_KILL_FRACTIONS[repeat % len(MID_FLUSH_KILL_FRACTIONS)]
                delay = facts["typical_flush_s"] * fraction
                time.sleep(delay)
                rest = writer.kill()
                finished = [m for m in rest if m.get("event") == "flushed"]
                kill = {"kill_after_ms": delay * 1000.0, "flush_finished_before_kill": bool(finished)}
            else:
                facts = writer.read_until("ready", commits)
                writer.kill()
        if state == "cache_lost":
            (path / CACHE_MARKER).write_text("a boot before a machine crash\n")
        facts.pop("event", None)
        runs_at_kill = facts.pop("index_runs", None)
        sample = _reopen("kvlog", path, plan, key_index, work,
                         probe=make_keys(plan.keys, 1, plan.seed)[0] if state == "mid_flush" else None)
        sample.update(state=state, repeat=repeat, index_runs_at_kill=runs_at_kill,
                      most_index_runs_in_load=max((c["index_runs"] for c in commits), default=0),
                      writer=facts, **kill)
        return sample
    finally:
        shutil.rmtree(path, ignore_errors=True)


def load_anchor(kind: str, plan: Plan, path: Path, log_dir: Path) -> dict[str, Any]:
    """Load the N records into a new py-lmdb environment or rocksdict database (once per run)."""
    with Child(f"load-{kind}", log_dir, dir=path, keys=plan.keys, commit_records=plan.commit_records,
               seed=plan.seed, map_size=plan.lmdb_map_size) as child:
        loaded = child.read_until("loaded")
        child.finish()
    return {"load_s": loaded["load_s"]}


def anchor_sample(kind: str, plan: Plan, path: Path, key_index: int, log_dir: Path,
                  salt: str) -> dict[str, Any]:
    """Kill a writer in the middle of its writes to the loaded anchor, then time the reopen."""
    with Child(f"kill-{kind}", log_dir, dir=path, commit_records=plan.commit_records,
               map_size=plan.lmdb_map_size, salt=salt) as writer:
        writer.read_until("ready")
        writer.kill()
    return _reopen(kind, path, plan, key_index, log_dir)


def measure_recovery(plan: Plan, work: Path, repeats: int,
                     describe: Callable[[str], None] = lambda text: None,
                     states: Sequence[str] = STATES) -> dict[str, Any]:
    """Every one of ``states`` ``repeats`` times, each kvlog sample followed by one of each anchor.

    Returns ``{"samples": {name: {state: [sample, ...]}}, "anchor_loads": {...},
    "anchors_skipped": {name: reason}, "key_indices": [...]}`` with ``name`` "kvlog" and the
    anchors that ran.
    """
    skipped: dict[str, str] = {}
    missing = rocksdict_missing()
    if missing:
        skipped["rocksdict"] = missing
    anchors = [a for a in ANCHORS if a not in skipped]
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {state: [] for state in states} for name in ("kvlog", *anchors)}
    loads: dict[str, dict[str, Any]] = {}
    paths = {name: work / f"anchor-{name}" for name in anchors}
    picks = np.random.default_rng(plan.seed + 11).integers(0, plan.keys, size=repeats)
    try:
        for name in anchors:
            describe(f"store: recovery, loading {plan.keys:,} records into {name}")
            loads[name] = load_anchor(name, plan, paths[name], work)
        for repeat in range(repeats):
            key_index = int(picks[repeat])
            for state in states:
                describe(f"store: recovery, {state}, run {repeat + 1}/{repeats} "
                         f"(kvlog writer, {plan.keys:,} records)")
                samples["kvlog"][state].append(kvlog_sample(plan, work, state, repeat, key_index))
                for name in anchors:
                    describe(f"store: recovery, {state}, run {repeat + 1}/{repeats} ({name})")
                    samples[name][state].append(anchor_sample(name, plan, paths[name], key_index, work,
                                                              salt=f"{plan.seed} {state} {repeat}"))
    finally:
        for path in paths.values():
            shutil.rmtree(path, ignore_errors=True)
    return {"samples": samples, "anchor_loads": loads, "anchors_skipped": skipped,
            "key_indices": [int(i) for i in picks]}
