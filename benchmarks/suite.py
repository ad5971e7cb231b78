"""The benchmark suite: kvlog measured side by side with its anchors in the same run.

Every benchmark produces one *entry*: the kvlog figure (the *subject*), one or
more *anchors* measured in the same process on the same data just before or
after it, the ratios ``subject / anchor``, and, where there is one, a target
with its outcome. Throughputs are the median of ``repeats`` runs (``puts_repeats`` for the
puts); latencies are per-operation ``perf_counter`` samples summarised as p50/p90/p99.

Groups:

``log``
    ``Producer.append`` of 1000-record batches vs py-lmdb puts in one
    transaction; durable flushes per second on local disk and on SeaweedFS vs
    one synced LMDB transaction per put (local) or one raw S3 PUT (SeaweedFS);
    commit latency on SeaweedFS vs a raw conditional S3 PUT.
``store``
    buffered puts + flush vs py-lmdb (one transaction) and sqlite3
    (``executemany``, WAL, one transaction); random gets vs py-lmdb and a
    dict; ``get_many`` of 100 keys vs 100 gets, py-lmdb ``Cursor.getmulti`` and rocksdict
    (:mod:`benchmarks.get_many`); a full scan vs an LMDB cursor; durable writes from 16 threads vs
    LMDB with one synced transaction per put; peak anonymous memory at two
    store sizes, each in a fresh process; reopening after the writer was
    killed (``kill -9``) in four states, a fresh process's ``kvlog.open`` +
    first get vs py-lmdb's (and rocksdict's) reopen after a killed writer
    (:mod:`benchmarks.recovery`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any

import lmdb
import numpy as np

import kvlog
from benchmarks.children import child_env
from benchmarks.data import KEY_BYTES, VALUE_BYTES, make_keys, make_values, median, percentiles
from benchmarks.get_many import bench_store_get_many
from benchmarks.machine import machine_info
from benchmarks.recovery import (
    MID_FLUSH_KILL_FRACTIONS,
    STATES,
    Plan,
    commit_records_for,
    measure_recovery,
    min_commits,
)
from kvlog import StoreConfig, SystemClock
from kvlog.log import open_log

__all__ = ["Settings", "FULL", "QUICK", "TINY", "run_suite", "SCHEMA"]

SCHEMA = "kvlog-bench/1"
MiB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    """Sizes and durations of one suite run."""

    mode: str
    records: int
    """Records of the store benchmarks (puts, gets, scan)."""
    repeats: int
    """Runs of each throughput measurement; the median is reported."""
    puts_repeats: int
    """Runs of the puts benchmark, the noisiest: each of its runs writes five new stores of
    ``records`` records to disk."""
    append_batches: int
    """1000-record batches appended per run of the log benchmark."""
    durable_seconds: float
    """Length of each time-bounded durable-write run."""
    commit_samples: int
    """Appends timed one by one for the SeaweedFS commit latency."""
    rss_sizes: tuple[int, int]
    """Store sizes (keys) of the two memory runs."""
    latency_samples: int = 20_000
    """Gets timed one by one for the get latency percentiles."""
    rss_gets: int = 20_000
    recovery_keys: int = 20_000
    """Records loaded before each kill of the recovery benchmark (``repeats`` runs per state)."""
    append_batch_records: int = 1000
    commit_batch_records: int = 10
    threads: int = 16
    seaweedfs: bool = True
    seed: int = 0
    store_settings: dict[str, Any] = field(default_factory=dict)
    """StoreConfig settings of every kvlog store the suite opens (default: none, the defaults)."""


FULL = Settings("full", records=1_000_000, repeats=3, puts_repeats=5, append_batches=200, durable_seconds=3.0,
                commit_samples=500, rss_sizes=(100_000, 5_000_000), recovery_keys=5_000_000)
QUICK = Settings("quick", records=50_000, repeats=3, puts_repeats=3, append_batches=20, durable_seconds=1.0,
                 commit_samples=100, rss_sizes=(20_000, 200_000), latency_samples=5_000,
                 recovery_keys=20_000)
TINY = Settings("tiny", records=3_000, repeats=1, puts_repeats=1, append_batches=3, durable_seconds=0.3,
                commit_samples=20, rss_sizes=(2_000, 10_000), latency_samples=1_000, rss_gets=1_000,
                recovery_keys=3_000)

#: Targets printed next to the figures (not asserted).
TARGETS: dict[str, dict[str, Any]] = {
    "store.puts": {"anchor": "lmdb", "min_ratio": 1.0, "text": "puts >= 1.0x raw LMDB"},
    "store.gets": {"anchor": "lmdb", "min_ratio": 0.5, "text": "gets >= 0.5x raw LMDB"},
    "store.scan": {"anchor": "lmdb_cursor", "min_ratio": 0.5, "text": "scan >= 0.5x LMDB cursor"},
    "store.memory": {"metric": "growth_mib", "max": 64.0, "text": "RssAnon growth < 64 MiB"},
    **{f"store.recovery_{state}": {"metric": "slowest_ms", "max": 1000.0,
                                   "text": "open + first get < 1 s, every run"} for state in STATES},
}

GENERAL_METHOD = (
    "Each benchmark runs kvlog and its anchors in the same process, one after the other, on the "
    "same records: 16-byte keys (two SplitMix64 words of the record index, distinct and "
    "random-looking, so inserts land in random B-tree positions) and 100-byte values from "
    "numpy.random.default_rng(seed) (incompressible). Durations come from time.perf_counter. "
    "Throughputs are the median of `repeats` runs (`puts_repeats` for the puts; every run listed "
    "in `runs`); each run of a "
    "write benchmark starts from a new, empty store or database in a new directory under the "
    "work directory, on the local disk (see machine.work_dir_filesystem). Latencies are "
    "per-operation samples (p50/p90/p99 in milliseconds). kvlog stores use the default "
    "StoreConfig (recorded in `store_config`) unless `settings.store_settings` says otherwise. "
    "The Python garbage collector stays on, as in real use. Ratios are kvlog / anchor in the "
    "benchmark's unit; `speedup` turns it so that > 1 always means kvlog is faster. Targets are "
    "printed, not asserted."
)


# -- results -----------------------------------------------------------------------------------

def measurement(key: str, name: str, unit: str, runs: Sequence[float], *,
                latencies_s: Sequence[float] | None = None, **extra: Any) -> dict[str, Any]:
    """One measured figure: the median of ``runs``, every run, and latency percentiles."""
    out: dict[str, Any] = {"key": key, "name": name, "unit": unit, "value": median(runs),
                           "runs": [float(r) for r in runs]}
    if latencies_s is not None:
        out["latency_ms"] = percentiles(latencies_s)
    out.update(extra)
    return out


def make_entry(bench_id: str, group: str, title: str, method: str,
               subject: dict[str, Any], anchors: list[dict[str, Any]], *,
               higher_is_better: bool = True, seconds: float = 0.0, **extra: Any) -> dict[str, Any]:
    """A benchmark's entry: subject, anchors, ratios and the target's outcome."""
    ratios: dict[str, dict[str, float | None]] = {}
    for anchor in anchors:
        value = anchor["value"]
        ratio = subject["value"] / value if value else None
        speedup = None if ratio is None or ratio == 0 else (ratio if higher_is_better else 1.0 / ratio)
        ratios[anchor["key"]] = {"ratio": ratio, "speedup": speedup}
    entry: dict[str, Any] = {
        "id": bench_id, "group": group, "title": title, "status": "ok",
        "unit": subject["unit"], "higher_is_better": higher_is_better, "method": method,
        "subject": subject, "anchors": anchors, "ratios": ratios, "seconds": seconds,
    }
    entry.update(extra)
    target = TARGETS.get(bench_id)
    if target is not None:
        entry["target"] = evaluate_target(target, entry)
    return entry


def evaluate_target(target: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The target with its measured value and ``met`` (True/False, None when not measurable)."""
    out = dict(target)
    if "anchor" in target:
        value = entry["ratios"].get(target["anchor"], {}).get("ratio")
        out["value"] = value
        out["met"] = None if value is None else bool(value >= target["min_ratio"])
    else:
        value = entry.get(target["metric"])
        out["value"] = value
        out["met"] = None if value is None else bool(value < target["max"])
    return out


