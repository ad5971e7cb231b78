"""The event loop is never blocked: a ticker keeps its period while a large flush runs.

A liveness check, not a speed figure: a ticker coroutine sleeps 5 ms in a loop and records the
largest gap between two ticks while ``await store.flush()`` commits a few hundred thousand
buffered records. A healthy loop keeps the gap near the GIL switch interval (tens of ms on a
loaded 2-core machine); a loop blocked by the flush shows a gap as long as the flush. The flush
is made at least twice the bound long (more records if needed), so a blocked loop cannot pass.
Calling the sync ``flush()`` on the loop instead fails this test (gap ~ 0.9 s on 2 cores).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import kvlog.aio
from kvlog.clock import SystemClock
from tests.aio.support import QUIET, run

#: Largest gap allowed between two 5 ms ticks.
MAX_GAP_S = 0.25
START_RECORDS = 200_000
MAX_RECORDS = 1_600_000


async def _ticker(gaps: list[float], stop: asyncio.Event) -> None:
    clock = SystemClock()
    last = clock.monotonic_s()
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = clock.monotonic_s()
        gaps.append(now - last)
        last = now


def test_a_large_flush_does_not_block_the_loop(tmp_path: Path) -> None:
    clock = SystemClock()

    async def one_flush(records: int) -> tuple[float, float]:
        """(the flush's duration, the largest tick gap during it)."""
        async with kvlog.aio.open(tmp_path / f"s{records}", **QUIET) as store:
            def fill() -> None:
                for i in range(records):
                    store.sync.put(b"key-%09d" % i, b"v" * 100)

            await store.call(fill)
            gaps: list[float] = []
            stop = asyncio.Event()
            ticker = asyncio.create_task(_ticker(gaps, stop))
            await asyncio.sleep(0.02)
            began = clock.monotonic_s()
            await store.flush()
            took = clock.monotonic_s() - began
            stop.set()
            await ticker
            return took, max(gaps)

    async def main() -> None:
        records = START_RECORDS
        while True:
            took, gap = await one_flush(records)
            if took >= 2 * MAX_GAP_S or records >= MAX_RECORDS:
                break
            records *= 2  # too fast to tell a blocked loop from a healthy one: a larger flush
        assert took >= 2 * MAX_GAP_S, f"a flush of {records} records took only {took:.3f} s"
        assert gap < MAX_GAP_S, f"the loop stalled {gap * 1000:.0f} ms during a {took:.2f} s flush"

    run(main())
