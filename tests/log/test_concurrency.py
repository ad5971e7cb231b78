"""Several writers on one store: the commit log serializes them.

* 8 writer threads, each with its own producer and its own Log handle and cache directory (so
  they behave like separate processes), on local storage and on SeaweedFS;
* a deterministic lost race between two handles;
* two real processes (multiprocessing, spawn) writing through ``kvlog.open``.

Afterwards: offsets unique and dense per partition, every acknowledged record readable exactly
once at its acknowledged offsets, and every handle replays the log to the same state.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.check import check_store
from kvlog.clock import ManualClock, SeededIdSource
from kvlog.config import StoreConfig
from kvlog.errors import CommitConflictError
from kvlog.format.producer_state import producer_to_json
from kvlog.log import Log, open_log
from kvlog.log.records import AppendResult, partition_for_key
from kvlog.meta import MetaReader
from kvlog.storage import ForwardStream, LocalStorage, ObjectInfo, Storage, open_storage
from kvlog.storage.base import BytesLike

PARTS = 4
WRITERS = 8
APPENDS = 8


class ConflictCounter(Storage):
    """Forwards to ``inner`` and counts commits published and swaps of the head that lost the race."""

    def __init__(self, inner: Storage) -> None:
        super().__init__()
        self.inner = inner
        self.uri = inner.uri
        self.commits = 0
        self.conflicts = 0

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        self.inner.put_if_absent(name, data)

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        try:
            token = self.inner.swap(name, data, expected, copy_to)
        except FileExistsError:
            self.conflicts += 1
            raise
        self.commits += 1
        return token

    def read_versioned(self, name: str, unless: str | None = None) -> tuple[bytes, str] | None:
        return self.inner.read_versioned(name, unless)

    def read(self, name: str) -> bytes:
        return self.inner.read(name)

    def read_range(self, name: str, start: int, length: int) -> bytes:
        return self.inner.read_range(name, start, length)

    def open_stream(self, name: str, start: int = 0) -> ForwardStream:
        return self.inner.open_stream(name, start)

    def put(self, name: str, data: BytesLike) -> None:
        self.inner.put(name, data)

    def stat(self, name: str) -> ObjectInfo:
        return self.inner.stat(name)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, name: str) -> None:
        self.inner.delete(name)

    def close(self) -> None:
        self.inner.close()


def _state(the_log: Log) -> dict[str, Any]:
    def collect(r: MetaReader) -> dict[str, Any]:
        return {
            "version": r.version(),
            "batches": {p: [(b.base, b.last, b.file_id) for b in r.iter_batches(p, 0)] for p in range(PARTS)},
            "ends": {p: r.partition_end(p) for p in range(PARTS)},
            "producers": sorted((producer_to_json(s) for s in r.iter_producers()), key=lambda s: s["id"]),
            "index": list(r.index_scan()),
        }

    return dict(the_log.snapshot(collect))


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Storage]]:
    """Fresh handles (each with its own client) onto one empty root."""
    made: list[Storage] = []
    if request.param == "s3":
        uri, options = request.getfixturevalue("s3_root")

        def factory() -> Storage:
            made.append(open_storage(uri, options))
            return made[-1]
    else:

        def factory() -> Storage:
            made.append(LocalStorage(tmp_path / "root", fsync=False))
            return made[-1]

    yield factory
    for storage in made:
        storage.close()


def test_eight_writer_threads_with_their_own_handles(
    storage_factory: Callable[[], Storage], tmp_path: Path, record_property: Any
) -> None:
    config = StoreConfig(partitions=PARTS, checkpoint_interval=10, commit_retries=200)
    # The store exists before the writers start, as it would for processes opening it.
    open_log(storage_factory(), cache_dir=tmp_path / "creator", config=config).close()
    counters = [ConflictCounter(storage_factory()) for _ in range(WRITERS)]
    logs = [open_log(counters[i], cache_dir=tmp_path / f"cache{i}", config=config) for i in range(WRITERS)]
    barrier = threading.Barrier(WRITERS)
    acked: list[tuple[int, list[tuple[bytes, bytes]], AppendResult]] = []
    errors: list[BaseException] = []
    gave_up = [0] * WRITERS
    lock = threading.Lock()

    def writer(i: int) -> None:
        try:
            producer = logs[i].producer()  # a new producer id per writer
            sequences = [0] * PARTS
            barrier.wait(timeout=120)
            for n in range(APPENDS):
                p = (i + n) % PARTS
                records = [(f"w{i}-{n}-{j}".encode(), f"value {i} {n} {j}".encode()) for j in range(1 + n % 3)]
                while True:
                    try:
                        result = producer.append(p, records, base_sequence=sequences[p])
                        break
                    except CommitConflictError:
                        gave_up[i] += 1  # the internal retries ran out: resend, same sequence
                assert not result.duplicate
                sequences[p] += len(records)
                with lock:
                    acked.append((p, records, result))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(acked) == WRITERS * APPENDS

    conflicts = sum(c.conflicts for c in counters)
    commits = sum(c.commits for c in counters)
    record_property("swap_conflicts", conflicts)
    record_property("commit_retries_exhausted", sum(gave_up))
    print(f"\n{conflicts} swaps of the head lost the race, {sum(gave_up)} appends resent after exhausted retries")

    verifier = open_log(storage_factory(), cache_dir=tmp_path / "verifier", config=config)
    try:
        # Exactly one commit per acknowledged append landed (new producers register nothing).
        assert verifier.version == len(acked)
        assert commits <= len(acked)  # (a create retried inside the S3 client may count as lost)
        records = {p: list(verifier.read(p)) for p in range(PARTS)}
        for p in range(PARTS):
            assert [r.offset for r in records[p]] == list(range(len(records[p])))
            assert verifier.end_offset(p) == len(records[p])
        by_key = {r.key: r for p in range(PARTS) for r in records[p]}
        assert len(by_key) == sum(len(records[p]) for p in range(PARTS)) == sum(len(a[1]) for a in acked)
        for p, batch, result in acked:
            assert result.last_offset - result.base_offset + 1 == len(batch)
            assert [(r.partition, r.offset, r.value) for r in (by_key[k] for k, _v in batch)] == [
                (p, result.base_offset + j, v) for j, (_k, v) in enumerate(batch)]
        # Every handle replays the same commits into the same state.
        expected = _state(verifier)
        for the_log in logs:
            the_log.refresh()
            assert _state(the_log) == expected
    finally:
        verifier.close()
        for the_log in logs:
            the_log.close()


def test_a_lost_race_is_retried_at_the_next_version(tmp_path: Path) -> None:
    """Handle B's cache is one commit behind; its swap of the head is refused, it re-reads and retries."""
    config = StoreConfig(partitions=PARTS)
    a_storage = ConflictCounter(LocalStorage(tmp_path / "root", fsync=False))
    b_storage = ConflictCounter(LocalStorage(tmp_path / "root", fsync=False))
    clock = ManualClock()
    a = open_log(a_storage, cache_dir=tmp_path / "a", config=config, clock=clock, ids=SeededIdSource(1))
    b = open_log(b_storage, cache_dir=tmp_path / "b", config=config, clock=clock, ids=SeededIdSource(2))
    try:
        pa, pb = a.producer(), b.producer()
        pa.append(0, [(b"from-a", b"1")], base_sequence=0)
        assert b.version == 0  # B has not looked: it swaps the head it read at open
        result = pb.append(0, [(b"from-b", b"2")], base_sequence=0)
        assert b_storage.conflicts == 1 and b_storage.commits == 1
        assert (result.base_offset, result.duplicate) == (1, False)
        assert [r.key for r in b.read(0)] == [b"from-a", b"from-b"]
        a.refresh()
        assert _state(a) == _state(b)
    finally:
        a.close()
        b.close()


