"""Memory is bounded by configuration, not by the number of keys (guarantee 6).

Two fresh processes write 200k and 1M distinct keys with the same bounded
settings; the peak anonymous memory (RssAnon, which leaves out LMDB's
memory-mapped pages) of the larger run may exceed the smaller one's by at most
64 MiB. A per-key leak of even ~80 bytes (a memtable that never forgets, an
index kept in Python) would show as more than that over the extra 800k keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from store_support import child_env, run_script

MiB_KIB = 1024
SMALL, LARGE = 200_000, 1_000_000

#: No background flusher: the writer itself flushes when 8 MiB wait (backpressure), so the
#: write buffer's high-water mark does not depend on thread scheduling; a 4 MiB read cache.
BOUNDED = {
    "flush_interval_ms": 0,
    "flush_bytes": 8 << 20,
    "max_unflushed_bytes": 8 << 20,
    "max_record_bytes": 1 << 20,
    "cache_bytes": 4 << 20,
    "background_compaction": False,
}


@pytest.mark.slow
def test_memory_does_not_grow_with_the_number_of_keys(tmp_path: Path) -> None:
    runs = {}
    for n in (SMALL, LARGE):
        spec = {"uri": str(tmp_path / f"store-{n}"), "n": n, "settings": BOUNDED}
        runs[n] = run_script("memory_proc.py", spec, timeout=120)
        assert runs[n]["len"] == n + 1  # and the warm-up key
    small, large = runs[SMALL], runs[LARGE]
    growth_kib = large["peak_kib"] - small["peak_kib"]
    assert growth_kib < 64 * MiB_KIB, (
        f"peak RssAnon grew by {growth_kib / MiB_KIB:.1f} MiB from {SMALL} to {LARGE} keys: {runs}"
    )
    # The bounded write buffer keeps even the larger run modest above its own baseline.
    assert large["peak_kib"] - large["baseline_kib"] < 256 * MiB_KIB, runs


#: Defaults, but the background compactor looks for work every 300 ms instead of every 15 s, so
#: merges and cleaning rounds run while the keys are written and while they are read back.
COMPACTING = {"compaction_interval_ms": 300}


def _bench_rss(tmp_path: Path, keys: int, settings: dict[str, Any]) -> dict[str, Any]:
    """One fresh-process run of the store.memory benchmark's child (benchmarks.rss)."""
    command = [sys.executable, "-m", "benchmarks.rss", "--keys", str(keys), "--dir",
               str(tmp_path / f"bench-{keys}"), "--seed", "1", "--gets", "5000",
               "--settings", json.dumps(settings)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False,
                          env=child_env())
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["gets_missing"] == 0 and result["scanned"] == keys, result
    return result


@pytest.mark.slow
def test_memory_with_background_compaction_does_not_grow_with_the_number_of_keys(
    tmp_path: Path,
) -> None:
    """Flushes on the background thread and compaction jobs while writing and reading: the
    allocators' retained memory (kvlog.memory) must not accumulate with the rounds. RssAnon is
    sampled every 5 ms by the child. The margin is generous (the benchmark's target is 64 MiB at
    100k vs 5M keys); what it catches is memory that grows with every flush or round."""
    small = _bench_rss(tmp_path, 50_000, COMPACTING)
    large = _bench_rss(tmp_path, 1_000_000, COMPACTING)
    growth_kib = large["peak_kib"] - small["peak_kib"]
    assert growth_kib < 128 * MiB_KIB, (
        f"peak RssAnon grew by {growth_kib / MiB_KIB:.1f} MiB from 50k to 1M keys: {small} {large}"
    )
    # Reading back (gets, then a full scan) needs no more than writing did.
    assert large["peak_read_kib"] - small["peak_read_kib"] < 128 * MiB_KIB, (small, large)
