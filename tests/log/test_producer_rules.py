"""The idempotent-producer rules (Kafka's broker-side rules; docs/log.rst, "Producers").

Three layers of tests:

* explicit examples of every rule against the pure functions ``check_batch``/``accept_batch``;
* a property test that drives the pure functions and a small reference model written here
  (over the full history of accepted batches, not a 5-slot window) with the same operations;
* the same model against a real :class:`~kvlog.log.Log` on local storage with real LMDB,
  as a hypothesis state machine that also restarts the log (same or fresh cache) and moves an
  injected clock past ``producer_id_expiration_ms``; plus explicit Log examples.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvlog.clock import ManualClock, SeededIdSource
from kvlog.config import StoreConfig
from kvlog.errors import (
    InvalidRecordError,
    OutOfOrderSequenceError,
    ProducerError,
    ProducerFencedError,
)
from kvlog.format.commit import decode_commit
from kvlog.format.producer_state import (
    BatchMeta,
    ProducerState,
    producer_from_json,
    producer_to_json,
)
from kvlog.log import Log, Producer, open_log
from kvlog.log.naming import commit_name
from kvlog.log.producers import (
    SEQUENCE_MODULUS,
    WINDOW,
    accept_batch,
    check_batch,
    last_sequence,
    register_epoch,
)
from kvlog.storage import LocalStorage

M = 2**31
EXP = 10_000  # producer_id_expiration_ms of these tests
T0 = 1_700_000_000_000
PID = 42


# ---------------------------------------------------------------------------------------------
# The reference model: Kafka's broker-side rules, restated over full histories.
# ---------------------------------------------------------------------------------------------
ACCEPT, DUPLICATE, OUT_OF_ORDER, FENCED = "accept", "duplicate", "out_of_order", "fenced"


@dataclass
class RefBatch:
    first: int
    last: int
    first_offset: int
    last_offset: int


@dataclass
class RefPartition:
    epoch: int
    seen_ms: int
    accepted: list[RefBatch] = field(default_factory=list)  # never truncated


@dataclass
class RefProducer:
    epoch: int
    seen_ms: int
    parts: dict[int, RefPartition] = field(default_factory=dict)


class RefRules:
    """What the rules say should happen; knows nothing of kvlog's data structures."""

    def __init__(self, expiration_ms: int) -> None:
        self.expiration_ms = expiration_ms
        self.producers: dict[int, RefProducer] = {}

    def alive(self, pid: int, now: int) -> RefProducer | None:
        prod = self.producers.get(pid)
        if prod is None or now - prod.seen_ms > self.expiration_ms:
            return None  # unknown, or idle longer than the expiration: forgotten
        return prod

    def _part(self, prod: RefProducer, partition: int, now: int) -> RefPartition | None:
        part = prod.parts.get(partition)
        if part is None or now - part.seen_ms > self.expiration_ms:
            return None
        return part

    def epoch_of(self, pid: int, now: int) -> int | None:
        prod = self.alive(pid, now)
        return None if prod is None else prod.epoch

    def decide(
        self, pid: int, partition: int, epoch: int, first: int, count: int, now: int
    ) -> tuple[str, RefBatch | None]:
        prod = self.alive(pid, now)
        if prod is None:
            return ACCEPT, None  # an unknown or expired producer is accepted at any sequence
        if epoch < prod.epoch:
            return FENCED, None
        part = self._part(prod, partition, now)
        starts_new_epoch = epoch > (prod.epoch if part is None else part.epoch)
        if starts_new_epoch:
            return (ACCEPT, None) if first == 0 else (OUT_OF_ORDER, None)
        if part is None:
            return ACCEPT, None  # the producer's first batch on this partition in this epoch
        last = (first + count - 1) % M
        for batch in part.accepted[-5:]:
            if (batch.first, batch.last) == (first, last):
                return DUPLICATE, batch
        if first == (part.accepted[-1].last + 1) % M:
            return ACCEPT, None
        return OUT_OF_ORDER, None  # a gap, a partial overlap, or a duplicate older than the window

    def accept(self, pid: int, partition: int, epoch: int, batch: RefBatch, now: int) -> None:
        prod = self.alive(pid, now)
        if prod is None:
            prod = self.producers[pid] = RefProducer(epoch, now)
        prod.epoch = max(prod.epoch, epoch)
        prod.seen_ms = max(prod.seen_ms, now)
        part = self._part(prod, partition, now)
        if part is None or part.epoch != epoch:
            part = prod.parts[partition] = RefPartition(epoch, now)
        part.accepted.append(batch)
        part.seen_ms = max(part.seen_ms, now)

    def register(self, pid: int, epoch: int, now: int) -> str:
        prod = self.alive(pid, now)
        if prod is None:
            self.producers[pid] = RefProducer(epoch, now)
            return ACCEPT
        if epoch <= prod.epoch:
            return FENCED  # registering is conditional: only a newer epoch is taken
        prod.epoch = epoch
        prod.seen_ms = max(prod.seen_ms, now)
        return ACCEPT

    def sequence_for(self, pid: int, partition: int, choice: tuple[str, int], count: int, now: int) -> int:
        """A base sequence for a kind of batch (next, duplicate k-th last, overlap, gap, ...)."""
        kind, n = choice
        prod = self.alive(pid, now)
        part = None if prod is None else self._part(prod, partition, now)
        hist = part.accepted if part is not None else []
        nxt = (hist[-1].last + 1) % M if hist else 0
        if kind == "next":
            return nxt
        if kind == "dup" and hist:
            return hist[-min(n, len(hist))].first
        if kind == "overlap" and hist:
            batch = hist[-min(n, len(hist))]
            return (batch.first + 1) % M if count == 1 else batch.first
        if kind == "gap":
            return (nxt + n) % M
        if kind == "wrap":
            return M - 1 - n
        if kind == "any":
            return n % M
        return 0


