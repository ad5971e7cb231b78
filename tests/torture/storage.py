"""The harness's view of time and storage: a shared simulated clock, a gate, and a faulty storage.

* :class:`SimClock` follows the real clock plus a lead that only grows: advancing it makes every
  in-process handle believe that time passed (retention, GC delays, flush intervals) at a moment
  the schedule chooses, while storage modification times stay real, as GC compares them.
* :class:`StorageGate` lets a snapshot or a restore of the root happen between storage calls of
  the in-process handles, never in the middle of one (so the copy is consistent).
* :class:`TortureStorage` is :class:`~kvlog.storage.faulty.FaultyStorage` (seeded errors,
  lost responses, planned crashes) plus seeded slow calls, hooks that run before a matching call
  (to stall one flow while others go on), and death: after a simulated crash every later call of
  that handle raises :class:`SimulatedCrash` too, as the process it stands for is gone.
"""

from __future__ import annotations

import fnmatch
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvlog.log.head import HEAD_NAME
from kvlog.storage import Storage
from kvlog.storage.faulty import FaultPlan, FaultyStorage, SimulatedCrash, fail

__all__ = ["SimClock", "StorageGate", "FaultSpec", "Hook", "TortureStorage", "SimulatedCrash", "unit"]

T = TypeVar("T")


