"""Shared fixtures of the log tests: logs on local storage with an injected clock and ids."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvlog.clock import Clock, IdSource, ManualClock, SeededIdSource
from kvlog.config import StoreConfig
from kvlog.log import Log, open_log
from kvlog.storage import LocalStorage, Storage

#: A factory of logs: ``make_log(storage_or_root, cache_dir, **settings)``.
MakeLog = Callable[..., Log]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_log(clock: ManualClock) -> Iterator[MakeLog]:
    """Open logs (closed at teardown) on a root directory or a given storage, 4 partitions by default."""
    opened: list[Log] = []

    def factory(
        root: Path | Storage,
        cache_dir: Path,
        *,
        log_clock: Clock | None = None,
        ids: IdSource | None = None,
        partitions: int = 4,
        **settings: Any,
    ) -> Log:
        storage = root if isinstance(root, Storage) else LocalStorage(root, fsync=False)
        config = StoreConfig.from_settings(None, partitions=partitions, **settings)
        the_log = open_log(
            storage, cache_dir=cache_dir, partitions=partitions, config=config,
            clock=log_clock or clock, ids=ids or SeededIdSource(len(opened) + 1),
        )
        opened.append(the_log)
        return the_log

    yield factory
    for the_log in opened:
        the_log.close()


def records_of(the_log: Log, partition: int) -> list[tuple[int, bytes, bytes | None]]:
    """``(offset, key, value)`` of every record of ``partition``."""
    return [(r.offset, r.key, r.value) for r in the_log.read(partition)]


def commit_names(root: Path) -> list[str]:
    """Names under ``log/`` of a local store root."""
    directory = root / "log"
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


@pytest.fixture
def helpers() -> Any:
    """Small helpers shared by the log tests (``helpers.records_of``, ``helpers.commit_names``)."""

    class _Helpers:
        records_of = staticmethod(records_of)
        commit_names = staticmethod(commit_names)

    return _Helpers()
