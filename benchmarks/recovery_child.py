"""The processes of the recovery benchmark: writers that are killed, and the reopen that is timed.

The parent (:mod:`benchmarks.recovery`) runs this file's source with ``python -c``, not
``python -m benchmarks.recovery_child``: running any ``kvlog.*`` module imports ``kvlog``
first, and the reopen must time that import itself, and must not pay it at all when it
reopens py-lmdb or rocksdict. So nothing here imports ``kvlog`` at module level.

Roles (the first argument), each printing one JSON object per line on stdout:

``write-kvlog``
    loads ``--keys`` records into a new local store, one commit (``store.flush()``) per
    ``--commit-records``, with ``background_compaction=False`` and no background flusher
    (``flush_interval_ms=0``, so no quiet spell merges the index runs behind the parent's back).
    After commit ``K - index_run_limit`` of ``K`` it merges the index runs (what a quiet writer
    does), so the last ``index_run_limit`` commits' runs are pending at the end. Then, by
    ``--state``: ``closed``: ``close()``; ``settled``: ``log.settle_index()``; ``pending_runs``
    and ``cache_lost``: nothing; ``mid_flush``: puts ``--commit-records`` more records (indices ``keys ..``) and
    flushes them, a flush whose commit leaves one run more than the limit and so merges them
    all. It prints ``{"event": "ready"}`` (for ``mid_flush``: ``"flushing"`` as that flush
    starts and ``"flushed"`` when it returns) and waits to be killed.
``load-lmdb`` / ``load-rocksdict``
    loads the same records into a new py-lmdb environment (one write transaction per commit's
    records, synced once at the end) or rocksdict database (``Options(raw_mode=True)``, default
    WAL), closes it and exits.
``kill-lmdb`` / ``kill-rocksdict``
    opens the loaded database, puts ``--commit-records`` new random records (derived from
    ``--salt``; py-lmdb: inside one write transaction it never commits), prints
    ``{"event": "ready"}`` and waits.
``reopen``
    times ``import`` of the store's module, its open and the first get of ``--key`` (whose value
    must be ``--value``), then prints the figures and leaves at once (``os._exit``: closing is
    not part of what a user waits for, and a kvlog store's close would merge its runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvlog import Log

VALUE_BYTES = 100
KEY_BYTES = 16


def emit(**fields: Any) -> None:
    """One JSON line to the parent, flushed at once (the parent acts on it)."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def wait_to_be_killed() -> None:
    """Sleep until the parent's SIGKILL (an hour at most, should the parent die first)."""
    time.sleep(3600)
    sys.exit(3)


