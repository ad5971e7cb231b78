"""Named checkpoints and committed offsets under attack: races, lost files, damage, restores."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from root_surgery import copy_root, restore_root
from store_support import EXPLICIT_FLUSH, Root

import kvlog
from kvlog.clock import ManualClock
from kvlog.errors import (
    CheckpointExistsError,
    CommitStateUnknownError,
    CorruptDataError,
    InvalidRecordError,
    KvlogError,
    StorageError,
)
from kvlog.format.commit import Commit
from kvlog.format.envelope import decode_document, encode_document
from kvlog.log.head import HEAD_NAME
from kvlog.storage import LocalStorage
from kvlog.storage.base import BytesLike

FAST_GC: dict[str, Any] = dict(EXPLICIT_FLUSH, file_delete_delay_ms=1_000, commit_retention_ms=0,
                               checkpoint_interval=2)


def _write_rounds(store: kvlog.Store, rounds: range, keys: int = 30) -> None:
    for r in rounds:
        for i in range(keys):
            store.put(f"k{i}", f"round{r}-{i}")
        store.flush()


def _read_all(store: kvlog.Store) -> list[Any]:
    return [list(store.scan()), store.get("k1"), list(store.changes())]


def test_reading_a_deleted_and_collected_checkpoint_fails_cleanly(local_root: Root) -> None:
    clock = ManualClock()
    with local_root.open(clock=clock, partitions=2, **FAST_GC) as store:
        _write_rounds(store, range(3))
        store.checkpoint("cp")
        before = list(store.scan())
        old = local_root.open(cache="reader", read_only=True, checkpoint="cp")
        try:
            assert list(old.scan()) == before
            _write_rounds(store, range(3, 5))
            store.compact(force=True)
            store.delete_checkpoint("cp")
            for i in range(4):
                store.put(f"x{i}", "y", sync=True)
            clock.advance(10_000)
            store.gc()
            pinned = {e.path for _f, e in old.log.snapshot(lambda r: list(r.iter_files()))}
            assert pinned and not pinned & {i.name for i in store.log.storage.list("data/")}
            for attempt in range(2):
                try:
                    got = _read_all(old)
                except KvlogError:
                    continue
                assert got[0] == before, attempt  # never wrong data
        finally:
            old.close()


def test_opening_a_checkpoint_whose_files_were_deleted_by_hand(local_root: Root) -> None:
    clock = ManualClock()
    with local_root.open(clock=clock, partitions=2, **FAST_GC) as store:
        _write_rounds(store, range(3))
        cp = store.checkpoint("cp")
        _write_rounds(store, range(3, 5))
    root = Path(local_root.uri)
    (root / "log" / f"{cp.version:020d}.checkpoint.json").unlink()
    with pytest.raises(KvlogError):
        local_root.open(cache="fresh1", read_only=True, checkpoint="cp")
    (root / "log" / f"{cp.version:020d}.json").unlink()
    with pytest.raises(KvlogError):
        local_root.open(cache="fresh2", read_only=True, checkpoint="cp")


def _delete_data_files_then_expect_a_refusal(local_root: Root, **open_kwargs: Any) -> None:
    """Delete every data file by hand: opening checkpoint "cp" read-only, or reading it, refuses."""
    for f in (Path(local_root.uri) / "data").rglob("*.arrow"):
        f.unlink()
    try:
        old = local_root.open(read_only=True, checkpoint="cp", **open_kwargs)
    except KvlogError:
        return
    with old:
        with pytest.raises(KvlogError):
            _read_all(old)


def test_opening_a_checkpoint_whose_data_files_were_deleted_by_hand(local_root: Root) -> None:
    clock = ManualClock()
    # data files of their own: the test deletes them (a flush inside its commit has none)
    with local_root.open(clock=clock, partitions=2, commit_inline_bytes=0, **FAST_GC) as store:
        _write_rounds(store, range(3))
        store.checkpoint("cp")
        _write_rounds(store, range(3, 5))
        store.compact(force=True)
    _delete_data_files_then_expect_a_refusal(local_root, cache="fresh")


def test_a_cached_checkpoint_whose_data_files_were_deleted_by_hand(local_root: Root) -> None:
    clock = ManualClock()
    # data files of their own: the test deletes them
    with local_root.open(clock=clock, partitions=2, commit_inline_bytes=0, **FAST_GC) as store:
        _write_rounds(store, range(3))
        store.checkpoint("cp")
        with local_root.open(read_only=True, checkpoint="cp") as old:
            assert len(old) == 30
    _delete_data_files_then_expect_a_refusal(local_root)


def test_two_handles_create_one_name_at_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "c0", partitions=2, **EXPLICIT_FLUSH) as s:
        _write_rounds(s, range(2))
    for attempt in range(6):
        handles = [kvlog.open(root, cache_dir=tmp_path / f"c{i}", **EXPLICIT_FLUSH) for i in range(2)]
        barrier = threading.Barrier(2)
        results: list[Any] = [None, None]

        def make(i: int, attempt: int = attempt, handles: list[kvlog.Store] = handles,
                 barrier: threading.Barrier = barrier, results: list[Any] = results) -> None:
            barrier.wait()
            try:
                results[i] = handles[i].checkpoint(f"same{attempt}")
            except KvlogError as e:
                results[i] = e
        threads = [threading.Thread(target=make, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [r for r in results if isinstance(r, kvlog.Checkpoint)]
        lost = [r for r in results if isinstance(r, CheckpointExistsError)]
        assert len(won) == 1 and len(lost) == 1, results
        for h in handles:
            h.refresh()
            assert [c for c in h.checkpoints() if c.name == f"same{attempt}"] == won
            h.close()


def test_a_checkpoint_of_a_restored_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    clock = ManualClock()
    # data files of their own: restore_root puts back the data directory of the backup
    with kvlog.open(root, cache_dir=tmp_path / "c", clock=clock, partitions=2, commit_inline_bytes=0,
                    **FAST_GC) as store:
        _write_rounds(store, range(2))
        copy_root(root, tmp_path / "backup")
        _write_rounds(store, range(2, 4))
        store.checkpoint("late")
        with kvlog.open(root, cache_dir=tmp_path / "c", read_only=True, checkpoint="late") as old:
            assert len(old) == 30
    restore_root(root, tmp_path / "backup")
    for cache in ("c", "fresh"):
        try:
            old = kvlog.open(root, cache_dir=tmp_path / cache, read_only=True, checkpoint="late")
        except KvlogError:
            continue
        with old:
            pytest.fail(f"opened a checkpoint the restored root does not hold: {list(old.scan())[:2]}")


def test_offsets_and_pins_survive_commit_gc_and_a_fresh_cache(local_root: Root) -> None:
    clock = ManualClock()
    with local_root.open(clock=clock, partitions=2, **FAST_GC) as store:
        _write_rounds(store, range(2))
        with store.consumer("g") as c:
            c.poll(timeout_s=0)
            c.commit()
            committed = {p: c.committed(p) for p in c.partitions}
        cp = store.checkpoint("cp")
        for i in range(8):
            store.put(f"x{i}", "y", sync=True)
        store.compact(force=True)
        clock.advance(10_000)
        store.gc()
    with local_root.open(cache="fresh", clock=clock, **FAST_GC) as again:
        assert again.checkpoints() == [cp]
        with again.consumer("g") as c:
            assert {p: c.committed(p) for p in c.partitions} == committed


@pytest.mark.parametrize("offset", [2**63, 2**64, -1])
def test_an_offset_too_big_to_store_is_refused_before_any_commit(local_root: Root, offset: int) -> None:
    with local_root.open(partitions=2, **EXPLICIT_FLUSH) as store:
        store.put("a", "1", sync=True)
        version = store.log.version
        with store.consumer("g") as c:
            with pytest.raises(InvalidRecordError):
                c.seek(0, offset)
            c.commit()
            assert c.committed(0) == 0
        assert store.log.version == version + 1


@pytest.mark.parametrize("offsets", [{"0": 2**64}, {"0": 2**63}, {"70000": 1}, {"\u00b2": 1}, {"0": -1}])
def test_a_crafted_offsets_commit_is_refused_and_the_store_goes_on(local_root: Root,
                                                                   offsets: dict[str, int]) -> None:
    """An offsets commit no kvlog call writes (another program, or a damaged writer) is refused
    by every reader; it never stops replay."""
    with local_root.open(partitions=2, **EXPLICIT_FLUSH) as store:
        store.put("a", "1", sync=True)
        commit_id = store.log.new_id()

        def build(version: int) -> Commit:
            return Commit(version, commit_id, 0, "offsets", info={"group": "g", "offsets": offsets})

        outcome = store.log.commit(build)
        assert outcome.refusal is not None
        store.put("b", "2", sync=True)
        assert store.consumer("g").committed(0) is None
    with local_root.open(cache="fresh") as fresh:
        assert fresh.get("b") == b"2"
        assert fresh.consumer("g").committed(0) is None


def _reseal_newest_checkpoint(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite the newest metadata checkpoint with ``change`` applied and a valid checksum (a
    body no kvlog writes, from another program)."""
    newest = sorted((root / "log").glob("*.checkpoint.json"))[-1]
    body = decode_document(newest.name, newest.read_bytes(), "checkpoint")
    change(body)
    newest.write_bytes(encode_document("checkpoint", body))


