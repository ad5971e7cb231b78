"""A damaged metadata cache never gives a wrong answer, a raw LMDB error or a crash.

The cache is derived data. Damage is found by the CRC32C of every key-index entry (B-tree and
index runs), by checking that a record read from a data file holds the key asked for, by
LMDB's own errors (raised as ``CorruptDataError`` naming the cache), and, when a cache that
changed since its last clean close is opened, by a check of the whole file before LMDB reads
it. A read that meets damage raises ``CorruptDataError``; the damage is recorded, and the next
open rebuilds what was damaged from storage, after which every key reads back exactly.

Damage is made with real LMDB (writes through the store's own environment) or by writing
into ``data.mdb``. ``KVLOG_DAMAGE_SEEDS=500`` runs the random-page test with more seeds.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.errors import CorruptDataError, KvlogError, StorageError
from kvlog.index.entry import encode_index_value
from kvlog.index.runs import RUN_ID, run_find
from kvlog.meta.env import SEALED_DBS, seal
from kvlog.storage import LocalStorage
from kvlog.storage.faulty import FaultPlan, FaultyStorage, fail
from tests.files import copy_store

SETTINGS: dict[str, Any] = {
    "flush_interval_ms": 0, "flush_bytes": 1 << 30, "max_unflushed_bytes": 1 << 30,
    "background_compaction": False, "partitions": 4,
}
SMALL = [b"small-%04d" % i for i in range(60)]
BIG = [b"big-%04d" % i for i in range(20)]  # values over inline_value_bytes: read from data files
PAGE = 4096


def _value(key: bytes) -> bytes:
    size = 1500 + len(key) if key.startswith(b"big") else 1 + sum(key) % 90
    return (key * (size // len(key) + 1))[:size]


def _fill(store: kvlog.Store, keys: list[bytes], flushes: int = 2) -> None:
    for n in range(flushes):
        for key in keys[n::flushes]:
            store.put(key, _value(key))
        store.flush()


def _all_exact(store: kvlog.Store, keys: list[bytes]) -> None:
    for key in keys:
        assert store.get(key) == _value(key), key
    assert dict(store.scan()) == {key: _value(key) for key in keys}
    assert len(store) == len(keys)


def _reads_are_exact_or_corrupt(store: kvlog.Store, keys: list[bytes]) -> None:
    for key in keys:
        try:
            assert store.get(key) == _value(key), key
        except CorruptDataError:
            pass
    for call in (lambda: dict(store.scan()), lambda: list(store.scan(reverse=True)), lambda: len(store)):
        try:
            result = call()
        except CorruptDataError:
            continue
        if isinstance(result, dict):
            assert result == {key: _value(key) for key in keys}
        elif isinstance(result, list):
            assert result == sorted(((key, _value(key)) for key in keys), reverse=True)
        else:
            assert result == len(keys)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def opened() -> Iterator[list[kvlog.Store]]:
    stores: list[kvlog.Store] = []
    yield stores
    for store in stores:
        try:
            store.close(flush=False)
        except Exception:  # noqa: BLE001 - a store left damaged on purpose is still released
            pass


def _write(store: kvlog.Store, fn: Callable[[Any, dict[str, Any]], None]) -> None:
    """Change the cache through the store's own LMDB environment (as damage would)."""
    env = store.log.env
    with env.env.begin(write=True) as txn:
        fn(txn, env.dbs)


def _flip(value: bytes, at: int) -> bytes:
    damaged = bytearray(value)
    damaged[at] ^= 0x10
    return bytes(damaged)


def _snapshot_reads(store: kvlog.Store, key: bytes) -> None:
    with store.snapshot() as snap:
        snap.get_many([SMALL[0], key])


#: Where a byte of an index value is flipped: its CRC, partition, offset, flags, inline value.
FIELDS = {"crc": 1, "partition": 5, "offset": 13, "flags": 14, "inline value": 16}


