"""Fixtures of the Spark tests: ONE SparkSession for the whole directory, and store builders.

Starting a JVM takes 30-60 s on a loaded 2-core machine, so every in-process
Spark test shares the session-scoped ``spark`` fixture: ``local[2,2]`` (two
cores, and ``spark.task.maxFailures`` = 2 so a task that fails once is retried
once), 4 shuffle partitions. Tests that need another JVM (the standalone
cluster, the command line) start subprocesses instead.

Stores are built with :func:`fill` (tests reach the helpers through the ``kv``
fixture): a deterministic workload of puts and
deletes over a small key space, flushed every few operations so the log has
many data files, with a plain dict as the model.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import kvlog

#: Settings of every test store: flushes and compaction happen only when a test asks.
MANUAL: dict[str, Any] = {
    "flush_interval_ms": 0,
    "flush_bytes": 1 << 30,
    "max_unflushed_bytes": 1 << 30,
    "background_compaction": False,
}

SPARK_MASTER = "local[2,2]"
#: JVM options for the tests' short-lived JVMs: the C1 compiler only and the serial collector
#: start and run small jobs about 30 % faster on a busy 2-core machine (measured on
#: ``kvlog spark materialize``: 22-26 s instead of 33-37 s).
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.python.worker.reuse": "true",
}


@pytest.fixture(scope="session", autouse=True)
def private_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``$XDG_CACHE_HOME`` in a temporary directory while the Spark tests run.

    The Spark driver keeps a private metadata cache per store under
    ``$XDG_CACHE_HOME/kvlog/spark``; the tests' stores are temporary, so are their caches.
    Set before the session's JVM starts, so its Python workers inherit it too.
    """
    saved = os.environ.get("XDG_CACHE_HOME")
    path = tmp_path_factory.mktemp("xdg-cache")
    os.environ["XDG_CACHE_HOME"] = str(path)
    yield path
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(scope="session")
def spark(private_caches: Path) -> Iterator[Any]:
    """The one SparkSession of the Spark tests (stopped at the end of the session)."""
    import spark_ext

    saved = os.environ.get("JDK_JAVA_OPTIONS")
    os.environ["JDK_JAVA_OPTIONS"] = FAST_JVM  # read once, by the JVM the session starts
    try:
        session = spark_ext.get_session(SPARK_MASTER, app_name="kvlog-tests", **SPARK_CONF)
    finally:
        if saved is None:
            del os.environ["JDK_JAVA_OPTIONS"]
        else:
            os.environ["JDK_JAVA_OPTIONS"] = saved
    session.sparkContext.setLogLevel("ERROR")
    spark_ext.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kv() -> SimpleNamespace:
    """This module's helpers (conftest modules are not importable by name): ``kv.fill(...)``.

    Built from this module's own globals: ``sys.modules["conftest"]`` may be another
    directory's conftest when the whole suite runs.
    """
    return SimpleNamespace(**{name: value for name, value in globals().items() if not name.startswith("__")})


def open_store(path: Path | str, **settings: Any) -> kvlog.Store:
    """A store with manual flushes and no background compaction (4 partitions unless given)."""
    options = {"partitions": 4, **MANUAL, **settings}
    return kvlog.open(str(path), **options)


def fill(store: kvlog.Store, *, ops: int, keys: int, seed: int, delete_every: int = 7,
         flush_every: int = 97, model: dict[bytes, bytes] | None = None) -> dict[bytes, bytes]:
    """Random puts (and every ``delete_every``-th op a delete) over ``keys`` keys; the dict model."""
    rng = random.Random(seed)
    model = {} if model is None else model
    for i in range(ops):
        key = b"key-%05d" % rng.randrange(keys)
        if i % delete_every == delete_every - 1:
            store.delete(key)
            model.pop(key, None)
        else:
            value = b"value-%d-%d-" % (seed, i) + b"x" * rng.randrange(0, 40)
            store.put(key, value)
            model[key] = value
        if i % flush_every == flush_every - 1:
            store.flush()
    store.flush()
    return model


def log_rows(store: kvlog.Store) -> list[tuple[int, int, int, bytes, bytes | None]]:
    """Every live record as (partition, offset, timestamp, key, value), in partition then offset order."""
    return [(r.partition, r.offset, r.timestamp_ms, r.key, r.value) for r in store.changes()]


def live_batches(store: kvlog.Store) -> list[dict[str, Any]]:
    """The batch directory of the store's live batches (partition then offset order)."""
    def collect(r: Any) -> list[dict[str, Any]]:
        return [b for p in range(store.log.partitions) for b in r.iter_batches(p, 0)]

    store.log.refresh()
    batches: list[dict[str, Any]] = store.log.snapshot(collect)
    return batches


def live_files(store: kvlog.Store) -> set[str]:
    """Paths of the store's live data files."""
    store.log.refresh()
    return {entry.path for _id, entry in store.log.snapshot(lambda r: list(r.iter_files()))}


def data_files_on_disk(root: Path | str) -> set[str]:
    """Every data file under a local store's root, as store-relative paths."""
    base = Path(root)
    return {str(p.relative_to(base)) for p in (base / "data").rglob("*") if p.is_file()}


def survivors_by_partition(store: kvlog.Store) -> dict[int, list[int]]:
    """The surviving offsets of every partition."""
    out: dict[int, list[int]] = {p: [] for p in range(store.log.partitions)}
    for r in store.changes():
        out[r.partition].append(r.offset)
    return out


def table_rows(table: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    """The rows of a pyarrow Table (from ``DataFrame.toArrow()``) as tuples, binary as bytes."""
    data = [table.column(c).to_pylist() for c in columns]
    return [tuple(bytes(v) if isinstance(v, bytearray) else v for v in row) for row in zip(*data, strict=True)]