SEQ_CHOICES = st.one_of(
    st.tuples(st.just("next"), st.just(0)),
    st.tuples(st.just("dup"), st.integers(1, WINDOW + 2)),
    st.tuples(st.just("overlap"), st.integers(1, 3)),
    st.tuples(st.just("gap"), st.integers(1, 3)),
    st.tuples(st.just("wrap"), st.integers(0, 3)),
    st.tuples(st.just("zero"), st.just(0)),
    st.tuples(st.just("any"), st.integers(0, M - 1)),
)
TIME_STEPS = st.sampled_from([0, 0, 0, 1, 250, EXP // 2, EXP - 1, EXP + 1, 3 * EXP])


# ---------------------------------------------------------------------------------------------
# Pure functions: explicit examples, one per rule.
# ---------------------------------------------------------------------------------------------
class PureLog:
    """check_batch + accept_batch with offsets assigned densely, as replay does."""

    def __init__(self, expiration_ms: int = EXP) -> None:
        self.exp = expiration_ms
        self.states: dict[int, ProducerState | None] = {}
        self.ends: dict[int, int] = {}

    def append(
        self, pid: int, partition: int, epoch: int, first: int, count: int, now: int
    ) -> tuple[int, int, bool]:
        state = self.states.get(pid)
        before = copy.deepcopy(state)
        decision = check_batch(state, partition, epoch, first, count, now, self.exp)
        assert state == before, "check_batch must not change the state"
        if not decision.accept:
            dup = decision.duplicate_of
            assert dup is not None
            return dup.first_offset, dup.last_offset, True
        base = self.ends.get(partition, 0)
        self.ends[partition] = base + count
        meta = BatchMeta(first, last_sequence(first, count), base, base + count - 1, now)
        self.states[pid] = accept_batch(state, pid, partition, epoch, meta, now, self.exp)
        return base, base + count - 1, False

    def register(self, pid: int, epoch: int, now: int) -> None:
        self.states[pid] = register_epoch(self.states.get(pid), pid, epoch, now, self.exp)


def test_unknown_producer_is_accepted_at_any_sequence() -> None:
    for seq in (0, 1, 12345, M - 1):
        assert check_batch(None, 0, 0, seq, 3, T0, EXP).accept


def test_exact_duplicate_of_each_of_the_last_five_returns_its_original_offsets() -> None:
    pure = PureLog()
    sent = [pure.append(PID, 0, 0, seq, 2, T0) for seq in range(0, 12, 2)]  # six batches
    assert [s[:2] for s in sent] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11)]
    for i in range(1, 6):  # the last five are remembered
        assert pure.append(PID, 0, 0, 2 * i, 2, T0) == (2 * i, 2 * i + 1, True)
    assert pure.ends[0] == 12  # duplicates assign nothing
    with pytest.raises(OutOfOrderSequenceError):  # the sixth-last fell out of the window
        pure.append(PID, 0, 0, 0, 2, T0)