@pytest.mark.parametrize("place", ["index", "run"])
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_damaged_index_entry_is_never_returned(path: Path, opened: list[kvlog.Store], place: str,
                                                 field: str) -> None:
    store = kvlog.open(path, **SETTINGS)
    opened.append(store)
    _fill(store, SMALL + BIG)
    if place == "index":
        store.log.settle_index()
    key = SMALL[7] if field == "inline value" else BIG[3]
    at = FIELDS[field]

    def damage(txn: Any, dbs: dict[str, Any]) -> None:
        if place == "index":
            txn.put(key, _flip(txn.get(key, db=dbs["index"]), at), db=dbs["index"])
            return
        with txn.cursor(db=dbs["runs"]) as cur:
            for number, run in cur:
                value = run_find(run, key)
                if value:
                    start = run.index(value)
                    txn.put(number, _flip(run, start + at), db=dbs["runs"])
                    return
        raise AssertionError("no run holds the key")

    assert store.log.snapshot(lambda r: r.runs_pending()) == (0 if place == "index" else 2)
    _write(store, damage)
    for read in (lambda: store.get(key), lambda: store[key], lambda: store.get(key.decode()),
                 lambda: dict(store.scan()), lambda: list(store.scan(reverse=True)),
                 lambda: store.get_many([SMALL[0], key]), lambda: _snapshot_reads(store, key)):
        with pytest.raises(CorruptDataError) as raised:
            read()
        assert raised.value.name == store.log.env.name
    assert store.get(SMALL[0]) == _value(SMALL[0])  # the rest of the index still answers
    assert store.log.snapshot(lambda r: r.get_meta("index_ready")) == b"0"  # rebuilt at the next open
    if place == "run":
        with pytest.raises(CorruptDataError):
            store.log.settle_index()  # a damaged run is never merged into the B-tree
    store.close(flush=False)
    again = kvlog.open(path, **SETTINGS)
    opened.append(again)
    _all_exact(again, SMALL + BIG)


def test_an_entry_pointing_at_another_keys_record_is_refused(path: Path, opened: list[kvlog.Store]) -> None:
    """An entry whose checksum holds but whose offset is another key's (the batch directory or
    a collision): the record read does not hold the key, so its value is never returned."""
    store = kvlog.open(path, **SETTINGS)
    opened.append(store)
    _fill(store, BIG)
    store.log.settle_index()
    victim, other = BIG[1], BIG[2]
    target = store.log.snapshot(lambda r: r.index_get(other))
    assert target is not None and target.inline is None
    _write(store, lambda txn, dbs: txn.put(
        victim, encode_index_value(victim, target.partition, target.offset, None), db=dbs["index"]))
    for read in (lambda: store.get(victim), lambda: dict(store.scan())):
        with pytest.raises(CorruptDataError):
            read()
    assert store.get(other) == _value(other)
    store.close(flush=False)
    again = kvlog.open(path, **SETTINGS)
    opened.append(again)
    _all_exact(again, BIG)


def test_a_crafted_index_run_raises_instead_of_crashing(path: Path, opened: list[kvlog.Store]) -> None:
    """25 bytes whose first key ends far past the run: lookups and scans raise."""
    store = kvlog.open(path, **SETTINGS)
    opened.append(store)
    _fill(store, SMALL)
    crafted = struct.pack("<IIIIII", 0x3252564B, 2, 0xFFFFFF00, 1, 0, 0) + b"k"
    _write(store, lambda txn, dbs: txn.put(RUN_ID.pack(10**6), crafted, db=dbs["runs"]))
    for read in (lambda: store.get(SMALL[3]), lambda: store.get(b"zzz"), lambda: dict(store.scan()),
                 lambda: len(store)):
        with pytest.raises(CorruptDataError):
            read()
    store.close(flush=False)
    again = kvlog.open(path, **SETTINGS)
    opened.append(again)
    _all_exact(again, SMALL)


def _meta(data: bytes) -> tuple[int, int]:
    """The main database's root page and the last page of an LMDB file (the newer meta page)."""
    metas = [struct.unpack_from("<Q", data, PAGE * m + 16 + 128)[0] for m in (0, 1)]
    meta = PAGE * (0 if metas[0] >= metas[1] else 1) + 16
    main_root = struct.unpack_from("<Q", data, meta + 72 + 40)[0]
    last = struct.unpack_from("<Q", data, meta + 120)[0]
    return main_root, last


