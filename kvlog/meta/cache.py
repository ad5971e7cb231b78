"""The metadata cache: typed access to the named LMDB databases.

Databases (all rebuildable from the storage root):

``meta``      applied version, last commit time, store uuid, this cache's producer id
``files``     live data files: file id -> file entry with resolved offsets
``batches``   the batch directory: (partition, last offset) -> resolved batch
``parts``     partition -> start and end offsets
``producers`` producer id -> producer state (epoch and 5-batch windows)
``outcomes``  commit id -> what applying it decided for each batch
``pending``   data-file path -> time after which it may be deleted
``index``     key -> (partition, offset[, inline value]): the key index's B-tree
``runs``      run number -> index run: later commits' index entries, not yet merged into ``index``
``cleaner``   partition -> cleaner checkpoint and state
``condemned`` data-file path -> commit time at which a ``gc`` commit condemned it (an orphan
              that GC deletes; no later commit may make it live)
``offsets``   (consumer group, partition) -> the group's committed offset
              (:mod:`kvlog.meta.group_offsets`)
``groups``    consumer group -> its last commit time and whether it holds tombstones
              (:mod:`kvlog.meta.group_offsets`)
``pins``      named checkpoint -> the version it pins and the data files live there
              (:mod:`kvlog.meta.named_pins`)

The key index (``index`` and ``runs``) is read and written by :mod:`kvlog.index`, which checks
its own entries. The values of the other databases but ``pending`` and ``condemned`` are sealed
with a CRC32C of their key and bytes (:func:`kvlog.meta.env.seal`), so damage there is found too, never
taken for a batch's whereabouts or the applied version. The meta key ``cache_layout`` names
this layout. LMDB errors and damaged values become kvlog errors (:meth:`LmdbEnv.failure`,
:class:`~kvlog.meta.env.CacheDamage`) in every :class:`MetaReader` method.
"""

from __future__ import annotations

import functools
import inspect
import json
import struct
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar, cast

import lmdb

from kvlog.format.producer_state import ProducerState, producer_from_json, producer_to_json
from kvlog.meta.env import CACHE_LAYOUT, LMDB_ERROR, CacheDamage, LmdbEnv, seal, unseal
from kvlog.meta.records import CleanerState, CommitOutcome, LiveBatch, LiveFile

__all__ = ["LMDB_ERROR", "EncodedRow", "MetaTxn", "MetaReader", "batch_key", "encoded_json", "guard_methods"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_BATCH_KEY = struct.Struct(">HQ")
_PART_KEY = struct.Struct(">H")
_PID_KEY = struct.Struct(">Q")
_U64 = struct.Struct(">Q")
def _loads(raw: bytes | memoryview) -> Any:
    try:
        return json.loads(bytes(raw))
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        raise CacheDamage("a metadata value does not parse", index_only=False) from None


#: ``json.dumps(obj, separators=(",", ":"))``, with its encoder made once rather than per call.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
#: The same with sorted members, as documents (checkpoints) are written.
_ENCODE_SORTED = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode


def _dumps(obj: Any) -> bytes:
    return _ENCODE(obj).encode()


def _json_in(key: bytes | memoryview, value: bytes | memoryview) -> Any:
    """The JSON object sealed under ``key`` (``CacheDamage`` if the value fails its checks)."""
    return _loads(unseal(key, value))


def _decoded(decode: Callable[[Any], T], key: bytes | memoryview, value: bytes | memoryview) -> T:
    """The typed value sealed under ``key`` (``CacheDamage`` if it fails its checks or its shape)."""
    obj = _json_in(key, value)
    try:
        return decode(obj)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):  # e.g. a list, not an object
        raise CacheDamage("a metadata value has the wrong shape", index_only=False) from None


#: Rows decoded lately, by (database, key): the exact stored (sealed) bytes each was decoded
#: from, and what they decode to. Decoding is a function of the key and the bytes alone, so a
#: row whose stored bytes are equal to a remembered row's is that value, whoever wrote it (this
#: process, another one, a cache restored from a copy) and whether the transaction that wrote it
#: committed or not; any other bytes are decoded and checked afresh. A producer's window is read
#: twice per append and rewritten by each: it is remembered when written.
_REMEMBERED: dict[tuple[str, bytes], tuple[bytes, Any]] = {}
_REMEMBER_AT_MOST = 1024


