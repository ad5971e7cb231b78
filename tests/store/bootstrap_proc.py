"""A writer process for tests/store/test_bootstrap.py: puts, deletes, records with a time to
live, compactions and garbage collection, drawn from a seed, until it has written ``writes``
records; prints ``{"done": true}`` at the end. Its spec comes in ``KVLOG_TEST_SPEC``."""

from __future__ import annotations

import json
import os
import random

import kvlog


def main() -> None:
    spec = json.loads(os.environ["KVLOG_TEST_SPEC"])
    rng = random.Random(spec["seed"])
    with kvlog.open(spec["uri"], storage_options=spec["storage_options"], cache_dir=spec["cache_dir"],
                    flush_interval_ms=5, background_compaction=False, file_delete_delay_ms=1000,
                    delete_retention_ms=0) as store:
        for i in range(spec["writes"]):
            key = f"k{rng.randrange(spec['keys']):03d}"
            roll = rng.random()
            if roll < 0.2:
                store.delete(key)
            elif roll < 0.25:
                ttl = rng.choice([1, 600_000])
                store.put(key, f"ttl{ttl}-{i}", ttl_ms=ttl)  # the value says how long it lives
            else:
                store.put(key, f"v{i}")
            if rng.random() < 0.01:
                store.flush()
                store.compact(force=True)
            if rng.random() < 0.005:
                store.gc()
        store.flush()
    print(json.dumps({"done": True}))


if __name__ == "__main__":
    main()
