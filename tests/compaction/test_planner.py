"""The planner, pure: eligibility (Kafka's rules and kvlog's additions), dirty ranges, merges."""

from __future__ import annotations

import dataclasses

import pytest

from kvlog import StoreConfig
from kvlog.compaction.planner import BatchInfo, FileInfo, Plan, partition_state, plan_compaction

NOW = 1_700_000_000_000
OLD = NOW - 10_000_000


def config(**settings: object) -> StoreConfig:
    # No merges unless a test asks for them.
    return StoreConfig.from_settings(None, **{"l0_merge_files": 1000, **settings})


def batch(partition: int, file_id: str, base: int, last: int, data_bytes: int = 100, *,
          min_ts: int = OLD, max_ts: int | None = None, horizon: int | None = None) -> BatchInfo:
    return BatchInfo(partition, file_id, base, last, data_bytes, min_ts,
                     min_ts if max_ts is None else max_ts, horizon)


def l0(file_id: str, version: int, level: int = 0) -> FileInfo:
    return FileInfo(file_id, level, 1000, (version, 0))


def plan(batches: list[BatchInfo], cfg: StoreConfig, *, checkpoints: dict[int, int] | None = None,
         files: list[FileInfo] | None = None, now: int = NOW, force: bool = False,
         skip: tuple[int, ...] = ()) -> Plan | None:
    ends: dict[int, int] = {}
    for b in batches:
        ends[b.partition] = max(ends.get(b.partition, 0), b.last + 1)
    if files is None:
        ids = sorted({b.file_id for b in batches})
        files = [l0(f, i + 1) for i, f in enumerate(ids)]
    return plan_compaction(files, batches, checkpoints or {}, ends, cfg, now, force=force,
                           skip_partitions=skip)


# -- dirty ratio ----------------------------------------------------------------------------------

def test_dirty_ratio_exactly_at_the_threshold_is_not_eligible() -> None:
    batches = [batch(0, "f1", 0, 9, 100), batch(0, "f2", 10, 19, 100)]
    assert plan(batches, config(), checkpoints={0: 10}) is None  # 100 / 200 == 0.5


def test_dirty_ratio_above_the_threshold_is_eligible() -> None:
    batches = [batch(0, "f1", 0, 9, 100), batch(0, "f2", 10, 19, 101)]
    found = plan(batches, config(), checkpoints={0: 10})
    assert found is not None and found.kind == "clean"
    spec = found.clean[0]
    assert (spec.first_dirty, spec.first_uncleanable, spec.reason) == (10, 20, "dirty_ratio")
    assert spec.dirty_ratio == pytest.approx(101 / 201)
    assert found.input_files == ("f1", "f2")
    assert found.output_level == 2


def test_a_ratio_of_zero_still_needs_dirty_bytes() -> None:
    batches = [batch(0, "f1", 0, 9, 100)]
    assert plan(batches, config(min_cleanable_dirty_ratio=0.0), checkpoints={0: 10}) is None
    assert plan(batches, config(min_cleanable_dirty_ratio=0.0), checkpoints={0: 9}) is not None


def test_dirtiest_partitions_only_are_cleaned_and_every_file_is_an_input() -> None:
    batches = [batch(0, "f1", 0, 9), batch(1, "f1", 0, 9), batch(1, "f2", 10, 19)]
    found = plan(batches, config(), checkpoints={0: 10, 1: 0})
    assert found is not None
    assert set(found.clean) == {1}
    assert found.input_files == ("f1", "f2")


# -- min.compaction.lag.ms ------------------------------------------------------------------------

def test_a_batch_whose_newest_record_is_exactly_the_lag_old_is_cleanable() -> None:
    lag = 60_000
    cfg = config(min_compaction_lag_ms=lag)
    batches = [batch(0, "f1", 0, 4, min_ts=OLD, max_ts=NOW - lag)]
    first_dirty, first_uncleanable, _clean, dirty, _ratio = partition_state(batches, 0, 5, cfg, NOW)
    assert (first_dirty, first_uncleanable, dirty) == (0, 5, 100)
    found = plan(batches, cfg)
    assert found is not None and found.clean[0].first_uncleanable == 5


