"""A service that keeps an in-memory cache of a store by following its changelog, and resumes
after a restart from the offsets its consumer group committed in the store.

A writer thread puts and deletes keys. The rebuilder reads them through
``store.consumer("cache-rebuilder")``: each record is applied to a dict (a tombstone
deletes), and ``commit()`` stores the group's positions in the store every few hundred
records. Halfway through, the rebuilder "crashes" (its store handle is closed without
committing the last records it applied) and starts again: its new consumer begins at the
committed offsets, so the records after them are applied a second time — harmless, because
applying a record is idempotent — and none is missed. At the end the cache equals the store.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading

import kvlog

WRITES = 4000
KEYS = 400
GROUP = "cache-rebuilder"


def write(path: str, done: threading.Event) -> None:
    """Write WRITES records over KEYS keys (every seventh one a delete) from another handle."""
    rng = random.Random(7)
    with kvlog.open(path, cache_dir=os.path.join(path, "writer-cache"), flush_interval_ms=50) as store:
        for i in range(WRITES):
            key = f"item:{rng.randrange(KEYS):04d}"
            if i % 7 == 6:
                store.delete(key)
            else:
                store.put(key, f"price-{i}")
            if i % 500 == 499:
                store.flush()
    done.set()


def apply(cache: dict[bytes, bytes], records: list[kvlog.Record]) -> None:
    """Apply changelog records to the cache: the latest value of a key wins, a tombstone deletes."""
    for record in records:
        if record.value is None:
            cache.pop(record.key, None)
        else:
            cache[record.key] = record.value


def run(path: str, cache: dict[bytes, bytes], writer_done: threading.Event, *, stop_after: int | None) -> int:
    """Consume until the writer is done and everything is applied (or ``stop_after`` records:
    then return without committing, as a crash would). Returns the records applied."""
    applied = 0
    with kvlog.open(path, flush_interval_ms=0) as store:
        consumer = store.consumer(GROUP)
        print("started at offsets", [consumer.position(p) for p in consumer.partitions])
        while True:
            records = consumer.poll(timeout_s=0.5, max_records=250)
            apply(cache, records)
            applied += len(records)
            if stop_after is not None and applied >= stop_after:
                return applied  # the last records applied are not committed
            if records:
                consumer.commit()
            elif writer_done.is_set():
                store.refresh()
                if not consumer.poll(timeout_s=0):
                    consumer.commit()
                    return applied


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        kvlog.open(path).close()  # create it before both sides start
        done = threading.Event()
        writer = threading.Thread(target=write, args=(path, done))
        writer.start()
        cache: dict[bytes, bytes] = {}
        first = run(path, cache, done, stop_after=WRITES // 2)
        print(f"applied {first} records, then stopped without committing the last ones")
        second = run(path, cache, done, stop_after=None)  # the restarted service
        writer.join()
        print(f"after the restart applied {second} more records")
        with kvlog.open(path, read_only=True) as store:
            expected = dict(store.scan())
        assert cache == expected, "the cache differs from the store"
        print(f"{len(cache)} keys in the cache")
        print("the rebuilt cache equals the store")


if __name__ == "__main__":
    main()
