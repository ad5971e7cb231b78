"""The peer suite's process-level figures: 16-thread durable writes, reopening, disk and memory.

``peers.durable_threads``: 16 threads writing with each store's synced write (kvlog
``put(sync=True)``, rocksdict ``WriteOptions.sync``, one synced py-lmdb transaction per put),
with kvlog's records per flush. ``peers.reopen``: a fresh process's open and first get after a
clean close (all three stores) and after ``kill -9`` of a writer with index runs pending or in
the middle of a flush (:mod:`benchmarks.recovery`, whose processes these are). ``peers.space``:
bytes on disk and peak ``RssAnon`` right after loading, each store in a fresh process
(:mod:`benchmarks.peer_child`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

import lmdb
import numpy as np

from benchmarks.children import child_env
from benchmarks.data import median
from benchmarks.peer_suite import KV_PEERS, peer_entry, turned
from benchmarks.recovery import (
    Plan,
    _reopen,
    commit_records_for,
    kvlog_sample,
    load_anchor,
    measure_recovery,
)
from benchmarks.suite import measurement, quiesce, threaded_loop

if TYPE_CHECKING:
    from benchmarks.peer_suite import PeerContext

__all__ = ["bench_durable_single", "bench_durable_threads", "bench_reopen", "bench_space"]

MiB = 1024 * 1024


def bench_durable_threads(ctx: PeerContext) -> dict[str, Any]:
    """16 threads, each write durable on return, for ``durable_seconds`` per run."""
    from rocksdict import Options, Rdict, WriteOptions

    import kvlog

    s = ctx.settings
    threads = s.threads
    n = len(ctx.keys)
    keys, values = ctx.keys, ctx.values
    contenders = (*KV_PEERS, "fsync_floor")
    runs: dict[str, list[float]] = {k: [] for k in contenders}
    per_flush: list[float] = []
    flushes: list[int] = []
    began = perf_counter()
    for r in range(s.repeats):
        for name in turned(contenders, r):
            ctx.bar.describe(f"peers: {threads} threads, synced writes ({name})")
            path = ctx.new_dir(f"threads-{name}")
            try:
                quiesce()
                if name == "kvlog":
                    store = kvlog.open(path)
                    try:
                        def kvlog_op(t: int, i: int, store: kvlog.Store = store) -> None:
                            j = (t + threads * i) % n
                            store.put(keys[j], values[j], sync=True)

                        count, elapsed, _lat = threaded_loop(kvlog_op, threads, s.durable_seconds)
                        done = int(store.stats()["flushes"])
                    finally:
                        store.close()
                    flushes.append(done)
                    per_flush.append(count / max(done, 1))
                elif name == "rocksdict":
                    options = Options(raw_mode=True)
                    options.create_if_missing(True)
                    db = Rdict(str(path), options)
                    synced = WriteOptions()
                    synced.sync = True
                    try:
                        def rocksdict_op(t: int, i: int, db: Any = db, synced: Any = synced) -> None:
                            j = (t + threads * i) % n
                            db.put(keys[j], values[j], synced)

                        count, elapsed, _lat = threaded_loop(rocksdict_op, threads, s.durable_seconds)
                    finally:
                        db.close()
                elif name == "fsync_floor":
                    count, elapsed = _fsync_floor(path, threads, s.durable_seconds, len(keys[0]) + len(values[0]))
                else:
                    env = lmdb.open(str(path), map_size=ctx.map_size(n), sync=True, max_spare_txns=threads)
                    try:
                        def lmdb_op(t: int, i: int, env: Any = env) -> None:
                            j = (t + threads * i) % n
                            with env.begin(write=True) as txn:
                                txn.put(keys[j], values[j])

                        count, elapsed, _lat = threaded_loop(lmdb_op, threads, s.durable_seconds)
                    finally:
                        env.close()
                runs[name].append(count / elapsed)
            finally:
                shutil.rmtree(path, ignore_errors=True)
    method = (
        f"{threads} threads, time-bounded runs of {s.durable_seconds:g} s on a new store per run, "
        f"the three stores in turn; each thread writes distinct records and every write is "
        f"durable (on disk, fsynced) when its call returns. kvlog: store.put(key, value, "
        f"sync=True), concurrent callers share flushes (group commit; records per flush = writes "
        f"/ store.stats()['flushes'], in `records_per_flush`). rocksdict: Rdict.put(key, value, "
        f"WriteOptions(sync=True)), RocksDB groups concurrent writers' WAL syncs. py-lmdb: "
        f"sync=True, one write transaction per put (LMDB serialises writers; every commit "
        f"fsyncs). Floor: each thread appends the same bytes as one record to a file of its "
        f"own and fsyncs it (os.write + os.fsync), the disk's rate of independent durable "
        f"appends from {threads} threads. Unit: writes/s = all writes / wall time from the start "
        f"barrier to the last join."
    )
    return peer_entry(
        "peers.durable_threads", f"durable writes, {threads} threads, sync=True", method,
        measurement("kvlog", "kvlog put(sync=True)", "writes/s", runs["kvlog"],
                    records_per_flush=per_flush, flushes_per_run=flushes),
        [measurement("lmdb", "py-lmdb, a synced txn per put", "writes/s", runs["lmdb"]),
         measurement("rocksdict", "rocksdict put, WriteOptions sync=True", "writes/s", runs["rocksdict"]),
         measurement("fsync_floor", f"{threads} threads, each write + fsync of its own file", "writes/s",
                     runs["fsync_floor"])],
        seconds=perf_counter() - began, records_per_flush=median(per_flush),
    )


def _fsync_floor(path: Path, threads: int, seconds: float, record_bytes: int) -> tuple[int, float]:
    """``threads`` threads, each appending ``record_bytes`` to a file of its own and fsyncing
    it, for ``seconds``: (appends, elapsed)."""
    path.mkdir(parents=True, exist_ok=True)
    fds = [os.open(path / f"t{t}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for t in range(threads)]
    record = b"r" * record_bytes
    try:
        def append(t: int, _i: int) -> None:
            os.write(fds[t], record)
            os.fsync(fds[t])

        count, elapsed, _lat = threaded_loop(append, threads, seconds)
    finally:
        for fd in fds:
            os.close(fd)
    return count, elapsed


def bench_durable_single(ctx: PeerContext) -> dict[str, Any]:
    """One thread: the latency of a durable put beside the floor of a new file made durable."""
    import kvlog

    s = ctx.settings
    n = len(ctx.keys)
    keys, values = ctx.keys, ctx.values
    latencies: dict[str, list[float]] = {"kvlog": [], "fsync_floor": []}
    runs: dict[str, list[float]] = {"kvlog": [], "fsync_floor": []}
    began = perf_counter()
    for r in range(s.repeats):
        for name in turned(("kvlog", "fsync_floor"), r):
            ctx.bar.describe(f"peers: one thread, synced writes ({name})")
            path = ctx.new_dir(f"single-{name}")
            try:
                quiesce()
                if name == "kvlog":
                    with kvlog.open(path) as store:
                        def kvlog_op(_t: int, i: int, store: kvlog.Store = store) -> None:
                            store.put(keys[i % n], values[i % n], sync=True)

                        _count, _elapsed, lat = threaded_loop(kvlog_op, 1, s.durable_seconds)
                else:
                    lat = _new_file_floor(path, s.durable_seconds, len(keys[0]) + len(values[0]))
                latencies[name].extend(lat)
                runs[name].append(median(lat) * 1000)
            finally:
                shutil.rmtree(path, ignore_errors=True)
    method = (
        f"One thread, time-bounded runs of {s.durable_seconds:g} s on a new store per run, in turn "
        f"with the floor. kvlog: store.put(key, value, sync=True), each call's latency. Floor: "
        f"the fewest steps a new durable object takes on a file system, each timed: write the "
        f"bytes of one record to a new file, fsync it, link it into a directory and fsync the "
        f"directory. Unit: the median latency of the run in ms; lower is better."
    )
    return peer_entry(
        "peers.durable_single", "durable write latency, one thread, sync=True", method,
        measurement("kvlog", "kvlog put(sync=True)", "ms", runs["kvlog"], latencies_s=latencies["kvlog"]),
        [measurement("fsync_floor", "a new file: write + fsync + link + directory fsync", "ms",
                     runs["fsync_floor"], latencies_s=latencies["fsync_floor"])],
        higher_is_better=False, seconds=perf_counter() - began,
    )


def _new_file_floor(path: Path, seconds: float, record_bytes: int) -> list[float]:
    """Latencies of making one new file of ``record_bytes`` durable, for ``seconds``."""
    path.mkdir(parents=True, exist_ok=True)
    record = b"r" * record_bytes
    directory = os.open(path, os.O_RDONLY)
    latencies: list[float] = []
    try:
        end = perf_counter() + seconds
        i = 0
        while perf_counter() < end:
            t0 = perf_counter()
            tmp = path / f".tmp{i}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, record)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(tmp, path / f"{i}.json")
            os.unlink(tmp)
            os.fsync(directory)
            latencies.append(perf_counter() - t0)
            i += 1
    finally:
        os.close(directory)
    return latencies


_REOPEN_NAMES = {
    "clean": {"lmdb": "py-lmdb after env.close(): lmdb.open + first get",
              "rocksdict": "rocksdict after close(): Rdict(path) + first get"},
    "killed": {"lmdb": "py-lmdb, writer killed in a write txn: lmdb.open + first get",
               "rocksdict": "rocksdict, writer killed after unsynced puts: Rdict(path) + first get"},
}


def bench_reopen(ctx: PeerContext) -> list[dict[str, Any]]:
    """Open + first get in a fresh process: after a clean close, and after kill -9."""
    s = ctx.settings
    keys = s.reopen_keys
    plan = Plan(keys, commit_records_for(keys), s.seed)
    began = perf_counter()
    picks = np.random.default_rng(s.seed + 11).integers(0, keys, size=s.repeats)
    clean: dict[str, list[dict[str, Any]]] = {k: [] for k in KV_PEERS}
    work = ctx.new_dir("reopen")
    work.mkdir(parents=True)
    try:
        for r in range(s.repeats):
            key_index = int(picks[r])
            for name in turned(KV_PEERS, r):
                ctx.bar.describe(f"peers: reopen after a clean close, {keys:,} records, run {r + 1} ({name})")
                if name == "kvlog":
                    clean[name].append(kvlog_sample(plan, work, "closed", r, key_index))
                    continue
                path = work / f"clean-{name}-{r}"
                try:
                    load_anchor(name, plan, path, work)
                    clean[name].append(_reopen(name, path, plan, key_index, work))
                finally:
                    shutil.rmtree(path, ignore_errors=True)
        killed = (measure_recovery(plan, work, s.repeats, ctx.bar.describe, states=s.killed_states)
                  if s.killed_states else None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    common = (
        f"{keys:,} records (16-byte keys, 100-byte values) loaded by a writer subprocess, "
        f"{plan.commit_records:,} records per commit (benchmarks.recovery); then a fresh process "
        f"(python -c) times the store's open and the first get of a record acknowledged before, "
        f"drawn at random (the same record for every store within a run), and checks its value; "
        f"interpreter start and imports are not in the figure (`import_ms`). {s.repeats} runs; "
        f"paired_ratios: kvlog's run i / the peer's run i. Unit: ms, lower is better."
    )
    clean_text = (
        "After a clean close. kvlog: the writer (background_compaction=False, no background "
        "flusher) calls store.close(), which flushes and merges the index runs, and is then "
        "killed; py-lmdb: the loader commits (one write transaction per commit's records, "
        "env.sync()) and closes the environment; rocksdict: the loader puts the records "
        "(Options(raw_mode=True), default WAL) and closes the database. " + common
    )
    out = [_reopen_entry("peers.reopen_clean", "reopen + first get after a clean close", clean_text,
                         clean, "clean", began, keys)]
    texts = (
        ("pending_runs", "reopen + first get after kill -9, index runs pending",
         "The kvlog writer is killed right after its last commit, its last index_run_limit "
         "commits' runs pending (the most a store holds at rest)."),
        ("mid_flush", "reopen + first get after kill -9 in the middle of a flush",
         "The kvlog writer is killed 0.5, 1 and 2 typical flush times (run by run) into a "
         "flush whose commit merges every pending run."))
    for state, title, text in texts:
        if killed is None or state not in s.killed_states:
            continue
        peers_text = (" py-lmdb: a writer is killed inside a write transaction of "
                      f"{plan.commit_records:,} records it never commits; rocksdict: a writer is "
                      f"killed after {plan.commit_records:,} unsynced puts, which the reopen "
                      "replays from its WAL. ")
        out.append(_reopen_entry(f"peers.reopen_{state}", title, text + peers_text + common,
                                 killed["samples"], state, None, keys,
                                 anchors_skipped=killed["anchors_skipped"]))
    return out


def _reopen_entry(bench_id: str, title: str, method: str, samples: dict[str, Any], state: str,
                  began: float | None, keys: int, **extra: Any) -> dict[str, Any]:
    def runs(name: str) -> list[dict[str, Any]]:
        found = samples[name]
        return list(found[state] if isinstance(found, dict) else found)

    kv = [x["total_ms"] for x in runs("kvlog")]
    names = _REOPEN_NAMES["clean" if state == "clean" else "killed"]
    anchors = [measurement(name, names[name], "ms", [x["total_ms"] for x in runs(name)], samples=runs(name))
               for name in ("lmdb", "rocksdict") if name in samples]
    return peer_entry(bench_id, title, method,
                      measurement("kvlog", "kvlog.open + first get", "ms", kv, samples=runs("kvlog")),
                      anchors, higher_is_better=False,
                      seconds=0.0 if began is None else perf_counter() - began,
                      slowest_ms=max(kv), keys=keys, **extra)


def _space_child(ctx: PeerContext, kind: str, keys: int) -> dict[str, Any]:
    path = ctx.new_dir(f"space-{kind}")
    command = [sys.executable, "-m", "benchmarks.peer_child", "--kind", kind, "--keys", str(keys),
               "--dir", str(path), "--seed", str(ctx.settings.seed)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=child_env())
    finally:
        shutil.rmtree(path, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} space run failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["last_found"]:
        raise AssertionError(f"{kind}: the last loaded record is missing after the load")
    return result


def bench_space(ctx: PeerContext) -> list[dict[str, Any]]:
    """Bytes on disk and peak RssAnon right after loading, each store in a fresh process."""
    keys = ctx.settings.space_keys
    began = perf_counter()
    results: dict[str, dict[str, Any]] = {}
    for name in KV_PEERS:
        ctx.bar.describe(f"peers: disk and memory after loading {keys:,} records ({name})")
        results[name] = _space_child(ctx, name, keys)
    method = (
        f"Each store in a fresh process (python -m benchmarks.peer_child), one after the other: "
        f"{keys:,} records (16-byte keys, 100-byte values, generated 10,000 at a time) loaded into "
        f"a new directory through its bulk path (kvlog: put, flush() and the index merge, default "
        f"StoreConfig with background compaction on; py-lmdb: one write transaction and "
        f"env.sync(); rocksdict: puts and flush()). {{what}}"
    )
    disk_text = ("Disk: the bytes the store's directory takes right after the load (allocated "
                 "blocks of every file: kvlog's data files, commits and its LMDB cache and index; "
                 "py-lmdb's data file; rocksdict's table files, WAL and manifest); the same after "
                 "close() is in `disk_bytes_closed`. Unit: MiB, lower is better.")
    rss_text = ("Memory: the peak RssAnon (anonymous resident memory, sampled every 5 ms: mapped "
                "file pages are the page cache's, not the process's) from the store's open to the "
                "end of the load; `baseline_kib` is the process's after importing the store's "
                "module. Unit: MiB, lower is better.")
    labels = {"lmdb": "py-lmdb", "rocksdict": "rocksdict"}

    def fig(key: str, name: str, field: str, result: dict[str, Any]) -> dict[str, Any]:
        scale = 1024 if field.endswith("kib") else MiB
        return measurement(key, name, "MiB", [result[field] / scale], detail=result)

    return [
        peer_entry("peers.disk", f"disk after loading {keys:,} records", method.replace("{what}", disk_text),
                   fig("kvlog", "kvlog", "disk_bytes", results["kvlog"]),
                   [fig(k, labels[k], "disk_bytes", results[k]) for k in ("lmdb", "rocksdict")],
                   higher_is_better=False, seconds=perf_counter() - began, keys=keys),
        peer_entry("peers.rss", f"peak RssAnon while loading {keys:,} records",
                   method.replace("{what}", rss_text),
                   fig("kvlog", "kvlog", "peak_kib", results["kvlog"]),
                   [fig(k, labels[k], "peak_kib", results[k]) for k in ("lmdb", "rocksdict")],
                   higher_is_better=False, seconds=0.0, keys=keys),
    ]
