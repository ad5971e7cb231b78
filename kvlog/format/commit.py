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
    time when an input is no longer live. A cleaning round's ``info`` names the version
    it read the consumer groups' tombstone holds at (``holds_at``); it is refused when a
    hold started or moved back after that version.
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
    next offset to read); the later commit of a group wins. ``hold_ms`` asks that compaction
    keep the tombstones and expired records at or after the group's offsets until that long
    after the group's last commit; ``delete: true`` (with no offsets) forgets the group.
``pin`` / ``unpin``
    create or delete a named checkpoint (``info``: ``name``; a pin also ``version``, the
    version it keeps, and ``paths``, the data files live there). Replay refuses a pin of
    a name that exists, or whose version is not the one just before it.

An ``append`` commit of a small flush may carry its one data file inside itself, attached
after the body (format 2 of the envelope): the body's ``inline`` object is that file's entry
without a path, its batch positions counted from the start of the attached bytes. Decoded,
it is the commit's first added file, whose path is the commit's own name and whose batch
positions are counted from the start of the commit object, so every reader reads its
batches by byte range as it reads a data file's.

Every commit may name the id of the commit it follows (``prev``): a reader
whose cache applied another commit at the version before knows that storage
is not the history it cached (restored from an older copy) and never mixes
the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from kvlog.errors import CorruptDataError, InvalidRecordError
from kvlog.format.checksum import crc32c
from kvlog.format.datafile import DATAFILE_VERSION, BatchLocation
from kvlog.format.envelope import encode_document, split_document