BAD_BODIES: dict[str, Callable[[dict[str, Any]], None]] = {
    "offset too big": lambda b: b["offsets"].append(["g", 0, 2**64]),
    "negative offset": lambda b: b["offsets"].append(["g", 0, -1]),
    "partition too big": lambda b: b["offsets"].append(["g", 70000, 1]),
    "group with NUL": lambda b: b["offsets"].append(["g\x00x", 0, 1]),
    "offsets not rows": lambda b: b.update(offsets=[7]),
    "pin not an object": lambda b: b["pins"].update(x=[]),
    "pins not an object": lambda b: b.update(pins=[1]),
}


@pytest.mark.parametrize("bad", sorted(BAD_BODIES))
def test_a_crafted_checkpoint_body_is_corrupt_data(tmp_path: Path, bad: str) -> None:
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "c", partitions=2, **EXPLICIT_FLUSH) as store:
        store.put("a", "1", sync=True)
        cp = store.checkpoint("cp")
        with store.consumer("g") as c:
            c.commit()
        store.log.write_checkpoint()
    _reseal_newest_checkpoint(root, BAD_BODIES[bad])
    with kvlog.open(root, cache_dir=tmp_path / "fresh") as fresh:  # the commits are replayed instead
        assert fresh.checkpoints() == [cp]
        assert fresh.consumer("g").committed(0) == 0
    for commit in (root / "log").glob("*.json"):
        if not commit.name.endswith(".checkpoint.json"):
            if commit.name != sorted((root / "log").glob("*.checkpoint.json"))[-1].name.replace(".checkpoint", ""):
                commit.unlink()  # only the checkpoint is left to read
    with pytest.raises(CorruptDataError):
        kvlog.open(root, cache_dir=tmp_path / "fresher")


