"""Opening a log: the store's identity, its metadata cache, and catching up with storage.

Opening reads (or creates) the identity document, acquires the LMDB cache, and
brings it up to date: a cache of another store is reset, an empty one loads the
newest checkpoint, and every later commit up to the head is replayed; a cache
ahead of or apart from the storage root (a root restored from an older copy) is
refused with :class:`StorageBehindError` naming the lost commits (or rebuilt,
when the caller accepts the loss). A damaged cache is deleted and rebuilt from storage.
Every argument is checked before anything is created, and a local store is created
only in a missing or empty directory unless ``create=True``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import replace
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
from kvlog.format.identity import (
    IDENTITY_NAME,
    STORE_FORMAT,
    Identity,
    decode_identity,
    encode_identity,
)
from kvlog.index import check_cache_file
from kvlog.log.checkpoints import load_checkpoint, newest_checkpoint, survey
from kvlog.log.committer import REBUILD_REOPEN
from kvlog.log.head import hole_text
from kvlog.log.log import Log
from kvlog.log.naming import LOG_PREFIX, commit_name
from kvlog.log.pinned_open import open_pinned
from kvlog.log.pins_named import check_name
from kvlog.meta import MetaTxn, acquire_env, reset_env
from kvlog.storage import Storage, StoreLocation, open_storage, parse_store_uri
from kvlog.storage.local import is_temporary
from kvlog.storage.uri import check_location_text

__all__ = ["default_cache_dir", "open_log", "check_open_arguments", "ON_STORAGE_BEHIND", "REBUILD_HINT", "CREATE_HINT"]

log = logging.getLogger("kvlog.log")


def default_cache_dir(storage: Storage) -> Path:
    """Where the metadata cache of a store lives when no ``cache_dir`` is given."""
    from kvlog.storage.local import LocalStorage

    if isinstance(storage, LocalStorage):
        return storage.root / "cache"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvlog"
    return base / sha256(storage.uri.encode()).hexdigest()[:24]


#: The values of ``on_storage_behind``: what opening does with a cache of commits storage lost.
ON_STORAGE_BEHIND = ("raise", "rebuild")

#: How a caller of :func:`open_log` accepts losing the commits a :class:`StorageBehindError` names.
REBUILD_HINT = 'pass on_storage_behind="rebuild" to rebuild the cache from storage without them'

#: How a caller creates a store in a directory that holds other files.
CREATE_HINT = "pass create=True to make a store there"


def open_log(
    uri: str | os.PathLike[str] | Storage,
    *,
    create: bool | None = None,
    partitions: int | None = None,
    read_only: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    config: StoreConfig | None = None,
    clock: Clock | None = None,
    ids: IdSource | None = None,
    maintain_index: bool = True,
    checkpoint: str | None = None,
    on_storage_behind: str = "raise",
) -> Log:
    """Open (or create) the log at ``uri`` and bring its metadata cache up to date.

    ``create`` None creates a local store only in a missing or empty directory, True anywhere
    (also among other files), False never (:class:`StoreNotFoundError`); an object-store prefix
    is the store, created unless ``create=False``. Every argument is checked, and the URI parsed
    (:func:`~kvlog.storage.uri.parse_store_uri`), before anything is created.
    ``on_storage_behind``: ``"raise"`` refuses a cache that applied commits storage no longer
    holds (a root restored from an older copy) with :class:`StorageBehindError`; ``"rebuild"``
    rebuilds the cache from storage, losing those commits.
    ``maintain_index=False`` keeps the metadata only, leaving the key index to a bulk
    load (see ``spark_ext.rebuild_index``); such a cache is marked as having no index.
    ``checkpoint`` (with ``read_only=True``) opens the log frozen at that named checkpoint
    (:mod:`kvlog.log.pinned_open`).
    """
    location = check_open_arguments(
        uri, create=create, partitions=partitions, read_only=read_only, cache_dir=cache_dir,
        storage_options=storage_options, config=config, clock=clock, ids=ids,
        maintain_index=maintain_index, checkpoint=checkpoint, on_storage_behind=on_storage_behind,
    )
    clock = clock or SystemClock()
    ids = ids or SystemIdSource()
    if isinstance(uri, Storage):
        storage, owns = uri, False
    else:
        assert location is not None
        _check_location(location, create, read_only)
        storage, owns = open_storage(uri, storage_options), True
    try:
        identity = _identity(storage, create is not False and not read_only, partitions, config, clock, ids)
        if not read_only and identity.format_version < STORE_FORMAT:
            identity = _upgrade(storage, identity)
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
            _catch_up(the_log, on_storage_behind)
        except CorruptDataError as e:
            # The cache is derived data: damaged, it is deleted and rebuilt from storage, unless
            # another user (in this process or another) still has it open.
            if e.name != env.name or not reset_env(env):
                raise
            log.warning("metadata cache at %s was damaged (%s): rebuilt from storage", env.path, e.reason)
            the_log.index.reopened()
            _catch_up(the_log, on_storage_behind)
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


def check_open_arguments(
    uri: object, *, create: object, partitions: object, read_only: object, cache_dir: object,
    storage_options: object, config: object, clock: object, ids: object, maintain_index: object,
    checkpoint: object, on_storage_behind: object,
) -> StoreLocation | None:
    """The location ``uri`` names (None for a :class:`Storage` given as is), once every argument
    of :func:`open_log` is of a type and value it takes; else a :class:`ConfigError` (or the
    :class:`InvalidRecordError` of a checkpoint name), raised before anything is created."""
    location = None if isinstance(uri, Storage) else parse_store_uri(uri)
    for name, value in (("create", create), ("read_only", read_only), ("maintain_index", maintain_index)):
        if not isinstance(value, bool) and not (name == "create" and value is None):
            allowed = "True, False or None" if name == "create" else "True or False"
            raise ConfigError(f"{name} must be {allowed}, not {value!r}")
    if partitions is not None:
        StoreConfig(partitions=partitions)  # type: ignore[arg-type]  # validates: ConfigError
    if cache_dir is not None:
        if isinstance(cache_dir, os.PathLike):
            cache_dir = os.fspath(cache_dir)
        if not isinstance(cache_dir, str):
            raise ConfigError(f"cache_dir must be a str or a path, not {type(cache_dir).__name__}")
        check_location_text(cache_dir, f"cache_dir {cache_dir!r}")
    if storage_options is not None and not (
            isinstance(storage_options, Mapping) and all(isinstance(k, str) for k in storage_options)):
        raise ConfigError(f"storage_options must be a mapping of named options, not {storage_options!r}")
    if config is not None and not isinstance(config, StoreConfig):
        raise ConfigError(f"config must be a StoreConfig, not {type(config).__name__}")
    for name, value, methods in (("clock", clock, ("now_ms", "monotonic_s")), ("ids", ids, ("token",))):
        if value is not None and not all(callable(getattr(value, m, None)) for m in methods):
            kind = "a Clock" if name == "clock" else "an IdSource"
            raise ConfigError(f"{name} must be {kind} (with {' and '.join(methods)}), not {type(value).__name__}")
    if not isinstance(on_storage_behind, str) or on_storage_behind not in ON_STORAGE_BEHIND:
        raise ConfigError(f"on_storage_behind must be one of {', '.join(map(repr, ON_STORAGE_BEHIND))}, "
                          f"not {on_storage_behind!r}")
    if checkpoint is not None:
        if not read_only:
            raise ConfigError("checkpoint= opens a store as it was: it needs read_only=True")
        check_name(checkpoint)
    return location


def _check_location(location: StoreLocation, create: bool | None, read_only: bool) -> None:
    """Refuse to open a local directory that holds no store when this open may not create one
    there: it is missing and ``create=False`` or ``read_only``, or it holds other files and
    ``create`` is not True. Object-store prefixes are the store: nothing to check."""
    directory = location.directory
    if directory is None:
        return
    uri = location.text
    try:
        if not os.path.lexists(directory):
            if create is False or read_only:
                raise StoreNotFoundError(f"no kvlog store at {uri!r}")
            return
        if not directory.is_dir():
            raise StoreNotFoundError(f"no kvlog store at {uri!r}: it is not a directory")
        if (directory / IDENTITY_NAME).exists():
            return
        if create is False or read_only:
            raise StoreNotFoundError(f"no kvlog store at {uri!r} (no {IDENTITY_NAME})")
        # A directory holding only the temporary file of another process's identity write is
        # a store being created at this instant: both opens go on, and one identity wins.
        if create is None and any(not is_temporary(entry.name) for entry in directory.iterdir()):
            raise StoreNotFoundError(
                f"{uri} is not empty and is not a kvlog store (no {IDENTITY_NAME}): {CREATE_HINT}")
    except OSError as e:
        raise StorageError(f"cannot look into the store directory {uri!r}: {e}") from e


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


def _upgrade(storage: Storage, identity: Identity) -> Identity:
    """Rewrite the identity of a store of an older format with :data:`STORE_FORMAT`, before
    this writer lands a commit an older kvlog could not read (it refuses the store instead)."""
    upgraded = replace(identity, format_version=STORE_FORMAT)
    storage.put(IDENTITY_NAME, encode_identity(upgraded))
    log.info("store %s upgraded to format %d", storage.uri, STORE_FORMAT)
    return upgraded


def _catch_up(the_log: Log, on_storage_behind: str) -> None:
    """Reset a cache of another store, refuse (or with ``"rebuild"`` reset) one that applied
    commits storage no longer holds, load the newest checkpoint into an empty cache, then
    replay up to the head."""
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
    if not the_log.maintain_index:
        the_log.env.write(lambda txn: MetaTxn(the_log.env, txn).put_meta("index_ready", b"0"))
    found = survey(the_log.storage)
    if found.hole is not None:
        # Found even by a cache at the head, which replays nothing: the root was put back from an
        # older copy without its head (or commits were deleted). Nothing is changed.
        raise StorageBehindError(found.hole, hole_text(the_log.storage.uri, found.head_version))
    # Replaying what a killed writer left applies its commits' index runs without merging them:
    # reads search pending runs, and the writer's quiet spells merge them later, so reopening
    # never waits for a merge, whatever was pending.
    with the_log.settle_deferred():
        try:
            loaded = _replay(the_log, found.newest_checkpoint)
        except StorageBehindError as e:
            if on_storage_behind != "rebuild":
                reason = e.reason.removesuffix(": " + REBUILD_REOPEN)
                raise StorageBehindError(e.name, f"{reason}; nothing was changed: {REBUILD_HINT}") from None
            log.warning("metadata cache at %s is ahead of or apart from the storage root %s (%s): "
                        "rebuilding it from storage, as on_storage_behind='rebuild' asks",
                        the_log.env.path, the_log.storage.uri, e)
            _reset_cache(the_log)
            loaded = _replay(the_log)
            if not the_log.read_only:
                the_log.drop_past_head()
        if not loaded and the_log.maintain_index and (
                the_log.snapshot(lambda r: r.get_meta("index_ready")) == b"0"):
            # Rebuild an index marked for it at the newest version, whose live files exist (an
            # older version's may have been compacted away and deleted).
            the_log.rebuild_index()


def _replay(the_log: Log, newest: int | None = None) -> bool:
    """Load the newest checkpoint (``newest``, if just listed) into an empty cache, or replay
    up to the head (which catches a cache behind commit GC up from the checkpoint); whether a
    checkpoint was loaded."""
    if the_log.version == 0 and _load_checkpoint(
            the_log, newest_checkpoint(the_log.storage) if newest is None else newest):
        return True
    the_log.refresh()
    return False


def _load_checkpoint(the_log: Log, newest: int) -> bool:
    """Load checkpoint ``newest`` (0: none) into the empty cache; whether it was loaded."""
    for attempt in range(3):
        if newest == 0:
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
            latest = newest_checkpoint(the_log.storage)
            if latest > newest and attempt < 2:
                # Its commit was collected under a newer checkpoint meanwhile: load that one.
                newest = latest
                continue
            # A damaged checkpoint only costs replay time while the commits it sums up remain
            # (commit GC may have collected some below it, and kept others that carry live files).
            names = set(the_log.storage.iter_names(LOG_PREFIX))
            if not all(commit_name(v) in names for v in range(1, newest + 1)):
                raise
            log.warning("checkpoint %d unusable (%s): replaying the commits instead", newest, e)
            _reset_cache(the_log)
            return False
    return False


def _reset_cache(the_log: Log) -> None:
    """Empty the metadata cache (keeping the store's identity) so that the next catch-up loads
    the newest checkpoint and replays from there, as a fresh cache does."""
    uuid = the_log.identity.store_uuid.encode()

    def reset(txn: Any) -> None:
        meta = MetaTxn(the_log.env, txn)
        meta.clear()
        meta.put_meta("uuid", uuid)
        meta.put_meta("index_ready", b"1")

    the_log.env.write(reset)
