"""The metadata cache: typed access to the named LMDB databases.

Databases (all rebuildable from the storage root):

``meta``      applied version, last commit time, store uuid, this cache's producer id
``files``     live data files: file id -> file entry with resolved offsets
``batches``   the batch directory: (partition, last offset) -> resolved batch
``parts``     partition -> start and end offsets
``producers`` producer id -> producer state (epoch and 5-batch windows)
``outcomes``  commit id -> what applying it decided for each batch
``pending``   data-file path -> time after which it may be deleted
``index``     key -> (partition, offset[, inline value])
``runs``      run number -> index run: later commits' index entries, not yet merged into ``index``
``cleaner``   partition -> cleaner checkpoint and state
``condemned`` data-file path -> commit time at which a ``gc`` commit condemned it (an orphan
              that GC deletes; no later commit may make it live)

An index value (in the B-tree and in index runs alike: settling copies run values into the
B-tree) is ``>IHQB``, the CRC32C then partition, offset and flags, followed by the long key's
length (``>I``) and bytes (flag 2) and then the inline value (flag 1). The CRC32C covers the
LMDB key followed by everything after the CRC itself, so a damaged value, or a value moved to
another key, is never taken for data: every read of the index checks it, and a mismatch raises
``CorruptDataError`` naming the cache and marks the key index for rebuild (meta ``index_ready``
= 0, see :mod:`kvlog.meta.env`).

The values of the other databases but ``pending`` and ``condemned`` are sealed with a CRC32C
of their key and bytes (:func:`kvlog.meta.env.seal`), so damage there is found too, never
taken for a batch's whereabouts or the applied version. The meta key ``cache_layout`` names
this layout. LMDB errors and damaged values become kvlog errors (:meth:`LmdbEnv.failure`,
:class:`~kvlog.meta.env.CacheDamage`) in every :class:`MetaReader` method.
"""

from __future__ import annotations

import functools
import heapq
import inspect
import json
import operator
import struct
from bisect import bisect_left
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

import lmdb
import numpy as np
import pyarrow as pa

from kvlog._native import load
from kvlog.errors import CorruptDataError
from kvlog.format.checksum import crc32c
from kvlog.format.columns import INDEX_HEAD_BYTES as _PACKED_HEAD_BYTES
from kvlog.format.columns import binary_ends, index_pairs, int64_column, latest_rows, valid_mask
from kvlog.log.producers import ProducerState, producer_from_json, producer_to_json
from kvlog.meta.env import CACHE_LAYOUT, LMDB_ERROR, CacheDamage, LmdbEnv, seal, unseal
from kvlog.meta.keys import DIRECT_KEY_BYTES, encode_index_key, is_long_encoded
from kvlog.meta.runs import RUN_ID, Buffer, build_run, run_entries, runs_find, walk_run

if TYPE_CHECKING:
    from kvlog.meta import _runs
else:
    _runs = load("kvlog.meta._runs", "kvlog.meta._runs_py")

__all__ = [
    "INDEX_HEAD_BYTES", "INLINE_FLAG", "LMDB_ERROR", "IndexEntry", "MetaTxn", "MetaReader",
    "PinnedRuns", "decode_index_value", "encode_index_value", "find_in_runs", "index_damage",
    "index_inline", "index_lookup", "index_read_handles", "index_value_reader", "prefix_successor",
]

P = ParamSpec("P")
R = TypeVar("R")

_BATCH_KEY = struct.Struct(">HQ")
_PART_KEY = struct.Struct(">H")
_PID_KEY = struct.Struct(">Q")
_U64 = struct.Struct(">Q")
_INDEX_HEAD = struct.Struct(">IHQB")
_INDEX_BODY = struct.Struct(">HQB")  # the head after its CRC
_CRC = struct.Struct(">I")
_KEYLEN = struct.Struct(">I")
_INLINE = 1
_LONG = 2
#: An index value is ``>IHQB`` (CRC32C, partition, offset, flags) then the long key's length and
#: bytes (flag 2) then the inline value (flag 1); see the module's docstring. A value whose byte
#: :data:`INDEX_HEAD_BYTES` - 1 is :data:`INLINE_FLAG` is a short key's entry with its value
#: inline from byte INDEX_HEAD_BYTES on, once its checksum is checked (:func:`index_inline`).
INDEX_HEAD_BYTES = _INDEX_HEAD.size
if INDEX_HEAD_BYTES != _PACKED_HEAD_BYTES:  # kvlog.format.columns writes the same head in C
    raise ImportError(f"index heads of {INDEX_HEAD_BYTES} and {_PACKED_HEAD_BYTES} bytes disagree")
INLINE_FLAG = _INLINE
#: Index entries handed to one ``putmulti`` call (their Python objects exist one chunk at a time).
_PUT_CHUNK = 8192
_SCAN_CHUNK = 512
_FIRST = itemgetter(0)


@dataclass(frozen=True)
class IndexEntry:
    """Where a key's latest value is: its partition and offset, and the value itself when inlined."""

    partition: int
    offset: int
    inline: bytes | None


