"""The on-storage format is enough to read a store: ``examples/outside_reader.py`` (standard
library and pyarrow only, following docs/format.rst) rebuilds every live record's (partition,
offset) and the latest state of a compacted store whose early commits were collected, exactly
as kvlog reads them; DuckDB then queries its Arrow tables."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import kvlog
import kvlog.log.append as append_module
from kvlog.clock import SystemClock
from kvlog.log.naming import commit_name
from tests.test_examples import EXPECTED

READER = Path(__file__).resolve().parents[2] / "examples" / "outside_reader.py"
HOUR_MS = 3_600_000

#: Runs the reader as a script, then says which modules it imported.
RUN = """
import json, runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps(sorted(sys.modules)))
"""


def build_store(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store with deletes, an expiring record, a compaction, a producer duplicate on either
    side of a checkpoint, its commits up to that checkpoint collected, and live files both in
    data files (the compaction's) and inside commits (the small flushes after it)."""
    settings: dict[str, Any] = {"partitions": 4, "background_compaction": False, "flush_interval_ms": 0,
                                "checkpoint_interval": 10_000, "commit_retention_ms": 0}
    with kvlog.open(str(root), **settings) as store:
        rng = random.Random(5)
        for i in range(600):
            key = b"key-%03d" % rng.randrange(150)
            if i % 9 == 8:
                store.delete(key)
            else:
                store.put(key, b"value-%d" % i)
            if i % 60 == 59:
                store.flush()
        store.put("expiring", "soon", ttl_ms=10 * 24 * HOUR_MS)
        the_log = store.log
        keys = [k for k in (b"dup-%03d" % i for i in range(100)) if the_log.partition_for(k) == 2][:4]
        producer = the_log.producer()
        producer.append(2, [(k, b"once") for k in keys], base_sequence=0)
        # Resends that miss the early duplicate check (as after a lost acknowledgement in another
        # process) are written and committed; replay refuses them as duplicates.
        monkeypatch.setattr(append_module, "_known_duplicates", lambda *args, **kwargs: None)
        assert producer.append(2, [(k, b"once") for k in keys], base_sequence=0).duplicate
        assert store.compact(force=True).records_removed > 0
        for i in range(100):
            store.put(b"key-%03d" % i, b"after-%d" % i)
        store.flush()
        checkpoint = the_log.write_checkpoint()
        # After the checkpoint: a resend its producer window (from the checkpoint) catches, and more.
        assert producer.append(2, [(k, b"once") for k in keys], base_sequence=0).duplicate
        producer.append(2, [(keys[0], b"twice")], base_sequence=4)
        store.delete(b"key-001")
        store.flush()
        # Age the log so GC collects the commits before the checkpoint (and the replaced files).
        past = (SystemClock().now_ms() - HOUR_MS) / 1000
        for name in os.listdir(root / "log"):
            if not name.endswith(f"{checkpoint:020d}.checkpoint.json"):
                os.utime(root / "log" / name, (past, past))
        collected = the_log.gc(now_ms=SystemClock().now_ms() + 2 * HOUR_MS)
        # The flushes before the compaction travelled inside their commits: the replaced
        # inline files went with them.
        assert collected["commits"] > 0 and collected["replaced"] == 0, collected
        live = the_log.snapshot(lambda r: [e.path for _fid, e in r.iter_files()])
        assert any(p.startswith("log/") for p in live) and any(p.startswith("data/") for p in live)
    assert not (root / commit_name(1)).exists()
    checkpoint_text = (root / "log" / f"{checkpoint:020d}.checkpoint.json").read_text()
    assert '"present":' in checkpoint_text, "no compacted batch lost records in its range"


