"""Writer operations: drawn from a seeded mix, performed on a store, journaled, checked as they go.

The same code drives a writer thread of the harness process and a writer process
(:mod:`.worker`): :func:`next_op` draws the next operation from the writer's own
``random.Random``; :class:`Lane` performs it on an open store, journals its writes, acknowledges
them when kvlog says they are durable, and checks what reads return (read-your-writes on the
handle's own keys, well-formed values everywhere, ordered and duplicate-free changelogs).
"""

from __future__ import annotations

import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Protocol

import kvlog
from kvlog.errors import KvlogError
from kvlog.storage.faulty import SimulatedCrash

from .model import Journal, check_changelog_chunk, key_name

__all__ = ["OpMix", "next_op", "Lane", "Sink", "REOPEN_ERRORS", "needs_reopen", "classify"]

#: Errors after which a writer reopens its store (kvlog says so, or the handle cannot go on).
REOPEN_ERRORS = frozenset({
    "ProducerFencedError", "OutOfOrderSequenceError", "StorageBehindError", "CommitStateUnknownError",
    "StoreClosedError", "CorruptDataError",
})


def needs_reopen(error: BaseException) -> bool:
    """Whether a writer should reopen its store after ``error`` raised from a write."""
    return any(t.__name__ in REOPEN_ERRORS for t in type(error).__mro__)


def classify(error: BaseException) -> str:
    """``Type: message`` of an error, short."""
    return f"{type(error).__name__}: {str(error)[:300]}"


class Sink(Protocol):
    """Where a lane reports: violations, notes, and what reads returned."""

    def violation(self, text: str) -> None: ...

    def note(self, text: str) -> None: ...

    def saw(self, key: str, value: bytes | None, *, committed: bool, where: str) -> None: ...


@dataclass
class OpMix:
    """Weights of a writer's operations and the shape of its writes (JSON-able for processes)."""

    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    keys: int = 12
    max_pad: int = 300
    big_pad: int = 1500
    max_batch: int = 6
    max_sleep_ms: int = 15

    def to_json(self) -> dict[str, Any]:
        return {"weights": self.weights, "keys": self.keys, "max_pad": self.max_pad, "big_pad": self.big_pad,
                "max_batch": self.max_batch, "max_sleep_ms": self.max_sleep_ms}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> OpMix:
        return cls(dict(obj["weights"]), int(obj["keys"]), int(obj["max_pad"]), int(obj["big_pad"]),
                   int(obj["max_batch"]), int(obj["max_sleep_ms"]))


DEFAULT_WEIGHTS: dict[str, float] = {
    "put": 30, "put_sync": 10, "delete": 4, "delete_sync": 3, "batch": 9, "flush": 8, "get": 10,
    "scan": 3, "changes": 2, "compact": 1.5, "gc": 1.5, "sleep": 6, "reopen": 0.2, "crash": 0.2,
}
#: Operations that change the handle's life (done by a handle's first lane, alone).
LIFECYCLE = frozenset({"reopen", "crash"})


def next_op(rng: random.Random, mix: OpMix, allowed: frozenset[str] | None = None) -> dict[str, Any]:
    """The next operation of a writer: a dict with ``op`` and its arguments."""
    names = [n for n in mix.weights if allowed is None or n in allowed]
    kind = rng.choices(names, [mix.weights[n] for n in names])[0]

    def pad() -> int:
        return rng.randint(mix.max_pad, mix.big_pad) if rng.random() < 0.15 else rng.randint(0, mix.max_pad)

    op: dict[str, Any] = {"op": kind}
    if kind in ("put", "put_sync"):
        op.update(key=rng.randrange(mix.keys), pad=pad())
    elif kind in ("delete", "delete_sync", "get"):
        op.update(key=rng.randrange(mix.keys))
    elif kind == "batch":
        op["items"] = [[rng.randrange(mix.keys), None if rng.random() < 0.2 else pad()]
                       for _ in range(rng.randint(1, mix.max_batch))]
    elif kind == "sleep":
        op["ms"] = rng.randint(0, mix.max_sleep_ms)
    elif kind == "compact":
        op["force"] = rng.random() < 0.6
    elif kind == "changes":
        op["partition"] = rng.randrange(64)
    elif kind == "scan":
        op["own"] = rng.random() < 0.5
    return op


