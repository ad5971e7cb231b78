"""The benchmark suite in a tiny configuration: it runs, and its results file has the documented shape.

Sizes are a few thousand records so this stays well under a minute (SeaweedFS
included when its binary is installed); the figures themselves are not checked.
The recovery part also runs alone in its ``--quick`` configuration (one run per
state), and its kill points are checked: what was pending when the writer was
killed, and what the reopened store found.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run
from benchmarks.recovery import ANCHORS, STATES, rocksdict_missing
from benchmarks.report import rows
from benchmarks.suite import SCHEMA, TARGETS, TINY, settings_for

# One worker runs the module: its fixture runs the tiny benchmarks once, not once a worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bench-quick")]

EXPECTED = {
    "log.append", "log.durable_local_sync_put", "log.durable_local_flush_loop",
    "log.durable_s3_sync_put", "log.durable_s3_flush_loop", "log.commit_latency_s3",
    "store.puts", "store.gets", "store.scan", "store.get_many", "store.durable_threads", "store.memory",
    "store.aio_get", "store.aio_put", "consumer.poll", "consumer.latency", "consumer.metrics",
    *(f"store.recovery_{state}" for state in STATES),
}


def _check_measurement(m: dict[str, Any]) -> None:
    assert set(m) >= {"key", "name", "unit", "value", "runs"}
    assert isinstance(m["value"], float) and m["value"] > 0
    assert m["runs"] and all(r > 0 for r in m["runs"])
    if "latency_ms" in m:
        lat = m["latency_ms"]
        assert lat["samples"] > 0
        assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    base = tmp_path_factory.mktemp("bench")
    out = base / "results" / "tiny.json"
    document = run(TINY, out, table=True, work_dir=base, progress=False)
    return document, out


def test_results_file_matches_the_document(results: tuple[dict[str, Any], Path]) -> None:
    document, out = results
    on_disk = json.loads(out.read_text())
    assert on_disk["schema"] == SCHEMA
    assert on_disk["mode"] == "tiny"
    assert [e["id"] for e in on_disk["benchmarks"]] == [e["id"] for e in document["benchmarks"]]
    for key in ("date", "wall_seconds", "machine", "settings", "store_config", "method", "targets"):
        assert key in on_disk
    machine = on_disk["machine"]
    assert machine["cores"] >= 1 and machine["python"] and machine["versions"]["lmdb"]
    assert on_disk["settings"]["key_bytes"] == 16 and on_disk["settings"]["value_bytes"] == 100


def test_every_benchmark_ran_with_its_anchors(results: tuple[dict[str, Any], Path]) -> None:
    document, _out = results
    entries = {e["id"]: e for e in document["benchmarks"]}
    assert set(entries) == EXPECTED
    for bench_id, entry in entries.items():
        if entry["status"] == "skipped":
            assert bench_id.startswith("log.") and "s3" in bench_id, entry
            continue
        assert entry["status"] == "ok", entry.get("traceback") or entry
        assert entry["method"] and entry["unit"]
        _check_measurement(entry["subject"])
        assert entry["anchors"]
        for anchor in entry["anchors"]:
            _check_measurement(anchor)
            ratio = entry["ratios"][anchor["key"]]
            assert ratio["ratio"] == pytest.approx(entry["subject"]["value"] / anchor["value"])
            assert ratio["speedup"] > 0


def test_targets_are_evaluated(results: tuple[dict[str, Any], Path]) -> None:
    document, _out = results
    entries = {e["id"]: e for e in document["benchmarks"]}
    for bench_id, target in TARGETS.items():
        got = entries[bench_id]["target"]
        assert got["text"] == target["text"]
        assert isinstance(got["met"], bool)
    memory = entries["store.memory"]
    assert memory["growth_mib"] == pytest.approx(memory["subject"]["value"] - memory["anchors"][0]["value"])
    small, large = document["settings"]["rss_sizes"]
    assert memory["subject"]["detail"]["keys"] == large and memory["anchors"][0]["detail"]["keys"] == small


def test_latencies_where_they_apply(results: tuple[dict[str, Any], Path]) -> None:
    document, _out = results
    entries = {e["id"]: e for e in document["benchmarks"] if e["status"] == "ok"}
    for bench_id in ("log.append", "log.durable_local_sync_put", "store.gets", "store.durable_threads"):
        assert entries[bench_id]["subject"]["latency_ms"]["samples"] > 0


def test_charts_are_written(results: tuple[dict[str, Any], Path]) -> None:
    document, out = results
    names = {Path(p).name for p in document["plots"]}
    assert names == {"tiny_ratios.png", "tiny_memory.png"}
    for name in names:
        assert (out.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_puts_pair_each_kvlog_run_with_its_anchor_run(results: tuple[dict[str, Any], Path]) -> None:
    document, _out = results
    puts = next(e for e in document["benchmarks"] if e["id"] == "store.puts")
    lmdb = next(a for a in puts["anchors"] if a["key"] == "lmdb")
    assert len(puts["subject"]["runs"]) == len(lmdb["runs"]) == TINY.puts_repeats
    assert lmdb["paired_ratios"] == pytest.approx(
        [k / a for k, a in zip(puts["subject"]["runs"], lmdb["runs"], strict=True)])
    target_row = next(r for r in rows(document) if r["target"] == TARGETS["store.puts"]["text"])
    assert target_row["note"].startswith(f"paired runs: {lmdb['paired_ratios'][0]:.2f}x")


def test_recovery_quick_kills_the_writer_at_each_state(tmp_path: Path) -> None:
    settings = settings_for("quick", repeats=1)
    out = tmp_path / "recovery.json"
    document = run(settings, out, plots=False, table=False, work_dir=tmp_path, progress=False,
                   only=["store.recovery"])
    on_disk = json.loads(out.read_text(encoding="utf-8"))
    assert [e["id"] for e in on_disk["benchmarks"]] == [f"store.recovery_{state}" for state in STATES]
    entries = {e["id"].removeprefix("store.recovery_"): e for e in document["benchmarks"]}
    expected_anchors = [a for a in ANCHORS if not (a == "rocksdict" and rocksdict_missing())]
    for state, entry in entries.items():
        assert entry["status"] == "ok", entry.get("traceback") or entry
        assert entry["unit"] == "ms" and entry["higher_is_better"] is False and entry["method"]
        assert entry["keys"] == settings.recovery_keys
        assert entry["commits"] * entry["commit_records"] >= entry["keys"]
        limit = entry["index_run_limit"]
        assert entry["commits"] >= limit + 1  # a merge, then the limit's runs pending
        subject = entry["subject"]
        _check_measurement(subject)
        assert len(subject["runs"]) == settings.repeats
        assert entry["slowest_ms"] == max(subject["runs"])
        assert isinstance(entry["target"]["met"], bool) and entry["target"]["value"] == entry["slowest_ms"]
        for sample, total in zip(subject["samples"], subject["runs"], strict=True):
            assert sample["state"] == state
            assert total == pytest.approx(sample["open_ms"] + sample["get_ms"])
            assert sample["import_ms"] > 0 and sample["process_ms"] > total
            assert sample["most_index_runs_in_load"] == limit
            writer = sample["writer"]
            assert writer["commits"] == entry["commits"] and writer["typical_flush_s"] > 0
            at_kill, at_open = sample["index_runs_at_kill"], sample["index_runs_at_open"]
            if state == "closed":
                assert at_kill is None and at_open == 0 and writer["close_s"] > 0
            elif state == "settled":
                assert at_kill == 0 and at_open == 0
            elif state == "pending_runs":
                assert at_kill == limit and at_open == limit  # opening merged nothing
            elif state == "cache_lost":
                # Rebuilt from a checkpoint (its runs merged), or every commit replayed unmerged.
                assert at_kill == limit and at_open in {0, writer["commits"]}
            else:
                assert at_kill == limit and sample["kill_after_ms"] > 0
                assert isinstance(sample["flush_finished_before_kill"], bool)
                # The killed flush's commit either never landed (its runs still pending), or
                # landed and was replayed without a merge, or landed with its merge done.
                landed = sample["killed_flush_landed"]
                assert (landed, at_open) in {(False, limit), (True, limit + 1), (True, 0)}
        assert [a["key"] for a in entry["anchors"]] == expected_anchors
        for anchor in entry["anchors"]:
            _check_measurement(anchor)
            assert len(anchor["samples"]) == settings.repeats and anchor["load_s"] > 0
            assert anchor["paired_ratios"] == pytest.approx(
                [k / a for k, a in zip(subject["runs"], anchor["runs"], strict=True)])
            assert entry["ratios"][anchor["key"]]["ratio"] == pytest.approx(subject["value"] / anchor["value"])
        if "rocksdict" not in expected_anchors:
            assert entry["anchors_skipped"]["rocksdict"]
    target_rows = [r for r in rows(document) if r["target"]]
    assert len(target_rows) == len(STATES)
    assert all(r["note"].startswith("runs ") for r in target_rows)
