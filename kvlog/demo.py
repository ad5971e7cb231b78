"""``kvlog demo``: the whole mission on embedded defaults, with a readable summary.

Writes about a million records with Zipf-distributed keys (so many keys are
updated many times) and some deletes, verifies a sample and the key count
against a plain dict, compacts and shows the space reclaimed, verifies again,
reopens the store read-only to show durability, checks the invariants, and
(when a ``materialize`` step is given, as ``kvlog demo`` does) materializes
the latest state with Spark in local mode and checks it against ``get``.

The store goes in a new temporary directory (or an empty ``path``), named in the first
line; it is removed at the end, after a failure and after an interrupt too, unless
``keep`` is given. Each step is shown while it runs: a spinner with the elapsed time on
a terminal, a line when it starts and one with its time when it ends otherwise (a log).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvlog.errors import ConfigError

__all__ = ["DemoResult", "run_demo"]


@dataclass
class DemoResult:
    """Figures of one demo run."""

    path: str
    records: int
    live_keys: int
    failures: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


def _keys(n: int, key_space: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    draws = rng.zipf(1.3, size=n)
    return np.minimum(draws, key_space) - 1


class _Steps:
    """Shows each step while it runs and says how long it took."""

    def __init__(self, say: Callable[[str], None], live: bool) -> None:
        self._say = say
        self._live = live

    @contextmanager
    def __call__(self, text: str, *, spinner: bool = True) -> Iterator[None]:
        """Run the body as the step ``text``: a spinner on a terminal (unless ``spinner`` is
        false: the step draws its own bar), a start line otherwise; then its time."""
        started = time.perf_counter()
        if self._live and spinner:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
            with Progress(*columns, console=Console(file=sys.stdout), transient=True) as bar:
                bar.add_task(text, total=None)
                yield
        else:
            if not self._live:
                self._say(f"{text} ...")
                sys.stdout.flush()  # a log shows the step while it runs, not when the buffer fills
            yield
        self._say(f"{text}: done in {time.perf_counter() - started:.1f} s")


def _fresh_root(path: str | None) -> str:
    """The demo's store directory: ``path`` if it is missing or empty, else a new temporary one.

    A ``path`` holding files is refused before anything is written, since the demo removes
    its directory at the end.
    """
    if path is None:
        return tempfile.mkdtemp(prefix="kvlog-demo-")
    if os.path.lexists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise ConfigError(f"demo path {path!r} exists and is not an empty directory: the demo makes "
                          "its store in a new or empty directory (and removes it afterwards)")
    os.makedirs(path, exist_ok=True)
    return path


def run_demo(
    path: str | None = None,
    *,
    records: int = 1_000_000,
    key_space: int = 200_000,
    delete_every: int = 10,
    seed: int = 7,
    say: Callable[[str], None] = print,
    progress_bars: bool | None = None,
    materialize: Callable[[str, str], Any] | None = None,
    keep: bool = False,
    live: bool | None = None,
) -> DemoResult:
    """Run the demo in ``path`` (a missing or empty directory; a new temporary one by default).

    The store is removed when the demo ends, however it ends, unless ``keep``; either way
    the last line says so. ``live`` shows spinners (default: when ``say`` is :func:`print`
    and standard output is a terminal); ``progress_bars`` the bar of the write step.
    """
    if not isinstance(records, int) or isinstance(records, bool) or records <= 0:
        raise ConfigError(f"records must be a whole number above zero, not {records!r}")
    root = _fresh_root(path)
    if keep:
        say(f"kvlog demo: store at {root} (kept at the end)")
    else:
        say(f"kvlog demo: store at {root} (removed at the end; --keep keeps it)")
    sys.stdout.flush()
    shown = (say is print and sys.stdout.isatty()) if live is None else live
    try:
        result = _run(root, records, key_space, delete_every, seed, say, progress_bars, materialize,
                      _Steps(say, shown))
    except BaseException:
        _finish(root, keep, say, "the demo stopped: ")
        raise
    _finish(root, keep, say, "")
    return result


def _finish(root: str, keep: bool, say: Callable[[str], None], prefix: str) -> None:
    """Remove the demo's store unless ``keep``, and say where it is or that it is gone."""
    if keep:
        say(f"{prefix}kept the demo store at {root}")
        return
    shutil.rmtree(root, ignore_errors=True)
    say(f"{prefix}removed the demo store {root} (--keep keeps it)")


