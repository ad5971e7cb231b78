"""A local root's watch on the head: woken by a swap of the watched name, by nothing else.

Renames onto other names in the directory (a ``put`` of a checkpoint) are drained and the
wait goes on; a closed watch refuses to wait; a directory that does not exist
gives no watch (the caller then looks for changes itself), as does an object store.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlog.clock import SystemClock
from kvlog.storage import LocalStorage
from kvlog.storage.faulty import FaultyStorage

HEAD = "log/head.json"
CLOCK = SystemClock().monotonic_s


def test_a_swap_of_the_watched_name_wakes_the_watch(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path, fsync=False)
    storage.put("log/other.json", b"x")  # the directory exists
    watch = storage.watch_swaps(HEAD)
    assert watch is not None
    with watch:
        assert watch.wait(0, CLOCK) is False
        token = storage.swap(HEAD, b"one", None, copy_to="log/1.json")
        assert watch.wait(30, CLOCK) is True
        assert watch.wait(0, CLOCK) is False  # drained
        storage.swap(HEAD, b"two", token)
        assert watch.wait(30, CLOCK) is True


def test_renames_onto_other_names_do_not_end_a_wait(tmp_path: Path) -> None:
    """A checkpoint put while waiting is drained, and the wait goes on to the swap (or to its
    end: a clock past the deadline ends it at the first other rename)."""
    storage = LocalStorage(tmp_path, fsync=False)
    storage.put("log/other.json", b"x")
    with storage.watch_swaps(HEAD) as watch:  # type: ignore[union-attr]
        storage.put("log/7.checkpoint.json", b"checkpoint")
        storage.swap(HEAD, b"one", None)
        assert watch.wait(30, CLOCK) is True
        storage.put("log/8.checkpoint.json", b"checkpoint")
        ticks = iter([0.0, 60.0])
        assert watch.wait(30, lambda: next(ticks)) is False  # drained, and the deadline passed


def test_a_closed_watch_refuses_to_wait(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path, fsync=False)
    storage.put("log/other.json", b"x")
    watch = storage.watch_swaps(HEAD)
    assert watch is not None
    watch.close()
    watch.close()
    with pytest.raises(ValueError):
        watch.wait(0, CLOCK)


def test_no_directory_no_watch_and_a_faulty_wrapper_forwards(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path, fsync=False)
    assert storage.watch_swaps(HEAD) is None  # log/ does not exist yet
    storage.put("log/other.json", b"x")
    watch = FaultyStorage(storage).watch_swaps(HEAD)
    assert watch is not None
    watch.close()


def test_a_process_holding_descriptors_past_fd_setsize_still_waits(tmp_path: Path) -> None:
    """The watch's descriptor may be numbered past 1024 (a server with many sockets): the wait
    does not use ``select``, whose sets end there."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:  # the hard limit of any machine the suite runs on allows 1200
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        storage = LocalStorage(tmp_path, fsync=False)
        storage.put("log/other.json", b"x")
        with storage.watch_swaps(HEAD) as watch:  # type: ignore[union-attr]
            assert watch.fileno() >= 1024
            assert watch.wait(0, CLOCK) is False
            storage.swap(HEAD, b"one", None)
            assert watch.wait(30, CLOCK) is True
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
