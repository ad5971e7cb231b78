"""Checkpoints: the whole metadata at one version, so openers need not replay every commit.

``log/<v>.checkpoint.json`` holds the catalog (live files and batches, partition
ends, producers, pending and condemned paths, cleaner state, consumer groups' committed
offsets, named checkpoints) as the cache had it
after applying commit ``v``, and the id of that commit. A checkpoint is written
after its commit, by a cache that applied only published commits; an opener
passes over a checkpoint whose commit is missing or another one (it describes a
history the root no longer holds, and a checkpoint of the history that follows
replaces it). The key index is never checkpointed: it is rebuilt from the live
data at the newest version.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvlog.errors import CorruptDataError, KvlogError
from kvlog.format.checksum import crc32c
from kvlog.format.commit import decode_commit
from kvlog.format.envelope import decode_document, envelope
from kvlog.format.producer_state import producer_from_json, producer_to_json
from kvlog.log.head import Head, head_files_present, read_head
from kvlog.log.naming import LOG_PREFIX, checkpoint_name, commit_name, parse_log_name
from kvlog.meta import (
    CleanerState,
    EncodedRow,
    GroupOffsets,
    GroupState,
    LiveBatch,
    LiveFile,
    MetaReader,
    MetaTxn,
    NamedPin,
    NamedPins,
    batch_key,
    encoded_json,
)
from kvlog.storage import Storage

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["Survey", "load_checkpoint", "maybe_checkpoint", "newest_checkpoint", "survey", "write_checkpoint"]

log = logging.getLogger("kvlog.log")

#: A string as JSON (as ``json.dumps`` writes it).
_json_string = json.encoder.encode_basestring_ascii

#: Rows of the ``files`` and ``batches`` tables a log remembers from one checkpoint to the next
#: (at most this many of each), so that a row unchanged since is not decoded again.
REMEMBER_ROWS = 1 << 14


def maybe_checkpoint(the_log: Log, applied: int | None = None) -> None:
    """Write a checkpoint when ``checkpoint_interval`` commits were applied since the last one
    (``applied``: the version just applied, if known; while it is too close to the last
    checkpoint seen, the cache is not read)."""
    interval = the_log.config.checkpoint_interval
    if applied is not None and applied - the_log.checkpoint_seen < interval:
        return
    last, version = the_log.snapshot(lambda r: (r.get_meta("checkpoint_version"), r.version()))
    last_version = the_log.checkpoint_seen = int(last) if last else 0
    if version - last_version >= interval:
        try:
            write_checkpoint(the_log)
        except KvlogError as e:
            # The commit that triggered it is durable and applied: a checkpoint only saves
            # later openers replay time, and the next commit tries again.
            log.warning("could not write a checkpoint (the next commit retries): %s", e)


def write_checkpoint(the_log: Log) -> int:
    """Write the full metadata at the applied version as ``log/<version>.checkpoint.json``."""
    known = the_log.checkpoint_rows
    (body, files, batches, seen), applied = the_log.snapshot(
        lambda r: (_checkpoint_body(r, known), r.applied_commit()))
    version = int(body["version"])
    body["commit_id"] = applied[1] if applied is not None else None
    the_log.checkpoint_rows = seen
    the_log.storage.put(checkpoint_name(version), envelope("checkpoint", _payload(body, files, batches)))
    interval = the_log.config.checkpoint_interval

    def record(txn: Any) -> None:
        meta = MetaTxn(the_log.env, txn)
        meta.put_meta("checkpoint_version", str(version).encode())
        # Outcomes are only needed by a committer that is still waiting for its commit.
        meta.prune_outcomes(version - interval)

    the_log.env.write(record)
    the_log.checkpoint_seen = max(the_log.checkpoint_seen, version)
    return version


def load_checkpoint(the_log: Log, version: int, head: tuple[str, int] | None = None) -> None:
    """Replace the metadata cache with checkpoint ``version``, replay the commits after it,
    then rebuild the key index from the live data.

    The index is rebuilt at the newest version, never at the checkpoint's: files live at
    an old checkpoint may have been replaced and deleted since. ``head``: the id and CRC32C of
    the commit at ``version`` when the caller knows them (a named checkpoint, whose commit GC
    may have collected); else that commit is read from storage.
    """
    name = checkpoint_name(version)
    body = decode_document(name, the_log.storage.read(name), "checkpoint")
    if head is None:
        head = _checkpoint_commit(the_log.storage, version, body)
    elif body.get("commit_id") not in (None, head[0]):
        raise CorruptDataError(name, f"describes another commit than {head[0]} at version {version}")
    if head is None:
        raise CorruptDataError(name, f"its commit {commit_name(version)} is missing or another "
                               "commit: a checkpoint of a history the root no longer holds")

    def load(txn: Any) -> None:
        meta = MetaTxn(the_log.env, txn)
        uuid = meta.get_meta("uuid")
        meta.clear()
        if uuid is not None:
            meta.put_meta("uuid", uuid)
        _load_checkpoint_body(meta, name, body)
        meta.set_applied_commit(version, head[0], head[1])  # later commits' ``prev`` is checked
        meta.put_meta("index_ready", b"0")

    the_log.env.write(load)
    the_log.refresh()  # indexes nothing while the index is marked not ready
    if the_log.maintain_index:
        the_log.rebuild_index()


def newest_checkpoint(storage: Storage) -> int:
    """The version of the newest checkpoint in ``storage`` at or below the head whose commit is
    present (0: none).

    A checkpoint is written after its commit, and commit GC keeps the newest checkpoint's
    commit, so a checkpoint without its commit, or past the head, describes a history the root
    no longer holds (written by a cache that was ahead of a restored root): it is passed over.
    """
    return _listed(storage)[0]


@dataclass(frozen=True)
class Survey:
    """What one listing of ``log/`` tells an opener about the history storage holds."""

    #: The newest checkpoint at or below the head whose commit is present (0: none).
    newest_checkpoint: int
    #: The head's version.
    head_version: int
    #: The first commit missing between the newest checkpoint (or the first commit) and the
    #: head, which a root restored without its head lacks (None: the history is whole).
    hole: str | None


def survey(storage: Storage) -> Survey:
    """The newest checkpoint and the first commit missing below the head, if any.

    The head's own commit may miss its copy: the head holds its bytes, and a writer puts the
    copy back, unless a data file it adds is missing too. Commit GC writes a checkpoint
    before it deletes the commits below it, so a commit missing from one listing is looked
    for in a second listing, which shows that checkpoint if GC was at work in between.
    """
    found = Survey(0, 0, None)
    for _listing in range(2):
        newest, names, head = _listed(storage)
        missing = next((v for v in range(max(newest, 1), head.version) if commit_name(v) not in names), 0)
        if not missing and head.version and head.name not in names and not head_files_present(storage, head):
            missing = head.version
        found = Survey(newest, head.version, commit_name(missing) if missing else None)
        if not missing:
            break
    return found


def _listed(storage: Storage) -> tuple[int, set[str], Head]:
    """The head read, then one listing of ``log/``: the newest checkpoint at or below the head
    whose commit is present (0: none), the names listed, and the head."""
    head = read_head(storage)  # first: every commit below it was in place before it
    names = {info.name for info in storage.list(LOG_PREFIX)}
    versions = sorted((parsed[0] for parsed in map(parse_log_name, names)
                       if parsed and parsed[1] == "checkpoint" and parsed[0] <= head.version), reverse=True)
    newest = next((v for v in versions if commit_name(v) in names), 0)
    return newest, names, head


def _checkpoint_body(r: MetaReader, known: dict[str, dict[bytes, EncodedRow]]) -> tuple[
        dict[str, Any], bytes, bytes, dict[str, dict[bytes, EncodedRow]]]:
    """The checkpoint body at ``r``'s version: its small members, its ``files`` object and
    ``batches`` array as JSON, and the rows of those tables to remember for the next one.

    ``known``: rows remembered at the last checkpoint; a row whose stored bytes are unchanged
    is not decoded again. The batches are those the live files list, in their order.
    """
    stored = r.encoded_rows("batches", known.get("batches", {}))
    live = r.encoded_rows("files", known.get("files", {}))
    files: list[bytes] = []
    batches: list[bytes] = []
    for key, row in live.items():
        files.append(b"%s:%s" % (_json_string(key.decode()).encode(), encoded_json(row)))
        for p, last in row[2]:
            found = stored.get(batch_key(p, last))
            if found is not None:
                if found[2] <= last:  # the batch holds offset ``last``
                    batches.append(encoded_json(found))
                continue
            batch = r.find_batch(p, last)  # no batch ends at ``last``: the one that holds it
            if batch is not None:
                batches.append(json.dumps(batch.to_json(), separators=(",", ":"), sort_keys=True).encode())
    seen = {name: rows if len(rows) <= REMEMBER_ROWS else dict(itertools.islice(rows.items(), REMEMBER_ROWS))
            for name, rows in (("files", live), ("batches", stored))}
    small = {
        "version": r.version(),
        "last_commit_ms": r.last_commit_ms(),
        "parts": {str(p): {"end": end} for p, end in r.iter_partitions()},
        "producers": [producer_to_json(s) for s in r.iter_producers()],
        "pending": dict(r.iter_pending()),
        "condemned": dict(r.iter_condemned()),
        "cleaner": {str(p): state.to_json() for p, state in r.iter_cleaner()},
        "offsets": [[g, p, o] for g, p, o in GroupOffsets(r).every()],
        "groups": {g: state.to_json() for g, state in GroupOffsets(r).states().items()},
        "holds_changed": GroupOffsets(r).holds_changed(),
        "pins": {pin.name: pin.to_json() for pin in NamedPins(r).every()},
    }
    return small, b"{" + b",".join(files) + b"}", b"[" + b",".join(batches) + b"]", seen


def _payload(small: dict[str, Any], files: bytes, batches: bytes) -> bytes:
    """The checkpoint body's JSON: one object with sorted members, ``small``'s encoded as
    :func:`~kvlog.format.envelope.encode_document` encodes them, and ``files`` and ``batches``
    (JSON already, encoded the same way) as the members of those names: the bytes
    ``encode_document`` gives for the whole body."""
    members = {name: json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
               for name, value in small.items()}
    members["files"] = files
    members["batches"] = batches
    return b"{" + b",".join(json.dumps(name).encode() + b":" + members[name] for name in sorted(members)) + b"}"


def _load_checkpoint_body(meta: MetaTxn, name: str, body: dict[str, Any]) -> None:
    try:
        for fid, entry in body["files"].items():
            meta.put_file(fid, LiveFile.from_json(entry))
        for b in body["batches"]:
            meta.put_batch(LiveBatch.from_json(b))
        for p, info in body["parts"].items():
            meta.put_partition_end(int(p), int(info["end"]))
        for p, state in body["cleaner"].items():
            meta.put_cleaner(int(p), CleanerState.from_json(state))
        for obj in body["producers"]:
            meta.put_producer(producer_from_json(obj))
        for path, due in body["pending"].items():
            meta.put_pending(path, int(due))
        for path, at in body.get("condemned", {}).items():
            meta.put_condemned(path, int(at))
        offsets = GroupOffsets(meta)
        for group, p, offset in body.get("offsets", []):
            offsets.put(str(group), int(p), int(offset))
        for group, state in body.get("groups", {}).items():
            offsets.put_state(str(group), GroupState.from_json(state))
        if body.get("holds_changed"):
            offsets.set_holds_changed(int(body["holds_changed"]))
        pins = NamedPins(meta)
        for pin_name, pin in body.get("pins", {}).items():
            pins.put(NamedPin.from_json(str(pin_name), pin))
        meta.set_version(int(body["version"]))
        meta.set_last_commit_ms(int(body["last_commit_ms"]))
        meta.put_meta("checkpoint_version", str(int(body["version"])).encode())
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise CorruptDataError(name, f"malformed checkpoint ({e!r})") from None


def _checkpoint_commit(storage: Storage, version: int, body: dict[str, Any]) -> tuple[str, int] | None:
    """``(id, CRC32C)`` of the commit storage holds at ``version``, if checkpoint ``version``
    describes it (None: that commit is missing or another one)."""
    name = commit_name(version)
    try:
        data = storage.read(name)
    except FileNotFoundError:
        return None
    commit_id = decode_commit(name, data).commit_id
    recorded = body.get("commit_id")
    if recorded is not None and recorded != commit_id:  # older checkpoints do not name it
        return None
    return commit_id, crc32c(data)
