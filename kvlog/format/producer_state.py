"""Producer state as kvlog keeps it: the types, and their JSON encoding.

One producer's state is its newest epoch and, per partition, the epoch and the
last few accepted batches (the window the idempotence rules of
:mod:`kvlog.log.producers` read). The same encoding is used in the metadata
cache and in checkpoints; values are immutable, and the rules return new ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BatchMeta",
    "PartitionProducerState",
    "ProducerState",
    "producer_from_json",
    "producer_to_json",
]


@dataclass(frozen=True)
class BatchMeta:
    """What the producer window remembers of an accepted batch."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    timestamp_ms: int
    digest: int | None = None
    """The batch's content digest (``kvlog.format.datafile.content_digest``); None when
    the commit that added it carried none."""


@dataclass(frozen=True)
class PartitionProducerState:
    """One producer's state on one partition: its epoch there and its window, oldest first."""

    epoch: int
    last_ms: int
    batches: tuple[BatchMeta, ...] = ()


@dataclass(frozen=True)
class ProducerState:
    """One producer's state: its newest epoch and its per-partition windows."""

    producer_id: int
    epoch: int
    last_ms: int
    partitions: Mapping[int, PartitionProducerState] = field(default_factory=dict)

    def expired(self, now_ms: int, expiration_ms: int) -> bool:
        """Whether the producer has been idle longer than ``expiration_ms`` at ``now_ms``."""
        return now_ms - self.last_ms > expiration_ms


def producer_to_json(state: ProducerState) -> dict[str, Any]:
    """The JSON object of ``state``."""
    return {
        "id": state.producer_id,
        "epoch": state.epoch,
        "last_ms": state.last_ms,
        "parts": {
            str(p): {
                "epoch": s.epoch,
                "last_ms": s.last_ms,
                "batches": [
                    [b.first_sequence, b.last_sequence, b.first_offset, b.last_offset, b.timestamp_ms]
                    + ([] if b.digest is None else [b.digest])
                    for b in s.batches
                ],
            }
            for p, s in sorted(state.partitions.items())
        },
    }


def producer_from_json(obj: Mapping[str, Any]) -> ProducerState:
    """The state :func:`producer_to_json` encoded; raises KeyError, TypeError, ValueError,
    IndexError or AttributeError when ``obj`` is malformed (the caller names the damaged
    document)."""
    return ProducerState(
        producer_id=int(obj["id"]),
        epoch=int(obj["epoch"]),
        last_ms=int(obj["last_ms"]),
        partitions={
            int(p): PartitionProducerState(
                int(s["epoch"]), int(s["last_ms"]), tuple(_batch_meta(b) for b in s["batches"])
            )
            for p, s in obj["parts"].items()
        },
    )


def _batch_meta(fields: list[Any]) -> BatchMeta:
    """A window entry of :func:`producer_to_json` (five integers, and the digest when known)."""
    first, last, first_offset, last_offset, stamp = (int(x) for x in fields[:5])
    digest = int(fields[5]) if len(fields) > 5 else None
    return BatchMeta(first, last, first_offset, last_offset, stamp, digest)
