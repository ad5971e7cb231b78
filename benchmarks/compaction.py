"""Compaction benchmarks: the offset map, a cleaning round against the I/O floor, requests, memory.

Each figure sits next to an anchor measured in the same run and is reported as
a ratio (``docs/benchmarks.rst`` explains the method and the figures):

``compaction.map_capacity`` / ``map_build`` / ``map_memory`` (a)
    distinct keys an :class:`~kvlog.compaction.OffsetMap` of
    ``offset_map_bytes`` holds (anchors: the target of 7 M keys per 128 MiB,
    Kafka's 24 bytes per entry, WarpStream's 41); the time to fingerprint and
    insert N distinct keys fed in Arrow-batch-sized chunks (anchor: a Python
    dict ``key -> offset`` built from the same chunks); the peak traced memory
    (tracemalloc) while doing so (anchor: ``offset_map_bytes``).
``compaction.one_round`` (a)
    a real cleaning round of a one-partition store of N distinct keys, which
    must end in one round (not partial), against the I/O floor below.
``compaction.vs_io_floor`` (b)
    a forced cleaning round of R records over K keys (100-byte values, 8
    partitions) against the I/O floor measured in the same run: every input
    data file read twice with pyarrow (``ipc.open_file`` + ``read_all``) and the
    surviving records written once (``ipc.new_file``, same compression, fsync).
    Target: at most 2.0x the floor.
``compaction.requests_s3`` (c)
    requests of one job on SeaweedFS against 1, 4 and 16 input files, from
    ``storage.requests``; expected: 2 stream GETs per input file.
``compaction.memory`` and ``compaction.memory_partitions`` (d)
    peak ``RssAnon`` growth (sampled every 50 ms by a thread) of the fresh
    process that compacts the store of ``one_round`` (one partition) and of
    ``vs_io_floor`` (8 partitions), against ``offset_map_bytes + 64 MiB``.

Stores are loaded with a bulk loader that writes exactly what a store's
flusher writes (one L0 data file per flush of ``flush_bytes``, holding every
partition's batch, committed by an idempotent producer through
:meth:`kvlog.Log.append_batches`), but builds the Arrow batches from numpy
buffers instead of one ``put`` call per record. Compactions run in a fresh
process (``python -m benchmarks.compaction --child-compact DIR``) so their
memory can be measured.

Run ``python -m benchmarks.compaction [--quick] [--out-dir DIR]``; the
benchmark suite calls :func:`run_compaction_benchmarks`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tracemalloc
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.ipc as ipc

import kvlog
from benchmarks.children import child_env
from benchmarks.data import KEY_BYTES, key_bytes, keys_at, median
from benchmarks.machine import machine_info
from benchmarks.report import save_results, text_table
from benchmarks.rss import RssSampler
from benchmarks.sizing import records_per_flush
from kvlog.compaction import SLOT_BYTES, OffsetMap, capacity_for, fingerprints
from kvlog.format import SCHEMA as DATA_SCHEMA
from kvlog.log import PendingBatch, partition_for_key
from kvlog.meta import LiveFile

__all__ = [
    "FULL", "QUICK", "SCHEMA", "TINY", "Sizes", "ascending_key_order", "batch_records", "bulk_load",
    "format_table", "io_floor", "live_files", "loadavg", "main", "make_entry", "measure",
    "partition_table", "records_per_file", "run_compaction_benchmarks",
]

SCHEMA = "kvlog-bench-compaction/1"
MiB = 1024 * 1024
#: The target: at least 7 M distinct keys per 128 MiB of offset map (docs/compaction.rst).
TARGET_KEYS_PER_128_MIB = 7_000_000
KAFKA_ENTRY_BYTES = 24
WARPSTREAM_ENTRY_BYTES = 41
#: (b): compaction at most this many times the I/O floor.
FLOOR_TARGET_RATIO = 2.0
#: (d): peak RssAnon growth at most offset_map_bytes + this.
RSS_SLACK_BYTES = 64 * MiB
RSS_INTERVAL_S = 0.05
#: Producer sequences wrap after ``2**31 - 1`` to 0, as in Kafka (docs/log.rst).
SEQUENCE_WRAP = 2**31


@dataclass(frozen=True)
class Sizes:
    """The sizes of one run."""

    mode: str
    map_keys: int
    """(a) distinct keys fingerprinted and inserted into the offset map."""
    map_bytes: int
    """(a) ``offset_map_bytes`` of the map, of the one-round store and of the memory run."""
    round_keys: int
    """(a) distinct keys of the one-partition store compacted in one round (0: skip)."""
    records: int
    """(b) records of the store compacted against the I/O floor."""
    keys: int
    """(b) distinct keys those records are drawn from (uniformly)."""
    floor_map_bytes: int = 128 * MiB
    """(b) ``offset_map_bytes`` of the store compacted against the floor."""
    value_bytes: int = 100
    partitions: int = 8
    chunk: int = 65_536
    """Keys per chunk fed to the offset map (an Arrow batch's worth)."""
    flush_bytes: int = 64 * MiB
    """Records per loaded data file = flush_bytes // (key + value + the flusher's overhead)."""
    floor_repeats: int = 3
    request_files: tuple[int, ...] = (1, 4, 16)
    request_records_per_file: int = 4096
    request_keys: int = 8192
    seaweedfs: bool = True
    seed: int = 0


FULL = Sizes("full", map_keys=7_000_000, map_bytes=128 * MiB, round_keys=7_000_000,
             records=10_000_000, keys=1_000_000)
QUICK = Sizes("quick", map_keys=200_000, map_bytes=4 * MiB, round_keys=200_000,
              records=200_000, keys=20_000, floor_map_bytes=4 * MiB, request_records_per_file=1024,
              request_keys=2048)
TINY = Sizes("tiny", map_keys=20_000, map_bytes=1 * MiB, round_keys=20_000, records=30_000,
             keys=3_000, floor_map_bytes=1 * MiB, flush_bytes=1 * MiB, floor_repeats=1,
             request_records_per_file=256, request_keys=512)

METHOD = (
    "All durations come from time.perf_counter; data from numpy.random.default_rng(seed). Keys are "
    "16 bytes (two SplitMix64 words of the key index: distinct, random-looking), values "
    "`value_bytes` random bytes (incompressible). Stores live on the local disk of the work "
    "directory (see machine.work_dir_filesystem), except the SeaweedFS ones (a `weed mini` on "
    "loopback). Stores are loaded by a bulk loader that writes what the flusher would write with "
    "flush_bytes = `flush_bytes` (one L0 file per flush holding every partition's batch, "
    "committed by an idempotent producer through Log.append_batches) from numpy buffers. Each "
    "compaction is one Store.compact(force=True) in a fresh process (python -m "
    "benchmarks.compaction --child-compact) with background_compaction=False, flush_interval_ms=0 "
    "and the Python garbage collector on, as in real use; its time is the compact() call alone. "
    "The I/O floor runs in the parent process after the compaction, on the same input files "
    "(still on disk: replaced inputs are deleted only by GC after file_delete_delay_ms), so both "
    "read from the same page cache. The machine is a shared virtual machine whose timings vary by "
    "up to 2x from run to run: figures are medians of repeated runs where the benchmark says so. "
    "The machine is shared: the load average before and after "
    "each benchmark is recorded (`loadavg`); ratios of figures measured minutes apart are only as "
    "steady as that load."
)


# -- helpers -----------------------------------------------------------------------------------

def loadavg() -> list[float]:
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


def measure(key: str, name: str, unit: str, runs: Sequence[float], **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "name": name, "unit": unit, "value": median(runs),
                           "runs": [float(r) for r in runs]}
    out.update(extra)
    return out


def make_entry(bench_id: str, title: str, method: str, subject: dict[str, Any], anchors: list[dict[str, Any]],
           *, higher_is_better: bool, seconds: float, target: dict[str, Any] | None = None,
           group: str = "compaction", **extra: Any) -> dict[str, Any]:
    """A benchmark's entry, in the shape of the general suite's (``benchmarks.suite``)."""
    ratios: dict[str, dict[str, float | None]] = {}
    for anchor in anchors:
        value = anchor["value"]
        ratio = subject["value"] / value if value else None
        speedup = None if not ratio else (ratio if higher_is_better else 1.0 / ratio)
        ratios[anchor["key"]] = {"ratio": ratio, "speedup": speedup}
    entry: dict[str, Any] = {
        "id": bench_id, "group": group, "title": title, "status": "ok",
        "unit": subject["unit"], "higher_is_better": higher_is_better, "method": method,
        "subject": subject, "anchors": anchors, "ratios": ratios, "seconds": seconds,
    }
    if target is not None:
        entry["target"] = target
    entry.update(extra)
    return entry


def _failed(bench_id: str, title: str, status: str, reason: str) -> dict[str, Any]:
    return {"id": bench_id, "group": "compaction", "title": title, "status": status, "reason": reason,
            "subject": None, "anchors": [], "ratios": {}}


def key_list(indices: npt.NDArray[np.uint64], seed: int = 0) -> list[bytes]:
    """The keys of ``indices`` (as :func:`benchmarks.data.keys_at`)."""
    return keys_at(indices, seed)


def ascending_key_order(n: int, seed: int = 0) -> npt.NDArray[np.uint64]:
    """The key indices ``0 .. n-1`` ordered so that their keys ascend bytewise.

    Appending distinct keys in key order makes every flush extend the LMDB key index at its end
    instead of rewriting most of its pages (which, for millions of random keys, writes tens of
    gigabytes while loading); the offset map still sees the keys in random hash order.
    """
    words = np.frombuffer(key_bytes(np.arange(n, dtype=np.uint64), seed), dtype=">u8").reshape(-1, 2)
    return np.lexsort((words[:, 1], words[:, 0])).astype(np.uint64)


def _fixed_binary(data: bytes, width: int, count: int) -> pa.Array:
    offsets = np.arange(0, width * (count + 1), width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def partition_table(universe: int, partitions: int, seed: int, chunk: int = 262_144) -> npt.NDArray[np.int64]:
    """The partition of every key index below ``universe`` (kvlog's own partition_for_key)."""
    out = np.empty(universe, dtype=np.int64)
    for start in range(0, universe, chunk):
        stop = min(universe, start + chunk)
        keys = key_list(np.arange(start, stop, dtype=np.uint64), seed)
        out[start:stop] = [partition_for_key(k, partitions) for k in keys]
    return out


def records_per_file(sizes: Sizes) -> int:
    """Records of one loaded data file: what one flush of ``flush_bytes`` holds."""
    return records_per_flush(sizes.flush_bytes, KEY_BYTES, sizes.value_bytes)


def bulk_load(the_log: kvlog.Log, key_indices: npt.NDArray[np.uint64], per_file: int, *, seed: int,
              value_bytes: int, partition_of: npt.NDArray[np.int64]) -> dict[str, Any]:
    """Append records with keys ``key_indices`` (in order), ``per_file`` per data file, to
    ``the_log`` (a store's ``store.log``, or a log of :func:`kvlog.log.open_log`) and commit."""
    producer = the_log.producer()
    sequences: dict[int, int] = {}
    files = 0
    began = perf_counter()
    for start in range(0, len(key_indices), per_file):
        idx = key_indices[start : start + per_file]
        parts = partition_of[idx]
        order = np.argsort(parts, kind="stable")
        idx, parts = idx[order], parts[order]
        values = np.random.default_rng([seed, 7, files]).bytes(len(idx) * value_bytes)
        now = the_log.clock.now_ms()
        bounds = np.searchsorted(parts, np.arange(the_log.partitions + 1))
        batches = []
        for p in range(the_log.partitions):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            if lo == hi:
                continue
            n = hi - lo
            records = pa.record_batch([
                _fixed_binary(key_bytes(idx[lo:hi], seed), KEY_BYTES, n),
                _fixed_binary(values[lo * value_bytes : hi * value_bytes], value_bytes, n),
                pa.array(np.full(n, now, dtype=np.int64)),
            ], schema=DATA_SCHEMA)
            seq = sequences.get(p, 0)
            batches.append(PendingBatch(p, records, seq))
            sequences[p] = (seq + n) % SEQUENCE_WRAP
        the_log.append_batches(producer.producer_id, producer.epoch, batches)
        files += 1
    return {"records": int(len(key_indices)), "files": files, "records_per_file": per_file,
            "seconds": perf_counter() - began}


def _store_settings(map_bytes: int, partitions: int, flush_bytes: int) -> dict[str, Any]:
    return {"offset_map_bytes": map_bytes, "background_compaction": False, "flush_interval_ms": 0,
            "flush_bytes": flush_bytes, "max_unflushed_bytes": max(2 * flush_bytes, 16 * MiB),
            "partitions": partitions}


# What a log holds, file by file and batch by batch: Store.stats() counts files and batches but
# does not list them, so these two read one snapshot of the log's metadata (Log.snapshot).

def live_files(the_log: kvlog.Log) -> list[LiveFile]:
    """The live data files of ``the_log`` (``path`` relative to the store's root, ``size``,
    ``level``…)."""
    def read(r: Any) -> list[LiveFile]:
        return [entry for _file_id, entry in r.iter_files()]

    files: list[LiveFile] = the_log.snapshot(read)
    return files


def batch_records(the_log: kvlog.Log) -> list[int]:
    """The records of every live batch of ``the_log``, partition by partition, in offset order."""
    def read(r: Any) -> list[int]:
        return [b.count for p in range(the_log.partitions) for b in r.iter_batches(p, 0)]

    counts: list[int] = the_log.snapshot(read)
    return counts


# -- the compaction child ------------------------------------------------------------------------

def child_compact(path: str, settings: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: open the store at ``path``, compact it once, report time and RssAnon."""
    import kvlog as kv

    # Warm what every kvlog process loads on its first batch (pyarrow's lazy imports), so the
    # baseline holds it and the compaction's figures do not.
    pa.array([b"x"], type=pa.binary()).to_pylist()
    store = kv.open(path, **settings)
    try:
        gc.collect()
        sampler = RssSampler(RSS_INTERVAL_S)
        baseline = sampler.sample()
        sampler.start()
        t0 = perf_counter()
        report = store.compact(force=True)
        seconds = perf_counter() - t0
        peak = sampler.mark()
        sampler.stop()
    finally:
        store.close()
    from benchmarks.machine import read_status_kib

    return {"compact_s": seconds, "baseline_kib": baseline, "peak_kib": peak,
            "growth_kib": peak - baseline, "samples": sampler.samples,
            "vm_hwm_kib": read_status_kib("VmHWM"), "report": report.to_dict()}


def _run_child(path: Path, settings: dict[str, Any]) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.compaction", "--child-compact", str(path),
               "--settings", json.dumps(settings)]
    t0 = perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=child_env())
    if done.returncode != 0:
        raise RuntimeError(f"the compaction process failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = perf_counter() - t0
    return result


# -- the I/O floor -----------------------------------------------------------------------------

def io_floor(inputs: Sequence[Path], survivors: Sequence[pa.Table], scratch: Path, compression: str,
             repeats: int) -> dict[str, Any]:
    """Read every input twice (open_file + read_all), write the survivors once; seconds per run."""
    codec = None if compression == "none" else compression
    runs: list[float] = []
    reads: list[float] = []
    writes: list[float] = []
    for r in range(repeats):
        t0 = perf_counter()
        rows = 0
        for _ in range(2):
            for p in inputs:
                with pa.OSFile(str(p), "rb") as source:
                    rows += ipc.open_file(source).read_all().num_rows
        t1 = perf_counter()
        written = 0
        for i, table in enumerate(survivors):
            target = scratch / f"floor-{r}-{i}.arrow"
            with pa.OSFile(str(target), "wb") as sink:
                with ipc.new_file(sink, table.schema,
                                  options=ipc.IpcWriteOptions(compression=codec)) as writer:
                    writer.write_table(table, max_chunksize=65_536)
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            written += target.stat().st_size
        t2 = perf_counter()
        runs.append(t2 - t0)
        reads.append(t1 - t0)
        writes.append(t2 - t1)
        for i in range(len(survivors)):
            (scratch / f"floor-{r}-{i}.arrow").unlink(missing_ok=True)
    return {"runs_s": runs, "read_twice_s": reads, "write_s": writes, "median_s": median(runs),
            "rows_read": rows, "bytes_written": written,
            "input_bytes": sum(p.stat().st_size for p in inputs), "input_files": len(inputs)}


def _clone_store(source: Path, target: Path) -> None:
    """A copy of a closed local store whose data files are hard links (compaction never changes them)."""
    def link_data(src: str, dst: str) -> None:
        if Path(src).suffix == ".arrow":
            os.link(src, dst)
        else:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link_data)


def _compact_against_floor(store_dir: Path, settings: dict[str, Any], repeats: int,
                           scratch: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Compact the closed store at ``store_dir`` in a child ``repeats`` times (each on a fresh
    clone of the loaded store), then measure the floor on its input files."""
    with kvlog.open(store_dir, read_only=True) as ro:
        inputs = [store_dir / f.path for f in live_files(ro.log)]
        compression = ro.config.compression
    runs = []
    for r in range(1, repeats):
        clone = scratch / f"clone-{r}"
        _clone_store(store_dir, clone)
        try:
            runs.append(_run_child(clone, settings))
        finally:
            shutil.rmtree(clone, ignore_errors=True)
    child = _run_child(store_dir, settings)  # the last run leaves its outputs for the checks below
    runs.append(child)
    child["compact_runs_s"] = [run["compact_s"] for run in runs]
    child["compact_s"] = median(child["compact_runs_s"])
    child["growth_kib"] = max(run["growth_kib"] for run in runs)
    with kvlog.open(store_dir, read_only=True) as ro:
        outputs = [store_dir / f.path for f in live_files(ro.log)]
        stats = ro.stats()
        sizes = batch_records(ro.log)
    child["output_batches"] = len(sizes)
    child["output_batch_max_records"] = max(sizes, default=0)
    survivors = []
    for p in outputs:
        with pa.OSFile(str(p), "rb") as source:
            survivors.append(ipc.open_file(source).read_all())
    floor = io_floor(inputs, survivors, scratch, compression, repeats)
    floor["output_files"] = len(outputs)
    floor["compression"] = compression
    child["store_keys_after"] = stats.get("keys")
    return child, floor


# -- (a) the offset map ------------------------------------------------------------------------

def bench_map(sizes: Sizes) -> list[dict[str, Any]]:
    n, map_bytes, chunk = sizes.map_keys, sizes.map_bytes, sizes.chunk
    load = [loadavg()]
    began = perf_counter()
    seed = 0x6B766C6F67 + sizes.seed
    chunks = [key_list(np.arange(s, min(n, s + chunk), dtype=np.uint64), sizes.seed)
              for s in range(0, n, chunk)]
    gen_s = perf_counter() - began

    # Timed run, no tracing.
    gc.collect()
    t0 = perf_counter()
    omap = OffsetMap(map_bytes, 0.9)
    omap.clear(0)
    alloc_s = perf_counter() - t0
    fp_s = ins_s = 0.0
    start = 0
    by_load: dict[int, list[float]] = {}  # tenth of the table's slots filled -> [keys, seconds]
    for keys in chunks:
        t0 = perf_counter()
        hi, lo = fingerprints(keys, seed)
        t1 = perf_counter()
        tenth = min(9, omap.size * 10 // omap.slots)
        mapped = omap.insert(hi, lo, np.arange(start, start + len(keys), dtype=np.int64))
        t2 = perf_counter()
        ins_s += t2 - t1
        fp_s += t1 - t0
        acc = by_load.setdefault(tenth, [0.0, 0.0])
        acc[0] += len(keys)
        acc[1] += t2 - t1
        if mapped != len(keys):
            raise AssertionError(f"the map filled after {start + mapped:,} of {n:,} keys")
        start += len(keys)
    total_s = alloc_s + fp_s + ins_s
    insert_by_load = [{"slots_filled_from": t / 10, "keys": int(k), "insert_s": sec,
                       "insert_us_per_key": sec / k * 1e6 if k else None}
                      for t, (k, sec) in sorted(by_load.items())]
    size_after = omap.size
    # Correctness: every key of a sample maps to its own offset.
    picks = np.random.default_rng(sizes.seed + 1).integers(0, n, size=min(n, 65_536), dtype=np.uint64)
    hi, lo = fingerprints(key_list(picks, sizes.seed), seed)
    found = omap.lookup(hi, lo)
    wrong = int(np.count_nonzero(found != picks.astype(np.int64)))
    nbytes = omap.nbytes
    del omap, hi, lo, found

    # Traced run: the same work under tracemalloc (the chunks of keys exist before it starts).
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    omap = OffsetMap(map_bytes, 0.9)
    omap.clear(0)
    start = 0
    for keys in chunks:
        hi, lo = fingerprints(keys, seed)
        omap.insert(hi, lo, np.arange(start, start + len(keys), dtype=np.int64))
        start += len(keys)
    # The table lives in an anonymous mapping, which tracemalloc does not see: add its size.
    traced_peak = tracemalloc.get_traced_memory()[1] - base + omap.nbytes
    tracemalloc.stop()
    del omap, hi, lo

    # Anchor: a dict key -> offset from the same chunks (what a map that keeps the keys costs).
    gc.collect()
    t0 = perf_counter()
    table: dict[bytes, int] = {}
    start = 0
    for keys in chunks:
        table.update(zip(keys, range(start, start + len(keys)), strict=True))
        start += len(keys)
    dict_s = perf_counter() - t0
    large_ints = max(0, n - 262)  # ints above 256 are objects of their own
    dict_bytes = sys.getsizeof(table) + n * sys.getsizeof(chunks[0][0]) + large_ints * sys.getsizeof(2**20)
    del table, chunks
    gc.collect()
    load.append(loadavg())

    capacity = capacity_for(map_bytes, 0.9)
    target_keys = TARGET_KEYS_PER_128_MIB * map_bytes // (128 * MiB)
    kafka = int(map_bytes // KAFKA_ENTRY_BYTES * 0.9)
    warpstream = map_bytes // WARPSTREAM_ENTRY_BYTES
    seconds = perf_counter() - began
    common: dict[str, Any] = {"keys": n, "offset_map_bytes": map_bytes, "chunk": chunk, "loadavg": load}
    cap_entry = make_entry(
        "compaction.map_capacity", f"offset map capacity, {map_bytes // MiB} MiB", (
            f"capacity_for(offset_map_bytes, 0.9): {SLOT_BYTES}-byte slots (96-bit fingerprint + "
            f"32-bit relative offset) at load factor 0.9. Anchors: the target of "
            f"{TARGET_KEYS_PER_128_MIB:,} keys per 128 MiB (scaled to this map's size); Kafka's "
            f"{KAFKA_ENTRY_BYTES} bytes per entry at the same load factor; WarpStream's "
            f"{WARPSTREAM_ENTRY_BYTES} bytes per entry. Checked: {n:,} distinct keys inserted into "
            f"one map without it filling, and a sample of {len(picks):,} looked up to their own "
            f"offsets ({wrong} wrong)."),
        measure("kvlog", "kvlog OffsetMap", "keys", [capacity], inserted=size_after,
                 lookup_sample=len(picks), lookup_wrong=wrong),
        [measure("target", "target: 7 M keys per 128 MiB", "keys", [target_keys]),
         measure("kafka_24B", "Kafka, 24 B/entry, load 0.9", "keys", [kafka]),
         measure("warpstream_41B", "WarpStream, 41 B/entry", "keys", [warpstream])],
        higher_is_better=True, seconds=0.0,
        target={"text": f"capacity >= {target_keys:,} keys and all {n:,} keys fit in one pass",
              "value": capacity, "met": bool(capacity >= target_keys and size_after == n and not wrong)},
        **common,
    )
    build_entry = make_entry(
        "compaction.map_build", f"fingerprint + insert {n:,} keys", (
            f"Keys made beforehand in chunks of {chunk:,} (list[bytes], an Arrow batch's worth) and "
            f"kept for every run. kvlog: OffsetMap(offset_map_bytes) + clear(), then per chunk "
            f"fingerprints(keys, seed) and OffsetMap.insert(hi, lo, offsets), timed apart and summed "
            f"(alloc_s, fingerprint_s, insert_s; insert_by_load splits the insert time by the "
            f"fraction of the table's slots filled when each chunk went in). Anchor: "
            f"dict.update(zip(chunk, offsets)) per chunk "
            f"into one dict (a map that keeps the keys). One run each; lower is better."),
        measure("kvlog", "OffsetMap fingerprint + insert", "s", [total_s], alloc_s=alloc_s,
                 fingerprint_s=fp_s, insert_s=ins_s, keys_per_s=n / total_s if total_s else None,
                 insert_by_load=insert_by_load),
        [measure("dict", "Python dict key -> offset", "s", [dict_s],
                  keys_per_s=n / dict_s if dict_s else None)],
        higher_is_better=False, seconds=seconds, key_generation_s=gen_s, **common,
    )
    memory_entry = make_entry(
        "compaction.map_memory", f"traced memory of the map, {n:,} keys", (
            "tracemalloc started after the key chunks were made; the figure is the traced peak "
            "above the traced memory at start while allocating, clearing and filling the map "
            "(numpy reports its buffers to tracemalloc), so it includes the per-chunk temporaries "
            "of fingerprints() and insert(), plus the table's buffer (an anonymous memory mapping, "
            "which tracemalloc does not trace). Anchors: offset_map_bytes; and the memory a dict "
            "key -> offset of the same keys would hold: sys.getsizeof(dict) + the key objects + "
            "the int objects (computed, not traced)."),
        measure("kvlog", "OffsetMap traced peak", "MiB", [traced_peak / MiB], map_buffer_bytes=nbytes),
        [measure("offset_map_bytes", "offset_map_bytes", "MiB", [map_bytes / MiB]),
         measure("dict", "Python dict key -> offset (computed)", "MiB", [dict_bytes / MiB])],
        higher_is_better=False, seconds=0.0, **common,
    )
    return [cap_entry, build_entry, memory_entry]


def _memory_entry(bench_id: str, title: str, of: str, child: dict[str, Any], map_bytes: int,
                  **extra: Any) -> dict[str, Any]:
    """(d): the peak RssAnon growth of a child compaction against offset_map_bytes + 64 MiB."""
    bound = map_bytes + RSS_SLACK_BYTES
    growth = child["growth_kib"] * 1024
    return make_entry(
        bench_id, title, (
            f"The compaction of {of} runs in a fresh process (python -m benchmarks.compaction "
            f"--child-compact): it imports kvlog, warms pyarrow, opens the store, collects garbage, "
            f"samples RssAnon from /proc/self/status (the baseline), then a thread samples it every "
            f"{RSS_INTERVAL_S * 1000:.0f} ms during Store.compact(). The figure is the growth: peak "
            f"sample - baseline; the absolute peak, the baseline and VmHWM (which also counts "
            f"file-backed LMDB pages) are beside it. Anchor and bound: offset_map_bytes + "
            f"{RSS_SLACK_BYTES // MiB} MiB."),
        measure("kvlog", "peak RssAnon - baseline", "MiB", [growth / MiB],
                 peak_mib=child["peak_kib"] / 1024, baseline_mib=child["baseline_kib"] / 1024,
                 vm_hwm_mib=(child["vm_hwm_kib"] or 0) / 1024, samples=child["samples"]),
        [measure("bound", f"offset_map_bytes + {RSS_SLACK_BYTES // MiB} MiB", "MiB", [bound / MiB])],
        higher_is_better=False, seconds=0.0,
        target={"text": f"peak - baseline <= offset_map_bytes + {RSS_SLACK_BYTES // MiB} MiB",
              "value": growth / MiB, "met": bool(growth <= bound),
              "absolute_peak_met": bool(child["peak_kib"] * 1024 <= bound)},
        offset_map_bytes=map_bytes, **extra,
    )


# -- (a) one real round, and (d) its memory ---------------------------------------------------------

def bench_one_round(sizes: Sizes, work: Path) -> list[dict[str, Any]]:
    n = sizes.round_keys
    began = perf_counter()
    load = [loadavg()]
    store_dir = work / "one-round"
    settings = _store_settings(sizes.map_bytes, 1, sizes.flush_bytes)
    per_file = records_per_file(sizes)
    with kvlog.open(store_dir, **settings) as store:
        loaded = bulk_load(store.log, ascending_key_order(n, sizes.seed), per_file, seed=sizes.seed,
                           value_bytes=sizes.value_bytes, partition_of=np.zeros(n, dtype=np.int64))
    gc.collect()
    child, floor = _compact_against_floor(store_dir, {k: v for k, v in settings.items() if k != "partitions"},
                                          1, work)
    shutil.rmtree(store_dir, ignore_errors=True)
    load.append(loadavg())
    report = child["report"]
    capacity = capacity_for(sizes.map_bytes, 0.9)
    one_round = bool(report["rounds"] == 1 and not report["partial"] and report["records_written"] == n
                     and report["records_read"] == n)
    compact_s = child["compact_s"]
    round_entry = make_entry(
        "compaction.one_round", f"one cleaning round, {n:,} distinct keys, 1 partition", (
            f"A one-partition store of {n:,} distinct keys ({sizes.value_bytes}-byte values, "
            f"{loaded['files']} L0 files of {per_file:,} records, appended in ascending key order "
            f"so that loading extends the LMDB key index instead of rewriting it), offset_map_bytes = "
            f"{sizes.map_bytes // MiB} MiB (capacity {capacity:,}), compacted by "
            "Store.compact(force=True) in a fresh process. It must end in one round: not partial, "
            "every record read and kept. Anchor: the I/O floor on the same files (read every input "
            "twice with pyarrow ipc.open_file + read_all, write the survivors once with "
            "ipc.new_file, same compression, then fsync), one run."),
        measure("kvlog", "Store.compact(force=True)", "s", [compact_s],
                 records_per_s=n / compact_s if compact_s else None, report=report,
                 output_batches=child["output_batches"],
                 output_batch_max_records=child["output_batch_max_records"]),
        [measure("io_floor", "pyarrow: read inputs twice, write survivors once", "s",
                  floor["runs_s"], detail=floor)],
        higher_is_better=False, seconds=perf_counter() - began,
        target={"text": "one round: not partial, all keys kept", "value": report["records_written"],
              "met": one_round},
        keys=n, load=loaded, loadavg=load,
    )
    memory_entry = _memory_entry(
        "compaction.memory", f"peak RssAnon, one round of {n:,} distinct keys, 1 partition",
        "compaction.one_round", child, sizes.map_bytes, keys=n)
    return [round_entry, memory_entry]


# -- (b) a cleaning round against the I/O floor --------------------------------------------------------

def bench_vs_floor(sizes: Sizes, work: Path) -> list[dict[str, Any]]:
    began = perf_counter()
    load = [loadavg()]
    store_dir = work / "vs-floor"
    settings = _store_settings(sizes.floor_map_bytes, sizes.partitions, sizes.flush_bytes)
    rng = np.random.default_rng([sizes.seed, 2])
    key_indices = rng.integers(0, sizes.keys, size=sizes.records, dtype=np.uint64)
    distinct = int(np.unique(key_indices).size)
    partition_of = partition_table(sizes.keys, sizes.partitions, sizes.seed)
    per_file = records_per_file(sizes)
    with kvlog.open(store_dir, **settings) as store:
        loaded = bulk_load(store.log, key_indices, per_file, seed=sizes.seed, value_bytes=sizes.value_bytes,
                           partition_of=partition_of)
    del key_indices, partition_of
    gc.collect()
    child, floor = _compact_against_floor(store_dir, {k: v for k, v in settings.items() if k != "partitions"},
                                          sizes.floor_repeats, work)
    shutil.rmtree(store_dir, ignore_errors=True)
    load.append(loadavg())
    report = child["report"]
    correct = bool(report["records_read"] == sizes.records and report["records_written"] == distinct
                   and not report["partial"])
    compact_s = child["compact_s"]
    ratio = compact_s / floor["median_s"] if floor["median_s"] else None
    growth_mib = child["growth_kib"] / 1024
    memory_entry = _memory_entry(
        "compaction.memory_partitions", f"peak RssAnon, {sizes.records:,} records, "
        f"{sizes.partitions} partitions", "compaction.vs_io_floor", child, sizes.floor_map_bytes,
        records=sizes.records)
    return [make_entry(
        "compaction.vs_io_floor",
        f"cleaning round, {sizes.records:,} records over {sizes.keys:,} keys vs the I/O floor", (
            f"{sizes.records:,} records ({KEY_BYTES}-byte keys drawn uniformly from {sizes.keys:,}, "
            f"{sizes.value_bytes}-byte values), {sizes.partitions} partitions, loaded as "
            f"{loaded['files']} L0 files of {per_file:,} records; offset_map_bytes = "
            f"{sizes.floor_map_bytes // MiB} MiB. kvlog: Store.compact(force=True) in a fresh "
            f"process, median of {sizes.floor_repeats} runs, each on its own clone of the loaded "
            f"store (data files hard-linked, metadata copied; checked on the last: every record "
            f"read, exactly the {distinct:,} distinct keys kept, not partial). Anchor, the I/O floor, measured right after on the same files: every input "
            f"file read twice with pyarrow (ipc.open_file on a pa.OSFile + read_all, which also "
            f"decompresses), then the surviving records (read beforehand, untimed, from the "
            f"compaction's own outputs) written once with ipc.new_file in the same compression and "
            f"fsynced, as the store's put does; median of {sizes.floor_repeats} runs. Ratio = "
            f"compaction seconds / floor seconds; target <= {FLOOR_TARGET_RATIO}."),
        measure("kvlog", "Store.compact(force=True)", "s", child["compact_runs_s"],
                 records_per_s=sizes.records / compact_s if compact_s else None, report=report,
                 peak_rss_growth_mib=growth_mib, baseline_rss_mib=child["baseline_kib"] / 1024,
                 output_batches=child["output_batches"],
                 output_batch_max_records=child["output_batch_max_records"]),
        [measure("io_floor", "pyarrow: read inputs twice, write survivors once", "s", floor["runs_s"],
                  detail=floor)],
        higher_is_better=False, seconds=perf_counter() - began,
        target={"text": f"compaction <= {FLOOR_TARGET_RATIO}x the I/O floor", "value": ratio,
              "met": None if ratio is None else bool(ratio <= FLOOR_TARGET_RATIO), "correct": correct},
        records=sizes.records, keys=sizes.keys, distinct_keys=distinct, load=loaded, loadavg=load,
    ), memory_entry]


# -- (c) requests per job on SeaweedFS -------------------------------------------------------------

def bench_requests(sizes: Sizes, work: Path, server: Any | None) -> dict[str, Any]:
    began = perf_counter()
    load = [loadavg()]
    own = None
    if server is None:
        from kvlog.testing.seaweedfs import SeaweedServer

        own = server = SeaweedServer(base_dir=work)
        server.start()
    try:
        bucket = "kvlog-bench-compaction"
        server.create_bucket(bucket)
        settings = _store_settings(4 * MiB, sizes.partitions, sizes.flush_bytes)
        partition_of = partition_table(sizes.request_keys, sizes.partitions, sizes.seed)
        rows: list[dict[str, Any]] = []
        tag = kvlog.SystemClock().now_ms()
        for files in sizes.request_files:
            uri = server.uri(bucket, f"requests-{tag}-{files}")
            cache = work / f"cache-requests-{files}"
            rng = np.random.default_rng([sizes.seed, 3, files])
            per = sizes.request_records_per_file
            key_indices = rng.integers(0, sizes.request_keys, size=files * per, dtype=np.uint64)
            with kvlog.open(uri, storage_options=dict(server.storage_options), cache_dir=cache,
                            **settings) as store:
                bulk_load(store.log, key_indices, per, seed=sizes.seed, value_bytes=sizes.value_bytes,
                          partition_of=partition_of)
                storage = store.log.storage
                before = Counter(storage.requests)
                t0 = perf_counter()
                report = store.compact(force=True)
                seconds = perf_counter() - t0
                delta = Counter(storage.requests)
                delta.subtract(before)
            kinds = {k: int(v) for k, v in sorted(delta.items()) if v}
            rows.append({
                "input_files": files, "files_in": report.files_in, "files_out": report.files_out,
                "records": int(len(key_indices)), "requests": kinds,
                "stream_gets": kinds.get("stream", 0),
                "gets": kinds.get("get", 0) + kinds.get("range_get", 0) + kinds.get("stream", 0),
                "puts": kinds.get("put", 0) + kinds.get("put_if_absent", 0) + kinds.get("swap", 0),
                "expected_stream_gets": 2 * files,
                "stream_gets_per_input_file": kinds.get("stream", 0) / files,
                "compact_s": seconds,
            })
            shutil.rmtree(cache, ignore_errors=True)
    finally:
        if own is not None:
            own.stop()
    load.append(loadavg())
    total_files = sum(r["input_files"] for r in rows)
    per_file = sum(r["stream_gets"] for r in rows) / total_files
    met = all(r["stream_gets"] == r["expected_stream_gets"] and r["files_in"] == r["input_files"]
              for r in rows)
    return make_entry(
        "compaction.requests_s3", "requests per compaction job on SeaweedFS", (
            f"For each of {list(sizes.request_files)} input files: a new store on SeaweedFS (weed "
            f"mini on loopback, obstore client), {sizes.partitions} partitions, loaded with that many "
            f"L0 files of {sizes.request_records_per_file:,} records (keys drawn from "
            f"{sizes.request_keys:,}, so every file holds every partition); then the difference of "
            f"store.log.storage.requests (a Counter by kind) across one Store.compact(force=True) in "
            f"the same process. gets = get + range_get + stream; puts = put + put_if_absent + swap "
            f"(the outputs, the replace commit and its copy). Figure: stream GETs per input file over all runs; "
            f"anchor: the design's 2, streams A and B (docs/compaction.rst)."),
        measure("kvlog", "stream GETs per input file", "GETs/file", [per_file], rows=rows),
        [measure("design", "design: 2 per input file", "GETs/file", [2.0])],
        higher_is_better=False, seconds=perf_counter() - began,
        target={"text": "exactly 2 stream GETs per input file, for 1, 4 and 16 files", "value": per_file,
              "met": met},
        loadavg=load,
    )


# -- the run -------------------------------------------------------------------------------------

Step = tuple[str, str, Callable[[], "dict[str, Any] | list[dict[str, Any]]"]]


def run_compaction_benchmarks(
    quick: bool, out_dir: Path, *, sizes: Sizes | None = None, work_dir: str | os.PathLike[str] | None = None,
    seaweed: Any | None = None, progress: Callable[[str], None] | None = None, write: bool = True,
) -> dict[str, Any]:
    """Run the compaction benchmarks; write ``out_dir/compaction.json`` (quick: ``compaction-quick.json``).

    ``sizes`` overrides the preset (FULL, or QUICK when ``quick``); ``seaweed`` is a running
    :class:`~kvlog.testing.seaweedfs.SeaweedServer` to use instead of starting one; ``progress`` is
    called with a line before each benchmark. Returns the JSON-able document.
    """
    chosen = sizes or (QUICK if quick else FULL)
    began = perf_counter()
    started = datetime.fromtimestamp(kvlog.SystemClock().now_ms() / 1000, UTC)
    say = progress or (lambda _line: None)
    entries: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="kvlog-bench-compaction-", dir=work_dir))
    info = machine_info(work)
    info["loadavg_start"] = loadavg()
    s3_missing: str | None = None
    if not chosen.seaweedfs:
        s3_missing = "disabled by sizes.seaweedfs"
    elif seaweed is None:
        try:
            import obstore  # noqa: F401

            from kvlog.testing.seaweedfs import find_weed

            find_weed()
        except Exception as e:
            s3_missing = f"{type(e).__name__}: {e}"
    steps: list[Step] = [
        ("compaction.map", "(a) offset map", lambda: bench_map(chosen)),
        ("compaction.one_round", "(a)+(d) one round and its memory", lambda: bench_one_round(chosen, work)),
        ("compaction.vs_io_floor", "(b) vs the I/O floor", lambda: bench_vs_floor(chosen, work)),
        ("compaction.requests_s3", "(c) requests on SeaweedFS",
         lambda: bench_requests(chosen, work, seaweed)),
    ]
    try:
        for step_id, title, fn in steps:
            if step_id == "compaction.one_round" and not chosen.round_keys:
                continue
            if step_id == "compaction.requests_s3" and s3_missing:
                entries.append(_failed(step_id, title, "skipped", s3_missing))
                continue
            say(f"{title} ...")
            t0 = perf_counter()
            try:
                produced = fn()
            except Exception as e:
                import traceback

                entry = _failed(step_id, title, "error", f"{type(e).__name__}: {e}")
                entry["traceback"] = traceback.format_exc()
                entries.append(entry)
            else:
                entries.extend(produced if isinstance(produced, list) else [produced])
            say(f"{title}: {perf_counter() - t0:.1f} s")
            gc.collect()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info["loadavg_end"] = loadavg()
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "mode": chosen.mode,
        "date": started.isoformat(timespec="seconds"),
        "wall_seconds": perf_counter() - began,
        "machine": info,
        "sizes": {**asdict(chosen), "records_per_file": records_per_file(chosen),
                  "requested": asdict(QUICK if quick else FULL)},
        "method": METHOD,
        "benchmarks": entries,
    }
    if write:
        out = Path(out_dir)
        name = "compaction.json" if chosen.mode == "full" else f"compaction-{chosen.mode}.json"
        save_results(document, out / name)
    return document


# -- the table -----------------------------------------------------------------------------------

def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and unit in ("s", "MiB", "GETs/file"):
        return f"{value:,.3f} {unit}" if value < 10 else f"{value:,.1f} {unit}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,} {unit}" if isinstance(value, int) else f"{value:,.3f} {unit}"


def _notes(e: dict[str, Any]) -> list[str]:
    if e["id"].startswith("compaction.memory"):
        s = e["subject"]
        return [f"{'':>18} peak {s['peak_mib']:.1f} MiB, baseline {s['baseline_mib']:.1f} MiB"]
    if e["id"] == "compaction.requests_s3":
        return [f"{'':>18} {r['input_files']:>2} files: {r['stream_gets']} stream, {r['gets']} GETs, "
                f"{r['puts']} PUTs {r['requests']}" for r in e["subject"]["rows"]]
    return []


def format_table(document: dict[str, Any]) -> str:
    """The results as a plain-text table: figure, anchors, ratios, target."""
    return text_table(document, "kvlog compaction benchmarks", _fmt, id_width=28, anchor_width=44, name_width=30,
                      notes=_notes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compaction",
                                     description="kvlog's compaction benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes (a minute or two)")
    parser.add_argument("--out-dir", default="benchmarks/results", help="where the JSON goes")
    parser.add_argument("--work-dir", help="where the temporary stores go (default: the system temp)")
    parser.add_argument("--records", type=int, help="override (b)'s records")
    parser.add_argument("--keys", type=int, help="override (b)'s distinct keys")
    parser.add_argument("--round-keys", type=int, help="override (a)'s one-round store size (0: skip)")
    parser.add_argument("--map-keys", type=int, help="override (a)'s keys inserted into the map")
    parser.add_argument("--no-s3", action="store_true", help="skip the SeaweedFS benchmark")
    parser.add_argument("--child-compact", help=argparse.SUPPRESS)
    parser.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_compact:
        result = child_compact(args.child_compact, json.loads(args.settings))
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    sizes = QUICK if args.quick else FULL
    overrides = {name: getattr(args, name) for name in ("records", "keys", "round_keys", "map_keys")
                 if getattr(args, name) is not None}
    if args.no_s3:
        overrides["seaweedfs"] = False
    if overrides:
        sizes = replace(sizes, **overrides)
    document = run_compaction_benchmarks(
        args.quick, Path(args.out_dir), sizes=sizes, work_dir=args.work_dir,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(format_table(document))
    print(f"results: {document['path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