def _remembered(db: str, decode: Callable[[Any], T], key: bytes, value: bytes | memoryview) -> T:
    """:func:`_decoded` of a row of ``db``, reusing the value remembered for the same bytes."""
    hit = _REMEMBERED.get((db, key))
    if hit is not None and hit[0] == value:
        found: T = hit[1]
        return found
    decoded = _decoded(decode, key, value)
    if isinstance(value, bytes):
        _remember(db, key, value, decoded)
    return decoded


def _remember(db: str, key: bytes, value: bytes, decoded: Any) -> None:
    """Remember that ``value`` stored under ``key`` in ``db`` decodes to ``decoded``."""
    if len(_REMEMBERED) >= _REMEMBER_AT_MOST:
        _REMEMBERED.clear()
    _REMEMBERED[(db, key)] = (value, decoded)


#: A row of the ``files`` or ``batches`` table as checkpoints hold it (:meth:`MetaReader.encoded_rows`):
#: its stored (sealed) bytes; its value's JSON as documents are written (compact, members
#: sorted) when that is not the stored payload itself (None: it is, as rows are written); and
#: what a checkpoint needs of the value (a file: its batches' keys; a batch: its first offset).
EncodedRow = tuple[bytes, bytes | None, Any]
_SEAL_BYTES = len(seal(b"", b""))


def _encoded(table: str, key: bytes, value: bytes) -> EncodedRow:
    """The :data:`EncodedRow` of a stored row of ``table``, decoded and checked."""
    facts: Any
    if table == "files":
        entry = _decoded(LiveFile.from_json, key, value)
        obj, facts = entry.to_json(), entry.batches
    else:
        batch = _decoded(LiveBatch.from_json, key, value)
        obj, facts = batch.to_json(), batch.base
    text = _ENCODE_SORTED(obj).encode()
    return value, (None if value[_SEAL_BYTES:] == text else text), facts


def encoded_json(row: EncodedRow) -> bytes:
    """The JSON of the value of an :data:`EncodedRow`."""
    return row[0][_SEAL_BYTES:] if row[1] is None else row[1]


def _version_of_outcome(key: bytes | memoryview, value: bytes | memoryview) -> int:
    """The version of a stored outcome: read from the head of its JSON, which
    :meth:`CommitOutcome.to_json` begins with it (``{"version":<digits>,``); any other shape
    is decoded whole."""
    payload = unseal(key, value)
    head = b'{"version":'
    if payload.startswith(head):
        end = payload.find(b",", len(head), len(head) + 21)
        digits = payload[len(head):end]
        if end > 0 and digits.isdigit() and (digits[:1] != b"0" or len(digits) == 1):
            return int(digits)
    return _decoded(CommitOutcome.from_json, key, value).version


def batch_key(partition: int, last: int) -> bytes:
    """The key of the batch directory's row of the batch of ``partition`` ending at ``last``."""
    return _BATCH_KEY.pack(partition, last)


def _end_of(obj: Any) -> int:
    """A partition's end offset from its ``parts`` value."""
    return int(obj["end"])


def _json_out(key: bytes, obj: Any) -> bytes:
    """``obj`` as JSON, sealed under ``key``."""
    return seal(key, _dumps(obj))


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


def guard_methods(cls: type[R]) -> type[R]:
    """Every method of ``cls`` (not inherited) as :func:`_guarded` (a reader class of its own
    for a subclass of :class:`MetaReader`)."""
    for name, attr in list(vars(cls).items()):
        if inspect.isfunction(attr) and not (name.startswith("__") and name.endswith("__")):
            setattr(cls, name, _guarded(attr))
    return cls