def test_duplicate_must_match_first_and_last_sequence() -> None:
    pure = PureLog()
    pure.append(PID, 0, 0, 0, 3, T0)  # sequences 0..2
    with pytest.raises(OutOfOrderSequenceError):  # same first, shorter: partial overlap
        pure.append(PID, 0, 0, 0, 2, T0)
    with pytest.raises(OutOfOrderSequenceError):  # same first, longer: partial overlap
        pure.append(PID, 0, 0, 0, 4, T0)
    with pytest.raises(OutOfOrderSequenceError):  # starts inside the batch
        pure.append(PID, 0, 0, 1, 2, T0)
    assert pure.append(PID, 0, 0, 0, 3, T0) == (0, 2, True)


def test_gap_is_out_of_order_and_changes_nothing() -> None:
    pure = PureLog()
    pure.append(PID, 0, 0, 0, 2, T0)
    state = copy.deepcopy(pure.states[PID])
    for seq in (3, 4, 100, M - 1):
        with pytest.raises(OutOfOrderSequenceError):
            pure.append(PID, 0, 0, seq, 1, T0)
    assert pure.states[PID] == state
    assert pure.append(PID, 0, 0, 2, 1, T0) == (2, 2, False)


def test_older_epoch_is_fenced_everywhere() -> None:
    pure = PureLog()
    pure.append(PID, 0, 1, 0, 1, T0)
    with pytest.raises(ProducerFencedError):
        pure.append(PID, 0, 0, 1, 1, T0)
    with pytest.raises(ProducerFencedError):  # also on a partition the old epoch never wrote
        pure.append(PID, 3, 0, 0, 1, T0)
    with pytest.raises(ProducerFencedError):  # and a resend of an old-epoch duplicate
        pure.append(PID, 0, 0, 0, 1, T0)
    pure.register(PID, 5, T0)
    with pytest.raises(ProducerFencedError):
        pure.append(PID, 0, 4, 0, 1, T0)
    with pytest.raises(ProducerFencedError):
        pure.register(PID, 4, T0)


def test_new_epoch_starts_at_sequence_zero_and_replaces_the_window() -> None:
    pure = PureLog()
    for seq in range(3):
        pure.append(PID, 0, 0, seq, 1, T0)
    with pytest.raises(OutOfOrderSequenceError):
        pure.append(PID, 0, 1, 3, 1, T0)  # continuing the old sequence under a new epoch
    assert pure.append(PID, 0, 1, 0, 1, T0) == (3, 3, False)
    # The old epoch's batch with sequence 0 is gone from the window: seq 0 now means offset 3.
    assert pure.append(PID, 0, 1, 0, 1, T0) == (3, 3, True)
    # A registered newer epoch: the first batch on a partition with history must start at 0.
    pure.register(PID, 2, T0)
    with pytest.raises(OutOfOrderSequenceError):
        pure.append(PID, 0, 2, 1, 1, T0)
    assert pure.append(PID, 0, 2, 0, 2, T0)[2] is False
    # ... and a not-yet-registered newer epoch too, even on a fresh partition.
    with pytest.raises(OutOfOrderSequenceError):
        pure.append(PID, 1, 3, 7, 1, T0)
    assert pure.append(PID, 1, 3, 0, 1, T0) == (0, 0, False)


def test_registered_epoch_may_start_a_fresh_partition_anywhere() -> None:
    pure = PureLog()
    pure.register(PID, 0, T0)
    assert pure.append(PID, 2, 0, 777, 1, T0) == (0, 0, False)
    assert pure.append(PID, 2, 0, 778, 1, T0) == (1, 1, False)


@pytest.mark.parametrize(("first", "count", "last"), [(M - 1, 1, M - 1), (M - 2, 3, 0), (M - 1, 4, 2)])
def test_sequences_wrap_after_two_to_the_31_minus_one(first: int, count: int, last: int) -> None:
    assert SEQUENCE_MODULUS == M and WINDOW == 5
    assert last_sequence(first, count) == last
    pure = PureLog()
    assert pure.append(PID, 0, 0, first, count, T0) == (0, count - 1, False)
    assert pure.append(PID, 0, 0, first, count, T0) == (0, count - 1, True)  # wrapped duplicate
    with pytest.raises(OutOfOrderSequenceError):
        pure.append(PID, 0, 0, (last + 2) % M, 1, T0)
    with pytest.raises(OutOfOrderSequenceError):  # a partial overlap across the wrap
        pure.append(PID, 0, 0, first, count + 1, T0)
    assert pure.append(PID, 0, 0, (last + 1) % M, 1, T0) == (count, count, False)


