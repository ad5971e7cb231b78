"""The log: commit protocol, offsets, producers, replay into the metadata cache, reads.

Writers outside the store's own flush and compaction (the Spark extension) come in through
:mod:`kvlog.log.outside`: :func:`commit_files`, :class:`BulkIndexLoad`, :func:`unchanged_since`.
"""

from kvlog.log.append import PendingBatch, to_record_batch
from kvlog.log.log import Log
from kvlog.log.opening import open_log
from kvlog.log.outside import BulkIndexLoad, IndexRow, commit_files, unchanged_since
from kvlog.log.producer_handle import Producer
from kvlog.log.records import AppendResult, Record, partition_for_key
from kvlog.meta import CommitOutcome, LiveBatch

__all__ = ["AppendResult", "BulkIndexLoad", "CommitOutcome", "IndexRow", "LiveBatch", "Log", "PendingBatch",
           "Producer", "Record", "commit_files", "open_log", "partition_for_key", "to_record_batch",
           "unchanged_since"]
