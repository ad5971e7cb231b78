"""Catching up a cache that fell behind commit GC, while it is in use.

Commit GC collects the commits below the newest checkpoint once they are older than
``commit_retention_ms``. A cache that had not applied them by then (a consumer idle for
longer, a writer paused, a process that slept) finds its next commit missing and can
never replay up to the head. It catches up the way a fresh cache starts: the newest
checkpoint is loaded, the commits after it are replayed, and the key index is rebuilt from
the live data. That happens in a cache of its own, in a directory inside the live one, and
then the live cache's tables are replaced by it in one LMDB write transaction
(:func:`kvlog.meta.transplant.transplant`): readers in this process and in every other
process sharing the cache see the old version or the new one, never an emptied key index.

How a cache tells that it fell behind: the next commit it needs, below the head, is
missing while a newer checkpoint exists (commit GC collects only below the newest
checkpoint, :meth:`kvlog.log.committer.Committer.apply_landed`).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlog.errors import CorruptDataError, StorageError
from kvlog.index import check_cache_file
from kvlog.log.checkpoints import load_checkpoint, newest_checkpoint
from kvlog.meta import MetaTxn, acquire_env, release_env
from kvlog.meta.transplant import transplant

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["ASIDE_PREFIX", "catch_up"]

log = logging.getLogger("kvlog.log")

#: The directories, inside a cache, where a catch-up builds the cache it moves in:
#: ``catch-up.<pid>.<token>``.
ASIDE_PREFIX = "catch-up."


def catch_up(the_log: Log) -> bool:
    """Bring ``the_log``'s cache to the newest checkpoint and the commits after it, built
    beside the cache and moved in whole; whether it moved forward (False: nothing newer to
    load, or another process sharing the cache caught it up first). The caller holds the
    log's apply lock."""
    storage = the_log.storage
    for _ in range(3):
        newest = newest_checkpoint(storage)
        if newest <= the_log.version:
            return False
        try:
            return _catch_up_to(the_log, newest)
        except FileNotFoundError:
            pass  # collected between the listing and the read: a newer one was written
        except CorruptDataError:
            # Its commit was collected under a newer checkpoint meanwhile: load that one.
            if newest_checkpoint(storage) <= newest:
                raise
    raise StorageError(f"checkpoints of {storage.uri} keep vanishing while this cache catches up "
                       "from them; try again")


def _catch_up_to(the_log: Log, newest: int) -> bool:
    cache = the_log.env.path
    _remove_leftovers(cache)
    path = cache / f"{ASIDE_PREFIX}{os.getpid()}.{the_log.ids.token(8).hex()}"
    env = acquire_env(path, check_cache_file)
    try:
        aside = the_log.beside(env)
    except BaseException:
        release_env(env)
        shutil.rmtree(path, ignore_errors=True)
        raise
    try:
        uuid = the_log.identity.store_uuid.encode()

        def mark(txn: Any) -> None:
            meta = MetaTxn(env, txn)
            meta.put_meta("uuid", uuid)
            meta.put_meta("index_ready", b"1")

        env.write(mark)
        load_checkpoint(aside, newest)
        reached = aside.version
        before = the_log.version
        with the_log.index.applying():
            moved = transplant(the_log.env, env, lambda meta: meta.version() < reached)
    finally:
        aside.close()  # releases the environment beside
        shutil.rmtree(path, ignore_errors=True)
    if moved:
        log.info("metadata cache at %s fell behind commit GC at version %d: caught up from "
                 "checkpoint %d to version %d", cache, before, newest, reached)
    return moved


def _remove_leftovers(cache: Path) -> None:
    """Delete the directories of catch-ups whose process is gone (killed while catching up)."""
    try:
        entries = [e for e in os.scandir(cache) if e.name.startswith(ASIDE_PREFIX) and e.is_dir()]
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(ASIDE_PREFIX):].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
