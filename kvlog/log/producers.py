"""Kafka's idempotent-producer rules, broker side, as a pure state machine.

State per producer id: the newest registered epoch and, per partition, the
epoch and the metadata of the last :data:`WINDOW` accepted batches. A batch is
checked when the commit holding it is applied (never when its file is
written), with the commit's timestamp as "now", so every reader replays the
same decisions:

* an older epoch than the producer's → :class:`~kvlog.errors.ProducerFencedError`;
* an unknown or expired producer (on this partition) → accepted at any sequence;
* a newer epoch → must start at sequence 0, and replaces the partition's state;
* the same epoch and exactly the (first, last) sequence of one of the last
  5 batches, with the same content digest → a duplicate: the original offsets,
  nothing written; the same sequences with another content →
  :class:`~kvlog.errors.ProducerFencedError` (two holders share the epoch, so
  this one must stop: a resend that is not the same batch is never taken for one);
* the same epoch, first sequence = last sequence + 1 (mod 2^31) → accepted;
* anything else (a gap, a partial overlap, a duplicate older than the window)
  → :class:`~kvlog.errors.OutOfOrderSequenceError`.

Registering an epoch is a conditional step of its own (Kafka's InitProducerId):
a ``producer`` commit is accepted only if its epoch is newer than the
producer's current one, so when several processes open the same producer at
the same instant exactly one of them gets each epoch.

Unlike Kafka, the whole window lives in the metadata, so compaction cannot
shrink it and it survives restarts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvlog.errors import OutOfOrderSequenceError, ProducerError, ProducerFencedError
from kvlog.format.producer_state import BatchMeta, PartitionProducerState, ProducerState

__all__ = [
    "FENCED_HINT",
    "SEQUENCE_MODULUS",
    "WINDOW",
    "Decision",
    "last_sequence",
    "check_batch",
    "fenced_message",
    "accept_batch",
    "register_epoch",
]

SEQUENCE_MODULUS = 2**31
WINDOW = 5

#: What a fenced writer's error adds: only a reused explicit producer id is fenced, and how
#: several writers share a store.
FENCED_HINT = ("a later handle opened with the same producer_id took it over; to run several "
               "writers at once, open each without producer_id (each handle is then a producer of "
               "its own) or give each writer a producer_id of its own")


def fenced_message(producer_id: int, epoch: int, current: int, where: str = "") -> str:
    """The message of :class:`ProducerFencedError` for a write (or opening) at ``epoch`` once
    ``current`` is the producer's epoch: what fenced it, and how to run several writers."""
    return (f"producer {producer_id} epoch {epoch} is older than the current epoch {current}{where}: "
            f"{FENCED_HINT}")


def last_sequence(first_sequence: int, count: int) -> int:
    """The sequence of a batch's last record; sequences wrap after 2^31 - 1."""
    return (first_sequence + count - 1) % SEQUENCE_MODULUS


@dataclass(frozen=True)
class Decision:
    """The outcome of checking a batch: accept it, or it duplicates ``duplicate_of``."""

    accept: bool
    duplicate_of: BatchMeta | None = None


def check_batch(
    state: ProducerState | None,
    partition: int,
    epoch: int,
    first_sequence: int,
    count: int,
    now_ms: int,
    expiration_ms: int,
    digest: int | None = None,
) -> Decision:
    """Decide a batch under the rules above; raises a :class:`ProducerError` subclass when refused.

    ``digest`` is the batch's content digest: a batch repeating a remembered one's sequences is
    its duplicate only if the digests agree (or either is unknown)."""
    if count < 1:
        raise ProducerError("a batch holds at least one record")
    if not 0 <= first_sequence < SEQUENCE_MODULUS:
        raise OutOfOrderSequenceError(f"base_sequence {first_sequence} outside [0, 2^31)")
    if state is None or state.expired(now_ms, expiration_ms):
        return Decision(accept=True)
    if epoch < state.epoch:
        raise ProducerFencedError(fenced_message(state.producer_id, epoch, state.epoch))
    part = state.partitions.get(partition)
    if part is None or now_ms - part.last_ms > expiration_ms:
        if epoch > state.epoch and first_sequence != 0:
            raise OutOfOrderSequenceError(
                f"producer {state.producer_id}: a new epoch {epoch} must start at sequence 0, "
                f"got {first_sequence}"
            )
        return Decision(accept=True)
    if epoch < part.epoch:
        raise ProducerFencedError(fenced_message(state.producer_id, epoch, part.epoch, f" on partition {partition}"))
    if epoch > part.epoch:
        if first_sequence != 0:
            raise OutOfOrderSequenceError(
                f"producer {state.producer_id}: a new epoch {epoch} must start at sequence 0, "
                f"got {first_sequence}"
            )
        return Decision(accept=True)
    last = last_sequence(first_sequence, count)
    for meta in part.batches:
        if meta.first_sequence == first_sequence and meta.last_sequence == last:
            if digest is not None and meta.digest is not None and digest != meta.digest:
                raise ProducerFencedError(
                    f"producer {state.producer_id} epoch {epoch} partition {partition}: sequences "
                    f"{first_sequence}..{last} already hold another batch; another process writes "
                    "with the same producer id and epoch"
                )
            return Decision(accept=False, duplicate_of=meta)
    expected = (part.batches[-1].last_sequence + 1) % SEQUENCE_MODULUS if part.batches else 0
    if first_sequence != expected:
        raise OutOfOrderSequenceError(
            f"producer {state.producer_id} partition {partition}: expected sequence {expected}, "
            f"got {first_sequence}"
        )
    return Decision(accept=True)


def accept_batch(
    state: ProducerState | None,
    producer_id: int,
    partition: int,
    epoch: int,
    meta: BatchMeta,
    now_ms: int,
    expiration_ms: int,
) -> ProducerState:
    """The state after accepting ``meta`` (a batch :func:`check_batch` accepted)."""
    if state is None or state.expired(now_ms, expiration_ms):
        state = ProducerState(producer_id, epoch, now_ms)
    part = state.partitions.get(partition)
    if part is None or part.epoch != epoch or now_ms - part.last_ms > expiration_ms:
        part = PartitionProducerState(epoch, now_ms)
    part = PartitionProducerState(part.epoch, max(part.last_ms, now_ms), (*part.batches, meta)[-WINDOW:])
    return replace(state, epoch=max(state.epoch, epoch), last_ms=max(state.last_ms, now_ms),
                   partitions={**state.partitions, partition: part})


def register_epoch(
    state: ProducerState | None, producer_id: int, epoch: int, now_ms: int, expiration_ms: int
) -> ProducerState:
    """The state after a producer registered ``epoch``.

    Only a newer epoch than the current one is taken: an equal or older one is fenced, so two
    openers that both computed ``epoch`` from the same state never both hold it."""
    if state is None or state.expired(now_ms, expiration_ms):
        return ProducerState(producer_id, epoch, now_ms)
    if epoch <= state.epoch:
        raise ProducerFencedError(
            f"producer {producer_id} epoch {epoch} is not newer than the current epoch {state.epoch}"
        )
    return replace(state, epoch=epoch, last_ms=max(state.last_ms, now_ms))