def _db_root(data: bytes, name: bytes) -> int:
    """The root page of a named database (the main database is one leaf page here)."""
    main_root, _last = _meta(data)
    page = main_root * PAGE
    lower = struct.unpack_from("<H", data, page + 12)[0]
    for i in range((lower - 16) // 2):
        at = page + struct.unpack_from("<H", data, page + 16 + 2 * i)[0]
        ksize = struct.unpack_from("<H", data, at + 6)[0]
        if data[at + 8 : at + 8 + ksize] == name:
            return int(struct.unpack_from("<Q", data, at + 8 + ksize + 40)[0])
    raise AssertionError(f"no database {name!r}")


def test_an_lmdb_error_is_a_corrupt_data_error_and_the_cache_is_rebuilt(path: Path,
                                                                        opened: list[kvlog.Store]) -> None:
    store = kvlog.open(path, **SETTINGS)
    opened.append(store)
    _fill(store, SMALL)
    store.log.settle_index()
    data_file = path / "cache" / "data.mdb"
    root = _db_root(data_file.read_bytes()[: 4 * 1024 * 1024], b"index")
    with open(data_file, "r+b") as f:  # the index's root page becomes a page of no kind
        f.seek(root * PAGE + 10)
        f.write(b"\x00\x00")
    for read in (lambda: store.get(SMALL[1]), lambda: store.get(SMALL[1].decode()), lambda: dict(store.scan()),
                 lambda: store.log.snapshot(lambda r: list(r.index_scan()))):
        with pytest.raises(CorruptDataError) as raised:
            read()
        assert raised.value.name == store.log.env.name
    store.close(flush=False)
    again = kvlog.open(path, **SETTINGS)  # the cache was marked: deleted, rebuilt from storage
    opened.append(again)
    _all_exact(again, SMALL)


#: A batch directory value as damage leaves it: failing its checksum, JSON cut short, or sealed
#: JSON of the wrong shape (an object missing its fields, or not an object at all).
SPOILED_BATCH: dict[str, Callable[[bytes, bytes], bytes]] = {
    "checksum": lambda key, value: _flip(value, 9),
    "json": lambda key, value: seal(key, b'{"base": 0, "pa'),
    "fields missing": lambda key, value: seal(key, b'{"base": 0}'),
    "not an object": lambda key, value: seal(key, b"[]"),
}


@pytest.mark.parametrize("damage", sorted(SPOILED_BATCH))
def test_damaged_metadata_found_while_opening_rebuilds_the_cache(path: Path, opened: list[kvlog.Store],
                                                                damage: str) -> None:
    """Damage inside a value LMDB stores whole (a batch directory entry), found while the cache
    catches up: the cache is deleted and rebuilt before the store is handed out."""
    store = kvlog.open(path, **SETTINGS)
    opened.append(store)
    _fill(store, SMALL)

    def spoil(txn: Any, dbs: dict[str, Any]) -> None:
        with txn.cursor(db=dbs["batches"]) as cur:
            assert cur.first()
            key = bytes(cur.key())
            value = SPOILED_BATCH[damage](key, bytes(cur.value()))
            txn.put(key, value, db=dbs["batches"])
        txn.put(b"index_ready", seal(b"index_ready", b"0"), db=dbs["meta"])  # the rebuild reads every batch

    _write(store, spoil)
    store.close(flush=False)
    again = kvlog.open(path, **SETTINGS)
    opened.append(again)
    _all_exact(again, SMALL)


#: How each catalog database is read, and a sealed value of its that is JSON but not the shape
#: of the value it holds.
SHAPE_READS: dict[str, tuple[Callable[[Any], object], bytes]] = {
    "batches": (lambda r: list(r.iter_batches(0, 0)) + list(r.iter_batches(1, 0)), b"[]"),
    "files": (lambda r: list(r.iter_files()), b"7"),
    "parts": (lambda r: list(r.iter_partitions()), b'"end"'),
    "cleaner": (lambda r: list(r.iter_cleaner()), b"[1, 2]"),
    "producers": (lambda r: list(r.iter_producers()), b'{"id": 1, "epoch": 0, "last_ms": 0, "parts": []}'),
}


@pytest.mark.parametrize("db", sorted(SHAPE_READS))
def test_a_catalog_value_of_the_wrong_shape_is_corrupt_data(path: Path, opened: list[kvlog.Store],
                                                            db: str) -> None:
    """A sealed catalog value whose JSON has the wrong shape is damage like any other: the read
    raises ``CorruptDataError`` naming the cache (never a raw Python error), and the next open
    rebuilds the cache."""
    store = kvlog.open(path, **SETTINGS)
    opened.append(store)
    _fill(store, SMALL)
    store.compact(force=True)  # cleaner state for every partition holding records
    read, shaped = SHAPE_READS[db]

    def spoil(txn: Any, dbs: dict[str, Any]) -> None:
        with txn.cursor(db=dbs[db]) as cur:
            assert cur.first()
            key = bytes(cur.key())
        txn.put(key, seal(key, shaped), db=dbs[db])

    _write(store, spoil)
    with pytest.raises(CorruptDataError) as raised:
        store.log.snapshot(read)
    assert raised.value.name == store.log.env.name
    store.close(flush=False)
    again = kvlog.open(path, **SETTINGS)
    opened.append(again)
    _all_exact(again, SMALL)


def test_a_cache_of_another_layout_is_rebuilt(path: Path, opened: list[kvlog.Store]) -> None:
    """A cache whose values carry no checksums (no ``cache_layout``): emptied when it is opened
    and rebuilt from storage."""
    store = kvlog.open(path, **SETTINGS)
    opened.append(store)
    _fill(store, SMALL + BIG)
    store.log.settle_index()

    def old_layout(txn: Any, dbs: dict[str, Any]) -> None:
        for name in ("index", *SEALED_DBS):
            with txn.cursor(db=dbs[name]) as cur:
                entries = [(bytes(k), bytes(v)) for k, v in cur]
            for key, value in entries:
                txn.put(key, value[4:], db=dbs[name])  # index entries: >HQB and the inline value
        txn.delete(b"cache_layout", db=dbs["meta"])

    _write(store, old_layout)
    store.close(flush=False)
    again = kvlog.open(path, **SETTINGS)
    opened.append(again)
    _all_exact(again, SMALL + BIG)


# -- random damage to the file of a closed store -------------------------------------------------

SEEDS = int(os.environ.get("KVLOG_DAMAGE_SEEDS", "4"))
KEYS = SMALL + BIG + [b"more-%05d" % i for i in range(400)]


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    """Closed stores to damage copies of: the index settled, or with index runs pending."""
    made = {}
    for kind in ("settled", "runs"):
        path = tmp_path_factory.mktemp(kind) / "store"
        store = kvlog.open(path, **SETTINGS)
        _fill(store, KEYS, flushes=4)
        if kind == "settled":
            store.close()
        else:
            assert store.log.snapshot(lambda r: r.runs_pending()) == 4
            store.close(flush=False)  # leaves the runs pending
        made[kind] = (path, _meta((path / "cache" / "data.mdb").read_bytes()[: 64 * 1024 * 1024])[1])
    return made


def _damage(data_file: Path, last_page: int, rng: random.Random, how: str) -> None:
    with open(data_file, "r+b") as f:
        for _ in range(rng.randint(1, 3)):
            page = rng.randrange(2, last_page + 1)
            if how == "pages":
                f.seek(page * PAGE)
                f.write(rng.randbytes(PAGE))
            elif how == "bytes":
                length = rng.randint(1, 64)
                f.seek(page * PAGE + rng.randrange(0, PAGE - length))
                f.write(rng.randbytes(length))
            else:
                at = page * PAGE + rng.randrange(0, PAGE)
                f.seek(at)
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes([byte ^ (1 << rng.randrange(8))]))


