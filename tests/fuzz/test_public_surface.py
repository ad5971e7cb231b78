"""A fuzzer of kvlog's public surface: every call with bad arguments gets a ``KvlogError`` and changes nothing.

Every public function and method of :mod:`kvlog` (``kvlog.open``, the :class:`~kvlog.Store`
methods with the ``MutableMapping`` ones and its key, value and item views,
:class:`~kvlog.WriteBatch`, :class:`~kvlog.Snapshot`, :class:`~kvlog.Consumer`, the
:class:`~kvlog.Log` methods the API reference lists and :class:`~kvlog.Producer`, named
checkpoints), of :mod:`kvlog.aio` (``open`` and the :class:`~kvlog.aio.AsyncStore` methods) and
every command of the command line is called with arguments drawn from wrong types (None, ints,
floats, bools, lists, dicts, ``object()``), NaN and infinities, negative, zero and huge numbers
(2**63, 2**64, 10**100), empty, NUL-holding, surrogate-holding and very long strings and bytes,
odd URIs (``file://host/x``, ``file:///x?q=1#f``, ``s3://``, ``nope://x``, relative paths
with ``..``), mixed with valid arguments.

The oracle, per call: it succeeds, or it raises a :class:`kvlog.KvlogError`. The exceptions a
``dict`` raises in the same place are allowed there and only there: ``KeyError`` from
``store[key]``, ``del store[key]`` and ``store.pop(key)`` without a default for a well-formed key
that is missing. Any other exception is a failure. A
refused call leaves every file of the store and of its metadata cache byte-identical, and so
does a flush after it (nothing of the refused call was buffered either); a read-only call
leaves them byte-identical even when it succeeds. ``lock.mdb`` is left out of the comparison:
it is LMDB's table of reader slots, which every read transaction writes by design (a reader
records the transaction it reads in it); it holds no data of the store and LMDB resets it when
the environment opens. ``data.mdb`` is sparse (its map size): its hash covers the size and
every nonzero page with its offset (:func:`tests.files.content_digest`). The cache's
``kvlog-clean`` stamp (``data.mdb``'s size, modification time and inode, written by the last
clean close) is compared without the time: opening LMDB sets ``data.mdb``'s length to the map
size, which moves its modification time without changing a byte, so a read-only open and close
rewrites the stamp with a new time; ``data.mdb``'s bytes are compared all the same.

The command line runs in this process through ``kvlog.cli.main(argv)`` (exit codes through
``SystemExit``, stdout and stderr captured), as tests/test_cli.py runs it, and a few examples
as a real process running what the ``kvlog`` console script runs (``sys.exit(main())``). Its
oracle: exit 0, or a non-zero exit with exactly one line on stderr, no traceback, and not a bare Python exception caught by the command
line's last resort (``kvlog: error: TypeError: ...``); a refused command changes no file.
Calls that wait as documented are kept short: a valid positive timeout of ``Consumer.poll``
(over some partitions) and ``Log.wait_for_commit`` (for a version not yet reached) becomes
0.01 s, and ``kvlog.aio``'s ``changes`` gets only false ``follow`` values (a true one waits
for new commits until closed). ``demo`` always gets ``--no-spark`` and a small ``--records``, and ``spark`` jobs get URIs
that hold no store (refused before a JVM starts), so the fuzzer stays fast.

Budget. By default each Python target runs 30 examples, each command-line target 8, and the
real-process command line 4: the whole module takes well under a minute. For a longer local
run, set ``KVLOG_FUZZ_EXAMPLES`` (examples per Python target; command-line targets get a
quarter of it, the real process a tenth), e.g.
``KVLOG_FUZZ_EXAMPLES=2000 python -m pytest tests/fuzz -q``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import kvlog
import kvlog.aio
from kvlog.cli import main as cli_main
from kvlog.config import KEY_BYTES_LIMIT, StoreConfig
from tests.files import content_digest

EXAMPLES = int(os.environ.get("KVLOG_FUZZ_EXAMPLES", "30"))
CLI_EXAMPLES = max(8, EXAMPLES // 4)
PROCESS_EXAMPLES = max(4, EXAMPLES // 10)
# No shrinking: a failure reports the drawn arguments as they came (shrinking a call that opens
# stores can take minutes).
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                phases=[Phase.explicit, Phase.reuse, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.filter_too_much, HealthCheck.data_too_large])
CLI_FUZZ = settings(FUZZ, max_examples=CLI_EXAMPLES)
PROCESS_FUZZ = settings(FUZZ, max_examples=PROCESS_EXAMPLES)

PARTITIONS = 3
QUIET: dict[str, Any] = {"background_compaction": False, "flush_interval_ms": 0, "partitions": PARTITIONS}
SEED: dict[Any, Any] = {b"alpha": b"1", b"beta": b"2", b"gamma": b"3" * 2000, "delta": "4", b"tab\tkey": b"\x00\xff"}
MISSING_KEY = b"no-such-key"

# -- the arguments --------------------------------------------------------------------------------

NAN = float("nan")
INF = float("inf")
ODD_URIS = ["file://host/x", "file:///x?q=1#f", "s3://", "nope://x", "../x", "..", "a/../../b", "."]
ODD: list[Any] = [
    None, 0, 1, -1, 7, True, False, 0.0, -0.0, 1.5, -2.5, NAN, INF, -INF,
    2**31, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**64), 10**100, -(10**100),
    "", b"", bytearray(), "\udc80", "k\udc80", "\ud800x", "\x00", "a\x00b", b"\x00", b"a\x00b",
    "x" * 5000, b"x" * 5000, "é" * 3000, b"y" * (KEY_BYTES_LIMIT + 1),
    [], [b"k"], [b"k", b"v"], [(b"k", b"v")], (b"k",), (b"k", b"v"), {}, {"a": 1}, {b"k": b"v"}, set(),
    object(), bytearray(b"k"), memoryview(b"k"), "5", "-1", "nan", "inf", "true", complex(1, 1),
    *ODD_URIS,
]


def odd() -> st.SearchStrategy[Any]:
    """One bad (or accidentally good) argument of any kind."""
    return st.one_of(
        st.sampled_from(ODD),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.binary(max_size=12),
        st.lists(st.one_of(st.integers(-3, 9), st.binary(max_size=3), st.none()), max_size=3),
    )


def arg(*valid: Any, also: st.SearchStrategy[Any] | None = None) -> st.SearchStrategy[Any]:
    """A parameter's value: a bad one, or one of ``valid`` (or drawn from ``also``)."""
    choices: list[st.SearchStrategy[Any]] = [odd()]
    if valid:
        choices.append(st.sampled_from(list(valid)))
    if also is not None:
        choices.append(also)
    return st.one_of(*choices)