def failed_entry(bench_id: str, group: str, title: str, status: str,
                 reason: str) -> dict[str, Any]:
    """An entry for a benchmark that could not run (``skipped``) or raised (``error``)."""
    entry: dict[str, Any] = {"id": bench_id, "group": group, "title": title,
                             "status": status, "reason": reason, "subject": None, "anchors": [],
                             "ratios": {}}
    target = TARGETS.get(bench_id)
    if target is not None:
        entry["target"] = {**target, "value": None, "met": None}
    return entry


# -- progress ----------------------------------------------------------------------------------

class Progress:
    """A rich progress bar on a terminal; silent otherwise."""

    def __init__(self, total: int, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._total = total
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                     TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                     transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("kvlog benchmarks", total=self._total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=text)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)


# -- the run's context ---------------------------------------------------------------------------

class Context:
    """What the benchmarks share: settings, data, a work directory, the store left by the puts."""

    def __init__(self, settings: Settings, work: Path, bar: Progress) -> None:
        self.settings = settings
        self.work = work
        self.bar = bar
        self.keys = make_keys(0, settings.records, settings.seed)
        self.values = make_values(0, settings.records, settings.seed)
        self._dirs = 0
        # Left by the puts benchmark for the gets and scan benchmarks, with their directories.
        self.store: kvlog.Store | None = None
        self.store_dir: Path | None = None
        self.lmdb_env: Any = None
        self.lmdb_dir: Path | None = None
        self.seaweed: Any = None

    def new_dir(self, name: str) -> Path:
        self._dirs += 1
        path = self.work / f"{self._dirs:03d}-{name}"
        path.mkdir(parents=True)
        return path

    @contextlib.contextmanager
    def scratch_dir(self, name: str) -> Iterator[Path]:
        """A new directory, removed afterwards: files kept in the page cache would make every
        later run take fresh memory pages, which cost a new virtual machine a fault each."""
        path = self.new_dir(name)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def drop_puts_store(self) -> None:
        """Close and remove the store and the LMDB environment the puts benchmark left."""
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.lmdb_env is not None:
            self.lmdb_env.close()
            self.lmdb_env = None
        for path in (self.store_dir, self.lmdb_dir):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)
        self.store_dir = self.lmdb_dir = None

    def open_store(self, uri: str | Path, **options: Any) -> kvlog.Store:
        return kvlog.open(uri, **{**self.settings.store_settings, **options})

    def lmdb_map_size(self, records: int) -> int:
        # Generous: 1 KiB per record plus 64 MiB; the file is sparse, only used pages count.
        return records * 1024 + 64 * MiB

    def record(self, i: int) -> tuple[bytes, bytes]:
        n = len(self.keys)
        return self.keys[i % n], self.values[i % n]

    def close(self) -> None:
        self.drop_puts_store()
        if self.seaweed is not None:
            self.seaweed.stop()
            self.seaweed = None


def quiesce() -> None:
    """Collect garbage and write every dirty page back (``os.sync``), so that a timed run does
    not pay for the writeback or the garbage of the runs before it."""
    gc.collect()
    os.sync()


def timed_loop(op: Callable[[int], object], seconds: float) -> tuple[int, float, list[float]]:
    """Call ``op(i)`` for i = 0, 1, … until ``seconds`` have passed: (calls, elapsed, latencies)."""
    latencies: list[float] = []
    start = perf_counter()
    end = start + seconds
    i = 0
    now = start
    while now < end:
        t0 = perf_counter()
        op(i)
        now = perf_counter()
        latencies.append(now - t0)
        i += 1
    return i, now - start, latencies