@guard_methods
class MetaReader:
    """Reads within one LMDB transaction (a consistent snapshot). LMDB errors and damage found
    in the cache are raised as kvlog errors, the damage recorded (see the module's docstring)."""

    def __init__(self, env: LmdbEnv, txn: lmdb.Transaction) -> None:
        self._env = env
        self.txn = txn
        self._db = env.dbs

    @property
    def env(self) -> LmdbEnv:
        """The environment this snapshot reads."""
        return self._env

    def close(self) -> None:
        """End this snapshot."""
        self.txn.abort()

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
    def partition_end(self, partition: int) -> int:
        """The next offset ``partition`` will assign (0 for a partition that never had a batch)."""
        key = _PART_KEY.pack(partition)
        value = self.txn.get(key, db=self._db["parts"])
        return 0 if value is None else _decoded(_end_of, key, value)

    # -- files and batches --------------------------------------------------------------------
    def get_file(self, file_id: str) -> LiveFile | None:
        key = file_id.encode()
        value = self.txn.get(key, db=self._db["files"])
        return None if value is None else _decoded(LiveFile.from_json, key, value)

    def iter_files(self) -> Iterator[tuple[str, LiveFile]]:
        with self.txn.cursor(db=self._db["files"]) as cur:
            for k, v in cur:
                yield bytes(k).decode(), _decoded(LiveFile.from_json, k, v)

    def find_batch(self, partition: int, offset: int) -> LiveBatch | None:
        """The live batch of ``partition`` whose offset range holds ``offset``, if any."""
        with self.txn.cursor(db=self._db["batches"]) as cur:
            if not cur.set_range(_BATCH_KEY.pack(partition, offset)):
                return None
            p, _last = _BATCH_KEY.unpack(cur.key())
            if p != partition:
                return None
            batch = _decoded(LiveBatch.from_json, cur.key(), cur.value())
            return batch if batch.base <= offset else None

    def iter_batches(self, partition: int, from_offset: int = 0) -> Iterator[LiveBatch]:
        """Live batches of ``partition`` in offset order, from the one holding ``from_offset``."""
        with self.txn.cursor(db=self._db["batches"]) as cur:
            if not cur.set_range(_BATCH_KEY.pack(partition, from_offset)):
                return
            for k, v in cur:
                p, _last = _BATCH_KEY.unpack(k)
                if p != partition:
                    return
                yield _decoded(LiveBatch.from_json, k, v)

    def encoded_rows(self, table: str, known: dict[bytes, EncodedRow]) -> dict[bytes, EncodedRow]:
        """Every row of ``table`` (``files`` or ``batches``) by its key, in key order, as an
        :data:`EncodedRow`. A row whose stored bytes are equal to those of its ``known`` row is
        that row (decoding is a function of the key and the bytes alone); any other is decoded
        and checked."""
        rows: dict[bytes, EncodedRow] = {}
        with self.txn.cursor(db=self._db[table]) as cur:
            for k, v in cur:
                key, value = bytes(k), bytes(v)  # the very objects of a snapshot of copies
                hit = known.get(key)
                rows[key] = hit if hit is not None and hit[0] == value else _encoded(table, key, value)
        return rows

    def count_batches(self) -> int:
        return int(self.txn.stat(self._db["batches"])["entries"])

    # -- producers, outcomes, pending deletions ------------------------------------------------
    def get_producer(self, producer_id: int) -> ProducerState | None:
        key = _PID_KEY.pack(producer_id)
        value = self.txn.get(key, db=self._db["producers"])
        return None if value is None else _remembered("producers", producer_from_json, key, value)

    def iter_producers(self) -> Iterator[ProducerState]:
        with self.txn.cursor(db=self._db["producers"]) as cur:
            for k, v in cur:
                yield _decoded(producer_from_json, k, v)

    def get_outcome(self, commit_id: str) -> CommitOutcome | None:
        key = commit_id.encode()
        value = self.txn.get(key, db=self._db["outcomes"])
        return None if value is None else _decoded(CommitOutcome.from_json, key, value)

    def iter_pending(self) -> Iterator[tuple[str, int]]:
        with self.txn.cursor(db=self._db["pending"]) as cur:
            for k, v in cur:
                yield bytes(k).decode(), int(_U64.unpack(v)[0])

    def iter_partitions(self) -> Iterator[tuple[int, int]]:
        """Every partition that has had a batch, with its end offset."""
        with self.txn.cursor(db=self._db["parts"]) as cur:
            for k, v in cur:
                yield _PART_KEY.unpack(k)[0], _decoded(_end_of, k, v)

    def iter_cleaner(self) -> Iterator[tuple[int, CleanerState]]:
        """Every partition's cleaner state."""
        with self.txn.cursor(db=self._db["cleaner"]) as cur:
            for k, v in cur:
                yield _PART_KEY.unpack(k)[0], _decoded(CleanerState.from_json, k, v)

    def get_cleaner(self, partition: int) -> CleanerState | None:
        """The partition's cleaner state; None before its first cleaning round."""
        key = _PART_KEY.pack(partition)
        value = self.txn.get(key, db=self._db["cleaner"])
        return None if value is None else _decoded(CleanerState.from_json, key, value)

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

