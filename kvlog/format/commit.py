"""Commit entries: what makes files and batches live, encoded in the envelope.

A commit is one of three kinds:

``append``
    adds data files; each batch names its partition and its producer
    (id, epoch, base sequence). Offsets are *not* written: replay assigns each
    accepted batch the partition's next offsets, and a batch the producer rules
    reject (a duplicate, a fenced epoch) is simply never live — a retroactive
    tombstone.
``replace``
    compaction output: removes input files and adds files whose batches carry
    explicit offsets (``base``/``last``) and, where records were removed, the
    present offsets as a roaring bitmap relative to ``base``. Refused at apply
    time when an input is no longer live.
``producer``
    registers a producer epoch (opening a store for writing bumps its epoch,
    fencing an older holder); accepted only if the epoch is newer than the
    producer's current one.
``gc``
    condemns orphan data files (``remove`` lists their paths) before GC deletes
    them: a later commit that adds a condemned file is refused, so a commit can
    never make live a file that GC took, however slow its writer was.
``offsets``
    a consumer group's committed offsets (``info``: ``group`` and ``offsets``, partition ->
    next offset to read); the later commit of a group wins.
``pin`` / ``unpin``
    create or delete a named checkpoint (``info``: ``name``; a pin also ``version``, the
    version it keeps, and ``paths``, the data files live there). Replay refuses a pin of
    a name that exists, or whose version is not the one just before it.

Every commit may name the id of the commit it follows (``prev``): a reader
whose cache applied another commit at the version before knows that storage
is not the history it cached (restored from an older copy) and never mixes
the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvlog.errors import CorruptDataError
from kvlog.format.datafile import DATAFILE_VERSION, BatchLocation
from kvlog.format.envelope import decode_document, encode_document

__all__ = [
    "BatchEntry",
    "FileEntry",
    "Commit",
    "COMMIT_KINDS",
    "encode_commit",
    "decode_commit",
    "file_to_json",
    "file_from_json",
]

COMMIT_KINDS = ("append", "replace", "producer", "gc", "offsets", "pin", "unpin")


@dataclass(frozen=True)
class BatchEntry:
    """One batch of a data file as the batch directory knows it."""

    partition: int
    location: BatchLocation
    producer_id: int | None = None
    epoch: int = 0
    base_sequence: int = 0
    base_offset: int | None = None
    """Set for compacted batches; appended batches get theirs at replay."""
    last_offset: int | None = None
    present: str | None = None
    """Encoded bitmap of present offsets relative to ``base_offset``; None means every offset."""
    tombstone_horizon_ms: int | None = None
    """Tombstones in this batch may be dropped by a cleaning round at or after this time."""
    digest: int | None = None
    """Content digest of an appended batch's keys and values, by which the producer rules tell
    a resend of this batch from another batch with the same sequences."""


@dataclass(frozen=True)
class FileEntry:
    """A data file: where it is and what batches it holds, in file order."""

    file_id: str
    path: str
    level: int
    size: int
    crc: int
    batches: tuple[BatchEntry, ...]


@dataclass(frozen=True)
class Commit:
    """One entry of the commit log."""

    version: int
    commit_id: str
    timestamp_ms: int
    kind: str
    add: tuple[FileEntry, ...] = ()
    remove: tuple[str, ...] = ()
    producer_id: int | None = None
    epoch: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form details (compaction checkpoints, horizons); replayed as given."""
    previous_id: str | None = None
    """The id of the commit at ``version - 1`` when this one was written (None: not recorded)."""


def _batch_to_json(b: BatchEntry) -> dict[str, Any]:
    loc = b.location
    out: dict[str, Any] = {
        "p": b.partition, "pos": loc.position, "len": loc.length, "crc": loc.crc, "n": loc.count,
        "bytes": loc.data_bytes, "ts": [loc.min_timestamp, loc.max_timestamp],
    }
    if loc.schema != DATAFILE_VERSION:
        out["schema"] = loc.schema
    if b.producer_id is not None:
        out.update(pid=b.producer_id, epoch=b.epoch, seq=b.base_sequence)
    if b.base_offset is not None:
        out.update(base=b.base_offset, last=b.last_offset)
    if b.present is not None:
        out["present"] = b.present
    if b.tombstone_horizon_ms is not None:
        out["horizon"] = b.tombstone_horizon_ms
    if b.digest is not None:
        out["digest"] = b.digest
    return out


def _int(name: str, obj: dict[str, Any], key: str, default: int | None = None) -> int:
    value = obj.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CorruptDataError(name, f"field {key!r} is not an integer")
    return value


