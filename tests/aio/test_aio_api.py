"""Every method of ``kvlog.aio.AsyncStore`` against the sync API on the same store: same answers,
same errors for bad input (nothing changed), and scans and changelogs that cross chunk borders."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import kvlog
import kvlog.aio
from kvlog.aio import CHUNK_ROWS, AsyncStore
from tests.aio.support import QUIET, run


def _open(path: Path, **kwargs: Any) -> kvlog.aio.Opening:
    return kvlog.aio.open(path, partitions=3, **{**QUIET, **kwargs})


def test_put_get_delete_contains_flush(tmp_path: Path) -> None:
    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            assert isinstance(store, AsyncStore) and isinstance(store.sync, kvlog.Store)
            await store.put(b"a", b"1")
            await store.put("b", "2", sync=True)
            assert await store.get(b"a") == b"1" and await store.get("b") == b"2"
            assert await store.get(b"missing") is None
            assert await store.get(b"missing", b"dflt") == b"dflt"
            assert await store.contains(b"a") and not await store.contains(b"missing")
            assert not await store.contains(12) and not await store.contains(b"")  # as `in` does
            version = await store.flush()
            assert version == store.sync.log.version
            await store.delete(b"a")
            assert await store.get(b"a") is None
            await store.delete(b"never-there", sync=True)  # not an error, as in the sync API
            assert await store.refresh() == store.sync.log.version
        # Closed on exit, and everything was flushed: a new handle sees it.
        with kvlog.open(tmp_path / "s") as again:
            assert list(again.scan()) == [(b"b", b"2")]

    run(main())


def test_await_open_without_async_with(tmp_path: Path) -> None:
    async def main() -> None:
        store = await _open(tmp_path / "s")
        await store.put(b"k", b"v")
        assert not store.closed
        await store.close()
        assert store.closed
        await store.close()  # a second close is a no-op
        with pytest.raises(kvlog.StoreClosedError):
            await store.get(b"k")

    run(main())
    with kvlog.open(tmp_path / "s") as again:
        assert again.get(b"k") == b"v"


def test_wrapping_an_open_store_and_call(tmp_path: Path) -> None:
    sync = kvlog.open(tmp_path / "s", **QUIET)

    async def main() -> None:
        store = AsyncStore(sync, workers=2)
        loop_thread = threading.current_thread()

        def batch() -> str:
            with store.sync.batch() as b:
                b.put(b"x", b"1")
                b.put(b"y", b"2")
            return threading.current_thread().name

        name = await store.call(batch)
        assert name.startswith("kvlog-aio") and threading.current_thread() is loop_thread
        assert await store.get(b"y") == b"2"
        assert repr(store).startswith("AsyncStore(Store(")
        await store.close()

    run(main())
    assert sync.log.read_only is False
    with pytest.raises(kvlog.StoreClosedError):
        sync.get(b"x")  # the async store owns the sync one: closing one closed both


def test_get_many_is_the_sync_get_many(tmp_path: Path) -> None:
    """Needs ``Store.get_many``: the async call gives exactly what the sync one gives."""
    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            await store.put(b"a", b"1")
            await store.put(b"b", b"2")
            await store.flush()
            await store.put(b"c", b"3")  # unflushed: the memtable answers
            keys = [b"c", b"missing", "a", b"b", b"a"]
            assert await store.get_many(keys) == store.sync.get_many(keys) == [b"3", None, b"1", b"2", b"1"]
            assert await store.get_many([]) == []
            with pytest.raises(kvlog.InvalidRecordError):
                store.sync.get_many([b"a", b""])
            with pytest.raises(kvlog.InvalidRecordError):
                await store.get_many([b"a", b""])

    run(main())


def _fill(store: kvlog.Store, n: int) -> dict[bytes, bytes]:
    model = {b"k%06d" % i: b"v%d" % i for i in range(n)}
    for key, value in model.items():
        store.put(key, value)
    return model


@pytest.mark.parametrize("n", [0, 1, CHUNK_ROWS - 1, CHUNK_ROWS, CHUNK_ROWS + 1, 3 * CHUNK_ROWS + 7])
def test_scan_across_chunk_borders(tmp_path: Path, n: int) -> None:
    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            model = await store.call(_fill, store.sync, n)
            if n % 2:
                await store.flush()  # half the cases from the index, half from the memtable
            expected = sorted(model.items())
            assert [kv async for kv in store.scan()] == expected
            assert [kv async for kv in store.scan(reverse=True)] == expected[::-1]
            lo, hi = b"k%06d" % (n // 4), b"k%06d" % (3 * n // 4)
            assert [kv async for kv in store.scan(lo, hi)] == list(store.sync.scan(lo, hi))
            assert [kv async for kv in store.scan(prefix=b"k0000")] == list(store.sync.scan(prefix=b"k0000"))
            assert [kv async for kv in store.scan(prefix="zz")] == []

    run(main())


@pytest.mark.parametrize("n", [0, CHUNK_ROWS, 2 * CHUNK_ROWS + 1])
def test_changes_across_chunk_borders(tmp_path: Path, n: int) -> None:
    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            await store.call(_fill, store.sync, n)
            await store.delete(b"k000000")
            await store.flush()
            every = [r async for r in store.changes()]
            assert every == list(store.sync.changes())
            assert len(every) == n + 1
            for p in range(3):
                assert [r async for r in store.changes(p)] == list(store.sync.changes(p))
                assert [r async for r in store.changes(p, 5)] == list(store.sync.changes(p, 5))
            tombstones = [r for r in every if r.value is None]
            assert [r.key for r in tombstones] == [b"k000000"]

    run(main())


def test_compact_stats_check_gc(tmp_path: Path) -> None:
    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            for _ in range(3):
                await store.put(b"k", b"v")
                await store.flush()
            report = await store.compact(force=True)
            assert isinstance(report, kvlog.CompactionReport)
            stats = await store.stats()
            assert stats["read_only"] is False and stats["memtable_keys"] == 0
            assert await store.check() == []
            assert isinstance(await store.gc(), dict)
            assert [kv async for kv in store.scan()] == [(b"k", b"v")]

    run(main())


BAD_INPUT: list[tuple[str, tuple[Any, ...]]] = [
    ("put", (None, b"v")), ("put", (b"", b"v")), ("put", (12, b"v")), ("put", (b"x" * 5000, b"v")),
    ("put", (b"k", None)), ("put", (b"k", 12)), ("put", ("\ud800", b"v")),
    ("delete", (None,)), ("delete", (b"",)), ("delete", (b"x" * 5000,)),
    ("get", (None,)), ("get", (b"",)), ("get", (12,)),
]


@pytest.mark.parametrize(("method", "args"), BAD_INPUT, ids=[f"{m}-{i}" for i, (m, _a) in enumerate(BAD_INPUT)])
def test_bad_input_raises_the_sync_error_and_changes_nothing(tmp_path: Path, method: str,
                                                             args: tuple[Any, ...]) -> None:
    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            await store.put(b"keep", b"1", sync=True)
            version = store.sync.log.version
            with pytest.raises(kvlog.InvalidRecordError) as sync_error:
                getattr(store.sync, method)(*args)
            with pytest.raises(kvlog.InvalidRecordError) as async_error:
                await getattr(store, method)(*args)
            assert type(async_error.value) is type(sync_error.value)
            assert str(async_error.value) == str(sync_error.value)
            assert await store.flush() == version
            assert [kv async for kv in store.scan()] == [(b"keep", b"1")]

    run(main())


def test_bad_iterator_arguments(tmp_path: Path) -> None:
    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            with pytest.raises(kvlog.InvalidRecordError):
                [kv async for kv in store.scan(12)]  # type: ignore[arg-type]
            with pytest.raises(kvlog.InvalidRecordError):
                [kv async for kv in store.scan(prefix=3.5)]  # type: ignore[arg-type]
            with pytest.raises(kvlog.InvalidRecordError):
                [r async for r in store.changes(3)]
            with pytest.raises(kvlog.InvalidRecordError):
                [r async for r in store.changes(0, -1)]
            with pytest.raises(kvlog.InvalidRecordError):
                [r async for r in store.changes(-1, follow=True)]
            # The store still works after each refusal.
            await store.put(b"k", b"v")
            assert [kv async for kv in store.scan()] == [(b"k", b"v")]

    run(main())


def test_open_errors_are_the_sync_errors(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(kvlog.StoreNotFoundError):
            await kvlog.aio.open(tmp_path / "none", create=False)
        with pytest.raises(kvlog.ConfigError):
            await kvlog.aio.open(tmp_path / "s", flush_intervall_ms=5)
        with pytest.raises(kvlog.ConfigError):
            async with kvlog.aio.open(tmp_path / "s", workers=0):
                pass
        with pytest.raises(kvlog.ConfigError):
            await kvlog.aio.open(tmp_path / "s", workers=True)
        with kvlog.open(tmp_path / "t") as sync, pytest.raises(kvlog.ConfigError):
            AsyncStore(sync, workers=-1)  # refused: the caller keeps its store

    run(main())
    assert not (tmp_path / "none").exists()


def test_read_only(tmp_path: Path) -> None:
    with kvlog.open(tmp_path / "s") as writer:
        writer.put(b"k", b"v")

    async def main() -> None:
        async with kvlog.aio.open(tmp_path / "s", read_only=True, create=False) as store:
            assert await store.get(b"k") == b"v"
            with pytest.raises(kvlog.ReadOnlyError):
                await store.put(b"k", b"w")
            with pytest.raises(kvlog.ReadOnlyError):
                await store.delete(b"k")
            with pytest.raises(kvlog.ReadOnlyError):
                await store.compact()
            assert [kv async for kv in store.scan()] == [(b"k", b"v")]
            assert [r.key async for r in store.changes()] == [b"k"]

    run(main())


def test_calls_on_a_closed_store(tmp_path: Path) -> None:
    async def main() -> None:
        store = await _open(tmp_path / "s")
        await store.put(b"k", b"v")
        await store.close()
        for call in (store.put(b"k", b"w"), store.get(b"k"), store.delete(b"k"), store.flush(),
                     store.get_many([b"k"]), store.contains(b"k"), store.stats(), store.compact(),
                     store.refresh(), store.check(), store.gc(), store.call(lambda: None)):
            with pytest.raises(kvlog.StoreClosedError):
                await call
        with pytest.raises(kvlog.StoreClosedError):
            [kv async for kv in store.scan()]
        with pytest.raises(kvlog.StoreClosedError):
            [r async for r in store.changes(follow=True)]

    run(main())
    with kvlog.open(tmp_path / "s") as again:
        assert list(again.scan()) == [(b"k", b"v")]


def test_iterators_are_fetched_in_workers_a_chunk_at_a_time(tmp_path: Path) -> None:
    """The loop thread never advances the sync iterator: the store's scan is called, and its
    rows produced, only in worker threads, one hop per chunk."""
    threads: list[str] = []

    class Watched(kvlog.Store):
        def scan(self, *args: Any, **kwargs: Any) -> Any:
            for pair in super().scan(*args, **kwargs):
                threads.append(threading.current_thread().name)
                yield pair

    async def main() -> None:
        sync = kvlog.open(tmp_path / "s", **QUIET)
        sync.__class__ = Watched
        async with AsyncStore(sync, workers=1) as store:
            await store.call(_fill, sync, 2 * CHUNK_ROWS + 3)
            hops = 0
            async for _pair in store.scan():
                hops += 1
            assert hops == 2 * CHUNK_ROWS + 3

    run(main())
    assert len(threads) == 2 * CHUNK_ROWS + 3
    assert set(threads) == {"kvlog-aio_0"}


def test_many_tasks_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with _open(tmp_path / "s", workers=3) as store:
            async def writer(t: int) -> None:
                for i in range(200):
                    await store.put(b"t%d-%03d" % (t, i), b"%d" % i)

            await asyncio.gather(*(writer(t) for t in range(8)))
            await store.flush()
            pairs = [kv async for kv in store.scan()]
            assert len(pairs) == 1600
            got = await asyncio.gather(*(store.get(b"t%d-%03d" % (t, 199)) for t in range(8)))
            assert got == [b"199"] * 8

    run(main())


def test_put_with_a_time_to_live_expires_under_the_stores_clock(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()

    async def main() -> None:
        async with _open(tmp_path / "s", clock=clock) as store:
            await store.put(b"session", b"token", ttl_ms=1_000)
            assert await store.get(b"session") == b"token"
            clock.advance(1_000)
            assert await store.get(b"session") is None
            with pytest.raises(kvlog.InvalidRecordError):
                await store.put(b"bad", b"v", ttl_ms=0)
            assert await store.get(b"bad") is None

    run(main())


def test_puts_and_gets_memory_answers_run_on_the_loop_and_the_rest_in_workers(tmp_path: Path) -> None:
    """A plain put of bytes and a get memory answers (an unflushed write, an absent key, a value
    kept inline in the index) start no worker; a get of a value in a data file, a put with a
    time to live, a sync put and a put that fills the buffer go to a worker as before."""
    hops: list[str] = []

    async def main() -> None:
        sync = kvlog.open(tmp_path / "s", partitions=3, flush_bytes=4096, inline_value_bytes=8,
                          refresh_interval_ms=600_000, **{k: v for k, v in QUIET.items() if k != "flush_bytes"})
        async with AsyncStore(sync, workers=1) as store:
            real_job = store._job

            def counted(fn: Any, args: tuple[Any, ...]) -> Any:
                hops.append(getattr(fn, "__name__", repr(fn)))
                return real_job(fn, args)

            store._job = counted  # type: ignore[method-assign]
            await store.refresh()  # a read refreshes first after refresh_interval_ms: in a worker
            hops.clear()
            await store.put(b"small", b"v")  # buffered on the loop
            assert await store.get(b"small") == b"v"  # the memtable answers
            assert await store.get(b"absent", "d") == "d"  # the index says absent
            assert hops == []
            await store.flush()
            assert await store.get(b"small") == b"v"  # inline in the index (8 bytes at most)
            assert hops == ["flush"]
            await store.put(b"large", b"x" * 100)
            await store.flush()
            hops.clear()
            assert await store.get(b"large") == b"x" * 100  # in a data file: a worker reads it
            await store.put(b"t", b"v", ttl_ms=60_000)
            await store.put(b"s", b"v", sync=True)
            assert len(hops) == 3
            hops.clear()
            for i in range(200):  # past flush_bytes: the put that fills the buffer flushes in a worker
                await store.put(f"fill{i:03d}".encode(), b"y" * 64)
            assert hops and set(hops) == {"_after_put_trigger"}
            assert await store.get(b"fill199") == b"y" * 64

    run(main())


def test_an_async_consumer_reads_seeks_commits_and_reports_lag_as_the_sync_one(tmp_path: Path) -> None:
    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            for i in range(30):
                await store.put(f"k{i:02d}", "v")
            await store.flush()
            consumer = store.consumer("g")
            assert consumer.partitions == (0, 1, 2) and consumer.group == "g"
            assert sum((await consumer.lag()).values()) == 30 and not await consumer.caught_up()
            got = []
            while not await consumer.caught_up():
                got += await consumer.poll(timeout_s=0)
            assert sorted(r.key for r in got) == [f"k{i:02d}".encode() for i in range(30)]
            await consumer.commit()
            assert [await consumer.committed(p) for p in range(3)] == [await consumer.position(p) for p in range(3)]
            await consumer.seek_all({0: 0})
            assert await consumer.position(0) == 0
            await consumer.seek_to_end()
            assert await consumer.poll(timeout_s=0.01) == []
            with pytest.raises(kvlog.errors.InvalidRecordError):
                await consumer.poll(max_records=0)
            with pytest.raises(kvlog.errors.InvalidRecordError):
                await consumer.seek_all({7: 0})
            consumer.close()

    run(main())


def test_an_async_consumer_holds_tombstones_from_its_first_call_and_groups_are_listed_and_deleted(
        tmp_path: Path) -> None:
    """Creating the consumer commits nothing on the loop; its first call commits the hold, in a
    worker, before it reads. ``consumer_groups`` and ``delete_group`` are the sync ones."""

    async def main() -> None:
        async with _open(tmp_path / "s") as store:
            await store.put("a", "1")
            await store.flush()
            version = store.sync.log.version
            consumer = store.consumer("held", hold_tombstones=True)
            assert store.sync.log.version == version and await store.consumer_groups() == []
            assert [r.key for r in await consumer.poll(timeout_s=0)] == [b"a"]
            info, = await store.consumer_groups()
            assert info.name == "held" and info.holding and info.offsets == {0: 0, 1: 0, 2: 0}
            await store.delete_group("held")
            assert await store.consumer_groups() == []
            with pytest.raises(kvlog.GroupNotFoundError):
                await store.delete_group("held")
            with pytest.raises(kvlog.InvalidRecordError):
                store.consumer("g", hold_tombstones="yes")  # type: ignore[arg-type]

    run(main())


def test_an_async_poll_waits_on_the_loop_for_another_processes_commit_holding_no_worker(
        tmp_path: Path) -> None:
    """One worker, a follow interval of ten minutes: a poll waiting for records leaves the worker
    free for other calls, and another process's commit (the head's rename) wakes it."""
    import sys

    path = tmp_path / "s"
    with kvlog.open(path, **QUIET) as first:
        first.put(b"first", b"v", sync=True)  # a first commit: log/ is there to watch
    script = ("import sys, kvlog\n"
              "with kvlog.open(sys.argv[1], cache_dir=sys.argv[2]) as s:\n"
              "    s.put(b'from-another-process', b'v', sync=True)\n")

    async def main() -> None:
        sync = kvlog.open(path, follow_interval_ms=600_000, **QUIET)
        async with AsyncStore(sync, workers=1) as store:
            consumer = store.consumer("g")
            await consumer.seek_to_end()
            waiting = asyncio.ensure_future(consumer.poll(timeout_s=300))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            assert await store.call(lambda: "the worker is free") == "the worker is free"
            writer = await asyncio.create_subprocess_exec(sys.executable, "-c", script, str(path),
                                                          str(tmp_path / "writer-cache"))
            assert await writer.wait() == 0
            records = await asyncio.wait_for(waiting, 60)
            assert [r.key for r in records] == [b"from-another-process"]

    run(main())


def test_a_cancelled_async_poll_loses_no_record_and_closing_ends_a_wait(tmp_path: Path) -> None:
    import time as _time

    async def main() -> None:
        sync = kvlog.open(tmp_path / "s", **QUIET)
        async with AsyncStore(sync, workers=1) as store:
            for i in range(5):
                await store.put(f"k{i}", "v")
            await store.flush()
            consumer = store.consumer("g")
            real_poll = consumer.sync.poll

            def slow_poll(*args: Any, **kwargs: Any) -> Any:
                records = real_poll(*args, **kwargs)
                _time.sleep(0.3)  # the task is cancelled while the worker holds the records
                return records

            consumer.sync.poll = slow_poll  # type: ignore[method-assign]
            task = asyncio.ensure_future(consumer.poll(timeout_s=0))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            consumer.sync.poll = real_poll  # type: ignore[method-assign]
            await store.call(lambda: None)  # the cancelled read has finished: positions put back
            got = await consumer.poll(timeout_s=0)
            assert sorted(r.key for r in got) == [f"k{i}".encode() for i in range(5)]
            waiting = asyncio.ensure_future(store.consumer("h", partitions=[0]).poll(timeout_s=300))
            await store.consumer("h2").seek_to_end()
            await asyncio.sleep(0.05)
            await store.close()
            with pytest.raises(kvlog.errors.StoreClosedError):
                await asyncio.wait_for(waiting, 60)

    run(main())
