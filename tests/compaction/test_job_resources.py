"""What a job allocates: a map sized to its dirty ranges, outputs built in a spill directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import kvlog.compaction.runner as runner_module
from kvlog.compaction.offset_map import SLOT_BYTES, OffsetMap, capacity_for

MiB = 2**20


def _fill(store: Any, keys: int, rounds: int) -> dict[bytes, bytes]:
    model = {}
    for r in range(rounds):
        for i in range(keys):
            key, value = f"k{i:05}".encode(), f"v{r}-{i}".encode()
            store.put(key, value)
            model[key] = value
        store.flush()
    return model


def test_the_map_is_sized_to_the_largest_dirty_range(tmp_path: Path, make_store: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real_map = OffsetMap

    def recording_map(map_bytes: int, load_factor: float = 0.9) -> OffsetMap:
        sizes.append(map_bytes)
        return real_map(map_bytes, load_factor)

    monkeypatch.setattr(runner_module, "OffsetMap", recording_map)
    store = make_store(tmp_path / "s", partitions=2, offset_map_bytes=128 * MiB)
    model = _fill(store, 300, 3)  # 900 records, at most 900 in one partition's dirty range
    report = store.compact(force=True)
    assert report.rounds == 1 and not report.partial
    assert len(sizes) == 1
    assert SLOT_BYTES * 2 <= sizes[0] <= SLOT_BYTES * (int(900 / 0.9) + 2)
    assert capacity_for(sizes[0], 0.9) >= max(report.records_read // 2, 1)
    # The report still names the configured capacity, what a pass may use.
    assert report.map_capacity == capacity_for(128 * MiB, 0.9)
    assert dict(store.scan()) == model
    assert store.check() == []


def test_a_small_configured_map_is_never_enlarged(tmp_path: Path, make_store: Any) -> None:
    store = make_store(tmp_path / "s", partitions=1, offset_map_bytes=64, offset_map_load_factor=0.5)
    model = _fill(store, 10, 2)
    report = store.compact(force=True)
    assert report.partial  # two keys a pass: the configured map, not one sized to 20 records
    for _ in range(10):  # ten keys, two a round
        store.compact(force=True)
    assert store.stats()["records"] == len(model)
    assert dict(store.scan()) == model
    assert store.check() == []


def test_outputs_are_built_in_a_spill_directory_that_the_job_removes(tmp_path: Path, make_store: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(tmp_path / "s", partitions=2)
    model = _fill(store, 200, 2)
    spill_root = store.log.env.path / runner_module.SPILL_DIR
    seen: list[Path] = []
    storage = store.log.storage
    real_put_file = storage.put_file

    def put_file(name: str, path: Path) -> None:
        if name.startswith("data/2/"):  # an output of the job, written from its spill file
            assert path.is_file() and spill_root in path.parents
            seen.append(path)
        real_put_file(name, path)

    monkeypatch.setattr(storage, "put_file", put_file)
    report = store.compact(force=True)
    assert report.files_out >= 1
    assert len(seen) == report.files_out
    assert not any(path.exists() for path in seen)  # moved into the store (a local store)
    assert list(spill_root.iterdir()) == []  # the job's directory is gone
    assert dict(store.scan()) == model
    assert store.check() == []


def test_spill_directories_of_crashed_jobs_go_once_a_day_old(tmp_path: Path, make_store: Any, clock: Any) -> None:
    store = make_store(tmp_path / "s", partitions=2)
    _fill(store, 50, 2)
    spill_root = store.log.env.path / runner_module.SPILL_DIR
    old, recent = spill_root / "old-job", spill_root / "recent-job"
    for directory in (old, recent):
        directory.mkdir(parents=True)
        (directory / "output-0.arrow").write_bytes(b"partial")
    day_and_a_bit = (runner_module.STALE_SPILL_MS + 60_000) / 1000
    stamp = clock.now_ms() / 1000 - day_and_a_bit
    os.utime(old, (stamp, stamp))
    store.compact(force=True)
    assert not old.exists()
    assert recent.exists()  # maybe a job of another process still running
