"""Expiring index entries: flag 4 and the 8-byte expiry after the head, built and read alike by
the C extensions and their twins, checked like every other entry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlog
from kvlog.errors import CorruptDataError
from kvlog.format.columns import binary_column
from kvlog.index import entry as entry_module
from kvlog.index.entry import (
    EXPIRES_FLAG,
    INDEX_HEAD_BYTES,
    IndexEntry,
    decode_entry,
    encode_index_value,
)
from kvlog.index.keys import encode_index_key
from kvlog.index.runs import build_run, run_entries, run_find
from kvlog.meta.env import CacheDamage

pytestmark = pytest.mark.usefixtures("native")

INT64 = st.integers(-(2**63) + 1, 2**63 - 1)


@st.composite
def expiring_runs(draw: st.DrawFn) -> tuple[list[bytes], list[bytes | None], list[int | None], int]:
    keys = sorted(draw(st.lists(st.binary(min_size=1, max_size=6), max_size=30, unique=True)))
    values = [draw(st.none() | st.binary(max_size=10)) for _ in keys]
    expiries = [draw(st.none() | INT64) for _ in keys]
    return keys, values, expiries, draw(st.integers(0, 10))


@settings(max_examples=150, deadline=None)
@given(expiring_runs())
def test_a_run_with_expiries_holds_the_encoders_entries(inputs: tuple) -> None:
    keys, values, expiries, inline_limit = inputs
    n = len(keys)
    live = [v is not None for v in values]
    expiring = [e is not None and alive for e, alive in zip(expiries, live, strict=True)]
    run = build_run(binary_column(keys), binary_column(values), np.arange(n, dtype=np.int64),
                    np.full(n, 3, dtype=np.uint16), np.arange(10, 10 + n, dtype=np.int64),
                    np.array(live, dtype=bool), inline_limit,
                    np.array([e or 0 for e in expiries], dtype=np.int64), np.array(expiring, dtype=bool))
    for i, key in enumerate(keys):
        value = values[i]
        if value is None:
            assert run_find(run, key) == b""
            continue
        inline = value if len(value) <= inline_limit else None
        expected = encode_index_value(key, 3, 10 + i, inline, expiries[i])
        assert run_find(run, key) == expected
        assert decode_entry(key, expected)[1] == IndexEntry(3, 10 + i, inline, expiries[i])
        # The fast path never hands out the value of an expiring entry.
        assert entry_module._runs.inline(key, expected) == (None if expiries[i] is not None else inline)
    assert len(run_entries(run, None, None, 100)) == n


@pytest.mark.parametrize("key", [b"k", b"L" * 600])
def test_every_flipped_byte_of_an_expiring_entry_is_damage(key: bytes) -> None:
    value = encode_index_value(key, 2, 77, b"val", 1_700_000_000_100)
    lmdb_key = encode_index_key(key)
    assert value[INDEX_HEAD_BYTES - 1] & EXPIRES_FLAG
    assert decode_entry(lmdb_key, value)[1].expires_ms == 1_700_000_000_100
    for at in range(len(value)):
        for bit in (0x01, 0x80):
            bad = bytearray(value)
            bad[at] ^= bit
            with pytest.raises(CacheDamage):
                decode_entry(lmdb_key, bytes(bad))
    with pytest.raises(CacheDamage):  # cut inside the expiry
        decode_entry(lmdb_key, value[:INDEX_HEAD_BYTES + 4])


def test_a_damaged_expiring_entry_in_a_store_is_corrupt_data(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    store = kvlog.open(tmp_path / "s", cache_dir=tmp_path / "c", clock=clock, flush_interval_ms=0,
                       background_compaction=False)
    store.put(b"k", b"v", ttl_ms=1000, sync=True)
    store.log.settle_index()
    env = store.log.env
    index_db = env.dbs["index"]

    def flip(txn: object) -> None:
        raw = bytearray(txn.get(b"k", db=index_db))  # type: ignore[attr-defined]
        raw[INDEX_HEAD_BYTES + 3] ^= 0x10  # inside the expiry
        txn.put(b"k", bytes(raw), db=index_db)  # type: ignore[attr-defined]

    env.write(flip)
    with pytest.raises(CorruptDataError):
        store.get(b"k")
    store.close()