def test_a_flipped_byte_in_a_checkpoint_body_carrying_offsets_and_pins(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "c", partitions=2, **EXPLICIT_FLUSH) as store:
        store.put("a", "1", sync=True)
        cp = store.checkpoint("cp")
        with store.consumer("g") as c:
            c.commit()
        version = store.log.write_checkpoint()
    newest = root / "log" / f"{version:020d}.checkpoint.json"
    data = bytearray(newest.read_bytes())
    at = data.index(b'"offsets"') + 3
    data[at] ^= 0x01
    newest.write_bytes(bytes(data))
    try:
        fresh = kvlog.open(root, cache_dir=tmp_path / "fresh")
    except CorruptDataError:
        return
    with fresh:  # only if it read the commits instead: exactly what they say
        assert fresh.checkpoints() == [cp]
        assert fresh.consumer("g").committed(0) == 0


@pytest.mark.parametrize("db", ["offsets", "groups", "pins"])
def test_a_flipped_byte_in_the_catalog_is_corrupt_data_and_the_cache_is_rebuilt(tmp_path: Path,
                                                                                db: str) -> None:
    path = tmp_path / "root"
    store = kvlog.open(path, partitions=2, **EXPLICIT_FLUSH)
    try:
        store.put("a", "1", sync=True)
        cp = store.checkpoint("cp")
        with store.consumer("g", hold_tombstones=True) as c:
            c.commit()
        groups = store.consumer_groups()
        env = store.log.env
        with env.env.begin(write=True) as txn:
            with txn.cursor(db=env.dbs[db]) as cur:
                assert cur.first()
                key, value = bytes(cur.key()), bytearray(cur.value())
            value[-1] ^= 0x10
            txn.put(key, bytes(value), db=env.dbs[db])
        with pytest.raises(CorruptDataError):
            store.checkpoints()
            store.consumer("g").committed(0)
            store.consumer_groups()
    finally:
        store.close(flush=False)
    with kvlog.open(path) as again:
        assert again.checkpoints() == [cp]
        assert again.consumer("g").committed(0) == 0
        assert again.consumer_groups() == groups and groups[0].holding


