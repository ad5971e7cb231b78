"""``kvlog demo``: the whole mission on embedded defaults, with a readable summary.

Writes about a million records with Zipf-distributed keys (so many keys are
updated many times) and some deletes, verifies a sample and the key count
against a plain dict, compacts and shows the space reclaimed, verifies again,
reopens the store read-only to show durability, checks the invariants, and
(when a ``materialize`` step is given, as ``kvlog demo`` does) materializes
the latest state with Spark in local mode and checks it against ``get``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
) -> DemoResult:
    """Run the demo in ``path`` (a fresh temporary directory by default)."""
    import kvlog
    from kvlog.progress import progress

    root = path or tempfile.mkdtemp(prefix="kvlog-demo-")
    os.makedirs(root, exist_ok=True)
    say(f"kvlog demo: store at {root}")
    model: dict[bytes, bytes] = {}
    key_ids = _keys(records, key_space, seed)
    result = DemoResult(root, records, 0)
    started = time.perf_counter()
    with kvlog.open(root, background_compaction=False) as store:
        with progress("writing", records, enabled=progress_bars) as bar:
            step = 10_000
            for start in range(0, records, step):
                for i in range(start, min(start + step, records)):
                    key = b"user:%08d" % key_ids[i]
                    if i % delete_every == delete_every - 1:
                        store.delete(key)
                        model.pop(key, None)
                    else:
                        value = b"profile-v%d-" % i + b"x" * 80
                        store.put(key, value)
                        model[key] = value
                bar.advance(min(step, records - start))
        version = store.flush()
        write_s = time.perf_counter() - started
        result.figures["write_s"] = round(write_s, 2)
        result.figures["writes_per_s"] = round(records / write_s)
        result.figures["version"] = version
        sample = sorted(model)[:: max(1, len(model) // 10_000)]
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
        say(f"compacting {stats['records']:,} records ({stats['file_bytes'] / 2**20:.1f} MiB in "
            f"{stats['files']} files)")
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
        if dict(store.scan(prefix=b"user:0000")) != {k: v for k, v in model.items() if k.startswith(b"user:0000")}:
            result.failures.append("after compaction: a prefix scan differs from the model")
    with kvlog.open(root, read_only=True) as reader:
        for key in sample[:1000]:
            if reader.get(key) != model[key]:
                result.failures.append(f"read-only reopen: get({key!r}) differs")
        result.failures.extend(reader.check())
    if materialize is not None:
        say("materializing the latest state with Spark (local mode)")
        t = time.perf_counter()
        out_dir = os.path.join(root, "materialized")
        materialize(root, out_dir)
        result.figures["spark_s"] = round(time.perf_counter() - t, 2)
        import pyarrow.parquet as pq

        table = pq.read_table(out_dir, columns=["key", "value"])
        rows = dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))
        result.figures["spark_rows"] = len(rows)
        if rows != model:
            result.failures.append(f"Spark materialization has {len(rows):,} rows; differs from the model")
        with kvlog.open(root, read_only=True) as reader:
            for key in list(rows)[:2000]:
                if reader.get(key) != rows[key]:
                    result.failures.append(f"Spark row {key!r} differs from get()")
    result.live_keys = len(model)
    dead = 1 - stats["live_keys"] / max(stats["records"], 1)
    result.figures.update(
        records_in_log=stats["records"], live_keys=stats["live_keys"], data_files=stats["files"],
        file_bytes=stats["file_bytes"], dead_fraction=round(dead, 3),
        sample_checked=len(sample),
    )
    _summary(result, say)
    return result


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
