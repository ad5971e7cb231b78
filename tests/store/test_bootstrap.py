"""An exact bootstrap: the state read from a snapshot plus the changelog from
``snap.end_offsets()`` on is the store, while another process writes, compacts and collects.

A writer process puts, deletes and writes records with a time to live, compacting and
collecting garbage now and then. Meanwhile this process takes snapshots at drawn moments; for
each, it reads the state, then tails from the snapshot's end offsets (``seek_all``, ``poll``)
applying every record, until the writer is done and the consumer ``caught_up()``. Every view
must equal the store read directly, key for key (expired records aside: a view keeps what the
changelog said, and the comparison drops the values written to live a millisecond), and no
offset may come twice or below the snapshot's offsets. On a local root and on SeaweedFS.
"""

from __future__ import annotations

import random
import subprocess
import time
from typing import Any

import pytest
from store_support import Root, apply_records, child_env, python_script

QUIET: dict[str, Any] = {"flush_interval_ms": 0, "background_compaction": False}


def _tail(store: Any, view: dict[bytes, bytes], offsets: dict[int, int], name: str,
          writer: subprocess.Popen[str]) -> None:
    consumer = store.consumer(name)
    consumer.seek_all(offsets)
    seen: set[tuple[int, int]] = set()
    while True:
        records = consumer.poll(timeout_s=0.05)
        for record in records:
            assert record.offset >= offsets[record.partition]
            assert (record.partition, record.offset) not in seen
            seen.add((record.partition, record.offset))
        apply_records(view, records)
        if not records and writer.poll() is not None and consumer.caught_up():
            return


@pytest.mark.parametrize("seed", [1, 2])
def test_a_snapshot_plus_its_tail_is_the_store_while_another_process_writes(
        root: Root, seed: int) -> None:
    with root.open(partitions=3, **QUIET) as store:
        store.put("k000", "first")
    rng = random.Random(seed)
    writes = 1500 if root.kind == "local" else 400
    spec = root.spec(cache="writer", seed=seed, writes=writes, keys=60)
    writer = subprocess.Popen(python_script("bootstrap_proc.py"), env=child_env(spec), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        views: list[dict[bytes, bytes]] = []
        with root.open(cache="reader", read_only=True) as reader:
            for n in range(3):
                reader.refresh()
                with reader.snapshot() as snap:
                    view, offsets = dict(snap.scan()), snap.end_offsets()
                _tail(reader, view, offsets, f"view-{n}", writer)
                views.append(view)
                if n < 2 and writer.poll() is None:
                    writer_pause = rng.uniform(0.0, 0.3)
                    reader.log.wait_for_commit(reader.log.version, writer_pause)
        out, err = writer.communicate(timeout=600)
        assert writer.returncode == 0, err[-4000:]
        with root.open(cache="check", read_only=True) as check:
            expected = dict(check.scan())
        assert not any(v.startswith(b"ttl1-") for v in expected.values())  # a millisecond: expired
        for view in views:
            assert {k: v for k, v in view.items() if not v.startswith(b"ttl1-")} == expected
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.communicate()


def test_a_lagging_group_that_holds_tombstones_misses_no_delete_while_another_process_compacts(
        root: Root) -> None:
    """A group that holds tombstones reads slowly (a few records a poll, committing each time)
    while a writer process puts, deletes, writes records with a time to live and compacts with
    ``delete_retention_ms=0``: its view, built from the whole changelog, ends with exactly the
    store's keys."""
    with root.open(partitions=3, **QUIET) as store:
        store.put("k000", "first")
    spec = root.spec(cache="writer", seed=7, writes=1500 if root.kind == "local" else 400, keys=60)
    with root.open(cache="reader", **QUIET) as reader:
        consumer = reader.consumer("slow", hold_tombstones=True)
        writer = subprocess.Popen(python_script("bootstrap_proc.py"), env=child_env(spec), text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            view: dict[bytes, bytes] = {}
            while True:
                records = consumer.poll(timeout_s=0.05, max_records=5)
                apply_records(view, records)
                consumer.commit()
                if writer.poll() is None:
                    time.sleep(0.02)  # slower than the writer: the group lags behind its compactions
                elif not records and consumer.caught_up():
                    break
            out, err = writer.communicate(timeout=600)
            assert writer.returncode == 0, err[-4000:]
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.communicate()
    with root.open(cache="check", read_only=True) as check:
        expected = dict(check.scan())
    assert {k: v for k, v in view.items() if not v.startswith(b"ttl1-")} == expected
