"""Bytes a store takes, split by what holds them: live data files, replaced files waiting out
their delete delay, files nothing references, commits, and the metadata cache.

A commit that carries a live inline file counts as a data file (with its whole size), one
whose inline file was replaced as awaiting deletion. Store files are counted by their object sizes (one listing of ``data/`` and one of ``log/``:
what an object store bills, and within a few KiB what a local disk gives them); the cache
directory by its allocated blocks, because its LMDB data file is sparse and its apparent size
is the map size, not the disk it takes. The cache's share is split further by the pages of its
data file (:meth:`kvlog.meta.env.LmdbEnv.page_bytes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlog.format.identity import IDENTITY_NAME
from kvlog.log.naming import DATA_PREFIX, LOG_PREFIX

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["disk_usage"]


def disk_usage(the_log: Log) -> dict[str, int]:
    """The bytes of the store of ``the_log`` and of its cache (see the module docstring):

    ``data_files`` (live data files, and the commits that carry a live inline file, whole),
    ``awaiting_deletion`` (files replaced by compaction,
    deleted by GC once ``file_delete_delay_ms`` has passed and no read view of this process
    needs them), ``unreferenced`` (data files no commit made live: a commit in flight, or left
    by a crash; GC condemns them after the delay), ``log`` (commits, checkpoints and the
    identity file), ``cache`` (the metadata cache's files) and its pages ``cache_index``,
    ``cache_runs``, ``cache_catalog``, ``cache_free``, and ``total`` (the five first added up)."""
    live, pending = the_log.snapshot(
        lambda r: ({e.path for _fid, e in r.iter_files()}, {path for path, _due in r.iter_pending()}))
    out = {"data_files": 0, "awaiting_deletion": 0, "unreferenced": 0, "log": 0}
    storage = the_log.storage
    for info in storage.list(DATA_PREFIX):
        kind = "data_files" if info.name in live else "awaiting_deletion" if info.name in pending else "unreferenced"
        out[kind] += info.size
    for info in storage.list(LOG_PREFIX):
        kind = "data_files" if info.name in live else "awaiting_deletion" if info.name in pending else "log"
        out[kind] += info.size
    try:
        out["log"] += storage.stat(IDENTITY_NAME).size
    except FileNotFoundError:
        pass  # a store being created
    env = the_log.env
    out["cache"] = env.files_bytes()
    out["total"] = sum(out.values())
    for part, size in env.page_bytes().items():
        out[f"cache_{part}"] = size
    return out
