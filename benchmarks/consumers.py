"""Consumer groups and monitoring: records/s through ``poll``, the latency from another
process's ``sync=True`` put to the ``poll`` that returns it, and what a Prometheus scrape of
:mod:`kvlog.metrics` costs the put path.

``python -m benchmarks.consumers writer URI COUNT INTERVAL_MS`` is the writer child of the
latency benchmark: it puts COUNT keys with ``sync=True``, one every INTERVAL_MS, and prints
``<i> <wall ns before the put> <wall ns after it>`` for each.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

import kvlog
from benchmarks.children import child_env
from benchmarks.data import percentiles

if TYPE_CHECKING:
    from benchmarks.suite import Context

__all__ = ["bench_consumer_latency", "bench_consumer_throughput", "bench_metrics_overhead"]

#: How often the metrics benchmark scrapes: 15 times as often as Prometheus's usual 15 s.
SCRAPE_INTERVAL_S = 1.0
#: Keys the latency benchmark's writer puts, and the pause between two puts.
LATENCY_PUTS = {"quick": 100, "full": 400}
LATENCY_INTERVAL_MS = 20


def bench_consumer_throughput(ctx: Context) -> dict[str, Any]:
    """Records/s through ``Consumer.poll`` (500 a call) vs ``store.changes()`` on the same data."""
    from benchmarks.suite import make_entry, measurement

    s = ctx.settings
    total = s.records
    began = perf_counter()
    poll_runs: list[float] = []
    changes_runs: list[float] = []
    with ctx.scratch_dir("consumer") as path:
        store = ctx.open_store(path, flush_interval_ms=0, background_compaction=False)
        try:
            ctx.bar.describe("consumer: loading")
            for i in range(total):
                store.put(*ctx.record(i))
            store.flush()
            for run in range(s.repeats):
                ctx.bar.describe("consumer: poll")
                consumer = store.consumer(f"bench-{run}")
                t0 = perf_counter()
                seen = 0
                while batch := consumer.poll(timeout_s=0, max_records=500):
                    seen += len(batch)
                poll_runs.append(seen / (perf_counter() - t0))
                if seen != total:
                    raise AssertionError(f"polled {seen} records of {total}")
                ctx.bar.describe("consumer: changes()")
                t0 = perf_counter()
                seen = sum(1 for _ in store.changes())
                changes_runs.append(seen / (perf_counter() - t0))
        finally:
            store.close()
    method = (
        f"{total} records put into a new local store and flushed; each run a consumer of a new "
        f"group polls (timeout_s=0, max_records=500) until a poll returns nothing. Records/s = "
        f"records / wall time of all polls. Anchor: store.changes() (every partition, offset "
        f"order) over the same records: the read path a consumer adds its positions to."
    )
    return make_entry(
        "consumer.poll", "consumer", "records/s through Consumer.poll", method,
        measurement("kvlog", "Consumer.poll, 500 a call", "records/s", poll_runs, records=total),
        [measurement("changes", "store.changes()", "records/s", changes_runs, records=total)],
        seconds=perf_counter() - began,
    )


def bench_consumer_latency(ctx: Context) -> dict[str, Any]:
    """Another process's ``sync=True`` put to the ``poll`` that returns it: p50 and p99."""
    from benchmarks.suite import make_entry, measurement

    count = LATENCY_PUTS["quick" if ctx.settings.records <= 100_000 else "full"]
    began = perf_counter()
    follow_ms = kvlog.StoreConfig().follow_interval_ms
    with ctx.scratch_dir("consumer-latency") as path:
        kvlog.open(path).close()
        returned: dict[bytes, int] = {}
        with kvlog.open(path, read_only=True) as reader:
            consumer = reader.consumer("latency")
            ctx.bar.describe("consumer: latency (writer process)")
            writer = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.consumers", "writer", str(path), str(count),
                 str(LATENCY_INTERVAL_MS)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                cwd=Path(__file__).resolve().parents[1],
            )
            try:
                while len(returned) < count:
                    records = consumer.poll(timeout_s=30)
                    now = time.time_ns()
                    if not records and writer.poll() is not None:
                        break
                    for record in records:
                        returned[record.key] = now
            finally:
                out, err = writer.communicate(timeout=120)
        if writer.returncode != 0 or len(returned) != count:
            raise RuntimeError(f"writer exited {writer.returncode} after {len(returned)} puts: {err}")
    e2e: list[float] = []
    put: list[float] = []
    for line in out.splitlines():
        i, before, after = (int(x) for x in line.split())
        e2e.append((returned[f"key-{i:06d}".encode()] - before) / 1e9)
        put.append((after - before) / 1e9)
    method = (
        f"A writer process puts {count} keys with sync=True, one every {LATENCY_INTERVAL_MS} ms, "
        f"into a local store; this process polls a read-only handle's consumer (timeout 30 s) and "
        f"stamps each record with the wall time its poll returned. Latency = that time - the wall "
        f"time just before the writer's put call (one machine, one clock). The waiting poll is "
        f"woken by the kernel when the writer's commit renames the head (inotify); "
        f"follow_interval_ms = {follow_ms} (the default) is the backstop look. Anchor: the "
        f"sync=True put's own latency in the writer (a floor: the commit must land before any "
        f"reader sees it)."
    )
    return make_entry(
        "consumer.latency", "consumer", "put(sync=True) in another process -> poll returns it",
        method,
        measurement("kvlog", "put -> poll, other process", "ms", [1000 * sorted(e2e)[len(e2e) // 2]],
                    latencies_s=e2e, puts=count, follow_interval_ms=follow_ms),
        [measurement("put", "sync=True put alone", "ms", [1000 * sorted(put)[len(put) // 2]],
                     latencies_s=put)],
        higher_is_better=False, seconds=perf_counter() - began,
    )


def bench_metrics_overhead(ctx: Context) -> dict[str, Any]:
    """Buffered puts/s while a thread scrapes :func:`kvlog.metrics.text` every second, vs the
    same puts with no collector, runs interleaved on one store."""
    import kvlog.metrics
    from benchmarks.suite import make_entry, measurement

    s = ctx.settings
    total = s.records
    began = perf_counter()
    with_runs: list[float] = []
    without_runs: list[float] = []
    scrapes_s: list[float] = []
    with ctx.scratch_dir("metrics") as path:
        store = ctx.open_store(path, background_compaction=False)
        try:
            def puts(run: int) -> float:
                t0 = perf_counter()
                for i in range(total):
                    key, value = ctx.record(i)
                    store.put(key, value)
                store.flush()
                return total / (perf_counter() - t0)

            for run in range(s.repeats):
                for scraped in (run % 2 == 0, run % 2 == 1):  # interleaved, each first in turn
                    ctx.bar.describe(f"metrics: puts {'with' if scraped else 'without'} scrapes")
                    if not scraped:
                        without_runs.append(puts(run))
                        continue
                    stop = threading.Event()

                    def scrape(stop: threading.Event = stop) -> None:
                        while not stop.wait(SCRAPE_INTERVAL_S):
                            t0 = perf_counter()
                            kvlog.metrics.text(store)
                            scrapes_s.append(perf_counter() - t0)

                    scraper = threading.Thread(target=scrape, name="scraper")
                    scraper.start()
                    try:
                        with_runs.append(puts(run))
                    finally:
                        stop.set()
                        scraper.join()
        finally:
            store.close()
    method = (
        f"{total} buffered puts then a flush into one local store, per run; in the runs with "
        f"metrics a thread calls kvlog.metrics.text(store) (what a Prometheus scrape of the "
        f"registered collector does) every {SCRAPE_INTERVAL_S * 1000:.0f} ms, 15 times as "
        f"often as a usual 15 s scrape interval. Runs with and without alternate, each first "
        f"in turn. Anchor: the runs without a collector. The store grows by the same records "
        f"each run (the same keys are written again), so later runs scrape more batches."
    )
    return make_entry(
        "consumer.metrics", "consumer", "buffered puts/s while metrics are scraped", method,
        measurement("kvlog", "puts, scraped every second", "puts/s", with_runs, records=total,
                    scrape_ms=percentiles(scrapes_s) if scrapes_s else None, scrapes=len(scrapes_s)),
        [measurement("no-metrics", "puts, no collector", "puts/s", without_runs, records=total)],
        seconds=perf_counter() - began,
    )


def _writer(uri: str, count: int, interval_ms: int) -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    with kvlog.open(uri, flush_interval_ms=0, background_compaction=False) as store:
        for i in range(count):
            time.sleep(interval_ms / 1000)
            before = time.time_ns()
            store.put(f"key-{i:06d}", "v", sync=True)
            print(i, before, time.time_ns())


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "writer":
        _writer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("usage: python -m benchmarks.consumers writer URI COUNT INTERVAL_MS")
