"""Helpers of the race tests: copying and restoring a local root, ageing its data files.

They act on a store root the way an operator or time would, between two steps of a writer
that a hook (a real ``LocalStorage`` subclass) holds still.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

#: Options of a store with no background thread: every commit happens when a test says so.
QUIET = {"background_compaction": False, "flush_interval_ms": 0, "partitions": 2}
TWO_HOURS_S = 2 * 3600


def is_commit(name: str) -> bool:
    """Whether a storage name is a commit (not a checkpoint)."""
    return name.startswith("log/") and name.endswith(".json") and not name.endswith(".checkpoint.json")


def age_every_data_file(root: Path) -> None:
    """Set every data file's modification time two hours back: a writer stalled that long."""
    old = time.time() - TWO_HOURS_S
    for path in (root / "data").rglob("*.arrow"):
        os.utime(path, (old, old))


def copy_root(root: Path, to: Path) -> None:
    """A backup of the root (without its cache)."""
    shutil.copytree(root, to, ignore=shutil.ignore_patterns("cache"))


def restore_root(root: Path, backup: Path, dirs: tuple[str, ...] = ("log", "data")) -> None:
    """Put ``dirs`` of the root back as ``backup`` has them (absent if the backup has none:
    a store of small flushes has no ``data/``)."""
    for name in dirs:
        shutil.rmtree(root / name, ignore_errors=True)
        if (backup / name).exists():
            shutil.copytree(backup / name, root / name)


def write_past_a_backup(store: Any, root: Path, backup: Path) -> None:
    """Acknowledge ``a``, back the root up to ``backup``, then acknowledge ``b`` and ``c``:
    restoring the backup later removes the last two writes' commits."""
    store.put(b"a", b"1", sync=True)
    copy_root(root, backup)
    store.put(b"b", b"2", sync=True)
    store.put(b"c", b"3", sync=True)
