"""Tail a store's changelog while it is written, and rebuild its state from the log alone.

A producer thread writes and deletes keys. The consumer (the main thread)
reads ``store.changes(partition, from_offset)`` for every partition, applies
each record to a plain dict (a tombstone deletes), remembers the last offset it
saw per partition, and resumes from that offset + 1 on its next poll — as a
Kafka consumer of a compacted topic does. At the end the dict equals the store.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time

import kvlog

WRITES = 3000
KEYS = 300


def produce(store: kvlog.Store, done: threading.Event) -> None:
    """Write WRITES records over KEYS keys (every tenth one a delete), flushing now and then."""
    rng = random.Random(42)
    for i in range(WRITES):
        key = f"sensor:{rng.randrange(KEYS):04d}"
        if i % 10 == 9:
            store.delete(key)
        else:
            store.put(key, f"reading-{i}")
        if i % 250 == 249:
            store.flush()
            time.sleep(0.01)
    store.flush()
    done.set()


def poll(store: kvlog.Store, positions: dict[int, int], state: dict[bytes, bytes]) -> int:
    """Apply every durable record after the remembered positions; return how many there were."""
    seen = 0
    for partition in range(store.log.partitions):
        for record in store.changes(partition, positions[partition]):
            if record.value is None:
                state.pop(record.key, None)
            else:
                state[record.key] = record.value
            positions[partition] = record.offset + 1  # resume after the last record seen
            seen += 1
    return seen


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kvlog-tail-") as tmp:
        path = os.path.join(tmp, "sensors")
        with kvlog.open(path, partitions=4) as store:
            positions = {p: 0 for p in range(store.log.partitions)}
            state: dict[bytes, bytes] = {}
            done = threading.Event()
            producer = threading.Thread(target=produce, args=(store, done), name="producer")
            producer.start()
            polls = 0
            while not done.is_set():
                seen = poll(store, positions, state)
                polls += 1
                if seen:
                    print(f"poll {polls}: {seen} new records, next offsets {positions}")
                time.sleep(0.02)
            producer.join()
            seen = poll(store, positions, state)  # everything written is durable now
            print(f"final poll: {seen} new records, next offsets {positions}")

            expected = dict(store.scan())
            print(f"rebuilt {len(state)} keys from the changelog; the store has {len(expected)}")
            assert state == expected, "the changelog and the store disagree"
            print("the rebuilt dict equals the store")
    print("tail changelog: done")


if __name__ == "__main__":
    main()
