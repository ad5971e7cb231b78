"""Settling by merging the runs (kvlog.index.merge): the merge against a model, the B-tree written
in key order (appended or in place), damage, and a writer killed in the middle of a settle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_index_run_format import expected_value, make_run

import kvlog
from kvlog.index import merge as index_merge
from kvlog.index.merge import merge_runs

#: The merge runs against the C extension and against its Python twin.
pytestmark = pytest.mark.usefixtures("native")

ROOT = Path(__file__).resolve().parents[2]

run_st = st.dictionaries(st.binary(min_size=1, max_size=5), st.one_of(st.none(), st.binary(max_size=6)),
                         max_size=30)


def build(records: dict[bytes, bytes | None]) -> bytes:
    keys = sorted(records)
    return make_run(keys, [records[k] for k in keys], [1] * len(keys), [7] * len(keys), 4)


@settings(max_examples=200, deadline=None)
@given(st.lists(run_st, max_size=6), st.integers(1, 9), st.one_of(st.none(), st.binary(max_size=3)))
def test_merge_matches_the_newest_run_of_each_key(runs: list[dict[bytes, bytes | None]], chunk: int,
                                                   lower: bytes | None) -> None:
    model: dict[bytes, bytes] = {}
    for records in runs:  # oldest first: a later run wins
        for key, value in records.items():
            model[key] = expected_value(key, value, 1, 7, 4)
    wanted = sorted((k, v) for k, v in model.items() if lower is None or k >= lower)
    newest_first = [build(records) for records in reversed(runs)]
    got: list[tuple[bytes, bytes]] = []
    at = lower
    while True:
        puts, deletions = merge_runs(newest_first, at, chunk)
        taken = sorted(puts + [(key, b"") for key in deletions])
        assert [k for k, _v in puts] == sorted(k for k, _v in puts)
        assert deletions == sorted(deletions)
        got += taken
        if len(taken) < chunk:
            break
        at = taken[-1][0] + b"\x00"
    assert got == wanted
    everything = merge_runs(newest_first, lower, -1)
    assert sorted(everything[0] + [(k, b"") for k in everything[1]]) == wanted


def test_a_damaged_run_raises() -> None:
    good = build({b"a": b"1", b"b": None, b"c": b"3"})
    flipped = bytearray(good)
    flipped[-1] ^= 1  # the last entry's value
    with pytest.raises(ValueError):
        merge_runs([bytes(flipped), good], None, -1)
    with pytest.raises(ValueError):
        merge_runs([good[:-1]], None, -1)
    with pytest.raises(ValueError):
        merge_runs([b"KVR3" + b"\x00" * 4], None, -1)


def quiet_store(path: Path, **extra: Any) -> kvlog.Store:
    return kvlog.open(str(path), flush_interval_ms=0, background_compaction=False, **extra)


def btree_entries(store: kvlog.Store) -> int:
    env = store.log.env
    with env.env.begin() as txn:
        return int(txn.stat(env.dbs["index"])["entries"])


@pytest.mark.parametrize("chunk", [3, 65536])
def test_settles_appending_then_in_place(tmp_path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_merge, "MERGE_CHUNK", chunk)
    store = quiet_store(tmp_path / "s")
    model: dict[bytes, bytes] = {}
    for flush in range(3):  # an empty tree: the merged entries are appended
        for i in range(40):
            model[b"m%03d" % (i * 3 + flush)] = b"a%d" % flush
            store.put(b"m%03d" % (i * 3 + flush), model[b"m%03d" % (i * 3 + flush)])
        store.flush()
    assert store.log.settle_index() == 3
    assert btree_entries(store) == len(model)
    # Keys below the tree's last, overwrites and deletions: written in place.
    for flush in range(3):
        for i in range(0, 120, 7):
            key = b"m%03d" % i
            if (i + flush) % 3 == 0:
                store.delete(key)
                model.pop(key, None)
            else:
                model[key] = b"b%d" % flush
                store.put(key, model[key])
        model[b"a%d" % flush] = b"low"
        store.put(b"a%d" % flush, b"low")
        store.flush()
    assert store.log.settle_index() == 3
    assert btree_entries(store) == len(model)
    assert dict(store.items()) == model
    for key, value in model.items():
        assert store.get(key) == value
    assert store.check() == []
    store.close()


_CHILD = """
import sys, time
import kvlog
from kvlog.index import merge

path = sys.argv[1]
store = kvlog.open(path, flush_interval_ms=0, background_compaction=False)
for flush in range(4):
    for i in range(200):
        if i % 5 == flush:
            store.delete(b"k%04d" % i)
        else:
            store.put(b"k%04d" % i, b"v%d-%d" % (flush, i))
    store.flush()
merge.MERGE_CHUNK = 16
real = merge.merge_runs
calls = [0]

def slow(*args):
    calls[0] += 1
    if calls[0] == 3:  # two chunks are in the B-tree, in the open write transaction
        print("merging", flush=True)
        time.sleep(60)
    return real(*args)

merge.merge_runs = slow
store.log.settle_index()
print("settled", flush=True)
time.sleep(60)
"""


def expected_after_child() -> dict[bytes, bytes]:
    model: dict[bytes, bytes] = {}
    for flush in range(4):
        for i in range(200):
            if i % 5 == flush:
                model.pop(b"k%04d" % i, None)
            else:
                model[b"k%04d" % i] = b"v%d-%d" % (flush, i)
    return model


def test_a_writer_killed_in_the_middle_of_a_settle_leaves_the_runs(tmp_path: Path) -> None:
    path = tmp_path / "s"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"merging\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    model = expected_after_child()
    store = quiet_store(path)
    assert store.log.snapshot(lambda r: r.runs_pending()) == 4
    assert btree_entries(store) == 0
    assert dict(store.items()) == model
    assert store.log.settle_index() == 4
    assert btree_entries(store) == len(model)
    for key, value in model.items():
        assert store.get(key) == value
    assert store.get(b"k0003") is None  # deleted by the newest run
    assert store.check() == []
    store.close()