def test_base_sequence_outside_the_range_is_refused() -> None:
    with pytest.raises(OutOfOrderSequenceError):
        check_batch(None, 0, 0, M, 1, T0, EXP)
    with pytest.raises(OutOfOrderSequenceError):
        check_batch(None, 0, 0, -1, 1, T0, EXP)
    with pytest.raises(ProducerError):
        check_batch(None, 0, 0, 0, 0, T0, EXP)


def test_idle_producer_expires_and_is_then_accepted_at_any_sequence() -> None:
    pure = PureLog()
    pure.append(PID, 0, 3, 0, 2, T0)
    later = T0 + EXP - 1
    assert pure.append(PID, 0, 3, 0, 2, later) == (0, 1, True)  # duplicates do not refresh it
    with pytest.raises(ProducerFencedError):
        pure.append(PID, 0, 2, 0, 1, later)
    expired = T0 + EXP + 1
    assert pure.append(PID, 0, 3, 0, 2, expired) == (2, 3, False)  # forgotten: a new batch
    # After expiry even an older epoch is a fresh producer.
    pure2 = PureLog()
    pure2.append(PID, 0, 3, 0, 1, T0)
    assert pure2.append(PID, 0, 1, 5, 1, expired) == (1, 1, False)


def test_partition_state_expires_on_its_own() -> None:
    pure = PureLog()
    pure.append(PID, 0, 0, 0, 1, T0)
    pure.append(PID, 1, 0, 0, 1, T0 + EXP)  # keeps the producer alive
    assert pure.append(PID, 0, 0, 50, 1, T0 + EXP + 1) == (1, 1, False)  # partition 0 forgotten
    with pytest.raises(OutOfOrderSequenceError):
        pure.append(PID, 1, 0, 50, 1, T0 + EXP + 1)  # partition 1 remembered


# ---------------------------------------------------------------------------------------------
# Pure functions against the model.
# ---------------------------------------------------------------------------------------------
OPERATION = st.one_of(
    st.tuples(
        st.just("append"), st.sampled_from([1, 2]), st.integers(0, 2),
        st.sampled_from(["current", "current", "current", "older", "newer"]),
        SEQ_CHOICES, st.integers(1, 4), TIME_STEPS,
    ),
    st.tuples(st.just("register"), st.sampled_from([1, 2]), st.sampled_from(["current", "older", "newer"]),
              TIME_STEPS),
)


def _epoch(model: RefRules, pid: int, choice: str, now: int) -> int:
    current = model.epoch_of(pid, now)
    base = 0 if current is None else current
    if choice == "older":
        return max(base - 1, 0)
    if choice == "newer":
        return base + 1
    return base


@settings(max_examples=400, deadline=None)
@given(st.lists(OPERATION, min_size=1, max_size=60))
def test_pure_rules_agree_with_the_reference_model(operations: list[tuple[Any, ...]]) -> None:
    model = RefRules(EXP)
    pure = PureLog(EXP)
    now = T0
    for op in operations:
        if op[0] == "register":
            _, pid, epoch_choice, dt = op
            now += dt
            epoch = _epoch(model, pid, epoch_choice, now)
            expected = model.register(pid, epoch, now)
            if expected == FENCED:
                with pytest.raises(ProducerFencedError):
                    pure.register(pid, epoch, now)
            else:
                pure.register(pid, epoch, now)
            continue
        _, pid, partition, epoch_choice, seq_choice, count, dt = op
        now += dt
        epoch = _epoch(model, pid, epoch_choice, now)
        first = model.sequence_for(pid, partition, seq_choice, count, now)
        outcome, dup = model.decide(pid, partition, epoch, first, count, now)
        if outcome == FENCED:
            with pytest.raises(ProducerFencedError):
                pure.append(pid, partition, epoch, first, count, now)
        elif outcome == OUT_OF_ORDER:
            with pytest.raises(OutOfOrderSequenceError):
                pure.append(pid, partition, epoch, first, count, now)
        elif outcome == DUPLICATE:
            assert dup is not None
            assert pure.append(pid, partition, epoch, first, count, now) == (
                dup.first_offset, dup.last_offset, True)
        else:
            base = pure.ends.get(partition, 0)
            assert pure.append(pid, partition, epoch, first, count, now) == (base, base + count - 1, False)
            model.accept(pid, partition, epoch,
                         RefBatch(first, (first + count - 1) % M, base, base + count - 1), now)
        for state in pure.states.values():
            if state is not None:  # the state survives its JSON form exactly (cache, checkpoints)
                assert producer_from_json(producer_to_json(state)) == state
                assert all(len(part.batches) <= WINDOW for part in state.partitions.values())


