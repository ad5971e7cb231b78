"""The peer suite (``python -m benchmarks --only peers``) at a tiny size: right answers, documented shape.

First the YCSB workloads are applied to kvlog, py-lmdb and rocksdict holding the same few
thousand records, and every answer of every operation (each read's value, each scan's pairs,
each read-modify-write's new value) must be the same for the three stores: a check of the
workload generator and of the adapters. Then the whole peer suite runs in its tiny
configuration and its results file is checked. No figure is checked: this keeps the suite
working, it does not judge speed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.data import make_keys, make_values
from benchmarks.peer_suite import SCHEMA, TARGETS, TINY, run_peer_benchmarks
from benchmarks.peers import KvlogPeer, LmdbPeer, Peer, RocksdictPeer, SqlitePeer
from benchmarks.report import rows
from benchmarks.ycsb import (
    INSERT,
    READ,
    RMW,
    SCAN,
    UPDATE,
    WORKLOADS,
    make_stream,
    run_stream,
    zeta,
)

pytestmark = pytest.mark.slow

RECORDS = 2_000
OPS = 1_000

EXPECTED = {
    "peers.load", "peers.gets", "peers.scan", "peers.short_scans", "peers.short_scans_pending",
    *(f"peers.ycsb_{w}" for w in "abcdef"), "peers.durable_threads", "peers.durable_single", "peers.reopen_clean",
    "peers.disk", "peers.rss",
}


def _open_all(base: Path) -> dict[str, Peer]:
    return {"kvlog": KvlogPeer(base / "kvlog"), "lmdb": LmdbPeer(base / "lmdb", map_size=64 << 20),
            "rocksdict": RocksdictPeer(base / "rocksdict"), "sqlite": SqlitePeer(base / "sqlite")}


def test_every_store_answers_every_operation_alike(tmp_path: Path) -> None:
    keys, values = make_keys(0, RECORDS), make_values(0, RECORDS)
    peers = _open_all(tmp_path)
    try:
        for peer in peers.values():
            peer.load(zip(keys, values, strict=True))
        count = RECORDS
        for name in ("A", "B", "C", "F", "D", "E"):
            stream = make_stream(WORKLOADS[name], count, OPS, seed=5)
            answers: dict[str, list[Any]] = {}
            for key, peer in peers.items():
                answers[key] = []
                run_stream(peer, stream, answers[key].append)
                peer.durable()
            assert answers["kvlog"] == answers["lmdb"] == answers["rocksdict"] == answers["sqlite"], name
            kinds = Counter(stream.codes)
            got = answers["kvlog"]
            reads = [a for code, a in zip(stream.codes, got, strict=True) if code in (READ, RMW)]
            assert all(isinstance(a, bytes) and len(a) == 100 for a in reads), name
            assert reads or name == "E"
            scans = [a for code, a in zip(stream.codes, got, strict=True) if code == SCAN]
            for (code, length, start), pairs in zip(
                    [(c, n, k) for c, n, k in zip(stream.codes, stream.lengths, stream.keys, strict=True)
                     if c == SCAN], scans, strict=True):
                assert code == SCAN and 1 <= len(pairs) <= length
                assert pairs[0][0] >= start and [k for k, _v in pairs] == sorted(k for k, _v in pairs)
            if name == "E":
                assert kinds[SCAN] > 0 and kinds[INSERT] > 0
            if name == "F":
                # a read-modify-write's answer is the value a later read of that key sees
                last = {}
                for code, key, answer in zip(stream.codes, stream.keys, got, strict=True):
                    if code == RMW:
                        last[key] = answer
                for key, value in last.items():
                    assert peers["kvlog"].get(key) == value
            if name in ("A", "B"):
                assert kinds[UPDATE] > 0
            count += stream.inserts
        sums = {key: list(peer.scan_all()) for key, peer in peers.items()}
        assert len(sums["kvlog"]) == count
        assert sums["kvlog"] == sums["lmdb"] == sums["rocksdict"] == [tuple(p) for p in sums["sqlite"]]
    finally:
        for peer in peers.values():
            peer.close()


def test_the_request_distributions() -> None:
    # zeta by its tail estimate agrees with the exact sum, and reaches YCSB's value for 10^10 items
    exact = float((np.arange(1, 3_000_001, dtype=np.float64) ** -0.99).sum())
    assert zeta(3_000_000)[()] == pytest.approx(exact, rel=1e-12)
    assert zeta(10_000_000_000)[()] == pytest.approx(26.46902820178302, rel=1e-9)
    stream = make_stream(WORKLOADS["C"], 100_000, 50_000, seed=1)
    hits = Counter(stream.keys).most_common()
    # zipfian: a few keys take a large share, most keys are read at most once
    assert hits[0][1] > 500 and len(hits) < 30_000
    latest = make_stream(WORKLOADS["D"], 100_000, 20_000, seed=1)
    newest = set(make_keys(95_000, 6_000))
    reads = [k for c, k in zip(latest.codes, latest.keys, strict=True) if c == READ]
    assert sum(k in newest for k in reads) > len(reads) // 2


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    base = tmp_path_factory.mktemp("peers")
    document = run_peer_benchmarks(TINY, base / "results", work_dir=base, progress=False)
    return document, base / "results" / "peers-tiny.json"


def test_the_results_file(results: tuple[dict[str, Any], Path]) -> None:
    document, out = results
    on_disk = json.loads(out.read_text())
    assert on_disk["schema"] == SCHEMA and on_disk["mode"] == "tiny"
    assert set(on_disk["durability"]) == {"kvlog", "lmdb", "rocksdict", "sqlite"}
    entries = {e["id"]: e for e in on_disk["benchmarks"]}
    assert set(entries) == EXPECTED
    for bench_id, entry in entries.items():
        assert entry["status"] == "ok", entry.get("traceback") or entry
        assert entry["method"] and entry["unit"]
        subject = entry["subject"]
        assert subject["value"] > 0 and len(subject["runs"]) == TINY.repeats
        for anchor in entry["anchors"]:
            assert anchor["value"] > 0 and len(anchor["paired_ratios"]) == len(anchor["runs"])
            ratio = entry["ratios"][anchor["key"]]
            assert ratio["ratio"] == pytest.approx(subject["value"] / anchor["value"])
            low, high = ratio["range"]
            assert low <= high and ratio["speedup"] > 0
        for target in TARGETS.get(bench_id, []):
            assert any(g["text"] == target["text"] and isinstance(g["met"], bool) for g in entry["targets"])
    for w in "abcdef":
        assert {a["key"] for a in entries[f"peers.ycsb_{w}"]["anchors"]} == {"lmdb", "rocksdict"}
        assert "Durability:" in entries[f"peers.ycsb_{w}"]["method"]
    assert entries["peers.durable_threads"]["records_per_flush"] >= 1
    assert {a["key"] for a in entries["peers.durable_threads"]["anchors"]} == {"lmdb", "rocksdict", "fsync_floor"}
    assert {a["key"] for a in entries["peers.durable_single"]["anchors"]} == {"fsync_floor"}
    assert not entries["peers.durable_single"]["higher_is_better"]
    assert entries["peers.short_scans_pending"]["index_runs_pending"] in (None, TINY.pending_commits)
    assert entries["peers.disk"]["subject"]["detail"]["disk_bytes"] > 0
    names = {Path(p).name for p in document["plots"]}
    assert names == {"peers-tiny_ratios.png"}
    assert (out.parent / "peers-tiny_ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    texts = {r["target"] for r in rows(document)}
    assert {"YCSB E >= 0.8x py-lmdb", "YCSB E >= 1.5x rocksdict"} <= texts
