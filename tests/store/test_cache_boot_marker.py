"""The metadata cache is not fsynced; a marker with the boot id guards against machine crashes.

A cache left open during an earlier boot may be torn by the crash of that boot: the first
process to open it afterwards deletes it, and the store rebuilds it from its storage root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kvlog
from kvlog.meta import env as meta_env


@pytest.fixture
def boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    boot_file = tmp_path / "boot_id"
    boot_file.write_text("boot-1\n")
    monkeypatch.setattr(meta_env, "_BOOT_ID", boot_file)
    return boot_file


def test_marker_while_open_and_removed_on_close(tmp_path: Path, boot: Path) -> None:
    path = tmp_path / "store"
    marker = path / "cache" / "kvlog-unsynced"
    store = kvlog.open(path, background_compaction=False)
    store.put(b"k", b"v", sync=True)
    assert marker.read_text() == "boot-1"
    store.close()
    assert not marker.exists()


def test_cache_of_an_earlier_boot_is_rebuilt(tmp_path: Path, boot: Path) -> None:
    path = tmp_path / "store"
    store = kvlog.open(path, background_compaction=False)
    for i in range(100):
        store.put(b"key%03d" % i, b"value%03d" % i)
    store.flush()
    store.close()
    cache = path / "cache"
    # A machine crash while the cache was open: the marker of that boot stays, the file is torn.
    (cache / "kvlog-unsynced").write_text("boot-1")
    (cache / "data.mdb").write_bytes(b"\0" * 8192)
    boot.write_text("boot-2\n")
    again = kvlog.open(path, background_compaction=False)
    try:
        assert again.get(b"key042") == b"value042"
        assert len(again) == 100
        assert (cache / "kvlog-unsynced").read_text() == "boot-2"
    finally:
        again.close()


def test_same_boot_keeps_the_cache(tmp_path: Path, boot: Path) -> None:
    path = tmp_path / "store"
    store = kvlog.open(path, background_compaction=False)
    store.put(b"k", b"v", sync=True)
    store.close()
    cache = path / "cache"
    (cache / "kvlog-unsynced").write_text("boot-1")  # a process of this boot died holding it
    before = (cache / "data.mdb").stat().st_ino
    again = kvlog.open(path, background_compaction=False)
    try:
        assert again.get(b"k") == b"v"
        assert (cache / "data.mdb").stat().st_ino == before
    finally:
        again.close()
