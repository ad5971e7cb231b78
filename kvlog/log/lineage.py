"""What the chain of commits in storage says about a commit a cache relied on and no longer finds.

Commit GC collects commits only below a checkpoint, oldest first, and keeps the commit right
below the newest checkpoint (:mod:`kvlog.log.gc`); every commit names the one before it (its
``prev``). So when a commit a reader or writer relied on is missing, what followed it is
usually still in storage to tell whether it was collected (its history goes on) or put out
of the history (a restore, or a version GC had freed). The committer and the opener ask.
"""

from __future__ import annotations

from kvlog.errors import CorruptDataError
from kvlog.format.checksum import crc32c
from kvlog.format.commit import decode_commit
from kvlog.log.checkpoints import newest_checkpoint
from kvlog.log.naming import commit_name
from kvlog.storage import Storage

__all__ = ["followed_by", "left_behind", "link_broken"]


def followed_by(storage: Storage, version: int, commit_id: str) -> bool:
    """Whether storage's history holds commit ``commit_id`` at ``version``, shown by the next
    commit, which names it as the commit it follows (its ``prev``).

    Commit GC collects a commit only below a checkpoint and keeps the commit right below the
    newest checkpoint (:mod:`kvlog.log.gc`), so when a commit a reader or writer relied on is
    missing, what followed it is usually still there to say whether it was collected (its
    history goes on) or put out of the history (a restore, a version GC had freed). False
    when nothing in storage names it, which decides nothing either way.
    """
    after = commit_name(version + 1)
    try:
        return decode_commit(after, storage.read(after)).previous_id == commit_id
    except FileNotFoundError:
        return False


def left_behind(storage: Storage, version: int) -> bool:
    """Whether commit ``version``, which the commit after it does not name, lies outside the
    store's history in a version commit GC freed (a writer behind the retention window wrote it
    there, and takes it back once it sees that), rather than the commit after it following a gap.

    Commit GC collects commits oldest first, only below a checkpoint: with the commit before
    ``version`` collected and a checkpoint past the next one, no reader of the history crosses
    either commit, and a cache that applied ``version`` is behind that checkpoint.
    """
    if version > 1 and storage.exists(commit_name(version - 1)):
        return False
    return newest_checkpoint(storage) > version + 1


def link_broken(storage: Storage, version: int, before: tuple[int, str, int]) -> str | None:
    """Why commit ``version - 1`` in ``storage`` is not ``before`` (the commit a cache applied
    there, its id and CRC32C), or None when it is, was collected below a checkpoint at
    ``version`` or later (commit GC removes only commits a checkpoint sums up), or is damaged
    in place (no longer a readable commit, so not one a restore put back)."""
    name = commit_name(version - 1)
    try:
        data = storage.read(name)
    except FileNotFoundError:
        if newest_checkpoint(storage) >= version:
            return None
        return "is missing from storage"
    if crc32c(data) == before[2]:
        return None
    try:
        found = decode_commit(name, data)
    except CorruptDataError:
        # Damaged in place, not replaced: a restore puts back whole commits. The cache applied it
        # intact, and a reader replaying it from storage meets the damage by name.
        return None
    if found.commit_id == before[1]:
        return None
    return "differs from the commit this cache applied at that version"
