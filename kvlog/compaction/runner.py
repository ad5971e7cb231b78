"""The runner: plans, runs jobs, commits them as one ``replace``, and keeps compacting in the background.

Commit order (and why): output files are written first under fresh names; the
``replace`` commit then switches atomically from the inputs to the outputs; the
inputs are deleted by GC only ``file_delete_delay_ms`` later, so readers of
older versions keep their files. A crash before the commit leaves orphans for
GC and the old state; after it, the new state. A replace whose inputs are no
longer all live (another compactor won) is refused when applied, and its
outputs, never referenced, are deleted at once.

A failing partition never stops the compactor silently: the error is logged,
shown per partition in ``stats()``, and the partition (with the files that
hold it) is retried with exponential backoff while the others go on.
"""

from __future__ import annotations

import logging
import math
import shutil
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvlog.compaction.merger import PartitionFailure, run_job
from kvlog.compaction.offset_map import SLOT_BYTES, OffsetMap, capacity_for
from kvlog.compaction.planner import BatchInfo, FileInfo, Plan, plan_compaction
from kvlog.config import StoreConfig
from kvlog.errors import InvalidRecordError, KvlogError
from kvlog.format.checksum import crc32c
from kvlog.format.commit import BatchEntry, Commit, FileEntry
from kvlog.log import Log
from kvlog.log.naming import LOG_PREFIX, data_file_name
from kvlog.memory import release_unused_memory
from kvlog.meta import CleanerState, GroupOffsets, LiveBatch, MetaReader
from kvlog.progress import progress
from kvlog.storage.base import BytesLike

__all__ = ["CompactionReport", "Compactor"]

log = logging.getLogger("kvlog.compaction")

_BACKOFF_START_MS = 1_000
_BACKOFF_MAX_MS = 300_000