KEYS = arg(*SEED, MISSING_KEY, "alpha", bytearray(b"beta"), also=st.binary(min_size=1, max_size=8))
VALUES = arg(b"v", "v", b"", bytearray(b"w"), also=st.binary(max_size=8))
PARTS = arg(*range(PARTITIONS), PARTITIONS, also=st.integers(-2, PARTITIONS + 1))
OFFSETS = arg(0, 1, 5, 10**6)
BOOLS = arg(True, False)
GROUPS = arg("g", "group-1", "ü", also=st.text(min_size=1, max_size=6))
NAMES = arg("cp", "cp-2", also=st.text(min_size=1, max_size=6))
NOW_MS = arg(None, 0, 1_700_000_000_000, 2**62)
TTL = arg(None, 1, 60_000)
OPTIONAL = st.one_of(st.just(None), odd())


def well_formed_key(key: Any) -> bool:
    """Whether ``key`` is a key a store may hold (a missing one may then raise ``KeyError``)."""
    if isinstance(key, str):
        try:
            key = key.encode("utf-8")
        except UnicodeEncodeError:
            return False
    return isinstance(key, bytes | bytearray | memoryview) and 0 < len(bytes(key)) <= KEY_BYTES_LIMIT


def blocking_timeout(value: Any) -> Any:
    """``value`` unless it is a valid timeout that could make a wait last: then a short one."""
    if isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value) and value > 0:
        return 0.01
    return value


# -- the store's files ----------------------------------------------------------------------------