__all__ = [
    "BatchEntry",
    "FileEntry",
    "Commit",
    "COMMIT_KINDS",
    "encode_commit",
    "decode_commit",
    "file_to_json",
    "file_from_json",
    "attached_bytes",
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
    attached: bytes | memoryview | None = field(default=None, compare=False, repr=False)
    """To encode: the bytes of a small data file carried inside the commit, whose entry is
    ``add[0]`` with its batch positions counted from the start of these bytes. A decoded
    commit leaves this None: its inline file is ``add[0]``, located in the commit object."""


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
    elif b.epoch != 0 or b.base_sequence != 0:  # written as given, so it reads back as given
        out.update(epoch=b.epoch, seq=b.base_sequence)
    if b.base_offset is not None or b.last_offset is not None:
        out.update(base=b.base_offset, last=b.last_offset)
    if b.present is not None:
        out["present"] = b.present
    if b.tombstone_horizon_ms is not None:
        out["horizon"] = b.tombstone_horizon_ms
    if b.digest is not None:
        out["digest"] = b.digest
    return out


#: Integer fields hold 64-bit values: the metadata cache packs offsets, versions and producer
#: ids as unsigned 64-bit keys, and other readers of the format need not handle bigger ones.
_UINT = (0, 2**63)
_INT64 = (-(2**63), 2**63)
#: Partitions are 16-bit (the cache's keys hold them in two bytes).
_PARTITION = (0, 2**16)
#: The bytes of an id or path the cache keys a row by (LMDB's largest key).
KEY_BYTES_LIMIT = 511


def _int(name: str, obj: dict[str, Any], key: str, default: int | None = None,
         bounds: tuple[int, int] = _UINT) -> int:
    value = obj.get(key, default)
    if value.__class__ is not int:
        raise CorruptDataError(name, f"field {key!r} is not an integer")
    if not bounds[0] <= value < bounds[1]:
        raise CorruptDataError(name, f"field {key!r} is out of range: {value}")
    return value


def _opt_int(name: str, obj: dict[str, Any], key: str, bounds: tuple[int, int] = _UINT) -> int | None:
    return None if obj.get(key) is None else _int(name, obj, key, bounds=bounds)


#: How a field of :func:`_check_ints` may be missing: never, absent or null, absent only.
_REQUIRED, _NULLABLE, _DEFAULTED = 0, 1, 2


def _check_ints(name: str, obj: dict[str, Any], fields: tuple[tuple[str, int, int, int], ...]) -> None:
    """Each ``(key, low, high, missing)`` of ``fields``: ``obj[key]`` is an integer (never a
    bool) in ``[low, high)``, or missing as ``missing`` allows."""
    get = obj.get
    for key, low, high, missing in fields:
        value = get(key)
        if value.__class__ is int and low <= value < high:
            continue
        if value is None and (missing == _NULLABLE or (missing == _DEFAULTED and key not in obj)):
            continue
        if value.__class__ is not int:
            raise CorruptDataError(name, f"field {key!r} is not an integer")
        raise CorruptDataError(name, f"field {key!r} is out of range: {value}")


_BATCH_INTS = (
    ("p", *_PARTITION, _REQUIRED), ("pos", *_UINT, _REQUIRED), ("len", *_UINT, _REQUIRED),
    ("crc", *_UINT, _REQUIRED), ("n", *_UINT, _REQUIRED), ("bytes", *_UINT, _REQUIRED),
    ("schema", *_UINT, _DEFAULTED), ("pid", *_UINT, _NULLABLE), ("epoch", *_INT64, _DEFAULTED),
    ("seq", *_UINT, _DEFAULTED), ("base", *_UINT, _NULLABLE), ("last", *_UINT, _NULLABLE),
    ("horizon", *_INT64, _NULLABLE), ("digest", *_INT64, _NULLABLE),
)
_FILE_INTS = (("level", *_UINT, _REQUIRED), ("size", *_UINT, _REQUIRED), ("crc", *_UINT, _REQUIRED))
_COMMIT_INTS = (("version", *_UINT, _REQUIRED), ("ts", *_INT64, _REQUIRED), ("pid", *_UINT, _NULLABLE),
                ("epoch", *_INT64, _NULLABLE))


def _key_string(name: str, value: Any, what: str) -> str:
    """``value`` if it is a string the cache can key a row by: 1 to 511 bytes of UTF-8."""
    if value.__class__ is not str and not isinstance(value, str):
        raise CorruptDataError(name, f"{what} is not a string")
    if not value or (len(value) * 4 > KEY_BYTES_LIMIT and not _fits(value)):
        raise CorruptDataError(name, f"{what} is empty or longer than {KEY_BYTES_LIMIT} bytes")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise CorruptDataError(name, f"{what} is not valid UTF-8") from None
    return value


def _fits(value: str) -> bool:
    try:
        return len(value.encode("utf-8")) <= KEY_BYTES_LIMIT
    except UnicodeEncodeError:
        return True  # refused as not UTF-8 next


def _plain_json(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` reads back from JSON as itself: objects with string keys, lists,
    strings, integers, finite floats, booleans and null. The range of a number is the rule of
    the commit kind that reads it (replay refuses an offset past 63 bits, for one), not of JSON."""
    cls = value.__class__
    if cls is str or cls is bool or cls is int or value is None:
        return True
    if cls is float:
        return math.isfinite(value)
    if depth > 64:
        return False
    if cls is list:
        return all(_plain_json(v, depth + 1) for v in value)
    if cls is dict:
        return all(k.__class__ is str and _plain_json(v, depth + 1) for k, v in value.items())
    return False


def _check_cleaner(name: str, cleaner: Any) -> None:
    """The rule for a ``replace`` commit's ``info["cleaner"]``: partition (decimal) -> the
    cleaner state replay stores (``checkpoint`` offset, ``last_round_ms``, ``partial``)."""
    if not isinstance(cleaner, dict):
        raise CorruptDataError(name, "malformed cleaner state: not an object")
    for p, state in cleaner.items():
        if not (isinstance(p, str) and p.isascii() and p.isdigit() and int(p) < _PARTITION[1]
                and isinstance(state, dict) and isinstance(state.get("partial", False), bool)):
            raise CorruptDataError(name, f"malformed cleaner state for partition {p!r}")
        try:
            _int(name, state, "checkpoint", 0)
            _int(name, state, "last_round_ms", 0, _INT64)
        except CorruptDataError as e:
            raise CorruptDataError(name, f"malformed cleaner state for partition {p!r}: {e.reason}") from None


def _check_batch(name: str, obj: Any) -> None:
    """The rules of a batch entry's JSON object."""
    if obj.__class__ is not dict:
        raise CorruptDataError(name, "batch entry is not an object")
    _check_ints(name, obj, _BATCH_INTS)
    ts = obj.get("ts")
    if not (ts.__class__ is list and len(ts) == 2 and ts[0].__class__ is int and ts[1].__class__ is int
            and _INT64[0] <= ts[0] < _INT64[1] and _INT64[0] <= ts[1] < _INT64[1]):
        raise CorruptDataError(name, "batch entry lacks its timestamp range")
    present = obj.get("present")
    if present is not None and not isinstance(present, str):
        raise CorruptDataError(name, "batch offsets bitmap is not a string")


def _batch_from_json(name: str, obj: Any) -> BatchEntry:
    _check_batch(name, obj)
    return _batch_entry(obj)


def _batch_entry(obj: dict[str, Any]) -> BatchEntry:
    """The batch entry of an object :func:`_check_batch` accepted."""
    ts = obj["ts"]
    get = obj.get
    return BatchEntry(
        partition=obj["p"],
        location=BatchLocation(obj["pos"], obj["len"], obj["crc"], obj["n"], obj["bytes"], ts[0], ts[1],
                               get("schema", DATAFILE_VERSION)),
        producer_id=get("pid"),
        epoch=get("epoch", 0),
        base_sequence=get("seq", 0),
        base_offset=get("base"),
        last_offset=get("last"),
        present=get("present"),
        tombstone_horizon_ms=get("horizon"),
        digest=get("digest"),
    )


def file_to_json(f: FileEntry) -> dict[str, Any]:
    """A file entry as a JSON object (also used by checkpoints)."""
    return {
        "id": f.file_id, "path": f.path, "level": f.level, "size": f.size, "crc": f.crc,
        "batches": [_batch_to_json(b) for b in f.batches],
    }


def attached_bytes(name: str, data: bytes) -> memoryview:
    """The bytes a commit object ``data`` carries after its body (empty: none), which are the
    whole inline file its first added file names; ``CorruptDataError`` for a damaged commit."""
    _body, start = split_document(name, data, "commit")
    return memoryview(data)[start:]


def _check_file(name: str, obj: Any) -> None:
    """The rules of a file entry's JSON object, its batches' included."""
    if obj.__class__ is not dict or not isinstance(obj.get("id"), str) or not isinstance(obj.get("path"), str):
        raise CorruptDataError(name, "file entry lacks id or path")
    _key_string(name, obj["id"], "file id")
    _key_string(name, obj["path"], "file path")
    _check_ints(name, obj, _FILE_INTS)
    batches = obj.get("batches")
    if batches.__class__ is not list:
        raise CorruptDataError(name, "file entry lacks its batches")
    for b in batches:
        _check_batch(name, b)


def file_from_json(name: str, obj: Any) -> FileEntry:
    """The file entry of :func:`file_to_json`; raises ``CorruptDataError`` naming ``name``."""
    _check_file(name, obj)
    return FileEntry(
        file_id=obj["id"], path=obj["path"], level=obj["level"], size=obj["size"], crc=obj["crc"],
        batches=tuple(_batch_from_json(name, b) for b in obj["batches"]),
    )


def encode_commit(commit: Commit) -> bytes:
    """The bytes of ``log/<version>.json``.

    The body is checked by the very rules :func:`decode_commit` applies before it is encoded,
    so no commit is written that replay could not read: a value they refuse (a field out of its
    range, an ``info`` that is not plain JSON) is an :class:`~kvlog.errors.InvalidRecordError`.
    A commit with :attr:`Commit.attached` bytes is written in format 2, its ``add[0]`` as
    the body's ``inline`` file.
    """
    add = commit.add
    inline: dict[str, Any] | None = None
    if commit.attached is not None:
        if commit.kind != "append" or not add or add[0].size != len(commit.attached):
            raise InvalidRecordError("a commit carries the bytes of its first added file only, "
                                     "and only an append commit carries them")
        inline = file_to_json(add[0])
        del inline["path"]
        add = add[1:]
    body: dict[str, Any] = {
        "version": commit.version, "id": commit.commit_id, "ts": commit.timestamp_ms,
        "kind": commit.kind, "add": [file_to_json(f) for f in add],
        "remove": list(commit.remove), "info": commit.info,
    }
    if inline is not None:
        body["inline"] = inline
    if commit.producer_id is not None or commit.epoch is not None:
        body.update(pid=commit.producer_id, epoch=commit.epoch)
    if commit.previous_id is not None:
        body["prev"] = commit.previous_id
    try:
        _check_commit(_UNWRITTEN, body)
    except CorruptDataError as e:
        raise InvalidRecordError(f"a commit kvlog could not read back is not written: {e.reason}") from None
    return encode_document("commit", body, commit.attached)


#: The name refusals of :func:`encode_commit` are checked under.
_UNWRITTEN = "<commit being written>"


def decode_commit(name: str, data: bytes) -> Commit:
    """The commit in ``data``, verified; raises ``CorruptDataError`` naming ``name``.

    A commit carrying an inline file has it as its first added file, at path ``name``, its
    batches located in ``data`` (the attached bytes are checked against the file's CRC32C)."""
    body, start = split_document(name, data, "commit")
    commit = _commit_from_body(name, body)
    inline = body.get("inline")
    if inline is None:
        if start != len(data):
            raise CorruptDataError(name, "attached bytes without the inline file they hold")
        return commit
    size = len(data) - start
    if inline["size"] != size or crc32c(memoryview(data)[start:]) != inline["crc"]:
        raise CorruptDataError(name, "the attached inline file fails its size or checksum")
    batches = []
    for b in inline["batches"]:
        if b["pos"] + b["len"] > size:
            raise CorruptDataError(name, "an inline batch lies outside the attached bytes")
        batches.append(_batch_entry(dict(b, pos=b["pos"] + start)))
    entry = FileEntry(inline["id"], name, inline["level"], size, inline["crc"], tuple(batches))
    return replace(commit, add=(entry, *commit.add))


def _check_commit(name: str, body: dict[str, Any]) -> None:
    """The one set of rules a commit's fields obey, applied by the decoder to what it reads and
    by the encoder to what it is about to write (bounds that the metadata cache's keys and
    replay need: 64-bit integers, 16-bit partitions, ids and paths LMDB can key a row by)."""
    kind = body.get("kind")
    if kind not in COMMIT_KINDS:
        raise CorruptDataError(name, f"unknown commit kind {kind!r}")
    add, remove, info = body.get("add"), body.get("remove"), body.get("info")
    if add.__class__ is not list or remove.__class__ is not list or info.__class__ is not dict:
        raise CorruptDataError(name, "commit lacks add, remove or info")
    _key_string(name, body.get("id"), "the commit id")
    previous = body.get("prev")
    if previous is not None and not isinstance(previous, str):
        raise CorruptDataError(name, "malformed commit")
    _check_ints(name, body, _COMMIT_INTS)
    for r in remove:
        _key_string(name, r, "a removed file")
    for f in add:
        _check_file(name, f)
    inline = body.get("inline")
    if inline is not None:
        if kind != "append" or inline.__class__ is not dict or "path" in inline:
            raise CorruptDataError(name, "malformed inline file")
        _check_file(name, dict(inline, path=name))
    if info and not _plain_json(info):
        raise CorruptDataError(name, "info is not plain JSON (string keys, finite numbers)")
    if kind == "replace" and "cleaner" in info:
        _check_cleaner(name, info["cleaner"])


def _commit_from_body(name: str, body: dict[str, Any]) -> Commit:
    """The commit of a decoded body, once :func:`_check_commit` accepted it."""
    _check_commit(name, body)
    add = body["add"]
    return Commit(
        version=body["version"], commit_id=body["id"], timestamp_ms=body["ts"], kind=body["kind"],
        add=tuple(FileEntry(f["id"], f["path"], f["level"], f["size"], f["crc"],
                            tuple(map(_batch_entry, f["batches"]))) for f in add),
        remove=tuple(body["remove"]), producer_id=body.get("pid"), epoch=body.get("epoch"),
        info=body["info"], previous_id=body.get("prev"),
    )
