"""Anonymous memory of a store holding N keys, measured in a fresh process.

Run as ``python -m benchmarks.rss --keys N --dir DIR``; prints one JSON
object. The process writes N records (16-byte keys, 100-byte values) with
buffered ``put`` and a final ``flush``, runs one forced compaction
(``compact(force=True)``: every size goes through the same phases, so the
compactor's fixed costs, such as loading its compiled kernels, are in both),
then reads a random sample with ``get`` and the whole store with ``scan``. A thread samples ``RssAnon`` from
``/proc/self/status`` every few milliseconds; the peak is the largest sample
(``VmHWM``, the kernel's own peak, counts memory-mapped LMDB pages too, so it
is reported but not used: those pages are the page cache's, not the
process's). Keys and values are generated in chunks, so the driver itself
holds only a chunk at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.data import keys_at, make_keys, make_values
from benchmarks.machine import read_status_kib

__all__ = ["RssSampler", "measure_store_memory", "main"]

_CHUNK = 10_000


class RssSampler:
    """Samples ``RssAnon`` in a daemon thread; :meth:`mark` starts a new phase's peak."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.samples = 0
        self._peak = 0
        self._phase_peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> int:
        """Take one sample now; returns RssAnon in KiB."""
        value = read_status_kib("RssAnon") or 0
        with self._lock:
            self.samples += 1
            self._peak = max(self._peak, value)
            self._phase_peak = max(self._phase_peak, value)
        return value

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> RssSampler:
        self.sample()
        self._thread.start()
        return self

    def mark(self) -> int:
        """End the current phase: its peak in KiB (and start the next phase)."""
        self.sample()
        with self._lock:
            peak, self._phase_peak = self._phase_peak, 0
        return peak

    @property
    def peak(self) -> int:
        with self._lock:
            return self._peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def measure_store_memory(
    path: str, keys: int, *, seed: int = 0, gets: int = 20_000, scan: bool = True,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``keys`` records to a new store at ``path``, read them back, and report RssAnon (KiB)."""
    import kvlog

    sampler = RssSampler()
    baseline = sampler.sample()
    sampler.start()
    phases: dict[str, float] = {}
    began = time.perf_counter()
    store = kvlog.open(path, **(settings or {}))
    try:
        after_open = sampler.sample()
        sampler.mark()
        t0 = time.perf_counter()
        for start in range(0, keys, _CHUNK):
            count = min(_CHUNK, keys - start)
            for key, value in zip(make_keys(start, count, seed), make_values(start, count, seed),
                                  strict=True):
                store.put(key, value)
        store.flush()
        phases["write_s"] = time.perf_counter() - t0
        peak_write = sampler.mark()
        t0 = time.perf_counter()
        compacted = store.compact(force=True)
        phases["compact_s"] = time.perf_counter() - t0
        peak_compact = sampler.mark()
        t0 = time.perf_counter()
        picks = np.random.default_rng(seed + 1).integers(0, keys, size=min(gets, keys), dtype=np.uint64)
        missing = sum(1 for key in keys_at(picks, seed) if store.get(key) is None)
        phases["get_s"] = time.perf_counter() - t0
        scanned = -1
        if scan:
            t0 = time.perf_counter()
            scanned = sum(1 for _ in store.scan())
            phases["scan_s"] = time.perf_counter() - t0
        peak_read = sampler.mark()
        stats = store.stats()
    finally:
        store.close()
    sampler.stop()
    return {
        "keys": keys,
        "baseline_kib": baseline,
        "after_open_kib": after_open,
        "peak_write_kib": peak_write,
        "peak_compact_kib": peak_compact,
        "compacted_records_read": compacted.records_read,
        "peak_read_kib": peak_read,
        "peak_kib": sampler.peak,
        "final_kib": read_status_kib("RssAnon"),
        "vm_hwm_kib": read_status_kib("VmHWM"),
        "samples": sampler.samples,
        "sample_interval_s": sampler.interval_s,
        "gets": int(len(picks)),
        "gets_missing": missing,
        "scanned": scanned,
        "flushes": stats.get("flushes"),
        "files": stats.get("files"),
        "cache_disk_bytes": stats.get("cache_disk_bytes"),
        "seconds": time.perf_counter() - began,
        **phases,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rss", description=__doc__)
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--dir", required=True, help="a new store directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gets", type=int, default=20_000)
    parser.add_argument("--no-scan", action="store_true")
    parser.add_argument("--settings", default="{}", help="JSON object of StoreConfig settings")
    args = parser.parse_args(argv)
    result = measure_store_memory(args.dir, args.keys, seed=args.seed, gets=args.gets,
                                  scan=not args.no_scan, settings=json.loads(args.settings))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
