"""Self-check and statistics of a log: the metadata cache cross-checked against storage."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvlog.errors import CorruptDataError, StorageError
from kvlog.format.checksum import crc32c
from kvlog.format.commit import attached_bytes, decode_commit
from kvlog.index import IndexReader
from kvlog.log import Log
from kvlog.log.head import Head, read_head, storage_behind
from kvlog.log.naming import LOG_PREFIX, commit_name
from kvlog.log.reader import records_of_batch
from kvlog.meta import CleanerState, GroupOffsets, GroupState, LiveBatch, LiveFile

__all__ = ["check_store", "log_stats"]

#: Up to this many index entries, check() verifies every one points at its key's record.
INDEX_CHECK_LIMIT = 200_000


def check_store(log: Log, *, deep: bool = False) -> list[str]:
    """Findings, one line each; empty when the store is consistent.

    Checks: the cache is at the newest commit, and that commit is in storage,
    intact and the one the cache applied (a deleted, truncated or replaced newest
    commit would hide acknowledged writes from every fresh reader); every live
    file exists with its size and its whole-file CRC32C; per partition, live
    batches are ordered, disjoint and below the end offset; every index entry
    points at a live record with its key (all of them up to
    :data:`INDEX_CHECK_LIMIT` entries, or ``deep``); with ``deep`` every batch's
    own checksum too. Each finding names the damaged object.
    """
    findings: list[str] = []
    try:
        version = log.refresh()
    except CorruptDataError as e:  # a damaged head, or a history that is not this cache's
        findings.append(str(e))
        version = log.version
    head: Head | None = None
    if log.frozen_at is None:  # a log opened at a named checkpoint stays at its version by design
        try:
            head = read_head(log.storage)
        except CorruptDataError as e:
            if str(e) not in findings:
                findings.append(str(e))
        if head is not None and head.version > version:
            findings.append(f"the head is at version {head.version} but the cache stopped at {version}")
    findings.extend(_check_newest_commit(log, version, head))

    def collect(r: IndexReader) -> tuple[dict[str, LiveFile], dict[int, list[LiveBatch]], dict[int, int], int]:
        files = dict(r.iter_files())
        per_partition = {p: list(r.iter_batches(p, 0)) for p in range(log.partitions)}
        ends = {p: r.partition_end(p) for p in range(log.partitions)}
        return files, per_partition, ends, r.index_count()

    files, per_partition, ends, index_count = log.snapshot(collect)
    for file_id, entry in files.items():
        try:
            data = log.storage.read(entry.path)
        except FileNotFoundError:
            findings.append(f"live file {entry.path} is missing from storage")
            continue
        except StorageError as e:
            findings.append(f"live file {entry.path} could not be read: {e}")
            continue
        whole: bytes | memoryview = data
        if entry.path.startswith(LOG_PREFIX):
            try:
                whole = attached_bytes(entry.path, data)  # an inline file: the commit's attached bytes
            except CorruptDataError as e:
                findings.append(f"live inline file in commit {e}")
                continue
        if len(whole) != entry.size:
            findings.append(f"live file {entry.path} has {len(whole)} bytes, expected {entry.size}")
        elif crc32c(whole) != entry.crc:
            findings.append(f"live file {entry.path} fails its checksum (damaged in storage)")
        del data, whole
        if not entry.batches:
            findings.append(f"live file {file_id} has no live batch")
    for p, batches in per_partition.items():
        previous_last = -1
        for batch in batches:
            if batch.base <= previous_last:
                findings.append(f"partition {p}: batch {batch.base}..{batch.last} overlaps the one before")
            if batch.last < batch.base or batch.last >= ends[p]:
                findings.append(f"partition {p}: batch {batch.base}..{batch.last} outside [0, {ends[p]})")
            if batch.file_id not in files:
                findings.append(f"partition {p}: batch at {batch.base} belongs to no live file")
            previous_last = batch.last
            if deep:
                try:
                    log.read_batch(batch)
                except CorruptDataError as e:
                    findings.append(str(e))
    if deep or index_count <= INDEX_CHECK_LIMIT:
        findings.extend(_check_index(log))
    return findings


def _check_newest_commit(log: Log, version: int, head: Head | None) -> list[str]:
    """The newest applied commit is in storage, decodes, and is the one the cache applied; when
    not, the finding names every commit the cache applied that storage lost, as reopening the
    store would (:class:`~kvlog.errors.StorageBehindError`). ``head``: the head read (None: not
    read, or damaged)."""
    if version == 0:
        return []
    name = commit_name(version)
    if head is not None:
        behind = storage_behind(log.snapshot(lambda r: r.applied_commit()), head, log.storage.uri)
        if behind is not None:
            return [f"{behind[0]}: {behind[1]}"]
    applied = log.snapshot(lambda r: r.applied_commit())
    try:
        data = log.storage.read(name)
    except FileNotFoundError:
        return [f"commit {name}, the newest applied, is missing from storage "
                "(fresh readers stop before it)"]
    try:
        decode_commit(name, data)
    except CorruptDataError as e:
        return [f"commit {e}"]
    if applied is not None and applied[0] == version and crc32c(data) != applied[2]:
        return [f"commit {name} differs from the commit this cache applied at version {version}"]
    return []


def _check_index(log: Log) -> list[str]:
    """Every index entry points at a live record holding its key and (if inlined) its value."""
    findings: list[str] = []
    def every_entry(r: IndexReader) -> list[tuple[bytes, Any]]:
        return list(r.index_scan())

    entries = log.snapshot(every_entry)
    by_batch: dict[tuple[int, int], list[tuple[bytes, Any]]] = {}
    batches: dict[tuple[int, int], LiveBatch] = {}
    for key, entry in entries:
        if log.partition_for(key) != entry.partition:
            findings.append(f"index entry at offset {entry.offset} is in the wrong partition")
            continue
        def holder(r: IndexReader, e: Any = entry) -> LiveBatch | None:
            return r.find_batch(e.partition, e.offset)

        batch = log.snapshot(holder)
        if batch is None and entry.expires_ms is not None:
            continue  # an expiring record a compaction removed by a clock ahead of this one
        if batch is None:
            findings.append(f"index entry of a key points at partition {entry.partition} offset "
                            f"{entry.offset}, which is not live")
            continue
        slot = (entry.partition, batch.last)
        batches[slot] = batch
        by_batch.setdefault(slot, []).append((key, entry))
    for slot, items in by_batch.items():
        batch = batches[slot]
        try:
            records = {rec.offset: rec for rec in records_of_batch(batch, slot[0], log.read_batch(batch))}
        except CorruptDataError as e:  # a damaged or missing file is a finding, not a crash
            findings.append(str(e))
            continue
        for key, entry in items:
            rec = records.get(entry.offset)
            if rec is None or rec.key != key or rec.value is None:
                findings.append(f"index entry at partition {entry.partition} offset {entry.offset} "
                                "does not hold its key's value")
            elif entry.inline is not None and entry.inline != rec.value:
                findings.append(f"inline value at partition {entry.partition} offset {entry.offset} differs")
    return findings


def log_stats(log: Log, *, count_keys: bool = True) -> dict[str, Any]:
    """Counts and sizes of the log and its cache (no credentials, no keys). Without
    ``count_keys``, ``live_keys`` is None while index runs are pending: counting the keys
    through them looks each of their entries up in the index."""

    def collect(r: IndexReader) -> dict[str, Any]:
        files = dict(r.iter_files())
        levels: dict[str, dict[str, int]] = {}
        for entry in files.values():
            level = levels.setdefault(str(entry.level), {"files": 0, "bytes": 0})
            level["files"] += 1
            level["bytes"] += entry.size
        partitions = []
        records = 0
        for p in range(log.partitions):
            batches = list(r.iter_batches(p, 0))
            count = sum(b.count for b in batches)
            records += count
            cleaner = r.get_cleaner(p)
            # Dirty: bytes at or past the cleaner's checkpoint (the planner's ratio before
            # min_compaction_lag_ms holds back the newest batches).
            data_bytes = sum(b.data_bytes for b in batches)
            first_dirty = cleaner.checkpoint if cleaner is not None else 0
            dirty_bytes = sum(b.data_bytes for b in batches if b.last >= first_dirty)
            partitions.append({
                "partition": p,
                "start_offset": batches[0].base if batches else r.partition_end(p),
                "end_offset": r.partition_end(p),
                "records": count,
                "batches": len(batches),
                "data_bytes": data_bytes,
                "dirty_bytes": dirty_bytes,
                "dirty_ratio": dirty_bytes / data_bytes if data_bytes else 0.0,
                "cleaner": _cleaner_json(cleaner),
            })
        return {
            "uri": log.storage.uri,
            "store_uuid": log.identity.store_uuid,
            "partitions": log.partitions,
            "version": r.version(),
            "live_keys": r.index_count() if count_keys or not r.runs_pending() else None,
            "index_runs": r.runs_pending(),
            "records": records,
            "files": len(files),
            "file_bytes": sum(e.size for e in files.values()),
            "levels": levels,
            "producers": sum(1 for _ in r.iter_producers()),
            "partition_stats": partitions,
        }

    out: dict[str, Any] = log.snapshot(collect)
    out["cache_dir"] = str(log.env.path)
    out["cache_disk_bytes"] = log.env.disk_bytes()
    out["batch_cache_bytes"] = log.batch_cache.nbytes
    out["commits_written"] = log.commits_written
    out["commits_applied"] = log.commits_applied
    out["storage_requests"] = dict(log.storage.requests)
    out["storage_traffic"] = {kind: log.storage.traffic[kind] for kind in ("sent", "received", "fsyncs")}
    out["commit_latency"] = log.commit_latency().to_json()
    now = log.clock.now_ms()

    def groups(r: IndexReader) -> tuple[dict[str, dict[str, int]], dict[str, GroupState], dict[int, int]]:
        table = GroupOffsets(r)
        return _groups(table.every()), table.states(), table.holds(now)

    out["consumer_groups"], states, holds = log.snapshot(groups)
    # Tombstone holds: per partition, the offset from which on compaction keeps dead records,
    # and each holding group's expiry (when it lapses unless the group commits again).
    out["holds"] = {str(p): offset for p, offset in sorted(holds.items())}
    out["holding_groups"] = {g: s.hold_expires_ms for g, s in sorted(states.items()) if s.holding(now)}
    return out


def _groups(rows: Iterable[tuple[str, int, int]]) -> dict[str, dict[str, int]]:
    """Committed offsets by group, then partition (as ``stats()`` shows them)."""
    out: dict[str, dict[str, int]] = {}
    for group, partition, offset in rows:
        out.setdefault(group, {})[str(partition)] = offset
    return out


def _cleaner_json(state: CleanerState | None) -> dict[str, Any]:
    """A partition's cleaner state as ``stats()`` shows it ({} before its first round)."""
    return {} if state is None else state.to_json()