# ---------------------------------------------------------------------------------------------
# Through a real Log: explicit examples.
# ---------------------------------------------------------------------------------------------
def _recs(tag: str, count: int) -> list[tuple[bytes, bytes]]:
    return [(f"{tag}-{i}".encode(), f"value-{tag}-{i}".encode()) for i in range(count)]


def _live_files(the_log: Log) -> int:
    return int(the_log.snapshot(lambda r: len(list(r.iter_files()))))


def _data_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "data").rglob("*.arrow"))


def test_duplicate_through_the_log_returns_original_offsets_and_writes_nothing(
    tmp_path: Path, make_log: Any, helpers: Any
) -> None:
    root = tmp_path / "root"
    the_log = make_log(root, tmp_path / "cache", producer_id_expiration_ms=EXP)
    producer = the_log.producer(PID)
    originals = [producer.append(1, _recs(f"b{i}", 2), base_sequence=2 * i) for i in range(5)]
    assert [(r.base_offset, r.last_offset, r.duplicate) for r in originals] == [
        (2 * i, 2 * i + 1, False) for i in range(5)]
    before = (the_log.version, the_log.end_offset(1), _live_files(the_log),
              helpers.commit_names(root), _data_files(root), helpers.records_of(the_log, 1))
    for i in reversed(range(5)):
        again = producer.append(1, _recs(f"b{i}", 2), base_sequence=2 * i)
        assert (again.base_offset, again.last_offset, again.duplicate) == (2 * i, 2 * i + 1, True)
    # Nothing written: no offsets, no live file, no commit, no data file.
    after = (the_log.version, the_log.end_offset(1), _live_files(the_log),
             helpers.commit_names(root), _data_files(root), helpers.records_of(the_log, 1))
    assert after == before


def test_a_duplicate_decided_at_replay_never_becomes_live(tmp_path: Path, make_log: Any, helpers: Any) -> None:
    """A resend from a handle whose cache is behind is written and committed, and replay refuses
    it as a duplicate (a retroactive tombstone): original offsets, nothing live, for every reader."""
    root = tmp_path / "root"
    first = make_log(root, tmp_path / "cache-a")
    producer = first.producer(PID)
    second = make_log(root, tmp_path / "cache-b")
    resumed = second.producer(PID, epoch=producer.epoch)  # a second process of the same producer
    sent = producer.append(2, _recs("once", 3), base_sequence=0)
    producer.append(2, _recs("then", 1), base_sequence=3)
    version, files = first.version, _live_files(first)
    again = resumed.append(2, _recs("once", 3), base_sequence=0)  # its cache had not seen them
    assert (again.base_offset, again.last_offset, again.duplicate) == (sent.base_offset, sent.last_offset, True)
    assert second.version == version + 1  # the resend was committed, and refused at replay
    for reader in (first, second, make_log(root, tmp_path / "cache-c")):
        reader.refresh()
        assert reader.end_offset(2) == 4 and _live_files(reader) == files
        assert [k for _o, k, _v in helpers.records_of(reader, 2)] == [k for k, _v in _recs("once", 3) + _recs("then", 1)]


def test_gap_and_partial_overlap_through_the_log_change_no_offsets(
    tmp_path: Path, make_log: Any, helpers: Any
) -> None:
    the_log = make_log(tmp_path / "root", tmp_path / "cache")
    producer = the_log.producer(PID)
    producer.append(0, _recs("a", 3), base_sequence=0)
    content = helpers.records_of(the_log, 0)
    for seq, count in [(4, 1), (1, 1), (0, 2), (2, 2), (M - 1, 1)]:
        with pytest.raises(OutOfOrderSequenceError):
            producer.append(0, _recs(f"bad{seq}", count), base_sequence=seq)
    assert helpers.records_of(the_log, 0) == content and the_log.end_offset(0) == 3
    assert producer.append(0, _recs("b", 1), base_sequence=3).base_offset == 3