def _loads(raw: bytes | memoryview) -> Any:
    try:
        return json.loads(bytes(raw))
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        raise CacheDamage("a metadata value does not parse", index_only=False) from None


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _json_in(key: bytes | memoryview, value: bytes | memoryview) -> Any:
    """The JSON object sealed under ``key`` (``CacheDamage`` if the value fails its checks)."""
    return _loads(unseal(key, value))


def _json_out(key: bytes, obj: Any) -> bytes:
    """``obj`` as JSON, sealed under ``key``."""
    return seal(key, _dumps(obj))


def prefix_successor(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def _entry_damage(lmdb_key: bytes) -> CacheDamage:
    shown = lmdb_key[:DIRECT_KEY_BYTES]
    return CacheDamage(f"the key index's entry for {shown[:40]!r}{'...' if len(shown) > 40 else ''} "
                       "is malformed or fails its checksum", index_only=True)


def _decode_index(lmdb_key: bytes, value: bytes) -> tuple[bytes, IndexEntry]:
    """The user key and entry of an index value, its checksum checked (``CacheDamage``)."""
    try:
        key, partition, offset, inline = _runs.decode(lmdb_key, value)
    except ValueError:
        raise _entry_damage(lmdb_key) from None
    return key, IndexEntry(partition, offset, inline)


def encode_index_value(key: bytes, partition: int, offset: int, inline: bytes | None) -> bytes:
    """The index value of user ``key`` pointing at ``(partition, offset)``, with ``inline`` (its
    value) unless None: head, long key if any, inline value, sealed with the CRC32C."""
    lmdb_key = encode_index_key(key)
    long_key = len(key) > DIRECT_KEY_BYTES
    flags = (_INLINE if inline is not None else 0) | (_LONG if long_key else 0)
    parts = [_INDEX_BODY.pack(partition, offset, flags)]
    if long_key:
        parts += [_KEYLEN.pack(len(key)), key]
    if inline is not None:
        parts.append(inline)
    body = b"".join(parts)
    return _CRC.pack(crc32c(body, crc32c(lmdb_key))) + body


def decode_index_value(key: bytes, value: bytes) -> IndexEntry:
    """The entry of an index value read for ``key`` (a user key), its checksum checked: raises
    ``ValueError`` (a :class:`~kvlog.meta.env.CacheDamage`) if it fails (see :func:`index_damage`)."""
    return _decode_index(encode_index_key(key), value)[1]


#: ``index_inline(lmdb_key, value)``: a short key's inline value from its index value (None: the
#: value is in a data file), the checksum checked: ``ValueError`` if it fails (see
#: :func:`index_damage`). The compiled function itself: the get fast path calls it per get.
index_inline: Callable[[bytes, bytes], bytes | None] = _runs.inline


def index_damage(env: LmdbEnv, lmdb_key: bytes) -> CorruptDataError:
    """The error for an index entry of ``lmdb_key`` that failed its checks, once the key index
    is marked for rebuild."""
    damage = _entry_damage(lmdb_key)
    return env.damaged(str(damage), index_only=True)


def index_read_handles(env: LmdbEnv) -> tuple[Callable[[Any], Any], Any, type[Exception]]:
    """For a caller's own fast path: ``begin(db)`` of a read transaction (``txn.get(lmdb_key)``
    then ``txn.abort()``, after looking in the snapshot's index runs: :class:`PinnedRuns`), the
    index database, and the error meaning "take the slow path" (another process grew the map).

    The caller checks each value with :func:`index_inline` (or :func:`decode_index_value`) and
    turns other :data:`LMDB_ERROR` errors into kvlog errors with ``env.failure``."""
    return env.env.begin, env.dbs["index"], lmdb.MapResizedError


def _guarded(method: Callable[P, R]) -> Callable[P, R]:
    """``method`` of a :class:`MetaReader` with LMDB errors and damage raised as kvlog errors
    (``MapFullError`` and ``MapResizedError`` pass: :meth:`LmdbEnv.write` handles them)."""
    passing = (lmdb.MapFullError, lmdb.MapResizedError)

    def failure(reader: Any, error: Exception) -> Exception:
        env: LmdbEnv = reader._env
        if isinstance(error, CacheDamage):
            return env.damaged(str(error), index_only=error.index_only)
        assert isinstance(error, lmdb.Error)
        return env.failure(error)

    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def walk(*args: Any, **kwargs: Any) -> Any:
            try:
                return (yield from method(*args, **kwargs))
            except passing:
                raise
            except (lmdb.Error, CacheDamage) as e:
                raise failure(args[0], e) from (e if isinstance(e, lmdb.Error) else None)

        return cast(Callable[P, R], walk)

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except passing:
            raise
        except (lmdb.Error, CacheDamage) as e:
            raise failure(args[0], e) from (e if isinstance(e, lmdb.Error) else None)

    return call


def _guard_methods(cls: type[R]) -> type[R]:
    """Every method of ``cls`` (not inherited) as :func:`_guarded`."""
    for name, attr in list(vars(cls).items()):
        if inspect.isfunction(attr) and not (name.startswith("__") and name.endswith("__")):
            setattr(cls, name, _guarded(attr))
    return cls


def _runs_newest_first(txn: lmdb.Transaction, runs_db: Any) -> list[Buffer]:
    with txn.cursor(db=runs_db) as cur:
        return [value for _key, value in cur.iterprev()] if cur.last() else []


def find_in_runs(runs: list[Buffer], lmdb_key: bytes) -> bytes | None:
    """The newest run's entry for a key (``b""``: deleted), or None if no run has one; the entry
    is checked (its CRC32C), and ``ValueError`` raised if it or the run is damaged."""
    if len(lmdb_key) > DIRECT_KEY_BYTES:
        return None  # runs hold short keys only; a long key's LMDB key is longer
    return runs_find(runs, lmdb_key)


def _find_in_runs(runs: list[Buffer], lmdb_key: bytes) -> bytes | None:
    """:func:`find_in_runs`, damage raised as ``CacheDamage``."""
    try:
        return find_in_runs(runs, lmdb_key)
    except ValueError:
        raise CacheDamage("an index run is damaged", index_only=True) from None


class PinnedRuns:
    """The index runs of the newest snapshot a reader asked for, as views of the LMDB map kept
    valid by a read transaction of that snapshot, until a newer snapshot replaces it (so gets
    that meet pending runs do not read the run directory each time)."""

    def __init__(self, env: LmdbEnv) -> None:
        self._env = env
        self._db = env.dbs["runs"]
        # (snapshot id, the transaction keeping the views valid, the runs newest first): replaced
        # whole, so a reader holding the tuple keeps its transaction alive while it searches.
        self._pinned: tuple[int, lmdb.Transaction | None, list[Buffer]] = (-1, None, [])

    def runs(self, snapshot: int) -> list[Buffer] | None:
        """The runs of LMDB snapshot ``snapshot``; None if it is no longer the newest."""
        pinned = self._pinned
        if pinned[0] == snapshot:
            return pinned[2]
        try:
            views = self._env.env.begin(buffers=True)
        except lmdb.Error:
            return None
        if views.id() != snapshot:
            views.abort()
            return None
        runs = _runs_newest_first(views, self._db)
        self._pinned = (snapshot, views, runs)
        return runs

    def release(self) -> None:
        """Let the pinned snapshot go (its pages can be reused)."""
        if self._pinned[1] is not None:
            self._pinned = (-1, None, [])


def index_value_reader(env: LmdbEnv) -> Callable[[bytes], bytes | None]:
    """A function reading one raw index value by LMDB key, in a short read transaction of its
    own: from the newest index run holding the key, else from the index."""
    db = env.dbs["index"]
    runs_db = env.dbs["runs"]

    def read(lmdb_key: bytes) -> bytes | None:
        try:
            txn = env.env.begin(db=db, buffers=True)
        except lmdb.MapResizedError:
            env._adopt_size()
            return read(lmdb_key)
        except lmdb.Error as e:
            raise env.failure(e) from e
        try:
            found = _find_in_runs(_runs_newest_first(txn, runs_db), lmdb_key)
            if found is not None:
                return found or None
            view = txn.get(lmdb_key)
            if view is None:
                return None
            value = bytes(view)
            _decode_index(lmdb_key, value)  # its checksum
            return value
        except lmdb.Error as e:
            raise env.failure(e) from e
        except CacheDamage as e:
            raise env.damaged(str(e), index_only=e.index_only) from None
        finally:
            txn.abort()

    return read


def index_lookup(env: LmdbEnv, key: bytes) -> IndexEntry | None:
    """One key's index entry in a short read transaction of its own."""
    value = index_value_reader(env)(encode_index_key(key))
    if value is None:
        return None
    try:
        return decode_index_value(key, value)
    except CacheDamage as e:
        raise env.damaged(str(e), index_only=True) from None


def _scan_bounds(start: bytes | None, stop: bytes | None, prefix: bytes | None) -> tuple[bytes | None, bytes | None]:
    """The key range ``[lower, upper)`` of a scan from ``start`` to ``stop`` within ``prefix``."""
    lower, upper = start, stop
    if prefix:
        lower = prefix if lower is None or lower < prefix else lower
        successor = prefix_successor(prefix)
        if successor is not None and (upper is None or successor < upper):
            upper = successor
    return lower, upper


@_guard_methods
class MetaReader:
    """Reads within one LMDB transaction (a consistent snapshot). LMDB errors and damage found
    in the cache are raised as kvlog errors, the damage recorded (see the module's docstring)."""

    def __init__(self, env: LmdbEnv, txn: lmdb.Transaction) -> None:
        self._env = env
        self.txn = txn
        self._db = env.dbs
        self._run_cache: list[Buffer] | None = None
        self._run_views: lmdb.Transaction | None = None

    def close(self) -> None:
        """End this snapshot (its transaction and the one its index runs are read through)."""
        self.txn.abort()
        if self._run_views is not None:
            self._run_views.abort()
            self._run_views = None
        self._run_cache = None

    # -- meta ---------------------------------------------------------------------------------
    def get_meta(self, name: str) -> bytes | None:
        key = name.encode()
        value = self.txn.get(key, db=self._db["meta"])
        return None if value is None else unseal(key, value)

    def version(self) -> int:
        """The applied version (0: nothing applied)."""
        value = self.get_meta("version")
        return 0 if value is None else int(_U64.unpack(value)[0])

    def last_commit_ms(self) -> int:
        value = self.get_meta("last_commit_ms")
        return 0 if value is None else int(_U64.unpack(value)[0])

    # -- partitions ---------------------------------------------------------------------------
    def get_partition(self, partition: int) -> dict[str, Any]:
        """``{"start": int, "end": int}``; a new partition starts empty at 0."""
        key = _PART_KEY.pack(partition)
        value = self.txn.get(key, db=self._db["parts"])
        return {"start": 0, "end": 0} if value is None else dict(_json_in(key, value))

    # -- files and batches --------------------------------------------------------------------
    def get_file(self, file_id: str) -> dict[str, Any] | None:
        key = file_id.encode()
        value = self.txn.get(key, db=self._db["files"])
        return None if value is None else dict(_json_in(key, value))

    def iter_files(self) -> Iterator[tuple[str, dict[str, Any]]]:
        with self.txn.cursor(db=self._db["files"]) as cur:
            for k, v in cur:
                yield bytes(k).decode(), _json_in(k, v)

    def find_batch(self, partition: int, offset: int) -> dict[str, Any] | None:
        """The live batch of ``partition`` whose offset range holds ``offset``, if any."""
        with self.txn.cursor(db=self._db["batches"]) as cur:
            if not cur.set_range(_BATCH_KEY.pack(partition, offset)):
                return None
            p, _last = _BATCH_KEY.unpack(cur.key())
            if p != partition:
                return None
            batch: dict[str, Any] = _json_in(cur.key(), cur.value())
            return batch if batch["base"] <= offset else None

    def iter_batches(self, partition: int, from_offset: int = 0) -> Iterator[dict[str, Any]]:
        """Live batches of ``partition`` in offset order, from the one holding ``from_offset``."""
        with self.txn.cursor(db=self._db["batches"]) as cur:
            if not cur.set_range(_BATCH_KEY.pack(partition, from_offset)):
                return
            for k, v in cur:
                p, _last = _BATCH_KEY.unpack(k)
                if p != partition:
                    return
                yield _json_in(k, v)

    def count_batches(self) -> int:
        return int(self.txn.stat(self._db["batches"])["entries"])

    # -- producers, outcomes, pending deletions ------------------------------------------------
    def get_producer(self, producer_id: int) -> ProducerState | None:
        key = _PID_KEY.pack(producer_id)
        value = self.txn.get(key, db=self._db["producers"])
        return None if value is None else producer_from_json(_json_in(key, value))

    def iter_producers(self) -> Iterator[ProducerState]:
        with self.txn.cursor(db=self._db["producers"]) as cur:
            for k, v in cur:
                yield producer_from_json(_json_in(k, v))

    def get_outcome(self, commit_id: str) -> dict[str, Any] | None:
        key = commit_id.encode()
        value = self.txn.get(key, db=self._db["outcomes"])
        return None if value is None else dict(_json_in(key, value))

    def iter_pending(self) -> Iterator[tuple[str, int]]:
        with self.txn.cursor(db=self._db["pending"]) as cur:
            for k, v in cur:
                yield bytes(k).decode(), int(_U64.unpack(v)[0])

    def iter_partitions(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Every partition that has had a batch, with its offsets info."""
        with self.txn.cursor(db=self._db["parts"]) as cur:
            for k, v in cur:
                yield _PART_KEY.unpack(k)[0], _json_in(k, v)

    def iter_cleaner(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Every partition's cleaner state."""
        with self.txn.cursor(db=self._db["cleaner"]) as cur:
            for k, v in cur:
                yield _PART_KEY.unpack(k)[0], _json_in(k, v)

    def get_cleaner(self, partition: int) -> dict[str, Any]:
        key = _PART_KEY.pack(partition)
        value = self.txn.get(key, db=self._db["cleaner"])
        return {} if value is None else dict(_json_in(key, value))

    # -- condemned orphans and the applied commit ----------------------------------------------
    def is_condemned(self, path: str) -> bool:
        """Whether a ``gc`` commit condemned the data file ``path`` (it may already be deleted)."""
        return self.txn.get(path.encode(), db=self._db["condemned"]) is not None

    def iter_condemned(self) -> Iterator[tuple[str, int]]:
        """Every condemned path with the commit time that condemned it."""
        with self.txn.cursor(db=self._db["condemned"]) as cur:
            for k, v in cur:
                yield bytes(k).decode(), int(_U64.unpack(v)[0])

    def applied_commit(self) -> tuple[int, str, int] | None:
        """``(version, commit id, CRC32C of its bytes)`` of the newest commit applied, if known."""
        value = self.get_meta("applied_commit")
        if value is None:
            return None
        obj = _loads(value)
        return int(obj[0]), str(obj[1]), int(obj[2])

    # -- key index ----------------------------------------------------------------------------
    def index_get(self, key: bytes) -> IndexEntry | None:
        lmdb_key = encode_index_key(key)
        found = _find_in_runs(self._runs(), lmdb_key)
        if found is not None:
            return _decode_index(lmdb_key, found)[1] if found else None
        value = self.txn.get(lmdb_key, db=self._db["index"])
        if value is None:
            return None
        return _decode_index(lmdb_key, bytes(value))[1]

    def index_count(self) -> int:
        """Keys in the index (its pending runs applied)."""
        count = int(self.txn.stat(self._db["index"])["entries"])
        runs = self._runs()
        if runs:
            index_db = self._db["index"]
            for key, value in _merge_runs(runs, None, None, reverse=False):
                present = self.txn.get(key, db=index_db) is not None
                if value and not present:
                    count += 1
                elif not value and present:
                    count -= 1
        return count

    def runs_pending(self) -> int:
        """Index runs of this snapshot not merged into the index yet."""
        return int(self.txn.stat(self._db["runs"])["entries"])

    def _runs(self) -> list[Buffer]:
        """This snapshot's index runs, newest first (read once per reader)."""
        if self._run_cache is None and not self.pin_runs():
            # A commit landed between this reader's transaction and the second one: read copies
            # (this transaction makes bytes), at most index_run_limit runs of one flush each.
            self._run_cache = _runs_newest_first(self.txn, self._db["runs"])
        assert self._run_cache is not None
        return self._run_cache

    def pin_runs(self) -> bool:
        """Find this snapshot's index runs (if any) as views of the LMDB map, through a second read
        transaction of the same snapshot kept as long as this reader; False if a commit landed
        since this reader began (the second transaction would see another snapshot)."""
        if self._run_cache is not None:
            return True
        if not self.runs_pending():
            self._run_cache = []
            return True
        try:
            views = self._env.env.begin(buffers=True)
        except lmdb.Error:
            return False
        if views.id() != self.txn.id():
            views.abort()
            return False
        self._run_views = views
        self._run_cache = _runs_newest_first(views, self._db["runs"])
        return True

    def index_scan(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        prefix: bytes | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, IndexEntry]]:
        """Index entries in true key order (or reverse), ``start <= key < stop``, with ``prefix``."""
        lower, upper = _scan_bounds(start, stop, prefix)
        if lower is not None and upper is not None and lower >= upper:
            return
        runs = self._runs()
        with self.txn.cursor(db=self._db["index"]) as cur:
            entries = self._walk_reverse(cur, upper) if reverse else self._walk_forward(cur, lower)
            if runs:
                entries = _overlay(entries, _merge_runs(runs, lower, upper, reverse=reverse), reverse=reverse)
            for key, entry in entries:
                if reverse:
                    if upper is not None and key >= upper:
                        continue
                    if lower is not None and key < lower:
                        return
                else:
                    if lower is not None and key < lower:
                        continue
                    if upper is not None and key >= upper:
                        return
                if prefix and not key.startswith(prefix):
                    continue
                yield key, entry

    def index_inline_chunks(
        self, start: bytes | None, stop: bytes | None, prefix: bytes | None
    ) -> Generator[list[tuple[bytes, bytes]], None, bytes | None]:
        """Forward scan of ``(key, inline value)`` lists while entries are short keys with inline
        values; returns None at the end of the range, or the lower bound from which the rest must
        be read with :meth:`index_scan` (at the first other entry)."""
        lower, upper = _scan_bounds(start, stop, prefix)
        if lower is not None and upper is not None and lower >= upper:
            return None
        if self._runs():
            return b"" if lower is None else lower  # pending runs: the general path merges them
        # LMDB keys below ``cut`` are in the range; past a long ``upper``, long keys need their real keys.
        cut = upper if upper is None or len(upper) <= DIRECT_KEY_BYTES else upper[:DIRECT_KEY_BYTES]
        with self.txn.cursor(db=self._db["index"]) as cur:
            found = cur.first() if lower is None else cur.set_range(lower[:DIRECT_KEY_BYTES])
            if not found:
                return None
            entries = cast(Iterator[tuple[bytes, bytes]], cur.iternext())  # buffers=False: bytes
            first = True
            while True:
                raw = list(islice(entries, _SCAN_CHUNK))
                if not raw:
                    return None
                if first and lower is not None and len(lower) > DIRECT_KEY_BYTES:
                    return lower  # a long lower bound: the general path finds where to begin
                first = False
                done = False
                if cut is not None and raw[-1][0] >= cut:
                    raw = raw[:bisect_left(raw, cut, key=_FIRST)]
                    done = True
                try:
                    out = _runs.inline_prefix(raw)  # checked, up to the first other entry
                except ValueError:
                    for k, v in raw:
                        _decode_index(k, v)  # raises for the damaged entry
                    raise
                if len(out) != len(raw):
                    at = len(out)
                    if at:
                        yield out
                    key = raw[at][0]
                    # A long key's run: every real key of it is > its first bytes + b"\0".
                    return key[:DIRECT_KEY_BYTES] + b"\x00" if is_long_encoded(key) else key
                if out:
                    yield out
                if done:
                    # A long upper bound: keys from its first bytes on are compared in full there.
                    if cut is None or cut == upper:
                        return None
                    return cut if lower is None or lower < cut else lower

    @staticmethod
    def _walk_forward(cur: lmdb.Cursor, lower: bytes | None) -> Iterator[tuple[bytes, IndexEntry]]:
        if lower is None:
            found = cur.first()
        else:
            found = cur.set_range(lower[:DIRECT_KEY_BYTES])
        if not found:
            return
        yield from _sorted_runs(cur, forward=True)

    @staticmethod
    def _walk_reverse(cur: lmdb.Cursor, upper: bytes | None) -> Iterator[tuple[bytes, IndexEntry]]:
        if upper is None:
            found = cur.last()
        elif not cur.set_range(upper[:DIRECT_KEY_BYTES]):
            found = cur.last()
        elif len(upper) <= DIRECT_KEY_BYTES:
            found = cur.prev()
        else:
            # Long keys sharing the first bytes of ``upper`` may sort on either side of it:
            # start past all of them; the caller filters by the real keys.
            probe = upper[:DIRECT_KEY_BYTES]
            while True:
                k = bytes(cur.key())
                if not (k == probe or (is_long_encoded(k) and k.startswith(probe))):
                    found = cur.prev()
                    break
                if not cur.next():
                    found = cur.last()
                    break
        if not found:
            return
        yield from _sorted_runs(cur, forward=False)


def _sorted_runs(cur: lmdb.Cursor, *, forward: bool) -> Iterator[tuple[bytes, IndexEntry]]:
    """Entries from the cursor's position onward, with runs of long keys sorted by real key."""
    step = cur.next if forward else cur.prev
    run: list[tuple[bytes, IndexEntry]] = []
    run_prefix = b""
    while True:
        lmdb_key = bytes(cur.key())
        key, entry = _decode_index(lmdb_key, bytes(cur.value()))
        if is_long_encoded(lmdb_key):
            head = lmdb_key[:DIRECT_KEY_BYTES]
            if run and head != run_prefix:
                yield from sorted(run, reverse=not forward)
                run = []
            run_prefix = head
            run.append((key, entry))
        else:
            if run:
                yield from sorted(run, reverse=not forward)
                run = []
            yield key, entry
        if not step():
            break
    if run:
        yield from sorted(run, reverse=not forward)


def _walk_run(run: Buffer, lower: bytes | None, upper: bytes | None, *,
              reverse: bool) -> Iterator[tuple[bytes, bytes]]:
    """:func:`walk_run`, damage raised as ``CacheDamage``."""
    try:
        yield from walk_run(run, lower, upper, reverse=reverse)
    except ValueError:
        raise CacheDamage("an index run is damaged", index_only=True) from None


def _tagged(run: Buffer, age: int, lower: bytes | None, upper: bytes | None,
            reverse: bool) -> Iterator[tuple[bytes, bytes, int]]:
    for key, value in _walk_run(run, lower, upper, reverse=reverse):
        yield key, value, age


def _merge_runs(runs: list[Buffer], lower: bytes | None, upper: bytes | None, *,
                reverse: bool) -> Iterator[tuple[bytes, bytes]]:
    """The entries of runs (newest first) with ``lower <= key < upper`` in key order (or
    reverse), the newest entry of each key only (``b""``: deleted)."""
    if len(runs) == 1:
        yield from _walk_run(runs[0], lower, upper, reverse=reverse)
        return
    streams = [_tagged(run, age, lower, upper, reverse) for age, run in enumerate(runs)]
    # Equal keys come newest (age 0) first either way.
    order: Callable[[tuple[bytes, bytes, int]], tuple[bytes, int]] = (
        (lambda e: (e[0], -e[2])) if reverse else (lambda e: (e[0], e[2]))
    )
    last = None
    for key, value, _age in heapq.merge(*streams, key=order, reverse=reverse):
        if key != last:
            last = key
            yield key, value


def _overlay(indexed: Iterator[tuple[bytes, IndexEntry]], pending: Iterator[tuple[bytes, bytes]], *,
             reverse: bool) -> Iterator[tuple[bytes, IndexEntry]]:
    """Index entries with the runs' entries (which win) merged in; deletions removed."""
    before = operator.gt if reverse else operator.lt
    ahead = next(pending, None)
    for key, entry in indexed:
        while ahead is not None and before(ahead[0], key):
            if ahead[1]:
                yield ahead[0], _decode_index(ahead[0], ahead[1])[1]
            ahead = next(pending, None)
        if ahead is not None and ahead[0] == key:
            if ahead[1]:
                yield key, _decode_index(key, ahead[1])[1]
            ahead = next(pending, None)
            continue
        yield key, entry
    while ahead is not None:
        if ahead[1]:
            yield ahead[0], _decode_index(ahead[0], ahead[1])[1]
        ahead = next(pending, None)


class MetaTxn(MetaReader):
    """Reads and writes within one LMDB write transaction."""

    def _runs(self) -> list[Buffer]:
        # This transaction changes the runs: read them afresh, as copies (it makes bytes).
        return _runs_newest_first(self.txn, self._db["runs"])

    # -- index runs -------------------------------------------------------------------------------
    def add_run(self, run: bytes) -> None:
        """Append an index run (it wins over every earlier run and the index)."""
        db = self._db["runs"]
        with self.txn.cursor(db=db) as cur:
            number = RUN_ID.unpack(cur.key())[0] + 1 if cur.last() else 0
        self.txn.put(RUN_ID.pack(number), run, db=db, append=True)  # the newest: the last key

    def settle_runs(self) -> int:
        """Merge the pending index runs into the index, oldest first; return how many."""
        db = self._db["runs"]
        index_db = self._db["index"]
        with self.txn.cursor(db=db) as cur:
            numbers = [bytes(number) for number in cur.iternext(values=False)]
        for number in numbers:
            run = self.txn.get(number, db=db)  # a copy (this transaction makes bytes): one at a time
            assert run is not None
            lower: bytes | None = None
            while True:
                try:
                    chunk = run_entries(run, lower, None, _PUT_CHUNK)  # every entry checked
                except ValueError:
                    raise CacheDamage("an index run is damaged", index_only=True) from None
                puts = [pair for pair in chunk if pair[1]]
                if len(puts) != len(chunk):
                    for key, value in chunk:
                        if not value:
                            self.txn.delete(key, db=index_db)
                if puts:
                    with self.txn.cursor(db=index_db) as cur:
                        cur.putmulti(puts)
                if len(chunk) < _PUT_CHUNK:
                    break
                lower = chunk[-1][0] + b"\x00"
        if numbers:
            self.txn.drop(db, delete=False)
        return len(numbers)

    def _settle(self) -> None:
        """Before a write straight into the index: merge the runs, which would otherwise win."""
        if self.runs_pending():
            self.settle_runs()

    def put_meta(self, name: str, value: bytes) -> None:
        key = name.encode()
        self.txn.put(key, seal(key, value), db=self._db["meta"])

    def set_version(self, version: int) -> None:
        self.put_meta("version", _U64.pack(version))

    def set_last_commit_ms(self, ms: int) -> None:
        self.put_meta("last_commit_ms", _U64.pack(max(ms, 0)))

    def put_partition(self, partition: int, info: dict[str, Any]) -> None:
        key = _PART_KEY.pack(partition)
        self.txn.put(key, _json_out(key, info), db=self._db["parts"])

    def put_file(self, file_id: str, entry: dict[str, Any]) -> None:
        key = file_id.encode()
        self.txn.put(key, _json_out(key, entry), db=self._db["files"])

    def delete_file(self, file_id: str) -> None:
        self.txn.delete(file_id.encode(), db=self._db["files"])

    def put_batch(self, partition: int, last_offset: int, batch: dict[str, Any]) -> None:
        key = _BATCH_KEY.pack(partition, last_offset)
        self.txn.put(key, _json_out(key, batch), db=self._db["batches"])

    def delete_batch(self, partition: int, last_offset: int) -> None:
        self.txn.delete(_BATCH_KEY.pack(partition, last_offset), db=self._db["batches"])

    def put_producer(self, state: ProducerState) -> None:
        key = _PID_KEY.pack(state.producer_id)
        self.txn.put(key, _json_out(key, producer_to_json(state)), db=self._db["producers"])

    def delete_producer(self, producer_id: int) -> None:
        self.txn.delete(_PID_KEY.pack(producer_id), db=self._db["producers"])

    def put_outcome(self, commit_id: str, outcome: dict[str, Any]) -> None:
        key = commit_id.encode()
        self.txn.put(key, _json_out(key, outcome), db=self._db["outcomes"])

    def prune_outcomes(self, below_version: int) -> None:
        """Forget outcomes of commits older than ``below_version``."""
        with self.txn.cursor(db=self._db["outcomes"]) as cur:
            stale = [bytes(k) for k, v in cur if _json_in(k, v)["version"] < below_version]
        for k in stale:
            self.txn.delete(k, db=self._db["outcomes"])

    def put_pending(self, path: str, due_ms: int) -> None:
        self.txn.put(path.encode(), _U64.pack(due_ms), db=self._db["pending"])

    def delete_pending(self, path: str) -> None:
        self.txn.delete(path.encode(), db=self._db["pending"])

    def put_cleaner(self, partition: int, state: dict[str, Any]) -> None:
        key = _PART_KEY.pack(partition)
        self.txn.put(key, _json_out(key, state), db=self._db["cleaner"])

    def put_condemned(self, path: str, at_ms: int) -> None:
        self.txn.put(path.encode(), _U64.pack(max(at_ms, 0)), db=self._db["condemned"])

    def set_applied_commit(self, version: int, commit_id: str, crc: int) -> None:
        self.put_meta("applied_commit", _dumps([version, commit_id, crc]))

    def index_put(self, key: bytes, partition: int, offset: int, inline: bytes | None) -> None:
        self._settle()
        self.txn.put(encode_index_key(key), encode_index_value(key, partition, offset, inline),
                     db=self._db["index"])

    def index_apply(
        self, partition: int, latest: dict[bytes, tuple[int, bytes | None]], inline_limit: int
    ) -> None:
        """Point many keys of ``partition`` at ``(offset, value)``; a None value deletes the key."""
        self._settle()
        db = self._db["index"]
        puts = []
        for key, (offset, value) in latest.items():
            if value is None:
                self.txn.delete(encode_index_key(key), db=db)
            else:
                puts.append((key, partition, offset, value))
        puts.sort()
        self.index_put_many(puts, inline_limit)

    def index_put_many(self, items: list[tuple[bytes, int, int, bytes]], inline_limit: int) -> None:
        """Write ``(key, partition, offset, value)`` entries; values up to ``inline_limit`` inline."""
        self._settle()
        puts = []
        for key, partition, offset, value in items:
            if len(key) > DIRECT_KEY_BYTES:
                self.index_put(key, partition, offset, value if len(value) <= inline_limit else None)
            else:
                inline = value if len(value) <= inline_limit else None
                puts.append((key, encode_index_value(key, partition, offset, inline)))
        if puts:
            with self.txn.cursor(db=self._db["index"]) as cur:
                cur.putmulti(puts)

    def index_records(
        self, partition: int | np.ndarray, keys: pa.Array, values: pa.Array, offsets: np.ndarray,
        inline_limit: int, run_limit: int = 0,
    ) -> None:
        """Point ``keys`` (binary) at ``offsets`` of ``partition`` (one, or one per record) in one
        pass; the last record of a key wins, a null value (a tombstone) deletes it; values up to
        ``inline_limit`` inline.

        With ``run_limit`` > 0 and short keys only, the entries become one index run (the caller
        merges the runs, :meth:`settle_runs`, once more than ``run_limit`` are pending);
        otherwise they are written into the index at once."""
        n = len(keys)
        if n == 0:
            return
        ends, _data = binary_ends(keys)
        if int(np.diff(ends).max()) > DIRECT_KEY_BYTES:  # long keys: the general path
            parts = np.broadcast_to(np.asarray(partition), (n,)).tolist()
            key_list = keys.to_pylist()
            for p, key, offset, value in zip(parts, key_list, offsets.tolist(), values.to_pylist(), strict=True):
                self.index_apply(p, {key: (offset, value)}, inline_limit)
            return
        chosen = latest_rows(keys)  # each key's last record, in key order
        if run_limit > 0:
            if isinstance(partition, np.ndarray):
                run_parts = partition[chosen]
            else:
                run_parts = np.full(len(chosen), partition, dtype=np.uint16)
            self.add_run(build_run(keys, values, chosen, run_parts, offsets[chosen],
                                   valid_mask(values)[chosen], inline_limit))
            return
        self._settle()
        if values.null_count:
            live = valid_mask(values)[chosen]
            index_db = self._db["index"]
            for key in keys.take(int64_column(chosen[~live])).to_pylist():
                self.txn.delete(key, db=index_db)
            chosen = np.ascontiguousarray(chosen[live])
        m = len(chosen)
        if m == 0:
            return
        if isinstance(partition, np.ndarray):
            parts = np.ascontiguousarray(partition[chosen], dtype=np.uint16)
        else:
            parts = np.full(m, partition, dtype=np.uint16)
        positions = np.ascontiguousarray(offsets[chosen], dtype=np.int64)
        with self.txn.cursor(db=self._db["index"]) as cur:
            # Python objects for one chunk at a time: a flush's worth at once is tens of MiB.
            for start in range(0, m, _PUT_CHUNK):
                stop = start + _PUT_CHUNK
                cur.putmulti(index_pairs(keys, values, chosen[start:stop], parts[start:stop],
                                         positions[start:stop], inline_limit))

    def clear_index(self) -> None:
        """Empty the key index and its pending runs."""
        self.txn.drop(self._db["index"], delete=False)
        self.txn.drop(self._db["runs"], delete=False)

    def index_delete(self, key: bytes) -> None:
        self._settle()
        self.txn.delete(encode_index_key(key), db=self._db["index"])

    def clear(self, *, keep_index: bool = False) -> None:
        """Empty every database (the index and its runs too unless ``keep_index``); the meta
        database keeps the cache's layout (``cache_layout``), which an emptied cache has too."""
        for name, db in self._db.items():
            if keep_index and name in ("index", "runs"):
                continue
            self.txn.drop(db, delete=False)
        self.put_meta("cache_layout", CACHE_LAYOUT)
