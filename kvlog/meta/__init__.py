"""The LMDB metadata cache: the catalog of a store's files, batches, producers and partitions;
the only package that imports lmdb but for :mod:`kvlog.index`, which keeps its key index there."""

from kvlog.meta.cache import EncodedRow, MetaReader, MetaTxn, batch_key, encoded_json
from kvlog.meta.env import DB_NAMES, LmdbEnv, acquire_env, release_env, reset_env
from kvlog.meta.group_offsets import GroupOffsets, GroupState, holds_of
from kvlog.meta.named_pins import NamedPin, NamedPins
from kvlog.meta.records import (
    BatchOutcome,
    CleanerState,
    CommitOutcome,
    LiveBatch,
    LiveFile,
    Refusal,
)

__all__ = [
    "DB_NAMES", "BatchOutcome", "EncodedRow", "batch_key", "encoded_json", "GroupOffsets", "GroupState", "holds_of", "NamedPin", "NamedPins", "CleanerState", "CommitOutcome", "LiveBatch", "LiveFile", "LmdbEnv",
    "MetaReader", "MetaTxn", "Refusal", "acquire_env", "release_env", "reset_env",
]
