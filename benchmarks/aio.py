"""The cost of ``kvlog.aio``: a call awaited on an event loop vs the same sync call.

Each awaited call of :class:`kvlog.aio.AsyncStore` is one hop to a worker thread and back; the
sync API's get of an inline value or buffered put costs about a microsecond. Both run on the
same store, alternately within each repeat (the order swapped every repeat), so drifting load
hits both. Reported: calls/s of each, the ratio async / sync with its range over the repeats,
and the overhead per call in microseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from statistics import median
from time import perf_counter
from typing import Any

from benchmarks.suite import Context, make_entry, measurement

__all__ = ["bench_store_aio", "CALLS"]

#: Calls timed per run (fewer when the suite's record count is smaller).
CALLS = 20_000


def _sync_seconds(op: Callable[[bytes], object], keys: Sequence[bytes]) -> float:
    t0 = perf_counter()
    for key in keys:
        op(key)
    return perf_counter() - t0


def _async_seconds(op: Callable[[bytes], Any], keys: Sequence[bytes]) -> float:
    """Sequential awaits on a fresh loop; only the awaits are timed, not the loop's start."""
    async def main() -> float:
        t0 = perf_counter()
        for key in keys:
            await op(key)
        return perf_counter() - t0

    return asyncio.run(main())


def bench_store_aio(ctx: Context) -> list[dict[str, Any]]:
    """Awaited get and put vs the sync calls, on one store."""
    import kvlog.aio

    s = ctx.settings
    calls = min(CALLS, len(ctx.keys))
    keys = list(ctx.keys[:calls])
    value = ctx.values[0]
    entries: list[dict[str, Any]] = []
    began = perf_counter()
    with ctx.scratch_dir("aio") as path:
        store = ctx.open_store(path / "store")
        astore = kvlog.aio.AsyncStore(store)
        try:
            for key in keys:
                store.put(key, value)
            store.flush()
            for key in keys[:100]:  # warm both paths: the pool's threads exist before timing
                store.get(key)
            _async_seconds(astore.get, keys[:100])
            runs: dict[str, list[float]] = {"sync_get": [], "aio_get": [], "sync_put": [], "aio_put": []}
            for repeat in range(max(3, s.repeats)):
                ctx.bar.describe(f"store: asyncio overhead, repeat {repeat + 1}")
                put_keys = [b"p%d-" % repeat + k for k in keys]
                half = calls // 2
                order = [("sync", "aio"), ("aio", "sync")][repeat % 2]
                for kind in order:
                    if kind == "sync":
                        runs["sync_get"].append(calls / _sync_seconds(store.get, keys))
                        runs["sync_put"].append(half / _sync_seconds(
                            lambda k: store.put(k, value), put_keys[:half]))
                    else:
                        runs["aio_get"].append(calls / _async_seconds(astore.get, keys))
                        runs["aio_put"].append(half / _async_seconds(
                            lambda k: astore.put(k, value), put_keys[half:]))
                store.flush()
            for key in keys[:: max(1, calls // 100)]:
                if store.get(key) != value:
                    raise AssertionError(f"{key!r} lost its value")
        finally:
            asyncio.run(astore.close())
    for op, title in (("get", "awaited get of an existing key"), ("put", "awaited buffered put")):
        sync_runs, aio_runs = runs[f"sync_{op}"], runs[f"aio_{op}"]
        ratios = [a / b for a, b in zip(aio_runs, sync_runs, strict=True)]
        overhead_us = [(1 / a - 1 / b) * 1e6 for a, b in zip(aio_runs, sync_runs, strict=True)]
        method = (
            f"One store (default settings, {calls:,} records of 16-byte keys and 100-byte values, "
            f"flushed, values inline in the index). kvlog.aio: `await astore.{op}(...)` of "
            f"{'every key' if op == 'get' else 'new keys (half the keys per run, buffered)'} in "
            "sequence on an asyncio loop: answered on the loop itself (memory holds the answer; "
            "a refresh due, or a buffer's flush, takes a hop to the AsyncStore's worker pool of "
            f"4 threads). Anchor: the sync `store.{op}(...)` of the same kind of keys on the "
            "main thread. The two alternate within each repeat, the order swapped every repeat; "
            "calls/s is the median of the runs; `ratio_range` is the smallest and largest "
            "per-repeat async / sync ratio and `overhead_us` the extra time per call."
        )
        entries.append(make_entry(
            f"store.aio_{op}", "store", title, method,
            measurement("aio", f"kvlog.aio {op}", "calls/s", aio_runs),
            [measurement("sync", f"kvlog sync {op}", "calls/s", sync_runs)],
            seconds=perf_counter() - began,
            ratio_range=[min(ratios), max(ratios)], ratio_runs=ratios,
            overhead_us={"median": median(overhead_us), "min": min(overhead_us), "max": max(overhead_us)},
        ))
    return entries
