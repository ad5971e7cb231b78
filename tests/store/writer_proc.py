"""A writer process for the recovery tests: writes until it is killed.

The spec (JSON in the KVLOG_TEST_SPEC environment variable) gives the store
(uri, storage_options, cache_dir), settings, a run id and a seed. The process
prints ``ready``, then writes forever, printing every key once its write is
acknowledged (one key per line, line-buffered):

* batches of 10 keys ``r<run>-b<n>-<i>`` sharing a batch id: acknowledged when
  the ``with store.batch()`` block has exited;
* single ``put(..., sync=True)`` of ``r<run>-s<n>``: acknowledged on return;
* a few plain puts of ``r<run>-p<n>`` then ``flush()``: acknowledged when
  flush() returns.

Values are a function of the key (:func:`value_for`), so the reader can check them.

With ``"threads": n`` in the spec the process instead runs ``n`` threads, each writing keys
``r<run>-t<thread>-<n>`` with ``put(..., sync=True)`` and printing each one when its put has
returned (one ``os.write`` per line: whole lines, however the threads interleave).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import zlib

import kvlog

BATCH_SIZE = 10


def value_for(key: str) -> bytes:
    """The value written for ``key``: small ones inline, some larger than inline_value_bytes."""
    pad = (zlib.crc32(key.encode()) % 3) * 800
    return f"value-of-{key}|".encode() + b"x" * pad


def main() -> None:
    spec = json.loads(os.environ["KVLOG_TEST_SPEC"])
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    rng = random.Random(spec["seed"])
    run = spec["run"]
    store = kvlog.open(
        spec["uri"], storage_options=spec["storage_options"], cache_dir=spec["cache_dir"],
        **spec.get("settings", {}),
    )
    print("ready")
    if spec.get("threads"):
        _sync_threads(store, run, int(spec["threads"]))
    n = 0
    while True:
        n += 1
        choice = rng.random()
        if choice < 0.45:
            keys = [f"r{run}-b{n:06d}-{i}" for i in range(BATCH_SIZE)]
            with store.batch() as b:
                for key in keys:
                    b.put(key, value_for(key))
        elif choice < 0.7:
            keys = [f"r{run}-s{n:06d}"]
            store.put(keys[0], value_for(keys[0]), sync=True)
        else:
            keys = [f"r{run}-p{n:06d}-{i}" for i in range(rng.randint(1, 20))]
            for key in keys:
                store.put(key, value_for(key))
            store.flush()
        for key in keys:
            print(key)


def _sync_threads(store: kvlog.Store, run: int, threads: int) -> None:
    """``threads`` threads of durable puts, each key printed once its put returned; forever."""
    out = sys.stdout.fileno()

    def write(thread: int) -> None:
        n = 0
        while True:
            n += 1
            key = f"r{run}-t{thread:02d}-{n:06d}"
            store.put(key, value_for(key), sync=True)
            os.write(out, f"{key}\n".encode())

    workers = [threading.Thread(target=write, args=(t,), daemon=True) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
