"""Catalog rows remembered decoded (producer windows): a remembered value is used only for the
very bytes it was decoded from, so another writer's row, an aborted write, a restored or
damaged cache are always decoded and checked afresh."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.errors import CorruptDataError
from kvlog.format.producer_state import (
    BatchMeta,
    PartitionProducerState,
    ProducerState,
    producer_from_json,
    producer_to_json,
)
from kvlog.index import check_cache_file
from kvlog.meta import LmdbEnv, MetaReader, MetaTxn, acquire_env, release_env
from kvlog.meta.env import seal

U31 = st.integers(0, 2**31 - 1)
U62 = st.integers(0, 2**62)
metas = st.builds(BatchMeta, U31, U31, U62, U62, U62, st.none() | st.integers(0, 2**63 - 1))
parts = st.builds(PartitionProducerState, U31, U62, st.lists(metas, max_size=5).map(tuple))
states = st.builds(ProducerState, st.integers(0, 2**63 - 1), U31, U62,
                   st.dictionaries(st.integers(0, 65535), parts, max_size=8))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[LmdbEnv]:
    the_env = acquire_env(tmp_path / "cache", check_cache_file)
    yield the_env
    release_env(the_env)


def state(producer_id: int, epoch: int, first_offset: int) -> ProducerState:
    window = (BatchMeta(0, 4, first_offset, first_offset + 4, 1000, 77),)
    return ProducerState(producer_id, epoch, 1000, {3: PartitionProducerState(epoch, 1000, window)})


def read_producer(env: LmdbEnv, producer_id: int) -> ProducerState | None:
    reader = MetaReader(env, env.read())
    try:
        return reader.get_producer(producer_id)
    finally:
        reader.close()


def put_raw(env: LmdbEnv, s: ProducerState) -> None:
    """Write a producer row as another process would: not through this process's MetaTxn."""
    key = s.producer_id.to_bytes(8, "big")
    value = seal(key, json.dumps(producer_to_json(s)).encode())
    env.write(lambda txn: txn.put(key, value, db=env.dbs["producers"]))


@settings(max_examples=80, deadline=None)
@given(s=states)
def test_a_written_state_is_what_its_row_decodes_to(s: ProducerState) -> None:
    # The state put_producer remembers is the state its stored JSON decodes to.
    assert producer_from_json(json.loads(json.dumps(producer_to_json(s)))) == s


def test_a_row_another_writer_changed_is_decoded_afresh(env: LmdbEnv) -> None:
    mine, theirs = state(7, 1, 0), state(7, 2, 50)
    env.write(lambda txn: MetaTxn(env, txn).put_producer(mine))
    assert read_producer(env, 7) == mine
    put_raw(env, theirs)
    assert read_producer(env, 7) == theirs
    put_raw(env, mine)  # back to bytes remembered earlier: the same value
    assert read_producer(env, 7) == mine


def test_a_state_written_in_an_aborted_transaction_is_not_read(env: LmdbEnv) -> None:
    kept, dropped = state(9, 1, 0), state(9, 1, 5)
    env.write(lambda txn: MetaTxn(env, txn).put_producer(kept))

    class Abort(Exception):
        pass

    def write_then_fail(txn: object) -> None:
        MetaTxn(env, txn).put_producer(dropped)  # type: ignore[arg-type]
        raise Abort

    with pytest.raises(Abort):
        env.write(write_then_fail)
    assert read_producer(env, 9) == kept


def test_a_damaged_row_is_found_though_its_value_was_remembered(env: LmdbEnv) -> None:
    s = state(11, 1, 0)
    env.write(lambda txn: MetaTxn(env, txn).put_producer(s))
    assert read_producer(env, 11) == s
    key = (11).to_bytes(8, "big")

    def damage(txn: object) -> None:
        value = bytearray(txn.get(key, db=env.dbs["producers"]))  # type: ignore[attr-defined]
        value[-3] ^= 0x01
        txn.put(key, bytes(value), db=env.dbs["producers"])  # type: ignore[attr-defined]

    env.write(damage)
    with pytest.raises(CorruptDataError):
        read_producer(env, 11)


def test_two_stores_share_nothing_but_equal_bytes(tmp_path: Path) -> None:
    # Rows are remembered by database, key and bytes: a second cache holding another state
    # under the same producer id reads its own.
    one = acquire_env(tmp_path / "one", check_cache_file)
    two = acquire_env(tmp_path / "two", check_cache_file)
    try:
        a, b = state(5, 1, 0), state(5, 3, 100)
        one.write(lambda txn: MetaTxn(one, txn).put_producer(a))
        two.write(lambda txn: MetaTxn(two, txn).put_producer(b))
        for _ in range(2):
            assert read_producer(one, 5) == a
            assert read_producer(two, 5) == b
    finally:
        release_env(one)
        release_env(two)