class Lane:
    """One writer: its keys, journal and read-your-writes model, on a store it may share.

    :meth:`run` performs one operation and returns what the handle's owner must do next:
    ``None``, ``"reopen"`` (a clean close and reopen), ``"crash"`` (close without flushing),
    or ``"recover"`` (kvlog said the handle cannot go on, or it raised something unexpected).
    """

    def __init__(self, writer: str, journal: Journal, sink: Sink, mix: OpMix) -> None:
        self.writer = writer
        self.journal = journal
        self.sink = sink
        self.mix = mix
        self.keys = [key_name(writer, i) for i in range(mix.keys)]
        self.expected: dict[str, bytes | None] = {}
        self.errors = 0
        self.consecutive_errors = 0
        self.ops = 0
        self.acks = 0

    def new_generation(self) -> None:
        """The handle was reopened: what this lane wrote before is no longer known to be visible."""
        self.expected.clear()
        self.consecutive_errors = 0

    def run(self, store: kvlog.Store, gen: int, op: dict[str, Any]) -> str | None:
        kind = str(op["op"])
        if kind in LIFECYCLE:
            return kind
        self.ops += 1
        touched: list[str] = []
        try:
            self._perform(store, gen, op, touched)
        except SimulatedCrash:
            raise
        except KvlogError as e:
            self.errors += 1
            self.consecutive_errors += 1
            for key in touched:
                self.expected.pop(key, None)
            if kind in ("put", "put_sync", "delete", "delete_sync", "batch", "flush") and (
                    needs_reopen(e) or self.consecutive_errors >= 8):
                self.sink.note(f"{self.writer}: {kind} raised {classify(e)}; reopening")
                return "recover"
            return None
        except Exception as e:  # noqa: BLE001 - anything but a KvlogError from kvlog is a finding
            for key in touched:
                self.expected.pop(key, None)
            self.sink.violation(f"{self.writer}: {kind} raised an unexpected {classify(e)}\n"
                                f"{traceback.format_exc(limit=8)}")
            return "recover"
        self.consecutive_errors = 0
        return None

    def _ack(self, gen: int) -> None:
        self.journal.ack(gen)
        self.acks += 1

    def _perform(self, store: kvlog.Store, gen: int, op: dict[str, Any], touched: list[str]) -> None:
        kind = op["op"]
        if kind in ("put", "put_sync"):
            key = self.keys[op["key"]]
            value = self.journal.next_value(key, op["pad"])
            touched.append(key)
            self.journal.record(key, value, gen)
            store.put(key, value, sync=kind == "put_sync")
            self.expected[key] = value
            if kind == "put_sync":
                self._ack(gen)
        elif kind in ("delete", "delete_sync"):
            key = self.keys[op["key"]]
            touched.append(key)
            self.journal.record(key, None, gen)
            store.delete(key, sync=kind == "delete_sync")
            self.expected[key] = None
            if kind == "delete_sync":
                self._ack(gen)
        elif kind == "batch":
            staged: dict[str, bytes | None] = {}
            with store.batch() as b:
                for index, pad in op["items"]:
                    key = self.keys[index]
                    touched.append(key)
                    if pad is None:
                        self.journal.record(key, None, gen)
                        b.delete(key)
                        staged[key] = None
                    else:
                        value = self.journal.next_value(key, pad)
                        self.journal.record(key, value, gen)
                        b.put(key, value)
                        staged[key] = value
            self.expected.update(staged)
            self._ack(gen)
        elif kind == "flush":
            store.flush()
            self._ack(gen)
        elif kind == "get":
            key = self.keys[op["key"]]
            got = store.get(key)
            self._check_own(key, got, "get")
        elif kind == "scan":
            prefix = self.writer + "/" if op.get("own") else None
            items = dict(store.scan(prefix=prefix))
            seen = {}
            for raw_key, value in items.items():
                key = raw_key.decode("latin-1")
                seen[key] = value
                self.sink.saw(key, value, committed=False, where=f"{self.writer} scan")
            for key in self.keys:
                self._check_own(key, seen.get(key), "scan")
        elif kind == "changes":
            partition = op["partition"] % store.log.partitions
            records = [(r.offset, r.key.decode("latin-1"), r.value) for r in store.changes(partition)]
            for line in check_changelog_chunk(f"{self.writer} changes()", partition, records, None):
                self.sink.violation(line)
            for _offset, record_key, record_value in records:
                self.sink.saw(record_key, record_value, committed=True, where=f"{self.writer} changes()")
        elif kind == "compact":
            store.compact(force=op["force"])
        elif kind == "gc":
            store.gc()
        elif kind == "sleep":
            time.sleep(op["ms"] / 1000.0)
        else:
            raise ValueError(f"unknown operation {kind!r}")

    def _check_own(self, key: str, got: bytes | None, how: str) -> None:
        self.sink.saw(key, got, committed=False, where=f"{self.writer} {how}")
        if key in self.expected and got != self.expected[key]:
            want = self.expected[key]
            self.sink.violation(
                f"{self.writer}: {how}({key!r}) returned {got[:40] if got else got!r}, but this handle last wrote "
                f"{want[:40] if want else want!r} (read-your-writes)")
