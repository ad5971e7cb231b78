"""The driver's commit of ``mode("overwrite")``: the DataFrame's records and a tombstone per other key.

The tasks have written their data files as an append does. The driver then:

1. reads back the ``key`` column of those files (only the key buffers are
   decompressed) and refuses a key that appears twice: the DataFrame would not
   say which value is the latest;
2. takes the live keys of the store at one version ``V``, in key order, from a
   read-only handle with a key index of its own (a private cache next to the
   driver's metadata cache);
3. writes one data file holding a tombstone for every live key the DataFrame
   does not have;
4. commits the task files and the tombstone file in one ``append`` commit that
   is valid only as version ``V + 1``. If anything else landed first (a local
   ``put``, another overwrite), the tombstones are computed again at the new
   version, up to :data:`ATTEMPTS` times; then the overwrite is refused with
   :class:`~kvlog.errors.CommitConflictError` and nothing is written.

The driver holds every key of the DataFrame and every key it tombstones in
memory (a Python ``set`` and ``list`` of ``bytes``: about the key's length
plus 80 bytes per key); the store's keys are streamed.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

import kvlog
from kvlog.clock import SystemClock
from kvlog.errors import CommitConflictError, InvalidRecordError, KvlogError
from kvlog.format.checksum import crc32c
from kvlog.format.commit import BatchEntry, FileEntry
from kvlog.format.datafile import DataFileWriter, decode_batch, make_record_batch
from kvlog.log import CommitOutcome
from kvlog.log.naming import data_file_name
from kvlog.log.records import partition_for_key
from kvlog.storage import Storage

__all__ = ["ATTEMPTS", "OverwriteTarget", "commit_overwrite", "keys_cache_dir"]

#: How many versions an overwrite computes its tombstones against before it gives up.
ATTEMPTS = 10


@dataclass(frozen=True)
class OverwriteTarget:
    """The store an overwrite commits to, as the writer planned it."""

    uri: str
    storage_options: dict[str, Any] | None
    metadata_cache: str
    partitions: int
    compression: str
    job_id: str


def keys_cache_dir(metadata_cache: str) -> str:
    """The driver's key-index cache of a store: beside its metadata-only cache, never inside it."""
    return os.path.normpath(metadata_cache) + ".keys"


class _Moved(Exception):
    """The next free version is not the one the tombstones were computed against."""


def dataframe_keys(storage: Storage, files: Iterable[FileEntry]) -> set[bytes]:
    """Every key of the task files; InvalidRecordError if one appears twice."""
    keys: set[bytes] = set()
    total = 0
    for entry in files:
        for batch in entry.batches:
            loc = batch.location
            data = storage.read_range(entry.path, loc.position, loc.length)
            column = decode_batch(entry.path, data, loc, keys_only=True).column("key").to_pylist()
            keys.update(column)
            total += len(column)
    if len(keys) != total:
        twice = _a_duplicate(storage, files)
        raise InvalidRecordError(
            f"mode('overwrite') takes each key once, so that the DataFrame is the latest state; "
            f"{total - len(keys)} rows repeat a key (e.g. {twice!r}). Deduplicate the DataFrame "
            f"(e.g. dropDuplicates(['key'])) or append it. Nothing was written")
    return keys


def _a_duplicate(storage: Storage, files: Iterable[FileEntry]) -> bytes:
    """One key that appears more than once (read again: only on the error path)."""
    counts: Counter[bytes] = Counter()
    for entry in files:
        for batch in entry.batches:
            loc = batch.location
            data = storage.read_range(entry.path, loc.position, loc.length)
            counts.update(decode_batch(entry.path, data, loc, keys_only=True).column("key").to_pylist())
    return min(key for key, n in counts.items() if n > 1)