def threaded_loop(op: Callable[[int, int], object], threads: int,
                  seconds: float) -> tuple[int, float, list[float]]:
    """``threads`` threads call ``op(thread, i)`` for ``seconds``: (calls, elapsed, latencies)."""
    barrier = threading.Barrier(threads + 1)
    results: list[tuple[int, list[float]]] = [(0, [])] * threads
    errors: list[BaseException] = []

    def work(t: int) -> None:
        latencies: list[float] = []
        count = 0
        try:
            barrier.wait()
            end = perf_counter() + seconds
            now = 0.0
            while now < end:
                t0 = perf_counter()
                op(t, count)
                now = perf_counter()
                latencies.append(now - t0)
                count += 1
        except BaseException as e:  # reported by the caller
            errors.append(e)
        results[t] = (count, latencies)

    workers = [threading.Thread(target=work, args=(t,), name=f"bench-{t}") for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = perf_counter()
    for w in workers:
        w.join()
    elapsed = perf_counter() - start
    if errors:
        raise errors[0]
    return sum(c for c, _l in results), elapsed, [x for _c, lat in results for x in lat]


# -- log benchmarks --------------------------------------------------------------------------------

def bench_log_append(ctx: Context) -> dict[str, Any]:
    """(a) Producer.append of 1000-record batches vs py-lmdb puts in one transaction."""
    s = ctx.settings
    size = s.append_batch_records
    total = s.append_batches * size
    batches = []
    for b in range(s.append_batches):
        batches.append([ctx.record(b * size + i) for i in range(size)])
    kv_runs: list[float] = []
    kv_lat: list[float] = []
    lm_runs: list[float] = []
    began = perf_counter()
    for _ in range(s.repeats):
        ctx.bar.describe("log: Producer.append (kvlog)")
        store = ctx.open_store(ctx.new_dir("append"))
        try:
            producer = store.log.producer()
            partitions = store.log.partitions
            sequence = [0] * partitions
            t0 = perf_counter()
            for b, records in enumerate(batches):
                p = b % partitions
                a0 = perf_counter()
                producer.append(p, records, base_sequence=sequence[p])
                kv_lat.append(perf_counter() - a0)
                sequence[p] += len(records)
            kv_runs.append(total / (perf_counter() - t0))
            ends = sum(store.log.end_offset(p) for p in range(partitions))
            if ends != total:
                raise AssertionError(f"appended {total} records but the partitions end at {ends}")
        finally:
            store.close()
        ctx.bar.describe("log: py-lmdb puts, one transaction")
        env = lmdb.open(str(ctx.new_dir("append-lmdb")), map_size=ctx.lmdb_map_size(total))
        try:
            t0 = perf_counter()
            with env.begin(write=True) as txn:
                put = txn.put
                for records in batches:
                    for k, v in records:
                        put(k, v)
            lm_runs.append(total / (perf_counter() - t0))
        finally:
            env.close()
    method = (
        f"kvlog: a new local store per run; one producer (store.log.producer()) appends "
        f"{s.append_batches} batches of {size} records (list of (key, value) tuples prepared "
        f"beforehand) round-robin over the partitions with base_sequence tracked per partition; "
        f"each append is durable on return (one data file + one commit, fsynced). Records/s = "
        f"{total} / wall time of all appends; latency = each append call. Anchor: the same "
        f"records put with txn.put into a new py-lmdb environment (defaults: sync=True, "
        f"metasync=True) in one write transaction, commit included."
    )
    return make_entry(
        "log.append", "log", f"Producer.append, {size}-record batches", method,
        measurement("kvlog", "kvlog Producer.append", "records/s", kv_runs, latencies_s=kv_lat,
                    records=total, batch_records=size),
        [measurement("lmdb", "py-lmdb puts, one txn", "records/s", lm_runs, records=total)],
        seconds=perf_counter() - began,
    )


def _lmdb_synced_puts(ctx: Context, threads: int, repeats: int = 1) -> tuple[list[float], list[float]]:
    """Runs (ops/s) and latencies of one synced LMDB write transaction per put."""
    s = ctx.settings
    runs: list[float] = []
    lat: list[float] = []
    for _ in range(repeats):
        env = lmdb.open(str(ctx.new_dir("lmdb-sync")), map_size=ctx.lmdb_map_size(len(ctx.keys)),
                        sync=True, metasync=True, max_spare_txns=threads)
        try:
            def op(t: int, i: int, env: Any = env) -> None:
                k, v = ctx.record(t + threads * i)
                with env.begin(write=True) as txn:
                    txn.put(k, v)

            if threads == 1:
                n, elapsed, latencies = timed_loop(lambda i: op(0, i), s.durable_seconds)
            else:
                n, elapsed, latencies = threaded_loop(op, threads, s.durable_seconds)
            runs.append(n / elapsed)
            lat.extend(latencies)
        finally:
            env.close()
    return runs, lat


def _kvlog_durable(ctx: Context, open_store: Callable[[], kvlog.Store], *,
                   flush_loop: bool, repeats: int = 1) -> tuple[list[float], list[float]]:
    """Runs (flushes/s) and latencies of put(sync=True), or of put + flush(), on one thread."""
    s = ctx.settings
    runs: list[float] = []
    lat: list[float] = []
    for _ in range(repeats):
        store = open_store()
        try:
            if flush_loop:
                def op(i: int, store: kvlog.Store = store) -> None:
                    k, v = ctx.record(i)
                    store.put(k, v)
                    store.flush()
            else:
                def op(i: int, store: kvlog.Store = store) -> None:
                    k, v = ctx.record(i)
                    store.put(k, v, sync=True)

            n, elapsed, latencies = timed_loop(op, s.durable_seconds)
            runs.append(n / elapsed)
            lat.extend(latencies)
        finally:
            store.close()
    return runs, lat


def _extend(into: tuple[list[float], list[float]], more: tuple[list[float], list[float]]) -> None:
    into[0].extend(more[0])
    into[1].extend(more[1])


def bench_log_durable_local(ctx: Context) -> list[dict[str, Any]]:
    """(b) durable flushes per second on local disk vs synced LMDB transactions."""
    began = perf_counter()
    sync_runs: list[float] = []
    sync_lat: list[float] = []
    flush_runs: list[float] = []
    flush_lat: list[float] = []
    lm_runs: list[float] = []
    lm_lat: list[float] = []
    # Interleaved (kvlog, kvlog, anchor) per repeat, so drifting load on the machine hits all alike.
    for _ in range(ctx.settings.repeats):
        ctx.bar.describe("log: durable flushes, local (kvlog)")
        _extend((sync_runs, sync_lat), _kvlog_durable(
            ctx, lambda: ctx.open_store(ctx.new_dir("sync")), flush_loop=False))
        _extend((flush_runs, flush_lat), _kvlog_durable(
            ctx, lambda: ctx.open_store(ctx.new_dir("flush")), flush_loop=True))
        ctx.bar.describe("log: synced LMDB transactions")
        _extend((lm_runs, lm_lat), _lmdb_synced_puts(ctx, 1))
    seconds = perf_counter() - began
    anchor = measurement("lmdb_sync", "py-lmdb, one synced txn per put", "txn/s", lm_runs,
                         latencies_s=lm_lat)
    common = (
        f"Local disk, one thread, time-bounded runs of {ctx.settings.durable_seconds:g} s, a new "
        f"store per run, kvlog and anchor runs alternating. Each flush writes one commit carrying "
        f"its record as an inline L0 file (a conditional swap of the head: a fsynced temporary "
        f"file, a hard link at the commit's name, a rename over the head under a lock of log/, a "
        f"directory fsync) and applies it to the LMDB cache. Anchor: a "
        f"new py-lmdb environment with sync=True, metasync=True and one write transaction per "
        f"put (each commit fsyncs)."
    )
    return [
        make_entry("log.durable_local_sync_put", "log", "durable flushes/s, local, put(sync=True)",
                   "kvlog: store.put(key, value, sync=True) in a loop; every call waits for its "
                   "own flush. " + common,
                   measurement("kvlog", "kvlog put(sync=True)", "flushes/s", sync_runs,
                               latencies_s=sync_lat),
                   [anchor], seconds=seconds),
        make_entry("log.durable_local_flush_loop", "log", "durable flushes/s, local, put + flush()",
                   "kvlog: store.put(key, value) then store.flush() in a loop (one record per "
                   "flush). " + common,
                   measurement("kvlog", "kvlog put + flush()", "flushes/s", flush_runs,
                               latencies_s=flush_lat),
                   [anchor], seconds=0.0),
    ]


def _seaweed(ctx: Context) -> Any:
    if ctx.seaweed is None:
        from kvlog.testing.seaweedfs import SeaweedServer

        server = SeaweedServer(base_dir=ctx.work)
        server.start()
        server.create_bucket("kvlog-bench")
        ctx.seaweed = server
    return ctx.seaweed


def _raw_s3(server: Any) -> Any:
    """An obstore client for the bench bucket, configured like kvlog's but with no kvlog code."""
    from obstore.store import S3Store

    options = server.storage_options
    return S3Store(
        "kvlog-bench",
        config={"endpoint": options["endpoint_override"], "region": options["region"],
                "access_key_id": options["access_key"], "secret_access_key": options["secret_key"]},
        client_options={"allow_http": True},
    )


def bench_log_s3(ctx: Context) -> list[dict[str, Any]]:
    """(b) durable flushes per second and (c) commit latency on SeaweedFS vs raw S3 PUTs."""
    import obstore

    s = ctx.settings
    began = perf_counter()
    ctx.bar.describe("log: starting SeaweedFS")
    server = _seaweed(ctx)
    stores = iter(range(1, 1_000_000))

    def open_s3() -> kvlog.Store:
        return ctx.open_store(server.uri("kvlog-bench", f"store-{next(stores)}"),
                              storage_options=dict(server.storage_options),
                              cache_dir=str(ctx.new_dir("s3-cache")))

    client = _raw_s3(server)
    body = bytes(1024)
    names = iter(range(10**9))

    def raw_put(_i: int) -> None:
        obstore.put(client, f"raw/{next(names):012d}", body, mode="create", use_multipart=False)

    sync_runs: list[float] = []
    sync_lat: list[float] = []
    flush_runs: list[float] = []
    flush_lat: list[float] = []
    raw_runs: list[float] = []
    raw_lat: list[float] = []
    for _ in range(s.repeats):
        ctx.bar.describe("log: durable flushes, SeaweedFS (kvlog)")
        _extend((sync_runs, sync_lat), _kvlog_durable(ctx, open_s3, flush_loop=False))
        _extend((flush_runs, flush_lat), _kvlog_durable(ctx, open_s3, flush_loop=True))
        ctx.bar.describe("log: raw S3 PUTs")
        n, elapsed, latencies = timed_loop(raw_put, s.durable_seconds)
        raw_runs.append(n / elapsed)
        raw_lat.extend(latencies)

    ctx.bar.describe("log: commit latency, SeaweedFS (kvlog and raw PUTs, alternating)")
    size = s.commit_batch_records
    append_lat: list[float] = []
    raw_commit_lat: list[float] = []
    store = open_s3()
    try:
        producer = store.log.producer()
        partitions = store.log.partitions
        sequence = [0] * partitions
        for b in range(s.commit_samples):
            p = b % partitions
            records = [ctx.record(b * size + i) for i in range(size)]
            t0 = perf_counter()
            producer.append(p, records, base_sequence=sequence[p])
            append_lat.append(perf_counter() - t0)
            sequence[p] += size
            t0 = perf_counter()
            raw_put(0)
            raw_commit_lat.append(perf_counter() - t0)
        requests = store.stats().get("storage_requests")
    finally:
        store.close()

    seconds = perf_counter() - began
    anchor = measurement("s3_put", "raw S3 PUT (If-None-Match), 1 KiB", "PUT/s", raw_runs,
                         latencies_s=raw_lat)
    common = (
        f"SeaweedFS {server.endpoint} (weed mini on loopback, started by "
        f"kvlog.testing.SeaweedServer), one thread, time-bounded runs of {s.durable_seconds:g} s, "
        f"a new store prefix and LMDB cache per run, kvlog and anchor runs alternating. A kvlog "
        f"flush is one conditional PUT of the head (If-Match), the commit that carries its record "
        f"inline, and the PUT of the commit's copy at its own name. Anchor: raw "
        f"obstore.put of a 1 KiB object with mode='create' (If-None-Match: *), one after the "
        f"other, to the same server through a separate obstore client."
    )
    p50 = percentiles(append_lat).get("p50", 0.0)
    raw_p50 = percentiles(raw_commit_lat).get("p50", 0.0)
    return [
        make_entry("log.durable_s3_sync_put", "log", "durable flushes/s, SeaweedFS, put(sync=True)",
                   "kvlog: store.put(key, value, sync=True) in a loop. " + common,
                   measurement("kvlog", "kvlog put(sync=True)", "flushes/s", sync_runs,
                               latencies_s=sync_lat),
                   [anchor], seconds=seconds),
        make_entry("log.durable_s3_flush_loop", "log", "durable flushes/s, SeaweedFS, put + flush()",
                   "kvlog: store.put(key, value) then store.flush() in a loop. " + common,
                   measurement("kvlog", "kvlog put + flush()", "flushes/s", flush_runs,
                               latencies_s=flush_lat),
                   [anchor], seconds=0.0),
        make_entry("log.commit_latency_s3", "log",
                   f"commit latency p50, SeaweedFS, {size}-record append",
                   f"kvlog: {s.commit_samples} calls of Producer.append(partition, {size} records, "
                   f"base_sequence=...) on one store, round-robin over partitions, each timed "
                   f"alone (durable on return). The figure is the p50 latency (ms); p99 is in "
                   f"latency_ms. Anchor: {s.commit_samples} raw conditional 1 KiB PUTs, each timed "
                   f"alone right after an append (alternating). " + common,
                   measurement("kvlog", "kvlog Producer.append", "ms", [p50],
                               latencies_s=append_lat, storage_requests=requests),
                   [measurement("s3_put", "raw S3 PUT (If-None-Match), 1 KiB", "ms", [raw_p50],
                                latencies_s=raw_commit_lat)],
                   higher_is_better=False, seconds=0.0),
    ]


# -- store benchmarks ------------------------------------------------------------------------------

def bench_store_puts(ctx: Context) -> dict[str, Any]:
    """Buffered puts then flush vs py-lmdb (one txn) and sqlite3 executemany (WAL, one txn)."""
    s = ctx.settings
    keys, values = ctx.keys, ctx.values
    n = len(keys)
    kv_runs: list[float] = []
    lm_runs: list[float] = []
    sq_runs: list[float] = []
    calls_runs: list[float] = []
    settled_runs: list[float] = []
    btree_runs: list[float] = []
    no_index_runs: list[float] = []
    flushes: list[int] = []
    began = perf_counter()
    ctx.bar.describe(f"store: {n:,} puts, untimed (warming the process up)")
    _warm_up_puts(ctx, keys, values)
    for r in range(s.puts_repeats):
        ctx.bar.describe(f"store: {n:,} puts + flush (kvlog)")
        ctx.drop_puts_store()
        ctx.store_dir = ctx.new_dir("puts")
        store = ctx.open_store(ctx.store_dir)
        elapsed = _timed_puts(store, keys, values)
        kv_runs.append(n / elapsed)
        t0 = perf_counter()
        store.log.settle_index()  # now, not in the background while the anchors run
        settled_runs.append(n / (elapsed + perf_counter() - t0))
        flushes.append(int(store.stats()["flushes"]))
        ctx.store = store  # the last one serves the gets and the scan

        ctx.bar.describe(f"store: {n:,} puts (py-lmdb)")
        ctx.lmdb_dir = ctx.new_dir("puts-lmdb")
        env = lmdb.open(str(ctx.lmdb_dir), map_size=ctx.lmdb_map_size(n))
        quiesce()
        t0 = perf_counter()
        with env.begin(write=True) as txn:
            lput = txn.put
            for k, v in zip(keys, values, strict=True):
                lput(k, v)
        lm_runs.append(n / (perf_counter() - t0))
        ctx.lmdb_env = env

        ctx.bar.describe(f"store: {n:,} put() calls alone, and puts + flush writing the B-tree per commit")
        calls_runs.append(n / _put_calls_seconds(ctx, keys, values))
        btree_runs.append(n / _btree_puts_seconds(ctx, keys, values))
        ctx.bar.describe(f"store: {n:,} puts + flush into a log that keeps no key index")
        no_index_runs.append(n / _log_only_seconds(ctx, keys, values))

        ctx.bar.describe(f"store: {n:,} puts (sqlite3)")
        with ctx.scratch_dir("puts-sqlite") as db_dir, contextlib.closing(
                sqlite3.connect(db_dir / "kv.db", isolation_level=None)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
            quiesce()
            t0 = perf_counter()
            conn.execute("BEGIN")
            conn.executemany("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", zip(keys, values, strict=True))
            conn.execute("COMMIT")
            sq_runs.append(n / (perf_counter() - t0))
            if r == 0:
                (count,) = conn.execute("SELECT count(*) FROM kv").fetchone()
                if count != n:
                    raise AssertionError(f"sqlite holds {count} rows, not {n}")
    method = (
        f"{n:,} records. kvlog: a new local store per run; store.put(key, value) for every record "
        f"(buffered: the background flusher writes L0 files as flush_bytes fill, writers flush "
        f"themselves past max_unflushed_bytes), then store.flush(); records/s = n / (time of "
        f"all puts + the final flush), so every record is durable and indexed at the end. "
        f"Anchors: py-lmdb txn.put of every record in one write transaction of a new environment "
        f"(sync=True, metasync=True), commit included; sqlite3 (stdlib) executemany of INSERT OR "
        f"REPLACE into a WITHOUT ROWID table with a BLOB primary key, journal_mode=WAL, "
        f"synchronous=FULL, one transaction, COMMIT included. Beside the anchors (same run, "
        f"not anchors): settled: the same kvlog run's puts + flush + settling the index runs "
        f"its commits wrote into the index's B-tree (store.log.settle_index(), timed right after "
        f"the flush), the rate sustained once the index is merged too; btree_per_commit: the "
        f"same puts + flush into a store with index_run_limit=0, whose commits write the B-tree "
        f"themselves (the design before index runs); calls_only: the put() calls alone into a "
        f"store that never flushes; no_index: the same puts and flush into a log that keeps no "
        f"key index (open_log(maintain_index=False)), the log's own cost. Every store or "
        f"database is removed once measured (the last kvlog store and LMDB environment after the "
        f"gets and the scan): kept files would make each later run take never-used memory pages "
        f"for its page cache, which on a new virtual machine slowed py-lmdb run by run from "
        f"655,000 to 490,000 records/s, against 610,000 to 666,000 with each removed. First an untimed "
        f"round of the kvlog puts and the py-lmdb transaction warms the process up (its heap, "
        f"first calls; py-lmdb alone, six runs in one process, each removed: 609,000 records/s "
        f"in the first, 623,000 to 666,000 in the others). Then {s.puts_repeats} runs, "
        f"each measuring kvlog, then every other figure, in turn; every timed part starts after "
        f"gc.collect() and os.sync(), so no run pays for an earlier one's writeback. "
        f"paired_ratios: kvlog's run i / py-lmdb's run i."
    )
    return make_entry(
        "store.puts", "store", "buffered puts + flush", method,
        measurement("kvlog", "kvlog put x n + flush()", "records/s", kv_runs, records=n,
                    flushes_per_run=flushes),
        [measurement("lmdb", "py-lmdb puts, one txn", "records/s", lm_runs, records=n,
                     paired_ratios=[k / a for k, a in zip(kv_runs, lm_runs, strict=True)]),
         measurement("sqlite", "sqlite3 executemany, WAL, one txn", "records/s", sq_runs, records=n)],
        seconds=perf_counter() - began,
        context={
            "settled": measurement("settled", "kvlog puts + flush + index settled", "records/s",
                                   settled_runs, records=n),
            "btree_per_commit": measurement("btree_per_commit", "kvlog puts + flush, index_run_limit=0",
                                            "records/s", btree_runs, records=n),
            "calls_only": measurement("calls_only", "kvlog put() calls, never flushed", "records/s",
                                      calls_runs, records=n),
            "no_index": measurement("no_index", "kvlog puts + flush, no key index", "records/s",
                                    no_index_runs, records=n),
        },
    )


def _timed_puts(store: kvlog.Store, keys: Sequence[bytes], values: Sequence[bytes], *,
                flush: bool = True) -> float:
    """Seconds of ``store.put`` for every record, then ``flush()`` when ``flush``, timed from a
    quiet start (:func:`quiesce`)."""
    put = store.put
    quiesce()
    t0 = perf_counter()
    for k, v in zip(keys, values, strict=True):
        put(k, v)
    if flush:
        store.flush()
    return perf_counter() - t0


def _warm_up_puts(ctx: Context, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
    """Untimed: the kvlog puts, then the py-lmdb transaction, once each, so that no timed run
    pays for growing the process's heap or for first calls."""
    with ctx.scratch_dir("puts-warm-up") as path:
        store = ctx.open_store(path)
        try:
            _timed_puts(store, keys, values, flush=False)
        finally:
            store.close()
    with ctx.scratch_dir("puts-lmdb-warm-up") as path:
        env = lmdb.open(str(path), map_size=ctx.lmdb_map_size(len(keys)))
        try:
            with env.begin(write=True) as txn:
                lput = txn.put
                for k, v in zip(keys, values, strict=True):
                    lput(k, v)
        finally:
            env.close()


def _put_calls_seconds(ctx: Context, keys: Sequence[bytes], values: Sequence[bytes]) -> float:
    """Seconds of ``store.put`` for every record into a store that never flushes (then dropped)."""
    with ctx.scratch_dir("puts-calls") as path:
        store = ctx.open_store(path, flush_bytes=1 << 50, max_unflushed_bytes=1 << 50,
                               flush_interval_ms=0, background_compaction=False)
        try:
            return _timed_puts(store, keys, values, flush=False)
        finally:
            store.close(flush=False)


def _btree_puts_seconds(ctx: Context, keys: Sequence[bytes], values: Sequence[bytes]) -> float:
    """Seconds of ``store.put`` for every record then ``flush()``, into a store whose commits
    write the index's B-tree themselves (``index_run_limit=0``)."""
    with ctx.scratch_dir("puts-btree") as path:
        store = ctx.open_store(path, index_run_limit=0)
        try:
            return _timed_puts(store, keys, values)
        finally:
            store.close()


def _log_only_seconds(ctx: Context, keys: Sequence[bytes], values: Sequence[bytes]) -> float:
    """Seconds of ``store.put`` for every record then ``flush()``, into a log without a key index."""
    config = StoreConfig.from_settings(None, **ctx.settings.store_settings)
    with ctx.scratch_dir("puts-no-index") as path:
        store = kvlog.Store(open_log(path, config=config, maintain_index=False))
        try:
            return _timed_puts(store, keys, values)
        finally:
            store.close()


def _per_op_latency(get: Callable[[bytes], object], probe: Sequence[bytes]) -> list[float]:
    out = []
    for k in probe:
        t0 = perf_counter()
        get(k)
        out.append(perf_counter() - t0)
    return out


def bench_store_gets(ctx: Context) -> dict[str, Any]:
    """Random gets vs py-lmdb gets (one read txn, and a txn per get) and a dict."""
    s = ctx.settings
    store, env = ctx.store, ctx.lmdb_env
    if store is None or env is None:
        raise RuntimeError("the gets benchmark needs the store left by the puts benchmark")
    n = len(ctx.keys)
    order = np.random.default_rng(s.seed + 7).permutation(n)
    probe = [ctx.keys[i] for i in order]
    table = dict(zip(ctx.keys, ctx.values, strict=True))
    began = perf_counter()

    def run_kvlog() -> float:
        get = store.get
        missing = 0
        t0 = perf_counter()
        for k in probe:
            if get(k) is None:
                missing += 1
        rate = n / (perf_counter() - t0)
        if missing:
            raise AssertionError(f"kvlog missed {missing} of {n} keys")
        return rate

    def run_lmdb() -> float:
        missing = 0
        t0 = perf_counter()
        with env.begin() as txn:
            get = txn.get
            for k in probe:
                if get(k) is None:
                    missing += 1
        rate = n / (perf_counter() - t0)
        if missing:
            raise AssertionError(f"lmdb missed {missing} of {n} keys")
        return rate

    def run_lmdb_txn() -> float:
        missing = 0
        begin = env.begin
        t0 = perf_counter()
        for k in probe:
            with begin() as txn:
                if txn.get(k) is None:
                    missing += 1
        rate = n / (perf_counter() - t0)
        if missing:
            raise AssertionError(f"lmdb missed {missing} of {n} keys")
        return rate

    def run_dict() -> float:
        missing = 0
        get = table.get
        t0 = perf_counter()
        for k in probe:
            if get(k) is None:
                missing += 1
        rate = n / (perf_counter() - t0)
        if missing:
            raise AssertionError(f"dict missed {missing} of {n} keys")
        return rate

    runs: dict[str, list[float]] = {"kvlog": [], "lmdb": [], "lmdb_txn": [], "dict": []}
    for _ in range(s.repeats):
        for name, fn in (("kvlog", run_kvlog), ("lmdb", run_lmdb), ("lmdb_txn", run_lmdb_txn),
                         ("dict", run_dict)):
            ctx.bar.describe(f"store: {n:,} random gets ({name})")
            runs[name].append(fn())
    # Correctness on a sample, outside the timing.
    for i in order[:1000]:
        if store.get(ctx.keys[i]) != ctx.values[i]:
            raise AssertionError("kvlog returned a wrong value")
    sample = probe[: s.latency_samples]
    ctx.bar.describe("store: get latencies")
    kv_lat = _per_op_latency(store.get, sample)
    with env.begin() as txn:
        lm_lat = _per_op_latency(txn.get, sample)

    def txn_get(k: bytes) -> object:
        with env.begin() as txn:
            return txn.get(k)

    lt_lat = _per_op_latency(txn_get, sample)
    d_lat = _per_op_latency(table.get, sample)
    method = (
        f"{n:,} gets of every key in a random permutation (numpy default_rng), on the store and "
        f"the LMDB environment left by the last puts run (all records flushed; kvlog's values of "
        f"<= inline_value_bytes are inlined in its LMDB key index). kvlog: store.get(key), which "
        f"checks the memtable, then reads its LMDB cache in a read transaction it reuses while "
        f"that is the newest snapshot. Anchors: py-lmdb "
        f"txn.get in one read transaction for all gets (the target's anchor); py-lmdb with a new read "
        f"transaction per get; dict.get on a dict of the same records. "
        f"Each loop counts missing keys (none allowed). Latencies: the first "
        f"{len(sample):,} keys of the permutation, each get timed alone."
    )
    return make_entry(
        "store.gets", "store", "random gets", method,
        measurement("kvlog", "kvlog get", "gets/s", runs["kvlog"], latencies_s=kv_lat),
        [measurement("lmdb", "py-lmdb get, one read txn", "gets/s", runs["lmdb"], latencies_s=lm_lat),
         measurement("lmdb_txn", "py-lmdb get, a read txn per get", "gets/s", runs["lmdb_txn"],
                     latencies_s=lt_lat),
         measurement("dict", "dict.get", "gets/s", runs["dict"], latencies_s=d_lat)],
        seconds=perf_counter() - began,
    )


def bench_store_scan(ctx: Context) -> dict[str, Any]:
    """A full scan vs an LMDB cursor iteration."""
    s = ctx.settings
    store, env = ctx.store, ctx.lmdb_env
    if store is None or env is None:
        raise RuntimeError("the scan benchmark needs the store left by the puts benchmark")
    n = len(ctx.keys)
    kv_runs: list[float] = []
    lm_runs: list[float] = []
    began = perf_counter()
    for _ in range(s.repeats):
        ctx.bar.describe(f"store: scan of {n:,} keys (kvlog)")
        count = 0
        t0 = perf_counter()
        for _kv in store.scan():
            count += 1
        kv_runs.append(count / (perf_counter() - t0))
        if count != n:
            raise AssertionError(f"kvlog scanned {count} keys, not {n}")
        ctx.bar.describe(f"store: scan of {n:,} keys (LMDB cursor)")
        count = 0
        t0 = perf_counter()
        with env.begin() as txn:
            for _kv in txn.cursor():
                count += 1
        lm_runs.append(count / (perf_counter() - t0))
        if count != n:
            raise AssertionError(f"LMDB cursor gave {count} keys, not {n}")
    first = [k for k, _v in zip(store.scan(), range(5), strict=False)]
    if [k for k, _v in first] != sorted(ctx.keys)[:5]:
        raise AssertionError("kvlog's scan is not in key order")
    method = (
        f"A full scan of the {n:,} records left by the last puts run. kvlog: iterate "
        f"store.scan() (key order, one LMDB snapshot merged with the memtable; values inline in "
        f"the index) and count the (key, value) pairs. Anchor: iterate txn.cursor() of the py-lmdb "
        f"environment holding the same records, yielding (key, value) bytes, in one read "
        f"transaction. Both counts must equal n; kvlog's first keys are checked against sorted order."
    )
    return make_entry(
        "store.scan", "store", "full scan", method,
        measurement("kvlog", "kvlog scan()", "records/s", kv_runs),
        [measurement("lmdb_cursor", "py-lmdb cursor iteration", "records/s", lm_runs)],
        seconds=perf_counter() - began,
    )


def bench_store_durable_threads(ctx: Context) -> dict[str, Any]:
    """Durable writes/s from 16 threads with sync=True vs LMDB with one synced txn per put."""
    s = ctx.settings
    threads = s.threads
    began = perf_counter()
    kv_runs: list[float] = []
    kv_lat: list[float] = []
    lm_runs: list[float] = []
    lm_lat: list[float] = []
    flushes: list[int] = []
    for _ in range(s.repeats):
        ctx.bar.describe(f"store: durable writes, {threads} threads (kvlog)")
        store = ctx.open_store(ctx.new_dir("threads"))
        try:
            def op(t: int, i: int, store: kvlog.Store = store) -> None:
                k, v = ctx.record(t + threads * i)
                store.put(k, v, sync=True)

            n, elapsed, latencies = threaded_loop(op, threads, s.durable_seconds)
            kv_runs.append(n / elapsed)
            kv_lat.extend(latencies)
            flushes.append(int(store.stats()["flushes"]))
        finally:
            store.close()
        ctx.bar.describe(f"store: durable writes, {threads} threads (LMDB)")
        _extend((lm_runs, lm_lat), _lmdb_synced_puts(ctx, threads))
    method = (
        f"{threads} threads, time-bounded runs of {s.durable_seconds:g} s, kvlog and anchor runs "
        f"alternating (each thread loops until "
        f"its deadline; writes/s = all writes / wall time from the start barrier to the last "
        f"join), a new local store per run. kvlog: store.put(key, value, sync=True), distinct keys "
        f"per thread; concurrent waiters share flushes (group commit; flushes per run are in "
        f"flushes_per_run). Anchor: a new py-lmdb environment (sync=True, metasync=True), the "
        f"same {threads} threads each running one write transaction per put (LMDB serialises "
        f"writers; every commit fsyncs)."
    )
    return make_entry(
        "store.durable_threads", "store", f"durable writes/s, {threads} threads, sync=True", method,
        measurement("kvlog", "kvlog put(sync=True)", "writes/s", kv_runs, latencies_s=kv_lat,
                    flushes_per_run=flushes),
        [measurement("lmdb_sync", "py-lmdb, one synced txn per put", "writes/s", lm_runs,
                     latencies_s=lm_lat)],
        seconds=perf_counter() - began,
    )


def _rss_child(ctx: Context, keys: int) -> dict[str, Any]:
    s = ctx.settings
    path = ctx.new_dir(f"rss-{keys}") / "store"
    command = [sys.executable, "-m", "benchmarks.rss", "--keys", str(keys), "--dir", str(path),
               "--seed", str(s.seed), "--gets", str(s.rss_gets),
               "--settings", json.dumps(s.store_settings)]
    t0 = perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=child_env())
    wall = perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"the memory run for {keys} keys failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_seconds"] = wall
    shutil.rmtree(path.parent, ignore_errors=True)
    if result["gets_missing"] or result["scanned"] not in (-1, keys):
        raise AssertionError(f"the memory run for {keys} keys read back wrong data: {result}")
    return result


def bench_store_memory(ctx: Context) -> dict[str, Any]:
    """Peak RssAnon of a fresh process at a small and a large store size."""
    small, large = ctx.settings.rss_sizes
    began = perf_counter()
    ctx.bar.describe(f"store: memory, {small:,} keys (subprocess)")
    lo = _rss_child(ctx, small)
    ctx.bar.describe(f"store: memory, {large:,} keys (subprocess)")
    hi = _rss_child(ctx, large)
    lo_mib = lo["peak_kib"] / 1024
    hi_mib = hi["peak_kib"] / 1024
    method = (
        f"Two fresh processes (python -m benchmarks.rss), one per size: each opens a new local "
        f"store, puts N records (16-byte keys, 100-byte values, generated 10,000 at a time so the "
        f"driver holds little), flushes, compacts once (compact(force=True), so both sizes go "
        f"through the same phases and the compactor's fixed costs are in both), then gets "
        f"{ctx.settings.rss_gets:,} random keys and scans "
        f"the whole store. A thread samples RssAnon from /proc/self/status every 5 ms; the figure "
        f"is the peak sample (MiB) of the whole run; per-phase peaks (write, compact, read), the baseline "
        f"after imports and VmHWM (which counts memory-mapped LMDB pages too, so is not used) are "
        f"in `runs_detail`. Growth = peak at {large:,} keys - peak at {small:,} keys."
    )
    return make_entry(
        "store.memory", "store", f"peak RssAnon, {small:,} vs {large:,} keys", method,
        measurement("large", f"kvlog, {large:,} keys", "MiB", [hi_mib], keys=large, detail=hi),
        [measurement("small", f"kvlog, {small:,} keys", "MiB", [lo_mib], keys=small, detail=lo)],
        higher_is_better=False, seconds=perf_counter() - began, growth_mib=hi_mib - lo_mib,
    )


_RECOVERY_ANCHOR_NAMES = {
    "lmdb": "py-lmdb, writer killed in a write txn: lmdb.open + first get",
    "rocksdict": "rocksdict, writer killed after unsynced puts: Rdict(path) + first get",
}


def _recovery_state_text(state: str, limit: int, commit_records: int, keys: int) -> tuple[str, str]:
    """The title and the kill point of one state of the recovery benchmark."""
    if state == "closed":
        return ("reopen + first get after kill -9: after close()",
                "Killed after a clean store.close(), which flushes, merges the pending runs and "
                "marks the cache as closed cleanly.")
    if state == "settled":
        return ("reopen + first get after kill -9: 0 index runs pending",
                "Killed right after store.log.settle_index(): no runs pending, but the cache was "
                "not closed cleanly.")
    if state == "pending_runs":
        return (f"reopen + first get after kill -9: {limit} index runs pending",
                f"Killed right after the load's last commit, which leaves {limit} runs pending "
                f"(index_run_limit: the next commit merges them).")
    if state == "cache_lost":
        return ("reopen + first get after kill -9: the cache lost",
                f"Killed as with {limit} runs pending, then the cache is left as a machine crash "
                f"leaves it (its marker names another boot): the opener deletes it, loads the newest "
                f"checkpoint (or replays every commit when there is none) and rebuilds the key index.")
    fractions = ", ".join(f"{f:g}" for f in MID_FLUSH_KILL_FRACTIONS)
    return ("reopen + first get after kill -9: in the middle of a flush",
            f"After the load ({limit} runs pending) the writer puts {commit_records:,} more records "
            f"(indices {keys:,} on) and calls store.flush(), whose commit leaves {limit + 1} runs and "
            f"so merges them all in the writer; the parent kills it {fractions} typical flush times "
            f"(the median of the load's fastest three quarters of flushes, which leaves out those "
            f"that merged) after the writer says it starts the flush, run after run in turn: in the "
            f"data file, around the commit, or in the merge. Per run: whether the flush had "
            f"finished (flush_finished_before_kill) and whether its commit landed "
            f"(killed_flush_landed: its first key found after the reopen).")


def bench_store_recovery(ctx: Context) -> list[dict[str, Any]]:
    """Reopen + first get after the writer was killed, in four states, vs py-lmdb and rocksdict."""
    s = ctx.settings
    keys = s.recovery_keys
    plan = Plan(keys, commit_records_for(keys, s.store_settings), s.seed, dict(s.store_settings))
    config = StoreConfig.from_settings(None, **s.store_settings)
    limit = config.index_run_limit
    began = perf_counter()
    with ctx.scratch_dir("recovery") as work:
        result = measure_recovery(plan, work, s.repeats, ctx.bar.describe)
    seconds = perf_counter() - began
    samples = result["samples"]
    skipped = result["anchors_skipped"]
    settle_after = max(plan.commits - limit, 0) if limit > 0 else 0
    common = (
        f"{keys:,} records (16-byte keys, 100-byte values) loaded into a new local store by a writer "
        f"subprocess: kvlog.open(path, background_compaction=False, flush_interval_ms=0), no "
        f"background flusher, so no quiet spell merges the index runs between the writer's report "
        f"and the kill; {plan.commit_records:,} records per commit (store.flush(), {plan.commits} "
        f"commits: the records a {config.flush_bytes // MiB} MiB flush holds, or "
        f"N / {min_commits(s.store_settings)} when that is fewer); the writer merges the index runs (store.log.settle_index()) after "
        f"commit {settle_after}, as a quiet writer would, so the last {min(limit, plan.commits)} "
        f"commits' runs are pending at the end of the load, and prints the pending runs after "
        f"every commit; the parent sends SIGKILL at the state's point. Then every file and "
        f"directory under the store's directory is fsynced (the killed writer's pages reach the "
        f"disk first, so the timed part does not compete with their writeback; the anchors' "
        f"likewise) and a fresh process (python -c, "
        f"no kvlog module imported before its timer) times kvlog.open(path) (default settings) and "
        f"the first store.get of a record acknowledged before the kill, drawn at random (seeded; "
        f"the same record for every state and anchor within a run), and checks its value. The "
        f"figure is open + first get in ms; per run (`samples`): open_ms, get_ms, import_ms "
        f"(import kvlog), process_ms (from the spawn to the answer, as the parent sees it), "
        f"cache_check_ms (the part of the open spent checking the structure of an LMDB cache that "
        f"was not closed cleanly, which reads the whole file; timed by wrapping "
        f"kvlog.meta.env.check_lmdb_file), cache_disk_bytes, the pending runs at the kill and "
        f"after the open, and the writer's own timings. {s.repeats} runs per state; within each run "
        f"the states go in turn, each kvlog sample followed by one sample of each anchor. Anchors, "
        f"loaded once with the same records (py-lmdb: one write transaction per commit's records; "
        f"rocksdict: puts, Options(raw_mode=True), default WAL) and reused: py-lmdb: a writer "
        f"subprocess opens the environment, puts {plan.commit_records:,} new random records in a "
        f"write transaction it never commits and is killed; the reopen is lmdb.open + the first "
        f"get in one read transaction. rocksdict: a writer puts {plan.commit_records:,} new random "
        f"records (WAL, not synced) and is killed; the reopen, Rdict(path), replays them. "
        f"paired_ratios: kvlog's run i / the anchor's run i."
    )
    entries = []
    for state in STATES:
        title, point = _recovery_state_text(state, limit, plan.commit_records, keys)
        kv = samples["kvlog"][state]
        totals = [x["total_ms"] for x in kv]
        anchors = []
        for name, runs in samples.items():
            if name == "kvlog":
                continue
            theirs = runs[state]
            anchors.append(measurement(
                name, _RECOVERY_ANCHOR_NAMES[name], "ms", [x["total_ms"] for x in theirs],
                paired_ratios=[k / a["total_ms"] for k, a in zip(totals, theirs, strict=True)],
                **{f"{part}_ms": [x[f"{part}_ms"] for x in theirs]
                   for part in ("open", "get", "import", "process")},
                samples=theirs, load_s=result["anchor_loads"][name]["load_s"]))
        entries.append(make_entry(
            f"store.recovery_{state}", "store", title, point + " " + common,
            measurement("kvlog", "kvlog.open + first get", "ms", totals,
                        **{f"{part}_ms": [x[f"{part}_ms"] for x in kv]
                           for part in ("open", "get", "import", "process")},
                        samples=kv),
            anchors, higher_is_better=False, seconds=seconds if state == STATES[0] else 0.0,
            slowest_ms=max(totals), keys=keys, commit_records=plan.commit_records,
            commits=plan.commits, index_run_limit=limit, anchors_skipped=skipped,
        ))
    return entries


def bench_store_aio(ctx: Context) -> list[dict[str, Any]]:
    """kvlog.aio's awaited get and put vs the sync calls (``benchmarks/aio.py``)."""
    from benchmarks.aio import bench_store_aio as run  # it imports this module

    return run(ctx)


# -- the suite ----------------------------------------------------------------------------------

def bench_consumer_poll(ctx: Context) -> dict[str, Any]:
    """Consumer throughput (see :mod:`benchmarks.consumers`)."""
    from benchmarks.consumers import bench_consumer_throughput

    return bench_consumer_throughput(ctx)


def bench_consumer_put_to_poll(ctx: Context) -> dict[str, Any]:
    """Another process's sync put to poll (see :mod:`benchmarks.consumers`)."""
    from benchmarks.consumers import bench_consumer_latency

    return bench_consumer_latency(ctx)


def bench_metrics_overhead(ctx: Context) -> dict[str, Any]:
    """Puts/s while kvlog.metrics is scraped (see :mod:`benchmarks.consumers`)."""
    from benchmarks.consumers import bench_metrics_overhead as run

    return run(ctx)


Step = tuple[str, str, str, Callable[[Context], "dict[str, Any] | list[dict[str, Any]]"]]

STEPS: list[Step] = [
    ("log.append", "log", "Producer.append, 1000-record batches", bench_log_append),
    ("log.durable_local", "log", "durable flushes/s, local", bench_log_durable_local),
    ("log.s3", "log", "durable flushes/s and commit latency, SeaweedFS", bench_log_s3),
    ("store.puts", "store", "buffered puts + flush", bench_store_puts),
    ("store.gets", "store", "random gets", bench_store_gets),
    ("store.scan", "store", "full scan", bench_store_scan),
    ("store.get_many", "store", "get_many of 100 keys", bench_store_get_many),
    ("store.durable_threads", "store", "durable writes/s, 16 threads", bench_store_durable_threads),
    ("store.memory", "store", "peak RssAnon", bench_store_memory),
    ("store.recovery", "store", "reopen + first get after kill -9", bench_store_recovery),
    ("store.aio", "store", "asyncio overhead per call", bench_store_aio),
    ("consumer.poll", "consumer", "records/s through Consumer.poll", bench_consumer_poll),
    ("consumer.latency", "consumer", "put(sync=True) in another process -> poll",
     bench_consumer_put_to_poll),
    ("consumer.metrics", "consumer", "buffered puts/s while metrics are scraped", bench_metrics_overhead),
]


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: other work on the machine skews every figure."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not available
        return None


def run_step(measure: Callable[[], dict[str, Any] | list[dict[str, Any]]],
             failed: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of one benchmark step, each stamped with the load average; a step that
    raises gives ``failed(detail)`` with its traceback, and the suite goes on."""
    try:
        produced = measure()
    except Exception as e:
        entry = failed("".join(traceback.format_exception_only(type(e), e)).strip())
        entry["traceback"] = traceback.format_exc()
        return [entry]
    finally:
        gc.collect()
    entries = produced if isinstance(produced, list) else [produced]
    for entry in entries:
        entry["load_average"] = load_average()
    return entries


def _seaweed_available() -> str | None:
    """Why SeaweedFS benchmarks cannot run, or None."""
    try:
        import obstore  # noqa: F401

        from kvlog.testing.seaweedfs import find_weed

        find_weed()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


@contextlib.contextmanager
def _work_dir(base: str | os.PathLike[str] | None, keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kvlog-bench-", dir=base))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def run_suite(
    settings: Settings = FULL, *, work_dir: str | os.PathLike[str] | None = None,
    only: Sequence[str] | None = None, progress: bool | None = None, keep: bool = False,
) -> dict[str, Any]:
    """Run the benchmarks and return the results document (see ``benchmarks/README.md``).

    ``only`` selects steps by id prefix (``"store"``, ``"log.append"``…); ``progress`` forces the
    progress bar on or off (default: on when stderr is a terminal); ``keep`` leaves the work
    directory in place.
    """
    began = perf_counter()
    started = datetime.fromtimestamp(SystemClock().now_ms() / 1000, UTC)
    chosen = {st[0] for st in STEPS if not only or any(st[0].startswith(o) for o in only)}
    if chosen & {"store.gets", "store.scan", "store.get_many"}:
        chosen.add("store.puts")  # they read the store the puts benchmark leaves
    steps = [st for st in STEPS if st[0] in chosen]
    s3_missing = _seaweed_available() if settings.seaweedfs else "disabled by settings"
    entries: list[dict[str, Any]] = []
    with _work_dir(work_dir, keep) as work, Progress(len(steps), progress) as bar:
        ctx = Context(settings, work, bar)
        info = machine_info(work)
        info["load_average_start"] = load_average()
        try:
            for step_id, group, title, fn in steps:
                bar.describe(title)
                if step_id == "log.s3" and s3_missing:
                    for sub in ("log.durable_s3_sync_put", "log.durable_s3_flush_loop",
                                "log.commit_latency_s3"):
                        entries.append(failed_entry(sub, group, title, "skipped", s3_missing))
                    bar.advance()
                    continue
                entries += run_step(partial(fn, ctx), partial(failed_entry, step_id, group, title, "error"))
                bar.advance()
        finally:
            ctx.close()
    config = kvlog.StoreConfig.from_settings(None, **settings.store_settings).to_dict()
    info["load_average_end"] = load_average()
    return {
        "schema": SCHEMA,
        "mode": settings.mode,
        "date": started.isoformat(timespec="seconds"),
        "wall_seconds": perf_counter() - began,
        "machine": info,
        "settings": {**asdict(settings), "key_bytes": KEY_BYTES, "value_bytes": VALUE_BYTES},
        "store_config": config,
        "method": GENERAL_METHOD,
        "targets": TARGETS,
        "benchmarks": entries,
    }


def settings_for(mode: str, **overrides: Any) -> Settings:
    """The preset ``full``, ``quick`` or ``tiny``, with ``overrides`` applied."""
    base = {"full": FULL, "quick": QUICK, "tiny": TINY}[mode]
    return replace(base, **overrides) if overrides else base
