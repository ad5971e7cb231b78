"""Bad arguments to a compaction are refused before anything is written, and every commit is
checked by the rules replay reads it with before it is written: kvlog never writes a commit it
cannot read back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH, Root

import kvlog
import spark_ext
from kvlog.aio import AsyncStore
from kvlog.errors import InvalidRecordError, KvlogError
from kvlog.format.commit import Commit
from tests.files import content_digest

BAD_NOW_MS = [
    pytest.param(float("nan"), id="nan"),
    pytest.param(float("inf"), id="inf"),
    pytest.param(float("-inf"), id="-inf"),
    pytest.param(-1, id="negative"),
    pytest.param(1.5, id="float"),
    pytest.param(1000.0, id="whole-float"),
    pytest.param(True, id="bool"),
    pytest.param(2**63, id="2**63"),
    pytest.param("5", id="str"),
]
BAD_FORCE = [pytest.param(v, id=repr(v)) for v in (1, 0, "yes", None, 1.0)]


def fingerprint(root: Path) -> dict[str, str]:
    """Every file of the store's root (its cache too) by path, with a digest of its bytes (of
    the pages that hold data: the cache's file is a sparse gigabyte)."""
    return {str(p.relative_to(root)): content_digest(p)
            for p in sorted(root.rglob("*")) if p.is_file() and p.suffix != ".lock"}


def store_with_tombstones(root: Root) -> kvlog.Store:
    """A store whose next forced compaction writes a replace commit with tombstone horizons."""
    s = root.open(partitions=2, **EXPLICIT_FLUSH)
    for i in range(20):
        s.put(b"k%d" % i, b"v%d" % i)
    s.flush()
    for i in range(10):
        s.delete(b"k%d" % i)
    s.flush()
    return s


@pytest.mark.parametrize("now_ms", BAD_NOW_MS)
def test_compact_refuses_a_bad_now_ms_and_writes_nothing(local_root: Root, now_ms: Any) -> None:
    s = store_with_tombstones(local_root)
    try:
        before = fingerprint(Path(local_root.uri) / "log")
        with pytest.raises(InvalidRecordError, match="now_ms"):
            s.compact(force=True, now_ms=now_ms)
        assert fingerprint(Path(local_root.uri) / "log") == before
        report = s.compact(force=True, now_ms=2**63 - 1)  # the largest accepted is written and read back
        assert report.kind is not None
    finally:
        s.close()
    with local_root.open() as again:
        assert again.check() == []
        assert sorted(again.keys()) == [b"k%d" % i for i in range(10, 20)]


@pytest.mark.parametrize("force", BAD_FORCE)
def test_compact_refuses_a_bad_force(local_root: Root, force: Any) -> None:
    with store_with_tombstones(local_root) as s:
        before = fingerprint(Path(local_root.uri) / "log")
        with pytest.raises(InvalidRecordError, match="force"):
            s.compact(force=force)
        assert fingerprint(Path(local_root.uri) / "log") == before


def test_aio_compact_refuses_a_bad_now_ms(local_root: Root) -> None:
    store_with_tombstones(local_root).close()

    log_dir = Path(local_root.uri) / "log"

    async def run() -> None:
        async with AsyncStore(local_root.open(**EXPLICIT_FLUSH)) as s:
            before = fingerprint(log_dir)
            with pytest.raises(InvalidRecordError, match="now_ms"):
                await s.compact(force=True, now_ms=float("nan"))  # type: ignore[arg-type]
            assert fingerprint(log_dir) == before

    asyncio.run(run())


@pytest.mark.parametrize("now_ms", BAD_NOW_MS[:3])
def test_spark_compact_refuses_a_bad_now_ms_before_touching_spark(local_root: Root, now_ms: Any) -> None:
    # The arguments are checked before the session is used: None stands for a session here.
    store_with_tombstones(local_root).close()
    before = fingerprint(Path(local_root.uri))
    with pytest.raises(InvalidRecordError, match="now_ms"):
        spark_ext.compact(None, local_root.uri, force=True, now_ms=now_ms)
    assert fingerprint(Path(local_root.uri)) == before


def test_a_commit_replay_could_not_read_is_refused_and_nothing_lands(local_root: Root) -> None:
    with local_root.open(partitions=2, **EXPLICIT_FLUSH) as s:
        s.put(b"a", b"1")
        s.flush()
        log_dir = Path(local_root.uri) / "log"
        before = fingerprint(log_dir)
        version = s.log.version
        for info in ({"cleaner": {"0": {"checkpoint": 1, "last_round_ms": float("nan"), "partial": False}}},
                     {"cleaner": {"0": {"checkpoint": -1}}}, {"x": float("inf")}, {"x": (1, 2)}, {1: "x"}):
            def build(version: int, info: Any = info) -> Commit:
                return Commit(version, s.log.new_id(), 5, "replace", info=info)

            with pytest.raises(KvlogError, match="could not read back"):
                s.log.commit(build)
        with pytest.raises(KvlogError, match="could not read back"):
            s.log.commit(lambda v: Commit(v, s.log.new_id(), 5, "producer", producer_id=2**64, epoch=0))
        assert fingerprint(log_dir) == before
        assert s.log.version == version
    with local_root.open() as again:
        assert again.get(b"a") == b"1"
        assert again.check() == []
