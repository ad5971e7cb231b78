"""Another process that overwrites keys, compacts and collects, for the idle-reader tests.

The spec (JSON in KVLOG_TEST_SPEC) gives the store, the keys to overwrite (``keys``, each
written with the value ``new-<key>`` padded past the inline size) and the settings. The
process opens the store with its own cache and a :class:`kvlog.ManualClock`, writes the keys
in one flush, runs a forced compaction, moves its clock past ``file_delete_delay_ms`` (the
default's 60 s unless the settings say otherwise), writes a metadata checkpoint if the spec
asks (``metadata_checkpoint``) and runs GC, then prints the GC's counts as JSON. So the files the compaction replaced are deleted at once, deterministically, however
long the delay.
"""

from __future__ import annotations

import json
import os
import time

import kvlog


def main() -> None:
    spec = json.loads(os.environ["KVLOG_TEST_SPEC"])
    clock = kvlog.ManualClock(int(time.time() * 1000))  # from now: the store's commits are real-time
    settings = spec.get("settings", {})
    store = kvlog.open(spec["uri"], storage_options=spec["storage_options"], cache_dir=spec["cache_dir"],
                       clock=clock, **settings)
    try:
        keys = spec["keys"]
        # Two commits when a checkpoint follows: GC then collects the first one as well.
        halves = [keys[:len(keys) // 2], keys[len(keys) // 2:]] if spec.get("metadata_checkpoint") else [keys]
        for half in halves:
            for key in half:
                store.put(key, f"new-{key}|" + "y" * 600)
            store.flush()
        store.compact(force=True)
        clock.advance(int(settings.get("file_delete_delay_ms", 60_000)) + 1)
        if spec.get("metadata_checkpoint"):
            # The commits below it are older in storage time (S3 keeps whole seconds).
            time.sleep(1.05 if spec["uri"].startswith("s3://") else 0.01)
            store.log.write_checkpoint()  # GC collects the commits below it past the retention
        print(json.dumps(store.gc()))
    finally:
        store.close()


if __name__ == "__main__":
    main()
