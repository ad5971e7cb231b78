"""The door of writers outside the store's own flush and compaction (the Spark extension):
making data files they wrote live, and loading a key index they computed.

They never build commits or touch the metadata cache themselves: :func:`commit_files` builds
the commit and takes it through the commit path, and :class:`BulkIndexLoad` writes the key
index in the cache's transactions, so the cache's rules stay in :mod:`kvlog.meta` and
:mod:`kvlog.index` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvlog.errors import InvalidRecordError
from kvlog.format.commit import Commit, FileEntry
from kvlog.index import clear_index, index_put_many
from kvlog.index.write import index_put
from kvlog.meta import CommitOutcome, MetaTxn, NamedPins

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["BulkIndexLoad", "IndexRow", "commit_files", "unchanged_since"]

#: The commit kinds :func:`commit_files` makes: new files, or files that replace live ones.
_KINDS = ("append", "replace")

#: A key index row to load: ``(key, partition, offset, value, expires_ms or None)``.
IndexRow = tuple[bytes, int, int, bytes, int | None]


def commit_files(the_log: Log, kind: str, add: Sequence[FileEntry], *, remove: Sequence[str] = (),
                 info: Mapping[str, Any] | None = None, check: Callable[[int], None] | None = None,
                 commit_id: str | None = None) -> CommitOutcome:
    """Make the data files ``add`` live in one commit of ``kind``: ``"append"`` (their batches
    take their partitions' next offsets, by the producer rules) or ``"replace"`` (they take the
    place of the live files whose ids ``remove`` lists; refused unless all are still live).

    ``check(version)`` runs before each attempt at ``version`` and may raise to give up;
    ``commit_id`` (default: a new one) is how a caller recognises its commit after an
    ambiguous failure (:meth:`kvlog.log.Log.outcome`). Returns what applying the commit decided.
    """
    if kind not in _KINDS:
        raise InvalidRecordError(f"commit_files makes 'append' or 'replace' commits, not {kind!r}")
    if kind == "append" and remove:
        raise InvalidRecordError("an append commit removes no file")
    ident = commit_id or the_log.new_id()
    added, removed, details = tuple(add), tuple(remove), dict(info or {})

    def build(version: int) -> Commit:
        if check is not None:
            check(version)
        return Commit(version, ident, the_log.clock.now_ms(), kind, add=added, remove=removed, info=details)

    return the_log.commit(build)


def unchanged_since(the_log: Log, version: int) -> bool:
    """Whether the store holds what it held at ``version``: no commit since, or only the read
    lease a reader took for it (:mod:`kvlog.log.leases`: a pin landing at ``version + 1`` that
    names ``version``)."""
    now = the_log.version
    if now == version:
        return True
    return bool(now == version + 1 and the_log.snapshot(
        lambda r: any(pin.is_lease and pin.version == version for pin in NamedPins(r).every())))


class BulkIndexLoad:
    """Loads a key index computed elsewhere into the cache of a log opened without one
    (``maintain_index=False``): :meth:`clear`, then :meth:`load` in key order, then
    :meth:`finish`, which marks the index ready for the store to use."""

    def __init__(self, the_log: Log) -> None:
        self._log = the_log
        self._inline = the_log.config.inline_value_bytes

    def clear(self) -> None:
        """Empty the key index and its pending runs."""
        env = self._log.env
        env.write(lambda txn: clear_index(MetaTxn(env, txn)))

    def load(self, rows: Iterable[IndexRow]) -> None:
        """Write ``rows`` in one transaction (values up to ``inline_value_bytes`` inline; an
        expiring row keeps its expiry, which reads check)."""
        env, inline = self._log.env, self._inline
        items = list(rows)

        def work(txn: Any) -> None:
            meta = MetaTxn(env, txn)
            index_put_many(meta, [(k, p, o, v) for k, p, o, v, e in items if e is None], inline)
            for k, p, o, v, e in items:
                if e is not None:
                    index_put(meta, k, p, o, v if len(v) <= inline else None, e)

        env.write(work)

    def finish(self) -> None:
        """Mark the index ready: a store opened on this cache uses it without a replay."""
        env = self._log.env
        env.write(lambda txn: MetaTxn(env, txn).put_meta("index_ready", b"1"))
