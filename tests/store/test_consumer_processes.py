"""Consumer groups across real processes: waking on another process's commit, resuming a
group's committed offsets in a new process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from store_support import EXPLICIT_FLUSH, HERE, Root, child_env

import kvlog

PROC = str(HERE / "consumer_proc.py")
#: The poll's timeout in the child: the wake-up must come far sooner.
POLL_TIMEOUT_S = 60.0


def _spawn(spec: dict[str, object]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, PROC], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(spec))


def test_poll_in_another_process_wakes_on_a_sync_put(root: Root) -> None:
    with root.open(**EXPLICIT_FLUSH) as writer:
        writer.put("before", "0", sync=True)
        child = _spawn(root.spec("reader", mode="poll", group="g", timeout_s=POLL_TIMEOUT_S,
                                 settings={"follow_interval_ms": 50}))
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
            writer.put("wake", "1", sync=True)
            put_done = time.monotonic()
            line = child.stdout.readline().split()
            waited = time.monotonic() - put_done
        finally:
            child.wait(timeout=POLL_TIMEOUT_S + 30)
    assert line == ["got", "1", "wake"]
    # Woken by following the commit log, not by the poll's timeout running out.
    assert waited < POLL_TIMEOUT_S / 4


def test_a_new_process_resumes_at_the_offset_a_finished_one_committed(root: Root) -> None:
    with root.open(partitions=1, **EXPLICIT_FLUSH) as store:
        for i in range(30):
            store.put(f"k{i:02d}", f"v{i}")
        store.flush()
    first = subprocess.run([sys.executable, PROC], capture_output=True, text=True, timeout=120,
                           env=child_env(root.spec("one", mode="consume", group="g", count=12,
                                                   settings=EXPLICIT_FLUSH)))
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["done", "0:12"]
    with root.open(cache="two", **EXPLICIT_FLUSH) as store:
        consumer = store.consumer("g")
        assert consumer.committed(0) == 12
        assert consumer.position(0) == 12
        records = consumer.poll(timeout_s=0, max_records=100)
    assert [r.key for r in records] == [f"k{i:02d}".encode() for i in range(12, 30)]


def test_committed_offsets_are_seen_by_another_process_after_refresh(root: Root) -> None:
    count = 5
    with root.open(partitions=1, **EXPLICIT_FLUSH) as store, root.open(cache="other", read_only=True) as other:
        for i in range(10):
            store.put(f"k{i}", "v")
        store.flush()
        consumer = store.consumer("g")
        consumer.poll(timeout_s=0, max_records=count)
        consumer.commit()
        assert other.consumer("g").committed(0) is None  # its cache has not applied the commit
        other.refresh()
        assert other.consumer("g").committed(0) == count
        with pytest.raises(kvlog.ReadOnlyError):
            other.consumer("g").commit()