@pytest.mark.parametrize("reopen", [True, False])
def test_a_cache_just_behind_a_pinned_version_catches_up_and_loses_no_write(tmp_path: Path,
                                                                            reopen: bool) -> None:
    """A cache one commit short of a checkpoint's version, while commit GC collected everything
    around it: it must catch up to the head (never stop at the pinned version), reopened or
    live, and a write from it lands at the head and is seen by every reader."""
    root = tmp_path / "root"
    clock = ManualClock()
    a = kvlog.open(root, cache_dir=tmp_path / "a", clock=clock, partitions=2, **FAST_GC)
    b = kvlog.open(root, cache_dir=tmp_path / "b", clock=clock, **FAST_GC)
    try:
        b.put("from-b", "1", sync=True)
        if reopen:
            b.close()
        a.refresh()
        a.put("x", "1", sync=True)
        a.checkpoint("cp")
        for i in range(8):
            a.put(f"later{i}", "v", sync=True)
        a.compact(force=True)
        clock.advance(10_000)
        a.gc()
        if reopen:
            b = kvlog.open(root, cache_dir=tmp_path / "b", clock=clock, **FAST_GC)
            assert b.get("later7") == b"v"  # caught up from the newest metadata checkpoint
        # A live cache behind the retention window catches up in place: its write lands at the head.
        b.put("late", "2", sync=True)
        assert b.log.version > a.log.version
        assert b.get("later7") == b"v"
    finally:
        a.close()
        b.close()
    with kvlog.open(root, cache_dir=tmp_path / "fresh", clock=clock) as fresh:
        assert fresh.get("late") == b"2"
        assert fresh.get("later7") == b"v"


class AnswerLosingStorage(LocalStorage):
    """A real local storage that, when told, lets the next commit land (its swap of the head)
    but reports a timeout; unless ``learn``, reading the head fails five times too, so its
    outcome stays unknown to its writer."""

    lose = False
    learn = True
    _blind = 0

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        token = super().swap(name, data, expected, copy_to)
        if self.lose and name == HEAD_NAME:
            self.lose = False
            self._blind = 0 if self.learn else 5
            raise StorageError(f"{name}: timed out")
        return token

    def read_versioned(self, name: str, unless: str | None = None) -> tuple[bytes, str] | None:
        if name == HEAD_NAME and self._blind > 0:
            self._blind -= 1
            raise StorageError(f"{name}: timed out")
        return super().read_versioned(name, unless)


def _lose_the_answer(storage: AnswerLosingStorage, learn: bool) -> None:
    storage.lose, storage.learn = True, learn


@pytest.mark.parametrize("learn", [True, False])
def test_a_pin_whose_answer_was_lost(tmp_path: Path, learn: bool) -> None:
    storage = AnswerLosingStorage(tmp_path / "root", fsync=False)
    with kvlog.open(storage, cache_dir=tmp_path / "c", partitions=2, **EXPLICIT_FLUSH) as store:
        store.put("a", "1", sync=True)
        _lose_the_answer(storage, learn)
        if learn:
            cp = store.checkpoint("x")
        else:
            with pytest.raises(CommitStateUnknownError):
                store.checkpoint("x")
            store.refresh()
            with pytest.raises(CheckpointExistsError):  # the retry finds the first one landed
                store.checkpoint("x")
            [cp] = store.checkpoints()
        assert not storage.lose  # the pin's answer was lost
        assert store.checkpoints() == [cp]
        _lose_the_answer(storage, learn)
        if learn:
            store.delete_checkpoint("x")
        else:
            with pytest.raises(CommitStateUnknownError):
                store.delete_checkpoint("x")
            store.refresh()
        assert not storage.lose
        assert store.checkpoints() == []
        store.put("b", "2", sync=True)
    with kvlog.open(tmp_path / "root", cache_dir=tmp_path / "fresh") as fresh:
        assert fresh.checkpoints() == []
        assert fresh.get("b") == b"2"


@pytest.mark.parametrize("learn", [True, False])
def test_an_offsets_commit_whose_answer_was_lost_is_harmless_to_retry(tmp_path: Path, learn: bool) -> None:
    storage = AnswerLosingStorage(tmp_path / "root", fsync=False)
    with kvlog.open(storage, cache_dir=tmp_path / "c", partitions=2, **EXPLICIT_FLUSH) as store:
        for i in range(10):
            store.put(f"k{i}", "v")
        store.flush()
        with store.consumer("g") as c:
            got = c.poll(timeout_s=0)
            _lose_the_answer(storage, learn)
            if learn:
                c.commit()
            else:
                with pytest.raises(CommitStateUnknownError):
                    c.commit()
                c.commit()  # the retry
            assert not storage.lose  # the offsets commit's answer was lost
            want = {p: c.position(p) for p in c.partitions}
            assert {p: c.committed(p) for p in c.partitions} == want
        assert len(got) == 10
    with kvlog.open(tmp_path / "root", cache_dir=tmp_path / "fresh") as fresh:
        with fresh.consumer("g") as again:
            assert {p: again.committed(p) for p in again.partitions} == want
            assert again.poll(timeout_s=0) == []


