"""Producer handles: taking an epoch (fencing older holders) and appending with sequences.

Opening a producer registers an epoch with a conditional ``producer`` commit
(Kafka's InitProducerId): replay accepts it only if the epoch is newer than the
producer's current one, so when several processes open the same producer at the
same instant, exactly one of them gets each epoch and the others retry.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvlog.errors import (
    InvalidRecordError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    ReadOnlyError,
)
from kvlog.format.commit import Commit
from kvlog.log.append import PendingBatch, raise_refusal, to_record_batch
from kvlog.log.producers import fenced_message
from kvlog.log.records import AppendResult, validate_records

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["Producer", "open_producer", "register_producer"]


class Producer:
    """An idempotent producer: appends carry (producer id, epoch, base sequence)."""

    def __init__(self, log: Log, producer_id: int, epoch: int) -> None:
        self._log = log
        self.producer_id = producer_id
        self.epoch = epoch

    def append(self, partition: int, records: Sequence[Sequence[Any]], *, base_sequence: int) -> AppendResult:
        """Append ``records`` to ``partition``; durable on return. A repeat of one of the last 5
        batches returns the original offsets with ``duplicate=True``."""
        self._log.check_partition(partition)
        if not isinstance(base_sequence, int) or isinstance(base_sequence, bool):
            raise InvalidRecordError("base_sequence must be an integer")
        if not 0 <= base_sequence < 2**31:
            raise OutOfOrderSequenceError(f"base_sequence {base_sequence} outside [0, 2^31)")
        if isinstance(records, str | bytes | bytearray | memoryview) or not isinstance(records, Iterable):
            raise InvalidRecordError(f"records must be a sequence of (key, value, ...) tuples, not "
                                     f"{type(records).__name__}")
        cfg = self._log.config
        valid = validate_records(records, default_timestamp=self._log.clock.now_ms(),
                                 max_key_bytes=cfg.max_key_bytes, max_record_bytes=cfg.max_record_bytes)
        batch = PendingBatch(partition, to_record_batch(valid), base_sequence)
        return self._log.append_batches(self.producer_id, self.epoch, [batch])[0]

    def __repr__(self) -> str:
        return f"Producer(producer_id={self.producer_id}, epoch={self.epoch})"


def open_producer(the_log: Log, producer_id: int | None = None, *, epoch: int | None = None) -> Producer:
    """A producer handle: a new id, a bumped epoch (fencing), or a resumed one."""
    the_log.check_open()
    if the_log.read_only:
        raise ReadOnlyError("the store is open read-only")
    if producer_id is None:
        fresh_id = int.from_bytes(the_log.ids.token(8), "big") >> 1
        return Producer(the_log, fresh_id, 0 if epoch is None else epoch)
    if not isinstance(producer_id, int) or isinstance(producer_id, bool) or not 0 <= producer_id < 2**63:
        raise InvalidRecordError(f"producer_id must be an integer in [0, 2^63), not {producer_id!r}")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0):
        raise InvalidRecordError(f"epoch must be an integer >= 0, not {epoch!r}")
    retries, expiration_ms = the_log.config.commit_retries, the_log.config.producer_id_expiration_ms
    for _attempt in range(retries):
        the_log.refresh()
        state = the_log.snapshot(lambda r: r.get_producer(producer_id))
        now = max(the_log.clock.now_ms(), the_log.snapshot(lambda r: r.last_commit_ms()))
        current = None
        if state is not None and not state.expired(now, expiration_ms):
            current = state.epoch
        if epoch is None:
            # Bump past the newest epoch still remembered, even an expired one, so an old holder
            # that wakes up can never fence the new one.
            new_epoch = 0 if state is None else state.epoch + 1
        elif current is not None and epoch < current:
            raise ProducerFencedError(fenced_message(producer_id, epoch, current))
        else:
            new_epoch = epoch
        if current is not None and new_epoch == current:
            return Producer(the_log, producer_id, new_epoch)  # resumed: the same holder restarted
        try:
            register_producer(the_log, producer_id, new_epoch)
        except ProducerFencedError:
            # Another opener took this epoch first (the registration is conditional, so
            # exactly one wins it): read the new state and try again.
            continue
        return Producer(the_log, producer_id, new_epoch)
    raise ProducerFencedError(
        f"producer {producer_id}: {retries} attempts to take an epoch lost to other openers"
    )


def register_producer(the_log: Log, producer_id: int, epoch: int) -> None:
    """Commit ``epoch`` as the producer's current epoch, fencing older holders."""
    commit_id = the_log.new_id()
    clock = the_log.clock
    outcome = the_log.commit(
        lambda v: Commit(v, commit_id, clock.now_ms(), "producer", producer_id=producer_id, epoch=epoch)
    )
    if outcome.refusal is not None:
        raise_refusal(outcome.refusal)