def test_new_epoch_fences_the_old_holder_and_starts_at_zero(tmp_path: Path, make_log: Any) -> None:
    the_log = make_log(tmp_path / "root", tmp_path / "cache")
    old = the_log.producer(PID)
    assert old.epoch == 0
    old.append(0, _recs("old", 2), base_sequence=0)
    new = the_log.producer(PID)
    assert (new.producer_id, new.epoch) == (PID, 1)
    with pytest.raises(ProducerFencedError):
        old.append(0, _recs("old2", 1), base_sequence=2)
    with pytest.raises(ProducerFencedError):  # even a resend of its own batch
        old.append(0, _recs("old", 2), base_sequence=0)
    with pytest.raises(OutOfOrderSequenceError):
        new.append(0, _recs("new", 1), base_sequence=2)
    assert new.append(0, _recs("new", 1), base_sequence=0).base_offset == 2
    with pytest.raises(ProducerFencedError):
        the_log.producer(PID, epoch=0)  # resuming an older epoch
    resumed = the_log.producer(PID, epoch=1)
    assert resumed.append(0, _recs("new", 1), base_sequence=0).duplicate


def test_sequence_wrap_through_the_log(tmp_path: Path, make_log: Any) -> None:
    the_log = make_log(tmp_path / "root", tmp_path / "cache")
    producer = the_log.producer(PID)
    first = producer.append(2, _recs("w", 3), base_sequence=M - 2)  # M-2, M-1, 0
    assert (first.base_offset, first.last_offset, first.duplicate) == (0, 2, False)
    assert producer.append(2, _recs("x", 1), base_sequence=1).base_offset == 3
    again = producer.append(2, _recs("w", 3), base_sequence=M - 2)
    assert (again.base_offset, again.last_offset, again.duplicate) == (0, 2, True)
    with pytest.raises(OutOfOrderSequenceError):
        producer.append(2, _recs("y", 1), base_sequence=M - 1)
    for bad in (M, -1):
        with pytest.raises(OutOfOrderSequenceError):
            producer.append(2, _recs("y", 1), base_sequence=bad)
    with pytest.raises(InvalidRecordError):
        producer.append(2, _recs("y", 1), base_sequence=True)  # type: ignore[arg-type]
    assert the_log.end_offset(2) == 4


def test_expiry_follows_the_injected_clock(tmp_path: Path, make_log: Any, clock: ManualClock) -> None:
    root = tmp_path / "root"
    the_log = make_log(root, tmp_path / "cache", producer_id_expiration_ms=EXP)
    producer = the_log.producer(PID)
    producer.append(0, _recs("a", 2), base_sequence=0)
    commit = decode_commit("c", LocalStorage(root).read(commit_name(the_log.version)))
    assert commit.timestamp_ms == clock.now_ms() == T0  # commits are stamped by the injected clock
    clock.advance(EXP - 1)
    assert producer.append(0, _recs("a", 2), base_sequence=0).duplicate  # still remembered
    clock.advance(2)  # idle for EXP + 1 since the last accepted batch
    fresh = producer.append(0, _recs("a", 2), base_sequence=0)
    assert (fresh.base_offset, fresh.last_offset, fresh.duplicate) == (2, 3, False)
    commit = decode_commit("c", LocalStorage(root).read(commit_name(the_log.version)))
    assert commit.timestamp_ms == T0 + EXP + 1
    # An expired producer resumes at whatever epoch it asks for (it was forgotten) ...
    clock.advance(EXP + 1)
    assert the_log.producer(PID, epoch=7).epoch == 7
    # ... and a fresh epoch bump after expiry still goes past the newest remembered epoch, so the
    # old holder (epoch 7) is fenced rather than able to fence the new one.
    clock.advance(EXP + 1)
    bumped = the_log.producer(PID)
    assert bumped.epoch == 8
    with pytest.raises(ProducerFencedError):
        the_log.producer(PID, epoch=7)