def test_a_batch_whose_newest_record_is_one_ms_too_young_is_not() -> None:
    lag = 60_000
    cfg = config(min_compaction_lag_ms=lag)
    # The batch's oldest record is ancient: granularity is the batch, by its newest record.
    batches = [batch(0, "f1", 0, 4, min_ts=OLD, max_ts=NOW - lag + 1)]
    first_dirty, first_uncleanable, _clean, dirty, _ratio = partition_state(batches, 0, 5, cfg, NOW)
    assert (first_dirty, first_uncleanable, dirty) == (0, 0, 0)
    assert plan(batches, cfg) is None
    assert plan(batches, cfg, now=NOW + 1) is not None


def test_the_first_too_young_batch_ends_the_dirty_range() -> None:
    lag = 1_000
    cfg = config(min_compaction_lag_ms=lag)
    batches = [
        batch(0, "f1", 0, 4, max_ts=NOW - 5_000),
        batch(0, "f2", 5, 9, max_ts=NOW - 10),        # too young
        batch(0, "f3", 10, 14, max_ts=NOW - 5_000),   # old again, but after a young one
    ]
    _first_dirty, first_uncleanable, _clean, dirty, ratio = partition_state(batches, 0, 15, cfg, NOW)
    assert first_uncleanable == 5
    assert dirty == 100
    assert ratio == 1.0
    found = plan(batches, cfg)
    assert found is not None and found.clean[0].first_uncleanable == 5


# -- max.compaction.lag.ms ------------------------------------------------------------------------

def test_max_compaction_lag_is_a_strict_bound() -> None:
    lag = 3_600_000
    cfg = config(max_compaction_lag_ms=lag)
    # Mostly clean: the ratio alone would never make it eligible.
    batches = [batch(0, "f1", 0, 99, 10_000), batch(0, "f2", 100, 100, 10, min_ts=NOW - lag)]
    assert plan(batches, cfg, checkpoints={0: 100}) is None
    found = plan(batches, cfg, checkpoints={0: 100}, now=NOW + 1)
    assert found is not None
    assert found.clean[0].reason == "max_compaction_lag"
    assert (found.clean[0].first_dirty, found.clean[0].first_uncleanable) == (100, 101)


def test_max_compaction_lag_needs_cleanable_records() -> None:
    cfg = config(max_compaction_lag_ms=1_000, min_compaction_lag_ms=10_000)
    batches = [batch(0, "f1", 0, 99, 10_000), batch(0, "f2", 100, 100, 10, min_ts=NOW - 5_000)]
    assert plan(batches, cfg, checkpoints={0: 100}) is None


# -- tombstone horizon (kvlog: idle partitions too) -----------------------------------------------

def test_a_passed_tombstone_horizon_makes_an_idle_partition_eligible() -> None:
    batches = [batch(0, "f1", 0, 9, horizon=NOW)]
    assert partition_state(batches, 10, 10, config(), NOW)[3] == 0  # nothing dirty: idle
    found = plan(batches, config(), checkpoints={0: 10})
    assert found is not None and found.clean[0].reason == "tombstone_horizon"
    assert plan(batches, config(), checkpoints={0: 10}, now=NOW - 1) is None


# -- force ----------------------------------------------------------------------------------------

def test_force_cleans_every_partition_holding_records() -> None:
    batches = [batch(0, "f1", 0, 9), batch(2, "f1", 0, 3)]
    assert plan(batches, config(), checkpoints={0: 10, 2: 4}) is None
    found = plan(batches, config(), checkpoints={0: 10, 2: 4}, force=True)
    assert found is not None
    assert set(found.clean) == {0, 2}
    assert all(spec.reason == "forced" for spec in found.clean.values())
    assert plan([], config(), force=True) is None


# -- checkpoints ----------------------------------------------------------------------------------

def test_a_checkpoint_below_the_log_start_is_raised_to_it() -> None:
    batches = [batch(0, "f1", 40, 49)]
    first_dirty, first_uncleanable, clean, dirty, _ = partition_state(batches, 3, 50, config(), NOW)
    assert (first_dirty, first_uncleanable, clean, dirty) == (40, 50, 0, 100)