def _tombstone_file(target: OverwriteTarget, storage: Storage, keys: Sequence[bytes], attempt: int) -> FileEntry:
    """Write one data file with a tombstone for each of ``keys`` (one batch per partition)."""
    by_partition: dict[int, list[bytes]] = {}
    for key in keys:
        by_partition.setdefault(partition_for_key(key, target.partitions), []).append(key)
    now = SystemClock().now_ms()
    writer = DataFileWriter(target.compression)
    order = sorted(by_partition)
    for p in order:
        part = by_partition[p]
        writer.add(make_record_batch(part, [None] * len(part), [now] * len(part)))
    data, locations = writer.finish()
    producer_id = xxhash.xxh3_64_intdigest(f"{target.job_id}:tombstones:{attempt}".encode()) >> 1
    file_id = xxhash.xxh3_128_hexdigest(f"{target.job_id}:tombstones:{attempt}".encode())
    path = data_file_name(0, file_id)
    storage.put(path, data)
    batches = tuple(BatchEntry(partition=p, location=loc, producer_id=producer_id, epoch=0, base_sequence=0)
                    for p, loc in zip(order, locations, strict=True))
    return FileEntry(file_id, path, 0, len(data), crc32c(data), batches)


def commit_overwrite(target: OverwriteTarget, files: Sequence[FileEntry]) -> tuple[CommitOutcome, int]:
    """Commit ``files`` and the tombstones of every other live key as one commit; (outcome, tombstones).

    Raises InvalidRecordError (a key twice) or CommitConflictError (the store changed at
    every attempt); then the tombstone file this call wrote is deleted, the task files
    are left to the writer's abort. When the commit's fate is unknown (a storage error
    while it was written), every file stays: garbage collection takes them if it did
    not land.
    """
    from kvlog.log import commit_files, open_log

    the_log = open_log(target.uri, create=False, storage_options=target.storage_options,
                       cache_dir=target.metadata_cache, maintain_index=False)
    tombstones: FileEntry | None = None
    try:
        storage = the_log.storage
        wanted = dataframe_keys(storage, files)
        keys_store = kvlog.open(target.uri, read_only=True, storage_options=target.storage_options,
                                cache_dir=keys_cache_dir(target.metadata_cache))
        commit_id = the_log.new_id()
        try:
            for attempt in range(ATTEMPTS):
                # The log first: a commit builds on the version it last saw, which must not be
                # older than the snapshot the tombstones are computed from.
                the_log.refresh()
                keys_store.refresh()
                with keys_store.snapshot() as snap:
                    version = snap.version
                    absent = [key for key, _value in snap.scan() if key not in wanted]
                if tombstones is not None:
                    storage.delete(tombstones.path)
                    tombstones = None
                if absent:
                    tombstones = _tombstone_file(target, storage, absent, attempt)
                added = (*files, *([tombstones] if tombstones is not None else []))

                def check(v: int, version: int = version) -> None:
                    if v != version + 1:
                        raise _Moved(v)

                try:
                    outcome = commit_files(the_log, "append", added, check=check, commit_id=commit_id,
                                           info={"spark_overwrite": {"tombstones": len(absent), "attempt": attempt}})
                except _Moved:
                    landed = the_log.outcome(commit_id)  # ours landed, its answer was lost
                    if landed is None:
                        continue
                    outcome = landed
                except BaseException:
                    # Whether the commit landed is unknown: its files stay (GC takes them if not).
                    tombstones = None
                    raise
                if outcome.refusal is not None:
                    raise KvlogError(f"the overwrite commit was refused: {outcome.refusal.message}. "
                                     "Nothing was written")
                tombstones = None  # live: never deleted below
                return outcome, len(absent)
        finally:
            keys_store.close()
        raise CommitConflictError(
            f"the store at {target.uri} changed at each of {ATTEMPTS} attempts to commit the overwrite "
            "(other writers commit faster than its tombstones are computed). Nothing was written")
    finally:
        try:
            if tombstones is not None:
                the_log.storage.delete(tombstones.path)
        finally:
            the_log.close()
