"""The head: the one object whose conditional swap makes a commit live, and the one history check.

``log/head.json`` holds the bytes of the newest commit. A writer whose cache applied the
head publishes the next commit by swapping the head, conditional on the version of it the
writer read (:meth:`kvlog.storage.Storage.swap`: S3 ``If-Match``, a lock and a rename on a
local root); the swap leaves a copy at the commit's own name, ``log/<version>.json``,
which is where readers read commits and inline files. So:

* two writers racing for a version: one swap succeeds, the other is refused and applies
  the winner's commit before it tries again;
* a writer whose cache is behind (stalled, paused past commit GC, on a root restored from
  an older copy) holds a stale version of the head: its swap is refused, always, whatever
  names GC freed meanwhile, because commit names are only ever written after a swap;
* a lost answer is settled by reading the head (and, once it moved on, the copy);
* a cache checks the history it applied against the head (:func:`storage_behind`): a head
  older than the cache, or another commit at the cache's version, is a restore; the commits
  between the cache and the head must each name the one before (``prev``).

A store written before heads existed (format 1) has none: its newest commit is found by
listing, and the first writer's swap, conditional on the head being absent, creates it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlog.errors import CorruptDataError
from kvlog.format.checksum import crc32c
from kvlog.format.commit import decode_commit
from kvlog.format.envelope import split_document
from kvlog.log.naming import LOG_PREFIX, commit_name, parse_log_name
from kvlog.storage import Storage

__all__ = ["HEAD_NAME", "Head", "head_files_present", "hole_text", "read_head", "storage_behind"]

#: The name of the head object.
HEAD_NAME = f"{LOG_PREFIX}head.json"


@dataclass(frozen=True)
class Head:
    """The newest commit as the head holds it."""

    #: Its version (0: nothing committed yet).
    version: int
    #: Its id (None at version 0).
    commit_id: str | None
    #: The CRC32C of its bytes (what a cache remembers of the commit it applied).
    crc: int
    #: The storage version of the head object, for the next swap (None: there is no head
    #: object, in an empty store or one of format 1).
    token: str | None
    #: Its bytes (those of ``log/<version>.json`` too).
    data: bytes

    @property
    def name(self) -> str:
        """The commit's own name, ``log/<version>.json``."""
        return commit_name(self.version)


#: The head of a store with no commit.
EMPTY = Head(0, None, 0, None, b"")


def read_head(storage: Storage, known: Head | None = None) -> Head:
    """The head of ``storage`` (one read; a store without a head object is listed). ``known``:
    a head read earlier, returned as it is while the head object is still that version (on
    an object store the read then carries no body)."""
    unless = known.token if known is not None else None
    try:
        found = storage.read_versioned(HEAD_NAME, unless)
    except FileNotFoundError:
        return _listed_head(storage)
    if found is None:
        assert known is not None
        return known
    data, token = found
    body, _start = split_document(HEAD_NAME, data, "commit")
    version = body.get("version")
    if version.__class__ is not int or version < 1:
        raise CorruptDataError(HEAD_NAME, f"holds no commit version ({version!r})")
    # A commit the head holds is named by its own name when it is malformed, as where readers read it.
    commit = decode_commit(commit_name(version), data)
    return Head(commit.version, commit.commit_id, crc32c(data), token, data)


def _listed_head(storage: Storage) -> Head:
    """The newest commit of a store without a head object (format 1, or empty)."""
    versions = [parsed[0] for parsed in map(parse_log_name, storage.iter_names(LOG_PREFIX))
                if parsed is not None and parsed[1] == "commit"]
    for version in sorted(versions, reverse=True):
        name = commit_name(version)
        try:
            data = storage.read(name)
        except FileNotFoundError:
            continue  # collected since the listing
        return Head(version, decode_commit(name, data).commit_id, crc32c(data), None, data)
    return EMPTY


def storage_behind(applied: tuple[int, str, int] | None, head: Head, uri: str) -> tuple[str, str] | None:
    """What is wrong when a cache that applied commit ``applied`` (version, id, CRC32C) is not
    on the history ``head`` ends: (the first lost commit's name, what happened), or None.

    Only two things say so, and both are facts about the head: it is older than the cache (the
    commits after it, which the cache applied, are lost), or it is at the cache's version and
    another commit. A head further on is checked commit by commit as the cache replays up to
    it: each must name the one before (:meth:`kvlog.log.committer.Committer.apply_landed`).
    """
    if applied is None:
        return None
    version = applied[0]
    if head.version < version:
        lost = list(range(head.version + 1, version + 1))
        are, they = ("is", "it holds") if len(lost) == 1 else ("are", "they hold")
        return commit_name(lost[0]), (
            f"{_versions_text(lost)}, which the cache applied, {are} missing from the storage root "
            f"{uri}, whose newest commit is version {head.version} (restored from an older copy, "
            f"or deleted): the writes {they} are lost")
    if head.version == version and head.crc != applied[2]:
        return head.name, (
            f"commit {head.name} in {uri} differs from the commit the cache applied at that version "
            "(restored from an older copy, or replaced): the writes of the cache's commit are lost")
    return None


def head_files_present(storage: Storage, head: Head) -> bool:
    """Whether the data files the head's commit adds are in storage (its inline file is in the
    head itself): so a missing copy of the head's commit can be put back from the head."""
    commit = decode_commit(head.name, head.data)
    return all(storage.exists(file.path) for file in commit.add if file.path != head.name)


def hole_text(uri: str, head_version: int) -> str:
    """What a commit missing below the head (and above every checkpoint) says happened, and
    what repairs it: no cache can be rebuilt over the hole, and nothing in kvlog deletes the
    commits past it, so the copy must come back whole, its head with it."""
    return (f"is missing from the storage root {uri}, below its head (version {head_version}): the "
            f"history was put back from an older copy without its head, put back while a writer's "
            f"garbage collection was deleting, or damaged: stop the writers, put back the copy "
            f"with its {HEAD_NAME}, then open with on_storage_behind='rebuild'")


def _versions_text(versions: list[int]) -> str:
    """``commit log/…01.json`` or ``commits log/…01.json to log/…04.json``."""
    if len(versions) == 1:
        return f"commit {commit_name(versions[0])}"
    return f"commits {commit_name(versions[0])} to {commit_name(versions[-1])}"