def tree(root: Path) -> dict[str, str]:
    """Every file and directory under ``root`` with a digest of its bytes (``lock.mdb`` left out)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out[rel + "/"] = "dir"
        dirnames.sort()
        for name in filenames:
            if name == "lock.mdb":
                continue
            if name == "kvlog-clean":
                fields = (Path(dirpath) / name).read_text().split()
                out[os.path.join(rel, name)] = " ".join(fields[:1] + fields[2:])  # its size and inode
                continue
            out[os.path.join(rel, name)] = content_digest(Path(dirpath) / name)
    return out


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


# -- the oracle -----------------------------------------------------------------------------------

@dataclass
class Outcome:
    """What a call did: its result or error, and whether the error is one the oracle allows."""

    error: BaseException | None = None
    result: Any = None


def materialize(value: Any, limit: int = 40) -> Any:
    """``value`` with an iterator it returned read (at most ``limit`` items): errors of a lazy
    call surface here."""
    if isinstance(value, Iterator):
        try:
            return list(itertools.islice(value, limit))
        finally:
            close = getattr(value, "close", None)
            if close is not None:
                close()
    return value


def run_call(call: Callable[[], Any], allowed: tuple[type[BaseException], ...] = ()) -> Outcome:
    """Run ``call``; a ``KvlogError`` or an ``allowed`` error is an outcome, any other escapes."""
    try:
        return Outcome(result=materialize(call()))
    except kvlog.KvlogError as e:
        return Outcome(error=e)
    except allowed as e:
        return Outcome(error=e)


class Subject:
    """A store under fuzzing: the handle, the directory its files are in, and the last known tree."""

    def __init__(self, store: Any, root: Path) -> None:
        self.store = store
        self.root = root
        self.known: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root})"

    def snapshot(self) -> dict[str, str]:
        self.known = tree(self.root)
        return self.known


def check_call(subject: Subject, what: str, call: Callable[[], Any], *, reads_only: bool,
               allowed: tuple[type[BaseException], ...] = (), flush: Callable[[], Any] | None = None) -> Outcome:
    """The oracle: ``call`` succeeds or raises a ``KvlogError`` (or ``allowed``); refused, or a
    read, it changes no file of the store, and nothing of a refused call is flushed later."""
    before = subject.known
    outcome = run_call(call, allowed)
    after = tree(subject.root)
    if outcome.error is not None or reads_only:
        diff = changed(before, after)
        assert not diff, f"{what} ({outcome.error!r}) changed {diff}"
    if flush is not None:
        flush()
        after = tree(subject.root)
        if outcome.error is not None:
            diff = changed(before, after)
            assert not diff, f"{what} ({outcome.error!r}) left writes a flush made durable: {diff}"
    subject.known = after
    return outcome


# -- the stores -----------------------------------------------------------------------------------

def seed(store: kvlog.Store) -> None:
    """Put the seed data back (a clear() or popitem() may have taken it) and make it durable."""
    for k, v in SEED.items():
        if store.get(k) is None:
            store.put(k, v)
    store.flush()


@pytest.fixture(scope="module")
def subject(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Subject]:
    """One store for the module's Store, Log, Snapshot and Consumer targets, with some data."""
    root = tmp_path_factory.mktemp("fuzz") / "store"
    store = kvlog.open(str(root), **QUIET)
    for i in range(30):
        store.put(b"key-%02d" % i, b"value-%02d" % i)
    seed(store)
    store.delete(b"key-00")
    store.flush()
    store.checkpoint("kept")
    s = Subject(store, root)
    yield s
    store.close()


@pytest.fixture
def fresh(subject: Subject) -> Subject:
    """The module's store with its seed data, its tree recorded."""
    seed(subject.store)
    subject.snapshot()
    return subject


# -- Store, WriteBatch, views, Snapshot, Consumer, Log, Producer -----------------------------------

Draw = Callable[[st.SearchStrategy[Any]], Any]


class Target:
    """One public call: how to draw its arguments and make it; ``reads_only`` calls never write."""

    def __init__(self, name: str, make: Callable[[Any, Draw], Callable[[], Any]], reads_only: bool = False,
                 allowed: Callable[[dict[str, Any]], tuple[type[BaseException], ...]] = lambda a: ()) -> None:
        self.name = name
        self.make = make
        self.reads_only = reads_only
        self.allowed = allowed

    def __repr__(self) -> str:
        return self.name


def kw(draw: Draw, **strategies: st.SearchStrategy[Any]) -> dict[str, Any]:
    """Keyword arguments: each parameter is given (drawn) or left out."""
    out = {}
    for name, strategy in strategies.items():
        if draw(st.booleans()):
            out[name] = draw(strategy)
    return out


def _batch(store: Any, draw: Draw) -> Callable[[], Any]:
    ops = draw(st.lists(st.tuples(st.sampled_from(["put", "delete"]), KEYS, VALUES, TTL), min_size=1, max_size=3))

    def call() -> None:
        with store.batch() as b:
            for op, key, value, ttl in ops:
                if op == "put":
                    b.put(key, value, **({} if ttl is None else {"ttl_ms": ttl}))
                else:
                    b.delete(key)
    return call


def _consumer(method: str) -> Callable[[Any, Draw], Callable[[], Any]]:
    """A consumer made with drawn arguments, then one of its methods with drawn arguments."""
    def make(store: Any, draw: Draw) -> Callable[[], Any]:
        group = draw(GROUPS)
        parts = draw(st.one_of(st.none(), odd(), st.lists(PARTS, max_size=3)))
        margs: tuple[Any, ...] = ()
        mkw: dict[str, Any] = {}
        if method == "poll":
            mkw = kw(draw, timeout_s=arg(0, 0.0, 0.01, 2**64, 10**100, INF), max_records=arg(1, 3, 500))
            if "timeout_s" in mkw and parts is not None:
                # Over every partition from their start a poll finds records and returns at
                # once, whatever its timeout; over some it might wait for the timeout.
                mkw["timeout_s"] = blocking_timeout(mkw["timeout_s"])
        elif method in ("position", "committed"):
            margs = (draw(PARTS),)
        elif method == "seek":
            margs = (draw(PARTS), draw(OFFSETS))
        elif method in ("seek_to_beginning", "seek_to_end"):
            margs = (draw(st.one_of(st.none(), odd(), st.lists(PARTS, max_size=3))),)
        elif method in ("seek_all", "commit"):
            offsets = st.one_of(odd(), st.dictionaries(st.one_of(PARTS, odd()).filter(lambda k: k.__hash__ is not None),
                                                       st.one_of(OFFSETS, odd()),
                                                       max_size=3))
            margs = (draw(st.one_of(st.none(), offsets) if method == "commit" else offsets),)

        def call() -> Any:
            with store.consumer(group, parts) as consumer:
                consumer.seek_to_beginning()
                return getattr(consumer, method)(*margs, **mkw)
        return call
    return make


