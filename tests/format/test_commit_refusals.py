"""The encoder refuses every commit the decoder would refuse: one set of rules, checked on what
is written as on what is read, so kvlog never writes a commit it cannot read back."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.errors import InvalidRecordError, KvlogError
from kvlog.format import (
    COMMIT_KINDS,
    BatchEntry,
    BatchLocation,
    Commit,
    FileEntry,
    Identity,
    decode_commit,
    decode_identity,
    encode_commit,
    encode_identity,
)

NAME = "log/00000000000000000007.json"
NAN, INF = float("nan"), float("inf")

BATCH = BatchEntry(2, BatchLocation(312, 448, 7, 2, 18, -5, 9), producer_id=11, epoch=1, base_sequence=4,
                   base_offset=10, last_offset=11, present=None, tombstone_horizon_ms=1_700_000_000_000,
                   digest=99)
FILE = FileEntry("f1", "data/0/f1.arrow", 0, 1234, 99, (BATCH,))


def commit_of(kind: str) -> Commit:
    """A valid commit of ``kind`` carrying every field."""
    info: Any = {"replace": {"cleaner": {"0": {"checkpoint": 5, "last_round_ms": 1, "partial": False}}},
                            "offsets": {"group": "g", "offsets": {"0": 3}},
                            "pin": {"name": "n", "version": 6, "paths": ["data/0/f1.arrow"]},
                            "unpin": {"name": "n"}}.get(kind, {})
    return Commit(7, "c7", 1_700_000_000_000, kind, add=(FILE,), remove=("f0",), producer_id=11, epoch=2,
                  info=info, previous_id="c6")


def _batch(**changes: Any) -> Any:
    return lambda c: dataclasses.replace(c, add=(dataclasses.replace(FILE, batches=(
        dataclasses.replace(BATCH, **changes),)),))


def _location(**changes: Any) -> Any:
    return _batch(location=dataclasses.replace(BATCH.location, **changes))


def _file(**changes: Any) -> Any:
    return lambda c: dataclasses.replace(c, add=(dataclasses.replace(FILE, **changes),))


def _commit(**changes: Any) -> Any:
    return lambda c: dataclasses.replace(c, **changes)


BAD_FIELDS: dict[str, list[Any]] = {
    "version": [-1, 2**63, 1.5, True, "3", NAN, None],
    "commit_id": ["", "\ud800", "x" * 512, 5, None],
    "timestamp_ms": [2**63, -(2**63) - 1, NAN, INF, 1.0, None],
    "producer_id": [-1, 2**63, 1.5, False],
    "epoch": [2**63, 1.5, NAN],
    "previous_id": [5],
    "remove": [(5,), ("",), ("\udfff",)],
    "info": [{1: "x"}, {"x": NAN}, {"x": INF}, {"x": (1, 2)}, {"x": object()}, {"x": {2: 1}}],
    "file_id": ["", "\ud800", 7],
    "path": ["", "p" * 512, None],
    "level": [-1, 2**63, 1.5],
    "size": [-1, NAN],
    "file_crc": [True, 2**63],
    "partition": [-1, 2**16, 1.5, None],
    "position": [-1, 2**63, NAN],
    "length": [INF, -1],
    "crc": [True, -1],
    "count": [-1, 2.0],
    "data_bytes": [2**63],
    "min_timestamp": [2**63, NAN, -INF],
    "max_timestamp": [-(2**63) - 1, "9"],
    "schema": [-1, 2.0],
    "batch_producer_id": [-1, 2**63],
    "batch_epoch": [2**63, NAN],
    "base_sequence": [-1, 0.5],
    "base_offset": [-1, 2**63, NAN],
    "last_offset": [-1, INF],
    "present": [5, b"\x00"],
    "tombstone_horizon_ms": [NAN, INF, -INF, 2**63, 1.5],
    "digest": [2**63, NAN],
}
SETTERS = {
    "version": lambda v: _commit(version=v), "commit_id": lambda v: _commit(commit_id=v),
    "timestamp_ms": lambda v: _commit(timestamp_ms=v), "producer_id": lambda v: _commit(producer_id=v),
    "epoch": lambda v: _commit(epoch=v), "previous_id": lambda v: _commit(previous_id=v),
    "remove": lambda v: _commit(remove=v), "info": lambda v: _commit(info=v),
    "file_id": lambda v: _file(file_id=v), "path": lambda v: _file(path=v), "level": lambda v: _file(level=v),
    "size": lambda v: _file(size=v), "file_crc": lambda v: _file(crc=v),
    "partition": lambda v: _batch(partition=v), "position": lambda v: _location(position=v),
    "length": lambda v: _location(length=v), "crc": lambda v: _location(crc=v),
    "count": lambda v: _location(count=v), "data_bytes": lambda v: _location(data_bytes=v),
    "min_timestamp": lambda v: _location(min_timestamp=v), "max_timestamp": lambda v: _location(max_timestamp=v),
    "schema": lambda v: _location(schema=v), "batch_producer_id": lambda v: _batch(producer_id=v),
    "batch_epoch": lambda v: _batch(epoch=v), "base_sequence": lambda v: _batch(base_sequence=v),
    "base_offset": lambda v: _batch(base_offset=v), "last_offset": lambda v: _batch(last_offset=v),
    "present": lambda v: _batch(present=v), "tombstone_horizon_ms": lambda v: _batch(tombstone_horizon_ms=v),
    "digest": lambda v: _batch(digest=v),
}
#: Ids name the field and the value's position: a repr holding an address would differ between
#: the processes pytest-xdist collects in.
CASES = [pytest.param(f, v, id=f"{f}-{i}") for f, values in BAD_FIELDS.items() for i, v in enumerate(values)]


@pytest.mark.parametrize("kind", COMMIT_KINDS)
def test_a_valid_commit_of_every_kind_round_trips(kind: str) -> None:
    commit = commit_of(kind)
    assert decode_commit(NAME, encode_commit(commit)) == commit


@pytest.mark.parametrize(("field", "value"), CASES)
def test_every_kind_with_a_bad_field_is_refused_at_encode(field: str, value: Any) -> None:
    for kind in COMMIT_KINDS:
        bad = SETTERS[field](value)(commit_of(kind))
        with pytest.raises(InvalidRecordError, match="could not read back") as caught:
            encode_commit(bad)
        assert isinstance(caught.value, KvlogError)


@pytest.mark.parametrize("cleaner", [
    [], {"x": {}}, {"0": []}, {"65536": {}}, {"0": {"checkpoint": -1}}, {"0": {"checkpoint": 1.5}},
    {"0": {"last_round_ms": 2**63}}, {"0": {"partial": 1}}, {"0": {"checkpoint": None}},
])
def test_a_replace_with_a_cleaner_state_replay_could_not_store_is_refused(cleaner: Any) -> None:
    with pytest.raises(InvalidRecordError, match="cleaner|plain JSON"):
        encode_commit(dataclasses.replace(commit_of("replace"), info={"cleaner": cleaner}))


WIDE_INTS = st.one_of(st.integers(-(2**64), 2**64), st.sampled_from([-1, 0, 2**16, 2**63 - 1, 2**63, -(2**63)]))
ANYTHING = st.one_of(WIDE_INTS, st.floats(), st.booleans(), st.none(), st.text(max_size=3))
TEXT = st.text(max_size=6) | st.sampled_from(["", "\ud800", "x" * 520])
INFO_VALUES = st.recursive(
    st.none() | st.booleans() | WIDE_INTS | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner)
    | st.dictionaries(st.text(max_size=4) | st.integers(0, 3), inner, max_size=3),
    max_leaves=6,
)
locations = st.builds(BatchLocation, WIDE_INTS, WIDE_INTS, WIDE_INTS, WIDE_INTS, WIDE_INTS, WIDE_INTS | ANYTHING,
                      WIDE_INTS, st.just(1) | WIDE_INTS)
batches = st.builds(BatchEntry, WIDE_INTS | ANYTHING, locations, st.none() | WIDE_INTS, WIDE_INTS,
                    WIDE_INTS, st.none() | WIDE_INTS, st.none() | WIDE_INTS, st.none() | TEXT,
                    st.none() | WIDE_INTS | ANYTHING, st.none() | WIDE_INTS)
files = st.builds(FileEntry, TEXT, TEXT, WIDE_INTS, WIDE_INTS, WIDE_INTS | ANYTHING,
                  st.lists(batches, max_size=2).map(tuple))


@st.composite
def any_commits(draw: st.DrawFn) -> Commit:
    kind = draw(st.sampled_from(COMMIT_KINDS))
    info: Any = draw(st.dictionaries(st.text(max_size=4) | st.integers(0, 2) | st.just("cleaner"), INFO_VALUES,
                                max_size=3))
    version: Any = draw(WIDE_INTS | ANYTHING)
    commit_id: Any = draw(TEXT | ANYTHING)
    timestamp: Any = draw(WIDE_INTS | ANYTHING)
    epoch: Any = draw(st.none() | WIDE_INTS | ANYTHING)
    return Commit(version, commit_id, timestamp, kind,
                  add=tuple(draw(st.lists(files, max_size=2))), remove=tuple(draw(st.lists(TEXT, max_size=2))),
                  producer_id=draw(st.none() | WIDE_INTS), epoch=epoch, info=info, previous_id=draw(st.none() | TEXT))


@settings(max_examples=400, deadline=None)
@given(commit=any_commits())
def test_every_commit_the_encoder_accepts_decodes_to_an_equal_commit(commit: Commit) -> None:
    try:
        data = encode_commit(commit)
    except InvalidRecordError:
        return
    assert decode_commit(NAME, data) == commit


@pytest.mark.parametrize("change", [
    {"store_uuid": ""}, {"store_uuid": 5}, {"partitions": 0}, {"partitions": 2**16 + 1}, {"partitions": 1.5},
    {"created_ms": NAN}, {"created_ms": 2**63}, {"fingerprint_seed": -1}, {"fingerprint_seed": 2**64},
    {"format_version": 3}, {"partitions": True},
], ids=repr)
def test_an_identity_the_decoder_would_refuse_is_not_encoded(change: dict[str, Any]) -> None:
    identity = dataclasses.replace(Identity("u", 4, 1_700_000_000_000, 2**64 - 1), **change)
    with pytest.raises(InvalidRecordError, match="could not read back"):
        encode_identity(identity)


@settings(max_examples=200, deadline=None)
@given(identity=st.builds(Identity, TEXT, WIDE_INTS | ANYTHING, WIDE_INTS | ANYTHING, WIDE_INTS,
                          st.just(1) | WIDE_INTS))
def test_every_identity_the_encoder_accepts_decodes_to_an_equal_identity(identity: Identity) -> None:
    try:
        data = encode_identity(identity)
    except InvalidRecordError:
        return
    decoded = decode_identity(data)
    assert decoded == identity and not math.isnan(decoded.created_ms)
