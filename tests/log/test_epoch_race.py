"""Producer epochs are taken by a conditional commit: two openers never hold one epoch.

Two handles of one producer id may both compute "current epoch + 1" from the same state. Were
both to register it, each would have ``put(sync=True)`` acknowledged, and the producer rules
would drop one of the two writes as a "duplicate" of the other (same producer, epoch and
sequences). Exactly one opener wins each epoch, the other takes the next one (fencing the
first), and a batch that repeats another's sequences with other content is never taken for a
duplicate of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.clock import ManualClock, SeededIdSource
from kvlog.config import StoreConfig
from kvlog.errors import ProducerFencedError
from kvlog.log import Log, open_log
from kvlog.storage import LocalStorage
from kvlog.storage.base import BytesLike

PID = 4242


class InterleavingStorage(LocalStorage):
    """A real local storage that runs ``hook`` once, just before the next commit is written:
    the deterministic stand-in for another process acting at that instant."""

    hook: Callable[[], None] | None = None

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return super().swap(name, data, expected, copy_to)


def _open(storage: LocalStorage, cache: Path, clock: ManualClock, seed: int) -> Log:
    return open_log(storage, cache_dir=cache, partitions=1, config=StoreConfig(partitions=1),
                    clock=clock, ids=SeededIdSource(seed))


def test_concurrent_bumps_of_one_producer_never_share_an_epoch(tmp_path: Path) -> None:
    clock = ManualClock()
    root = tmp_path / "root"
    storage = InterleavingStorage(root, fsync=False)
    first = _open(storage, tmp_path / "cache-a", clock, 1)
    second = _open(LocalStorage(root, fsync=False), tmp_path / "cache-b", clock, 2)
    try:
        assert first.producer(PID).epoch == 0
        others: list[Any] = []
        # Both compute epoch 1 from the same state; the other opener registers it first.
        storage.hook = lambda: others.append(second.producer(PID))
        winner = first.producer(PID)
        (loser,) = others
        assert loser.epoch == 1
        assert winner.epoch == 2  # lost epoch 1 to the other opener and took the next one
        # The older holder is fenced; the newer one's write is acknowledged and kept.
        with pytest.raises(ProducerFencedError):
            loser.append(0, [(b"k", b"from-loser")], base_sequence=0)
        result = winner.append(0, [(b"k", b"from-winner")], base_sequence=0)
        assert not result.duplicate
        second.refresh()
        assert [(r.key, r.value) for r in second.read(0)] == [(b"k", b"from-winner")]
    finally:
        first.close()
        second.close()


def test_a_registration_of_the_current_epoch_is_refused(tmp_path: Path) -> None:
    clock = ManualClock()
    root = tmp_path / "root"
    one = _open(LocalStorage(root, fsync=False), tmp_path / "cache-a", clock, 1)
    two = _open(LocalStorage(root, fsync=False), tmp_path / "cache-b", clock, 2)
    try:
        one.register_producer(PID, 3)
        with pytest.raises(ProducerFencedError):
            two.register_producer(PID, 3)  # the same epoch again: someone already holds it
        with pytest.raises(ProducerFencedError):
            two.register_producer(PID, 2)
        two.register_producer(PID, 4)
    finally:
        one.close()
        two.close()


def test_another_batch_with_the_same_sequences_is_no_duplicate(tmp_path: Path) -> None:
    """Two holders that share an epoch on purpose (a resumed producer) and write different
    records at one sequence: the second is refused as fenced, not acknowledged as a duplicate."""
    clock = ManualClock()
    the_log = _open(LocalStorage(tmp_path / "root", fsync=False), tmp_path / "cache", clock, 1)
    try:
        producer = the_log.producer(PID)
        twin = the_log.producer(PID, epoch=producer.epoch)  # resumes the same epoch
        first = producer.append(0, [(b"a", b"1"), (b"b", b"2")], base_sequence=0)
        with pytest.raises(ProducerFencedError):
            twin.append(0, [(b"a", b"1"), (b"b", b"other")], base_sequence=0)
        clock.advance(5)  # a real resend, stamped later, is still the same batch
        again = twin.append(0, [(b"a", b"1"), (b"b", b"2")], base_sequence=0)
        assert again.duplicate and (again.base_offset, again.last_offset) == (
            first.base_offset, first.last_offset)
        assert [r.value for r in the_log.read(0)] == [b"1", b"2"]
    finally:
        the_log.close()


_OPENER = textwrap.dedent("""
    import json, sys, time
    import kvlog
    from kvlog.errors import KvlogError
    spec = json.loads(sys.argv[1])
    while time.time() < spec["start"]:
        pass
    outcome = {"key": spec["key"], "acked": False, "error": None}
    try:
        store = kvlog.open(spec["root"], producer_id=spec["pid"], cache_dir=spec["cache"],
                           partitions=1, background_compaction=False, flush_interval_ms=0)
        try:
            store.put(spec["key"], spec["key"], sync=True)
            outcome["acked"] = True
        finally:
            store.close(flush=False)
    except KvlogError as e:
        outcome["error"] = type(e).__name__
    print(json.dumps(outcome))
""")


@pytest.mark.slow
def test_processes_opening_one_producer_at_the_same_instant_lose_no_acknowledged_write(
    tmp_path: Path,
) -> None:
    """Four processes open one store with one producer id at the same instant (all start
    spinning towards one wall-clock time) and each writes one key with ``sync=True``: every
    acknowledged key is in the store, in several rounds."""
    root = tmp_path / "store"
    kvlog.open(root, partitions=1, background_compaction=False).close()
    acked: list[str] = []
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for round_ in range(6):
        start = time.time() + 1.5  # every process imports kvlog, then spins until this instant
        procs = []
        for i in range(4):
            spec = {"root": str(root), "pid": PID, "cache": str(tmp_path / f"cache-{round_}-{i}"),
                    "key": f"r{round_}-p{i}", "start": start}
            procs.append(subprocess.Popen([sys.executable, "-c", _OPENER, json.dumps(spec)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env))
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            outcome: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
            assert outcome["error"] in (None, "ProducerFencedError"), outcome
            if outcome["acked"]:
                acked.append(outcome["key"])
    assert acked, "no write was acknowledged at all"
    with kvlog.open(root, read_only=True, cache_dir=tmp_path / "fresh") as reader:
        missing = [key for key in acked if reader.get(key) != key.encode()]
        assert missing == [], f"acknowledged but lost: {missing}"
        assert reader.check() == []
