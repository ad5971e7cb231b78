"""Progress bars for long work: shown on a terminal, silent otherwise."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

__all__ = ["ProgressTask", "progress"]


class ProgressTask(Protocol):
    """What long work reports to."""

    def advance(self, amount: float = 1) -> None:
        """Record ``amount`` more units done."""
        ...


class _Silent:
    def advance(self, amount: float = 1) -> None:
        return None


class _RichTask:
    def __init__(self, bar: object, task_id: object) -> None:
        self._bar = bar
        self._task_id = task_id

    def advance(self, amount: float = 1) -> None:
        self._bar.advance(self._task_id, amount)  # type: ignore[attr-defined]


@contextmanager
def progress(description: str, total: float | None, *, enabled: bool | None = None) -> Iterator[ProgressTask]:
    """A progress bar on stderr when it is a terminal (or ``enabled``), a silent task otherwise."""
    show = sys.stderr.isatty() if enabled is None else enabled
    if not show:
        yield _Silent()
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        yield _RichTask(bar, bar.add_task(description, total=total))