def _snapshot(method: str) -> Callable[[Any, Draw], Callable[[], Any]]:
    def make(store: Any, draw: Draw) -> Callable[[], Any]:
        if method == "get":
            margs: tuple[Any, ...] = (draw(KEYS), draw(OPTIONAL))
            mkw: dict[str, Any] = {}
        elif method == "get_many":
            margs, mkw = (draw(st.one_of(odd(), st.lists(KEYS, max_size=4))),), {}
        elif method == "end_offsets":
            margs, mkw = (), {}
        else:
            margs = tuple(draw(st.lists(st.one_of(st.none(), KEYS), max_size=2)))
            mkw = kw(draw, prefix=st.one_of(st.none(), KEYS), reverse=BOOLS)

        def call() -> Any:
            with store.snapshot() as snap:
                return materialize(getattr(snap, method)(*margs, **mkw))
        return call
    return make


def _producer_append(store: Any, draw: Draw) -> Callable[[], Any]:
    record = st.one_of(odd(), st.tuples(KEYS, st.one_of(st.none(), VALUES)),
                       st.tuples(KEYS, VALUES, arg(0, 1_700_000_000_000)))
    partition = draw(PARTS)
    records = draw(st.one_of(odd(), st.lists(record, max_size=3)))
    base = draw(arg(0, 1, 2**31 - 1, 2**31))
    producer = _PRODUCERS.setdefault(id(store), store.log.producer())
    return lambda: producer.append(partition, records, base_sequence=base)


_PRODUCERS: dict[int, Any] = {}


def _log_producer(store: Any, draw: Draw) -> Callable[[], Any]:
    own = store.stats()["producer_id"]
    pid = draw(st.one_of(st.none(), odd(), st.integers(0, 2**63 - 1)).filter(lambda p: p != own))
    extra = kw(draw, epoch=arg(None, 0, 1, 2**31))
    return lambda: store.log.producer(pid, **extra)


def _wait_for_commit(store: Any, draw: Draw) -> Callable[[], Any]:
    version, timeout = draw(arg(0, 1, 10**9)), draw(arg(0, 0.01, INF, 2**64))
    if not (type(version) is int and 0 <= version < store.log.version):
        timeout = blocking_timeout(timeout)  # an older version returns at once, whatever the timeout
    return lambda: store.log.wait_for_commit(version, timeout)


def _in_view(view: str, strategy: st.SearchStrategy[Any]) -> Callable[[Any, Draw], Callable[[], Any]]:
    """``x in store.<view>()`` with ``x`` drawn from ``strategy``."""
    def make(store: Any, draw: Draw) -> Callable[[], Any]:
        x = draw(strategy)
        return lambda: x in getattr(store, view)()
    return make


def _missing(name: str, key_at: int = 0, no_default: bool = True) -> Callable[[dict[str, Any]], tuple[type[BaseException], ...]]:
    return lambda a: (KeyError,) if well_formed_key(a["args"][key_at]) and (not no_default or len(a["args"]) == 1) else ()


def simple(name: str, strategies: list[st.SearchStrategy[Any]], keywords: dict[str, st.SearchStrategy[Any]] | None = None,
           *, reads_only: bool = False, on: Callable[[Any], Any] = lambda s: s,
           allowed: Callable[[dict[str, Any]], tuple[type[BaseException], ...]] | None = None,
           optional_tail: int = 0) -> Target:
    """A target calling ``on(store).<name>(*args, **kwargs)`` with drawn arguments; the last
    ``optional_tail`` positional arguments may be left out."""
    def make(store: Any, draw: Draw) -> Callable[[], Any]:
        args = [draw(s) for s in strategies]
        if optional_tail:
            args = args[:len(args) - draw(st.integers(0, optional_tail))]
        kwargs = kw(draw, **(keywords or {}))
        make.last = {"args": args, "kwargs": kwargs}  # type: ignore[attr-defined]
        return lambda: getattr(on(store), name)(*args, **kwargs)
    return Target(("log." if on is log_of else "") + name, make, reads_only,
                  (lambda a: allowed(a)) if allowed else (lambda a: ()))


