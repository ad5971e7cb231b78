"""Random workloads with random compaction points keep a store equal to a dict model.

Each example opens a fresh store with a tiny offset map (64 to 1024 bytes: one
to 64 keys per pass, so most rounds are partial), applies puts, deletes and
flushes over a small key space, compacts at random moments with the clock
moved by random amounts (cleaning rounds and L0 merges), and closes and
reopens the store, sometimes with a fresh cache. After every round:

* ``get`` and ``scan`` equal the model (reads see unflushed writes too);
* ``check()`` finds nothing;
* offsets in ``changes()`` strictly increase within each partition, and every
  record there is one the log held before (same partition, offset, key, value);
* the latest durable record of every key is still in the log, except a
  tombstone, which may be gone, but then the key has no record left at all.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import kvlog
from kvlog import ManualClock
from kvlog.storage import LocalStorage

KEYS = [f"k{i}" for i in range(7)]

PUT = st.tuples(st.just("put"), st.sampled_from(KEYS), st.integers(0, 99))
DELETE = st.tuples(st.just("delete"), st.sampled_from(KEYS))
FLUSH = st.tuples(st.just("flush"))
COMPACT = st.tuples(st.just("compact"), st.sampled_from([0, 1, 10, 40, 200, 5_000]), st.booleans())
REOPEN = st.tuples(st.just("reopen"), st.booleans())
OPS = st.lists(st.one_of(PUT, PUT, PUT, DELETE, FLUSH, COMPACT, COMPACT, REOPEN), min_size=1, max_size=40)

SETTINGS = st.fixed_dictionaries({
    "partitions": st.integers(1, 3),
    "offset_map_bytes": st.sampled_from([64, 128, 256, 1024]),
    "offset_map_load_factor": st.sampled_from([0.25, 0.5, 0.9, 1.0]),
    "delete_retention_ms": st.sampled_from([0, 50, 1_000]),
    "min_compaction_lag_ms": st.sampled_from([0, 0, 30]),
    "max_compaction_lag_ms": st.sampled_from([None, 100]),
    "min_cleanable_dirty_ratio": st.sampled_from([0.0, 0.3, 0.5, 1.0]),
    "inline_value_bytes": st.sampled_from([0, 1024]),
    "l0_merge_files": st.sampled_from([2, 3, 32]),
})

Rec = tuple[int, int, bytes, bytes | None]


def check_against_model(store: kvlog.Store, model: dict[bytes, bytes | None],
                        durable: dict[bytes, Rec], known: set[Rec]) -> None:
    expected = {k: v for k, v in model.items() if v is not None}
    assert dict(store.scan()) == expected
    assert [k for k, _ in store.scan(reverse=True)] == sorted(expected, reverse=True)
    for key in KEYS:
        assert store.get(key) == model.get(key.encode())
    assert store.check() == []
    records = [(r.partition, r.offset, r.key, r.value) for r in store.changes()]
    assert set(records) <= known, "a record changed or appeared from nowhere"
    last_offset: dict[int, int] = {}
    last_of_key: dict[bytes, Rec] = {}
    for rec in records:
        p, offset, key, _value = rec
        assert offset > last_offset.get(p, -1)
        last_offset[p] = offset
        last_of_key[key] = rec
    for key, rec in durable.items():
        if rec[3] is not None:
            assert last_of_key.get(key) == rec, f"the latest value of {key!r} was lost"
        else:
            assert last_of_key.get(key) in (rec, None), f"an older value of deleted {key!r} came back"


@settings(max_examples=45, deadline=None)
@given(config=SETTINGS, ops=OPS)
def test_random_workloads_with_random_compactions_match_a_dict_model(
    config: dict[str, Any], ops: list[tuple[Any, ...]],
) -> None:
    if int(config["offset_map_bytes"] // 16 * config["offset_map_load_factor"]) < 1:
        config["offset_map_load_factor"] = 1.0
    clock = ManualClock(1_700_000_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        caches = 0

        def reopen() -> kvlog.Store:
            return kvlog.open(
                LocalStorage(Path(tmp) / "store", fsync=False), cache_dir=Path(tmp) / f"cache-{caches}",
                clock=clock, flush_interval_ms=0, flush_bytes=1 << 30, max_unflushed_bytes=1 << 30,
                background_compaction=False, **config,
            )

        store = reopen()
        try:
            model: dict[bytes, bytes | None] = {}
            durable: dict[bytes, Rec] = {}
            known: set[Rec] = set()
            for op in [*ops, ("flush",), ("compact", 10_000, False)]:
                if op[0] == "put":
                    clock.advance(1)
                    store.put(op[1], str(op[2]))
                    model[op[1].encode()] = str(op[2]).encode()
                elif op[0] == "delete":
                    clock.advance(1)
                    store.delete(op[1])
                    model[op[1].encode()] = None
                elif op[0] == "flush":
                    store.flush()
                    for r in store.changes():
                        rec = (r.partition, r.offset, r.key, r.value)
                        known.add(rec)
                        durable[r.key] = rec
                elif op[0] == "compact":
                    clock.advance(op[1])
                    report = store.compact(force=op[2])
                    assert not report.refused
                    check_against_model(store, model, durable, known)
                elif op[0] == "reopen":
                    # A clean close flushes; with a fresh cache the metadata is replayed from the log.
                    store.close()
                    caches += int(op[1])
                    store = reopen()
                    for r in store.changes():
                        rec = (r.partition, r.offset, r.key, r.value)
                        known.add(rec)
                        durable[r.key] = rec
                    check_against_model(store, model, durable, known)
            # Rounds to a fixed point: afterwards every key has exactly one record left.
            for _ in range(200):
                if store.compact(force=True).partial is False:
                    break
            check_against_model(store, model, durable, known)
            keys = [r.key for r in store.changes()]
            assert len(keys) == len(set(keys))
        finally:
            store.close(flush=False)