@pytest.mark.parametrize("reopen", ["same_cache", "fresh_cache", "fresh_cache_from_checkpoint"])
def test_the_whole_window_survives_a_restart(
    tmp_path: Path, make_log: Any, clock: ManualClock, reopen: str
) -> None:
    root = tmp_path / "root"
    interval = 3 if reopen == "fresh_cache_from_checkpoint" else 1000
    the_log = make_log(root, tmp_path / "cache", checkpoint_interval=interval)
    producer = the_log.producer(PID)
    sent = [producer.append(0, _recs(f"b{i}", i + 1), base_sequence=sum(range(1, i + 1)))
            for i in range(6)]
    other = producer.append(3, _recs("p3", 1), base_sequence=10)
    ends = [the_log.end_offset(p) for p in range(4)]
    version = the_log.version
    the_log.close()
    clock.advance(1000)
    cache = tmp_path / ("cache" if reopen == "same_cache" else "cache2")
    if reopen == "fresh_cache_from_checkpoint":
        assert any(n.endswith(".checkpoint.json") for n in (p.name for p in (root / "log").iterdir()))
    reopened = make_log(root, cache, checkpoint_interval=interval)
    assert reopened.version == version and [reopened.end_offset(p) for p in range(4)] == ends
    resumed = reopened.producer(PID, epoch=producer.epoch)
    assert reopened.version == version  # resuming the current epoch commits nothing
    for i in range(1, 6):  # the last five batches of partition 0 are still duplicates
        again = resumed.append(0, _recs(f"b{i}", i + 1), base_sequence=sum(range(1, i + 1)))
        assert (again.base_offset, again.last_offset, again.duplicate) == (
            sent[i].base_offset, sent[i].last_offset, True)
    assert resumed.append(3, _recs("p3", 1), base_sequence=10) == type(other)(
        other.base_offset, other.last_offset, True)
    with pytest.raises(OutOfOrderSequenceError):  # the sixth-last is out of the window
        resumed.append(0, _recs("b0", 1), base_sequence=0)
    assert [reopened.end_offset(p) for p in range(4)] == ends
    nxt = resumed.append(0, _recs("next", 1), base_sequence=sum(range(1, 7)))
    assert (nxt.base_offset, nxt.duplicate) == (ends[0], False)


# ---------------------------------------------------------------------------------------------
# Through a real Log: a state machine against the model.
# ---------------------------------------------------------------------------------------------
PARTS = 3