def _run(
    root: str, records: int, key_space: int, delete_every: int, seed: int, say: Callable[[str], None],
    progress_bars: bool | None, materialize: Callable[[str, str], Any] | None, step: _Steps,
) -> DemoResult:
    """The demo's steps on the store at ``root``."""
    import kvlog
    from kvlog.progress import progress

    model: dict[bytes, bytes] = {}
    key_ids = _keys(records, key_space, seed)
    result = DemoResult(root, records, 0)
    with kvlog.open(root, background_compaction=False) as store:
        started = time.perf_counter()
        with step(f"writing {records:,} records (Zipf-distributed keys, every {delete_every}th a delete)",
                  spinner=False), progress("writing", records, enabled=progress_bars) as bar:
            chunk = 10_000
            for start in range(0, records, chunk):
                for i in range(start, min(start + chunk, records)):
                    key = b"user:%08d" % key_ids[i]
                    if i % delete_every == delete_every - 1:
                        store.delete(key)
                        model.pop(key, None)
                    else:
                        value = b"profile-v%d-" % i + b"x" * 80
                        store.put(key, value)
                        model[key] = value
                bar.advance(min(chunk, records - start))
            version = store.flush()
        write_s = time.perf_counter() - started
        result.figures["write_s"] = round(write_s, 2)
        result.figures["writes_per_s"] = round(records / write_s)
        result.figures["version"] = version
        sample = sorted(model)[:: max(1, len(model) // 10_000)]
        with step(f"checking {len(sample):,} keys, deleted keys and the key count against a dict"):
            t = time.perf_counter()
            for key in sample:
                if store.get(key) != model[key]:
                    result.failures.append(f"get({key!r}) differs from the model")
            result.figures["gets_per_s"] = round(len(sample) / max(time.perf_counter() - t, 1e-9))
            deleted = [b"user:%08d" % k for k in range(0, key_space, 997) if b"user:%08d" % k not in model]
            for key in deleted[:1000]:
                if store.get(key) is not None:
                    result.failures.append(f"deleted key {key!r} is still readable")
            if len(store) != len(model):
                result.failures.append(f"store has {len(store)} keys, the model {len(model)}")
        stats = store.stats()
        with step(f"compacting {stats['records']:,} records ({stats['file_bytes'] / 2**20:.1f} MiB in "
                  f"{stats['files']} files) and checking again"):
            t = time.perf_counter()
            report = store.compact(force=True)
            result.figures["compact_s"] = round(time.perf_counter() - t, 2)
            after = store.stats()
            result.figures.update(
                records_removed=report.records_removed, tombstones_kept=after["records"] - after["live_keys"],
                bytes_before=stats["file_bytes"], bytes_after=after["file_bytes"],
                records_after=after["records"],
            )
            for key in sample:
                if store.get(key) != model[key]:
                    result.failures.append(f"after compaction: get({key!r}) differs from the model")
            if dict(store.scan(prefix=b"user:0000")) != {k: v for k, v in model.items()
                                                          if k.startswith(b"user:0000")}:
                result.failures.append("after compaction: a prefix scan differs from the model")
    with step("reopening the store read-only and running check()"), kvlog.open(root, read_only=True) as reader:
        for key in sample[:1000]:
            if reader.get(key) != model[key]:
                result.failures.append(f"read-only reopen: get({key!r}) differs")
        result.failures.extend(reader.check())
    if materialize is not None:
        out_dir = os.path.join(root, "materialized")
        with step("materializing the latest state with Spark (local mode; the JVM takes a while to start)"):
            t = time.perf_counter()
            materialize(root, out_dir)
            result.figures["spark_s"] = round(time.perf_counter() - t, 2)
        with step("checking Spark's table against the dict and get()"):
            _check_materialized(root, out_dir, model, result)
    result.live_keys = len(model)
    dead = 1 - stats["live_keys"] / max(stats["records"], 1)
    result.figures.update(
        records_in_log=stats["records"], live_keys=stats["live_keys"], data_files=stats["files"],
        file_bytes=stats["file_bytes"], dead_fraction=round(dead, 3),
        sample_checked=len(sample),
    )
    _summary(result, say)
    return result


def _check_materialized(root: str, out_dir: str, model: dict[bytes, bytes], result: DemoResult) -> None:
    """Compare the Parquet table Spark wrote with the model and with the store's ``get``."""
    import pyarrow.parquet as pq

    import kvlog

    table = pq.read_table(out_dir, columns=["key", "value"])
    rows = dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))
    result.figures["spark_rows"] = len(rows)
    if rows != model:
        result.failures.append(f"Spark materialization has {len(rows):,} rows; differs from the model")
    with kvlog.open(root, read_only=True) as reader:
        for key in list(rows)[:2000]:
            if reader.get(key) != rows[key]:
                result.failures.append(f"Spark row {key!r} differs from get()")


def _summary(result: DemoResult, say: Callable[[str], None]) -> None:
    f = result.figures
    say("")
    say("summary")
    say(f"  records written       {result.records:>12,}")
    say(f"  records in the log    {f['records_in_log']:>12,}")
    say(f"  live keys             {f['live_keys']:>12,}  (model: {result.live_keys:,})")
    say(f"  data files            {f['data_files']:>12,}  ({f['file_bytes'] / 2**20:.1f} MiB)")
    say(f"  dead fraction         {f['dead_fraction']:>12.1%}  (superseded records compaction can remove)")
    say(f"  write throughput      {f['writes_per_s']:>12,} records/s (buffered, then flushed)")
    say(f"  get throughput        {f['gets_per_s']:>12,} gets/s")
    say(f"  compaction            {f['records_removed']:>12,} records removed in {f['compact_s']} s; "
        f"{f['records_after']:,} left ({f['tombstones_kept']:,} tombstones kept for delete_retention_ms)")
    say(f"  space                 {f['bytes_before'] / 2**20:>10.1f} MiB -> {f['bytes_after'] / 2**20:.1f} MiB "
        f"({1 - f['bytes_after'] / max(f['bytes_before'], 1):.0%} reclaimed)")
    if "spark_rows" in f:
        say(f"  Spark materialization {f['spark_rows']:>12,} rows in {f['spark_s']} s, equal to the dict and to get()")
    say(f"  commit version        {f['version']:>12,}")
    say(f"  checked               {f['sample_checked']:,} keys against a dict, the key count, "
        "a read-only reopen, check()")
    if result.failures:
        say(f"FAILED: {len(result.failures)} problem(s)")
        for line in result.failures[:20]:
            say(f"  - {line}")
    else:
        say("all checks passed")
