"""Opening a log: the store's identity, its metadata cache, and catching up with storage.

Opening reads (or creates) the identity document, acquires the LMDB cache, and
brings it up to date: a cache of another store is reset, one ahead of or apart
from the storage root (a root restored from an older copy) is rebuilt, one behind
the newest checkpoint reloads from it, and then every later commit is replayed.
A damaged cache is deleted and rebuilt from storage.
"""

from __future__ import annotations

import logging
import os
from hashlib import sha256
from pathlib import Path
from typing import Any

from kvlog.clock import Clock, IdSource, SystemClock, SystemIdSource
from kvlog.config import StoreConfig
from kvlog.errors import (
    ConfigError,
    CorruptDataError,
    StorageBehindError,
    StorageError,
    StoreNotFoundError,
)
from kvlog.format.checksum import crc32c
from kvlog.format.commit import Commit, decode_commit
from kvlog.format.identity import IDENTITY_NAME, Identity, decode_identity, encode_identity
from kvlog.index import check_cache_file
from kvlog.log.checkpoints import load_checkpoint, newest_checkpoint
from kvlog.log.committer import followed_by, left_behind, link_broken
from kvlog.log.log import Log
from kvlog.log.naming import commit_name
from kvlog.log.pinned_open import open_pinned
from kvlog.log.pins_named import check_name
from kvlog.meta import MetaTxn, acquire_env, reset_env
from kvlog.storage import Storage, is_local_uri, open_storage

__all__ = ["default_cache_dir", "open_log"]

log = logging.getLogger("kvlog.log")


def default_cache_dir(storage: Storage) -> Path:
    """Where the metadata cache of a store lives when no ``cache_dir`` is given."""
    from kvlog.storage.local import LocalStorage

    if isinstance(storage, LocalStorage):
        return storage.root / "cache"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvlog"
    return base / sha256(storage.uri.encode()).hexdigest()[:24]


def open_log(
    uri: str | os.PathLike[str] | Storage,
    *,
    create: bool = True,
    partitions: int | None = None,
    read_only: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    config: StoreConfig | None = None,
    clock: Clock | None = None,
    ids: IdSource | None = None,
    maintain_index: bool = True,
    checkpoint: str | None = None,
) -> Log:
    """Open (or create) the log at ``uri`` and bring its metadata cache up to date.

    ``maintain_index=False`` keeps the metadata only, leaving the key index to a bulk
    load (see ``spark_ext.rebuild_index``); such a cache is marked as having no index.
    ``checkpoint`` (with ``read_only=True``) opens the log frozen at that named checkpoint
    (:mod:`kvlog.log.pinned_open`).
    """
    if checkpoint is not None:
        if not read_only:
            raise ConfigError("checkpoint= opens a store as it was: it needs read_only=True")
        check_name(checkpoint)
    clock = clock or SystemClock()
    ids = ids or SystemIdSource()
    if isinstance(uri, Storage):
        storage, owns = uri, False
    else:
        if not read_only and not create and is_local_uri(uri):
            target = os.fspath(uri).removeprefix("file://")
            if not os.path.isdir(target):
                raise StoreNotFoundError(f"no kvlog store at {os.fspath(uri)!r}")
        if read_only and is_local_uri(uri) and not os.path.isdir(os.fspath(uri).removeprefix("file://")):
            raise StoreNotFoundError(f"no kvlog store at {os.fspath(uri)!r}")
        storage, owns = open_storage(uri, storage_options), True
    try:
        identity = _identity(storage, create and not read_only, partitions, config, clock, ids)
        cfg = config or StoreConfig()
        if cfg.partitions != identity.partitions:
            cfg = StoreConfig.from_settings(cfg, partitions=identity.partitions)
        cache = Path(cache_dir) if cache_dir else default_cache_dir(storage)
        if cache.exists() and not cache.is_dir():
            raise ConfigError(f"cache_dir {os.fspath(cache)!r} is a file, not a directory")
        env = acquire_env(cache, check_cache_file)
    except BaseException:
        if owns:
            storage.close()
        raise
    the_log = Log(storage, identity, env, cfg, clock, ids, read_only, owns, maintain_index)
    try:
        try:
            _catch_up(the_log)
        except CorruptDataError as e:
            # The cache is derived data: damaged, it is deleted and rebuilt from storage, unless
            # another user (in this process or another) still has it open.
            if e.name != env.name or not reset_env(env):
                raise
            log.warning("metadata cache at %s was damaged (%s): rebuilt from storage", env.path, e.reason)
            the_log.index.reopened()
            _catch_up(the_log)
        except StorageBehindError:
            # Replay met a commit that a writer behind the commit retention window put in a
            # version GC had freed, followed by the history's own: rebuilt from the newest
            # checkpoint (past both), as a fresh cache starts.
            if newest_checkpoint(the_log.storage) <= the_log.version:
                raise
            log.warning("metadata cache at %s replayed a commit outside the history (written "
                        "behind the commit retention window): rebuilt from the newest checkpoint",
                        env.path)
            _reset_cache(the_log)
            _catch_up(the_log)
    except BaseException:
        the_log.close()
        raise
    if checkpoint is None:
        return the_log
    try:
        pinned = open_pinned(the_log, checkpoint)
    except BaseException:
        the_log.close()
        raise
    pinned._owns_storage, the_log._owns_storage = the_log._owns_storage, False
    the_log.close()
    return pinned