def _opt_int(name: str, obj: dict[str, Any], key: str) -> int | None:
    return None if obj.get(key) is None else _int(name, obj, key)


def _batch_from_json(name: str, obj: Any) -> BatchEntry:
    if not isinstance(obj, dict):
        raise CorruptDataError(name, "batch entry is not an object")
    ts = obj.get("ts")
    if not (isinstance(ts, list) and len(ts) == 2 and all(isinstance(t, int) for t in ts)):
        raise CorruptDataError(name, "batch entry lacks its timestamp range")
    present = obj.get("present")
    if present is not None and not isinstance(present, str):
        raise CorruptDataError(name, "batch offsets bitmap is not a string")
    return BatchEntry(
        partition=_int(name, obj, "p"),
        location=BatchLocation(
            _int(name, obj, "pos"), _int(name, obj, "len"), _int(name, obj, "crc"),
            _int(name, obj, "n"), _int(name, obj, "bytes"), ts[0], ts[1],
            _int(name, obj, "schema", DATAFILE_VERSION),
        ),
        producer_id=_opt_int(name, obj, "pid"),
        epoch=_int(name, obj, "epoch", 0),
        base_sequence=_int(name, obj, "seq", 0),
        base_offset=_opt_int(name, obj, "base"),
        last_offset=_opt_int(name, obj, "last"),
        present=present,
        tombstone_horizon_ms=_opt_int(name, obj, "horizon"),
        digest=_opt_int(name, obj, "digest"),
    )


def file_to_json(f: FileEntry) -> dict[str, Any]:
    """A file entry as a JSON object (also used by checkpoints)."""
    return {
        "id": f.file_id, "path": f.path, "level": f.level, "size": f.size, "crc": f.crc,
        "batches": [_batch_to_json(b) for b in f.batches],
    }


def file_from_json(name: str, obj: Any) -> FileEntry:
    """The file entry of :func:`file_to_json`; raises ``CorruptDataError`` naming ``name``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str) or not isinstance(obj.get("path"), str):
        raise CorruptDataError(name, "file entry lacks id or path")
    batches = obj.get("batches")
    if not isinstance(batches, list):
        raise CorruptDataError(name, "file entry lacks its batches")
    return FileEntry(
        file_id=obj["id"], path=obj["path"], level=_int(name, obj, "level"),
        size=_int(name, obj, "size"), crc=_int(name, obj, "crc"),
        batches=tuple(_batch_from_json(name, b) for b in batches),
    )


def encode_commit(commit: Commit) -> bytes:
    """The bytes of ``log/<version>.json``."""
    if commit.kind not in COMMIT_KINDS:
        raise ValueError(f"unknown commit kind {commit.kind!r}")
    body: dict[str, Any] = {
        "version": commit.version, "id": commit.commit_id, "ts": commit.timestamp_ms,
        "kind": commit.kind, "add": [file_to_json(f) for f in commit.add],
        "remove": list(commit.remove), "info": commit.info,
    }
    if commit.producer_id is not None:
        body.update(pid=commit.producer_id, epoch=commit.epoch)
    if commit.previous_id is not None:
        body["prev"] = commit.previous_id
    return encode_document("commit", body)


def decode_commit(name: str, data: bytes) -> Commit:
    """The commit in ``data``, verified; raises ``CorruptDataError`` naming ``name``."""
    body = decode_document(name, data, "commit")
    kind = body.get("kind")
    if kind not in COMMIT_KINDS:
        raise CorruptDataError(name, f"unknown commit kind {kind!r}")
    add, remove, info = body.get("add"), body.get("remove"), body.get("info")
    if not isinstance(add, list) or not isinstance(remove, list) or not isinstance(info, dict):
        raise CorruptDataError(name, "commit lacks add, remove or info")
    if not all(isinstance(r, str) for r in remove) or not isinstance(body.get("id"), str):
        raise CorruptDataError(name, "malformed commit")
    previous = body.get("prev")
    if previous is not None and not isinstance(previous, str):
        raise CorruptDataError(name, "malformed commit")
    return Commit(
        version=_int(name, body, "version"), commit_id=body["id"], timestamp_ms=_int(name, body, "ts"),
        kind=kind, add=tuple(file_from_json(name, f) for f in add), remove=tuple(remove),
        producer_id=_opt_int(name, body, "pid"), epoch=_opt_int(name, body, "epoch"), info=info,
        previous_id=previous,
    )