def _keys_for(producer_id: int, count: int) -> list[str]:
    return [f"proc{producer_id}-key{n}" for n in range(count)]


def _process_writer(path: str, producer_id: int, cache_dir: str, count: int, barrier: Any) -> None:
    with kvlog.open(path, producer_id=producer_id, cache_dir=cache_dir, flush_interval_ms=5,
                    background_compaction=False) as store:
        barrier.wait(timeout=120)
        keys = _keys_for(producer_id, count)
        for n, key in enumerate(keys[: count // 2]):
            store.put(key, f"value-{producer_id}-{n}")
            if n % 5 == 0:
                store.flush()
        with store.batch() as batch:
            for n, key in enumerate(keys[count // 2:], start=count // 2):
                batch.put(key, f"value-{producer_id}-{n}")
        store.delete(keys[0], sync=True)
        store.flush()


def test_two_processes_write_through_kvlog_open(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    path = tmp_path / "store"
    count = 30
    ids = [101, 202]
    barrier = ctx.Barrier(len(ids))
    procs = [
        ctx.Process(target=_process_writer, args=(str(path), pid, str(tmp_path / f"cache-{pid}"), count, barrier))
        for pid in ids
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    assert [proc.exitcode for proc in procs] == [0, 0]

    with kvlog.open(path, read_only=True, cache_dir=tmp_path / "verify-cache") as store:
        changes = list(store.changes())
        for p in range(store.log.partitions):
            offsets = [r.offset for r in changes if r.partition == p]
            assert offsets == list(range(store.log.end_offset(p)))
        # Every write is in the log exactly once: count puts and one tombstone per process.
        seen: dict[tuple[bytes, bool], int] = {}
        for r in changes:
            assert r.partition == partition_for_key(r.key, store.log.partitions)
            seen[(r.key, r.is_tombstone)] = seen.get((r.key, r.is_tombstone), 0) + 1
        expected = {(k.encode(), False): 1 for pid in ids for k in _keys_for(pid, count)}
        expected.update({(_keys_for(pid, count)[0].encode(), True): 1 for pid in ids})
        assert seen == expected
        for pid in ids:
            keys = _keys_for(pid, count)
            assert store.get(keys[0]) is None
            assert [store.get(k) for k in keys[1:]] == [f"value-{pid}-{n}".encode() for n in range(1, count)]
        producers = store.log.snapshot(lambda r: sorted(s.producer_id for s in r.iter_producers()))
        assert set(ids) <= set(producers)
        assert store.check() == []
        assert check_store(store.log) == []
