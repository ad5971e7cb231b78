"""Fault injection around any :class:`~kvlog.storage.base.Storage`, for tests only.

A :class:`FaultyStorage` forwards every call to the storage it wraps and, where
its :class:`FaultPlan` says so, fails instead. Every fault is deterministic: a
plan names the operation, a glob pattern over object names, and which matching
call fails (``nth``, then ``times`` calls in a row). A seeded random mode picks
faults from a hash of the seed and the call number, so the same seed and the
same calls give the same faults.

Fault kinds:

``"error"``
    raise :class:`~kvlog.errors.StorageError` *before* the operation: nothing happened.
``"timeout_after_success"``
    perform the operation, then raise ``StorageError("timed out ...")``: the
    caller cannot know that it succeeded (the case object stores really have).
``"crash"``
    raise :class:`SimulatedCrash` before or after the operation (``when``).
    ``SimulatedCrash`` is a ``BaseException`` and no ``KvlogError``, so library
    code does not catch it: the test sees the "process" die at that point.

Library code marks the steps of a flow that lie outside storage with
``storage.crash_point("after_data_write")`` (a no-op on real storages). The
:attr:`FaultyStorage.history` of a run lists every storage call and crash
point in order; :meth:`Event.crash_plan` turns any of them into a plan that
crashes exactly there, so a test can run a flow once and then crash it at each
step in turn::

    probe = FaultyStorage(LocalStorage(tmp))
    run_flow(probe)
    for event in probe.history:
        faulty = FaultyStorage(LocalStorage(fresh_dir()), event.crash_plan())
        with pytest.raises(SimulatedCrash):
            run_flow(faulty)
        check_recovery(fresh_dir())
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from kvlog.errors import StorageError
from kvlog.storage.base import BytesLike, ForwardStream, ObjectInfo, Storage
from kvlog.storage.watch import RenameWatch

__all__ = [
    "SimulatedCrash",
    "Fault",
    "FaultPlan",
    "Event",
    "FaultyStorage",
    "fail",
    "crash_at",
    "OPERATIONS",
    "STORAGE_OPERATIONS",
]

FaultKind = Literal["error", "timeout_after_success", "crash"]
When = Literal["before", "after"]

#: The Storage methods a fault can target, and the request kind each one counts.
STORAGE_OPERATIONS: dict[str, str] = {
    "read": "get",
    "read_range": "range_get",
    "open_stream": "stream",
    "put_if_absent": "put_if_absent",
    "put": "put",
    "swap": "swap",
    "read_versioned": "get",
    "stat": "stat",
    "list": "list",
    "delete": "delete",
}
#: Every operation a fault can name: the Storage methods, each ``read`` of a stream
#: opened by ``open_stream`` (``stream_read``), named crash points, and ``*`` (any).
OPERATIONS = frozenset({*STORAGE_OPERATIONS, "stream_read", "crash_point", "*"})
_KINDS = ("error", "timeout_after_success", "crash")

T = TypeVar("T")


class SimulatedCrash(BaseException):
    """The simulated process died here. Not a ``KvlogError``: library code lets it through."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


@dataclass(frozen=True)
class Fault:
    """One rule of a :class:`FaultPlan`; build it with :func:`fail` or :func:`crash_at`.

    It fires on the ``nth`` call (1-based) that matches ``op`` and ``name_pattern``
    (a glob over the object name, or over the step of a crash point; ``None``
    matches all) and on the ``times - 1`` matching calls after it (``times=None``:
    every matching call from the ``nth`` on).
    """

    op: str
    name_pattern: str | None = None
    nth: int = 1
    times: int | None = 1
    kind: FaultKind = "error"
    when: When = "before"

    def __post_init__(self) -> None:
        if self.op not in OPERATIONS:
            raise ValueError(f"unknown operation {self.op!r}; choose from {sorted(OPERATIONS)}")
        if self.kind not in _KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; choose from {_KINDS}")
        if self.when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', not {self.when!r}")
        if self.kind != "crash" and self.when != "before":
            raise ValueError(
                "only crashes take when='after'; an error after the operation is "
                "kind='timeout_after_success'"
            )
        if self.nth < 1:
            raise ValueError("nth counts matching calls from 1")
        if self.times is not None and self.times < 1:
            raise ValueError("times must be >= 1 (or None for every call from the nth on)")

    def matches(self, op: str, name: str) -> bool:
        if self.op != "*" and self.op != op:
            return False
        return self.name_pattern is None or fnmatch.fnmatchcase(name, self.name_pattern)

    def fires_on(self, count: int) -> bool:
        """Whether the ``count``-th matching call fails."""
        if count < self.nth:
            return False
        return self.times is None or count < self.nth + self.times


