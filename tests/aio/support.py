"""Shared helpers of the asyncio tests: running a coroutine with a deadline, quiet settings."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")

#: Nothing flushes on its own and nothing compacts: what is durable is what a test flushed.
QUIET: dict[str, Any] = {
    "flush_interval_ms": 0,
    "flush_bytes": 1 << 30,
    "max_unflushed_bytes": 1 << 30,
    "background_compaction": False,
}

#: A test's coroutine that runs longer than this is a hang, reported as a failure.
DEADLINE_S = 120.0


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """``coro`` on a new event loop (``asyncio.run``), failing it if it hangs."""
    return asyncio.run(asyncio.wait_for(coro, DEADLINE_S))
