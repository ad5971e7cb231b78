"""The ``store.get_many`` benchmark: many keys read in one call, against its anchors.

kvlog's ``store.get_many`` of 100 keys is timed against 100 ``store.get`` calls on the same
store, py-lmdb's ``Cursor.getmulti`` of the same 100 keys (in a read transaction of its own,
as each ``get_many`` takes one snapshot) on an environment holding the same records, and
rocksdict's ``Rdict.get([...])`` on a database holding them. The four run interleaved within
each repeat, on the same random key lists, and every answer is checked.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from benchmarks.suite import Context

__all__ = ["KEYS_PER_CALL", "bench_store_get_many", "calls_for"]

#: Keys per ``get_many`` call (and per anchor call).
KEYS_PER_CALL = 100


def calls_for(records: int) -> int:
    """Calls per timed run: every record read about twice over, at least 20 calls, at most 5,000."""
    return max(20, min(5_000, 2 * records // KEYS_PER_CALL))


def _load_rocksdict(path: Path, keys: Sequence[bytes], values: Sequence[bytes]) -> Any:
    """A rocksdict database (raw mode, default options: WAL on, not synced) holding the records."""
    from rocksdict import Options, Rdict, WriteBatch

    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(str(path), options)
    for start in range(0, len(keys), 10_000):
        batch = WriteBatch(raw_mode=True)
        for key, value in zip(keys[start:start + 10_000], values[start:start + 10_000], strict=True):
            batch.put(key, value)
        db.write(batch)
    db.flush()
    return db


def bench_store_get_many(ctx: Context) -> dict[str, Any]:
    """get_many of 100 keys vs 100 gets, py-lmdb getmulti and rocksdict's list get."""
    from benchmarks.suite import make_entry, measurement

    s = ctx.settings
    store, env = ctx.store, ctx.lmdb_env
    if store is None or env is None:
        raise RuntimeError("the get_many benchmark needs the store left by the puts benchmark")
    n = len(ctx.keys)
    calls = calls_for(n)
    rng = np.random.default_rng(s.seed + 11)
    picks = rng.integers(0, n, size=(calls, KEYS_PER_CALL))
    lists = [[ctx.keys[i] for i in row] for row in picks.tolist()]
    expected = [[ctx.values[i] for i in row] for row in picks.tolist()]
    rocks_dir = ctx.new_dir("get-many-rocksdict")
    began = perf_counter()
    ctx.bar.describe(f"store.get_many: loading {n:,} records into rocksdict")
    load_t0 = perf_counter()
    rocks = _load_rocksdict(rocks_dir, ctx.keys, ctx.values)
    rocks_load_s = perf_counter() - load_t0
    try:
        def kvlog_get_many() -> list[list[bytes | None]]:
            get_many = store.get_many
            return [get_many(keys) for keys in lists]

        def kvlog_gets() -> list[list[bytes | None]]:
            get = store.get
            return [[get(k) for k in keys] for keys in lists]

        def lmdb_getmulti() -> list[list[bytes | None]]:
            out = []
            begin = env.begin
            for keys in lists:
                with begin() as txn:
                    found = dict(txn.cursor().getmulti(keys))
                out.append([found.get(k) for k in keys])
            return out

        def rocksdict_get() -> list[list[bytes | None]]:
            get = rocks.get
            return [get(keys) for keys in lists]

        contenders: list[tuple[str, Callable[[], list[list[bytes | None]]]]] = [
            ("kvlog", kvlog_get_many), ("kvlog_gets", kvlog_gets), ("lmdb_getmulti", lmdb_getmulti),
            ("rocksdict", rocksdict_get),
        ]
        for name, fn in contenders:  # correctness, untimed: every answer of every call
            if fn() != expected:
                raise AssertionError(f"{name} returned wrong values")
        runs: dict[str, list[float]] = {name: [] for name, _fn in contenders}
        for _ in range(max(3, s.repeats)):
            for name, fn in contenders:
                ctx.bar.describe(f"store.get_many: {calls:,} calls of {KEYS_PER_CALL} keys ({name})")
                t0 = perf_counter()
                fn()
                runs[name].append(calls * KEYS_PER_CALL / (perf_counter() - t0))
    finally:
        rocks.close()
        shutil.rmtree(rocks_dir, ignore_errors=True)
    method = (
        f"{calls:,} calls, each reading {KEYS_PER_CALL} keys drawn at random (numpy default_rng, "
        f"with repeats) from the {n:,} records the last puts run left, all flushed (kvlog's "
        f"100-byte values are inline in its LMDB key index). kvlog: store.get_many(keys), one "
        f"snapshot per call (its memtable, then one LMDB read transaction for the index). "
        f"Anchors: 100 store.get calls on the same store; py-lmdb Cursor.getmulti(keys) in a new "
        f"read transaction per call on the environment of the puts benchmark holding the same "
        f"records (py-lmdb defaults); rocksdict Rdict.get(list) on a database loaded with the "
        f"same records (raw mode, default options: WAL on, not synced; flushed to its SST files, "
        f"loaded in {rocks_load_s:.1f} s). The four run interleaved in each of "
        f"{max(3, s.repeats)} repeats, in the same process, on the same key lists; every answer "
        f"of every call is checked once, untimed. Unit: keys read per second. paired_ratios: kvlog's "
        f"run i / the anchor's run i (the range of the ratio)."
    )
    def anchor(key: str, name: str) -> dict[str, Any]:
        paired = [k / a for k, a in zip(runs["kvlog"], runs[key], strict=True)]
        return measurement(key, name, "keys/s", runs[key], paired_ratios=paired)

    return make_entry(
        "store.get_many", "store", "get_many of 100 keys", method,
        measurement("kvlog", "kvlog get_many(100 keys)", "keys/s", runs["kvlog"]),
        [anchor("kvlog_gets", "kvlog, 100 get calls"),
         anchor("lmdb_getmulti", "py-lmdb Cursor.getmulti, a read txn per call"),
         anchor("rocksdict", "rocksdict Rdict.get(list)")],
        seconds=perf_counter() - began, calls=calls, keys_per_call=KEYS_PER_CALL,
    )
