"""Replacing the contents of a cache with another cache's, in one LMDB write transaction.

A cache that must be rebuilt while readers use it (in this process or in others sharing
it) is built in a second environment beside it, where nobody reads a half-filled key index,
and then moved in whole: every reader's snapshot sees the cache before or after, never
between. The tables are copied in key order, so LMDB appends pages rather than splitting
them; the copy costs about what the rebuild did.
"""

from __future__ import annotations

from collections.abc import Callable

import lmdb

from kvlog.meta.cache import MetaTxn
from kvlog.meta.env import DB_NAMES, LmdbEnv

__all__ = ["MERGED_TABLES", "transplant"]

#: Tables whose rows are added to the target's rather than replacing them: what applying a
#: commit decided, which a writer of this cache may still be waiting to read.
MERGED_TABLES = ("outcomes",)


def transplant(target: LmdbEnv, source: LmdbEnv, wanted: Callable[[MetaTxn], bool]) -> bool:
    """Replace every table of ``target`` with ``source``'s (merging :data:`MERGED_TABLES`) in
    one write transaction, if ``wanted`` says so of the target as that transaction finds it
    (another process may have moved it on meanwhile); whether it was replaced. Nobody may
    write ``source`` meanwhile."""
    reading = source.read()
    try:
        used = 0
        for name in DB_NAMES:
            stat = reading.stat(source.dbs[name])
            used += int(stat["branch_pages"]) + int(stat["leaf_pages"]) + int(stat["overflow_pages"])
        psize = int(source.env.stat()["psize"])

        def move(txn: lmdb.Transaction) -> bool:
            if not wanted(MetaTxn(target, txn)):
                return False
            for name in DB_NAMES:
                merged = name in MERGED_TABLES
                if not merged:
                    txn.drop(target.dbs[name], delete=False)
                rows = reading.cursor(db=source.dbs[name])
                rows.first()
                txn.cursor(db=target.dbs[name]).putmulti(rows.iternext(), append=not merged)
            return True

        # Pages freed by the drop are not reused before this transaction ends.
        replaced: bool = target.write(move, grows=used * psize)
        return replaced
    finally:
        reading.abort()