@dataclass
class CompactionReport:
    """What one ``Compactor.run_once`` (or ``Store.compact``) did."""

    rounds: int = 0
    kind: str | None = None
    partial: bool = False
    refused: bool = False
    records_read: int = 0
    records_written: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    files_in: int = 0
    files_out: int = 0
    map_capacity: int = 0
    checkpoints: dict[int, int] = field(default_factory=dict)
    partitions: list[int] = field(default_factory=list)
    duration_s: float = 0.0
    version: int | None = None
    expired_removed: int = 0
    """Records removed because they had expired (and were no longer needed to hide older ones)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Under the metadata cache directory: where jobs build their output files.
SPILL_DIR = "compaction-spill"
#: Spill directories older than this (left by crashed jobs) are deleted.
STALE_SPILL_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class _Catalog:
    """What planning reads of the catalog, in one snapshot."""

    files: list[FileInfo]
    batches: dict[int, list[LiveBatch]]
    checkpoints: dict[int, int]
    ends: dict[int, int]
    holds: dict[int, int]
    """Per partition, the offset from which on consumer groups hold dead records."""
    version: int


def _map_bytes_for(plan: Plan, batches: dict[int, list[LiveBatch]], config: StoreConfig) -> int:
    """The offset map a job needs: ``offset_map_bytes``, or less when no partition's dirty range
    holds that many records (a pass maps at most one key per record)."""
    most = 0
    for partition, spec in plan.clean.items():
        records = sum(b.count for b in batches.get(partition, ())
                      if b.last >= spec.first_dirty and b.base < spec.first_uncleanable)
        most = max(most, records)
    slots = math.ceil(max(most, 1) / config.offset_map_load_factor) + 1
    return min(config.offset_map_bytes, slots * SLOT_BYTES)


def check_compact_args(force: object, now_ms: object) -> None:
    """Refuse a compaction's arguments before anything is read or written: ``force`` is a bool
    and ``now_ms``, when given, an integer (never a bool) in ``[0, 2**63)``, the range every
    time a commit records (the cleaner's round time, its tombstone horizons) must stay in."""
    if type(force) is not bool:
        raise InvalidRecordError(f"force must be True or False, not {force!r}")
    if now_ms is not None and not (type(now_ms) is int and 0 <= now_ms < 2**63):
        raise InvalidRecordError(f"now_ms must be an integer in [0, 2**63) or None, not {now_ms!r}")


class Compactor:
    """Runs compaction jobs on one log, on demand or in a background thread."""

    def __init__(self, the_log: Log, *, target_file_bytes: int = 64 * 2**20) -> None:
        self._log = the_log
        self._config = the_log.config
        self._clock = the_log.clock
        self._target = target_file_bytes
        self._lock = threading.Lock()
        self.failures: dict[int, dict[str, Any]] = {}
        self.rounds = 0
        self.last_report: CompactionReport | None = None
        self.last_error: str | None = None
        #: Failed rounds and partitions since the store opened (each failure counted once).
        self.failures_total = 0
        #: When a round last ended without an error (ms since the epoch; None: never yet).
        self.last_success_ms: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- planning -----------------------------------------------------------------------------------
    def _snapshot(self, r: MetaReader, now_ms: int) -> _Catalog:
        # An inline file whose commit is a checkpoint interval old is due to move into a data
        # file: commit GC keeps its commit, and every commit after it, while it is live.
        due = r.version() - self._config.checkpoint_interval
        files = [FileInfo(file_id, entry.level, entry.size, entry.order,
                          entry.path.startswith(LOG_PREFIX) and entry.order[0] <= due)
                 for file_id, entry in r.iter_files()]
        batches = {p: list(r.iter_batches(p, 0)) for p in range(self._log.partitions)}
        checkpoints = {p: _checkpoint_of(r.get_cleaner(p)) for p in range(self._log.partitions)}
        ends = {p: r.partition_end(p) for p in range(self._log.partitions)}
        # A hold lapses for this job only once it has lapsed by the log's time as well: replay
        # gives every later commit at least that time, so a commit of the group after this
        # snapshot restarts its hold (refusing this job's commit) instead of renewing a hold
        # this job left out, which a clock read a moment after that commit was built would.
        holds = GroupOffsets(r).holds(min(now_ms, r.last_commit_ms()))
        return _Catalog(files, batches, checkpoints, ends, holds, r.version())

    def plan(self, now_ms: int, *, force: bool = False) -> tuple[Plan | None, dict[int, list[LiveBatch]]]:
        """The next job at ``now_ms`` and the live batches it reads, per partition."""
        at = self._log.snapshot(lambda r: self._snapshot(r, now_ms))
        infos = [
            BatchInfo(b.partition, b.file_id, b.base, b.last, b.data_bytes, b.min_timestamp,
                      b.max_timestamp, b.horizon_ms)
            for items in at.batches.values() for b in items
        ]
        skip = [p for p, f in self.failures.items() if f["retry_at_ms"] > now_ms]
        plan = plan_compaction(at.files, infos, at.checkpoints, at.ends, self._config, now_ms, force=force,
                               skip_partitions=skip, holds=at.holds, holds_at=at.version)
        if plan is None:
            return None, {}
        inputs = set(plan.input_files)
        chosen = {p: [b for b in items if b.file_id in inputs] for p, items in at.batches.items()}
        return plan, {p: items for p, items in chosen.items() if items}

    # -- running ------------------------------------------------------------------------------------
    def run_once(self, *, force: bool = False, now_ms: int | None = None, overlap: bool = True) -> CompactionReport:
        """Plan and run one job, commit it, and report; an empty report when there is nothing to do.

        ``overlap`` runs pass 1 of a partition beside pass 2 of the one before (faster, with about
        twice the memory in flight); the background thread runs its jobs without it, beside the
        application's writers.
        """
        check_compact_args(force, now_ms)
        with self._lock:
            started = self._clock.monotonic_s()
            now = self._clock.now_ms() if now_ms is None else now_ms
            self._log.refresh()
            plan, batches = self.plan(now, force=force)
            report = CompactionReport(map_capacity=capacity_for(self._config.offset_map_bytes,
                                                                self._config.offset_map_load_factor))
            if plan is None:
                report.duration_s = self._clock.monotonic_s() - started
                self.last_success_ms = self._clock.now_ms()
                return report
            report = self._run(plan, batches, now, report, overlap=overlap)
            report.duration_s = round(self._clock.monotonic_s() - started, 6)
            self.last_report = report
            self.last_success_ms = self._clock.now_ms()
            return report

    def _run(self, plan: Plan, batches: dict[int, list[LiveBatch]], now: int,
             report: CompactionReport, *, overlap: bool = True) -> CompactionReport:
        written: list[FileEntry] = []

        def write_file(data: BytesLike, entries: list[BatchEntry], spill: Path | None) -> FileEntry:
            file_id = self._log.new_id()
            path = data_file_name(plan.output_level, file_id)
            entry = FileEntry(file_id, path, plan.output_level, len(data), crc32c(data), tuple(entries))
            if spill is not None:
                self._log.storage.put_file(path, spill)  # a local store moves the file into place
            else:
                self._log.storage.put(path, data)
            written.append(entry)
            return entry

        offset_map = None
        if plan.kind == "clean":
            offset_map = OffsetMap(_map_bytes_for(plan, batches, self._config),
                                   self._config.offset_map_load_factor)
        total = sum(len(items) for items in batches.values())
        spill_dir = self._spill_dir(now)
        try:
            with progress(f"compacting ({plan.kind})", total) as bar:

                def partition_done(count: int) -> None:
                    bar.advance(count)
                    # A partition's batches were decoded and rewritten by this thread: return what
                    # it freed before the next partition, so a job holds one partition's buffers.
                    release_unused_memory()

                result = run_job(plan, batches, self._log.storage, write_file, offset_map,
                                 self._log.identity.fingerprint_seed, self._config, now,
                                 target_file_bytes=self._target, progress=partition_done,
                                 spill_dir=spill_dir, overlap=overlap)
        except PartitionFailure as e:
            self._fail(e.partition, e, now)
            self._discard(written)
            raise
        finally:
            del offset_map
            shutil.rmtree(spill_dir, ignore_errors=True)
            release_unused_memory()  # the map and the last partition's buffers
        for p in batches:  # every partition the job read and wrote (merges and copies too)
            self.failures.pop(p, None)
        cleaner = {str(p): CleanerState(end, now, end < plan.clean[p].first_uncleanable).to_json()
                   for p, end in result.checkpoints.items()}
        commit_id = self._log.new_id()

        def build(version: int) -> Commit:
            return Commit(version, commit_id, self._clock.now_ms(), "replace", add=tuple(result.outputs),
                          remove=plan.input_files,
                          info={"cleaner": cleaner, "job": plan.kind, "holds_at": plan.holds_at})

        outcome = self._log.commit(build)
        report.kind = plan.kind
        report.files_in = len(plan.input_files)
        report.partitions = sorted(plan.clean)
        if outcome.refusal is not None:
            log.info("compaction job refused: %s", outcome.refusal.message)
            self._discard(written)
            report.refused = True
            return report
        self.rounds += 1
        report.rounds = 1
        report.version = outcome.version
        report.partial = result.partial
        report.records_read = result.records_read
        report.records_written = result.records_written
        report.records_removed = result.records_read - result.records_written
        report.tombstones_removed = result.tombstones_removed
        report.expired_removed = result.expired_removed
        report.bytes_read = result.bytes_read
        report.bytes_written = result.bytes_written
        report.files_out = len(result.outputs)
        report.checkpoints = dict(result.checkpoints)
        return report

    def _spill_dir(self, now_ms: int) -> Path:
        """A fresh local directory, beside the metadata cache, where this job builds its outputs.

        Directories that crashed jobs left behind are deleted once a day old.
        """
        root = self._log.env.path / SPILL_DIR
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.iterdir():
            try:
                if stale.stat().st_mtime * 1000 < now_ms - STALE_SPILL_MS:
                    shutil.rmtree(stale, ignore_errors=True)
            except OSError:
                continue
        path = root / self._log.new_id()
        path.mkdir()
        return path

    def _discard(self, written: list[FileEntry]) -> None:
        # A job refused because its own earlier attempt already landed (its answer lost) must
        # not delete what that attempt made live: only outputs no commit made live go.
        live = set(self._log.snapshot(lambda r: [file_id for file_id, _entry in r.iter_files()]))
        for entry in written:
            if entry.file_id in live:
                continue
            try:
                self._log.storage.delete(entry.path)
            except KvlogError as e:  # an orphan for GC then
                log.warning("could not delete unreferenced output %s: %s", entry.path, e)

    def _fail(self, partition: int, error: BaseException, now: int) -> None:
        previous = self.failures.get(partition, {})
        count = int(previous.get("failures", 0)) + 1
        delay = min(_BACKOFF_START_MS * 2 ** (count - 1), _BACKOFF_MAX_MS)
        self.failures[partition] = {"error": str(error), "failures": count, "retry_at_ms": now + delay}
        self.last_error = str(error)
        self.failures_total += 1
        log.error("compaction of partition %d failed (attempt %d, retry in %d ms): %s",
                  partition, count, delay, error)

    # -- background ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background compactor thread."""
        self._thread = threading.Thread(target=self._run_forever, name="kvlog-compactor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the background thread (a running job finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run_forever(self) -> None:
        interval = max(self._config.compaction_interval_ms, 10) / 1000.0
        while not self._stop.wait(interval):
            try:
                report = self.run_once(overlap=False)  # beside the writers: half the memory in flight
                if report.rounds:
                    log.info("compacted: %d records read, %d removed", report.records_read, report.records_removed)
                self._log.gc()
            except PartitionFailure:
                continue  # recorded per partition by _fail
            except KvlogError as e:
                self.last_error = f"{type(e).__name__}: {e}"
                self.failures_total += 1
                log.warning("background compaction failed (will retry): %s", e)
            except Exception as e:  # never die silently: log, record, go on
                self.last_error = f"{type(e).__name__}: {e}"
                self.failures_total += 1
                log.exception("unexpected error in the background compactor")

    def stats(self) -> dict[str, Any]:
        """Compaction state for ``Store.stats()``."""
        return {
            "background": self.running,
            "rounds": self.rounds,
            "failing_partitions": {str(p): dict(f) for p, f in self.failures.items()},
            "last_error": self.last_error,
            "failures_total": self.failures_total,
            "last_success_ms": self.last_success_ms,
            "last_report": self.last_report.to_dict() if self.last_report else None,
            "map_capacity": capacity_for(self._config.offset_map_bytes, self._config.offset_map_load_factor),
        }


def _checkpoint_of(state: CleanerState | None) -> int:
    """A partition's cleaner checkpoint (0 before its first round)."""
    return 0 if state is None else state.checkpoint
