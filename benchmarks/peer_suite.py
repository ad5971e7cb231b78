"""kvlog against its peers: py-lmdb, rocksdict and sqlite3 on the figures a user compares.

``python -m benchmarks --only peers`` (part of ``make bench``) runs :func:`run_peer_benchmarks`
and writes ``benchmarks/results/peers.json`` with its chart ``peers_ratios.png``. Every
figure is kvlog against its peers in one process, the contenders interleaved within each
repeat (their order turned by one each repeat), on the same records (:mod:`benchmarks.data`)
and the same operations; each entry gives the medians, the ratio kvlog / peer and the range
of the ratios of the paired runs (``paired_ratios``), and states each side's durability.

Steps (``--only`` ids): ``peers.load`` (bulk load, kvlog's index merge counted),
``peers.gets``, ``peers.scan`` (full scan), ``peers.short_scans`` (with and without index
runs pending), ``peers.ycsb`` (workloads A-F, :mod:`benchmarks.ycsb`), and, in
:mod:`benchmarks.peer_system`, ``peers.durable_threads``, ``peers.durable_single``,
``peers.reopen`` and ``peers.space``. Targets are recorded with ``met`` (``target`` in the JSON, as in the main
suite) and printed, never asserted.
"""

from __future__ import annotations

import gc
import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

import kvlog
from benchmarks.data import KEY_BYTES, VALUE_BYTES, make_keys, make_values
from benchmarks.machine import machine_info
from benchmarks.peers import KvlogPeer, LmdbPeer, Peer, RocksdictPeer, SqlitePeer, settle_index
from benchmarks.report import save_results
from benchmarks.suite import (
    Progress,
    failed_entry,
    load_average,
    make_entry,
    measurement,
    quiesce,
    run_step,
)
from benchmarks.ycsb import (
    MAX_SCAN_LENGTH,
    WORKLOADS,
    ZIPFIAN_CONSTANT,
    Stream,
    make_stream,
    run_stream,
)

__all__ = ["FULL", "QUICK", "TINY", "SCHEMA", "TARGETS", "PeerContext", "PeerSettings", "peer_entry",
           "peer_settings_for", "run_peer_benchmarks"]

SCHEMA = "kvlog-bench-peers/1"
MiB = 1024 * 1024
KV_PEERS = ("kvlog", "lmdb", "rocksdict")


@dataclass(frozen=True)
class PeerSettings:
    """Sizes of one run of the peer suite."""

    mode: str
    records: int
    """Records loaded before the load, gets, scans and YCSB figures."""
    ops: int
    """Operations per run of YCSB A, B, C, D and F."""
    scan_ops: int
    """Operations per run of YCSB E (95 % of them scans of up to 100 keys)."""
    short_scans: int
    """Scans in the list the short-scan figures go through."""
    scan_seconds: float
    """Length of each time-bounded short-scan run."""
    repeats: int
    durable_seconds: float
    """Length of each 16-thread durable-write run."""
    reopen_keys: int
    """Records loaded before each reopen."""
    space_keys: int
    """Records loaded before the disk and memory figures."""
    killed_states: tuple[str, ...] = ("pending_runs", "mid_flush")
    """The kill points of :mod:`benchmarks.recovery` whose reopens ``peers.reopen`` times."""
    pending_commits: int = 8
    """Commits whose index runs are pending in the short-scan figure's second store."""
    threads: int = 16
    seed: int = 0


FULL = PeerSettings("full", records=1_000_000, ops=300_000, scan_ops=30_000, short_scans=20_000,
                    scan_seconds=3.0,
                    repeats=3, durable_seconds=3.0, reopen_keys=5_000_000, space_keys=5_000_000)
QUICK = PeerSettings("quick", records=100_000, ops=50_000, scan_ops=5_000, short_scans=2_000,
                     scan_seconds=1.0,
                     repeats=3, durable_seconds=1.0, reopen_keys=50_000, space_keys=200_000)
TINY = PeerSettings("tiny", records=3_000, ops=3_000, scan_ops=600, short_scans=200, scan_seconds=0.2,
                    repeats=1,
                    durable_seconds=0.3, reopen_keys=3_000, space_keys=5_000, pending_commits=4,
                    killed_states=())

