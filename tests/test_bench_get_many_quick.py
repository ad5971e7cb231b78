"""The get_many benchmark keeps working: a tiny run, its entry and its anchors.

Tiny sizes (3,000 records, 60 calls of 100 keys), so this checks that every contender
answers every call correctly (the benchmark raises otherwise) and the shape of the entry,
not the figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.get_many import KEYS_PER_CALL, calls_for
from benchmarks.suite import TINY, run_suite

pytestmark = pytest.mark.slow


def test_get_many_benchmark_runs(tmp_path: Path) -> None:
    document = run_suite(TINY, work_dir=tmp_path, only=["store.get_many"], progress=False)
    entries = {e["id"]: e for e in document["benchmarks"]}
    assert set(entries) == {"store.puts", "store.get_many"}  # the puts leave the store it reads
    entry = entries["store.get_many"]
    assert entry["status"] == "ok", entry.get("traceback") or entry
    assert entry["calls"] == calls_for(TINY.records) and entry["keys_per_call"] == KEYS_PER_CALL
    assert entry["subject"]["unit"] == "keys/s" and len(entry["subject"]["runs"]) >= 3
    assert [a["key"] for a in entry["anchors"]] == ["kvlog_gets", "lmdb_getmulti", "rocksdict"]
    for anchor in entry["anchors"]:
        assert len(anchor["runs"]) == len(entry["subject"]["runs"])
        assert all(r > 0 for r in anchor["runs"])
        ratio = entry["ratios"][anchor["key"]]["ratio"]
        assert ratio == pytest.approx(entry["subject"]["value"] / anchor["value"])
    assert "interleaved" in entry["method"] and "not synced" in entry["method"]
