"""A consumer process for the multi-process consumer tests.

The spec (JSON in KVLOG_TEST_SPEC) gives the store, a mode and its arguments:

``poll``
    open read-only, create the group's consumer, print ``ready``, poll once with
    ``timeout_s``; print ``got <n> <keys...>`` when poll returns.
``consume``
    open, read ``count`` records through the group's consumer, commit, print the offsets
    committed as ``done <partition>:<offset>...`` and exit.
"""

from __future__ import annotations

import json
import os
import sys

import kvlog


def main() -> None:
    spec = json.loads(os.environ["KVLOG_TEST_SPEC"])
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    mode = spec["mode"]
    store = kvlog.open(spec["uri"], storage_options=spec["storage_options"], cache_dir=spec["cache_dir"],
                       read_only=mode == "poll", **spec.get("settings", {}))
    consumer = store.consumer(spec["group"])
    if mode == "poll":
        consumer.poll(timeout_s=0)  # reads what is there before the writer's put
        print("ready")
        records = consumer.poll(timeout_s=spec["timeout_s"])
        print("got", len(records), *(r.key.decode() for r in records))
    else:
        taken = 0
        while taken < spec["count"]:
            taken += len(consumer.poll(timeout_s=5, max_records=spec["count"] - taken))
        consumer.commit()
        print("done", *(f"{p}:{consumer.position(p)}" for p in consumer.partitions))
    store.close()


if __name__ == "__main__":
    main()
