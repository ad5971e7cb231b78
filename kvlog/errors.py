"""The one error hierarchy of kvlog.

Every error kvlog raises on purpose is a :class:`KvlogError`. The subclass
tells the caller what to do: fix the input (:class:`InvalidRecordError`,
:class:`ConfigError`), install a missing part (:class:`MissingExtraError`), retry later (:class:`StorageError`,
:class:`CommitConflictError`), find out what happened
(:class:`CommitStateUnknownError`), stop writing (:class:`ProducerFencedError`,
:class:`StoreClosedError`, :class:`ReadOnlyError`), or restore from a good copy
(:class:`CorruptDataError`). Messages are for people and are not API.

This module imports nothing from kvlog.
"""

from __future__ import annotations

__all__ = [
    "KvlogError",
    "ConfigError",
    "MissingExtraError",
    "InvalidRecordError",
    "StoreNotFoundError",
    "StoreClosedError",
    "ReadOnlyError",
    "CorruptDataError",
    "StorageBehindError",
    "ProducerError",
    "OutOfOrderSequenceError",
    "ProducerFencedError",
    "CommitConflictError",
    "CommitStateUnknownError",
    "StorageError",
    "CheckpointNotFoundError",
    "CheckpointExistsError",
    "GroupNotFoundError",
]


class KvlogError(Exception):
    """Root of every error kvlog raises on purpose."""


class ConfigError(KvlogError, ValueError):
    """A setting is unknown, out of range, or conflicts with the store on disk: fix the setting."""


class MissingExtraError(ConfigError):
    """An optional part of kvlog is not installed: the message names the extra that installs it.

    ``extra`` is the name in ``pip install 'kvlog[extra]'``, ``module`` the module that could
    not be imported, ``purpose`` what needed it. Raised before any work starts.
    """

    def __init__(self, extra: str, module: str, purpose: str, note: str = "") -> None:
        super().__init__(f"{purpose} needs {module}, which is not installed: "
                         f"pip install 'kvlog[{extra}]'{note}")
        self.extra = extra
        self.module = module
        self.purpose = purpose
        self.note = note

    def __reduce__(self) -> tuple[type[MissingExtraError], tuple[str, str, str, str]]:
        return type(self), (self.extra, self.module, self.purpose, self.note)


class InvalidRecordError(KvlogError, ValueError):
    """A key or value is None, empty, of the wrong type or too large; the whole batch was rejected."""


class StoreNotFoundError(KvlogError):
    """No store exists at the URI and ``create=False`` was given."""


class StoreClosedError(KvlogError):
    """The store (or log, or producer) was closed: open it again to go on."""


class ReadOnlyError(KvlogError):
    """A write was attempted on a store opened with ``read_only=True``."""


class CorruptDataError(KvlogError):
    """A file or commit failed its checksum, is truncated, or has an unknown format version.

    ``name`` is the object that is damaged.
    """

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


class StorageBehindError(CorruptDataError):
    """The storage root is not the history the metadata cache applied: the newest commit the
    cache knows is missing or different (the root was restored from an older copy, or damaged).

    Nothing was written. Reopening the store raises this error too, naming the commits the
    cache applied that storage lacks, until the caller accepts losing them with
    ``kvlog.open(uri, on_storage_behind="rebuild")``, which rebuilds the cache from storage.
    """


class ProducerError(KvlogError):
    """A producer's append broke the idempotent-producer rules."""


class OutOfOrderSequenceError(ProducerError):
    """A batch's sequence left a gap or partly overlapped an earlier batch; resend in order."""


class ProducerFencedError(ProducerError):
    """The producer's epoch is older than the current one: another holder took over; stop writing."""


class CommitConflictError(KvlogError):
    """Other writers kept taking the next commit version and the internal retries ran out; retry."""


class CommitStateUnknownError(KvlogError):
    """The store could not learn whether a commit landed; reopen to find out before resending."""


class StorageError(KvlogError):
    """The storage backend failed; the cause is chained. Usually worth retrying later."""


class CheckpointNotFoundError(StoreNotFoundError):
    """No named checkpoint of that name exists in the store (see ``Store.checkpoints()``)."""


class GroupNotFoundError(StoreNotFoundError):
    """No consumer group of that name exists in the store (see ``Store.consumer_groups()``)."""


class CheckpointExistsError(KvlogError):
    """A named checkpoint of that name exists already: delete it first, or choose another name."""