def fail(
    op: str,
    name_pattern: str | None = None,
    nth: int = 1,
    times: int | None = 1,
    kind: FaultKind = "error",
    when: When = "before",
) -> Fault:
    """A fault on ``op`` (a Storage method name, ``stream_read``, ``crash_point`` or ``*``)."""
    return Fault(op, name_pattern, nth, times, kind, when)


def crash_at(step: str, *, nth: int = 1) -> Fault:
    """Crash at the ``nth`` time library code reaches ``crash_point(step)``."""
    return Fault("crash_point", glob.escape(step), nth, 1, "crash", "before")


class FaultPlan:
    """An ordered list of :class:`Fault` rules; the first rule that fires on a call wins."""

    def __init__(self, *faults: Fault) -> None:
        self.faults: list[Fault] = list(faults)

    def fail(
        self,
        op: str,
        name_pattern: str | None = None,
        *,
        nth: int = 1,
        times: int | None = 1,
        kind: FaultKind = "error",
        when: When = "before",
    ) -> FaultPlan:
        """Add a rule (see :func:`fail`) and return the plan, for chaining."""
        self.faults.append(fail(op, name_pattern, nth=nth, times=times, kind=kind, when=when))
        return self

    def crash_at(self, step: str, *, nth: int = 1) -> FaultPlan:
        """Add a crash at a named step (see :func:`crash_at`) and return the plan."""
        self.faults.append(crash_at(step, nth=nth))
        return self

    def __repr__(self) -> str:
        return f"FaultPlan({', '.join(map(repr, self.faults))})"


@dataclass(frozen=True)
class Event:
    """One call seen by a :class:`FaultyStorage`, in :attr:`FaultyStorage.history`.

    ``occurrence`` counts the calls with this same ``op`` and ``name`` so far
    (from 1); ``fault`` is the kind injected (``"crash_before"``/``"crash_after"``
    for crashes) or ``None``.
    """

    index: int
    op: str
    name: str
    occurrence: int
    fault: str | None = None

    def crash_plan(self, when: When = "before") -> FaultPlan:
        """A plan that crashes exactly at this call (``when`` is ignored for crash points)."""
        if self.op == "crash_point":
            return FaultPlan(crash_at(self.name, nth=self.occurrence))
        return FaultPlan(
            fail(self.op, glob.escape(self.name), nth=self.occurrence, kind="crash", when=when)
        )

    def error_plan(self, kind: FaultKind = "error") -> FaultPlan:
        """A plan that fails exactly this storage call with ``kind``."""
        if self.op == "crash_point":
            raise ValueError("crash points only crash; use crash_plan()")
        return FaultPlan(fail(self.op, glob.escape(self.name), nth=self.occurrence, kind=kind))


def _unit(seed: int, counter: int, salt: int) -> float:
    """A uniform number in [0, 1) from (seed, counter, salt); stable across Python versions."""
    digest = hashlib.blake2b(
        f"{seed}:{counter}:{salt}".encode(), digest_size=8, person=b"kvlog-faults"
    ).digest()
    return int.from_bytes(digest, "big") / 2**64


