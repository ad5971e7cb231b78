"""A full disk under the store or under its metadata cache is a ``StorageError``, never a crash,
and loses nothing acknowledged.

Each test mounts a small tmpfs (the tests run as root), lets a child process (``fill_proc.py``)
write to a store on it until a write fails, frees space by growing the tmpfs, lets the same
handle write and flush again, and then checks in a fresh handle that every acknowledged write
is there and the store is whole. The writer is a separate process so that a SIGBUS (a write
to a mapped page the disk has no block for) is a negative return code, not the end of pytest.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from store_support import child_env

import kvlog

FILL = Path(__file__).with_name("fill_proc.py")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs, unmounted whatever the test does."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.fail(f"these tests mount a tmpfs and need root (CAP_SYS_ADMIN): mount failed: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill_then_free(disk: Path, tmp_path: Path, *, uri: str, cache_dir: str, sync: bool = False) -> list[str]:
    """Run the writer until the disk is full, grow the disk, let it write again; the keys it
    acknowledged."""
    acked = tmp_path / "acked"
    spec: dict[str, Any] = {"uri": uri, "cache_dir": cache_dir, "acked": str(acked), "value_bytes": 100,
                            "batch_records": 20 if sync else 300, "max_batches": 5000, "sync": sync}
    child = subprocess.Popen([sys.executable, str(FILL)], env=child_env(spec), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        first = child.stdout.readline()
        if not first.startswith("FULL"):
            out, err = child.communicate(timeout=60)
            pytest.fail(f"the writer ended with {child.returncode} (negative: killed by a signal) "
                        f"before reporting a full disk: {first}{out}\n{err}")
        assert "StorageError" not in first  # the message only
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        out, err = child.communicate("go\n", timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, f"writer ended with {child.returncode}: {out}\n{err}"
    assert "RESUMED" in out
    return acked.read_text().split()


def assert_all_there(uri: str, cache_dir: str, keys: list[str]) -> None:
    assert keys
    with kvlog.open(uri, cache_dir=cache_dir, create=False) as store:
        found = store.get_many([k.encode() for k in keys])
        missing = [k for k, v in zip(keys, found, strict=True) if v is None]
        assert missing == []
        assert store.check() == []
        store.put(b"after", b"1", sync=True)
        assert store.get(b"after") == b"1"


def test_a_full_disk_under_the_cache_is_a_storage_error_and_loses_nothing(
        small_disk: Path, tmp_path: Path) -> None:
    uri, cache_dir = str(tmp_path / "store"), str(small_disk / "cache")
    keys = fill_then_free(small_disk, tmp_path, uri=uri, cache_dir=cache_dir)
    assert_all_there(uri, cache_dir, keys)


def test_a_full_disk_under_the_cache_with_sync_puts(small_disk: Path, tmp_path: Path) -> None:
    uri, cache_dir = str(tmp_path / "store"), str(small_disk / "cache")
    keys = fill_then_free(small_disk, tmp_path, uri=uri, cache_dir=cache_dir, sync=True)
    assert_all_there(uri, cache_dir, keys)


def test_a_full_disk_under_the_whole_store_is_a_storage_error_and_loses_nothing(
        small_disk: Path, tmp_path: Path) -> None:
    uri, cache_dir = str(small_disk / "store"), str(small_disk / "cache")
    keys = fill_then_free(small_disk, tmp_path, uri=uri, cache_dir=cache_dir)
    assert_all_there(uri, cache_dir, keys)
    assert not [p for p in Path(uri).rglob("*") if ".tmp-kvlog." in p.name]  # no torn or stray file


def test_a_full_disk_under_the_whole_store_with_sync_puts(small_disk: Path, tmp_path: Path) -> None:
    uri, cache_dir = str(small_disk / "store"), str(small_disk / "cache")
    keys = fill_then_free(small_disk, tmp_path, uri=uri, cache_dir=cache_dir, sync=True)
    assert_all_there(uri, cache_dir, keys)
