"""The log: commit protocol, offsets, producers, replay into the metadata cache, reads."""

from kvlog.log.append import PendingBatch, to_record_batch
from kvlog.log.log import Log
from kvlog.log.opening import open_log
from kvlog.log.producer_handle import Producer
from kvlog.log.records import AppendResult, Record, partition_for_key

__all__ = ["AppendResult", "Log", "PendingBatch", "Producer", "Record", "open_log",
           "partition_for_key", "to_record_batch"]
