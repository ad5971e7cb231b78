"""Handles opened without ``producer_id`` are producers of their own: any number of processes
write one store at once, on its default cache, and none fences another. Real processes on a
local store whose cache (``<dir>/cache``) they all share; a fresh process reads the result."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from store_support import EXPLICIT_FLUSH, child_env

import kvlog

#: A writer: waits for the go file (so that every writer opens at the same instant), opens the
#: store with default arguments, writes its keys by every path (a durable put, a batch, buffered
#: puts and a flush, buffered puts left for close), and closes.
WRITER = """
    import os, sys, time, kvlog
    root, name, go = sys.argv[1], sys.argv[2], sys.argv[3]
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    s = kvlog.open(root)
    s.put(f"{name}-sync", "1", sync=True)
    with s.batch() as b:
        for i in range(5):
            b.put(f"{name}-batch-{i}", str(i))
    for i in range(20):
        s.put(f"{name}-put-{i}", str(i))
    s.flush()
    for i in range(20):
        s.put(f"{name}-late-{i}", str(i))
    s.close()
    print("done", flush=True)
"""


def _keys(name: str) -> dict[str, bytes]:
    out = {f"{name}-sync": b"1"}
    out.update({f"{name}-batch-{i}": str(i).encode() for i in range(5)})
    out.update({f"{name}-put-{i}": str(i).encode() for i in range(20)})
    out.update({f"{name}-late-{i}": str(i).encode() for i in range(20)})
    return out


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=child_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_all(root: Path) -> dict[bytes, bytes]:
    """Every pair of the store as a fresh process with a cache of its own reads it."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, kvlog
        with kvlog.open(sys.argv[1], read_only=True, cache_dir=sys.argv[2]) as s:
            assert s.check() == [], s.check()
            print(repr(dict(s.scan())))
    """), str(root), str(root.parent / "fresh-cache")], env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pairs: dict[bytes, bytes] = eval(out.stdout)  # noqa: S307 - the repr of a dict of bytes
    return pairs


@pytest.mark.parametrize("writers", [2, 4])
def test_writers_opening_at_one_instant_all_keep_their_writes(tmp_path: Path, writers: int) -> None:
    root = tmp_path / "s"
    kvlog.open(str(root)).close()  # created first: the writers race on opening, not on creating
    go = tmp_path / "go"
    procs = [_spawn(WRITER, str(root), f"w{i}", str(go)) for i in range(writers)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out.strip() == "done", err
    expected = {k.encode(): v for i in range(writers) for k, v in _keys(f"w{i}").items()}
    assert _read_all(root) == expected


def test_a_writer_keeps_writing_while_another_opens_writes_and_closes(tmp_path: Path) -> None:
    root = tmp_path / "s"
    first = _spawn("""
        import sys, kvlog
        s = kvlog.open(sys.argv[1])
        s.put("first-sync", "1", sync=True)
        s.put("first-buffered", "2")  # still buffered while the other writer comes and goes
        print("ready", flush=True)
        sys.stdin.readline()
        s.put("first-after", "3")
        s.flush()
        s.put("first-at-close", "4")
        s.close()
        print("done", flush=True)
    """, str(root))
    assert first.stdout is not None and first.stdout.readline().strip() == "ready"
    go = tmp_path / "go"
    go.touch()
    second = _spawn(WRITER, str(root), "second", str(go))
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0 and out.strip() == "ready\ndone", err
    out, err = first.communicate("continue\n", timeout=300)
    assert first.returncode == 0 and out.strip() == "done", err
    expected = {k.encode(): v for k, v in _keys("second").items()}
    expected.update({b"first-sync": b"1", b"first-buffered": b"2", b"first-after": b"3", b"first-at-close": b"4"})
    assert _read_all(root) == expected


def test_a_default_handle_commits_nothing_at_open(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    kvlog.open(root).close()
    with kvlog.open(root, read_only=True) as reader:
        before = reader.log.version
    with kvlog.open(root, **EXPLICIT_FLUSH) as one, kvlog.open(root, **EXPLICIT_FLUSH) as two:
        assert one.refresh() == before and two.refresh() == before  # no producer commit
        assert one.stats()["producer_id"] != two.stats()["producer_id"]
        assert one.stats()["producer_epoch"] == two.stats()["producer_epoch"] == 0
        # Its first write is its producer's first batch, epoch 0, sequence 0: replay takes it.
        one.put(b"k", b"v", sync=True)
        two.put(b"k2", b"v2", sync=True)
        assert one.refresh() == before + 2
        assert one.check() == []
    with kvlog.open(root, **EXPLICIT_FLUSH) as again:  # the same cache, reopened: a new producer again
        assert again.stats()["producer_epoch"] == 0
        assert dict(again.scan()) == {b"k": b"v", b"k2": b"v2"}
