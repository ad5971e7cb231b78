"""The Spark benchmarks in a tiny configuration, on the tests' session: they run, and the document has its shape.

The figures themselves are not checked (the machine is shared); exactness of
the compaction and the row counts of the materialization are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.spark import SCHEMA, TINY, format_table, run_spark_benchmarks

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_tiny_spark_benchmarks(spark: Any, tmp_path: Path) -> None:
    document = run_spark_benchmarks(True, tmp_path / "results", sizes=TINY, spark=spark, work_dir=tmp_path)
    on_disk = json.loads((tmp_path / "results" / "spark-tiny.json").read_text())
    assert on_disk["schema"] == SCHEMA and on_disk["mode"] == "tiny"
    assert on_disk["machine"]["spark"]["own_session"] is False
    entries = {e["id"]: e for e in document["benchmarks"]}
    assert set(entries) == {"spark.compact", "spark.compact_memory", "spark.materialize", "spark.read"}
    for bench_id, entry in entries.items():
        assert entry["status"] == "ok", entry.get("traceback") or entry
        assert entry["subject"]["value"] > 0 and entry["anchors"], bench_id
        for anchor in entry["anchors"]:
            assert anchor["value"] > 0
            assert entry["ratios"][anchor["key"]]["ratio"] == pytest.approx(
                entry["subject"]["value"] / anchor["value"])
    compact = entries["spark.compact"]
    assert compact["target"]["met"], compact["target"]
    assert compact["target"]["value"] == {"rows": TINY.compact_keys, "keys": TINY.compact_keys, "max_n": 1}
    assert compact["extrapolation"]["records"] == 20_000_000
    materialize = entries["spark.materialize"]
    assert materialize["correct"] and materialize["rows"] == TINY.materialize_keys
    assert {a["key"] for a in materialize["anchors"]} == {"window_row_number", "max_by", "max_struct"}
    assert isinstance(materialize["target"]["met"], bool)
    assert "spark.materialize" in format_table(document)