def log_of(store: Any) -> Any:
    """The store's log, whose public methods are targets too."""
    return store.log


STORE_TARGETS: list[Target] = [
    simple("put", [KEYS, VALUES], {"sync": BOOLS, "ttl_ms": TTL}),
    simple("delete", [KEYS], {"sync": BOOLS}),
    Target("batch", _batch),
    simple("get", [KEYS, OPTIONAL], reads_only=True, optional_tail=1),
    simple("scan", [st.one_of(st.none(), KEYS), st.one_of(st.none(), KEYS)],
           {"prefix": st.one_of(st.none(), KEYS), "reverse": BOOLS}, reads_only=True, optional_tail=2),
    simple("changes", [st.one_of(st.none(), PARTS), OFFSETS], reads_only=True, optional_tail=2),
    simple("__getitem__", [KEYS], reads_only=True, allowed=_missing("__getitem__")),
    simple("__setitem__", [KEYS, VALUES]),
    simple("__delitem__", [KEYS], allowed=_missing("__delitem__")),
    simple("__contains__", [arg(*SEED, MISSING_KEY, also=odd())], reads_only=True),
    simple("get_many", [st.one_of(odd(), st.lists(KEYS, max_size=4))], reads_only=True),
    simple("update", [st.one_of(odd(), st.dictionaries(KEYS.filter(lambda k: k.__hash__ is not None), VALUES,
                                                         max_size=3),
                                st.lists(st.one_of(odd(), st.tuples(KEYS, VALUES)), max_size=3))],
           optional_tail=1),
    simple("pop", [KEYS, OPTIONAL], allowed=_missing("pop"), optional_tail=1),
    simple("setdefault", [KEYS, st.one_of(VALUES, st.none())], optional_tail=1),
    simple("popitem", []),
    simple("clear", []),
    simple("flush", []),
    simple("refresh", []),
    simple("__len__", [], reads_only=True),
    simple("__iter__", [], reads_only=True),
    simple("__reversed__", [], reads_only=True),
    simple("check", [], reads_only=True),
    simple("stats", [], reads_only=True),
    simple("disk_usage", [], reads_only=True),
    simple("gc", []),
    simple("compact", [], {"force": BOOLS, "now_ms": NOW_MS}),
    simple("checkpoint", [NAMES]),
    simple("checkpoints", [], reads_only=True),
    simple("delete_checkpoint", [NAMES]),
    Target("snapshot.get", _snapshot("get"), reads_only=True),
    Target("snapshot.get_many", _snapshot("get_many"), reads_only=True),
    Target("snapshot.scan", _snapshot("scan"), reads_only=True),
    Target("keys.__contains__", _in_view("keys", arg(*SEED, also=odd())), reads_only=True),
    Target("values.__contains__", _in_view("values", VALUES), reads_only=True),
    Target("items.__contains__", _in_view("items", st.one_of(odd(), st.tuples(KEYS, VALUES))), reads_only=True),
    Target("consumer", _consumer("close")),
    Target("consumer.poll", _consumer("poll"), reads_only=True),
    Target("consumer.position", _consumer("position"), reads_only=True),
    Target("consumer.seek", _consumer("seek"), reads_only=True),
    Target("consumer.seek_to_beginning", _consumer("seek_to_beginning"), reads_only=True),
    Target("consumer.committed", _consumer("committed"), reads_only=True),
    Target("consumer.commit", _consumer("commit")),
    Target("consumer.seek_all", _consumer("seek_all"), reads_only=True),
    Target("consumer.seek_to_end", _consumer("seek_to_end"), reads_only=True),
    Target("consumer.lag", _consumer("lag"), reads_only=True),
    Target("consumer.caught_up", _consumer("caught_up"), reads_only=True),
    simple("end_offsets", [], reads_only=True),
    simple("begin_offsets", [], reads_only=True),
    Target("snapshot.end_offsets", _snapshot("end_offsets"), reads_only=True),
    simple("partition_for", [KEYS], on=log_of, reads_only=True),
    simple("start_offset", [PARTS], on=log_of, reads_only=True),
    simple("end_offset", [PARTS], on=log_of, reads_only=True),
    simple("read", [PARTS, OFFSETS, st.one_of(st.none(), OFFSETS)], on=log_of, reads_only=True, optional_tail=2),
    simple("refresh", [], on=log_of, reads_only=True),
    simple("settle_index", [], on=log_of),
    simple("gc", [OPTIONAL], on=log_of, optional_tail=1),
    Target("log.wait_for_commit", _wait_for_commit, reads_only=True),
    Target("log.producer", _log_producer),
    Target("producer.append", _producer_append),
]

