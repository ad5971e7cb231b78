"""The Kafka source's read options: ``startingOffsetsByTimestamp``, ``endingOffsetsByTimestamp``, ``minPartitions``.

One store for the module, written through a clock the test steps by hand, backwards too
(record timestamps need not grow with offsets), over 4 partitions and many batches, the
older half compacted (offsets with gaps, batches with offset bitmaps). Every read is
compared with a computation over the store's records in Python (``changes()``): a time
resolves, per partition, to the offset of the first record in offset order whose
timestamp is at or after it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import kvlog
from kvlog.errors import ConfigError
from kvlog.log import LiveBatch
from spark_ext.by_timestamp import batch_reader, first_offset_at
from spark_ext.read_options import MAX_MIN_PARTITIONS, parse_read_options
from spark_ext.splits import allocate, records_in, slice_partition
from spark_ext.stream_options import StreamReadOptions
from spark_ext.stream_reader import KvlogStreamReader

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000
COLUMNS = ["partition", "offset", "timestamp", "key", "value"]
#: (partition, offset, timestamp, key, value), as ``kv.log_rows`` gives them.
Row = tuple[int, int, int, bytes, "bytes | None"]


class SteppedClock:
    """A clock set by hand to any time, earlier ones too (a writer's clock that steps back)."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms
        self._ticks = 0

    def now_ms(self) -> int:
        return self.now

    def now_ns(self) -> int:
        return self.now * 1_000_000

    def monotonic_s(self) -> float:
        self._ticks += 1
        return self._ticks / 1000


@pytest.fixture(scope="module")
def store(kv: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Row]]]:
    """(the store's path, its records): 160 writes compacted, then 80 more; each write 1 s after
    the one before, every 7th one 5 s before (so timestamps step back within a partition)."""
    path = str(tmp_path_factory.mktemp("kafka-options") / "store")
    clock, rng = SteppedClock(T0), random.Random(17)
    with kv.open_store(path, clock=clock) as s:
        for i in range(240):
            clock.now = T0 + i * 1000 - (30_000 if i % 7 == 6 else 0)
            key = b"key-%02d" % rng.randrange(40)
            if i % 9 == 8:
                s.delete(key)
            else:
                s.put(key, b"value-%d" % i)
            if i % 13 == 12:
                s.flush()
            if i == 159:
                s.flush()
                s.compact(force=True)
        s.flush()
        rows = kv.log_rows(s)
        assert any(b.present is not None for b in kv.live_batches(s)), "compaction left offsets with gaps"
    yield path, rows


def first_at(rows: list[Row], partition: int, time_ms: int) -> int | None:
    """The offset of ``partition``'s first record (offset order) at or after ``time_ms``, if any."""
    return next((o for p, o, t, *_ in rows if p == partition and t >= time_ms), None)


def starting_at(rows: list[Row], times: dict[int, int]) -> list[Row]:
    """The records a start by ``times`` reads (a partition not named starts at its first record)."""
    def keep(p: int, o: int) -> bool:
        if p not in times:
            return True
        first = first_at(rows, p, times[p])
        return first is not None and o >= first

    return sorted(r for r in rows if keep(r[0], r[1]))


def ending_at(rows: list[Row], times: dict[int, int]) -> list[Row]:
    """The records an end by ``times`` reads: those before the first at or after the time
    (exclusive; a partition not named, or without such a record, is read to its end)."""
    def keep(p: int, o: int) -> bool:
        first = first_at(rows, p, times[p]) if p in times else None
        return first is None or o < first

    return sorted(r for r in rows if keep(r[0], r[1]))


def as_json(times: dict[int, int]) -> str:
    return json.dumps({str(p): t for p, t in times.items()})


def read(spark: Any, path: str, **options: str) -> Any:
    r = spark.read.format("kvlog")
    for name, value in options.items():
        r = r.option(name, value)
    return r.load(path)


def rows_of(kv: Any, df: Any) -> list[Row]:
    return sorted(kv.table_rows(df.toArrow(), COLUMNS))


