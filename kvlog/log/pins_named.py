"""Named checkpoints: a version of the store kept whole, in every process, until deleted.

Not to be confused with the metadata checkpoints of :mod:`kvlog.log.checkpoints`
(``log/<v>.checkpoint.json``: the catalog at one version, so openers need not replay every
commit, collected as newer ones are written). A *named* checkpoint (``store.checkpoint(name)``)
pins a version: garbage collection keeps the data files live there and the metadata
checkpoint of that version, so ``kvlog.open(uri, read_only=True, checkpoint=name)``
reads the store exactly as it was.

Creating one, and why it is safe against a compaction and GC in another process:

1. write the metadata checkpoint at the applied version ``v`` (a crash after this step
   leaves an ordinary metadata checkpoint, which later GC collects);
2. commit ``pin`` naming ``v``, the id and CRC32C of commit ``v`` and the paths of the files
   live at ``v``, at version ``v + 1``. Replay refuses a pin whose version is not the commit's version minus one
   (``pin-follows-its-version``), so no commit came between: every file it names is live
   when it lands, and a file live when the pin is applied is deleted by no process's GC, which
   applies the pin before it applies any later replace. Losing the race for ``v + 1``, the
   creator starts again at the new version.

``unpin`` forgets a checkpoint; the next GC frees what only it kept.

The commit at ``v`` is *not* kept: the pin carries its id and CRC32C, which is all opening the
checkpoint needs of it. A commit kept after the ones around it were collected would stop a
cache one commit behind it at ``v`` (it replays up to the first missing commit, and finds
its head in storage), and a write from that cache would land in a freed version no reader
crosses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvlog.errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    CommitConflictError,
    CorruptDataError,
    InvalidRecordError,
)
from kvlog.format.checksum import crc32c
from kvlog.format.commit import Commit, decode_commit
from kvlog.log.checkpoints import write_checkpoint
from kvlog.log.naming import checkpoint_name, commit_name
from kvlog.meta import MetaReader, MetaTxn
from kvlog.meta.named_pins import NamedPin, NamedPins

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = [
    "Checkpoint", "NAME_BYTES_LIMIT", "apply_pin", "check_name", "commit_at", "create", "delete", "find", "kept_log_names",
    "listed", "pinned_paths",
]

#: The longest checkpoint name, in UTF-8 bytes.
NAME_BYTES_LIMIT = 255


@dataclass(frozen=True)
class Checkpoint:
    """A named checkpoint: the store as it was at ``version``, kept until deleted."""

    name: str
    version: int
    """The commit version whose state it keeps."""
    created_ms: int
    """When it was created (the pin commit's time, ms since the epoch)."""


def check_name(name: object) -> str:
    """``name`` if it is a usable checkpoint name, else :class:`InvalidRecordError`."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise InvalidRecordError(f"a checkpoint name is a non-empty str without NUL, not {name!r}")
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise InvalidRecordError("a checkpoint name must be valid UTF-8 text") from None
    if size > NAME_BYTES_LIMIT:
        raise InvalidRecordError(f"a checkpoint name holds at most {NAME_BYTES_LIMIT} bytes")
    return name


def _public(pin: NamedPin) -> Checkpoint:
    return Checkpoint(pin.name, pin.version, pin.created_ms)


class _Moved(Exception):
    """The applied version moved past the metadata checkpoint just written: start again."""


def create(the_log: Log, name: str) -> Checkpoint:
    """Pin the applied version as checkpoint ``name`` (see the module docstring)."""
    check_name(name)
    if find(the_log, name) is not None:
        raise CheckpointExistsError(f"a checkpoint named {name!r} exists already")
    commit_id = the_log.new_id()
    for _attempt in range(the_log.config.commit_retries):
        the_log.refresh()
        version = write_checkpoint(the_log)

        def live_at(r: MetaReader) -> tuple[int, tuple[int, str, int] | None, list[str]]:
            return r.version(), r.applied_commit(), sorted(entry.path for _fid, entry in r.iter_files())

        def build(next_version: int, version: int = version) -> Commit:
            at, head, paths = the_log.snapshot(live_at)
            if next_version != version + 1 or at != version:
                raise _Moved
            if head is None or head[0] != version:
                head = commit_at(the_log, version)
            info = {"name": name, "version": version, "commit_id": head[1], "commit_crc": head[2],
                    "paths": paths}
            return Commit(next_version, commit_id, the_log.clock.now_ms(), "pin", info=info)

        try:
            outcome = the_log.commit(build)
        except _Moved:
            continue
        if outcome.refusal is None:
            pin = find(the_log, name)
            assert pin is not None
            return pin
        if outcome.refusal.message.startswith("pin-name-free"):
            raise CheckpointExistsError(f"a checkpoint named {name!r} exists already")
    raise CommitConflictError(f"other writers kept committing while checkpoint {name!r} was pinned; retry")


def commit_at(the_log: Log, version: int) -> tuple[int, str, int]:
    """``(version, id, CRC32C)`` of the commit storage holds at ``version``."""
    name = commit_name(version)
    try:
        data = the_log.storage.read(name)
    except FileNotFoundError:
        raise CorruptDataError(name, "the commit a checkpoint is made at is missing") from None
    return version, decode_commit(name, data).commit_id, crc32c(data)


def delete(the_log: Log, name: str) -> None:
    """Forget checkpoint ``name`` (:class:`CheckpointNotFoundError` if there is none)."""
    check_name(name)
    the_log.refresh()
    if find(the_log, name) is None:
        raise CheckpointNotFoundError(f"no checkpoint named {name!r}")
    commit_id = the_log.new_id()

    def build(version: int) -> Commit:
        return Commit(version, commit_id, the_log.clock.now_ms(), "unpin", info={"name": name})

    outcome = the_log.commit(build)
    if outcome.refusal is not None:
        raise CheckpointNotFoundError(f"no checkpoint named {name!r} (deleted meanwhile)")


def find(the_log: Log, name: str) -> Checkpoint | None:
    """Checkpoint ``name`` in this cache, if any."""
    pin: NamedPin | None = the_log.snapshot(lambda r: NamedPins(r).get(name))
    return None if pin is None or pin.is_lease else _public(pin)


def listed(the_log: Log) -> list[Checkpoint]:
    """Every named checkpoint in this cache, by name (read leases are not checkpoints)."""
    pins: list[NamedPin] = the_log.snapshot(lambda r: list(NamedPins(r).every()))
    return [_public(pin) for pin in pins if not pin.is_lease]


def pinned_paths(r: MetaReader, now_ms: int | None = None) -> set[str]:
    """Every data file some named checkpoint or read lease keeps; given ``now_ms``, a lease
    expired at that time keeps none (``kvlog.log.leases``)."""
    return {path for pin in NamedPins(r).every()
            if now_ms is None or pin.expires_ms is None or pin.expires_ms > now_ms
            for path in pin.paths}


def kept_log_names(r: MetaReader) -> set[str]:
    """The metadata checkpoints the named checkpoints keep (one each; never their commits: see
    the module docstring). A read lease keeps none: it is never opened."""
    return {checkpoint_name(pin.version) for pin in NamedPins(r).every() if not pin.is_lease}


def apply_pin(txn: MetaTxn, commit: Commit) -> str | None:
    """Replay a ``pin`` or ``unpin`` commit; the reason it is refused, or None once applied."""
    name = commit.info.get("name")
    if not isinstance(name, str) or not name:
        return "a pin commit names its checkpoint"
    pins = NamedPins(txn)
    if commit.kind == "unpin":
        return None if pins.delete(name) else f"unpin-names-a-checkpoint: no checkpoint named {name!r}"
    try:
        pin = NamedPin.from_json(name, {**commit.info, "created_ms": commit.timestamp_ms})
    except ValueError as e:
        return str(e)
    if pins.get(name) is not None:
        return f"pin-name-free: a checkpoint named {name!r} exists already"
    if pin.version != commit.version - 1:
        return f"pin-follows-its-version: pins version {pin.version} but lands at {commit.version}"
    pins.put(pin)
    return None