#: Targets per entry id (``target`` entries of the JSON): a ratio bound against one peer, or a
#: bound on the entry's own metric.
TARGETS: dict[str, list[dict[str, Any]]] = {
    "peers.ycsb_e": [{"anchor": "lmdb", "min_ratio": 0.8, "text": "YCSB E >= 0.8x py-lmdb"},
                     {"anchor": "rocksdict", "min_ratio": 1.5, "text": "YCSB E >= 1.5x rocksdict"}],
    "peers.gets": [{"anchor": "lmdb", "min_ratio": 0.9, "text": "gets >= 0.9x py-lmdb"}],
    "peers.load": [{"anchor": "lmdb", "min_ratio": 1.0, "text": "load, merge counted, >= 1.0x py-lmdb"},
                   {"anchor": "rocksdict", "min_ratio": 1.0,
                    "text": "load, merge counted, >= 1.0x rocksdict"}],
    "peers.durable_threads": [{"anchor": "rocksdict", "min_ratio": 1.5,
                               "text": "16-thread sync writes >= 1.5x rocksdict"},
                              {"anchor": "fsync_floor", "min_ratio": 0.4,
                               "text": "16-thread sync writes >= 0.4x 16 threads fsyncing their own files"}],
    "peers.durable_single": [{"anchor": "fsync_floor", "max_ratio": 2.0,
                              "text": "one sync put's median <= 2x a new file's fsync + directory fsync"}],
    **{f"peers.reopen_{state}": [{"metric": "slowest_ms", "max": 1000.0,
                                  "text": "open + first get < 1 s, every run"}]
       for state in ("clean", "pending_runs", "mid_flush")},
    "peers.disk": [{"anchor": "rocksdict", "max_ratio": 2.0, "text": "disk <= 2x rocksdict"}],
}

METHOD = (
    "kvlog against py-lmdb, rocksdict (RocksDB) and, where a table store is a fair reference, "
    "sqlite3, in one process (the reopen and space figures in child processes), on the same "
    "records: 16-byte keys (two SplitMix64 words of the record index: distinct, random-looking) "
    "and 100-byte values from numpy.random.default_rng(seed) (incompressible). Within each repeat "
    "every contender runs once, in an order turned by one each repeat, so drifting load hits all "
    "alike; figures are medians of `repeats` runs, ratios are kvlog / peer of the medians, and "
    "`paired_ratios` (kvlog's run i / the peer's run i) give their range. Durations come from "
    "time.perf_counter; every timed write run starts after gc.collect() and os.sync(). kvlog "
    "uses the default StoreConfig unless an entry says otherwise. Each entry's method states "
    "what each side does and how durable its writes are. `speedup` > 1 means kvlog is faster. "
    "Targets are printed with the figures (`target`, `met`), never asserted."
)


# -- entries -------------------------------------------------------------------------------------

