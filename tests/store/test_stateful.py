"""A model test: a Store and a dict driven side by side.

The machine writes with puts, deletes and batches (some aborted), some puts with a time to
live, flushes, compacts (on a manual clock that moves tombstones past their horizon and
expiring records past their expiry),
reads with get/contains/len/scan, closes and reopens, crashes and reopens
(``close(flush=False)``), and keeps a second, read-only handle with its own
metadata cache, and snapshots: each holds a copy of ``model`` frozen when it was taken
and must keep reading it through later writes, flushes, compactions and GC (on the
shortest delete delay, the clock moved past it, so GC really deletes replaced files).
Two models are kept: ``model`` (what the writer must read) and
``durable`` (what survives a crash: everything before the last flush, sync
write, batch exit or close). Nothing flushes on its own (flush_interval_ms=0,
huge flush_bytes and max_unflushed_bytes), so the read-only handle must see
exactly ``durable``, never more. ``store.check()`` must be empty after every step. The models
keep each key's value and expiry; every read must hide a record whose expiry the clock has
reached (and never show an older value of its key instead).

Keys come from a small alphabet, so collisions and shared prefixes are common,
and include keys of 478..503 bytes sharing their first 480 bytes, on both
sides of the index's 480-byte direct-key limit.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from store_support import EXPLICIT_FLUSH, Root

import kvlog
from kvlog.testing.pytest_plugin import TEST_BUCKET

# -- strategies ---------------------------------------------------------------------------------

_LONG_LENGTHS = [478, 479, 480, 481, 500]

short_keys = st.text(alphabet="akz", min_size=1, max_size=3).map(str.encode)
long_keys = st.builds(
    lambda n, tail: b"k" * n + tail.encode(),
    st.sampled_from(_LONG_LENGTHS),
    st.text(alphabet="akz", max_size=3),
)
keys = st.one_of(short_keys, short_keys, long_keys)
bounds = st.none() | keys | st.just(b"k" * 480) | st.just(b"k" * 481)
prefixes = st.none() | st.just(b"") | st.text(alphabet="akz", min_size=1, max_size=2).map(str.encode) | st.builds(
    lambda n, tail: b"k" * n + tail.encode(), st.sampled_from([479, 480, 481]), st.text(alphabet="akz", max_size=1)
)
# Mostly small (inlined in the index) values, sometimes larger than inline_value_bytes (read from data files).
values = st.builds(lambda head, pad: head + b"v" * pad, st.binary(max_size=6), st.sampled_from([0, 0, 0, 1500]))
batch_ops = st.lists(st.tuples(keys, st.none() | values), min_size=1, max_size=8)
#: Times to live: mostly none, else shorter or longer than the clock's steps.
ttls = st.sampled_from([None, None, None, 1, 500, 2000])
#: A model of the store: each key's value and expiry (None: never).
Model = dict[bytes, tuple[bytes, int | None]]


#: Compaction with a small offset map, quick merges and short tombstone retention, on the
#: machine's manual clock (producers never expire within a run).
COMPACTION: dict[str, Any] = {
    "offset_map_bytes": 1 << 20,
    "l0_merge_files": 3,
    "delete_retention_ms": 1000,
    "producer_id_expiration_ms": 30 * 24 * 3600 * 1000,
}


class Boom(Exception):
    """Raised inside a ``with store.batch()`` block to abort it."""


def _as_given(key: bytes, as_str: bool) -> bytes | str:
    """The key as bytes, or as the str whose UTF-8 encoding it is."""
    return key.decode("ascii") if as_str else key


def _expected_scan(
    model: dict[bytes, bytes], start: bytes | None, stop: bytes | None, prefix: bytes | None, reverse: bool
) -> list[tuple[bytes, bytes]]:
    out = [
        (k, v) for k, v in sorted(model.items())
        if (start is None or k >= start) and (stop is None or k < stop)
        and (prefix is None or k.startswith(prefix))
    ]
    return out[::-1] if reverse else out


# -- the machine --------------------------------------------------------------------------------


class StoreMachine(RuleBasedStateMachine):
    """Store vs dict. Subclasses set :meth:`make_root`."""

    def make_root(self) -> Root:
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.root = self.make_root()
        self.clock = kvlog.ManualClock()
        # A low run limit: reads meet pending index runs, and commits past the limit settle them.
        self.settings: dict[str, Any] = {**EXPLICIT_FLUSH, **COMPACTION, "index_run_limit": 3,
                                         "file_delete_delay_ms": 1000}
        self.store = self.root.open(partitions=3, clock=self.clock, **self.settings)
        self.reader = self.root.open(cache="reader", read_only=True, clock=self.clock)
        self.stored: Model = {}
        self.durable_stored: Model = {}
        self.version = self.store.flush()
        #: Open snapshots of ``store``, each with the model frozen when it was taken.
        self.snapshots: list[tuple[kvlog.Snapshot, dict[bytes, bytes]]] = []

    def _live(self, stored: Model) -> dict[bytes, bytes]:
        now = self.clock.now_ms()
        return {k: v for k, (v, expires) in stored.items() if expires is None or now < expires}

    @property
    def model(self) -> dict[bytes, bytes]:
        """What the writer must read now."""
        return self._live(self.stored)

    @property
    def durable(self) -> dict[bytes, bytes]:
        """What survives a crash, as read now."""
        return self._live(self.durable_stored)

    def _expiry(self, ttl: int | None) -> int | None:
        return None if ttl is None else self.clock.now_ms() + ttl

    def teardown(self) -> None:
        for snap, _frozen in self.snapshots:
            snap.close()
        self.reader.close()
        self.store.close(flush=False)
        shutil.rmtree(self.root.workdir, ignore_errors=True)
        if self.root.kind == "local":
            shutil.rmtree(self.root.uri, ignore_errors=True)

    def _made_durable(self) -> None:
        self.durable_stored = dict(self.stored)

    # -- writes ---------------------------------------------------------------------------------
    @rule(key=keys, value=values, sync=st.booleans(), as_str=st.booleans(), ttl=ttls)
    def put(self, key: bytes, value: bytes, sync: bool, as_str: bool, ttl: int | None) -> None:
        self.store.put(_as_given(key, as_str), value, sync=sync, ttl_ms=ttl)
        self.stored[key] = (value, self._expiry(ttl))
        if sync:
            self._made_durable()

    @rule(key=keys, value=values)
    def set_item(self, key: bytes, value: bytes) -> None:
        self.store[key] = value
        self.stored[key] = (value, None)

    @rule(key=keys, sync=st.booleans())
    def delete(self, key: bytes, sync: bool) -> None:
        self.store.delete(key, sync=sync)
        self.stored.pop(key, None)
        if sync:
            self._made_durable()

    @rule(key=keys)
    def del_item(self, key: bytes) -> None:
        if key in self.model:
            del self.store[key]
            del self.stored[key]
        else:
            with pytest.raises(KeyError):
                del self.store[key]

    @rule(ops=batch_ops, ttl=ttls)
    def batch(self, ops: list[tuple[bytes, bytes | None]], ttl: int | None) -> None:
        with self.store.batch() as b:
            for i, (key, value) in enumerate(ops):
                if value is None:
                    b.delete(key)
                else:
                    b.put(key, value, ttl_ms=ttl if i % 2 else None)
            assert len(b) == len(ops)
        for i, (key, value) in enumerate(ops):
            if value is None:
                self.stored.pop(key, None)
            else:
                self.stored[key] = (value, self._expiry(ttl if i % 2 else None))
        self._made_durable()

    @rule(ops=batch_ops)
    def aborted_batch(self, ops: list[tuple[bytes, bytes | None]]) -> None:
        version = self.store.log.version
        with pytest.raises(Boom):
            with self.store.batch() as b:
                for key, value in ops:
                    if value is None:
                        b.delete(key)
                    else:
                        b.put(key, value)
                raise Boom
        assert self.store.log.version == version
        for key, _value in ops:
            assert self.store.get(key) == self.model.get(key)

    @rule()
    def flush(self) -> None:
        version = self.store.flush()
        assert version >= self.version
        self.version = version
        self._made_durable()

    @rule()
    def settle_index(self) -> None:
        """Merge the commits' index runs into the index's B-tree: no read may change."""
        self.store.log.settle_index()
        assert self.store.log.snapshot(lambda r: r.runs_pending()) == 0

    # -- reads ----------------------------------------------------------------------------------
    @rule(key=keys, as_str=st.booleans())
    def get(self, key: bytes, as_str: bool) -> None:
        given = _as_given(key, as_str)
        assert self.store.get(given) == self.model.get(key)
        assert self.store.get(given, b"<default>") == self.model.get(key, b"<default>")
        if key in self.model:
            assert self.store[given] == self.model[key]
        else:
            with pytest.raises(KeyError):
                self.store[given]

    @rule(key=keys)
    def contains(self, key: bytes) -> None:
        assert (key in self.store) == (key in self.model)

    @rule()
    def length_and_iteration(self) -> None:
        assert len(self.store) == len(self.model)
        assert list(self.store) == sorted(self.model)

    @rule(start=bounds, stop=bounds, prefix=prefixes, reverse=st.booleans())
    def scan(self, start: bytes | None, stop: bytes | None, prefix: bytes | None, reverse: bool) -> None:
        got = list(self.store.scan(start, stop, prefix=prefix, reverse=reverse))
        assert got == _expected_scan(self.model, start, stop, prefix, reverse)

    @rule(data=st.data())
    def get_many(self, data: st.DataObject) -> None:
        asked = data.draw(st.lists(st.sampled_from(sorted(self.model)) | keys, max_size=12)
                          if self.model else st.lists(keys, max_size=12))
        assert self.store.get_many(asked) == [self.model.get(k) for k in asked]

    # -- snapshots --------------------------------------------------------------------------------
    def _snapshot(self) -> None:
        self.snapshots.append((self.store.snapshot(), dict(self.model)))

    @precondition(lambda self: len(self.snapshots) < 3)
    @rule()
    def take_snapshot(self) -> None:
        self._snapshot()

    @precondition(lambda self: bool(self.snapshots))
    @rule(data=st.data())
    def read_snapshot(self, data: st.DataObject) -> None:
        snap, frozen = data.draw(st.sampled_from(self.snapshots))
        key = data.draw(st.sampled_from(sorted(frozen)) | keys if frozen else keys)
        assert snap.get(key) == frozen.get(key)
        assert (key in snap) == (key in frozen)
        asked = data.draw(st.lists(keys, max_size=8)) + [key]
        assert snap.get_many(asked) == [frozen.get(k) for k in asked]
        start, prefix, reverse = data.draw(bounds), data.draw(prefixes), data.draw(st.booleans())
        got = list(snap.scan(start, None, prefix=prefix, reverse=reverse))
        assert got == _expected_scan(frozen, start, None, prefix, reverse)

    @precondition(lambda self: bool(self.snapshots))
    @rule(data=st.data())
    def close_snapshot(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.snapshots) - 1))
        snap, frozen = self.snapshots.pop(i)
        assert list(snap.scan()) == sorted(frozen.items())
        snap.close()
        with pytest.raises(kvlog.StoreClosedError):
            snap.get(b"a")

    @rule(key=keys, big=st.booleans(), snapshot_first=st.booleans())
    def compact_and_gc_under_snapshots(self, key: bytes, big: bool, snapshot_first: bool) -> None:
        """A flushed value (``big``: not inline), then a snapshot (if ``snapshot_first``) and an
        overwrite, a compaction replacing every file, and GC with every replaced file past its
        delay: every open snapshot still reads its frozen model, from storage (no cached batch)."""
        self.store.put(key, b"before-" + b"b" * (1500 if big else 0))
        self.stored[key] = (b"before-" + b"b" * (1500 if big else 0), None)
        self.store.flush()
        if snapshot_first and len(self.snapshots) < 3:
            self._snapshot()
        self.store.put(key, b"after")
        self.stored[key] = (b"after", None)
        self.store.flush()
        self._made_durable()
        self.store.compact(force=True)
        self.clock.advance(self.settings["file_delete_delay_ms"] + 1)
        self.store.gc()
        self.store.log.batch_cache.clear()  # values not inline are read from storage again
        for snap, frozen in self.snapshots:
            assert list(snap.scan()) == sorted(frozen.items())
            assert snap.get_many(sorted(frozen)) == [frozen[k] for k in sorted(frozen)]
        assert self.store.get(key) == b"after"

    # -- compaction and time -------------------------------------------------------------------
    @rule(force=st.booleans(), flush_first=st.booleans())
    def compact(self, force: bool, flush_first: bool) -> None:
        if flush_first:  # compaction reads durable records only
            self.store.flush()
            self._made_durable()
        report = self.store.compact(force=force)
        assert isinstance(report, kvlog.CompactionReport)
        assert report.records_written <= report.records_read
        assert list(self.store.scan()) == sorted(self.model.items())

    @rule(ms=st.sampled_from([1, 600, 1500]))
    def advance_time(self, ms: int) -> None:
        self.clock.advance(ms)  # tombstones pass their horizon (delete_retention_ms=1000), records expire

    # -- lifecycle ------------------------------------------------------------------------------
    def _snapshots_released(self) -> None:
        """The store's close released every snapshot: their reads raise."""
        for snap, _frozen in self.snapshots:
            with pytest.raises(kvlog.StoreClosedError):
                snap.get_many([b"a"])
        self.snapshots = []

    @rule()
    def close_and_reopen(self) -> None:
        self.store.close()
        self._snapshots_released()
        self._made_durable()
        self.store = self.root.open(clock=self.clock, **self.settings)
        assert list(self.store.scan()) == sorted(self.model.items())

    @rule()
    def crash_and_reopen(self) -> None:
        self.store.close(flush=False)
        self._snapshots_released()
        self.stored = dict(self.durable_stored)
        self.store = self.root.open(clock=self.clock, **self.settings)
        assert list(self.store.scan()) == sorted(self.model.items())
        assert len(self.store) == len(self.model)

    # -- the second, read-only handle -----------------------------------------------------------
    def _reader_equals(self, expected: dict[bytes, bytes]) -> None:
        self.reader.refresh()
        assert list(self.reader.scan()) == sorted(expected.items())
        assert len(self.reader) == len(expected)

    @rule()
    def reader_sees_exactly_the_durable_state(self) -> None:
        self._reader_equals(self.durable)

    @rule()
    def reader_after_flush(self) -> None:
        self.store.flush()
        self._made_durable()
        self._reader_equals(self.durable)

    @precondition(lambda self: bool(self.durable))
    @rule(data=st.data())
    def reader_get_and_scan(self, data: st.DataObject) -> None:
        self.reader.refresh()
        key = data.draw(st.sampled_from(sorted(self.durable)) | keys)
        assert self.reader.get(key) == self.durable.get(key)
        start, prefix = data.draw(bounds), data.draw(prefixes)
        reverse = data.draw(st.booleans())
        got = list(self.reader.scan(start, None, prefix=prefix, reverse=reverse))
        assert got == _expected_scan(self.durable, start, None, prefix, reverse)
        with pytest.raises(kvlog.ReadOnlyError):
            self.reader.put(key, b"nope")

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def self_check_is_clean(self) -> None:
        assert self.store.check() == []


_counter = itertools.count()


def _machine(make_root: Any) -> type[StoreMachine]:
    class Machine(StoreMachine):
        pass

    Machine.make_root = lambda self: make_root()  # type: ignore[method-assign]
    Machine.__name__ = StoreMachine.__name__
    return Machine


def _settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def test_store_matches_model_local(tmp_path: Path) -> None:
    base = tmp_path

    def make_root() -> Root:
        where = Path(tempfile.mkdtemp(dir=base))
        return Root("local", str(where / "store"), None, where / "work")

    run_state_machine_as_test(_machine(make_root), settings=_settings(100))


@pytest.mark.s3
def test_store_matches_model_s3(seaweedfs: Any, tmp_path: Path) -> None:
    seaweedfs.create_bucket(TEST_BUCKET)
    base = tmp_path

    def make_root() -> Root:
        n = next(_counter)
        return Root(
            "s3", seaweedfs.uri(TEST_BUCKET, f"stateful-{tmp_path.name}-{n}"),
            dict(seaweedfs.storage_options), Path(tempfile.mkdtemp(dir=base)),
        )

    run_state_machine_as_test(_machine(make_root), settings=_settings(10))