@pytest.mark.parametrize("kind", ["settled", "runs"])
@pytest.mark.parametrize("how", ["pages", "bytes", "bits"])
def test_random_damage_never_gives_a_wrong_answer(templates: dict[str, tuple[Path, int]], tmp_path: Path,
                                                  kind: str, how: str) -> None:
    """Random pages, byte runs or bits of a closed store's ``data.mdb`` overwritten: opening
    and every read either answer exactly or raise ``CorruptDataError``; a second open answers
    every read exactly."""
    template, last_page = templates[kind]
    for seed in range(SEEDS):
        path = tmp_path / f"{how}-{seed}"
        copy_store(template, path)
        _damage(path / "cache" / "data.mdb", last_page, random.Random(f"{kind}-{how}-{seed}"), how)
        try:
            store = kvlog.open(path, **SETTINGS)
        except CorruptDataError:
            pass
        else:
            try:
                _reads_are_exact_or_corrupt(store, KEYS)
            finally:
                store.close(flush=False)
        again = kvlog.open(path, **SETTINGS)
        try:
            _all_exact(again, KEYS)
        finally:
            again.close(flush=False)
        shutil.rmtree(path)


def _reads_are_exact_or_refused(store: kvlog.Store, keys: list[bytes]) -> int:
    """Read every key and scan: each answer exact, or a ``KvlogError``; how many refused."""
    refused = 0
    for key in keys:
        try:
            assert store.get(key) == _value(key), key
        except KvlogError:
            refused += 1
    for call in (lambda: dict(store.scan()), lambda: store.get_many(keys), lambda: len(store)):
        try:
            result = call()
        except KvlogError:
            refused += 1
            continue
        if isinstance(result, dict):
            assert result == {key: _value(key) for key in keys}
        elif isinstance(result, list):
            assert result == [_value(key) for key in keys]
        else:
            assert result == len(keys)
    return refused


