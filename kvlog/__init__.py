"""kvlog: an embeddable key-value store whose source of truth is a compacted log.

>>> import kvlog, tempfile
>>> with kvlog.open(tempfile.mkdtemp()) as store:
...     store.put("greeting", "hello")
...     store.get("greeting")
b'hello'
"""

from __future__ import annotations

import logging
import os
from typing import Any

from kvlog.clock import Clock, IdSource, ManualClock, SeededIdSource, SystemClock, SystemIdSource
from kvlog.compaction import CompactionReport
from kvlog.config import StoreConfig
from kvlog.consumer import Consumer, GroupInfo
from kvlog.errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    CommitConflictError,
    CommitStateUnknownError,
    ConfigError,
    CorruptDataError,
    GroupNotFoundError,
    InvalidRecordError,
    KvlogError,
    MissingExtraError,
    OutOfOrderSequenceError,
    ProducerError,
    ProducerFencedError,
    ReadOnlyError,
    StorageBehindError,
    StorageError,
    StoreClosedError,
    StoreNotFoundError,
)
from kvlog.log import AppendResult, Log, Producer, Record
from kvlog.log.pins_named import Checkpoint
from kvlog.snapshot import Snapshot
from kvlog.storage import Storage
from kvlog.store import Store, WriteBatch, open_store

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "AppendResult", "Checkpoint", "CheckpointExistsError", "CheckpointNotFoundError", "Clock", "CompactionReport", "CommitConflictError", "CommitStateUnknownError", "ConfigError", "Consumer",
    "CorruptDataError", "GroupInfo", "GroupNotFoundError", "IdSource", "InvalidRecordError", "KvlogError", "Log", "ManualClock", "MissingExtraError",
    "OutOfOrderSequenceError", "Producer", "ProducerError", "ProducerFencedError", "ReadOnlyError",
    "Record", "SeededIdSource", "Snapshot", "StorageBehindError", "StorageError", "Store", "StoreClosedError", "StoreConfig",
    "StoreNotFoundError", "SystemClock", "SystemIdSource", "WriteBatch", "open", "__version__",
]


def open(  # noqa: A001 - the public name users call
    uri: str | os.PathLike[str] | Storage,
    *,
    partitions: int | None = None,
    create: bool | None = None,
    read_only: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    clock: Clock | None = None,
    config: StoreConfig | None = None,
    ids: IdSource | None = None,
    producer_id: int | None = None,
    checkpoint: str | None = None,
    on_storage_behind: str = "raise",
    **settings: Any,
) -> Store:
    """Open the store at ``uri`` (a directory, ``file:///abs/dir`` or ``s3://bucket/prefix``).

    ``partitions`` applies when the store is created (8 by default); on reopen a
    different value is a :class:`ConfigError`. By default (``create=None``) a local store
    is created only in a missing or empty directory: a directory holding other files but
    no ``kvlog.json`` is refused with :class:`StoreNotFoundError` and left untouched.
    ``create=True`` creates anywhere, also among other files; ``create=False`` never
    creates (:class:`StoreNotFoundError`). An ``s3://`` prefix is the store: it is
    created there unless ``create=False``. ``read_only=True`` opens without a producer:
    many processes may read at once. ``cache_dir`` is where the LMDB metadata
    cache lives (default: ``<dir>/cache`` for local stores, ``~/.cache/kvlog/…``
    for object stores). ``storage_options`` configure object stores
    (``endpoint_override``, ``access_key``, ``secret_key``, ``region``…).
    ``clock`` and ``ids`` inject time and randomness. Without ``producer_id``
    the handle is a producer of its own (a fresh id from ``ids``, epoch 0,
    nothing committed at open): any number of handles and processes write the
    store at once and none fences another. ``producer_id`` is a stable writer
    identity: opening with it takes the id's next epoch and fences an earlier
    holder, whose later writes raise :class:`ProducerFencedError`; give each
    concurrent writer its own. A handle never closed is flushed and closed at
    interpreter exit, or when the garbage collector frees it (with a
    ``ResourceWarning``), never by a forked child. Any :class:`StoreConfig`
    field may be given as a keyword, or a whole ``config``. ``checkpoint`` (with ``read_only=True``)
    opens the store exactly as it was at that named checkpoint (:meth:`Store.checkpoint`).

    ``on_storage_behind`` says what to do when the cache applied commits the storage root no
    longer holds (the root was restored from an older copy, or its newest commits deleted):
    ``"raise"`` (the default) raises :class:`StorageBehindError` naming them and changes
    nothing; ``"rebuild"`` accepts losing their writes and rebuilds the cache from storage.

    A URI or argument of a wrong type or value (a NUL byte, a ``file://`` URI with a host,
    query or fragment, an unknown scheme…) raises :class:`ConfigError` before anything is
    created.
    """
    return open_store(
        uri, partitions=partitions, create=create, read_only=read_only, cache_dir=cache_dir,
        storage_options=storage_options, clock=clock, config=config, ids=ids,
        producer_id=producer_id, checkpoint=checkpoint, on_storage_behind=on_storage_behind, **settings,
    )