def unit(seed: int, counter: int, salt: str) -> float:
    """A uniform number in [0, 1) from (seed, counter, salt), stable across runs and versions."""
    digest = hashlib.blake2b(f"{seed}:{counter}:{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class SimClock:
    """The real clock plus a lead the schedule can grow (a ``kvlog.Clock``).

    Storage modification times are real, so a clock that stood still (a plain ``ManualClock``)
    would fall behind them and GC would never see a file as old; this one never lags the real
    clock and jumps ahead when told to.
    """

    def __init__(self) -> None:
        self._lead_ms = 0
        self._lock = threading.Lock()

    @property
    def lead_ms(self) -> int:
        """How far ahead of the real clock this clock is."""
        with self._lock:
            return self._lead_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.lead_ms

    def now_ns(self) -> int:
        return time.time_ns() + self.lead_ms * 1_000_000

    def monotonic_s(self) -> float:
        return time.monotonic() + self.lead_ms / 1000.0

    def advance(self, ms: int) -> int:
        """Jump ``ms`` ahead; returns the new lead."""
        if ms < 0:
            raise ValueError("a clock never goes back")
        with self._lock:
            self._lead_ms += ms
            return self._lead_ms

    def __repr__(self) -> str:
        return f"SimClock(lead_ms={self.lead_ms})"


class StorageGate:
    """A shared/exclusive gate: storage calls pass shared, a snapshot or restore holds it alone.

    Shared entries never wait for a waiting exclusive one (only for one that holds the gate),
    so a storage call made from inside another (a hook) cannot deadlock.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        #: How many restores of the root have happened (counted by whoever holds the gate alone).
        self.restores = 0
        #: Objects a thread deleted after a restore it had not read the head since: deletions
        #: decided from the history before the restore (see :meth:`TortureStorage._run`).
        self.race_deleted: set[str] = set()

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._exclusive = True
            while self._shared:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


@dataclass
class FaultSpec:
    """The faults of one handle's storage, drawn from the run's seed (JSON-able, for processes).

    ``error_rate``: share of storage calls that fail (``error``) or lose their response
    (``timeout_after_success``); ``slow_rate``/``slow_max_ms``: share of calls delayed and by how
    much at most; ``slow_commit_ms``: the first ``slow_commits`` swaps of the head (the
    handle's first commits: its producer registration when it opens) take this long;
    ``crashes``: planned crashes, each ``[op, pattern, nth, when]``.
    """

    seed: int = 0
    error_rate: float = 0.0
    kinds: tuple[str, ...] = ("error", "timeout_after_success")
    slow_rate: float = 0.0
    slow_max_ms: int = 0
    crashes: list[list[Any]] = field(default_factory=list)
    slow_commit_ms: int = 0
    slow_commits: int = 2

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "error_rate": self.error_rate, "kinds": list(self.kinds),
                "slow_rate": self.slow_rate, "slow_max_ms": self.slow_max_ms, "crashes": self.crashes,
                "slow_commit_ms": self.slow_commit_ms, "slow_commits": self.slow_commits}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> FaultSpec:
        return cls(int(obj["seed"]), float(obj["error_rate"]), tuple(obj["kinds"]), float(obj["slow_rate"]),
                   int(obj["slow_max_ms"]), [list(c) for c in obj["crashes"]], int(obj.get("slow_commit_ms", 0)),
                   int(obj.get("slow_commits", 2)))

    def describe(self) -> str:
        parts = []
        if self.slow_commit_ms:
            parts.append(f"first {self.slow_commits} commits take {self.slow_commit_ms} ms")
        if self.error_rate:
            parts.append(f"errors {self.error_rate:.3f} {'/'.join(self.kinds)}")
        if self.slow_rate:
            parts.append(f"slow {self.slow_rate:.2f} <= {self.slow_max_ms} ms")
        for op, pattern, nth, when in self.crashes:
            parts.append(f"crash {when} {op} {pattern or '*'} #{nth}")
        return ", ".join(parts) or "none"


@dataclass
class Hook:
    """Runs ``action(op, name)`` before the ``times`` next calls matching ``op`` and ``pattern``."""

    op: str
    pattern: str | None
    action: Callable[[str, str], None]
    times: int = 1
    exclude: str | None = None

    def matches(self, op: str, name: str) -> bool:
        if self.op != "*" and op != self.op:
            return False
        if self.exclude is not None and fnmatch.fnmatchcase(name, self.exclude):
            return False
        return self.pattern is None or fnmatch.fnmatchcase(name, self.pattern)


class TortureStorage(FaultyStorage):
    """A :class:`FaultyStorage` with seeded slow calls, hooks, a gate, and death after a crash."""

    _transient = (*FaultyStorage._transient, "_hook_lock")

    def __init__(self, inner: Storage, spec: FaultSpec, *, label: str = "",
                 gate: StorageGate | None = None) -> None:
        plan = FaultPlan(*(fail(op, pattern, nth=int(nth), kind="crash", when=when)
                           for op, pattern, nth, when in spec.crashes))
        super().__init__(inner, plan, seed=spec.seed if spec.error_rate else None,
                         error_rate=spec.error_rate, random_kinds=spec.kinds)  # type: ignore[arg-type]
        self.spec = spec
        self.label = label
        self.gate = gate
        self.dead = False
        self.death: str | None = None
        self.hooks: list[Hook] = []
        self._hook_lock = threading.Lock()
        #: Per thread, the restore count at its last read or swap of the head.
        self._head_seen: dict[int, int] = {}
        self._slow_calls = 0
        self._slow_commits_done = 0
        #: While True, calls go straight through (no faults, slowness or hooks; still gated).
        self.suspended = False

    def _rebuild(self) -> None:
        super()._rebuild()
        self._hook_lock = threading.Lock()

    def _watched(self, op: str, name: str, action: Callable[[], T], gate: StorageGate) -> T:
        """Run the call, noting a thread's reads of the head and its deletions after a restore
        it has not read the head since: nothing makes a delete conditional on the head, so
        garbage collection that decided before a restore may delete objects of the copy (it
        says so when it reads the head again, and the operator puts them back)."""
        thread = threading.get_ident()
        if op == "delete" and self._head_seen.get(thread, gate.restores) < gate.restores:
            gate.race_deleted.add(name)
        result = super()._run(op, name, action)
        if name == HEAD_NAME and op in ("read", "read_versioned", "swap"):
            self._head_seen[thread] = gate.restores
        return result

    # -- control --------------------------------------------------------------------------------
    def add_hook(self, hook: Hook) -> None:
        with self._hook_lock:
            self.hooks.append(hook)

    def arm_crash(self, op: str = "*", pattern: str | None = None, when: str = "before") -> None:
        """Crash at the next call matching ``op`` and ``pattern`` (from whichever thread makes it)."""
        self.set_plan(FaultPlan(fail(op, pattern, nth=1, kind="crash", when=when)))  # type: ignore[arg-type]

    def quiet(self) -> None:
        """No more faults, slow calls or hooks (the final checks read through a quiet storage)."""
        self.error_rate = 0.0
        self.spec = FaultSpec()
        self.set_plan(None)
        with self._hook_lock:
            self.hooks.clear()

    # -- the call path --------------------------------------------------------------------------
    def _slow(self, op: str, name: str) -> None:
        spec = self.spec
        if spec.slow_commit_ms and op == "swap":
            with self._hook_lock:
                self._slow_commits_done += 1
                slow = self._slow_commits_done <= spec.slow_commits
            if slow:
                time.sleep(spec.slow_commit_ms / 1000.0)
        if not spec.slow_rate or op == "crash_point":
            return
        with self._hook_lock:
            self._slow_calls += 1
            n = self._slow_calls
        if unit(spec.seed, n, "slow") < spec.slow_rate:
            time.sleep(unit(spec.seed, n, "slow-ms") * spec.slow_max_ms / 1000.0)

    def _run(self, op: str, name: str, action: Callable[[], T]) -> T:
        if self.dead:
            raise SimulatedCrash(f"{self.label}: the process is gone ({self.death}); {op} {name!r}")
        if self.suspended:
            if self.gate is None:
                return action()
            with self.gate.shared():
                return action()
        fire = []
        with self._hook_lock:
            for hook in self.hooks:
                if hook.times > 0 and hook.matches(op, name):
                    hook.times -= 1
                    fire.append(hook)
            self.hooks = [h for h in self.hooks if h.times > 0]
        for hook in fire:
            hook.action(op, name)
        self._slow(op, name)
        try:
            if self.gate is None:
                return super()._run(op, name, action)
            with self.gate.shared():
                return self._watched(op, name, action, self.gate)
        except SimulatedCrash as e:
            if not self.dead:
                self.dead = True
                self.death = str(e)
            raise