def commits(keys: int, commit_records: int, seed: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """The loaded records, one commit's worth at a time: keys and values of records
    ``j * commit_records ..`` (the parent recomputes any record's value the same way)."""
    from benchmarks.data import make_keys, make_values

    for start in range(0, keys, commit_records):
        count = min(commit_records, keys - start)
        yield make_keys(start, count, seed), make_values(start, count, seed)


def index_runs_pending(log: Log) -> int:
    """Key-index runs a kvlog log holds not merged yet (``Store.stats()`` reports them too, but
    also counts the live keys, which costs a pass over the pending runs)."""
    return int(log.snapshot(lambda r: r.runs_pending()))


def write_kvlog(args: argparse.Namespace) -> None:
    import kvlog
    from benchmarks.data import make_keys, make_values

    settings = {**json.loads(args.settings), "background_compaction": False, "flush_interval_ms": 0,
                "flush_bytes": 1 << 50, "max_unflushed_bytes": 1 << 50}
    store = kvlog.open(args.dir, **settings)
    log = store.log
    limit = store.config.index_run_limit
    total = -(-args.keys // args.commit_records)
    settle_after = total - limit if limit > 0 else 0
    began = time.perf_counter()
    flush_times: list[float] = []
    merge_s = 0.0
    for done, (keys, values) in enumerate(commits(args.keys, args.commit_records, args.seed), 1):
        put = store.put
        for key, value in zip(keys, values, strict=True):
            put(key, value)
        t0 = time.perf_counter()
        store.flush()
        flush_times.append(time.perf_counter() - t0)
        if done == settle_after:
            t0 = time.perf_counter()
            log.settle_index()
            merge_s = time.perf_counter() - t0
        emit(event="commit", commits=done, index_runs=index_runs_pending(log),
             flush_s=flush_times[-1])
    load_s = time.perf_counter() - began
    # The median of the fastest three quarters of the flushes, which leaves out those that merged
    # the runs (one in index_run_limit + 1): the parent spaces its mid-flush kills by it.
    plain = sorted(flush_times)[: max(1, len(flush_times) * 3 // 4)]
    typical = plain[len(plain) // 2]
    facts: dict[str, Any] = {"load_s": load_s, "commits": total, "merge_s": merge_s,
                             "typical_flush_s": typical, "index_run_limit": limit}
    state = args.state
    if state == "closed":
        t0 = time.perf_counter()
        store.close()
        emit(event="ready", close_s=time.perf_counter() - t0, **facts)
    elif state == "settled":
        t0 = time.perf_counter()
        log.settle_index()
        emit(event="ready", settle_s=time.perf_counter() - t0,
             index_runs=index_runs_pending(log), **facts)
    elif state in ("pending_runs", "cache_lost"):
        emit(event="ready", index_runs=index_runs_pending(log), **facts)
    elif state == "mid_flush":
        keys = make_keys(args.keys, args.commit_records, args.seed)
        values = make_values(args.keys, args.commit_records, args.seed)
        for key, value in zip(keys, values, strict=True):
            store.put(key, value)
        runs = index_runs_pending(log)
        emit(event="flushing", index_runs=runs, **facts)
        t0 = time.perf_counter()
        store.flush()
        emit(event="flushed", flush_s=time.perf_counter() - t0,
             index_runs=index_runs_pending(log))
    else:
        raise SystemExit(f"unknown state {state!r}")
    wait_to_be_killed()


def load_lmdb(args: argparse.Namespace) -> None:
    import lmdb

    began = time.perf_counter()
    # Synced once at the end, not at every commit: the same file, without a wait per commit.
    env = lmdb.open(args.dir, map_size=args.map_size, sync=False)
    for keys, values in commits(args.keys, args.commit_records, args.seed):
        with env.begin(write=True) as txn:
            put = txn.put
            for key, value in zip(keys, values, strict=True):
                put(key, value)
    env.sync(True)
    env.close()
    emit(event="loaded", load_s=time.perf_counter() - began)


def _rocksdict_options() -> Any:
    from rocksdict import Options

    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return options


def load_rocksdict(args: argparse.Namespace) -> None:
    from rocksdict import Rdict

    began = time.perf_counter()
    db = Rdict(args.dir, _rocksdict_options())
    for keys, values in commits(args.keys, args.commit_records, args.seed):
        for key, value in zip(keys, values, strict=True):
            db[key] = value
    db.close()
    emit(event="loaded", load_s=time.perf_counter() - began)


def _random_records(count: int, salt: str) -> Iterator[tuple[bytes, bytes]]:
    """``count`` random-looking records (SHAKE-128 of ``salt``: new keys for each writer, the
    same for the same salt, none of them one of the loaded keys in practice)."""
    import hashlib

    step = KEY_BYTES + VALUE_BYTES
    raw = hashlib.shake_128(f"kvlog-bench-recovery {salt}".encode()).digest(count * step)
    for i in range(0, len(raw), step):
        yield raw[i : i + KEY_BYTES], raw[i + KEY_BYTES : i + step]


def kill_lmdb(args: argparse.Namespace) -> None:
    import lmdb

    env = lmdb.open(args.dir, map_size=args.map_size)
    txn = env.begin(write=True)
    for key, value in _random_records(args.commit_records, args.salt):
        txn.put(key, value)
    emit(event="ready", in_transaction=args.commit_records)
    wait_to_be_killed()


def kill_rocksdict(args: argparse.Namespace) -> None:
    from rocksdict import Rdict

    db = Rdict(args.dir, _rocksdict_options())
    for key, value in _random_records(args.commit_records, args.salt):
        db[key] = value
    emit(event="ready", unsynced_puts=args.commit_records)
    wait_to_be_killed()


def _time_cache_checks() -> list[float]:
    """Seconds of each structural check of the LMDB cache during the open (appended as they
    end): the open checks a cache that was not closed cleanly before LMDB reads it, and that
    check reads the whole file, so it is the part of an open that grows with the store.

    No public API times one step of an open, so this wraps kvlog's internal check function
    (``kvlog.meta.env.check_lmdb_file``) in place; where a kvlog has no such function it
    reports nothing rather than fail the run.
    """
    import importlib

    spent: list[float] = []
    try:
        env = importlib.import_module("kvlog.meta.env")
    except ImportError:
        return spent
    check = getattr(env, "check_lmdb_file", None)
    if check is None:
        return spent

    def timed(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return check(*args)
        finally:
            spent.append(time.perf_counter() - t0)

    setattr(env, "check_lmdb_file", timed)  # noqa: B010 (the module is imported by name)
    return spent


def reopen(args: argparse.Namespace) -> None:
    """Time the import, the open and the first get; check the value; report and leave."""
    key, expected = bytes.fromhex(args.key), bytes.fromhex(args.value)
    out: dict[str, Any] = {"event": "reopened", "kind": args.kind}
    if args.kind == "kvlog":
        t0 = time.perf_counter()
        import kvlog

        t1 = time.perf_counter()
        checks = _time_cache_checks()
        store = kvlog.open(args.dir, **json.loads(args.settings))
        t2 = time.perf_counter()
        value = store.get(key)
        t3 = time.perf_counter()
        out["cache_check_s"] = sum(checks)
        out["cache_disk_bytes"] = store.log.env.disk_bytes()
        out["index_runs"] = index_runs_pending(store.log)
        out["version"] = store.log.version
        if args.probe:
            out["probe_found"] = store.get(bytes.fromhex(args.probe)) is not None
    elif args.kind == "lmdb":
        t0 = time.perf_counter()
        import lmdb

        t1 = time.perf_counter()
        env = lmdb.open(args.dir, map_size=args.map_size)
        t2 = time.perf_counter()
        with env.begin() as txn:
            value = txn.get(key)
        t3 = time.perf_counter()
    elif args.kind == "rocksdict":
        t0 = time.perf_counter()
        from rocksdict import Rdict

        t1 = time.perf_counter()
        db = Rdict(args.dir, _rocksdict_options())
        t2 = time.perf_counter()
        value = db.get(key)
        t3 = time.perf_counter()
    else:
        raise SystemExit(f"unknown kind {args.kind!r}")
    out.update(import_s=t1 - t0, open_s=t2 - t1, get_s=t3 - t2, value_ok=value == expected)
    emit(**out)
    os._exit(0)


ROLES = {"write-kvlog": write_kvlog, "load-lmdb": load_lmdb, "load-rocksdict": load_rocksdict,
         "kill-lmdb": kill_lmdb, "kill-rocksdict": kill_rocksdict, "reopen": reopen}


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the role and its options and run it."""
    parser = argparse.ArgumentParser(prog="recovery_child")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--dir", required=True)
    parser.add_argument("--keys", type=int, default=0)
    parser.add_argument("--commit-records", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--state", default="")
    parser.add_argument("--settings", default="{}", help="JSON object of StoreConfig settings")
    parser.add_argument("--map-size", type=int, default=1 << 30)
    parser.add_argument("--kind", default="kvlog")
    parser.add_argument("--key", default="")
    parser.add_argument("--value", default="")
    parser.add_argument("--probe", default="", help="kvlog: a key whose presence is reported")
    parser.add_argument("--salt", default="", help="kill-*: what the random records derive from")
    args = parser.parse_args(argv)
    ROLES[args.role](args)


if __name__ == "__main__":
    main()
