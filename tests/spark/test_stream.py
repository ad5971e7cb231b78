"""Structured Streaming with kvlog: the ``kvlog`` streaming source and its exactly-once sink.

The source's offsets and limits are checked by calling the reader as Spark does (no query
needed); the queries then run for real with the tests' session, and one is killed with
SIGKILL mid-stream in a driver of its own and restarted from its checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import kvlog
from kvlog.errors import ConfigError, InvalidRecordError
from kvlog.log import partition_for_key
from spark_ext.stream_options import StreamReadOptions, StreamWriteOptions
from spark_ext.stream_reader import KvlogStreamReader, share_limit
from spark_ext.stream_writer import make_stream_writer

pytestmark = pytest.mark.spark

WRITE_SCHEMA = "key binary, value binary, timestamp bigint"


def _reader(path: str, **options: str) -> KvlogStreamReader:
    return KvlogStreamReader(StreamReadOptions.parse({"path": path, **options}))


def _records(store: kvlog.Store) -> Counter[tuple[int, bytes, bytes | None, int]]:
    store.log.refresh()
    return Counter((r.partition, r.key, r.value, r.timestamp_ms) for r in store.changes())


def test_share_limit_is_proportional_and_exact() -> None:
    assert share_limit({0: 30, 1: 10, 2: 0, 3: 60}, 10) == {0: 3, 1: 1, 2: 0, 3: 6}
    assert share_limit({0: 1, 1: 1, 2: 1, 3: 1}, 2) == {0: 1, 1: 1, 2: 0, 3: 0}
    assert share_limit({0: 5, 1: 7}, 100) == {0: 5, 1: 7}
    assert sum(share_limit({0: 7, 1: 11, 2: 13, 3: 17}, 25).values()) == 25


def test_source_offsets_limits_gaps_and_available_now(kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=300, keys=40, seed=3)
        store.compact(force=True)  # superseded records go: the offsets have gaps
        survivors = kv.survivors_by_partition(store)
        ends = {p: store.log.end_offset(p) for p in range(4)}
        assert sum(map(len, survivors.values())) < sum(ends.values())
        reader = _reader(path, maxRecordsPerTrigger="25")
        assert reader.getDefaultReadLimit() == ReadMaxRows(25)
        assert _reader(path).getDefaultReadLimit() == ReadAllAvailable()
        assert reader.initialOffset() == {str(p): 0 for p in range(4)}
        assert _reader(path, startingOffsets="latest").initialOffset() == {str(p): e for p, e in ends.items()}
        assert _reader(path, startingOffsets='{"0": 10, "2": -1}').initialOffset() == {
            "0": 10, "1": 0, "2": ends[2], "3": 0}
        for bad, message in (('{"9": 0}', "partitions 0..3"), (f'{{"1": {ends[1] + 1}}}', "after its end")):
            with pytest.raises(ConfigError, match=message):
                _reader(path, startingOffsets=bad).initialOffset()
        # Triggers of at most 25 existing records, shared in proportion to the backlogs, until the end.
        start, seen = reader.initialOffset(), []
        while (end := reader.latestOffset(start, ReadMaxRows(25))) != start:
            counts = {p: sum(1 for o in survivors[p] if start[str(p)] <= o < end[str(p)]) for p in range(4)}
            backlog = {p: sum(1 for o in survivors[p] if o >= start[str(p)]) for p in range(4)}
            assert counts == share_limit(backlog, 25)
            for part in reader.partitions(start, end):
                seen += [(p, o) for batch in reader.read(part)
                         for p, o in zip(batch.column("partition").to_pylist(), batch.column("offset").to_pylist(),
                                         strict=True)]
            start = end
        assert start == {str(p): e for p, e in ends.items()}
        assert sorted(seen) == [(p, o) for p in range(4) for o in survivors[p]]
        assert reader.partitions(start, start) == []
        # A start offset compacted away resumes at the next surviving record.
        gap = next(o for o in range(ends[1]) if o not in survivors[1])
        first = next(o for o in survivors[1] if o > gap)
        begin = {"0": ends[0], "1": gap, "2": ends[2], "3": ends[3]}
        part = reader.partitions(begin, reader.latestOffset(begin, ReadMaxRows(1)))
        assert [b.column("offset").to_pylist() for b in reader.read(part[0])] == [[first]]
        # availableNow: the ends are those of the moment the query starts.
        reader.prepareForTriggerAvailableNow()
        kv.fill(store, ops=50, keys=40, seed=4)
        assert reader.latestOffset(begin, ReadAllAvailable()) == {str(p): e for p, e in ends.items()}
        assert reader.reportLatestOffset() == {str(p): store.log.end_offset(p) for p in range(4)}


def test_bad_options_are_refused_before_anything_runs(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=40, keys=10, seed=5)
    for options, message in (({"maxRecordsPerTriger": "5"}, "unknown option 'maxRecordsPerTriger' for the kvlog streaming "
                               "source \\(did you mean 'maxRecordsPerTrigger'\\?\\); the known options are: "
                               "cache_dir, maxRecordsPerTrigger, minPartitions, path, startingOffsets, "
                               "startingOffsetsByTimestamp, view, storage"),
                              ({"maxRecordsPerTrigger": "0"}, "maxRecordsPerTrigger='0'"),
                              ({"startingOffsets": "first"}, "startingOffsets='first'"),
                              ({"view": "latest"}, "reads the log view")):
        with pytest.raises(ConfigError, match=message):
            StreamReadOptions.parse({"path": path, **options})
    with pytest.raises(ConfigError, match="needs .option\\('checkpointLocation'"):
        StreamWriteOptions.parse({"path": path})
    # Through Spark: an unknown option is refused when the stream is analysed (.load()), before
    # any query starts.
    with pytest.raises(Exception, match="(?i)unknown option 'maxRecordsPerTriger'"):
        spark.readStream.format("kvlog").option("maxRecordsPerTriger", "5").load(path)
    # A value only the stream checks fails the query before its first micro-batch; nothing is written.
    out = tmp_path / "out"
    query = (spark.readStream.format("kvlog").option("maxRecordsPerTrigger", "0").load(path)
             .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ck1"))
             .trigger(availableNow=True).start(str(out)))
    with pytest.raises(Exception, match="maxRecordsPerTrigger='0'"):
        query.awaitTermination()
    assert not (tmp_path / "ck1" / "offsets").exists() or not any((tmp_path / "ck1" / "offsets").iterdir())
    sink = str(tmp_path / "sink")
    kv.open_store(sink).close()
    stream = spark.readStream.format("kvlog").load(path).select("key", "value", "timestamp")
    with pytest.raises(Exception, match="(?i)unknown option 'batchSize' for the kvlog streaming sink"):
        (stream.writeStream.format("kvlog").option("batchSize", "9").option("checkpointLocation", str(tmp_path / "ck2"))
         .trigger(availableNow=True).start(sink).awaitTermination())
    from pyspark.sql.types import _parse_datatype_string

    with pytest.raises(InvalidRecordError, match="unknown column 'offset'. Nothing was written"):
        make_stream_writer({"path": sink, "checkpointLocation": str(tmp_path / "ck3")},
                           _parse_datatype_string("key binary, value binary, offset bigint"))
    with kvlog.open(sink, read_only=True) as store:
        assert store.log.version == 0 and not list(store.changes())  # creating commits nothing


def test_source_query_restarts_from_its_checkpoint(spark: Any, kv: Any, tmp_path: Path) -> None:
    path, out, ck = str(tmp_path / "store"), str(tmp_path / "out"), str(tmp_path / "ck")
    with kv.open_store(path) as store:
        kv.fill(store, ops=150, keys=30, seed=6)

        def run() -> list[int]:
            query = (spark.readStream.format("kvlog").option("maxRecordsPerTrigger", "40").load(path)
                     .writeStream.format("parquet").option("checkpointLocation", ck)
                     .trigger(availableNow=True).start(out))
            query.awaitTermination()
            return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

        assert run() == [40, 40, 40, 30]
        kv.fill(store, ops=70, keys=30, seed=7)  # more records, then the same query again
        assert run() == [40, 30]
        rows = spark.read.parquet(out).select("partition", "offset", "key", "value").collect()
        got = Counter((r.partition, r.offset, bytes(r.key), None if r.value is None else bytes(r.value))
                      for r in rows)
        assert max(got.values()) == 1
        assert set(got) == {(r.partition, r.offset, r.key, r.value) for r in store.changes()}


def _task_files(writer: Any, rows: list[tuple[bytes, bytes | None, int]]) -> Any:
    batch = pa.record_batch([pa.array([r[0] for r in rows], pa.binary()), pa.array([r[1] for r in rows], pa.binary()),
                             pa.array([r[2] for r in rows], pa.int64())], names=["key", "value", "timestamp"])
    return writer.write(iter([batch]))


def test_sink_commits_each_micro_batch_once(spark: Any, kv: Any, tmp_path: Path) -> None:
    """A commit called again, a re-run micro-batch with new task files, an abort after the commit
    landed, and two drivers committing the same micro-batch at once."""
    from pyspark.sql.types import _parse_datatype_string

    path = str(tmp_path / "store")
    kv.open_store(path).close()
    schema = _parse_datatype_string(WRITE_SCHEMA)
    options = {"path": path, "checkpointLocation": str(tmp_path / "ck")}
    writer = make_stream_writer(options, schema)
    first = [(b"k%03d" % i, b"v%d" % i, 1000 + i) for i in range(60)]
    messages = [_task_files(writer, first[:30]), _task_files(writer, first[30:])]
    writer.commit(messages, 0)
    writer.commit(messages, 0)  # the same commit again: already landed
    writer.abort(messages, 0)  # an abort after it landed keeps its files
    with kvlog.open(path, read_only=True) as store:
        assert store.log.version == 1  # created (no commit), then micro-batch 0 in one commit
        assert _records(store) == Counter((partition_for_key(k, 4), k, v, t) for k, v, t in first)
        assert store.check() == []
        landed = kv.data_files_on_disk(path)
    # Micro-batch 0 re-run (new task files, other content), here by a new writer: nothing lands,
    # and the new files are deleted.
    again = make_stream_writer(options, schema)
    rerun = [_task_files(again, [(b"other", b"x", 5)])]
    again.commit(rerun, 0)
    assert kv.data_files_on_disk(path) == landed
    # Micro-batch 1 committed by two drivers at the same instant: it lands once.
    second = [(b"n%03d" % i, None if i % 5 == 0 else b"w%d" % i, 2000 + i) for i in range(40)]
    drivers = [make_stream_writer(options, schema) for _ in range(2)]
    batches = [[_task_files(d, second)] for d in drivers]
    errors: list[BaseException] = []

    def commit(n: int) -> None:
        try:
            drivers[n].commit(batches[n], 1)
        except BaseException as e:  # the test reports it below
            errors.append(e)

    threads = [threading.Thread(target=commit, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with kvlog.open(path, read_only=True) as store:
        assert store.log.version == 2
        assert _records(store) == Counter((partition_for_key(k, 4), k, v, t) for k, v, t in first + second)
        assert store.check() == []
    assert len(kv.data_files_on_disk(path)) == len(landed) + 1


def test_sink_query_copies_a_changelog_exactly(spark: Any, kv: Any, tmp_path: Path) -> None:
    source, sink, ck = str(tmp_path / "source"), str(tmp_path / "sink"), str(tmp_path / "ck")
    with kv.open_store(source) as store:
        kv.fill(store, ops=200, keys=40, seed=8)
        want = _records(store)
    kv.open_store(sink).close()

    def run() -> list[int]:
        query = (spark.readStream.format("kvlog").option("maxRecordsPerTrigger", "80").load(source)
                 .select("key", "value", "timestamp")
                 .writeStream.format("kvlog").option("checkpointLocation", ck).trigger(availableNow=True).start(sink))
        query.awaitTermination()
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    assert run() == [80, 80, 40]
    assert run() == []  # nothing new: nothing written
    with kvlog.open(sink, read_only=True) as store:
        assert store.log.version == 3  # created (no commit), then one commit per micro-batch
        assert _records(store) == want
        producer = StreamWriteOptions.parse({"path": sink, "checkpointLocation": ck}).producer_id
        assert store.log.snapshot(lambda r: r.get_producer(producer)).epoch == 3  # batch 2 + 1


@pytest.mark.slow
def test_a_killed_query_restarts_without_duplicates_or_losses(kv: Any, tmp_path: Path) -> None:
    """The driver is killed with SIGKILL (with its JVM) after some micro-batches landed; the
    same query restarted from its checkpoint finishes: the sink holds every record once."""
    source, sink, ck = tmp_path / "source", tmp_path / "sink", tmp_path / "ck"
    with kv.open_store(source) as store:
        kv.fill(store, ops=300, keys=80, seed=9, flush_every=50)
        want = _records(store)
    kv.open_store(sink).close()
    worktree = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(worktree), JDK_JAVA_OPTIONS=kv.FAST_JVM)
    command = [sys.executable, str(Path(__file__).with_name("stream_copy.py")), "local[2]", str(source), str(sink),
               str(ck), "75"]

    def commits() -> int:
        log = sink / "log"  # appears with the first commit: creating the store commits nothing
        return sum(1 for f in log.iterdir() if not f.name.endswith(".checkpoint.json")) if log.is_dir() else 0

    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while commits() < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()[1][-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    landed = commits()
    assert landed >= 2, landed  # 2 of the 4 micro-batches (75 records each)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert done.returncode == 0, done.stderr[-3000:]
    with kvlog.open(str(sink), read_only=True) as store:
        assert _records(store) == want
        assert store.check() == []