def _identity(
    storage: Storage, create: bool, partitions: int | None, config: StoreConfig | None,
    clock: Clock, ids: IdSource,
) -> Identity:
    try:
        identity = decode_identity(storage.read(IDENTITY_NAME))
    except FileNotFoundError:
        if not create:
            raise StoreNotFoundError(f"no kvlog store at {storage.uri}") from None
        wanted = partitions if partitions is not None else (config.partitions if config else 8)
        StoreConfig(partitions=wanted)  # validates
        fresh = Identity(
            store_uuid=ids.token(16).hex(), partitions=wanted, created_ms=clock.now_ms(),
            fingerprint_seed=int.from_bytes(ids.token(8), "big"),
        )
        try:
            storage.put_if_absent(IDENTITY_NAME, encode_identity(fresh))
            return fresh
        except FileExistsError:
            identity = decode_identity(storage.read(IDENTITY_NAME))
    if partitions is not None and partitions != identity.partitions:
        raise ConfigError(
            f"partitions={partitions} but the store at {storage.uri} has {identity.partitions} partitions"
        )
    return identity


def _catch_up(the_log: Log) -> None:
    """Reset a cache of another store, reload from a checkpoint when behind it, then replay."""
    uuid = the_log.identity.store_uuid.encode()

    def check_uuid(txn: Any) -> bool:
        meta = MetaTxn(the_log.env, txn)
        current = meta.get_meta("uuid")
        if current == uuid:
            return False
        meta.clear()
        meta.put_meta("uuid", uuid)
        meta.put_meta("index_ready", b"1")
        return True

    if the_log.env.write(check_uuid):
        log.info("metadata cache at %s rebuilt for store %s", the_log.env.path, the_log.identity.store_uuid)
    if not _cache_matches_storage(the_log):
        log.warning("metadata cache at %s is ahead of or apart from the storage root %s (restored from "
                    "an older copy?): rebuilding it from storage", the_log.env.path, the_log.storage.uri)

        def reset(txn: Any) -> None:
            meta = MetaTxn(the_log.env, txn)
            producer_id = meta.get_meta("store_producer_id")
            meta.clear()
            meta.put_meta("uuid", uuid)
            meta.put_meta("index_ready", b"1")
            if producer_id is not None:
                meta.put_meta("store_producer_id", producer_id)

        the_log.env.write(reset)
    if not the_log.maintain_index:
        the_log.env.write(lambda txn: MetaTxn(the_log.env, txn).put_meta("index_ready", b"0"))
    newest = newest_checkpoint(the_log.storage)
    # Replaying what a killed writer left applies its commits' index runs without merging them:
    # reads search pending runs, and the writer's quiet spells merge them later, so reopening
    # never waits for a merge, whatever was pending.
    with the_log.settle_deferred():
        loaded = _load_checkpoint_if_behind(the_log, newest)
        if not loaded:
            the_log.refresh()
            # Replay stops at the first missing commit. Below the newest checkpoint (whose commit
            # storage holds) that is a commit GC collected while an older one stayed (a restore
            # put it back): the cache is behind, not at the head, and a write from there would
            # take a freed version that no reader starting from the checkpoint crosses.
            loaded = _load_checkpoint_if_behind(the_log, newest)
        if not loaded and the_log.maintain_index and (
                the_log.snapshot(lambda r: r.get_meta("index_ready")) == b"0"):
            # Rebuild an index marked for it at the newest version, whose live files exist (an
            # older version's may have been compacted away and deleted).
            the_log.rebuild_index()


