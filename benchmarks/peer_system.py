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
import shutil
import subprocess
import sys
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

__all__ = ["bench_durable_threads", "bench_reopen", "bench_space"]

MiB = 1024 * 1024


def bench_durable_threads(ctx: PeerContext) -> dict[str, Any]:
    """16 threads, each write durable on return, for ``durable_seconds`` per run."""
    from rocksdict import Options, Rdict, WriteOptions

    import kvlog

    s = ctx.settings
    threads = s.threads
    n = len(ctx.keys)
    keys, values = ctx.keys, ctx.values
    runs: dict[str, list[float]] = {k: [] for k in KV_PEERS}
    per_flush: list[float] = []
    flushes: list[int] = []
    began = perf_counter()
    for r in range(s.repeats):
        for name in turned(KV_PEERS, r):
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
        f"fsyncs). Unit: writes/s = all writes / wall time from the start barrier to the last join."
    )
    return peer_entry(
        "peers.durable_threads", f"durable writes, {threads} threads, sync=True", method,
        measurement("kvlog", "kvlog put(sync=True)", "writes/s", runs["kvlog"],
                    records_per_flush=per_flush, flushes_per_run=flushes),
        [measurement("lmdb", "py-lmdb, a synced txn per put", "writes/s", runs["lmdb"]),
         measurement("rocksdict", "rocksdict put, WriteOptions sync=True", "writes/s", runs["rocksdict"])],
        seconds=perf_counter() - began, records_per_flush=median(per_flush),
    )


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
