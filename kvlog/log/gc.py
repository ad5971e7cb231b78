"""Garbage collection: replaced files past their delay, orphan data files, old commits.

A replaced input goes once ``file_delete_delay_ms`` has passed since its replace commit
(an inline file, with its commit, by the rules of commits).
An orphan (a file no commit made live) is a candidate once it is older than the delay
both by the clock and relative to the newest commit's storage time; candidates are first
condemned by a ``gc`` commit and only then deleted. A commit that adds a condemned file
is refused when applied, so whichever lands first wins: the file becomes live and GC
keeps it, or GC takes it and its writer learns that its commit was refused (and writes
the file again, or discards the job). No commit ever makes live a file GC deleted,
however long its writer was stalled. Commits older than the newest checkpoint by more
than ``commit_retention_ms`` (storage time) go too, unless they carry an inline file still
in use. Named checkpoints
(:mod:`kvlog.log.pins_named`) keep the files live at their version and that version's
metadata checkpoint and commit; read leases (:mod:`kvlog.log.leases`) keep the files live at
their version until they are released or expire by the clock of the process running GC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvlog.errors import ReadOnlyError, StorageBehindError
from kvlog.format.commit import Commit
from kvlog.log.leases import drop_expired
from kvlog.log.naming import DATA_PREFIX, LOG_PREFIX, commit_name, parse_log_name
from kvlog.log.pins_named import kept_log_names, pinned_paths
from kvlog.meta import MetaTxn

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["collect_garbage"]


def collect_garbage(the_log: Log, now_ms: int | None = None) -> dict[str, int]:
    """Delete what is no longer needed (see the module docstring); how many of each kind."""
    the_log.check_open()
    if the_log.read_only:
        raise ReadOnlyError("the store is open read-only")
    storage, config = the_log.storage, the_log.config
    now = the_log.clock.now_ms() if now_ms is None else now_ms
    # Deleting trusts this cache's view of what is live and what was replaced: refreshing
    # checks it against the head (a cache ahead of a restored root raises).
    version = the_log.refresh()
    deleted = {"replaced": 0, "orphans": 0, "commits": 0}
    pending = dict(the_log.snapshot(lambda r: list(r.iter_pending())))
    live_paths = set(the_log.snapshot(lambda r: [e.path for _fid, e in r.iter_files()]))
    # Read after the pending paths: a pin this cache has not applied names only files live
    # at a later version, never one pending here. A read lease expired by this clock keeps none.
    pinned = the_log.snapshot(lambda r: pinned_paths(r, now))
    waiting = set(pending)  # replaced files still pending once the due ones are gone
    for path, due in pending.items():
        # A read view of this process may still read a file replaced after its commit.
        if due <= now and path not in pinned and not the_log.pins.protects(path):  # see kvlog.log.pins
            if path.startswith(LOG_PREFIX):
                waiting.discard(path)  # an inline file goes with its commit, by the rules below
            else:
                storage.delete(path)
                deleted["replaced"] += 1

            def forget(txn: Any, path: str = path) -> None:
                MetaTxn(the_log.env, txn).delete_pending(path)

            the_log.env.write(forget)
    # Orphans are judged by storage time, never by this process's clock alone: a file is a
    # candidate only when it is older than the delay both by our clock and relative to the
    # newest commit (the condemnation commit below is what makes deleting it safe).
    try:
        newest_commit_ms = storage.stat(commit_name(version)).mtime_ms if version else 0
    except FileNotFoundError:
        newest_commit_ms = 0
    horizon = min(now, newest_commit_ms) - config.file_delete_delay_ms
    condemned = set(the_log.snapshot(lambda r: [path for path, _at in r.iter_condemned()]))
    candidates = []
    for info in storage.list(DATA_PREFIX):
        if info.name in live_paths or info.name in pending or info.name in pinned or info.mtime_ms > horizon:
            continue
        if info.name in condemned:
            storage.delete(info.name)  # condemned earlier; its deletion did not finish
            deleted["orphans"] += 1
        else:
            candidates.append(info.name)
    if candidates:
        deleted["orphans"] += _collect_orphans(the_log, sorted(candidates))
    drop_expired(the_log, now)  # read leases whose holders never released them (kvlog.log.leases)
    entries = [(parse_log_name(i.name), i) for i in storage.list(LOG_PREFIX)]
    # Named checkpoints keep their metadata checkpoint and commit. Applying every commit
    # listed first: a pin of a version older than a listed metadata checkpoint landed before it.
    _refresh_after(the_log, deleted)
    kept = the_log.snapshot(kept_log_names)
    # Checkpoints of this cache's history only: one past its version was written by a cache of
    # a history a restore of the head removed.
    checkpoints = [v for parsed, _i in entries if parsed and parsed[1] == "checkpoint" and parsed[0] <= version
                   for v in [parsed[0]]]
    if checkpoints:
        newest = max(checkpoints)
        newest_info = next(i for parsed, i in entries if parsed == (newest, "checkpoint"))
        horizon = newest_info.mtime_ms - config.commit_retention_ms
        named = sorted(((parsed, info) for parsed, info in entries if parsed is not None), key=lambda e: e[0])
        # A commit that carries an inline file stays while the file is live, replaced but not
        # yet due, or read by a view (the compactor moves inline files into data files).
        in_use = live_paths | waiting | pinned
        for (at, kind), info in named:
            # Below the newest checkpoint only (whose own commit stays: an opener reads it), and
            # in any order: a cache that needs a collected commit catches up from the checkpoint.
            # No writer ever writes a freed name again: names are written after a swap of the head.
            due = at < newest and info.mtime_ms < horizon and info.name not in kept
            if kind == "commit":
                # Only commits this cache applied: it knows which of those carry a live file.
                due = due and at <= version and info.name not in in_use and not the_log.pins.protects(info.name)
            if due:
                storage.delete(info.name)
                deleted["commits"] += 1
    if deleted["commits"]:
        _refresh_after(the_log, deleted)
    return deleted


def _refresh_after(the_log: Log, deleted: dict[str, int]) -> int:
    """Refresh, after deleting what ``deleted`` counts: a root put back from an older copy
    between the refresh that decided those deletions and the deletions themselves may have
    lost objects the copy brought back (nothing makes a delete conditional on the head)."""
    try:
        return the_log.refresh()
    except StorageBehindError as e:
        if not any(deleted.values()):
            raise
        raise StorageBehindError(
            e.name, f"{e.reason}; garbage collection was deleting replaced files, orphans or old commits while "
            "the root was put back, and may have deleted objects of the copy: stop the writers "
            "and put the copy back again") from e


def _collect_orphans(the_log: Log, paths: list[str]) -> int:
    """Condemn ``paths`` with a ``gc`` commit, then delete the ones it condemned."""
    commit_id = the_log.new_id()

    def build(version: int) -> Commit:
        # Condemned paths are remembered for good (a few dozen bytes each, for files only a
        # crash leaves behind): a commit adding one is refused however late it comes.
        return Commit(version, commit_id, the_log.clock.now_ms(), "gc", remove=tuple(paths))

    outcome = the_log.commit(build)
    for path in outcome.condemned:
        the_log.storage.delete(path)
    return len(outcome.condemned)