class LogProducerMachine(RuleBasedStateMachine):
    """One producer id on a real log, with epoch bumps, stale holders, time and restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="kvlog-producer-sm-"))
        self.clock = ManualClock(T0)
        self.caches = 0
        self.opens = 0
        self.model = RefRules(EXP)
        self.records: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(PARTS)}
        self.serial = 0
        self.log = self._open(fresh_cache=True)
        self.producer = self.log.producer(PID)
        assert self.model.register(PID, 0, self.clock.now_ms()) == ACCEPT
        self.stale: list[Producer] = []

    def _open(self, *, fresh_cache: bool) -> Log:
        if fresh_cache:
            self.caches += 1
        self.opens += 1
        config = StoreConfig(partitions=PARTS, producer_id_expiration_ms=EXP, checkpoint_interval=4)
        return open_log(
            LocalStorage(self.dir / "root", fsync=False), cache_dir=self.dir / f"cache{self.caches}",
            partitions=PARTS, config=config, clock=self.clock, ids=SeededIdSource(self.opens),
        )

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _append(self, producer: Producer, partition: int, choice: tuple[str, int], count: int) -> None:
        now = self.clock.now_ms()
        first = self.model.sequence_for(PID, partition, choice, count, now)
        self.serial += 1
        batch = [(f"s{self.serial}-{i}".encode(), f"v{self.serial}-{i}".encode()) for i in range(count)]
        outcome, dup = self.model.decide(PID, partition, producer.epoch, first, count, now)
        if outcome == DUPLICATE:
            assert dup is not None  # a resend is the same batch: its records are the original's
            batch = self.records[partition][dup.first_offset:dup.last_offset + 1]
        files = _live_files(self.log)
        if outcome in (FENCED, OUT_OF_ORDER):
            error = ProducerFencedError if outcome == FENCED else OutOfOrderSequenceError
            with pytest.raises(error):
                producer.append(partition, batch, base_sequence=first)
            return
        result = producer.append(partition, batch, base_sequence=first)
        if outcome == DUPLICATE:
            assert dup is not None
            assert (result.base_offset, result.last_offset, result.duplicate) == (
                dup.first_offset, dup.last_offset, True)
            assert _live_files(self.log) == files
            return
        base = len(self.records[partition])
        assert (result.base_offset, result.last_offset, result.duplicate) == (base, base + count - 1, False)
        self.records[partition].extend(batch)
        self.model.accept(PID, partition, producer.epoch,
                          RefBatch(first, (first + count - 1) % M, base, base + count - 1), now)

    @rule(partition=st.integers(0, PARTS - 1), choice=SEQ_CHOICES, count=st.integers(1, 3))
    def append(self, partition: int, choice: tuple[str, int], count: int) -> None:
        self._append(self.producer, partition, choice, count)

    @precondition(lambda self: bool(self.stale))
    @rule(partition=st.integers(0, PARTS - 1), choice=SEQ_CHOICES, data=st.data())
    def append_from_a_stale_holder(self, partition: int, choice: tuple[str, int], data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(self.stale))
        self._append(holder, partition, choice, 1)

    @rule()
    def bump_epoch(self) -> None:
        now = self.clock.now_ms()
        # A bump goes past the newest epoch the log remembers, even of an expired producer.
        remembered = self.model.producers.get(PID)
        expected = 0 if remembered is None else remembered.epoch + 1
        new = self.log.producer(PID)
        assert new.epoch == expected
        assert self.model.register(PID, expected, now) == ACCEPT
        self.stale.append(self.producer)
        self.producer = new

    @rule(dt=st.sampled_from([1, 300, EXP // 2, EXP + 1]))
    def advance_clock(self, dt: int) -> None:
        self.clock.advance(dt)

    @rule(fresh_cache=st.booleans())
    def restart(self, fresh_cache: bool) -> None:
        version = self.log.version
        self.log.close()
        self.stale = []
        self.log = self._open(fresh_cache=fresh_cache)
        assert self.log.version == version
        now = self.clock.now_ms()
        epoch = self.producer.epoch
        current = self.model.epoch_of(PID, now)
        if current is not None and epoch < current:
            with pytest.raises(ProducerFencedError):
                self.log.producer(PID, epoch=epoch)
            self.bump_epoch()
            self.stale = []
            return
        self.producer = self.log.producer(PID, epoch=epoch)
        assert self.producer.epoch == epoch
        if current != epoch:
            assert self.model.register(PID, epoch, now) == ACCEPT
        else:
            assert self.log.version == version  # resuming commits nothing

    @invariant()
    def log_matches_the_model(self) -> None:
        for p in range(PARTS):
            expected = self.records[p]
            assert self.log.end_offset(p) == len(expected)
            got = [(r.offset, r.key, r.value) for r in self.log.read(p)]
            assert got == [(i, k, v) for i, (k, v) in enumerate(expected)]


LogProducerMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_log_producer_state_machine = LogProducerMachine.TestCase


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, PARTS - 1), SEQ_CHOICES, st.integers(1, 3), TIME_STEPS),
                min_size=1, max_size=12))
def test_log_and_pure_rules_decide_alike(batches: list[tuple[int, tuple[str, int], int, int]]) -> None:
    """The real log and the pure functions, fed the same batches, give the same results."""
    directory = Path(tempfile.mkdtemp(prefix="kvlog-producer-"))
    clock = ManualClock(T0)
    config = StoreConfig(partitions=PARTS, producer_id_expiration_ms=EXP)
    the_log = open_log(LocalStorage(directory / "root", fsync=False), cache_dir=directory / "cache",
                       config=config, clock=clock, ids=SeededIdSource(3))
    try:
        pure = PureLog(EXP)
        model = RefRules(EXP)
        producer = the_log.producer(None)  # a new id, never registered: epoch 0
        written: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(PARTS)}
        for n, (partition, choice, count, dt) in enumerate(batches):
            clock.advance(dt)
            now = clock.now_ms()
            first = model.sequence_for(producer.producer_id, partition, choice, count, now)
            records = [(f"{n}-{i}".encode(), b"v") for i in range(count)]
            try:
                expected: Any = pure.append(producer.producer_id, partition, 0, first, count, now)
            except ProducerError as e:
                with pytest.raises(type(e)):
                    producer.append(partition, records, base_sequence=first)
                continue
            if expected[2]:  # a duplicate is a resend of the same records
                records = written[partition][expected[0]:expected[1] + 1]
            else:
                written[partition].extend(records)
            got = producer.append(partition, records, base_sequence=first)
            assert (got.base_offset, got.last_offset, got.duplicate) == expected
            if not expected[2]:
                model.accept(producer.producer_id, partition, 0,
                             RefBatch(first, (first + count - 1) % M, expected[0], expected[1]), now)
    finally:
        the_log.close()
        shutil.rmtree(directory, ignore_errors=True)
