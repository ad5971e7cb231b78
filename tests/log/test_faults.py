"""Fault injection at every step of an append.

The flow (open a log, register a producer, append four batches over three partitions, with a
checkpoint every three commits) is run once through a :class:`FaultyStorage` that records its
history, once with each append writing a data file and once with each append's records attached
to its commit (an inline file). Then, for every step of that history in turn, the flow is run
again on a fresh root with exactly that step failing: an error before the call, a timeout after
it succeeded, or a simulated crash before or after it. A crash after the commit but before the
LMDB apply is also produced by a monkeypatched ``apply_commit``.

After each fault the invariant is checked: every acknowledged append is readable exactly once at
its acknowledged offsets; the producer, resumed with its current epoch, resends every batch with
its original base sequence; a batch that already landed comes back ``duplicate=True`` with its
original offsets, one that did not lands now; in the end every batch is in the log exactly once,
offsets dense, and the store's self-check is clean.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import kvlog.log.append as append_module
import kvlog.log.committer as committer_module
from kvlog.check import check_store
from kvlog.clock import ManualClock, SeededIdSource
from kvlog.config import StoreConfig
from kvlog.errors import CommitStateUnknownError, KvlogError, StorageError
from kvlog.log import Log, Producer, open_log
from kvlog.log.head import HEAD_NAME
from kvlog.log.naming import commit_name
from kvlog.log.records import AppendResult, partition_for_key
from kvlog.storage import LocalStorage
from kvlog.storage.faulty import Event, FaultPlan, FaultyStorage, SimulatedCrash, fail

PID = 77
PARTS = 3
SEED = 1234
# Data files of their own: the flow's steps include each append's data write, which the tests fail.
CONFIG = StoreConfig(partitions=PARTS, checkpoint_interval=3, commit_retries=5, commit_inline_bytes=0)
#: The same flow with every append's records attached to its commit.
INLINE_CONFIG = StoreConfig(partitions=PARTS, checkpoint_interval=3, commit_retries=5, commit_inline_bytes=65536)


def _keys(partition: int, count: int, tag: str) -> list[bytes]:
    out: list[bytes] = []
    for n in itertools.count():
        key = f"{tag}-{n}".encode()
        if partition_for_key(key, PARTS) == partition:
            out.append(key)
            if len(out) == count:
                return out
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Batch:
    partition: int
    records: list[tuple[bytes, bytes]]
    base_sequence: int


BATCHES = [
    Batch(0, [(k, b"a-" + k) for k in _keys(0, 2, "a")], 0),
    Batch(1, [(k, b"b-" + k) for k in _keys(1, 1, "b")], 0),
    Batch(0, [(k, b"c-" + k) for k in _keys(0, 3, "c")], 2),
    Batch(2, [(k, b"d-" + k) for k in _keys(2, 1, "d")], 0),
]


@dataclass
class Run:
    """What one run of the flow got done before it failed."""

    log: Log | None = None
    producer: Producer | None = None
    acked: dict[int, AppendResult] = field(default_factory=dict)
    failure: BaseException | None = None
    config: StoreConfig = CONFIG


def run_flow(storage: Any, cache: Path, run: Run, *, start: int = 0) -> None:
    """Open, register, append the batches from ``start``; records progress in ``run``."""
    if run.log is None:
        run.log = open_log(storage, cache_dir=cache, config=run.config, clock=ManualClock(),
                           ids=SeededIdSource(SEED))
    if run.producer is None:
        run.producer = run.log.producer(PID)
    for i in range(start, len(BATCHES)):
        b = BATCHES[i]
        run.acked[i] = run.producer.append(b.partition, b.records, base_sequence=b.base_sequence)


def resume(the_log: Log) -> Producer:
    """The producer as a restarted process gets it back: its id with its current epoch."""
    the_log.refresh()
    state = the_log.snapshot(lambda r: r.get_producer(PID))
    producer = the_log.producer(PID, epoch=state.epoch if state is not None else 0)
    assert state is None or producer.epoch == state.epoch
    return producer


def keys_present(the_log: Log) -> dict[bytes, list[tuple[int, int]]]:
    found: dict[bytes, list[tuple[int, int]]] = {}
    for p in range(PARTS):
        for r in the_log.read(p):
            found.setdefault(r.key, []).append((p, r.offset))
    return found


def check_acked(the_log: Log, acked: dict[int, AppendResult]) -> None:
    """Every acknowledged batch is readable exactly once, at its acknowledged offsets."""
    found = keys_present(the_log)
    for i, result in acked.items():
        b = BATCHES[i]
        assert not result.duplicate
        assert [found.get(k) for k, _v in b.records] == [
            [(b.partition, result.base_offset + j)] for j in range(len(b.records))]


def resend_and_verify(the_log: Log, acked: dict[int, AppendResult], *, replay_decides: bool = False) -> None:
    """Resend every batch with its original sequence; then each batch is in the log exactly once.

    ``replay_decides``: skip the writer's early duplicate check, so every resend is written and
    committed and the producer rules decide at replay (the path of a writer with a stale cache).
    """
    check_acked(the_log, acked)
    producer = resume(the_log)
    for i, b in enumerate(BATCHES):
        found = keys_present(the_log)
        landed = [k in found for k, _v in b.records]
        assert len(set(landed)) == 1, f"batch {i} landed in part: {landed}"
        version = the_log.version
        with pytest.MonkeyPatch.context() as patch:
            if replay_decides:
                patch.setattr(append_module, "_known_duplicates", lambda *_args: None)
            result = producer.append(b.partition, b.records, base_sequence=b.base_sequence)
        assert the_log.version == version + (0 if result.duplicate and not replay_decides else 1)
        if i in acked:
            assert result == AppendResult(acked[i].base_offset, acked[i].last_offset, True)
        else:
            assert result.duplicate == landed[0], f"batch {i}: landed={landed[0]} but got {result}"
    found = keys_present(the_log)
    for p in range(PARTS):
        offsets = [r.offset for r in the_log.read(p)]
        assert offsets == list(range(len(offsets))) and the_log.end_offset(p) == len(offsets)
    for b in BATCHES:
        assert [len(found[k]) for k, _v in b.records] == [1] * len(b.records)
        offsets = [found[k][0][1] for k, _v in b.records]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))  # a batch stays contiguous
    for key, inline in the_log.snapshot(lambda r: [(k, e.inline) for k, e in r.index_scan()]):
        assert inline is not None and inline.endswith(key)
    assert check_store(the_log) == []


@pytest.fixture(scope="module", params=[CONFIG, INLINE_CONFIG], ids=["data files", "inline files"])
def config(request: pytest.FixtureRequest) -> StoreConfig:
    """The settings of the flow: appends write data files, or attach their records to their commits."""
    the_config: StoreConfig = request.param
    return the_config


@pytest.fixture(scope="module")
def history(config: StoreConfig, tmp_path_factory: pytest.TempPathFactory) -> list[Event]:
    """Every step the flow takes, from a run without faults."""
    directory = tmp_path_factory.mktemp("probe")
    probe = FaultyStorage(LocalStorage(directory / "root", fsync=False))
    run = Run(config=config)
    run_flow(probe, directory / "cache", run)
    assert run.log is not None
    run.log.close()
    assert len(run.acked) == len(BATCHES)
    return list(probe.history)


def test_the_flow_has_every_step_of_an_append(config: StoreConfig, history: list[Event]) -> None:
    """The enumeration below covers data writes (when appends write data files), swaps of the
    head, replay reads and checkpoints."""
    ops = [(e.op, e.name.split("/")[0]) for e in history]
    assert ops.count(("put", "data")) == (0 if config.commit_inline_bytes else len(BATCHES))
    swaps = [e.name for e in history if e.op == "swap"]
    assert swaps == [HEAD_NAME] * (len(BATCHES) + 1)  # the registration, then one per append
    assert any(e.op == "put" and ".checkpoint." in e.name for e in history)
    # Data before commit, every time: the next write after a data write is the swap of the head.
    for e in history:
        if e.op == "put" and e.name.startswith("data/"):
            nxt = next(x for x in history[e.index + 1:] if x.op in ("put", "swap", "put_if_absent"))
            assert nxt.op == "swap"


def _inject(plan: FaultPlan, directory: Path, config: StoreConfig = CONFIG) -> tuple[FaultyStorage, Run]:
    faulty = FaultyStorage(LocalStorage(directory / "root", fsync=False), plan)
    run = Run(config=config)
    try:
        run_flow(faulty, directory / "cache", run)
    except (SimulatedCrash, KvlogError) as e:
        run.failure = e
    return faulty, run


def _reopen(directory: Path, cache: str, seed: int, config: StoreConfig = CONFIG) -> Log:
    return open_log(LocalStorage(directory / "root", fsync=False), cache_dir=directory / cache,
                    config=config, clock=ManualClock(), ids=SeededIdSource(seed))


def _recover_after_crash(directory: Path, run: Run, cache: str, seed: int) -> None:
    if run.log is not None:
        run.log.close()  # the "process" is gone; only its files and its LMDB remain
    reopened = _reopen(directory, cache, seed, run.config)
    try:
        resend_and_verify(reopened, run.acked, replay_decides=cache == "fresh-cache")
    finally:
        reopened.close()


@pytest.mark.parametrize("when", ["before", "after"])
def test_crash_at_every_step(config: StoreConfig, history: list[Event], tmp_path: Path, when: str) -> None:
    crashes = 0
    for event in history:
        if event.op == "crash_point" and when == "after":
            continue
        for cache in ("cache", "fresh-cache"):
            directory = tmp_path / f"{event.index}-{cache}"
            faulty, run = _inject(event.crash_plan(when), directory, config)  # type: ignore[arg-type]
            assert [e.index for e in faulty.injected] == [event.index], f"fault did not fire at {event}"
            if run.failure is None:
                # A crash "after" a read that raised FileNotFoundError never comes: the read
                # failed first and the flow went on (a missing next commit, a missing identity).
                assert when == "after" and event.op in ("read", "read_versioned", "stat"), (event, run)
                assert len(run.acked) == len(BATCHES)
            else:
                assert isinstance(run.failure, SimulatedCrash), (event, run.failure)
                crashes += 1
            try:
                _recover_after_crash(directory, run, cache, seed=SEED + 1 + event.index)
            except AssertionError as e:
                raise AssertionError(f"after a crash {when} {event}: {e}") from e
    steps = [e for e in history if e.op != "crash_point" or when == "before"]
    misses = [e for e in steps if e.op in ("read", "read_versioned") and e.name.startswith("log/")]
    assert crashes >= 2 * (len(steps) - len(misses) - 1)


@pytest.mark.parametrize("kind", ["error", "timeout_after_success"])
def test_storage_fault_at_every_step_then_retry_in_process(
    config: StoreConfig, history: list[Event], tmp_path: Path, kind: str
) -> None:
    """The process survives the fault, retries what was not acknowledged, and a reopen agrees."""
    for event in history:
        if event.op == "crash_point":
            continue
        directory = tmp_path / str(event.index)
        faulty, run = _inject(event.error_plan(kind), directory, config)  # type: ignore[arg-type]
        assert [e.index for e in faulty.injected] == [event.index], f"fault did not fire at {event}"
        try:
            if run.failure is None:
                # Retried inside the log (a commit put that failed or timed out): acknowledged once.
                assert len(run.acked) == len(BATCHES)
            else:
                assert isinstance(run.failure, StorageError | CommitStateUnknownError), run.failure
                assert len(run.acked) < len(BATCHES)
            faulty.set_plan(None)
            if run.log is not None:
                # Same process, same handle: resend everything (resume, same sequences).
                resend_and_verify(run.log, run.acked, replay_decides=event.index % 2 == 1)
                run.log.close()
            # Whatever happened, a cold reader of the root sees each batch exactly once.
            final = _reopen(directory, "cold-cache", seed=SEED + 100 + event.index, config=config)
            try:
                every = {i: AppendResult(r.base_offset, r.last_offset) for i, r in run.acked.items()}
                check_acked(final, every)
                if run.log is None:
                    resend_and_verify(final, run.acked)
                else:
                    assert sum(final.end_offset(p) for p in range(PARTS)) == sum(
                        len(b.records) for b in BATCHES)
            finally:
                final.close()
        except AssertionError as e:
            raise AssertionError(f"after {kind} at {event}: {e}") from e


@pytest.mark.parametrize("cache", ["cache", "fresh-cache"])
def test_crash_after_the_commit_before_the_lmdb_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: str
) -> None:
    """The commit landed, the process died inside the LMDB transaction that applies it."""
    real = committer_module.apply_commit
    applies = len(BATCHES) + 1  # the registration and each append
    for nth in range(1, applies + 1):
        calls = {"n": 0}

        def crashing(*args: Any, _nth: int = nth, _calls: dict[str, int] = calls) -> Any:
            _calls["n"] += 1
            if _calls["n"] == _nth:
                raise SimulatedCrash(f"apply #{_nth}")
            return real(*args)

        monkeypatch.setattr(committer_module, "apply_commit", crashing)
        directory = tmp_path / f"{nth}-{cache}"
        _faulty, run = _inject(FaultPlan(), directory)
        monkeypatch.setattr(committer_module, "apply_commit", real)
        assert isinstance(run.failure, SimulatedCrash)
        assert len(run.acked) == max(nth - 2, 0)
        # The commit is on storage, but the cache never saw it.
        assert LocalStorage(directory / "root").exists(commit_name(nth))
        if run.log is not None:
            assert run.log.snapshot(lambda r: r.version()) == nth - 1
        _recover_after_crash(directory, run, cache, seed=SEED + 50 + nth)


def test_commit_state_unknown_is_resolved_by_reopening(
    config: StoreConfig, history: list[Event], tmp_path: Path,
) -> None:
    """The swap of the head timed out after landing and every read-back failed: the caller
    cannot know."""
    target = commit_name(2)  # the first append's commit
    swaps = [e for e in history if e.op == "swap"]
    put_at = swaps[1].index
    reads_before = sum(1 for e in history[:put_at] if e.op == "read_versioned" and e.name == HEAD_NAME)
    plan = FaultPlan(
        fail("swap", HEAD_NAME, nth=2, kind="timeout_after_success"),
        fail("read_versioned", HEAD_NAME, nth=reads_before + 1, times=None),
    )
    faulty, run = _inject(plan, tmp_path, config)
    assert isinstance(run.failure, CommitStateUnknownError)
    assert run.acked == {} and LocalStorage(tmp_path / "root").exists(target)
    faulty.set_plan(None)
    assert run.log is not None
    run.log.close()
    _recover_after_crash(tmp_path, Run(acked={}, config=config), "fresh-cache", seed=SEED + 7)


def test_persistent_commit_failure_reports_an_error_and_writes_no_commit(tmp_path: Path) -> None:
    plan = FaultPlan(fail("swap", HEAD_NAME, nth=2, times=None))  # after the registration
    faulty, run = _inject(plan, tmp_path)
    assert isinstance(run.failure, KvlogError) and run.acked == {}
    root = LocalStorage(tmp_path / "root")
    assert not root.exists(commit_name(2))
    assert len(faulty.injected) == CONFIG.commit_retries
    faulty.set_plan(None)
    assert run.log is not None and run.producer is not None
    run_flow(faulty, tmp_path / "cache", run)  # the same producer retries: nothing had landed
    assert [r.duplicate for r in run.acked.values()] == [False] * len(BATCHES)
    resend_and_verify(run.log, run.acked)
    run.log.close()


def test_repeated_data_write_failures_then_success(tmp_path: Path) -> None:
    plan = FaultPlan(fail("put", "data/*", times=3))
    faulty, run = _inject(plan, tmp_path)
    assert isinstance(run.failure, StorageError) and run.acked == {}
    assert run.log is not None and run.producer is not None
    for _ in range(2):
        with pytest.raises(StorageError):
            run_flow(faulty, tmp_path / "cache", run)
    run_flow(faulty, tmp_path / "cache", run)
    assert len(faulty.injected) == 3
    resend_and_verify(run.log, run.acked)
    run.log.close()


@pytest.mark.parametrize("kind", ["error", "timeout_after_success"])
def test_a_failed_data_read_during_replay_loses_no_commit(tmp_path: Path, kind: str) -> None:
    """A reader replaying commits with a fresh cache hits a storage fault reading a batch: the
    commit must not be recorded as refused (that reader would lose it and disagree on offsets)."""
    run = Run()
    run_flow(LocalStorage(tmp_path / "root", fsync=False), tmp_path / "cache", run)
    assert run.log is not None
    run.log.close()
    probe = FaultyStorage(LocalStorage(tmp_path / "root", fsync=False))
    _reopen_on(probe, tmp_path / "probe-cache", seed=SEED + 300).close()
    reads = [e for e in probe.history if e.op == "read_range"]
    assert len(reads) == len(BATCHES)  # replay reads each batch once, to index it
    for event in reads:
        cache = tmp_path / f"replay-{event.index}"
        faulty = FaultyStorage(LocalStorage(tmp_path / "root", fsync=False), event.error_plan(kind))  # type: ignore[arg-type]
        try:
            reader = _reopen_on(faulty, cache, seed=SEED + 301 + event.index)
        except StorageError:
            reader = _reopen_on(faulty, cache, seed=SEED + 401 + event.index)  # the fault is gone now
        try:
            assert faulty.injected, event
            check_acked(reader, run.acked)
            resend_and_verify(reader, run.acked)
        finally:
            reader.close()


def _reopen_on(storage: Any, cache: Path, seed: int) -> Log:
    return open_log(storage, cache_dir=cache, config=CONFIG, clock=ManualClock(), ids=SeededIdSource(seed))
