"""The compaction benchmarks keep working: a tiny run of every benchmark and the JSON it writes.

Sizes are tiny (TINY: tens of thousands of records), so this checks the shape of
the results, the loader and the child process, not the figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.compaction import SCHEMA, TINY, format_table, run_compaction_benchmarks

pytestmark = pytest.mark.slow

EXPECTED = [
    "compaction.map_capacity", "compaction.map_build", "compaction.map_memory", "compaction.one_round",
    "compaction.memory", "compaction.vs_io_floor", "compaction.memory_partitions",
    "compaction.requests_s3",
]


def _check_entry(entry: dict[str, Any]) -> None:
    assert entry["status"] == "ok", entry.get("traceback") or entry.get("reason")
    assert entry["group"] == "compaction"
    assert isinstance(entry["method"], str) and entry["method"]
    subject = entry["subject"]
    assert subject["unit"] == entry["unit"]
    assert isinstance(subject["value"], float) and subject["value"] >= 0
    assert subject["runs"] and all(isinstance(r, float) for r in subject["runs"])
    assert entry["anchors"], "every figure has an anchor"
    for anchor in entry["anchors"]:
        assert anchor["value"] > 0
        ratio = entry["ratios"][anchor["key"]]["ratio"]
        assert ratio is not None and ratio >= 0
        assert ratio == pytest.approx(subject["value"] / anchor["value"])


def test_quick_compaction_benchmarks(tmp_path: Path, seaweedfs: Any) -> None:
    document = run_compaction_benchmarks(True, tmp_path / "out", sizes=TINY, work_dir=tmp_path,
                                         seaweed=seaweedfs)
    written = tmp_path / "out" / "compaction-tiny.json"
    assert document["path"] == str(written)
    on_disk = json.loads(written.read_text(encoding="utf-8"))
    assert on_disk["schema"] == SCHEMA and on_disk["mode"] == "tiny"
    returned = {k: v for k, v in document.items() if k != "path"}
    assert json.loads(json.dumps(returned)) == on_disk  # JSON-able as returned
    for key in ("cpu", "cores", "python", "versions", "loadavg_start", "loadavg_end"):
        assert key in on_disk["machine"]
    assert on_disk["method"] and on_disk["sizes"]["records"] == TINY.records
    by_id = {e["id"]: e for e in on_disk["benchmarks"]}
    assert list(by_id) == EXPECTED
    for entry in by_id.values():
        _check_entry(entry)

    capacity = by_id["compaction.map_capacity"]
    assert capacity["subject"]["inserted"] == TINY.map_keys
    assert capacity["subject"]["lookup_wrong"] == 0
    assert capacity["target"]["met"] is True

    assert by_id["compaction.one_round"]["target"]["met"] is True  # one round, nothing lost
    report = by_id["compaction.one_round"]["subject"]["report"]
    assert report["records_written"] == TINY.round_keys and not report["partial"]

    floor = by_id["compaction.vs_io_floor"]
    assert floor["target"]["correct"] is True
    assert floor["distinct_keys"] == floor["subject"]["report"]["records_written"]
    assert floor["anchors"][0]["detail"]["input_files"] == floor["subject"]["report"]["files_in"]

    memory = by_id["compaction.memory"]
    assert memory["subject"]["peak_mib"] >= memory["subject"]["baseline_mib"] > 0
    assert memory["anchors"][0]["value"] == (TINY.map_bytes + 64 * 2**20) / 2**20

    rows = by_id["compaction.requests_s3"]["subject"]["rows"]
    assert [r["input_files"] for r in rows] == list(TINY.request_files)
    for row in rows:  # each input file is read through exactly two streams
        assert row["stream_gets"] == 2 * row["input_files"] == row["expected_stream_gets"]
        assert row["puts"] >= 2  # an output file and the replace commit
    assert by_id["compaction.requests_s3"]["target"]["met"] is True

    table = format_table(on_disk)
    for bench_id in EXPECTED:
        assert bench_id in table


def test_output_batches_stay_within_the_limit(tmp_path: Path) -> None:
    """One input batch larger than OUTPUT_BATCH_RECORDS comes out split, never whole."""
    import numpy as np

    import kvlog
    from benchmarks.compaction import ascending_key_order, bulk_load
    from kvlog.compaction.merger import OUTPUT_BATCH_RECORDS

    n = OUTPUT_BATCH_RECORDS * 2 + 1000
    with kvlog.open(tmp_path / "s", partitions=1, background_compaction=False, flush_interval_ms=0,
                    offset_map_bytes=4 * 2**20) as store:
        bulk_load(store.log, ascending_key_order(n), n, seed=0, value_bytes=8,
                  partition_of=np.zeros(n, dtype=np.int64))
        report = store.compact(force=True)
        counts = store.log.snapshot(lambda r: [b.count for b in r.iter_batches(0, 0)])
    assert report.records_written == n and not report.partial
    assert sum(counts) == n
    assert max(counts) <= OUTPUT_BATCH_RECORDS