class MetaTxn(MetaReader):
    """Reads and writes within one LMDB write transaction."""

    def put_meta(self, name: str, value: bytes) -> None:
        key = name.encode()
        self.txn.put(key, seal(key, value), db=self._db["meta"])

    def set_version(self, version: int) -> None:
        self.put_meta("version", _U64.pack(version))

    def set_last_commit_ms(self, ms: int) -> None:
        self.put_meta("last_commit_ms", _U64.pack(max(ms, 0)))

    def put_partition_end(self, partition: int, end: int) -> None:
        key = _PART_KEY.pack(partition)
        self.txn.put(key, _json_out(key, {"end": end}), db=self._db["parts"])

    def put_file(self, file_id: str, entry: LiveFile) -> None:
        key = file_id.encode()
        self.txn.put(key, _json_out(key, entry.to_json()), db=self._db["files"])

    def delete_file(self, file_id: str) -> None:
        self.txn.delete(file_id.encode(), db=self._db["files"])

    def put_batch(self, batch: LiveBatch) -> None:
        key = _BATCH_KEY.pack(batch.partition, batch.last)
        self.txn.put(key, _json_out(key, batch.to_json()), db=self._db["batches"])

    def delete_batch(self, partition: int, last_offset: int) -> None:
        self.txn.delete(_BATCH_KEY.pack(partition, last_offset), db=self._db["batches"])

    def put_producer(self, state: ProducerState) -> None:
        key = _PID_KEY.pack(state.producer_id)
        value = _json_out(key, producer_to_json(state))
        self.txn.put(key, value, db=self._db["producers"])
        _remember("producers", key, value, state)

    def delete_producer(self, producer_id: int) -> None:
        self.txn.delete(_PID_KEY.pack(producer_id), db=self._db["producers"])

    def put_outcome(self, commit_id: str, outcome: CommitOutcome) -> None:
        key = commit_id.encode()
        self.txn.put(key, _json_out(key, outcome.to_json()), db=self._db["outcomes"])

    def prune_outcomes(self, below_version: int) -> None:
        """Forget outcomes of commits older than ``below_version``."""
        with self.txn.cursor(db=self._db["outcomes"]) as cur:
            stale = [bytes(k) for k, v in cur if _version_of_outcome(k, v) < below_version]
        for k in stale:
            self.txn.delete(k, db=self._db["outcomes"])

    def put_pending(self, path: str, due_ms: int) -> None:
        self.txn.put(path.encode(), _U64.pack(due_ms), db=self._db["pending"])

    def delete_pending(self, path: str) -> None:
        self.txn.delete(path.encode(), db=self._db["pending"])

    def put_cleaner(self, partition: int, state: CleanerState) -> None:
        key = _PART_KEY.pack(partition)
        self.txn.put(key, _json_out(key, state.to_json()), db=self._db["cleaner"])

    def put_condemned(self, path: str, at_ms: int) -> None:
        self.txn.put(path.encode(), _U64.pack(max(at_ms, 0)), db=self._db["condemned"])

    def set_applied_commit(self, version: int, commit_id: str, crc: int) -> None:
        """Record the newest commit applied (checked against the head by the next refresh)."""
        self.put_meta("applied_commit", _dumps([version, commit_id, crc]))

    def clear(self, *, keep_index: bool = False) -> None:
        """Empty every database (the index and its runs too unless ``keep_index``); the meta
        database keeps the cache's layout (``cache_layout``), which an emptied cache has too."""
        for name, db in self._db.items():
            if keep_index and name in ("index", "runs"):
                continue
            self.txn.drop(db, delete=False)
        self.put_meta("cache_layout", CACHE_LAYOUT)
