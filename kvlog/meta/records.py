"""The catalog's values as types: live batches and files, partitions, cleaner state, outcomes.

The catalog stores each value as checksummed JSON (the same objects checkpoints hold);
these classes are what every layer above :mod:`kvlog.meta` sees instead. Decoding
happens once, when a value leaves LMDB or a checkpoint; a malformed value raises
KeyError, TypeError, ValueError, IndexError or AttributeError (JSON that is not an
object), which the caller reports as damage naming the cache or the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvlog.format.datafile import DATAFILE_VERSION, BatchLocation

__all__ = [
    "BatchOutcome",
    "CleanerState",
    "CommitOutcome",
    "LiveBatch",
    "LiveFile",
    "Refusal",
]


@dataclass(frozen=True, slots=True)
class LiveBatch:
    """A live batch of the batch directory: where its records are, and their offsets."""

    file_id: str
    path: str
    level: int
    partition: int
    position: int
    """Byte position of the batch in its data file."""
    length: int
    """Its length in bytes."""
    crc: int
    """CRC32C of those bytes."""
    count: int
    """Records stored in the batch (offsets ``base..last`` minus those compaction removed)."""
    data_bytes: int
    """Bytes of keys and values in the batch."""
    min_timestamp: int
    max_timestamp: int
    base: int
    """First offset."""
    last: int
    """Last offset."""
    present: str | None = None
    """Encoded bitmap of the offsets present, relative to ``base``; None: every offset."""
    horizon_ms: int | None = None
    """Delete horizon of the batch's tombstones, once compaction stamped one."""
    schema: int = DATAFILE_VERSION
    """The data-file format version of its file's schema (``"schema"`` in JSON, absent for 1)."""

    @property
    def location(self) -> BatchLocation:
        """Where the batch is in its data file, and what reading it must find there."""
        return BatchLocation(self.position, self.length, self.crc, self.count, self.data_bytes,
                             self.min_timestamp, self.max_timestamp, self.schema)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the batch directory and of checkpoints, its members in sorted
        order (as checkpoints write them: a stored row is then that very JSON)."""
        out: dict[str, Any] = {"base": self.base, "bytes": self.data_bytes, "crc": self.crc, "f": self.file_id}
        if self.horizon_ms is not None:
            out["horizon"] = self.horizon_ms
        out.update(last=self.last, len=self.length, level=self.level, n=self.count, p=self.partition,
                   path=self.path, pos=self.position)
        if self.present is not None:
            out["present"] = self.present
        if self.schema != DATAFILE_VERSION:
            out["schema"] = self.schema
        out["ts"] = [self.min_timestamp, self.max_timestamp]
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> LiveBatch:
        """The batch :meth:`to_json` encoded."""
        present = obj.get("present")
        horizon = obj.get("horizon")
        return cls(
            str(obj["f"]), str(obj["path"]), int(obj["level"]), int(obj["p"]), int(obj["pos"]),
            int(obj["len"]), int(obj["crc"]), int(obj["n"]), int(obj["bytes"]), int(obj["ts"][0]),
            int(obj["ts"][1]), int(obj["base"]), int(obj["last"]),
            None if present is None else str(present), None if horizon is None else int(horizon),
            int(obj.get("schema", DATAFILE_VERSION)),
        )


@dataclass(frozen=True, slots=True)
class LiveFile:
    """A live data file and the batches of it that are live."""

    path: str
    level: int
    size: int
    crc: int
    """CRC32C of the whole file."""
    batches: tuple[tuple[int, int], ...]
    """Its live batches as (partition, last offset): keys of the batch directory."""
    version: int
    """The version of the commit that made it live."""
    order: tuple[int, int]
    """Commit order: the version that first made its data live, and its position among a
    replace's outputs (compaction's outputs take their inputs' place)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the file table and of checkpoints, its members in sorted order."""
        return {"batches": [list(b) for b in self.batches], "crc": self.crc, "level": self.level,
                "order": list(self.order), "path": self.path, "size": self.size, "version": self.version}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> LiveFile:
        """The file :meth:`to_json` encoded."""
        version = int(obj["version"])
        order = obj.get("order", [version, 0])
        return cls(
            str(obj["path"]), int(obj["level"]), int(obj["size"]), int(obj["crc"]),
            tuple((int(p), int(last)) for p, last in obj["batches"]), version,
            (int(order[0]), int(order[1]) if len(order) > 1 else 0),
        )


@dataclass(frozen=True, slots=True)
class CleanerState:
    """A partition's log-cleaner checkpoint: offsets below it are clean."""

    checkpoint: int = 0
    last_round_ms: int = 0
    partial: bool = False
    """The last round ended early (the offset map was full)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the cleaner table, of checkpoints and of ``replace`` commits."""
        return {"checkpoint": self.checkpoint, "last_round_ms": self.last_round_ms,
                "partial": self.partial}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CleanerState:
        """The state :meth:`to_json` encoded (missing fields take their defaults)."""
        return cls(int(obj.get("checkpoint", 0)), int(obj.get("last_round_ms", 0)),
                   bool(obj.get("partial", False)))


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why replay refused a whole commit: the error's class name and its message."""

    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What replay decided for one batch of an ``append`` or ``replace`` commit."""

    file_id: str
    index: int
    """The batch's position in its file."""
    duplicate: bool
    """A repeat of a batch the producer already wrote: nothing new is live, and the offsets
    are the original batch's."""
    base: int
    last: int


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """What applying one commit decided, as every reader of the log decides it."""

    version: int
    refusal: Refusal | None = None
    """Set when the rules refused the commit: nothing of it became live."""
    batches: tuple[BatchOutcome, ...] = ()
    """``append`` and ``replace`` commits: each batch's offsets."""
    condemned: tuple[str, ...] = ()
    """``gc`` commits: the paths condemned (the others it named were live or pending)."""
    kept: tuple[str, ...] = ()
    """``gc`` commits: the paths it named that were live or pending, and so kept."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the outcome table."""
        results: list[list[Any]] = [[b.file_id, b.index, "duplicate" if b.duplicate else "ok", b.base, b.last]
                                    for b in self.batches]
        results += [[path, "condemned"] for path in self.condemned]
        results += [[path, "kept"] for path in self.kept]
        error = None if self.refusal is None else [self.refusal.kind, self.refusal.message]
        return {"version": self.version, "error": error, "results": results}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CommitOutcome:
        """The outcome :meth:`to_json` encoded."""
        error = obj.get("error")
        batches: list[BatchOutcome] = []
        condemned: list[str] = []
        kept: list[str] = []
        for row in obj.get("results", ()):
            if len(row) == 2:
                (condemned if row[1] == "condemned" else kept).append(str(row[0]))
            else:
                batches.append(BatchOutcome(str(row[0]), int(row[1]), row[2] == "duplicate",
                                            int(row[3]), int(row[4])))
        return cls(
            int(obj["version"]), None if error is None else Refusal(str(error[0]), str(error[1])),
            tuple(batches), tuple(condemned), tuple(kept),
        )
