"""kvlog.metrics: a store's figures in Prometheus's text format, parsed back by the library.

The values must be the store's own: records flushed, commits, storage requests and bytes,
fsyncs, offsets per partition, the commit latency histogram (counts that add up), the
cleaner's failures and last success, and each consumer group's lag, including a group that
fell behind another process's writes. ``kvlog stats --prometheus`` prints the same text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import kvlog
import kvlog.metrics
from kvlog.cli import main

QUIET: dict[str, Any] = {"background_compaction": False, "flush_interval_ms": 0, "partitions": 2}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "store"))
            out[(sample.name, labels)] = sample.value
    return out


def test_the_text_format_holds_the_stores_figures(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "a", **QUIET) as store:
        for i in range(10):
            store.put(f"k{i}", "v", sync=True)
        reader = store.consumer("reader")
        reader.poll(timeout_s=0, max_records=4)
        reader.commit()
        store.compact(force=True)
        with kvlog.open(root, cache_dir=tmp_path / "b", **QUIET) as other:
            other.put("from-b", "v", sync=True)  # the group lags these too once the head is read
        store.refresh()
        stats = store.stats()
        got = _samples(kvlog.metrics.text(store))
        # The other handle's commit left an index run to merge: no key count in a scrape then.
        assert stats["index_runs"] > 0 and got[("kvlog_index_runs_pending", ())] == stats["index_runs"]
        assert ("kvlog_live_keys", ()) not in got
        store.log.settle_index()
        settled = _samples(kvlog.metrics.text(store))
    assert got[("kvlog_records_flushed_total", ())] == 10
    assert got[("kvlog_commits_written_total", ())] == stats["commits_written"]
    assert got[("kvlog_version", ())] == stats["version"]
    assert settled[("kvlog_live_keys", ())] == 11 and settled[("kvlog_index_runs_pending", ())] == 0
    assert got[("kvlog_storage_requests_total", (("kind", "swap"),))] == stats["storage_requests"]["swap"]
    assert got[("kvlog_storage_bytes_total", (("direction", "sent"),))] == stats["storage_traffic"]["sent"] > 0
    assert got[("kvlog_fsyncs_total", ())] == stats["storage_traffic"]["fsyncs"] > 0
    count = got[("kvlog_commit_seconds_count", ())]
    assert count == got[("kvlog_commit_seconds_bucket", (("le", "+Inf"),))] == stats["commit_latency"]["count"] >= 11
    assert got[("kvlog_commit_seconds_bucket", (("le", "0.0005"),))] <= count
    assert got[("kvlog_compaction_last_success_timestamp_seconds", ())] > 0
    assert got[("kvlog_compaction_failures_total", ())] == 0
    ends = {p["partition"]: p["end_offset"] for p in stats["partition_stats"]}
    for p in (0, 1):
        assert got[("kvlog_partition_end_offset", (("partition", str(p)),))] == ends[p]
        committed = stats["consumer_groups"]["reader"].get(str(p), 0)
        assert got[("kvlog_consumer_lag", (("group", "reader"), ("partition", str(p))))] == ends[p] - committed
    assert sum(got[("kvlog_consumer_lag", (("group", "reader"), ("partition", str(p))))] for p in (0, 1)) == 7


def test_register_adds_the_collector_to_a_registry_and_scrapes_read_the_store_now(tmp_path: Path) -> None:
    registry = CollectorRegistry(auto_describe=True)
    with kvlog.open(tmp_path / "root", **QUIET) as store:
        collector = kvlog.metrics.register(store, registry)
        first = _samples(generate_latest(registry).decode())
        store.put("k", "v", sync=True)
        second = _samples(generate_latest(registry).decode())
        registry.unregister(collector)
        assert generate_latest(registry) == b""
    assert second[("kvlog_records_flushed_total", ())] == first[("kvlog_records_flushed_total", ())] + 1


def test_a_failing_cleaner_is_counted(tmp_path: Path) -> None:
    with kvlog.open(tmp_path / "root", **QUIET) as store:
        for i in range(5):
            store.put(f"k{i}", "v", sync=True)
        store._compactor._fail(0, RuntimeError("disk on fire"), 0)
        got = _samples(kvlog.metrics.text(store))
    assert got[("kvlog_compaction_failures_total", ())] == 1
    assert got[("kvlog_compaction_failing_partitions", ())] == 1


def test_the_command_line_prints_the_text_format(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = str(tmp_path / "root")
    with kvlog.open(path, **QUIET) as store:
        store.put("k", "v", sync=True)
    assert main(["stats", path, "--prometheus"]) == 0
    got = _samples(capsys.readouterr().out)
    assert got[("kvlog_live_keys", ())] == 1
    with pytest.raises(SystemExit) as stopped:
        main(["stats", path, "--prometheus", "--json"])
    assert stopped.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_holds_are_exported_per_partition_and_per_group(tmp_path: Path) -> None:
    clock = kvlog.ManualClock(2_000_000)
    with kvlog.open(tmp_path / "s", clock=clock, group_hold_max_ms=60_000, **QUIET) as store:
        for i in range(6):
            store.put(f"k{i}", "v")
        store.flush()
        got = _samples(kvlog.metrics.text(store))
        assert not any(name.startswith("kvlog_tombstone_hold") for name, _labels in got)
        holder = store.consumer("holder", hold_tombstones=True)
        holder.poll(timeout_s=0, max_records=3)
        holder.commit()
        positions = {p: holder.position(p) for p in (0, 1)}
        got = _samples(kvlog.metrics.text(store))
        for p in (0, 1):
            assert got[("kvlog_tombstone_hold_offset", (("partition", str(p)),))] == positions[p]
        assert got[("kvlog_consumer_group_hold_expiry_timestamp_seconds", (("group", "holder"),))] == 2_060.0
        clock.advance(60_000)  # lapsed: no hold any more
        got = _samples(kvlog.metrics.text(store))
        assert not any(name.startswith("kvlog_tombstone_hold") or "hold_expiry" in name for name, _labels in got)