class _FaultyStream:
    """A stream whose reads can fail too (op ``stream_read``, name of the object)."""

    def __init__(self, storage: FaultyStorage, name: str, inner: ForwardStream) -> None:
        self._storage = storage
        self._name = name
        self._inner = inner

    @property
    def position(self) -> int:
        return self._inner.position

    def read(self, n: int) -> BytesLike:
        return self._storage._run("stream_read", self._name, lambda: self._inner.read(n))

    def skip_to(self, position: int) -> None:
        self._inner.skip_to(position)

    def close(self) -> None:
        self._inner.close()


class FaultyStorage(Storage):
    """Wraps ``inner`` and injects the faults of ``plan`` (and, given a ``seed``, random ones).

    Random mode: each storage call (not crash points, not stream reads) fails
    with probability ``error_rate``, with a kind drawn from ``random_kinds``;
    which calls fail depends only on ``seed`` and the call's number.

    ``requests`` counts the requests actually forwarded to ``inner``;
    :attr:`history` lists every call and crash point; :attr:`crash_points` the
    steps reached, in order.
    """

    _transient = (*Storage._transient, "_lock")

    def __init__(
        self,
        inner: Storage,
        plan: FaultPlan | Iterable[Fault] | None = None,
        *,
        seed: int | None = None,
        error_rate: float = 0.0,
        random_kinds: Sequence[FaultKind] = ("error", "timeout_after_success"),
        random_ops: Iterable[str] | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError("error_rate must lie in [0, 1]")
        if error_rate > 0 and seed is None:
            raise ValueError("random faults need a seed, so that runs can be replayed")
        if not random_kinds or any(k not in _KINDS for k in random_kinds):
            raise ValueError(f"random_kinds must be a non-empty selection of {_KINDS}")
        self.inner = inner
        self.uri = inner.uri
        self.seed = seed
        self.error_rate = error_rate
        self.random_kinds: tuple[FaultKind, ...] = tuple(random_kinds)
        self.random_ops = frozenset(random_ops if random_ops is not None else STORAGE_OPERATIONS)
        unknown = self.random_ops - set(STORAGE_OPERATIONS)
        if unknown:
            raise ValueError(f"random_ops {sorted(unknown)} are not storage operations")
        self._lock = threading.Lock()
        self.history: list[Event] = []
        self.crash_points: list[str] = []
        self.injected: list[Event] = []
        self._plan = FaultPlan()
        self._fault_counts: list[int] = []
        self._occurrences: dict[tuple[str, str], int] = {}
        self._random_calls = 0
        self.set_plan(plan)

    def _rebuild(self) -> None:
        super()._rebuild()
        self._lock = threading.Lock()

    # -- plan and bookkeeping ---------------------------------------------------------

    @property
    def plan(self) -> FaultPlan:
        return self._plan

    def set_plan(self, plan: FaultPlan | Iterable[Fault] | None) -> None:
        """Replace the plan; the rules count matching calls afresh from now on."""
        if plan is None:
            plan = FaultPlan()
        elif not isinstance(plan, FaultPlan):
            plan = FaultPlan(*plan)
        with self._lock:
            self._plan = plan
            self._fault_counts = [0] * len(plan.faults)

    def reset(self) -> None:
        """Forget the history, the request counts and the plan's counters."""
        with self._lock:
            self.history.clear()
            self.crash_points.clear()
            self.injected.clear()
            self._occurrences.clear()
            self._random_calls = 0
            self._fault_counts = [0] * len(self._plan.faults)
        with self._count_lock:
            self.requests.clear()

    def _decide(self, op: str, name: str) -> tuple[Event, Fault | None]:
        """Record the call and pick the fault to inject, if any (under the lock)."""
        with self._lock:
            key = (op, name)
            occurrence = self._occurrences.get(key, 0) + 1
            self._occurrences[key] = occurrence
            chosen: Fault | None = None
            for i, fault in enumerate(self._plan.faults):
                if fault.matches(op, name):
                    self._fault_counts[i] += 1
                    if chosen is None and fault.fires_on(self._fault_counts[i]):
                        chosen = fault
            if chosen is None and self.seed is not None and op in self.random_ops:
                self._random_calls += 1
                n = self._random_calls
                if _unit(self.seed, n, 0) < self.error_rate:
                    kind = self.random_kinds[int(_unit(self.seed, n, 1) * len(self.random_kinds))]
                    when: When = (
                        "after" if kind == "crash" and _unit(self.seed, n, 2) < 0.5 else "before"
                    )
                    chosen = Fault(op, None, 1, 1, kind, when)
            label = None
            if chosen is not None:
                label = f"crash_{chosen.when}" if chosen.kind == "crash" else chosen.kind
            event = Event(len(self.history), op, name, occurrence, label)
            self.history.append(event)
            if op == "crash_point":
                self.crash_points.append(name)
            if label is not None:
                self.injected.append(event)
            return event, chosen

    def _run(self, op: str, name: str, action: Callable[[], T]) -> T:
        event, fault = self._decide(op, name)
        if fault is None:
            return action()
        where = f"{op} {name!r} (call #{event.index})"
        if fault.kind == "error":
            raise StorageError(f"injected fault: {where} failed")
        if fault.kind == "crash" and fault.when == "before":
            raise SimulatedCrash(f"crash before {where}")
        result = action()
        if fault.kind == "crash":
            raise SimulatedCrash(f"crash after {where}")
        if isinstance(result, _FaultyStream):
            result.close()
        raise StorageError(f"injected fault: {where} timed out (it was performed)")

    def _forward(self, op: str, name: str, action: Callable[[], T]) -> T:
        def counted() -> T:
            self._count(STORAGE_OPERATIONS[op])
            return action()

        return self._run(op, name, counted)

    # -- crash points -------------------------------------------------------------------

    def crash_point(self, step: str) -> None:
        """Library code reached ``step``; raises :class:`SimulatedCrash` if the plan says so."""
        self._run("crash_point", step, lambda: self.inner.crash_point(step))

    # -- the Storage contract, forwarded ------------------------------------------------

    def read(self, name: str) -> bytes:
        return self._forward("read", name, lambda: self.inner.read(name))

    def watch_swaps(self, name: str) -> RenameWatch | None:
        return self.inner.watch_swaps(name)  # no request, so no fault: a missed wake is a look later

    def read_range(self, name: str, start: int, length: int) -> bytes:
        return self._forward("read_range", name, lambda: self.inner.read_range(name, start, length))

    def open_stream(self, name: str, start: int = 0) -> ForwardStream:
        return self._forward(
            "open_stream",
            name,
            lambda: _FaultyStream(self, name, self.inner.open_stream(name, start)),
        )

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        self._forward("put_if_absent", name, lambda: self.inner.put_if_absent(name, data))

    def put(self, name: str, data: BytesLike) -> None:
        self._forward("put", name, lambda: self.inner.put(name, data))

    def read_versioned(self, name: str, unless: str | None = None) -> tuple[bytes, str] | None:
        return self._forward("read_versioned", name, lambda: self.inner.read_versioned(name, unless))

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        return self._forward("swap", name, lambda: self.inner.swap(name, data, expected, copy_to))

    def put_file(self, name: str, path: Path) -> None:
        """Forwarded as a ``put`` (the same faults apply)."""
        self._forward("put", name, lambda: self.inner.put_file(name, path))

    def stat(self, name: str) -> ObjectInfo:
        return self._forward("stat", name, lambda: self.inner.stat(name))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self._forward("list", prefix, lambda: self.inner.list(prefix))

    def delete(self, name: str) -> None:
        self._forward("delete", name, lambda: self.inner.delete(name))

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"FaultyStorage({self.inner!r}, {self._plan!r}, seed={self.seed!r})"
