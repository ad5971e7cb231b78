"""A process for the memory test: write N keys, report anonymous memory as JSON.

Spec (KVLOG_TEST_SPEC): ``uri``, ``n``, ``settings``. Anonymous memory
(``RssAnon`` in /proc/self/status) is sampled every 5,000 writes; LMDB pages
are file-backed and do not count (the kernel may drop them at will). Prints one JSON line:
``{"n", "baseline_kib", "peak_kib", "final_kib", "len", "seconds"}``.
"""

from __future__ import annotations

import gc
import json
import os
import time

import kvlog


def rss_anon_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


def main() -> None:
    spec = json.loads(os.environ["KVLOG_TEST_SPEC"])
    n = int(spec["n"])
    started = time.perf_counter()
    store = kvlog.open(spec["uri"], **spec["settings"])
    store.put(b"warm-up", b"x", sync=True)
    gc.collect()
    baseline = peak = rss_anon_kib()
    value = b"v" * 24
    for i in range(n):
        store.put(b"key-%012d" % i, value)
        if i % 5000 == 0:
            peak = max(peak, rss_anon_kib())
    store.flush()
    peak = max(peak, rss_anon_kib())
    gc.collect()
    final = rss_anon_kib()
    count = len(store)
    assert store.get(b"key-%012d" % (n - 1)) == value and store.get(b"key-%012d" % 0) == value
    store.close()
    print(json.dumps({"n": n, "baseline_kib": baseline, "peak_kib": peak, "final_kib": final,
                      "len": count, "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
