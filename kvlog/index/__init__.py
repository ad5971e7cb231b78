"""The key index: where each key's latest value is, from the memtable through the pending index
runs to the LMDB B-tree. :class:`KeyIndex` is its interface; the modules hold one concept each:

``keys``      user keys as LMDB keys, and scan ranges
``entry``     index entries and their checksummed encoding; the cache file's structural check
``memtable``  this process's writes not applied yet
``runs``      the format of an index run (one commit's sorted entries)
``pending``   the runs pending in LMDB: newest first, pinned, merged
``tree``      walks of the B-tree, with the runs laid over it
``snapshot``  a read snapshot of the catalog and the index together
``reads``     the read transactions gets reuse while they hold the newest snapshot
``scan``      scans of memtable, runs and B-tree merged
``merged``    forward scans merged by whole chunks, the B-tree walked in C
``many``      reading many keys in one snapshot
``view``      a read view held open: one snapshot and a copy of the memtable
``expiries``  the rows of expiring entries, by which ``len`` skips the expired
``write``     writes within the log's own write transaction, and settling
``merge``     settling: the pending runs merged into the B-tree in key order
``index``     :class:`KeyIndex`
"""

from kvlog.index.entry import (
    INDEX_HEAD_BYTES,
    INLINE_FLAG,
    IndexEntry,
    RecordExpired,
    check_cache_file,
    decode_index_value,
    encode_index_value,
)
from kvlog.index.index import STALE, KeyIndex, RebuildChunk, Stale
from kvlog.index.keys import DIRECT_KEY_BYTES, LONG_KEY_BYTES, encode_index_key, prefix_successor
from kvlog.index.many import ResolveMany, lookup_many
from kvlog.index.memtable import TOMBSTONE, Expiring, MemTable, Tombstone
from kvlog.index.snapshot import IndexReader, runs_pending
from kvlog.index.view import IndexView
from kvlog.index.write import (
    add_run,
    clear_index,
    index_batch,
    index_batches,
    index_put_many,
    index_records,
    settle_runs,
)

__all__ = [
    "DIRECT_KEY_BYTES", "INDEX_HEAD_BYTES", "INLINE_FLAG", "LONG_KEY_BYTES", "STALE", "TOMBSTONE", "Expiring", "IndexEntry",
    "IndexReader", "IndexView", "KeyIndex", "MemTable", "RebuildChunk", "RecordExpired", "Stale", "Tombstone", "add_run",
    "check_cache_file",
    "clear_index", "decode_index_value", "encode_index_value", "encode_index_key", "index_batch", "index_batches",
    "index_put_many", "index_records", "lookup_many", "prefix_successor", "ResolveMany", "runs_pending",
    "settle_runs",
]