def _load_checkpoint_if_behind(the_log: Log, newest: int) -> bool:
    """Load checkpoint ``newest`` into a cache behind it that cannot replay up to it: a fresh
    cache, or one whose next commit commit GC already deleted; whether it was loaded."""
    for attempt in range(3):
        version = the_log.version
        if not (newest > version and (version == 0 or not the_log.storage.exists(commit_name(version + 1)))):
            return False
        try:
            load_checkpoint(the_log, newest)
            return True
        except FileNotFoundError:
            # Collected between the listing and the read (a newer one was written): list again.
            if attempt == 2:
                raise StorageError(f"checkpoints of {the_log.storage.uri} keep vanishing while "
                                   "being read; try again") from None
            newest = newest_checkpoint(the_log.storage)
        except StorageBehindError:
            raise
        except CorruptDataError as e:
            # A damaged checkpoint only costs replay time while the commits it sums up remain.
            if not the_log.storage.exists(commit_name(version + 1)):
                raise
            log.warning("checkpoint %d unusable (%s): replaying the commits instead", newest, e)
            return False
    return False


def _cache_matches_storage(the_log: Log) -> bool:
    """Whether the newest commit the cache applied, and the one it applied before it, are in
    storage as they were applied.

    A cache that fell behind commit GC is fine (it catches up from a checkpoint). One whose
    commit is missing with no newer checkpoint, or whose commit differs, belongs to a history
    the storage root no longer holds; so does one whose newest commit landed after a restore
    removed the commit before it (its writer died, or could not read, before checking).
    """
    applied: tuple[int, str, int] | None = the_log.snapshot(lambda r: r.applied_commit())
    if applied is None:
        return True
    version, commit_id, crc = applied
    name = commit_name(version)
    try:
        data = the_log.storage.read(name)
    except FileNotFoundError:
        after = commit_name(version + 1)
        try:
            following = decode_commit(after, the_log.storage.read(after))
        except FileNotFoundError:
            return newest_checkpoint(the_log.storage) > version
        # The next commit decides: collected history goes on from the commit the cache applied;
        # a next commit naming another one follows a history this cache left (it applied a
        # commit that its writer took back, or the root was restored). A next commit its
        # writer left in a version GC had freed (it died before taking it back) leads nowhere.
        return following.previous_id == commit_id and not _left_in_freed_version(the_log, following)
    if crc32c(data) != crc:
        return False
    if _left_in_freed_version(the_log, decode_commit(name, data)):
        return False  # the cache applied a commit its writer wrote in a version GC had freed
    before: tuple[int, str, int] | None = the_log.snapshot(lambda r: r.applied_before())
    return before is None or before[0] != version - 1 or link_broken(the_log.storage, version, before) is None


def _left_in_freed_version(the_log: Log, commit: Commit) -> bool:
    """Whether ``commit`` lies outside the history: the commit after it names another, and
    it sits in a version commit GC freed (:func:`kvlog.log.committer.left_behind`)."""
    after = commit_name(commit.version + 1)
    if not the_log.storage.exists(after) or followed_by(the_log.storage, commit.version, commit.commit_id):
        return False
    return left_behind(the_log.storage, commit.version)


def _reset_cache(the_log: Log) -> None:
    """Empty the metadata cache (keeping the store's identity and producer id) so that the
    next catch-up loads the newest checkpoint."""
    uuid = the_log.identity.store_uuid.encode()

    def reset(txn: Any) -> None:
        meta = MetaTxn(the_log.env, txn)
        producer_id = meta.get_meta("store_producer_id")
        meta.clear()
        meta.put_meta("uuid", uuid)
        meta.put_meta("index_ready", b"1")
        if producer_id is not None:
            meta.put_meta("store_producer_id", producer_id)

    the_log.env.write(reset)
