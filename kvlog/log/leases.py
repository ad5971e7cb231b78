"""Read leases: the data files of one version kept from every process's GC for a while.

A read that another process's compaction and GC must not break, and that this process's
pins (:mod:`kvlog.log.pins`) cannot protect because it runs elsewhere (a Spark job's
executors read the files its driver listed), takes a lease: a named pin
(:mod:`kvlog.log.pins_named`) with an expiry time. It is committed as named checkpoints are,
by a ``pin`` commit at ``v + 1`` naming the files live at ``v`` (replay refuses it at any other
version), so every process's GC applies it before any later replace and keeps those files;
what the reader reads is listed in the same snapshot as those files. Unlike a named
checkpoint it writes no metadata checkpoint (a lease is never opened), it is not listed among
the checkpoints, and its name (``NUL`` + ``lease-`` + a fresh id) is one no user checkpoint
can take.

Its holder releases it (an ``unpin`` commit) when the read ends. A holder that cannot say when
it ends, or that is killed, leaves it to its expiry: from ``expires_ms`` on (by the clock of
the process running GC) GC keeps none of its files and drops it with an ``unpin``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from kvlog.errors import CommitConflictError, InvalidRecordError
from kvlog.format.commit import Commit
from kvlog.log.pins_named import commit_at
from kvlog.meta import MetaReader
from kvlog.meta.named_pins import NamedPins

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["Lease", "drop_expired", "release", "take"]

_T = TypeVar("_T")

#: The first characters of every lease's name (a NUL: no checkpoint name has one).
PREFIX = "\x00lease-"


@dataclass(frozen=True)
class Lease:
    """A lease held on the files live at ``version`` until ``expires_ms`` (or its release)."""

    name: str
    version: int
    expires_ms: int


class _Moved(Exception):
    """A commit landed between the snapshot and the lease's version: take it again."""


def take(the_log: Log, ttl_ms: int, listing: Callable[[MetaReader], _T]) -> tuple[Lease, _T]:
    """Lease the files live at the newest version for ``ttl_ms`` and return the lease with
    ``listing`` applied to the snapshot of that version (what the reader will read: only files
    the lease keeps)."""
    if not isinstance(ttl_ms, int) or isinstance(ttl_ms, bool) or ttl_ms <= 0:
        raise InvalidRecordError(f"a lease lasts a positive number of milliseconds, not {ttl_ms!r}")
    name = PREFIX + the_log.new_id()
    for _attempt in range(the_log.config.commit_retries):
        version = the_log.refresh()
        listed: list[_T] = []
        expires: list[int] = []

        def build(next_version: int, version: int = version, listed: list[_T] = listed,
                  expires: list[int] = expires) -> Commit:
            def at(r: MetaReader) -> tuple[int, tuple[int, str, int] | None, list[str], _T]:
                return (r.version(), r.applied_commit(), sorted(e.path for _fid, e in r.iter_files()),
                        listing(r))

            now, head, paths, found = the_log.snapshot(at)
            if next_version != version + 1 or now != version:
                raise _Moved
            if head is None or head[0] != version:
                head = commit_at(the_log, version)
            listed[:] = [found]
            now_ms = the_log.clock.now_ms()
            expires[:] = [now_ms + ttl_ms]
            info = {"name": name, "version": version, "commit_id": head[1], "commit_crc": head[2],
                    "paths": paths, "expires_ms": expires[0]}
            return Commit(next_version, the_log.new_id(), now_ms, "pin", info=info)

        try:
            outcome = the_log.commit(build)
        except _Moved:
            continue
        if outcome.refusal is None:
            return Lease(name, version, expires[0]), listed[0]
    raise CommitConflictError("other writers kept committing while a read lease was taken; retry")


def release(the_log: Log, name: str) -> None:
    """Release the lease ``name`` (nothing when it expired and GC dropped it already)."""
    def build(version: int) -> Commit:
        return Commit(version, the_log.new_id(), the_log.clock.now_ms(), "unpin", info={"name": name})

    the_log.refresh()
    if the_log.snapshot(lambda r: NamedPins(r).get(name)) is not None:
        the_log.commit(build)  # refused only when released meanwhile: nothing left to do


def drop_expired(the_log: Log, now_ms: int) -> int:
    """Release every lease expired at ``now_ms``; how many (GC calls it)."""
    expired = the_log.snapshot(lambda r: [pin.name for pin in NamedPins(r).every()
                                          if pin.expires_ms is not None and pin.expires_ms <= now_ms])
    for name in expired:
        release(the_log, name)
    return len(expired)
