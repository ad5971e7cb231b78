"""A writer and compactor process for tests/store/test_tombstone_hold_processes.py.

Until ``stop_file`` exists (or it has written ``writes`` records), it puts, deletes and writes
records with a time to live over ``keys`` keys, drawn from ``seed``, and after every few
writes flushes and runs a forced compaction with ``delete_retention_ms=0`` (a tombstone goes
the round after the one that first keeps it, unless a group holds it), and often ``gc()`` with
the shortest ``file_delete_delay_ms``. It prints one JSON line at the end: the writes and the
compaction rounds it made, and how many were refused (and a line after each round).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import kvlog


def main() -> None:
    spec = json.loads(os.environ["KVLOG_TEST_SPEC"])
    rng = random.Random(spec["seed"])
    stop = Path(spec["stop_file"])
    rounds = refused = writes = 0
    with kvlog.open(spec["uri"], storage_options=spec["storage_options"], cache_dir=spec["cache_dir"],
                    flush_interval_ms=0, background_compaction=False, file_delete_delay_ms=1000,
                    delete_retention_ms=0, min_cleanable_dirty_ratio=0.0,
                    offset_map_bytes=spec.get("offset_map_bytes", 1 << 20)) as store:
        while writes < spec["writes"] and not stop.exists():
            for _ in range(rng.randint(1, 8)):
                key = f"k{rng.randrange(spec['keys']):03d}"
                roll = rng.random()
                if roll < 0.3:
                    store.delete(key)
                elif roll < 0.4:
                    store.put(key, f"ttl-{writes}", ttl_ms=rng.choice([1, 50, 600_000]))
                else:
                    store.put(key, f"v{writes}")
                writes += 1
            store.flush()
            report = store.compact(force=True)
            rounds += report.rounds
            refused += report.refused
            print(json.dumps({"round": rounds, "refused": refused}))  # progress, for a parent that kills
            if rng.random() < 0.3:
                store.gc()
    print(json.dumps({"writes": writes, "rounds": rounds, "refused": refused}))


if __name__ == "__main__":
    main()
