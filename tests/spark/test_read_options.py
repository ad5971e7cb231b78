"""Read options of the ``kvlog`` data source: checked when the read is analysed, offsets, time travel.

Every result is compared with what the store says without Spark (``changes()``, a
store opened at the checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kvlog

#: Each refused read costs a Python worker start on the driver (1-3 s on a busy 2-core machine).
pytestmark = [pytest.mark.spark, pytest.mark.slow]

LOG_COLUMNS = ["partition", "offset", "timestamp", "key", "value"]


def reader(spark: Any, **options: str) -> Any:
    r = spark.read.format("kvlog")
    for name, value in options.items():
        r = r.option(name, value)
    return r


def log_rows(kv: Any, df: Any) -> list[tuple[Any, ...]]:
    return sorted(kv.table_rows(df.toArrow(), LOG_COLUMNS))


def build(kv: Any, path: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Write, checkpoint ``cp``, write more, compact and collect garbage: (rows at cp, rows now)."""
    with kv.open_store(path) as store:
        kv.fill(store, ops=300, keys=40, seed=11)
        at_cp = kv.log_rows(store)
        store.checkpoint("cp")
        kv.fill(store, ops=300, keys=40, seed=12)
        store.compact(force=True)
        store.gc()
        now = kv.log_rows(store)
    return at_cp, now


def test_unknown_options_are_refused_when_the_read_is_analysed(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=50, keys=10, seed=1)
    # .load() analyses the read: no action (collect, count) is needed for the error.
    with pytest.raises(Exception, match=r"unknown option 'veiw' of the kvlog data source \(did you mean 'view'\?\)"
                                        r"; the known options are: cache_dir, checkpoint, endingOffsets"):
        reader(spark, veiw="latest").load(path)
    with pytest.raises(Exception, match=r"unknown option 'versionasof' .*named checkpoint: "
                                        r"\.option\('checkpoint', name\)"):
        reader(spark, versionAsOf="3").load(path)
    with pytest.raises(Exception, match=r"unknown option 'colour' of the kvlog data source; the known"):
        reader(spark, colour="red").load(path)
    # A streaming read's option passes .load() (which cannot tell a batch from a stream) and is
    # refused when the batch read is planned.
    stream_only = reader(spark, maxRecordsPerTrigger="5").load(path)
    with pytest.raises(Exception, match=r"unknown option 'maxrecordspertrigger' of the kvlog data source"):
        stream_only.collect()
    with pytest.raises(Exception, match=r"internal='yes': use 'true' or 'false'"):
        reader(spark, internal="yes").load(path)
    # Names are case-insensitive (Spark lower-cases them); storage.* options are known.
    df = reader(spark, VIEW="latest", Cache_Dir=str(tmp_path / "cache")).load(path)
    assert df.columns[:2] == ["key", "value"]
    with pytest.raises(Exception, match=r"storage_options \['region'\] do not apply to the local store"):
        reader(spark, **{"storage.region": "x"}).load(path).collect()


def test_a_users_schema_is_refused_before_any_task_runs(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=50, keys=10, seed=2)
        want = kv.log_rows(store)
    df = reader(spark).schema("key string, value string").load(path)
    status = spark.sparkContext.statusTracker()
    jobs_before = len(status.getJobIdsForGroup(None))
    with pytest.raises(Exception, match=r"the kvlog data source does not take a schema: view=log has the columns "
                                        r"partition int, offset bigint, .*remove \.schema\(\.\.\.\) "
                                        r"\(got struct<key:string,value:string>\)"):
        df.collect()
    with pytest.raises(Exception, match="does not take a schema: view=latest"):
        reader(spark, view="latest").schema("key binary").load(path).collect()
    assert len(status.getJobIdsForGroup(None)) == jobs_before  # no job ran
    # The view's own schema is accepted; not one that differs in a name's case or a nullability.
    with pytest.raises(Exception, match="does not take a schema"):
        reader(spark).schema("PARTITION int, offset bigint, timestamp bigint, key binary, value binary, "
                             "is_tombstone boolean, expires_ms bigint").load(path).collect()
    with pytest.raises(Exception, match="does not take a schema"):
        reader(spark).schema("partition int not null, offset bigint, timestamp bigint, key binary, "
                             "value binary, is_tombstone boolean, expires_ms bigint").load(path).collect()
    same = reader(spark).schema("partition int, offset bigint, timestamp bigint, key binary, "
                                "value binary, is_tombstone boolean, expires_ms bigint").load(path)
    assert log_rows(kv, same) == sorted(want)


