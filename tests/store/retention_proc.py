"""A writer process for the commit-retention soak: writes, checkpoints and collects.

Arguments: the store's path, this process's cache_dir, its name, and how many seconds to
run. Every round it writes three keys, flushes, writes a checkpoint and runs ``gc()`` with
``commit_retention_ms=0``. A store error is recorded and the store reopened (the advised
remedy); the process then prints one JSON line: its acknowledged keys, the errors seen, the
reopens that failed, and how many rounds it ran.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import kvlog
from kvlog.errors import KvlogError

SETTINGS: dict[str, Any] = {"flush_interval_ms": 0, "background_compaction": False, "commit_retention_ms": 0,
            "file_delete_delay_ms": 1000, "partitions": 2}


def main() -> None:
    root, cache, name, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    store = kvlog.open(root, cache_dir=cache, **SETTINGS)
    acked: list[str] = []
    errors: list[str] = []
    failed_reopens: list[str] = []
    rounds = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rounds += 1
        keys = [f"{name}-{rounds}-{i}" for i in range(3)]
        try:
            for key in keys:
                store.put(key, key)
            store.flush()
            acked.extend(keys)
            store.log.write_checkpoint()
            store.gc()
        except KvlogError as e:
            errors.append(f"{type(e).__name__}: {e}")
            store.close(flush=False)
            try:
                store = kvlog.open(root, cache_dir=cache, **SETTINGS)
            except KvlogError as again:
                failed_reopens.append(f"{type(again).__name__}: {again}")
                break
    store.close()
    print(json.dumps({"acked": acked, "errors": errors, "failed_reopens": failed_reopens,
                      "rounds": rounds}))


if __name__ == "__main__":
    main()