@pytest.mark.parametrize("target", STORE_TARGETS, ids=lambda t: t.name)
@FUZZ
@given(data=st.data())
def test_store_surface(fresh: Subject, target: Target, data: st.DataObject) -> None:
    """Every Store, view, Snapshot, Consumer, Log and Producer call: a result or a KvlogError; a
    refused call or a read changes no file of the store or its cache."""
    store = fresh.store
    if target.name in ("consumer.poll", "log.wait_for_commit"):
        store.put(b"poll-marker", b"x", sync=True)  # a record to return: a poll never waits long
        fresh.snapshot()
    call = target.make(store, data.draw)
    last = getattr(target.make, "last", {"args": [None], "kwargs": {}})
    check_call(fresh, target.name, call, reads_only=target.reads_only, allowed=target.allowed(last),
               flush=store.flush)


# -- opening: kvlog.open and kvlog.aio.open --------------------------------------------------------

SETTING_NAMES = [f for f in StoreConfig.__dataclass_fields__ if f != "partitions"]


@pytest.fixture(scope="module")
def open_area(tmp_path_factory: pytest.TempPathFactory) -> Subject:
    """A directory with a closed store in it: opening runs with it as the working directory, so
    relative URIs land in it too; the whole directory is compared."""
    area = tmp_path_factory.mktemp("open-area")
    (area / "work").mkdir()
    with kvlog.open(str(area / "store"), **QUIET) as store:
        seed(store)
    return Subject(None, area)


def open_arguments(area: Path, draw: Draw) -> tuple[Any, dict[str, Any]]:
    """A URI and keyword arguments of ``kvlog.open`` (valid ones mixed in)."""
    store = str(area / "store")
    uri = draw(st.one_of(
        st.sampled_from([store, Path(store), f"file://{store}", str(area / "new" / "s"), "rel/s",
                         f"file://{store}?q=1#f", f"file://{area}/x?q=1", f"file://host{store}",
                         "s3://", "nope://x", "../x/s", "", "\x00", "s\x00", "\udc80", f"{store}\udc80"]),
        odd()))
    kwargs = kw(draw, partitions=arg(None, PARTITIONS, 2), create=BOOLS, read_only=BOOLS,
                cache_dir=arg(None, str(area / "cache2")), storage_options=arg(None, {}),
                clock=arg(None, kvlog.ManualClock()), ids=arg(None, kvlog.SeededIdSource(1)),
                producer_id=arg(None, 1, 2**62), checkpoint=arg(None, "nope"),
                config=arg(None, StoreConfig(background_compaction=False)))
    for _ in range(draw(st.integers(0, 2))):
        kwargs[draw(st.sampled_from(SETTING_NAMES))] = draw(arg(0, 1, 1000, 0.5, "zstd", "none"))
    kwargs.setdefault("background_compaction", draw(arg(False)))
    if "config" in kwargs and kwargs["config"] is not None:
        kwargs.pop("background_compaction")
    return uri, kwargs