def test_times_resolve_to_the_first_record_at_or_after_them(spark: Any, kv: Any,
                                                            store: tuple[str, list[Row]]) -> None:
    path, rows = store
    stamps = {p: [t for q, _o, t, *_ in rows if q == p] for p in range(4)}
    # A time met first by a record that older records follow (the clock stepped back): they are read.
    stepped = next(t for t in range(T0, T0 + 240_000, 1000)
                   if any(r[2] < t for r in starting_at(rows, {2: t}) if r[0] == 2))
    assert first_at(rows, 2, stepped) is not None
    exact = stamps[1][len(stamps[1]) // 2]  # a record's own timestamp: at or after includes it

    # Partition 0 before every record, 1 at a record's time, 2 in the middle, 3 after every
    # record (nothing to read yet). (A partition the JSON does not name: below.)
    start = {0: T0 - 60_000, 1: exact, 2: stepped, 3: max(stamps[3]) + 1}
    assert rows_of(kv, read(spark, path, startingOffsetsByTimestamp=as_json(start))) == starting_at(rows, start)

    # Ending offsets are exclusive: the read stops just before the first record at or after the
    # time; a time after every record reads to the end, before every record reads nothing.
    end = {0: stepped, 1: T0 - 60_000, 2: exact + 1, 3: max(stamps[3]) + 1}
    got = rows_of(kv, read(spark, path, endingOffsetsByTimestamp=as_json(end)))
    assert got == ending_at(rows, end)
    first = first_at(rows, 0, stepped)
    assert first is not None and first not in {o for p, o, *_ in got if p == 0}
    assert max(o for p, o, *_ in got if p == 0) == max(o for p, o, *_ in rows if p == 0 and o < first)
    assert not [r for r in got if r[0] == 1]

    # Both sides by time, and a time beside offsets (a start resolved past the ending offset
    # reads nothing from that partition); a partition not named starts at its first record and
    # ends at its end.
    both = read(spark, path, startingOffsetsByTimestamp=as_json({0: T0 + 50_000, 2: T0 + 20_000}),
                endingOffsetsByTimestamp=as_json({0: T0 + 200_000, 3: T0 + 90_000}))
    want = [r for r in starting_at(rows, {0: T0 + 50_000, 2: T0 + 20_000})
            if r in ending_at(rows, {0: T0 + 200_000, 3: T0 + 90_000})]
    assert rows_of(kv, both) == want
    late = first_at(rows, 1, T0 + 200_000)
    assert late is not None
    mixed = read(spark, path, startingOffsetsByTimestamp=as_json({1: T0 + 200_000, 2: T0 + 100_000}),
                 endingOffsets=json.dumps({"1": late - 1, "3": 6}))
    assert rows_of(kv, mixed) == [r for r in starting_at(rows, {1: T0 + 200_000, 2: T0 + 100_000})
                                  if r[0] != 1 and (r[0] != 3 or r[1] < 6)]


def test_a_time_reads_at_most_one_batch_per_partition(kv: Any, store: tuple[str, list[Row]]) -> None:
    """The catalog's least and greatest timestamps of each batch skip every batch but the one
    whose timestamps straddle the time (checked here for every record's time, and the next ms)."""
    path, rows = store
    with kvlog.open(path, read_only=True) as s:
        batches = kv.live_batches(s)
        storage = s.log.storage
        decoded: list[LiveBatch] = []
        inner = batch_reader(storage)

        def counting(b: LiveBatch) -> pa.RecordBatch:
            decoded.append(b)
            return inner(b)

        for p in range(4):
            mine = [b for b in batches if b.partition == p]
            times = sorted({t for q, _o, t, *_ in rows if q == p})
            for time_ms in [T0 - 1, *times, *(t + 1 for t in times)]:
                decoded.clear()
                first = first_at(rows, p, time_ms)
                assert first_offset_at(mine, time_ms, -7, counting) == (-7 if first is None else first)
                assert len(decoded) <= 1, (p, time_ms, decoded)


def test_min_partitions_splits_the_read_not_its_rows(spark: Any, kv: Any, store: tuple[str, list[Row]]) -> None:
    path, rows = store
    plain = read(spark, path)
    assert plain.rdd.getNumPartitions() < 12  # one per data file: the store has 8
    assert rows_of(kv, plain) == sorted(rows)
    split = read(spark, path, minPartitions="12")
    assert split.rdd.getNumPartitions() >= 12
    assert rows_of(kv, split) == sorted(rows)
    # With offsets by time and pushed filters, the same rows as without minPartitions.
    options = {"startingOffsetsByTimestamp": as_json({0: T0 + 30_000}), "endingOffsets": json.dumps({"2": 40})}
    narrowed = read(spark, path, minPartitions="12", **options).where("offset >= 3 AND partition != 3")
    assert narrowed.rdd.getNumPartitions() >= 12
    assert rows_of(kv, narrowed) == [r for r in starting_at(rows, {0: T0 + 30_000})
                                     if (r[0] != 2 or r[1] < 40) and r[1] >= 3 and r[0] != 3]
    # View latest: more key-hash shares, the same keys.
    latest = read(spark, path, view="latest", minPartitions="6")
    assert latest.rdd.getNumPartitions() >= 6
    with kvlog.open(path, read_only=True) as s:
        state = dict(s.items())
    assert {bytes(r["key"]): bytes(r["value"]) for r in latest.collect()} == state


def test_the_stream_starts_by_time_and_splits_each_micro_batch(spark: Any, kv: Any, store: tuple[str, list[Row]],
                                                               tmp_path: Path) -> None:
    path, rows = store
    times = {0: T0 + 150_000, 1: T0 + 300_000, 3: T0 + 60_000}  # 1: after every record; 2: from its first
    reader = KvlogStreamReader(StreamReadOptions.parse({"path": path, "startingOffsetsByTimestamp": as_json(times)}))
    with kvlog.open(path, read_only=True) as s:
        ends = s.log.end_offsets()
    want_start = {str(p): (first_at(rows, p, times[p]) if p in times else 0) for p in range(4)}
    assert reader.initialOffset() == {p: ends[int(p)] if o is None else o for p, o in want_start.items()}

    seen: list[Row] = []
    splits: list[tuple[int, int]] = []

    def each(batch: Any, _batch_id: int) -> None:
        table = batch.toArrow()
        splits.append((batch.rdd.getNumPartitions(), table.num_rows))
        seen.extend(kv.table_rows(table, COLUMNS))

    query = (spark.readStream.format("kvlog").option("startingOffsetsByTimestamp", as_json(times))
             .option("minPartitions", "5").option("maxRecordsPerTrigger", "60").load(path)
             .writeStream.foreachBatch(each).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert sorted(seen) == starting_at(rows, times)
    assert len(splits) >= 2 and all(tasks >= 5 for tasks, count in splits if count >= 5), splits


def test_bad_values_are_refused_before_any_job_runs(spark: Any, kv: Any, store: tuple[str, list[Row]],
                                                    tmp_path: Path) -> None:
    path, _rows = store
    start, end = "startingOffsetsByTimestamp", "endingOffsetsByTimestamp"
    bad: list[tuple[dict[str, str], str]] = [
        ({start: "yesterday"}, r"startingOffsetsByTimestamp='yesterday' is not JSON: give an object of times"),
        ({end: "[1700000000000]"}, r"endingOffsetsByTimestamp='\[1700000000000\]': give a JSON object of times"),
        ({start: "1700000000000"}, r"give a JSON object of times per partition"),
        ({start: "{}"}, r"names no partition"),
        ({start: '{"x": 1}'}, r"startingOffsetsByTimestamp: 'x' is not a partition number, as in"),
        ({start: '{"orders": {"0": 1}}'}, r"'orders' is not a partition number \(kvlog's JSON is keyed by partition "
                                          r"alone: a store has no topics\)"),
        ({start: '{"-1": 1}'}, r"partition -1 does not exist \(partitions count from 0\)"),
        ({start: '{"0": 1, "00": 2}'}, r"partition 0 is given twice"),
        ({start: '{"0": -5}'}, r"partition 0: -5 is not a time \(an integer of milliseconds since the epoch"),
        ({start: '{"0": 1.5e12}'}, r"partition 0: 1500000000000.0 is not a time"),
        ({end: '{"0": true}'}, r"partition 0: true is not a time"),
        ({start: '{"0": "1700000000000"}'}, r'partition 0: "1700000000000" is not a time'),
        ({start: '{"0": null}'}, r"partition 0: null is not a time"),
        ({start: '{"0": 9223372036854775808}'}, r"is not a time .*from 0 to 9223372036854775807"),
        ({start: '{"1": 20, "2": 5}', end: '{"1": 10}'}, r"partition 1: startingOffsetsByTimestamp 20 is after "
                                                        r"endingOffsetsByTimestamp 10: the read is empty"),
        ({start: '{"0": 1}', "startingOffsets": "earliest"}, r"startingOffsets and startingOffsetsByTimestamp both "
                                                             r"say where the read starts: give one of them"),
        ({end: '{"0": 1}', "endingOffsets": '{"0": 4}'}, r"endingOffsets and endingOffsetsByTimestamp both say "
                                                         r"where the read ends"),
        ({start: '{"0": 1}', "view": "latest"}, r"they apply to view=log only"),
        *[({"minPartitions": value}, rf"minPartitions='{value}': use a whole number from 1 to {MAX_MIN_PARTITIONS}")
          for value in ("0", "-3", "2.5", "two", "", "true", str(MAX_MIN_PARTITIONS + 1), "9" * 40)],
    ]
    # What .load() runs (parse_read_options, for batch reads and streams alike): every value.
    for options, message in bad:
        with pytest.raises(ConfigError, match=message):
            parse_read_options({"path": path, **{k.lower(): v for k, v in options.items()}})
    # Through Spark, at .load() (the stream's too), and no job ran; a partition the store does not
    # have needs the store, which .load() opens.
    status = spark.sparkContext.statusTracker()
    jobs_before = len(status.getJobIdsForGroup(None))
    through_spark = [bad[0], bad[8], bad[15], bad[-8],
                     ({end: '{"4": 1700000000000}'}, r"endingOffsetsByTimestamp: partition 4 does not exist: the "
                                                     r"store has 4 partitions \(0 to 3\)")]
    for options, message in through_spark:
        with pytest.raises(Exception, match=message):
            read(spark, path, **options)
    stream = spark.readStream.format("kvlog").option(start, '{"9": 1}')
    with pytest.raises(Exception, match=r"startingOffsetsByTimestamp: partition 9 does not exist"):
        stream.load(path)
    assert len(status.getJobIdsForGroup(None)) == jobs_before  # no job ran
    # A stream has no end: endingOffsetsByTimestamp passes .load() (a batch read takes it) and
    # fails the query before its first micro-batch.
    for name in ("endingOffsetsByTimestamp", "endingOffsets"):
        with pytest.raises(ConfigError, match=rf"{name} is an option of batch reads: a kvlog stream has no end"):
            StreamReadOptions.parse({"path": path, name: '{"0": 1}'})
    with pytest.raises(ConfigError, match="minPartitions='0'"):
        StreamReadOptions.parse({"path": path, "minPartitions": "0"})
    query = (spark.readStream.format("kvlog").option(end, '{"0": 1}').load(path)
             .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start(str(tmp_path / "out")))
    with pytest.raises(Exception, match="endingOffsetsByTimestamp is an option of batch reads"):
        query.awaitTermination()
    offsets = tmp_path / "ck" / "offsets"
    assert not offsets.exists() or not any(offsets.iterdir())


def test_slices_cover_every_record_once(kv: Any, store: tuple[str, list[Row]]) -> None:
    """:func:`slice_partition` over the store's real batches (bitmaps of compacted ones too):
    the slices hold every record of the range once, as many each as can be."""
    path, rows = store
    with kvlog.open(path, read_only=True) as s:
        batches = kv.live_batches(s)
    for p in range(4):
        mine = sorted((b for b in batches if b.partition == p), key=lambda b: b.base)
        offsets = [o for q, o, *_ in rows if q == p]
        for first, end in ((0, offsets[-1] + 1), (offsets[3], offsets[-5])):
            inside = [o for o in offsets if first <= o < end]
            for parts in (1, 2, 3, 7, len(inside), len(inside) + 5):
                slices = slice_partition(p, mine, first, end, parts)
                assert len(slices) == min(parts, len(inside))
                held = [[o for o in inside if piece.first <= o < piece.end] for piece in slices]
                assert [o for offsets_of_slice in held for o in offsets_of_slice] == inside
                assert max(map(len, held)) - min(map(len, held)) <= 1
                assert [sum(records_in(b, piece.first, piece.end) for b in piece.batches)
                        for piece in slices] == list(map(len, held))


def test_allocate_shares_slices_in_proportion() -> None:
    assert allocate({0: 30, 1: 10, 2: 0, 3: 60}, 10) == {0: 3, 1: 1, 3: 6}
    assert allocate({0: 100, 1: 1}, 4) == {0: 3, 1: 1}  # a partition with records gets one
    assert allocate({0: 2, 1: 1}, 8) == {0: 2, 1: 1}  # never more slices than records
    shares = allocate({0: 7, 1: 11, 2: 13, 3: 17}, 25)
    assert sum(shares.values()) == 25 and all(shares[p] <= n for p, n in {0: 7, 1: 11, 2: 13, 3: 17}.items())
