"""Store settings: one frozen dataclass, validated, with Kafka names documented.

Settings that change the on-storage format (``partitions``) are persisted in
``kvlog.json`` when the store is created and checked on reopen.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, fields
from typing import Any

from kvlog.errors import ConfigError

__all__ = ["StoreConfig", "KAFKA_NAMES", "MiB", "DAY_MS", "KEY_BYTES_LIMIT", "MIN_FILE_DELETE_DELAY_MS"]

#: Bytes in a mebibyte, for sizes in settings (``64 * MiB``).
MiB = 1024 * 1024
#: Milliseconds in a day, for durations in settings (``7 * DAY_MS``).
DAY_MS = 24 * 3600 * 1000
#: The smallest ``file_delete_delay_ms``: a get looks its key up and reads the value's batch
#: in two steps, and a replaced file must outlive that (and any scan's next chunk) by a margin.
MIN_FILE_DELETE_DELAY_MS = 1_000
#: The longest key any store holds (the largest ``max_key_bytes``).
KEY_BYTES_LIMIT = 65_535

#: The Kafka setting each kvlog setting corresponds to, where there is one.
KAFKA_NAMES: dict[str, str] = {
    "delete_retention_ms": "delete.retention.ms",
    "min_compaction_lag_ms": "min.compaction.lag.ms",
    "max_compaction_lag_ms": "max.compaction.lag.ms",
    "min_cleanable_dirty_ratio": "min.cleanable.dirty.ratio",
    "offset_map_bytes": "log.cleaner.dedupe.buffer.size",
    "offset_map_load_factor": "log.cleaner.io.buffer.load.factor",
    "producer_id_expiration_ms": "producer.id.expiration.ms",
    "file_delete_delay_ms": "file.delete.delay.ms",
    "compaction_interval_ms": "log.cleaner.backoff.ms",
    "max_record_bytes": "max.message.bytes",
    "partitions": "num.partitions",
}


@dataclass(frozen=True)
class StoreConfig:
    """Every tunable of a store, with its default.

    Unknown names and out-of-range values raise :class:`~kvlog.errors.ConfigError`.
    """

    partitions: int = 8
    """Number of partitions, fixed when the store is created (Kafka: num.partitions)."""
    delete_retention_ms: int = DAY_MS
    """How long a tombstone that is the latest for its key is kept after the round that first sees it."""
    min_compaction_lag_ms: int = 0
    """Records younger than this are never cleaned."""
    max_compaction_lag_ms: int | None = None
    """A partition whose oldest dirty record is older than this is cleaned whatever its dirty ratio."""
    min_cleanable_dirty_ratio: float = 0.5
    """A partition is cleaned when dirty / (clean + dirty) bytes is strictly greater than this."""
    offset_map_bytes: int = 128 * MiB
    """Size of the compactor's offset map, allocated once per job."""
    offset_map_load_factor: float = 0.9
    """How full the offset map may get before a round ends early."""
    producer_id_expiration_ms: int = DAY_MS
    """Producers idle this long are forgotten (their duplicate window with them)."""
    flush_interval_ms: int = 200
    """Unflushed writes older than this are flushed by the background flusher."""
    flush_bytes: int = 16 * MiB
    """A flush starts when this many bytes are buffered."""
    max_unflushed_bytes: int = 32 * MiB
    """Writers block (backpressure) while this many bytes wait for a flush."""
    commit_inline_bytes: int = 64 * 1024
    """A flush whose data file is at most this many bytes is written inside its commit: one
    object, one file fsync and one directory fsync on a local root, one PUT on an object
    store. 0: every flush writes a data file of its own."""
    cache_bytes: int = 32 * MiB
    """Bound of the in-memory read cache of decoded batches."""
    inline_value_bytes: int = 1024
    """Values up to this size are kept in the key index itself, so a get needs no data-file read."""
    index_run_limit: int = 32
    """A commit writes its key-index entries as one sorted run; past this many pending runs they
    are merged into the index's B-tree (also when the writer is idle). 0: every commit writes
    the B-tree itself."""
    l0_merge_files: int = 32
    """L0 files waiting before they are merged into L1."""
    file_delete_delay_ms: int = 60_000
    """Grace period before an unreferenced data file or a replaced input is deleted: how long a
    read of an older version (a scan, a snapshot) may keep using a replaced file. At least
    :data:`~kvlog.config.MIN_FILE_DELETE_DELAY_MS`. Acknowledged writes never depend on it: GC condemns an
    orphan in a commit before deleting it, and a commit adding a condemned file is refused."""
    background_compaction: bool = True
    """Run the compactor in a background thread."""
    compaction_interval_ms: int = 15_000
    """How often the background compactor looks for work (Kafka: log.cleaner.backoff.ms)."""
    checkpoint_interval: int = 100
    """A metadata checkpoint is written every this many commits."""
    commit_retention_ms: int = 7 * DAY_MS
    """Commits older than the newest checkpoint by more than this are deleted."""
    max_key_bytes: int = 4096
    """Largest key a put accepts. Reads and deletes take any key up to :data:`~kvlog.config.KEY_BYTES_LIMIT`,
    so lowering this on a reopen never makes existing keys unreadable."""
    max_record_bytes: int = 8 * MiB
    """Largest key + value accepted."""
    compression: str = "zstd"
    """Arrow IPC buffer compression of data files: 'zstd', 'lz4' or 'none'."""
    refresh_interval_ms: int = 1000
    """Reads pick up other writers' commits at most this stale (0: check on every read)."""
    commit_retries: int = 50
    """How many times a commit is retried at a later version when other writers take it first."""
    group_hold_max_ms: int = 7 * DAY_MS
    """How long a consumer group's tombstone hold (``store.consumer(group, hold_tombstones=True)``)
    outlives the group's last commit: past it, compaction removes the tombstones and expired
    records the group has not read, as if it held none. A commit records the setting of the
    process that made it. Disk cost: every tombstone and expired record at or after the
    lagging group's offsets stays, with its key."""
    follow_interval_ms: int = 100
    """How often a waiter (a consumer's ``poll``) looks for other processes' commits (on a
    local root the kernel wakes it when the head is renamed; this is then a backstop)."""

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, what: str) -> None:
            if not cond:
                raise ConfigError(f"{name}={getattr(self, name)!r}: {what}")

        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "max_compaction_lag_ms":
                need(value is None or (_is_int(value) and value >= 0), f.name,
                     "must be None or an integer >= 0")
            elif f.name in ("min_cleanable_dirty_ratio", "offset_map_load_factor"):
                need(isinstance(value, int | float) and not isinstance(value, bool), f.name,
                     "must be a number")
            elif f.name == "background_compaction":
                need(isinstance(value, bool), f.name, "must be True or False")
            elif f.name == "compression":
                need(value in ("zstd", "lz4", "none"), f.name, "must be 'zstd', 'lz4' or 'none'")
            else:
                need(_is_int(value) and value >= 0, f.name, "must be an integer >= 0")
        need(self.follow_interval_ms >= 1, "follow_interval_ms", "must be >= 1")
        need(1 <= self.partitions <= 65535, "partitions", "must be between 1 and 65535")
        need(0.0 <= self.min_cleanable_dirty_ratio <= 1.0, "min_cleanable_dirty_ratio",
             "must be between 0 and 1")
        need(0.0 < self.offset_map_load_factor <= 1.0, "offset_map_load_factor",
             "must be in (0, 1]")
        need(self.offset_map_bytes >= 64, "offset_map_bytes", "must hold at least one key (>= 64)")
        need(int(self.offset_map_bytes // 16 * self.offset_map_load_factor) >= 1, "offset_map_bytes",
             "must hold at least one key at offset_map_load_factor (16 bytes a slot)")
        need(1 <= self.max_key_bytes <= KEY_BYTES_LIMIT, "max_key_bytes",
             f"must be between 1 and {KEY_BYTES_LIMIT}")
        need(self.max_record_bytes > self.max_key_bytes, "max_record_bytes",
             "must be larger than max_key_bytes")
        need(self.max_unflushed_bytes >= self.max_record_bytes, "max_unflushed_bytes",
             "must be at least max_record_bytes")
        need(self.checkpoint_interval >= 1, "checkpoint_interval", "must be >= 1")
        need(self.l0_merge_files >= 2, "l0_merge_files", "must be >= 2")
        need(self.file_delete_delay_ms >= MIN_FILE_DELETE_DELAY_MS, "file_delete_delay_ms",
             f"must be at least {MIN_FILE_DELETE_DELAY_MS} ms: a replaced file must outlive the "
             "reads that began before it was replaced")

    @classmethod
    def from_settings(cls, base: StoreConfig | None = None, **settings: Any) -> StoreConfig:
        """A config from ``base`` (or the defaults) with ``settings`` replaced; unknown names are refused."""
        if base is not None and not isinstance(base, StoreConfig):
            raise ConfigError(f"config must be a StoreConfig or None, not {type(base).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ConfigError(_unknown_message(unknown, sorted(known)))
        return dataclasses.replace(cls() if base is None else base, **settings)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict."""
        return dataclasses.asdict(self)


def _unknown_message(unknown: list[str], known: list[str]) -> str:
    """``unknown setting 'x' (did you mean 'y'?)``, one clause per unknown name.

    The suggestion is the closest known name by :func:`difflib.get_close_matches`, when one
    is close enough to be a typo.
    """
    clauses = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        clauses.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(clauses)}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
