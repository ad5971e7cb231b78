"""Reads and resizes of the metadata cache's LMDB map (kvlog.meta.map_gate).

Resizing the map unmaps it and maps it again elsewhere, so a view of the old map handed out
before must never be read after. Each case runs in a child process (a read of an unmapped view
kills it, which the test reports as a failure, not as a lost pytest worker), with the address
space just below the map reserved first, so that the grown map cannot cover the old one and
every stale read faults at once instead of reading other pages. Both the C extensions and
their pure-Python twins are tried.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kvlog

REPO = Path(kvlog.__file__).resolve().parent.parent

PRELUDE = '''
import ctypes, mmap, sys, threading
import kvlog
from kvlog.errors import StorageError

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
MAP_FIXED_NOREPLACE = 0x100000

def grow(store):
    """Double the cache's map, with the addresses below it reserved: it moves."""
    env = store.log.env
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith(str(env.path / "data.mdb")):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if hi - lo >= 1 << 20:  # the map itself, not the meta pages' mapping
                libc.mmap(lo - 4 * (hi - lo), 4 * (hi - lo), 0,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
    env._grow()

def fill(store, n, tag=b"v"):
    for i in range(n):
        store.put(b"k%05d" % i, tag + b"%d" % i)
    store.flush()

store = kvlog.open(sys.argv[1], flush_interval_ms=0, background_compaction=False)
'''


def _run(tmp_path: Path, body: str, pure: bool) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if pure:
        env["KVLOG_PURE_PYTHON"] = "1"
    else:
        env.pop("KVLOG_PURE_PYTHON", None)
    script = PRELUDE + textwrap.dedent(body) + "\nstore.close()\nprint('done')\n"
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "store")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.stdout.rstrip().endswith("done"), done.stdout
    return done.stdout


@pytest.fixture(params=["c", "pure"])
def pure(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "pure")


def test_gets_after_the_map_grew_with_runs_pending_read_afresh(tmp_path: Path, pure: bool) -> None:
    out = _run(tmp_path, '''
        fill(store, 300)
        assert store.log.index.runs_pending() if hasattr(store.log.index, "runs_pending") else True
        assert store.get(b"k00001") == b"v1"  # pools a transaction with the run's views
        assert any(snap[2] for snap in store.log.index._snaps)
        grow(store)
        assert store.get(b"k00001") == b"v1"
        assert store.get(b"k00299") == b"v299"
        assert store.get(b"missing") is None
        fill(store, 300, b"w")
        assert store.get(b"k00007") == b"w7"
        grow(store)
        assert [store.get(b"k%05d" % i) for i in range(300)] == [b"w%d" % i for i in range(300)]
        print("gets", store.log.env.gate.epoch)
    ''', pure)
    assert "gets 4" in out


def test_a_scan_open_across_a_resize_ends_with_a_storage_error(tmp_path: Path, pure: bool) -> None:
    out = _run(tmp_path, '''
        fill(store, 2000)
        for reverse in (False, True):
            scan = store.scan(reverse=reverse)
            first = [next(scan) for _ in range(40)]
            grow(store)
            try:
                rest = list(scan)
            except StorageError as e:
                assert "map was resized" in str(e), e
                print("ended", reverse)
            else:
                raise AssertionError(f"a scan read past a resize: {len(first) + len(rest)} pairs")
            again = list(store.scan(reverse=reverse))
            assert len(again) == 2000
        print("pairs", len(list(store.scan())))
    ''', pure)
    assert "ended False" in out and "ended True" in out and "pairs 2000" in out


def test_reads_in_other_threads_while_the_map_grows(tmp_path: Path, pure: bool) -> None:
    out = _run(tmp_path, '''
        fill(store, 500)
        stop = threading.Event()
        errors = []
        counts = {"gets": 0, "scans": 0, "ended": 0}

        def reader(n):
            while not stop.is_set():
                try:
                    for i in range(n, 500, 37):
                        value = store.get(b"k%05d" % i)
                        if value is None or value[1:] != b"%d" % i:
                            errors.append((i, value))
                        counts["gets"] += 1
                    got = [k for k, _ in store.scan(start=b"k00100", stop=b"k00200")]
                    if got != [b"k%05d" % i for i in range(100, 200)]:
                        errors.append(("scan", len(got)))
                    counts["scans"] += 1
                except StorageError as e:
                    if "map was resized" not in str(e):
                        errors.append(repr(e))
                    counts["ended"] += 1

        threads = [threading.Thread(target=reader, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        try:
            for round in range(5):
                fill(store, 500, b"%c" % (ord("a") + round))
                grow(store)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert errors == [], errors[:5]
        assert counts["gets"] > 0 and counts["scans"] > 0, counts
        print("epoch", store.log.env.gate.epoch)
    ''', pure)
    assert "epoch 10" in out


def test_a_resize_made_by_another_process_sharing_the_cache(tmp_path: Path, pure: bool) -> None:
    """Another process grows the shared cache's map and commits; this one adopts the new size
    (what it does when LMDB says MapResizedError: once the data outgrows its own map), behind the
    same gate: gets answer, a scan open across the adoption ends with StorageError, never reads
    the old map."""
    out = _run(tmp_path, '''
        import os, subprocess
        store.close()
        store = kvlog.open(sys.argv[1], producer_id=1, refresh_interval_ms=600_000, flush_interval_ms=0,
                           background_compaction=False)
        fill(store, 2000)
        assert store.get(b"k00001") == b"v1" and any(snap[2] for snap in store.log.index._snaps)
        scan = store.scan()
        first = [next(scan) for _ in range(40)]
        size = store.log.env.map_size()
        child = (
            "import kvlog\\n"
            f"with kvlog.open({sys.argv[1]!r}, cache_dir={str(store.log.env.path)!r}, producer_id=2, "
            "flush_interval_ms=0, background_compaction=False) as s:\\n"
            "    s.log.env._grow()\\n"
            "    s.put(b'theirs', b'grown', sync=True)\\n"
        )
        subprocess.run([sys.executable, "-c", child], check=True, timeout=120, env=os.environ)
        assert store.get(b"theirs") == b"grown"  # the old map still covers every page
        store.log.env._adopt_size()
        assert store.log.env.map_size() == 2 * size
        assert store.get(b"theirs") == b"grown"
        assert [store.get(b"k%05d" % i) for i in range(0, 2000, 7)] == [b"v%d" % i for i in range(0, 2000, 7)]
        try:
            rest = list(scan)
        except StorageError as e:
            assert "map was resized" in str(e), e
            print("ended")
        else:
            raise AssertionError(f"a scan read past the adopted resize: {len(first) + len(rest)} pairs")
        print("pairs", len(list(store.scan())))
    ''', pure)
    assert "ended" in out and "pairs 2001" in out