@FUZZ
@given(data=st.data())
def test_open_surface(open_area: Subject, data: st.DataObject, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvlog.open``: a store or a KvlogError; a refused open changes no file anywhere near."""
    monkeypatch.chdir(open_area.root / "work")
    uri, kwargs = open_arguments(open_area.root, data.draw)
    open_area.snapshot()

    def call() -> None:
        kvlog.open(uri, **kwargs).close()
    check_call(open_area, f"open({uri!r}, {kwargs!r})", call, reads_only=False)


@FUZZ
@given(data=st.data())
def test_aio_open_surface(open_area: Subject, data: st.DataObject, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvlog.aio.open`` with drawn arguments and ``workers``: as ``kvlog.open``."""
    monkeypatch.chdir(open_area.root / "work")
    uri, kwargs = open_arguments(open_area.root, data.draw)
    kwargs.pop("checkpoint", None)
    kwargs.update(kw(data.draw, workers=arg(1, 4)))
    open_area.snapshot()

    async def go() -> None:
        async with kvlog.aio.open(uri, **kwargs):
            pass
    check_call(open_area, f"aio.open({uri!r}, {kwargs!r})", lambda: asyncio.run(go()), reads_only=False)


# -- kvlog.aio: the AsyncStore methods -------------------------------------------------------------

class AioSubject(Subject):
    """An AsyncStore's subject, with the event loop every call of it runs on."""

    def __init__(self, store: Any, root: Path) -> None:
        super().__init__(store, root)
        self.loop = asyncio.new_event_loop()


@pytest.fixture(scope="module")
def aio_subject(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AioSubject]:
    """One AsyncStore for the module's aio targets, on its own event loop."""
    root = tmp_path_factory.mktemp("aio") / "store"
    with kvlog.open(str(root), **QUIET) as store:
        seed(store)
    s = AioSubject(None, root)
    s.store = s.loop.run_until_complete(kvlog.aio.open(str(root), **QUIET))
    yield s
    s.loop.run_until_complete(s.store.close())
    s.loop.close()


async def _agen_list(agen: Any, limit: int = 40) -> list[Any]:
    out = []
    try:
        async for item in agen:
            out.append(item)
            if len(out) >= limit:
                break
    finally:
        await agen.aclose()
    return out


def _aio(name: str, strategies: list[st.SearchStrategy[Any]], keywords: dict[str, st.SearchStrategy[Any]] | None = None,
         *, reads_only: bool = False, generator: bool = False) -> Target:
    def make(aio: Any, draw: Draw) -> Callable[[], Any]:
        args, kwargs = [draw(s) for s in strategies], kw(draw, **(keywords or {}))

        async def go() -> Any:
            made = getattr(aio, name)(*args, **kwargs)
            return await (_agen_list(made) if generator else made)
        return lambda: _AIO_LOOP[0].run_until_complete(go())
    return Target(f"aio.{name}", make, reads_only)


_AIO_LOOP: list[asyncio.AbstractEventLoop] = []

AIO_TARGETS: list[Target] = [
    _aio("put", [KEYS, VALUES], {"sync": BOOLS, "ttl_ms": TTL}),
    _aio("delete", [KEYS], {"sync": BOOLS}),
    _aio("get", [KEYS, OPTIONAL], reads_only=True),
    _aio("get_many", [st.one_of(odd(), st.lists(KEYS, max_size=4))], reads_only=True),
    _aio("contains", [arg(*SEED, also=odd())], reads_only=True),
    _aio("scan", [st.one_of(st.none(), KEYS), st.one_of(st.none(), KEYS)],
         {"prefix": st.one_of(st.none(), KEYS), "reverse": BOOLS}, reads_only=True, generator=True),
    _aio("changes", [st.one_of(st.none(), PARTS), OFFSETS], {"follow": st.sampled_from([False, None, 0, 0.0, "", b"", []])},
         reads_only=True, generator=True),
    _aio("flush", []),
    _aio("refresh", []),
    _aio("compact", [], {"force": BOOLS, "now_ms": NOW_MS}),
    _aio("stats", [], reads_only=True),
    _aio("check", [], reads_only=True),
    _aio("gc", []),
    _aio("disk_usage", [], reads_only=True),
]


@pytest.mark.parametrize("target", AIO_TARGETS, ids=lambda t: t.name)
@FUZZ
@given(data=st.data())
def test_aio_surface(aio_subject: AioSubject, target: Target, data: st.DataObject) -> None:
    """Every AsyncStore method: a result or a KvlogError; refused or a read, no file changes."""
    _AIO_LOOP[:] = [aio_subject.loop]
    sync_store = aio_subject.store.sync
    seed(sync_store)
    aio_subject.snapshot()
    call = target.make(aio_subject.store, data.draw)
    check_call(aio_subject, target.name, call, reads_only=target.reads_only, flush=sync_store.flush)


# -- the command line -----------------------------------------------------------------------------

# A Python exception the command line's last resort caught: a call that should have been refused
# with a KvlogError or a usage error.
BARE = tuple(name for name in dir(__builtins__ if isinstance(__builtins__, dict) else __builtins__)
             if name.endswith("Error") or name.endswith("Exception"))


def cli_text() -> st.SearchStrategy[str]:
    """A command-line argument: odd text (no NUL: an argv cannot hold one), or a plain one."""
    return st.one_of(
        st.sampled_from(["", "k", "-", "--", "-x", "5", "-1", "9", "0", "2" * 30, "nan", "inf", "\udc80",
                         "k\udcff", "x" * 5000, "é" * 2000, "zz", "00ff", "{}", "[]", "null", '{"a": 1}',
                         "a=b", "=1", "cache_bytes=0", "cache_bytes=-1", "flush_interval_ms=nan",
                         "partitions=5", "compression=nope", "max_key_bytes=1", "none", *ODD_URIS]),
        st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=8),
    )