def test_two_consumers_of_one_group_commit_at_once_from_two_handles(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with kvlog.open(root, cache_dir=tmp_path / "c0", partitions=2, **EXPLICIT_FLUSH) as s:
        for i in range(20):
            s.put(f"k{i}", "v")
    handles = [kvlog.open(root, cache_dir=tmp_path / f"c{i}", **EXPLICIT_FLUSH) for i in range(2)]
    try:
        consumers = [h.consumer("g") for h in handles]
        consumers[0].seek(0, 3)
        consumers[1].seek(0, 5)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def commit(i: int) -> None:
            barrier.wait()
            try:
                for _ in range(5):
                    consumers[i].commit()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=commit, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for h in handles:
            h.refresh()
        seen = {c.committed(0) for c in consumers}
        assert len(seen) == 1 and seen <= {3, 5}  # both agree on the last commit
    finally:
        for h in handles:
            h.close()


def test_a_snapshot_read_while_another_thread_compacts_and_collects_in_a_loop(local_root: Root) -> None:
    clock = ManualClock()
    with local_root.open(clock=clock, partitions=2, inline_value_bytes=0, **FAST_GC) as store:
        _write_rounds(store, range(2))
        snap = store.snapshot()
        want_items = list(snap.scan())
        keys = [f"k{i}" for i in range(30)] + ["absent"]
        want_many = snap.get_many(keys)
        stop = threading.Event()
        errors: list[BaseException] = []
        collected = [0]
        churned = threading.Event()

        def churn() -> None:
            try:
                r = 2
                while not stop.is_set():
                    _write_rounds(store, range(r, r + 1))
                    store.compact(force=True)
                    clock.advance(5_000)
                    collected[0] += store.gc()["replaced"]
                    r += 1
                    if r == 5:
                        churned.set()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        worker = threading.Thread(target=churn)
        worker.start()
        try:
            while not churned.is_set() and not errors:  # three rounds of compaction and GC at least
                assert list(snap.scan()) == want_items
                assert snap.get_many(keys) == want_many
                assert snap.get("k3") == want_many[3]
        finally:
            stop.set()
            worker.join()
        assert not errors
        assert collected[0] == 0  # a pin keeps every file replaced after it
        snap.close()
        clock.advance(5_000)
        assert store.gc()["replaced"] > 0
        live = {e.path for _f, e in store.log.snapshot(lambda r: list(r.iter_files()))}
        assert {i.name for i in store.log.storage.list("data/")} == live  # the pin held no more


def test_a_snapshot_dropped_unclosed_during_a_scan_keeps_its_files_until_the_scan_ends(local_root: Root) -> None:
    clock = ManualClock()
    with local_root.open(clock=clock, partitions=2, inline_value_bytes=0, **FAST_GC) as store:
        _write_rounds(store, range(2))
        want = list(store.snapshot().scan())
        gc.collect()
        assert store.log.pins.held() == 0
        scan = store.snapshot().scan()  # the snapshot itself is dropped at once
        first = next(scan)
        _write_rounds(store, range(2, 4))
        store.compact(force=True)
        clock.advance(5_000)
        store.gc()
        gc.collect()
        assert [first, *scan] == want
        del scan
        gc.collect()
        assert store.log.pins.held() == 0


def test_openers_of_one_checkpoint_at_once_all_read_it_whole(tmp_path: Path) -> None:
    """Handles opening one checkpoint with one cache at the same instant: one loads its cache,
    the others wait and reuse it; none empties it under another's reads."""
    for attempt in range(8):
        root, cache = tmp_path / f"root{attempt}", tmp_path / f"cache{attempt}"
        with kvlog.open(root, cache_dir=cache, partitions=2, **FAST_GC) as store:
            _write_rounds(store, range(2), keys=300)
            store.checkpoint("cp")
            want = list(store.scan())
        barrier = threading.Barrier(4)
        results: list[object] = []

        def read(root: Path = root, cache: Path = cache, barrier: threading.Barrier = barrier,
                 results: list[object] = results, want: list[tuple[bytes, bytes]] = want) -> None:
            barrier.wait()
            try:
                with kvlog.open(root, cache_dir=cache, read_only=True, checkpoint="cp") as old:
                    results.append(list(old.scan()) == want)
            except BaseException as e:  # noqa: BLE001 - reported below
                results.append(e)
        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [True] * 4, (attempt, results)
