"""A child process that writes to a store until the disk under it is full.

It opens the store of the spec in ``KVLOG_TEST_SPEC`` and writes batches of records, each
made durable by a flush (or by a last ``put(sync=True)``): after that returns, the keys it
acknowledged are appended to the spec's ``acked`` file (on another filesystem than the full
one). The first ``StorageError`` ends the loop: the process prints ``FULL <message>`` and
waits for a line on stdin (the parent frees space meanwhile), then writes and flushes one more
batch with the same handle, prints ``RESUMED`` and closes the store. Any other error exits 3
with its traceback; a fatal signal (SIGBUS from a mapped page the disk had no block for) shows
as a negative return code in the parent.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import kvlog
from kvlog.errors import StorageError


def main() -> int:
    spec = json.loads(os.environ["KVLOG_TEST_SPEC"])
    store = kvlog.open(spec["uri"], cache_dir=spec["cache_dir"], partitions=2,
                       flush_interval_ms=3_600_000, flush_bytes=1 << 30, **spec.get("settings", {}))
    value = b"v" * spec["value_bytes"]
    with open(spec["acked"], "a") as acked:

        def write_batch(batch: int) -> None:
            keys = [b"b%06d-%04d" % (batch, i) for i in range(spec["batch_records"])]
            for key in keys:
                store.put(key, value)
            if spec.get("sync"):
                store.put(b"sync-%06d" % batch, value, sync=True)
                keys.append(b"sync-%06d" % batch)
            else:
                store.flush()
            acked.write("".join(k.decode() + "\n" for k in keys))
            acked.flush()
            os.fsync(acked.fileno())

        try:
            batch = 0
            try:
                while batch < spec["max_batches"]:
                    write_batch(batch)
                    batch += 1
            except StorageError as e:
                print("FULL", str(e).replace("\n", " ")[:300], flush=True)
            else:
                print("NOT FULL after", batch, "batches", flush=True)
                return 4
            sys.stdin.readline()  # the parent freed space
            write_batch(batch + 1)
            print("RESUMED", flush=True)
            store.close()
        except BaseException:
            traceback.print_exc()
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