def test_starting_and_ending_offsets(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=400, keys=60, seed=3, flush_every=23)
        everything = kv.log_rows(store)
    ends = {p: max(o for q, o, *_ in everything if q == p) + 1 for p in range(4)}

    def check(start: str | None, end: str | None, keep: Any) -> None:
        options = {k: v for k, v in (("startingOffsets", start), ("endingOffsets", end)) if v is not None}
        got = log_rows(kv, reader(spark, **options).load(path))
        assert got == [r for r in everything if keep(r[0], r[1])], options

    check("earliest", "latest", lambda p, o: True)
    check(json.dumps({"0": 10, "3": 5}), None, lambda p, o: o >= {0: 10, 3: 5}.get(p, 0))
    check(None, json.dumps({"1": 20}), lambda p, o: p != 1 or o < 20)  # ending offsets are exclusive
    check(json.dumps({"2": 7, "1": -2, "0": -1}), json.dumps({"2": 30, "3": -1}),
          lambda p, o: p != 0 and (p != 2 or 7 <= o < 30))
    check("latest", None, lambda p, o: False)
    check(json.dumps({"1": ends[1] - 3}), None, lambda p, o: p != 1 or o >= ends[1] - 3)
    # Refused when the read is analysed (.load()), with the reason.
    bad = [
        ({"startingOffsets": "{0: 1}"}, r"startingOffsets='\{0: 1\}' is neither 'earliest', 'latest' nor JSON"),
        ({"startingOffsets": "[1, 2]"}, r"give a JSON object of offsets per partition"),
        ({"endingOffsets": json.dumps({"4": 3})}, r"endingOffsets: partition 4 does not exist: the store has "
                                                  r"4 partitions \(0 to 3\)"),
        ({"startingOffsets": json.dumps({"1": 9}), "endingOffsets": json.dumps({"1": 4})},
         r"partition 1: startingOffsets 9 is after endingOffsets 4"),
        ({"startingOffsets": json.dumps({"1": -5})}, r"partition 1: -5 is not an offset"),
        ({"endingOffsets": "earliest"}, r"endingOffsets='earliest' reads nothing"),
        ({"endingOffsets": json.dumps({"2": -2})}, r"-2 \(earliest\) is not an ending offset"),
        ({"view": "latest", "startingOffsets": "earliest"}, r"they apply to view=log only; view=latest is each "
                                                           r"key's newest record"),
    ]
    for options, message in bad:
        with pytest.raises(Exception, match=message):
            reader(spark, **options).load(path)


def test_checkpoint_reads_the_store_as_it_was(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    at_cp, now = build(kv, path)
    assert at_cp != now
    with kvlog.open(path, read_only=True, checkpoint="cp") as old:
        latest_at_cp = {k: v for k, v in old.items()}
        files_of_cp = kv.live_files(old)  # data files, or inline files of commits (log/...)
    with kvlog.open(path, read_only=True) as store:
        files_at_cp = files_of_cp - kv.live_files(store)
    assert files_at_cp, "compaction and GC left the checkpoint's files only to the checkpoint"
    got = log_rows(kv, reader(spark, checkpoint="cp").load(path))
    assert got == sorted(at_cp)
    assert log_rows(kv, reader(spark).load(path)) == sorted(now)
    latest = reader(spark, view="latest", checkpoint="cp").load(path).collect()
    assert {bytes(r["key"]): bytes(r["value"]) for r in latest} == latest_at_cp
    # Offsets apply to the checkpoint's log.
    part = reader(spark, checkpoint="cp", startingOffsets=json.dumps({"2": 5})).load(path)
    assert log_rows(kv, part) == sorted(r for r in at_cp if r[0] != 2 or r[1] >= 5)
    with pytest.raises(Exception, match=r"CheckpointNotFoundError: no checkpoint named 'nope'"):
        reader(spark, checkpoint="nope").load(path)
    with pytest.raises(Exception, match=r"CheckpointNotFoundError: no checkpoint named 'nope'"):
        reader(spark, checkpoint="nope", view="latest").load(path)
