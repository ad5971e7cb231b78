"""Log.wait_for_commit: woken at once by this process's commits and, on a local root, by other
processes' commits; by following the commit log where storage cannot tell; ending at its
timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvlog.clock import SystemClock
from kvlog.config import StoreConfig
from kvlog.errors import ConfigError, InvalidRecordError, StoreClosedError
from kvlog.log import Log, Producer
from tests.log.conftest import MakeLog


def _append(log_: Log, producer: Producer, key: bytes) -> None:
    producer.append(0, [(key, b"v")], base_sequence=log_.end_offset(0))


def test_returns_at_once_when_a_newer_commit_is_applied(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(tmp_path / "root", tmp_path / "cache", log_clock=SystemClock())
    producer = log.producer()
    _append(log, producer, b"a")
    assert log.wait_for_commit(0, 30.0) == log.version >= 1


def test_a_commit_of_this_process_wakes_a_waiter(tmp_path: Path, make_log: MakeLog) -> None:
    # A long follow interval: only the committer's signal can wake the waiter in time.
    log = make_log(tmp_path / "root", tmp_path / "cache", log_clock=SystemClock(), follow_interval_ms=600_000)
    producer = log.producer()
    before = log.version
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(log.wait_for_commit(before, 300.0)))
    waiter.start()
    _append(log, producer, b"a")
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert got == [before + 1]


def test_a_commit_of_another_cache_is_found_by_following_the_log(tmp_path: Path, make_log: MakeLog) -> None:
    reader = make_log(tmp_path / "root", tmp_path / "cache-r", log_clock=SystemClock(), follow_interval_ms=20)
    writer = make_log(tmp_path / "root", tmp_path / "cache-w", log_clock=SystemClock())
    producer = writer.producer()
    before = reader.refresh()
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(reader.wait_for_commit(before, 300.0)))
    waiter.start()
    _append(writer, producer, b"a")
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert got == [writer.version] and reader.version == writer.version


def test_times_out_with_the_applied_version(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(tmp_path / "root", tmp_path / "cache", follow_interval_ms=10)  # a ManualClock
    version = log.version
    # The manual clock never moves: the slept slices end the wait.
    assert log.wait_for_commit(version, 0.05) == version
    assert log.wait_for_commit(version, 0) == version


@pytest.mark.parametrize("after, timeout", [(-1, 1.0), (None, 1.0), (True, 1.0), (0, -0.5), (0, "1"),
                                            (0, float("nan")), (0, None)])
def test_bad_arguments(tmp_path: Path, make_log: MakeLog, after: object, timeout: object) -> None:
    log = make_log(tmp_path / "root", tmp_path / "cache")
    with pytest.raises(InvalidRecordError):
        log.wait_for_commit(after, timeout)  # type: ignore[arg-type]


def test_a_closed_log_refuses(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(tmp_path / "root", tmp_path / "cache")
    log.close()
    with pytest.raises(StoreClosedError):
        log.wait_for_commit(0, 0)


@pytest.mark.parametrize("value", [0, -1, 1.5, None])
def test_follow_interval_must_be_a_positive_integer(value: object) -> None:
    with pytest.raises(ConfigError):
        StoreConfig(follow_interval_ms=value)  # type: ignore[arg-type]


def test_commits_short_of_the_version_waited_for_do_not_shorten_the_wait(tmp_path: Path,
                                                                           make_log: MakeLog) -> None:
    # A manual clock (it never moves) and a follow interval longer than the timeout: only the
    # time actually slept ends the wait, never the commits that woke it early.
    log = make_log(tmp_path / "root", tmp_path / "cache", follow_interval_ms=600_000)
    producer = log.producer()
    before = log.version
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(log.wait_for_commit(before + 3, 300.0)))
    waiter.start()
    for key in (b"a", b"b", b"c", b"d"):
        _append(log, producer, key)
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert got == [before + 4]


_PUT_IN_ANOTHER_PROCESS = """
import sys, kvlog
with kvlog.open(sys.argv[1], cache_dir=sys.argv[2]) as store:
    store.put(b"from-another-process", b"v", sync=True)
"""


def test_a_commit_of_another_process_wakes_a_waiter_on_a_local_root(tmp_path: Path, make_log: MakeLog) -> None:
    """On a local root the kernel reports the head's rename (inotify): a follow interval of ten
    minutes and a wait of five, yet another process's commit ends the wait."""
    root = tmp_path / "root"
    reader = make_log(root, tmp_path / "cache-r", log_clock=SystemClock(), follow_interval_ms=600_000)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    put = [sys.executable, "-c", _PUT_IN_ANOTHER_PROCESS, str(root), str(tmp_path / "cache-w")]
    subprocess.run(put, env=env, check=True, timeout=120)  # the first commit makes log/
    before = reader.refresh()
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(reader.wait_for_commit(before, 300.0)))
    waiter.start()
    subprocess.run(put, env=env, check=True, timeout=120)
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert got and got[0] > before
