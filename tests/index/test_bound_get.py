"""A store's ``get`` is one call of ``_runs.StoreGet`` (kvlog.index.reads.bound_get) for a valid
bytes key of an open store, and the method :meth:`kvlog.Store.get` for every other call: both
give the same answers and raise the same errors, in C and in the pure-Python twin."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.config import KEY_BYTES_LIMIT
from kvlog.errors import InvalidRecordError, StoreClosedError
from kvlog.store import Store
from tests.native import Native, implementation

pytestmark = pytest.mark.usefixtures("native")

REPO = Path(kvlog.__file__).resolve().parent.parent
QUIET = {"flush_interval_ms": 0, "background_compaction": False}


def _open(path: Path, **kwargs: Any) -> kvlog.Store:
    return kvlog.open(str(path / "store"), cache_dir=str(path / "cache"), **{**QUIET, **kwargs})


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "value", call()
    except Exception as e:  # noqa: BLE001 - the class and the message are what is compared
        return "error", (type(e), str(e))


def _same_as_the_method(store: kvlog.Store, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """``store.get(*args, **kwargs)``, checked equal (value, or error class and message) to
    what the method :meth:`kvlog.Store.get` gives for the same call."""
    bound = _outcome(lambda: store.get(*args, **kwargs))
    method = _outcome(lambda: Store.get(store, *args, **kwargs))
    assert bound == method, (args, kwargs)
    return bound


KEYS: list[Any] = [
    b"a", "a", b"", "", b"missing", "missing", bytearray(b"a"), memoryview(b"a"), 7, None, 1.5,
    b"x" * KEY_BYTES_LIMIT, b"x" * (KEY_BYTES_LIMIT + 1), "x" * (KEY_BYTES_LIMIT + 1), b"k" * 5000,
    "\udcff",
]


def test_the_store_get_is_the_implementations_one_call(tmp_path: Path, native: Native) -> None:
    with _open(tmp_path) as store:
        assert type(store.get) is native.runs.StoreGet
        assert Store.get.__doc__ == "The value of ``key``, or ``default``."


@pytest.mark.parametrize("flushed", [False, True])
def test_every_key_gives_what_the_method_gives(tmp_path: Path, flushed: bool) -> None:
    with _open(tmp_path) as store:
        store.put(b"a", b"1")
        if flushed:
            store.flush()
        for key in KEYS:
            _same_as_the_method(store, key)
            _same_as_the_method(store, key, b"otherwise")
            _same_as_the_method(store, key, default=0)
            _same_as_the_method(store, key=key)
        assert _same_as_the_method(store, b"a") == ("value", b"1")
        assert _same_as_the_method(store, "a") == ("value", b"1")
        assert _same_as_the_method(store, b"missing", b"d") == ("value", b"d")
        assert _same_as_the_method(store, b"a", b"d") == ("value", b"1")
        assert _same_as_the_method(store, b"x" * KEY_BYTES_LIMIT, 5) == ("value", 5)
        assert _same_as_the_method(store, bytearray(b"a")) == ("value", b"1")  # bytes-like keys are read
        assert _same_as_the_method(store, memoryview(b"a"), 0) == ("value", b"1")
        for bad in (b"", "", 7, None, 1.5, b"x" * (KEY_BYTES_LIMIT + 1), "x" * (KEY_BYTES_LIMIT + 1)):
            kind, (cls, _message) = _same_as_the_method(store, bad)
            assert kind == "error" and issubclass(cls, InvalidRecordError), bad
        _same_as_the_method(store)
        _same_as_the_method(store, b"a", None, None)
        _same_as_the_method(store, b"a", nothing=1)
        assert _same_as_the_method(store)[1][0] is TypeError


def test_the_dict_methods_over_get(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        store.put(b"a", b"1")
        store.flush()
        assert store[b"a"] == b"1" and store["a"] == b"1"
        assert b"a" in store and bytearray(b"a") in store and memoryview(b"a") in store
        assert b"" not in store and 7 not in store and b"b" not in store
        with pytest.raises(KeyError):
            store[b"b"]
        with pytest.raises(InvalidRecordError):
            store[b""]


def test_a_closed_store_raises_for_every_key(tmp_path: Path) -> None:
    store = _open(tmp_path)
    store.put(b"a", b"1")
    store.flush()
    assert store.get(b"a") == b"1"
    store.close()
    for key in KEYS:
        for args in ((key,), (key, b"d")):
            kind, (cls, _message) = _same_as_the_method(store, *args)
            assert kind == "error" and cls is StoreClosedError, key
    with pytest.raises(StoreClosedError):
        store[b"a"]


def test_a_value_in_a_data_file(tmp_path: Path) -> None:
    big = bytes(range(256)) * 40  # larger than inline_value_bytes: the index holds where it is
    with _open(tmp_path) as store:
        store.put(b"big", big)
        store.put(b"small", b"s")
        assert store.get(b"big") == big  # from the memtable
        store.flush()
        store.log.index.settle()
        for _ in range(3):  # the pooled transaction is reused for the later ones
            assert _same_as_the_method(store, b"big") == ("value", big)
            assert _same_as_the_method(store, b"big", b"d") == ("value", big)
            assert _same_as_the_method(store, b"small") == ("value", b"s")
        store.delete(b"big")
        store.flush()
        assert store.get(b"big", b"gone") == b"gone"


def test_expiring_records_are_hidden_once_expired(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    with _open(tmp_path, clock=clock, refresh_interval_ms=600_000) as store:
        store.put(b"t", b"v", ttl_ms=1000)
        store.put(b"big", b"b" * 4000, ttl_ms=1000)
        store.put(b"kept", b"k")
        assert store.get(b"t") == b"v"
        store.flush()
        store.log.index.settle()
        assert store.get(b"t") == b"v" and store.get(b"big") == b"b" * 4000
        clock.advance(999)
        assert store.get(b"t", b"d") == b"v"
        clock.advance(1)
        assert store.get(b"t", b"d") == b"d" and store.get(b"big") is None
        assert store.get(b"kept") == b"k"


def test_another_processs_commit_is_seen_after_the_refresh_interval(tmp_path: Path) -> None:
    clock = kvlog.ManualClock()
    with _open(tmp_path, clock=clock, refresh_interval_ms=1000) as store:
        store.put(b"mine", b"1")
        store.flush()
        assert store.get(b"theirs") is None  # the refresh due at the first read is done
        script = (
            "import sys, kvlog\n"
            "with kvlog.open(sys.argv[1], cache_dir=sys.argv[2], flush_interval_ms=0,"
            " background_compaction=False) as s:\n"
            "    s.put(b'theirs', b'2'); s.put(b'mine', b'3'); s.flush()\n"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-c", script, str(tmp_path / "store"), str(tmp_path / "other")],
                       env=env, check=True, timeout=120)
        # Before the refresh is due, gets answer from this process's view of the store.
        assert store.get(b"theirs", b"not yet") == b"not yet"
        assert store.get(b"mine") == b"1"
        clock.advance(1000)  # due: the next get refreshes, then looks again
        assert store.get(b"theirs") == b"2"
        assert store.get(b"mine") == b"3"
        assert store.get(b"theirs", b"d") == b"2"


def test_a_get_after_the_map_grew(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        for i in range(200):
            store.put(b"k%03d" % i, b"v%d" % i)
        store.flush()
        assert store.get(b"k001") == b"v1"
        epoch = store.log.env.gate.epoch
        store.log.env._grow()
        assert store.log.env.gate.epoch == epoch + 2
        assert [store.get(b"k%03d" % i) for i in range(200)] == [b"v%d" % i for i in range(200)]
        assert store.get(b"missing", 0) == 0


def test_close_from_another_thread(tmp_path: Path) -> None:
    store = _open(tmp_path)
    store.put(b"a", b"1")
    store.flush()
    seen: list[Any] = []
    started = threading.Event()

    def reader() -> None:
        while True:
            try:
                seen.append(store.get(b"a"))
            except Exception as e:  # noqa: BLE001 - checked below
                seen.append(e)
                return
            started.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert started.wait(30)
    store.close()
    thread.join(30)
    assert not thread.is_alive()
    # Every get before the close answers; the first one after it raises a kvlog error.
    assert set(seen[:-1]) == {b"1"} and isinstance(seen[-1], kvlog.KvlogError), seen[-3:]
    with pytest.raises(StoreClosedError):
        store.get(b"a")


def test_a_subclass_keeps_its_own_get(tmp_path: Path) -> None:
    class Upper(Store):
        def get(self, key: bytes | str, default: Any = None) -> Any:
            value = super().get(key, default)
            return value.upper() if isinstance(value, bytes) else value

    with _open(tmp_path) as plain:
        plain.put(b"a", b"x")
        plain.flush()
        log = plain.log
        upper = Upper(log)
        assert upper.get(b"a") == b"X" and "get" not in vars(upper)


def test_stores_get_twin_is_equal() -> None:
    """StoreGet on stand-ins: every answer of ``lookup`` is handled as the twin handles it."""

    class Owner:
        def __init__(self) -> None:
            self._closed = False
            self._refresh_at = 1.5

    calls: list[Any] = []

    def lookup(key: bytes, fresh: float) -> Any:
        calls.append(("lookup", key, fresh))
        if key == b"e":
            raise ValueError("a lookup's error")
        return {b"v": b"value", b"n": None, b"s": "stale"}[key]

    def fallback(*args: Any, **kwargs: Any) -> Any:
        calls.append(("fallback", args, kwargs))
        return "fell back"

    def found(key: bytes, answer: Any, default: Any) -> Any:
        calls.append(("found", key, answer, default))
        return "found"

    def run(runs: Any) -> list[Any]:
        calls.clear()
        owner = Owner()
        get = runs.StoreGet(owner, lookup, fallback, found, 4)
        out: list[Any] = []
        for args, kwargs in [((b"v",), {}), ((b"n",), {}), ((b"n", 7), {}), ((b"s", 7), {}), ((b"s",), {}),
                             (("v",), {}), ((b"",), {}), ((b"vvvvv",), {}), ((b"vvvv",), {}), ((), {}),
                             ((b"v",), {"default": 1}), ((), {"key": b"v"}), ((b"v", 1, 2), {}),
                             ((bytearray(b"v"),), {}), ((memoryview(b"v"),), {}), ((1,), {})]:
            out.append(_outcome(partial(get, *args, **kwargs)))
        for closed in (True, 1, None):
            owner._closed = closed
            out.append(_outcome(lambda: get(b"v")))
        owner._closed = False
        owner._refresh_at = 9.0
        out.append(_outcome(lambda: get(b"v")))
        out.append(_outcome(lambda: get(b"e")))
        del owner._closed
        out.append(_outcome(lambda: get(b"v")[:0]))
        for bad in (0, -1, "4", 2.0):
            out.append(_outcome(partial(runs.StoreGet, owner, lookup, fallback, found, bad)))
        return [out, list(calls)]

    compiled = run(implementation("c").runs)
    assert compiled == run(implementation("python").runs)
    assert compiled[0][:6] == [("value", b"value"), ("value", None), ("value", 7), ("value", "found"),
                               ("value", "found"), ("value", "fell back")]
    assert compiled[1][:2] == [("lookup", b"v", 1.5), ("lookup", b"n", 1.5)]