def test_a_checkpoint_beyond_the_log_end_re_cleans_from_the_start() -> None:
    batches = [batch(0, "f1", 40, 49)]
    first_dirty, first_uncleanable, _clean, dirty, _ = partition_state(batches, 99, 50, config(), NOW)
    assert (first_dirty, first_uncleanable, dirty) == (40, 50, 100)


def test_a_checkpoint_inside_a_batch_counts_the_batch_dirty() -> None:
    batches = [batch(0, "f1", 0, 9, 100), batch(0, "f2", 10, 19, 100)]
    first_dirty, _fu, clean, dirty, ratio = partition_state(batches, 15, 20, config(), NOW)
    assert (first_dirty, clean, dirty, ratio) == (15, 100, 100, 0.5)


# -- L0 merges ------------------------------------------------------------------------------------

def test_l0_merge_waits_for_l0_merge_files() -> None:
    cfg = config(l0_merge_files=4, min_cleanable_dirty_ratio=1.0)
    files = [l0("a", 1, level=2)] + [l0(f"f{i}", i + 1) for i in range(1, 4)]
    batches = [batch(0, f.file_id, i * 10, i * 10 + 9) for i, f in enumerate(files)]
    assert plan(batches, cfg, files=files) is None
    files.append(l0("f4", 5))
    batches.append(batch(0, "f4", 40, 49))
    found = plan(batches, cfg, files=files)
    assert found is not None
    assert (found.kind, found.output_level, dict(found.clean)) == ("merge", 1, {})
    assert found.input_files == ("f1", "f2", "f3", "f4")  # L0 only, in commit order


def test_a_run_holding_an_inline_file_due_to_move_is_merged_however_short() -> None:
    cfg = config(l0_merge_files=4, min_cleanable_dirty_ratio=1.0)
    files = [l0("a", 1, level=2), l0("f1", 2), l0("f2", 3)]
    batches = [batch(0, f.file_id, i * 10, i * 10 + 9) for i, f in enumerate(files)]
    assert plan(batches, cfg, files=files) is None
    files[2] = dataclasses.replace(files[2], inline_due=True)
    found = plan(batches, cfg, files=files)
    assert found is not None and found.kind == "merge"
    assert found.input_files == ("f1", "f2")  # the whole L0 run it belongs to, in commit order


def test_cleaning_comes_before_merging() -> None:
    cfg = config(l0_merge_files=2)
    files = [l0("f1", 1), l0("f2", 2)]
    batches = [batch(0, "f1", 0, 9), batch(0, "f2", 10, 19)]
    found = plan(batches, cfg, files=files)
    assert found is not None and found.kind == "clean"


# -- partitions that are failing ------------------------------------------------------------------

def test_skipped_partitions_are_never_cleaned_and_block_their_files() -> None:
    batches = [batch(0, "f1", 0, 9), batch(1, "f1", 0, 9), batch(1, "f2", 10, 19)]
    assert plan(batches, config(), skip=()) is not None
    # Partition 1 is failing: it holds part of every file, so no job may take any.
    assert plan(batches, config(), skip=(1,)) is None
    assert plan(batches, config(), skip=(1,), force=True) is None


def test_a_merge_skips_blocked_files_and_stays_a_contiguous_run() -> None:
    cfg = config(l0_merge_files=2, min_cleanable_dirty_ratio=1.0)
    files = [l0(f"f{i}", i) for i in range(1, 6)]
    # Partition 0 in every file; partition 1 (failing) only in f2.
    batches = [batch(0, f"f{i}", i * 10, i * 10 + 9) for i in range(1, 6)] + [batch(1, "f2", 0, 9)]
    found = plan(batches, cfg, files=files, skip=(1,))
    assert found is not None and found.kind == "merge"
    assert "f2" not in found.input_files
    # Partition 0's files must stay disjoint, ordered ranges: a merge of f1 with f3..f5
    # would jump over f2's range. The inputs are one contiguous run in commit order.
    orders = [int(f[1:]) for f in found.input_files]
    assert orders == list(range(orders[0], orders[0] + len(orders)))
    assert found.input_files == ("f3", "f4", "f5")


def test_plans_are_frozen_values() -> None:
    found = plan([batch(0, "f1", 0, 9)], config())
    assert found is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.kind = "merge"  # type: ignore[misc]
