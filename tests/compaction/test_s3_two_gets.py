"""On a real S3 server (SeaweedFS), a job reads each input file with exactly two GETs.

Pass 1 reads a partition's dirty range through stream A of each input file,
pass 2 reads all of the partition through stream B; both only move forward, so
however many partitions a file holds, it costs two streaming GETs per job. The
count is taken from the storage's own request counter, not assumed. The job
then writes its outputs (PUTs) and one ``replace`` commit (a conditional swap of the head,
then the PUT of the commit's copy at its own name).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog import ManualClock

PARTITIONS = 4


def open_s3(s3_root: tuple[str, dict[str, Any]], tmp_path: Path, clock: ManualClock) -> kvlog.Store:
    uri, options = s3_root
    return kvlog.open(uri, storage_options=options, cache_dir=tmp_path / "cache", clock=clock,
                      partitions=PARTITIONS, flush_interval_ms=0, flush_bytes=1 << 30,
                      max_unflushed_bytes=1 << 30, background_compaction=False, checkpoint_interval=1000)


@pytest.mark.parametrize("files", [3, 6])
def test_a_job_costs_two_gets_per_input_file(
    s3_root: tuple[str, dict[str, Any]], tmp_path: Path, clock: ManualClock, files: int,
) -> None:
    store = open_s3(s3_root, tmp_path, clock)
    try:
        model: dict[bytes, bytes] = {}
        for flush in range(files):
            for i in range(40):
                key, value = f"key-{i:03}".encode(), f"{flush}-{i}".encode() * 4
                store.put(key, value)
                model[key] = value
            store.flush()
        per_file = store.log.snapshot(
            lambda r: {fid: {p for p, _last in e.batches} for fid, e in r.iter_files()})
        assert len(per_file) == files
        assert all(len(parts) >= 3 for parts in per_file.values()), per_file  # several partitions each

        storage = store.log.storage
        storage.requests.clear()
        report = store.compact()
        requests = dict(storage.requests)

        assert (report.rounds, report.kind, report.files_in) == (1, "clean", files)
        assert report.partitions == list(range(PARTITIONS))
        assert requests.get("stream", 0) == 2 * files, requests
        assert requests.get("range_get", 0) == 0, requests  # no ranged reads of the inputs
        assert requests.get("put", 0) == report.files_out + 1 >= 2, requests  # outputs, the commit's copy
        assert requests.get("swap", 0) == 1, requests  # the replace commit
        assert report.records_removed == (files - 1) * 40

        assert dict(store.scan()) == model
        assert store.check() == []
    finally:
        store.close()


def test_a_second_job_reads_a_clean_file_once(
    s3_root: tuple[str, dict[str, Any]], tmp_path: Path, clock: ManualClock,
) -> None:
    store = open_s3(s3_root, tmp_path, clock)
    try:
        for flush in range(2):
            for i in range(40):
                store.put(f"key-{i:03}", f"{flush}-{i}")
            store.flush()
        assert store.compact().files_out == 1
        for i in range(0, 40, 2):
            store.put(f"key-{i:03}", "new")
        store.flush()
        storage = store.log.storage
        storage.requests.clear()
        report = store.compact(force=True)  # the dirty ratio (about 1/3) alone would wait
        requests = dict(storage.requests)
        # The cleaned file holds only records below the checkpoints: pass 2 alone reads it.
        # The new file is read by both passes.
        assert report.files_in == 2
        assert requests.get("stream", 0) == 3, requests
        assert requests.get("swap", 0) == 1, requests
        assert report.records_removed == 20
        assert store.check() == []
    finally:
        store.close()