def run_reader(root: Path, out: Path, now_ms: int) -> tuple[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", RUN, str(READER), str(root), str(out), str(now_ms)],
                          capture_output=True, text=True, timeout=120, cwd=out, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary, last, modules = done.stdout.strip().splitlines()
    assert last == EXPECTED["outside_reader.py"]
    return summary, json.loads(modules)


def read_arrow(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def test_an_outside_reader_rebuilds_the_changelog_and_the_state(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    build_store(root, monkeypatch)
    now = SystemClock().now_ms()
    summary, modules = run_reader(root, out, now)
    assert not [m for m in modules if m.split(".")[0] in ("kvlog", "spark_ext", "pyroaring", "lmdb")]
    with kvlog.open(str(root), read_only=True) as store:
        changes = [(r.partition, r.offset, r.timestamp_ms, r.key, r.value, r.expires_ms) for r in store.changes()]
        state = dict(store.items())
        version = store.log.version
    changelog = read_arrow(out / "changelog.arrow")
    columns = ["partition", "offset", "timestamp", "key", "value", "expires"]
    assert list(zip(*(changelog.column(c).to_pylist() for c in columns), strict=True)) == changes
    latest = read_arrow(out / "latest.arrow")
    assert dict(zip(latest.column("key").to_pylist(), latest.column("value").to_pylist(), strict=True)) == state
    newest = {key: (p, offset) for p, offset, _t, key, _v, _e in changes}
    positions = {key: newest[key] for key in state}
    assert {r["key"]: (r["partition"], r["offset"]) for r in latest.to_pylist()} == positions
    assert summary == f"version {version}: {len(changes)} live records, {len(state)} live keys"
    assert sum(1 for c in changes if c[3].startswith(b"dup-")) == 5  # 4 once, then 1 more: no duplicate

    # DuckDB reads no Arrow IPC file, but queries the Arrow table pyarrow read.
    con = duckdb.connect()
    con.register("latest", latest)
    counts = con.execute("SELECT partition, count(*) FROM latest GROUP BY partition ORDER BY partition").fetchall()
    assert counts == sorted(Counter(p for p, _o in positions.values()).items())


@pytest.mark.parametrize("values", [
    [0], [5, 9, 70_000], list(range(100, 300)),                     # arrays; one run
    list(range(0, 10_000, 2)), list(range(0, 200_000, 3)),           # bitsets, several containers
    [1, 2, 3] + list(range(10, 5000)) + list(range(300_000, 310_000)) + [65_536 * 7 + 1],  # runs, >= 4 containers
], ids=["one", "sparse", "run", "bitset", "containers", "mixed"])
def test_the_outside_readers_bitmap_decoder(values: list[int]) -> None:
    import importlib.util

    from kvlog.format.bitmap import encode_offsets

    spec = importlib.util.spec_from_file_location("outside_reader", READER)
    assert spec is not None and spec.loader is not None
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    assert reader.roaring_values(encode_offsets(values)) == values


@pytest.mark.parametrize("checkpoint", ["none", "after the hold started"])
def test_an_outside_reader_refuses_the_round_a_tombstone_hold_refuses(tmp_path: Path, checkpoint: str) -> None:
    """A cleaning round planned before a group's tombstone hold started commits after it: kvlog
    refuses it (its outputs are deleted). An outside reader following the format refuses it
    too, whether it replays the group's ``offsets`` commits itself or starts from a checkpoint
    that carries them (``offsets``, ``groups``, ``holds_changed``): both read the same changelog."""
    from kvlog import ManualClock
    from kvlog.compaction.runner import CompactionReport, Compactor

    root, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    clock = ManualClock(SystemClock().now_ms())
    with kvlog.open(str(root), clock=clock, partitions=1, background_compaction=False, flush_interval_ms=0,
                    delete_retention_ms=1_000, checkpoint_interval=10_000) as store:
        store.put("a", "1")
        store.put("b", "2")
        store.flush()
        plain = store.consumer("g")
        plain.poll(timeout_s=0)
        plain.commit()
        store.delete("a")
        store.flush()
        clock.advance(2_000)
        store.compact(force=True)  # stamps the tombstone's horizon
        clock.advance(2_000)
        compactor = Compactor(store.log)
        plan, batches = compactor.plan(clock.now_ms(), force=True)
        assert plan is not None
        store.consumer("g", hold_tombstones=True).close()
        store.consumer("other", hold_tombstones=True).commit({0: 0})  # a second group, moved back
        if checkpoint != "none":
            store.log.write_checkpoint()
        assert compactor._run(plan, batches, clock.now_ms(), CompactionReport()).refused
        changes = [(r.partition, r.offset, r.key, r.value) for r in store.changes()]
        assert (b"a", None) in [(k, v) for _p, _o, k, v in changes]
    run_reader(root, out, clock.now_ms())
    changelog = read_arrow(out / "changelog.arrow")
    columns = ["partition", "offset", "key", "value"]
    assert list(zip(*(changelog.column(c).to_pylist() for c in columns), strict=True)) == changes