def _evaluate(target: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    out = dict(target)
    if "anchor" in target:
        value = entry["ratios"].get(target["anchor"], {}).get("ratio")
        out["value"] = value
        if "min_ratio" in target:
            out["speedup_target"] = target["min_ratio"] if entry["higher_is_better"] else None
            out["met"] = None if value is None else bool(value >= target["min_ratio"])
        else:
            out["speedup_target"] = None if entry["higher_is_better"] else 1.0 / target["max_ratio"]
            out["met"] = None if value is None else bool(value <= target["max_ratio"])
    else:
        value = entry.get(target["metric"])
        out["value"] = value
        out["met"] = None if value is None else bool(value < target["max"])
    return out


def peer_entry(bench_id: str, title: str, method: str, subject: dict[str, Any],
               anchors: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """An entry in the main suite's shape, with each anchor's paired-ratio range and the targets."""
    for anchor in anchors:
        paired = [k / a for k, a in zip(subject["runs"], anchor["runs"], strict=False) if a]
        anchor.setdefault("paired_ratios", paired)
    entry = make_entry(bench_id, "peers", title, method, subject, anchors, **extra)
    for anchor in anchors:
        paired = anchor["paired_ratios"]
        entry["ratios"][anchor["key"]]["range"] = [min(paired), max(paired)] if paired else None
    targets = [_evaluate(t, entry) for t in TARGETS.get(bench_id, [])]
    if targets:
        entry["target"] = targets[0]
        entry["targets"] = targets
    return entry


def _failed(bench_id: str, title: str, status: str, reason: str) -> dict[str, Any]:
    entry = failed_entry(bench_id, "peers", title, status, reason)
    targets = [{**t, "value": None, "met": None} for t in TARGETS.get(bench_id, [])]
    if targets:
        entry["target"], entry["targets"] = targets[0], targets
    return entry


def durability_text(*keys: str) -> str:
    """The durability statements of the named contenders, for an entry's method."""
    classes = {c.key: c for c in (KvlogPeer, LmdbPeer, RocksdictPeer, SqlitePeer)}
    return " Durability: " + "; ".join(classes[k].durability for k in keys) + "."


# -- the run's context ---------------------------------------------------------------------------

class PeerContext:
    """Settings, records, a work directory, and the stores the load leaves for the reads."""

    def __init__(self, settings: PeerSettings, work: Path, bar: Progress) -> None:
        self.settings = settings
        self.work = work
        self.bar = bar
        self.keys = make_keys(0, settings.records, settings.seed)
        self.values = make_values(0, settings.records, settings.seed)
        self.loaded: dict[str, Peer] = {}
        self._dirs = 0

    def new_dir(self, name: str) -> Path:
        self._dirs += 1
        return self.work / f"{self._dirs:03d}-{name}"

    def map_size(self, records: int) -> int:
        return records * 1024 + 64 * MiB

    def open(self, key: str, path: Path, **settings: Any) -> Peer:
        if key == "kvlog":
            return KvlogPeer(path, **settings)
        if key == "lmdb":
            return LmdbPeer(path, map_size=self.map_size(2 * self.settings.records))
        if key == "rocksdict":
            return RocksdictPeer(path)
        return SqlitePeer(path)

    def drop(self, peer: Peer) -> None:
        peer.close()
        shutil.rmtree(peer.path, ignore_errors=True)

    def close(self) -> None:
        for peer in self.loaded.values():
            self.drop(peer)
        self.loaded.clear()


def turned(names: Sequence[str], repeat: int) -> list[str]:
    """``names`` turned by ``repeat`` places: each contender runs first in turn."""
    k = repeat % len(names)
    return [*names[k:], *names[:k]]


def digest(pairs: Iterator[tuple[bytes, bytes]] | Any) -> tuple[int, str]:
    """How many pairs, and a hash of them in order: stores holding the same data agree."""
    h = hashlib.blake2b(digest_size=16)
    count = 0
    for key, value in pairs:
        h.update(key)
        h.update(value)
        count += 1
    return count, h.hexdigest()


# -- load, gets, scans ---------------------------------------------------------------------------

LOAD_NAMES = {"lmdb": "py-lmdb, one write txn + env.sync()", "rocksdict": "rocksdict puts + flush()",
              "sqlite": "sqlite3 executemany, one txn + checkpoint"}


def bench_load(ctx: PeerContext) -> dict[str, Any]:
    """Bulk load: kvlog's puts + flush + index merge vs each peer's bulk path."""
    s = ctx.settings
    n = len(ctx.keys)
    names = ("kvlog", "lmdb", "rocksdict", "sqlite")
    runs: dict[str, list[float]] = {k: [] for k in names}
    unmerged: list[float] = []
    merge_s: list[float] = []
    began = perf_counter()
    for r in range(s.repeats):
        for name in turned(names, r):
            ctx.bar.describe(f"peers: load {n:,} records ({name})")
            peer = ctx.open(name, ctx.new_dir(f"load-{name}"))
            records = list(zip(ctx.keys, ctx.values, strict=True))
            quiesce()
            if isinstance(peer, KvlogPeer):
                put = peer.store.put
                t0 = perf_counter()
                for key, value in records:
                    put(key, value)
                peer.store.flush()
                t1 = perf_counter()
                settle_index(peer.store)
                t2 = perf_counter()
                unmerged.append(n / (t1 - t0))
                merge_s.append(t2 - t1)
                runs[name].append(n / (t2 - t0))
            else:
                t0 = perf_counter()
                peer.load(records)
                runs[name].append(n / (perf_counter() - t0))
            if r == s.repeats - 1:
                ctx.loaded[name] = peer  # the last loads serve the gets and the scans
            else:
                ctx.drop(peer)
    method = (
        f"{n:,} records into a new, empty store per run. kvlog: store.put(key, value) for every "
        f"record, store.flush(), then the key index's pending runs merged into its B-tree "
        f"(Store.log.settle_index(), the merge a quiet store runs in the background), all inside "
        f"the timer: records/s = n / (puts + flush + merge). py-lmdb: every record in one write "
        f"transaction, commit and env.sync() included. rocksdict: Rdict.put of every record "
        f"(WAL, not synced), then Rdict.flush() (memtables written to table files, synced). "
        f"sqlite3: executemany of INSERT OR REPLACE in one transaction, COMMIT and "
        f"wal_checkpoint(FULL) included. All "
        f"four end durable. Beside the anchors: kvlog's puts + flush without the merge "
        f"(`context.unmerged`) and the merge's seconds (`merge_s`)."
        + durability_text("kvlog", "sqlite")
    )
    return peer_entry(
        "peers.load", f"bulk load, {n:,} puts + flush, index merge counted", method,
        measurement("kvlog", "kvlog puts + flush + merge", "records/s", runs["kvlog"], merge_s=merge_s),
        [measurement(k, LOAD_NAMES[k], "records/s", runs[k]) for k in names[1:]],
        seconds=perf_counter() - began,
        context={"unmerged": measurement("unmerged", "kvlog puts + flush, merge not counted",
                                         "records/s", unmerged)},
    )


def _timed_reads(ctx: PeerContext, label: str, fns: dict[str, Callable[[], int]], expect: int,
                 unit_count: int) -> dict[str, list[float]]:
    """Run each of ``fns`` once per repeat, interleaved; each returns what it found (checked)."""
    runs: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(ctx.settings.repeats):
        for name in turned(list(fns), r):
            ctx.bar.describe(f"peers: {label} ({name})")
            gc.collect()
            t0 = perf_counter()
            got = fns[name]()
            runs[name].append(unit_count / (perf_counter() - t0))
            if got != expect:
                raise AssertionError(f"{name}: {label} found {got}, not {expect}")
    return runs


def bench_gets(ctx: PeerContext) -> dict[str, Any]:
    """Random gets of every loaded key, uniform order."""
    n = len(ctx.keys)
    order = np.random.default_rng(ctx.settings.seed + 7).permutation(n)
    probe = [ctx.keys[i] for i in order]
    peers = ctx.loaded
    lmdb_peer = peers["lmdb"]
    assert isinstance(lmdb_peer, LmdbPeer)

    def gets(peer: Peer) -> Callable[[], int]:
        def run() -> int:
            get = peer.get
            return sum(1 for k in probe if get(k) is not None)
        return run

    def lmdb_one_txn() -> int:
        with lmdb_peer.env.begin() as txn:
            get = txn.get
            return sum(1 for k in probe if get(k) is not None)

    fns = {name: gets(peers[name]) for name in ("kvlog", "lmdb", "rocksdict", "sqlite")}
    fns["lmdb_one_txn"] = lmdb_one_txn
    began = perf_counter()
    runs = _timed_reads(ctx, f"{n:,} random gets", fns, n, n)
    for i in order[:1000]:
        want = ctx.values[i]
        for name in ("kvlog", "lmdb", "rocksdict", "sqlite"):
            if peers[name].get(ctx.keys[i]) != want:
                raise AssertionError(f"{name} returned a wrong value")
    names = {"lmdb": "py-lmdb get, a read txn per get", "lmdb_one_txn": "py-lmdb get, one read txn for all",
             "rocksdict": "rocksdict get", "sqlite": "sqlite3 SELECT by primary key"}
    method = (
        f"{n:,} gets of every loaded key in a random permutation (numpy default_rng), on the stores "
        f"the last load left (kvlog's index merged; rocksdict's table files flushed). kvlog: "
        f"store.get. py-lmdb: a read transaction per get, what a user serving independent reads "
        f"writes (the target's anchor), and one read transaction for all gets, its floor. "
        f"rocksdict: Rdict.get. sqlite3: SELECT v WHERE k = ?. Every get must find its key; "
        f"1,000 values are checked against the loaded ones, untimed."
    )
    return peer_entry(
        "peers.gets", f"random gets, {n:,} keys", method,
        measurement("kvlog", "kvlog get", "gets/s", runs["kvlog"]),
        [measurement(k, names[k], "gets/s", runs[k]) for k in ("lmdb", "lmdb_one_txn", "rocksdict", "sqlite")],
        seconds=perf_counter() - began,
    )


def bench_full_scan(ctx: PeerContext) -> dict[str, Any]:
    """A full scan of the loaded records."""
    n = len(ctx.keys)
    peers = ctx.loaded
    sums = {name: digest(peers[name].scan_all()) for name in ("kvlog", "lmdb", "rocksdict", "sqlite")}
    if len(set(sums.values())) != 1 or sums["kvlog"][0] != n:
        raise AssertionError(f"the full scans disagree: {sums}")

    def count(peer: Peer) -> Callable[[], int]:
        def run() -> int:
            return sum(1 for _ in peer.scan_all())
        return run

    began = perf_counter()
    runs = _timed_reads(ctx, f"full scan of {n:,} records",
                        {name: count(peers[name]) for name in ("kvlog", "lmdb", "rocksdict", "sqlite")}, n, n)
    names = {"lmdb": "py-lmdb cursor", "rocksdict": "rocksdict items()", "sqlite": "sqlite3 SELECT ORDER BY k"}
    method = (
        f"Iterate every (key, value) pair of the {n:,} loaded records in key order: kvlog "
        f"store.scan(); py-lmdb a cursor of one read transaction; rocksdict Rdict.items(); "
        f"sqlite3 SELECT k, v ORDER BY k. Before the timed runs the four scans are checked to "
        f"return the same pairs in the same order (count and hash)."
    )
    return peer_entry(
        "peers.scan", f"full scan, {n:,} records", method,
        measurement("kvlog", "kvlog scan()", "records/s", runs["kvlog"]),
        [measurement(k, names[k], "records/s", runs[k]) for k in ("lmdb", "rocksdict", "sqlite")],
        seconds=perf_counter() - began,
    )


def _pending_store(ctx: PeerContext) -> tuple[KvlogPeer, int | None]:
    """A kvlog store holding the loaded records with the last commits' index runs pending."""
    s = ctx.settings
    peer = KvlogPeer(ctx.new_dir("short-scans-pending"), background_compaction=False,
                     flush_interval_ms=0, flush_bytes=1 << 50, max_unflushed_bytes=1 << 50)
    n = len(ctx.keys)
    per_commit = -(-n // s.pending_commits)
    for start in range(0, n, per_commit):
        for key, value in zip(ctx.keys[start:start + per_commit], ctx.values[start:start + per_commit],
                              strict=True):
            peer.store.put(key, value)
        peer.store.flush()
    try:
        runs: int | None = int(peer.store.log.snapshot(lambda r: r.runs_pending()))
    except AttributeError:  # a kvlog that counts its pending runs another way
        runs = None
    return peer, runs


def bench_short_scans(ctx: PeerContext) -> list[dict[str, Any]]:
    """Scans of 1..100 keys from random starts, kvlog with its index merged and with runs pending."""
    s = ctx.settings
    n = len(ctx.keys)
    rng = np.random.default_rng(s.seed + 13)
    starts = [ctx.keys[i] for i in rng.integers(0, n, size=s.short_scans)]
    lengths = rng.integers(1, MAX_SCAN_LENGTH + 1, size=s.short_scans).tolist()
    total = int(sum(lengths))
    peers = dict(ctx.loaded)
    ctx.bar.describe("peers: short scans, loading a kvlog store with index runs pending")
    pending, runs_pending = _pending_store(ctx)
    peers["kvlog_pending"] = pending
    names = ("kvlog", "kvlog_pending", "lmdb", "rocksdict", "sqlite")
    try:
        check = [(start, length) for start, length in zip(starts[:500], lengths[:500], strict=True)]
        want = [peers["lmdb"].scan(start, length) for start, length in check]
        for name in names:
            if [peers[name].scan(start, length) for start, length in check] != want:
                raise AssertionError(f"{name}: short scans differ from py-lmdb's")

        began = perf_counter()
        expect = sum(len(peers["lmdb"].scan(a, b)) for a, b in zip(starts, lengths, strict=True))
        runs: dict[str, list[float]] = {k: [] for k in names}
        done: dict[str, list[int]] = {k: [] for k in names}
        for r in range(s.repeats):
            for name in turned(names, r):
                ctx.bar.describe(f"peers: short scans, {s.scan_seconds:g} s ({name})")
                count, elapsed = _scans_for(peers[name], starts, lengths, s.scan_seconds)
                runs[name].append(count / elapsed)
                done[name].append(count)
    finally:
        ctx.drop(pending)
    labels = {"lmdb": "py-lmdb cursor set_range, a read txn per scan",
              "rocksdict": "rocksdict items(from_key=...)", "sqlite": "sqlite3 SELECT k >= ? LIMIT n"}
    method = (
        f"Time-bounded runs of {s.scan_seconds:g} s, each going through a list of {s.short_scans:,} "
        f"scans from its start (again from the first when it ends), each scan from a loaded key "
        f"drawn uniformly (numpy default_rng) for a length drawn uniformly in 1..{MAX_SCAN_LENGTH} "
        f"({total:,} keys asked for in the list, {expect:,} returned); `scans_per_run` gives each "
        f"run's count. kvlog: list(islice(store.scan(start), length)). py-lmdb: a read "
        f"transaction, cursor.set_range(start), then `length` pairs. rocksdict: "
        f"islice(Rdict.items(from_key=start), length). sqlite3: SELECT k, v WHERE k >= ? ORDER BY "
        f"k LIMIT ?. Unit: scans/s. The first 500 scans of every contender are checked to equal "
        f"py-lmdb's, untimed. {{store}}"
    )
    settled = ("kvlog: the store the last load left, its key index merged (no index runs pending).")
    pending_text = (
        f"kvlog: a second store holding the same records, loaded with background_compaction=False, "
        f"flush_interval_ms=0 and no size-triggered flush, in {s.pending_commits} commits "
        f"(store.flush()) whose index runs stay pending ({runs_pending} pending; the merge runs "
        f"past index_run_limit, when writers are quiet or at close, none of which happens here); "
        f"the peers are the same as in peers.short_scans."
    )
    out = []
    for bench_id, key, title, text in (
            ("peers.short_scans", "kvlog", "short scans of 1..100 keys, index merged", settled),
            ("peers.short_scans_pending", "kvlog_pending",
             f"short scans of 1..100 keys, {runs_pending} index runs pending", pending_text)):
        out.append(peer_entry(
            bench_id, title, method.replace("{store}", text),
            measurement("kvlog", "kvlog scan + islice", "scans/s", runs[key], scans_per_run=done[key]),
            [measurement(k, labels[k], "scans/s", runs[k], scans_per_run=done[k])
             for k in ("lmdb", "rocksdict", "sqlite")],
            seconds=perf_counter() - began if key == "kvlog" else 0.0,
            index_runs_pending=runs_pending if key == "kvlog_pending" else 0,
        ))
    return out


def _scans_for(peer: Peer, starts: Sequence[bytes], lengths: Sequence[int],
               seconds: float) -> tuple[int, float]:
    """Scans of ``peer`` through the list (cycled) until ``seconds`` pass: (scans, elapsed)."""
    scan = peer.scan
    gc.collect()
    count = 0
    t0 = perf_counter()
    end = t0 + seconds
    now = t0
    size = len(starts)
    while now < end:
        i = count % size
        scan(starts[i], lengths[i])
        count += 1
        if count % 16 == 0 or count == 1:
            now = perf_counter()
    return count, perf_counter() - t0


# -- YCSB -----------------------------------------------------------------------------------------

def bench_ycsb(ctx: PeerContext) -> list[dict[str, Any]]:
    """YCSB A-F on three stores loaded alike, each workload's contenders interleaved."""
    s = ctx.settings
    n = len(ctx.keys)
    began = perf_counter()
    peers: dict[str, Peer] = {}
    try:
        for name in KV_PEERS:
            ctx.bar.describe(f"peers: YCSB, loading {n:,} records ({name})")
            peers[name] = ctx.open(name, ctx.new_dir(f"ycsb-{name}"))
            peers[name].load(zip(ctx.keys, ctx.values, strict=True))
        order = ("A", "B", "C", "F", "D", "E")
        runs: dict[str, dict[str, list[float]]] = {w: {k: [] for k in KV_PEERS} for w in order}
        deferred: dict[str, list[float]] = {w: [] for w in order}
        count = n
        for r in range(s.repeats):
            for w in order:
                ops = s.scan_ops if w == "E" else s.ops
                stream = make_stream(WORKLOADS[w], count, ops, s.seed + r)
                outcomes = {}
                for name in turned(KV_PEERS, r):
                    ctx.bar.describe(f"peers: YCSB {w}, {ops:,} operations, run {r + 1} ({name})")
                    rate, outcomes[name], merge = _ycsb_run(peers[name], stream)
                    runs[w][name].append(rate)
                    if merge is not None:
                        deferred[w].append(merge)
                if len({(o.found, o.scanned) for o in outcomes.values()}) != 1:
                    raise AssertionError(f"YCSB {w}: the stores answered differently: {outcomes}")
                count += stream.inserts
        ctx.bar.describe("peers: YCSB, checking that the stores hold the same records")
        sums = {name: digest(peer.scan_all()) for name, peer in peers.items()}
        if len(set(sums.values())) != 1 or sums["kvlog"][0] != count:
            raise AssertionError(f"after YCSB the stores differ: {sums}")
    finally:
        for peer in peers.values():
            ctx.drop(peer)
    method = (
        f"YCSB core workload {{w}} ({{title}}), {{ops:,}} operations per run on stores loaded with "
        f"{n:,} records (untimed) and left by the workloads before it; the workloads run in "
        f"YCSB's order A, B, C, F, D, E, {s.repeats} times, each time drawing a new stream. "
        f"Request distribution: scrambled zipfian (constant {ZIPFIAN_CONSTANT}, ranks over 10^10 "
        f"items hashed with FNV-1a onto the records), latest for D; E's scans start at a zipfian "
        f"key and read a length uniform in 1..{MAX_SCAN_LENGTH}; inserts write new records. "
        f"Every operation is drawn beforehand (benchmarks.ycsb), the same stream for the three "
        f"stores, which run one after the other, in an order turned each repeat. A run times "
        f"the operations and the call that makes its writes durable (kvlog flush(), py-lmdb "
        f"env.sync(), rocksdict flush_wal(sync=True)). Reads: kvlog store.get, py-lmdb a read "
        f"transaction per get, rocksdict get; scans: as in peers.short_scans; a read-modify-write "
        f"reads the value and writes its first half anew (py-lmdb in one write transaction, "
        f"kvlog and rocksdict a get then a put). After each kvlog run its pending index runs are "
        f"merged, untimed, so that no deferred work runs during a peer's run; its seconds are in "
        f"`deferred_merge_s` and `context.merge_counted` counts them. The stores must find the "
        f"same number of keys and return the same number of scanned pairs in every run, and hold "
        f"the same records (count and hash of a full scan) at the end. Unit: operations/s."
        + durability_text(*KV_PEERS)
    )
    names = {"lmdb": "py-lmdb, a txn per operation", "rocksdict": "rocksdict"}
    out = []
    for w in order:
        ops = s.scan_ops if w == "E" else s.ops
        kv = runs[w]["kvlog"]
        merged = [ops / (ops / rate + m) for rate, m in zip(kv, deferred[w], strict=True)]
        out.append(peer_entry(
            f"peers.ycsb_{w.lower()}", f"YCSB {w}: {WORKLOADS[w].title}",
            method.format(w=w, title=WORKLOADS[w].title, ops=ops),
            measurement("kvlog", "kvlog", "ops/s", kv, deferred_merge_s=deferred[w]),
            [measurement(k, names[k], "ops/s", runs[w][k]) for k in ("lmdb", "rocksdict")],
            seconds=perf_counter() - began if w == "A" else 0.0, ops=ops,
            context={"merge_counted": measurement("merge_counted", "kvlog, deferred merge counted",
                                                  "ops/s", merged)},
        ))
    return out


def _ycsb_run(peer: Peer, stream: Stream) -> tuple[float, Any, float | None]:
    """One timed run: (ops/s, outcome, kvlog's deferred merge seconds or None)."""
    quiesce()
    t0 = perf_counter()
    outcome = run_stream(peer, stream)
    peer.durable()
    rate = len(stream) / (perf_counter() - t0)
    merge = None
    if isinstance(peer, KvlogPeer):
        t1 = perf_counter()
        settle_index(peer.store)
        merge = perf_counter() - t1
    return rate, outcome, merge


# -- the suite -----------------------------------------------------------------------------------

Step = tuple[str, str, Callable[[PeerContext], "dict[str, Any] | list[dict[str, Any]]"]]


def _steps() -> list[Step]:
    from benchmarks.peer_system import (
        bench_durable_single,
        bench_durable_threads,
        bench_reopen,
        bench_space,
    )

    return [
        ("peers.load", "bulk load, merge counted", bench_load),
        ("peers.gets", "random gets", bench_gets),
        ("peers.scan", "full scan", bench_full_scan),
        ("peers.short_scans", "short scans", bench_short_scans),
        ("peers.ycsb", "YCSB A-F", bench_ycsb),
        ("peers.durable_threads", "16-thread sync writes", bench_durable_threads),
        ("peers.durable_single", "one-thread sync write latency", bench_durable_single),
        ("peers.reopen", "reopen after close and after kill -9", bench_reopen),
        ("peers.space", "disk and RssAnon after a load", bench_space),
    ]


#: Steps that read the stores ``peers.load`` leaves.
NEEDS_LOAD = {"peers.gets", "peers.scan", "peers.short_scans"}


def run_peer_benchmarks(
    settings: PeerSettings, out_dir: str | Path | None, *, only: Sequence[str] | None = None,
    work_dir: str | Path | None = None, progress: bool | None = None,
) -> dict[str, Any]:
    """Run the peer suite (``only``: step id prefixes); write ``out_dir/peers.json`` (quick:
    ``peers-quick.json``) with its chart; return the document."""
    began = perf_counter()
    started = datetime.fromtimestamp(kvlog.SystemClock().now_ms() / 1000, UTC)
    steps = _steps()
    chosen = {st[0] for st in steps if not only or any(st[0].startswith(o) for o in only)}
    if chosen & NEEDS_LOAD:
        chosen.add("peers.load")
    entries: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="kvlog-bench-peers-", dir=work_dir))
    info = machine_info(work)
    info["load_average_start"] = load_average()
    try:
        with Progress(len(chosen), progress) as bar:
            ctx = PeerContext(settings, work, bar)
            try:
                for step_id, title, fn in steps:
                    if step_id not in chosen:
                        continue
                    bar.describe(title)
                    entries += run_step(partial(fn, ctx), partial(_failed, step_id, title, "error"))
                    bar.advance()
            finally:
                ctx.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info["load_average_end"] = load_average()
    document: dict[str, Any] = {
        "schema": SCHEMA, "title": "kvlog against its peers", "mode": settings.mode, "date": started.isoformat(timespec="seconds"),
        "wall_seconds": perf_counter() - began, "machine": info,
        "settings": {**asdict(settings), "key_bytes": KEY_BYTES, "value_bytes": VALUE_BYTES},
        "store_config": kvlog.StoreConfig().to_dict(), "method": METHOD,
        "durability": {c.key: c.durability for c in (KvlogPeer, LmdbPeer, RocksdictPeer, SqlitePeer)},
        "targets": TARGETS, "benchmarks": entries,
    }
    if out_dir is not None:
        name = "peers.json" if settings.mode == "full" else f"peers-{settings.mode}.json"
        save_results(document, Path(out_dir) / name)
    return document


def peer_settings_for(mode: str, **overrides: Any) -> PeerSettings:
    """The preset ``full``, ``quick`` or ``tiny`` with ``overrides`` applied."""
    base = {"full": FULL, "quick": QUICK, "tiny": TINY}[mode]
    return replace(base, **overrides) if overrides else base
