"""Opening a store at a named checkpoint: a read-only log frozen at the pinned version.

The pinned version gets a metadata cache of its own (next to the store's, under
``<cache>-checkpoints/<version>``): the metadata checkpoint written when the checkpoint was
created (kept by GC while it exists) is loaded there, with the commit at that version as the
pin records it (GC does not keep that commit), and the key index is rebuilt from the
data files the checkpoint keeps (not when the store is opened with ``maintain_index=False``,
as the Spark driver does to list batches: the metadata alone is loaded then). That log never
applies later commits, so every read (get, scan, len, changes, offsets) answers as the store
was at that version. A cache already loaded for that version (and the same commit there) is
reused, and openers load it one at a time (a lock file beside it), so none empties it under
another's reads; the caches of deleted checkpoints stay until that directory is removed (they
are derived data).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvlog.errors import CheckpointNotFoundError, CorruptDataError
from kvlog.index import check_cache_file
from kvlog.log.checkpoints import load_checkpoint
from kvlog.log.log import Log
from kvlog.log.naming import checkpoint_name
from kvlog.meta import MetaTxn, NamedPin, NamedPins, acquire_env

__all__ = ["open_pinned"]

_LOADED = "pinned_version"


def open_pinned(main: Log, name: str) -> Log:
    """A read-only log of ``main``'s storage frozen at checkpoint ``name`` (``main`` is
    left open; the caller closes it). :class:`CheckpointNotFoundError` if there is none."""
    pin: NamedPin | None = main.snapshot(lambda r: NamedPins(r).get(name))
    if pin is None:
        raise CheckpointNotFoundError(f"no checkpoint named {name!r} in {main.storage.uri}")
    cache = Path(f"{main.env.path}-checkpoints") / str(pin.version)
    env = acquire_env(cache, check_cache_file)
    pinned = Log(main.storage, main.identity, env, main.config, main.clock, main.ids,
                 read_only=True, owns_storage=False, maintain_index=main.maintain_index)
    pinned.frozen_at = pin.version
    try:
        with _loading(cache):
            _load(pinned, pin)
    except BaseException:
        pinned.close()
        raise
    return pinned


@contextmanager
def _loading(cache: Path) -> Iterator[None]:
    """Hold the pinned cache's load lock (an exclusive ``flock`` on ``<cache>.lock``): a second
    opener (thread or process) waits, then finds the cache loaded, rather than emptying it
    under the first one's reads."""
    with open(f"{cache}.lock", "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _load(pinned: Log, pin: NamedPin) -> None:
    """Load the metadata checkpoint of the pinned version and rebuild the key index, unless
    this cache holds them already (for the same commit at that version: a root restored from
    another history gets a fresh load)."""
    uuid = pinned.identity.store_uuid.encode()
    version = pin.version
    marker = f"{version}:{pin.commit_id}".encode()

    def ready(r: Any) -> bool:
        return bool(r.get_meta("uuid") == uuid and r.get_meta(_LOADED) == marker
                    and (r.get_meta("index_ready") == b"1" or not pinned.maintain_index)
                    and r.version() == version)

    if pinned.snapshot(ready):
        return

    def start(txn: Any) -> None:
        meta = MetaTxn(pinned.env, txn)
        meta.clear()
        meta.put_meta("uuid", uuid)

    pinned.env.write(start)
    try:
        # The frozen log applies no later commit; the commit at the version comes from the pin.
        load_checkpoint(pinned, version, (pin.commit_id, pin.commit_crc))
    except FileNotFoundError as e:  # deleted by hand, or by a GC that did not know the pin
        raise CorruptDataError(checkpoint_name(version), "a file the named checkpoint keeps is "
                               f"missing: {e.filename or e}") from None
    pinned.env.write(lambda txn: MetaTxn(pinned.env, txn).put_meta(_LOADED, marker))
