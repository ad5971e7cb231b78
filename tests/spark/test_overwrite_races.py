"""``mode("overwrite")`` under attack: failed jobs, lost task attempts, concurrent writers."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import kvlog
from kvlog.format.commit import decode_commit
from kvlog.log.naming import commit_name

pytestmark = pytest.mark.spark


def _overwrite(df: Any, path: str) -> None:
    df.write.format("kvlog").mode("overwrite").save(path)


def _state(path: str) -> dict[bytes, bytes]:
    with kvlog.open(path, read_only=True) as store:
        assert store.check() == []
        return dict(store.scan())


def _rows(prefix: str, n: int) -> list[tuple[bytes, bytes]]:
    return [(f"{prefix}-{i:04d}".encode(), f"{prefix}-value-{i}".encode()) for i in range(n)]


@pytest.mark.slow
def test_a_failed_job_leaves_nothing(spark: Any, kv: Any, tmp_path: Path) -> None:
    """Task 0 writes its file; task 1 fails on both attempts: nothing is visible, and task 0's file,
    which this Spark does not hand to the writer's ``abort``, is an orphan that GC deletes."""
    from pyspark import TaskContext

    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=80, keys=30, seed=31)
        version, state, live = store.log.version, dict(store.scan()), kv.live_files(store)
    on_disk = kv.data_files_on_disk(path)
    data_dir = str(Path(path) / "data")
    before = len(on_disk)

    def fail_task_1(batches: Any) -> Any:
        context = TaskContext.get()
        yield from batches
        if context.partitionId() == 1:
            deadline = time.monotonic() + 10  # until task 0's file is there
            while time.monotonic() < deadline and sum(1 for _ in Path(data_dir).rglob("*.arrow")) <= before:
                time.sleep(0.05)
            time.sleep(0.5)
            raise RuntimeError("injected failure of task 1")

    df = spark.createDataFrame(_rows("new", 40), "key binary, value binary").repartition(2)
    with pytest.raises(Exception, match="injected failure"):
        _overwrite(df.mapInArrow(fail_task_1, df.schema), path)
    with kvlog.open(path, read_only=True) as store:
        assert store.log.version == version and dict(store.scan()) == state
        assert kv.live_files(store) == live
    with kvlog.open(path, background_compaction=False, file_delete_delay_ms=1000) as store:
        _collect_orphans(store)
        assert dict(store.scan()) == {**state, b"later": b"x"} and store.check() == []
        _assert_only_live_files_stored(kv, path, store)


def _assert_only_live_files_stored(kv: Any, path: str, store: kvlog.Store) -> None:
    """Every data file under the root is live, and every live file is stored: a data file, or
    the inline file of a commit (named by the commit)."""
    live = kv.live_files(store)
    assert kv.data_files_on_disk(path) == {p for p in live if p.startswith("data/")}
    inline = live - kv.data_files_on_disk(path)
    assert all(p.startswith("log/") and (Path(path) / p).is_file() for p in inline), inline


def _collect_orphans(store: kvlog.Store) -> dict[str, int]:
    """GC once the orphans are older than the (minimal, 1 s) delay by the clock and by a later commit."""
    time.sleep(1.1)
    store.put("later", "x", sync=True)
    return store.gc()


def test_a_lost_task_attempt_is_never_live_and_gc_collects_it(spark: Any, kv: Any, tmp_path: Path) -> None:
    """A task attempt whose file was written but whose result never reached the driver."""
    from spark_ext.writer import KvlogWriter

    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        store.put("old", "x", sync=True)
    rows = _rows("k", 50)
    schema = "key binary, value binary"
    df = spark.createDataFrame(rows, schema).repartition(2)
    # The lost attempt: the writer's own task code, run outside Spark, its message dropped.
    lost = KvlogWriter({"path": path}, df.schema, overwrite=True)
    lost.write(iter([pa.RecordBatch.from_pylist([{"key": k, "value": b"lost"} for k, _v in rows])]))
    stray = kv.data_files_on_disk(path)
    _overwrite(df, path)
    assert _state(path) == dict(rows)
    with kvlog.open(path, background_compaction=False, file_delete_delay_ms=1000) as store:
        orphans = stray - kv.live_files(store)
        assert orphans, "the lost attempt wrote no file"
        assert _collect_orphans(store)["orphans"] >= len(orphans)
        _assert_only_live_files_stored(kv, path, store)
    assert _state(path) == {**dict(rows), b"later": b"x"}


def test_two_overwrites_at_once(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=60, keys=30, seed=32)
        version = store.log.version
    frames = {name: _rows(name, 30 + 10 * i) for i, name in enumerate(("left", "right"))}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            _overwrite(spark.createDataFrame(frames[name], "key binary, value binary").repartition(2), path)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(name,)) for name in frames]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    final = _state(path)
    assert final in (dict(frames["left"]), dict(frames["right"]))
    with kvlog.open(path, read_only=True) as store:
        assert store.log.version == version + 2
        replayed: dict[bytes, bytes | None] = {}
        for record in store.changes():
            replayed[record.key] = record.value
    assert {k: v for k, v in replayed.items() if v is not None} == final


def test_overwrite_while_a_local_process_writes(spark: Any, kv: Any, tmp_path: Path) -> None:
    """A put that lands between the overwrite's planning and its commit is tombstoned or kept, never lost."""
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=60, keys=30, seed=33)
        start = store.log.version
    rows = _rows("df", 40)
    stop = threading.Event()
    written: list[bytes] = []

    def local_writer() -> None:
        with kvlog.open(path, background_compaction=False) as store:
            seen = kv.data_files_on_disk(path)
            i = 0
            while not stop.is_set():
                now = kv.data_files_on_disk(path)
                if now - seen and i < 4:  # the task files, the first tombstone files: put at once
                    seen = now
                    key = f"local-{i:04d}".encode()
                    store.put(key, b"local", sync=True)
                    written.append(key)
                    i += 1
                time.sleep(0.001)

    thread = threading.Thread(target=local_writer)
    thread.start()
    try:
        _overwrite(spark.createDataFrame(rows, "key binary, value binary").repartition(2), path)
    finally:
        stop.set()
        thread.join()
    with kvlog.open(path, read_only=True) as store:
        final = dict(store.scan())
        end = store.log.version
        history = [decode_commit(commit_name(v), (Path(path) / commit_name(v)).read_bytes())
                   for v in range(start + 1, end + 1)]
        overwrite_at = [c.version for c in history if "spark_overwrite" in c.info]
        assert len(overwrite_at) == 1
        records = {}
        for record in store.changes():
            records.setdefault(record.key, []).append(record.value)
    assert written, "the local writer never wrote"
    # Every key of the DataFrame holds its value; a local key survives exactly when its put
    # committed after the overwrite, else the overwrite's commit holds its tombstone.
    assert {k: final[k] for k, _v in rows} == dict(rows)
    survivors = {k for k in written if k in final}
    assert set(final) == set(dict(rows)) | survivors
    for key in written:
        assert records[key] == ([b"local"] if key in survivors else [b"local", None])
    # Each put is one commit: the ones before the overwrite's commit are exactly the tombstoned ones.
    puts_before = [c for c in history if c.version < overwrite_at[0] and c.kind == "append"]
    assert written[:len(puts_before)] == [k for k in written if k not in survivors]
