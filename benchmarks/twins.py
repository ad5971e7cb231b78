"""Each C extension against its pure-Python twin, on the user-visible operation it serves.

``python benchmarks/twins.py [--repeats 5] [--scale 1.0]`` prints, for each extension, the
seconds of the operation with the extension and with its twin, C and twin interleaved in each
repeat after one warm-up run of each (fresh stores, one process: the wrappers' module is
swapped between runs), and the ratio twin / C as a median with its range. The operations:

``_writebuffer``  200k puts of 16-byte keys and 100-byte values, then ``flush()``.
``_columns``      the same puts of 45k random 16-byte keys, then ``flush()`` (the commit: Arrow
                  columns, each key's last row in key order, the index entries); and the
                  flush alone.
``_kernels``      ``compact(force=True)`` of a store of 1M records (200k keys, 5 versions).
``_runs``         45k ``get`` of keys held by pending index runs and a full ``scan`` merging the
                  runs.
``_cache_check``  the cache check (``check_lmdb``) of the uncompacted 1M-record store's cache.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import kvlog
from kvlog.index import check_cache_file
from kvlog.meta.env import check_lmdb_file

#: extension: (C module, twin module, wrapper attributes that hold it)
MODULES = {
    "_writebuffer": ("kvlog.log._writebuffer", "kvlog.log._writebuffer_py", []),
    "_columns": ("kvlog.format._columns", "kvlog.format._columns_py", ["kvlog.format.columns._columns"]),
    "_kernels": ("kvlog.compaction._kernels", "kvlog.compaction._kernels_py", ["kvlog.compaction.kernels._kernels"]),
    "_runs": ("kvlog.index._runs", "kvlog.index._runs_py",
              ["kvlog.index.runs._runs", "kvlog.index.entry._runs", "kvlog.index.tree._runs"]),
    "_cache_check": ("kvlog.index._cache_check", "kvlog.index._cache_check_py", ["kvlog.index.entry._cache_check"]),
}
MANUAL: dict[str, Any] = {"flush_interval_ms": 0, "flush_bytes": 1 << 30, "max_unflushed_bytes": 1 << 31,
          "background_compaction": False}


def use(extension: str, implementation: str) -> None:
    """Make every wrapper of ``extension`` call ``implementation`` (``c`` or ``python``)."""
    compiled, twin, holders = MODULES[extension]
    module = importlib.import_module(compiled if implementation == "c" else twin)
    for holder in holders:
        name, attribute = holder.rsplit(".", 1)
        setattr(importlib.import_module(name), attribute, module)
    if extension == "_writebuffer":
        setattr(importlib.import_module("kvlog.log.flusher"), "WriteBuffer", module.WriteBuffer)  # noqa: B010
    if extension == "_runs":  # the get path's inline check, bound by name
        for holder in ("kvlog.index.entry", "kvlog.index.index"):
            setattr(importlib.import_module(holder), "index_inline", module.inline)  # noqa: B010


def keys_of(n: int, seed: int) -> list[bytes]:
    return [bytes(k) for k in np.random.default_rng(seed).integers(0, 256, (n, 16), dtype=np.uint8)]


def open_store(path: Path) -> kvlog.Store:
    return kvlog.open(path, partitions=4, config=kvlog.StoreConfig(**MANUAL))


def puts_and_flush(n: int, *, flush_only: bool = False) -> Callable[[Path], float]:
    """``n`` puts then ``flush()``, timed whole or (``flush_only``) the flush alone."""
    keys = keys_of(n, 1)
    value = b"v" * 100

    def run(path: Path) -> float:
        with open_store(path) as store:
            start = time.perf_counter()
            for key in keys:
                store.put(key, value)
            if flush_only:
                start = time.perf_counter()
            store.flush()
            return time.perf_counter() - start

    return run


def compaction(template: Path) -> Callable[[Path], float]:
    def run(path: Path) -> float:
        shutil.copytree(template, path, dirs_exist_ok=True)
        with open_store(path / "store") as store:
            start = time.perf_counter()
            store.compact(force=True)
            return time.perf_counter() - start

    return run


def run_reads(n: int) -> Callable[[Path], float]:
    keys = keys_of(n, 2)

    def run(path: Path) -> float:
        config = kvlog.StoreConfig(**MANUAL)
        with kvlog.open(path, partitions=4, config=config) as store:
            for key in keys:
                store.put(key, b"w" * 100)
            store.flush()  # its index entries wait in an index run
            start = time.perf_counter()
            for key in keys:
                store.get(key)
            sum(1 for _ in store.scan())
            return time.perf_counter() - start

    return run


def cache_check(template: Path) -> Callable[[Path], float]:
    data = next(template.rglob("data.mdb"))

    def run(path: Path) -> float:
        start = time.perf_counter()
        assert check_lmdb_file(data, check_cache_file) is None
        return time.perf_counter() - start

    return run


def build_template(root: Path, records: int, keys: int) -> Path:
    """A store of ``records`` puts over ``keys`` keys, flushed every ``keys`` records."""
    use("_writebuffer", "c")
    use("_columns", "c")
    use("_runs", "c")
    distinct = keys_of(keys, 3)
    with open_store(root / "store") as store:
        for version in range(records // keys):
            value = b"%d" % version * 20
            for key in distinct:
                store.put(key, value)
            store.flush()
    return root


def measure(extension: str, operation: Callable[[Path], float], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"c": [], "python": []}
    for implementation in ("c", "python"):  # a warm-up run of each, not counted
        use(extension, implementation)
        with tempfile.TemporaryDirectory() as tmp:
            operation(Path(tmp) / "s")
    for _ in range(repeats):
        for implementation in ("c", "python"):
            use(extension, implementation)
            with tempfile.TemporaryDirectory() as tmp:
                times[implementation].append(operation(Path(tmp) / "s"))
    use(extension, "c")
    return times


def report(label: str, times: dict[str, list[float]]) -> None:
    ratios = [p / c for c, p in zip(times["c"], times["python"], strict=True)]
    c_med, p_med = statistics.median(times["c"]), statistics.median(times["python"])
    print(f"{label:<48} C {c_med:8.3f} s [{min(times['c']):.3f}-{max(times['c']):.3f}]   "
          f"twin {p_med:8.3f} s [{min(times['python']):.3f}-{max(times['python']):.3f}]   "
          f"twin/C {statistics.median(ratios):5.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]   "
          f"C saves {100 * (1 - c_med / p_med):4.1f}%", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every record count")
    parser.add_argument("--only", nargs="*", default=list(MODULES))
    args = parser.parse_args()
    s = args.scale
    with tempfile.TemporaryDirectory() as tmp:
        if "_writebuffer" in args.only:
            report(f"_writebuffer: {int(200_000 * s)} puts + flush",
                   measure("_writebuffer", puts_and_flush(int(200_000 * s)), args.repeats))
        if "_columns" in args.only:
            report(f"_columns: {int(45_000 * s)} puts + flush (commit)",
                   measure("_columns", puts_and_flush(int(45_000 * s)), args.repeats))
            report(f"_columns: the flush (commit) of {int(45_000 * s)} keys alone",
                   measure("_columns", puts_and_flush(int(45_000 * s), flush_only=True), args.repeats))
        if "_runs" in args.only:
            report(f"_runs: {int(45_000 * s)} gets + scan over a pending run",
                   measure("_runs", run_reads(int(45_000 * s)), args.repeats))
        if "_kernels" in args.only or "_cache_check" in args.only:
            template = build_template(Path(tmp) / "template", int(1_000_000 * s), int(200_000 * s))
            if "_kernels" in args.only:
                report(f"_kernels: compact {int(1_000_000 * s)} records",
                       measure("_kernels", compaction(template), args.repeats))
            if "_cache_check" in args.only:
                report(f"_cache_check: check_lmdb of a {int(200_000 * s)}-key cache",
                       measure("_cache_check", cache_check(template), args.repeats))


if __name__ == "__main__":
    main()