def cli_argv(store: str, area: Path, draw: Draw) -> list[str]:
    """A drawn command line: a command, a URI (the store's, mostly) and drawn arguments and options."""
    command = draw(st.sampled_from(["put", "get", "delete", "scan", "consume", "stats", "check", "compact",
                                    "spark compact", "spark materialize", "spark rebuild-index", "demo", "bench"]))
    uri = draw(st.one_of(st.sampled_from([store, f"file://{store}", str(area / "new"), str(area)]), cli_text()))
    argv: list[str] = command.split()
    if command.startswith("spark"):
        if os.path.isdir(uri) or uri.startswith("file://"):
            uri = str(area / "no-store-here")
        argv.append(uri)
        argv += [draw(cli_text()) for _ in range(1 if command != "spark compact" else 0)]
        opts = ["--master", "--conf", "--storage-options", "--force"]
    elif command == "demo":
        records = draw(st.one_of(st.sampled_from(["0", "-1", "x", "1e3", "", "3", "20"]), cli_text()))
        if records.lstrip("+").isdigit() and int(records) > 20:
            records = "20"
        argv += ["--no-spark", "--records", records, "--path", draw(st.sampled_from(
            [str(area / "demo-new"), str(area), store, "", "\udc80"]) | cli_text())]
        opts = ["--keep"]
    elif command == "bench":
        argv += [draw(cli_text()) for _ in range(draw(st.integers(0, 2)))]
        opts = []
    else:
        argv.append(uri)
        npos = {"put": 2, "get": 1, "delete": 1, "consume": 1}.get(command, 0)
        argv += [draw(cli_text()) for _ in range(draw(st.integers(max(0, npos - 1), npos + 1)))]
        opts = ["--set", "--storage-options", "--hex"] + {
            "put": ["--key-file", "--value-file", "--create"], "get": ["--key-file", "--format"],
            "delete": ["--key-file"], "scan": ["--prefix", "--start", "--stop", "--reverse", "--format"],
            "consume": ["--partition", "--max-records", "--no-commit", "--format"],
            "stats": ["--json"], "compact": ["--force"]}.get(command, [])
    flags = {"--hex", "--create", "--reverse", "--no-commit", "--json", "--force", "--keep"}
    for opt in draw(st.lists(st.sampled_from(opts), max_size=3)) if opts else []:
        argv.append(opt)
        if opt not in flags:
            argv.append(draw(cli_text()))
    return argv


@pytest.fixture(scope="module")
def cli_area(tmp_path_factory: pytest.TempPathFactory) -> Subject:
    area = tmp_path_factory.mktemp("cli")
    (area / "work").mkdir()
    with kvlog.open(str(area / "store"), **QUIET) as store:
        seed(store)
    return Subject(None, area)


def cli_outcome(code: int, err: str, what: str) -> None:
    """The command line's oracle on a run's exit code and stderr."""
    if code == 0:
        return
    assert "Traceback" not in err, f"{what}: {err}"
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), f"{what}: stderr is not one line: {err!r}"
    head = lines[0].split(": ")
    assert not (len(head) >= 3 and head[1] == "error" and head[2] in BARE), \
        f"{what}: a bare Python exception reached the command line: {lines[0]}"


@CLI_FUZZ
@given(data=st.data())
def test_cli_surface(cli_area: Subject, data: st.DataObject, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command of the command line, in this process: exit 0, or one line on stderr and no
    file of the store or around it changed."""
    monkeypatch.chdir(cli_area.root / "work")
    argv = cli_argv(str(cli_area.root / "store"), cli_area.root, data.draw)
    before = cli_area.snapshot()
    out, err = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", errors="surrogateescape", write_through=True)
    stdin = io.TextIOWrapper(io.BytesIO(b"stdin-bytes"), encoding="utf-8")
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
        monkeypatch.setattr(sys, "stdin", stdin)
        try:
            code = cli_main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    cli_outcome(code, err.getvalue(), f"kvlog {argv!r}")
    if code != 0 or argv[0] in ("get", "scan", "stats", "check") or "--no-commit" in argv:
        diff = changed(before, tree(cli_area.root))
        assert not diff, f"kvlog {argv!r} (exit {code}: {err.getvalue()!r}) changed {diff}"


#: What the ``kvlog`` console script runs (``kvlog.cli`` has no ``__main__``); with PYTHONPATH it
#: imports the kvlog under test.
CONSOLE_SCRIPT = "import sys; from kvlog.cli import main; sys.exit(main())"


@PROCESS_FUZZ
@given(data=st.data())
def test_cli_process_surface(cli_area: Subject, data: st.DataObject) -> None:
    """A few drawn command lines as a real ``kvlog`` process (bytes on the argv, a
    real exit status and stderr): the same oracle."""
    argv = cli_argv(str(cli_area.root / "store"), cli_area.root, data.draw)
    before = cli_area.snapshot()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(kvlog.__file__).parent.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, *(os.fsencode(a) for a in argv)],
                          capture_output=True, timeout=120, cwd=cli_area.root / "work", env=env,
                          stdin=subprocess.DEVNULL, check=False)
    err = done.stderr.decode("utf-8", errors="backslashreplace")
    cli_outcome(done.returncode, err, f"kvlog {argv!r}")
    if done.returncode != 0:
        diff = changed(before, tree(cli_area.root))
        assert not diff, f"kvlog {argv!r} (exit {done.returncode}: {err!r}) changed {diff}"