@pytest.mark.parametrize(("nth", "files"), [
    pytest.param(1, "data/*", id="1"), pytest.param(70, "data/*", id="70"),
    pytest.param(1, "log/*", id="1-inline files"), pytest.param(70, "log/*", id="70-inline files"),
])
def test_a_rebuild_failing_partway_never_answers_none_for_a_live_key(tmp_path: Path, opened: list[kvlog.Store],
                                                                      nth: int, files: str) -> None:
    """A rebuild of the key index whose read of a data file or of a commit's inline file fails
    (on the first batch, or in its second chunk of batches) leaves the open handle answering
    each key exactly or refusing with a ``KvlogError``, never with None; the next refresh
    rebuilds it, exact."""
    faulty = FaultyStorage(LocalStorage(tmp_path / "root", fsync=False))
    # Data files of their own, or inline files only: the test fails a read of the one kind of file.
    inline_bytes = 0 if files == "data/*" else 65536
    store = kvlog.open(faulty, cache_dir=tmp_path / "cache", commit_inline_bytes=inline_bytes, **SETTINGS)
    opened.append(store)
    keys = SMALL + BIG
    _fill(store, keys, flushes=60)
    batches = store.log.snapshot(lambda r: [b.path for p in range(4) for b in r.iter_batches(p, 0)])
    assert len(batches) > 70  # two chunks of batches to index
    assert all(path.startswith(files[:-1]) for path in batches)
    _all_exact(store, keys)
    store.log.batch_cache.clear()  # the rebuild reads every batch from storage
    faulty.set_plan(FaultPlan(fail("read_range", files, nth=nth)))
    store.log._committer.index_stale = True  # as after applying a commit whose data was compacted away
    with pytest.raises(StorageError):
        store.refresh()
    assert faulty.injected
    assert _reads_are_exact_or_refused(store, keys) > 0  # the index is incomplete: refused, not None
    faulty.set_plan(None)
    store.refresh()  # rebuilds the index again, the fault gone
    assert store.log.snapshot(lambda r: r.get_meta("index_ready")) == b"1"
    _all_exact(store, keys)
    assert _reads_are_exact_or_refused(store, keys) == 0
