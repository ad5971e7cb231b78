"""Tombstone holds under torture (the ``held`` scenario).

While writers (threads and processes) put and delete, crash and reopen, and the maintainer
and the writers' background threads compact and collect garbage with no delete retention, a
:class:`HeldReader` reads the changelog slowly as a member of a group that holds tombstones:
a few records a poll (now and then a burst that catches up), committing after most polls,
sometimes crashing (its view goes back to the one of its last commit, and a new consumer
starts at the committed offsets). Near the end it catches up and reads no more while writes
and rounds go on. At the end, once nothing changes the store any more, it reads the rest: its
view, built from the changelog alone, must be exactly the store's keys and values. A delete
removed past a held offset would leave a key in the view that the store no longer has.

Restores of the root are left out: a restore takes commits away, the hold's included.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

import kvlog
from kvlog.errors import KvlogError

from .ops import DEFAULT_WEIGHTS, classify
from .scenarios import (
    MIXED_EPISODES,
    Action,
    Advance,
    Compact,
    Scenario,
    Spawn,
    WaitOps,
    _episode,
    _writers,
    scenario,
)
from .storage import FaultSpec, TortureStorage

if TYPE_CHECKING:
    from .runner import Run
    from .world import World

__all__ = ["HeldCrash", "HeldReader", "HeldStill", "StartHeld", "held"]


class HeldReader:
    """A slow member of a group that holds tombstones, with the view it builds from the changelog.

    Its handle has no storage faults (a commit whose outcome is unknown would leave the view it
    must go back to unknown too); every other handle of the run may have them.
    """

    def __init__(self, world: World, name: str, *, seed: int, max_records: int, pause_ms: int) -> None:
        self.world = world
        self.name = name
        self.group = f"held-{name}"
        self.rng = random.Random(seed)
        self.max_records = max_records
        self.pause_ms = pause_ms
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.store: kvlog.Store | None = None
        self.storage: TortureStorage | None = None
        self.consumer: kvlog.Consumer | None = None
        self.view: dict[bytes, bytes] = {}
        self.committed: dict[bytes, bytes] = {}
        self.crash_requested = threading.Event()
        #: Set: catch up, commit, then read nothing more until the final check (the end of a run
        #: with the group behind while rounds remove what it does not hold).
        self.still = threading.Event()
        self.reads = self.commits = self.crashes = self.deletes_seen = 0
        self.lock = threading.Lock()

    def start(self) -> None:
        self.store, self.storage = self.world.open(self.name, self.world.cache_dir(self.name), FaultSpec(),
                                                   background_compaction=False)
        self.world.cleanups.append(self._close)
        self.consumer = self.store.consumer(self.group, hold_tombstones=True)
        self.world.log(f"{self.name}: group {self.group} holds from {self._positions()}")
        self.thread = threading.Thread(target=self._main, name=f"torture-{self.name}", daemon=True)
        self.thread.start()

    def _positions(self) -> dict[int, int]:
        assert self.consumer is not None
        return {p: self.consumer.position(p) for p in self.consumer.partitions}

    def _apply(self, records: list[kvlog.Record]) -> None:
        for record in records:
            if record.value is None:
                self.view.pop(record.key, None)
                self.deletes_seen += 1
            else:
                self.view[record.key] = record.value

    def _restart(self) -> None:
        """A crash of the member: what it read since its last commit is lost; a new consumer
        starts at the group's committed offsets (the hold committed again, where it was)."""
        assert self.store is not None and self.consumer is not None
        self.consumer.close()
        self.view = dict(self.committed)
        self.consumer = self.store.consumer(self.group, hold_tombstones=True)
        self.crashes += 1
        self.world.log(f"{self.name}: crashed and restarted at {self._positions()}")

    def _main(self) -> None:
        try:
            while not self.stop.is_set():
                with self.lock:
                    assert self.consumer is not None
                    if self.crash_requested.is_set():
                        self.crash_requested.clear()
                        self._restart()
                    if self.still.is_set():
                        while records := self.consumer.poll(timeout_s=0, max_records=1000):
                            self._apply(records)
                            self.reads += len(records)
                        self.consumer.commit()
                        self.committed = dict(self.view)
                        self.world.log(f"{self.name}: caught up at {self._positions()}; reads no more")
                        break
                    # Mostly a few records; now and then a burst that catches up: a ghost key needs a
                    # put read early and its delete read late.
                    burst = self.rng.random() < 0.05
                    records = self.consumer.poll(timeout_s=0, max_records=1000 if burst else
                                                 self.rng.randint(1, self.max_records))
                    self._apply(records)
                    self.reads += len(records)
                    if self.rng.random() < 0.85:
                        self.consumer.commit()
                        self.committed = dict(self.view)
                        self.commits += 1
                time.sleep(self.rng.random() * self.pause_ms / 1000.0)
        except (KvlogError, AssertionError) as e:
            self.world.history.violation(f"{self.name}: died: {classify(e)}\n{traceback.format_exc()}")

    def finish(self) -> None:
        """Stop reading (the handle stays open for :meth:`final_check`)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(60)
            if self.thread.is_alive():
                self.world.history.violation(f"{self.name}: its thread did not stop")

    def final_check(self) -> None:
        """Read what is left; the view must be the store's keys and values."""
        world = self.world
        if self.store is None or self.consumer is None:
            return
        with self.lock:
            try:
                self.store.refresh()
                lag = sum(self.consumer.lag().values())
                while records := self.consumer.poll(timeout_s=0, max_records=1000):
                    self._apply(records)
                expected = dict(self.store.scan())
                groups = {info.name: info for info in self.store.consumer_groups()}
            except KvlogError as e:
                world.history.violation(f"{self.name}: the final read raised {classify(e)}")
                return
        world.log(f"{self.name}: {self.reads} records read, {self.commits} commits, {self.crashes} crashes, "
                  f"{self.deletes_seen} deletes seen, {lag} offsets behind at the end")
        info = groups.get(self.group)
        if info is None or not info.holding:
            world.history.violation(f"{self.name}: group {self.group} does not hold tombstones at the end: {info}")
        extra = sorted(k.decode("latin-1") for k in set(self.view) - set(expected))
        missing = sorted(k.decode("latin-1") for k in set(expected) - set(self.view))
        differ = sorted(k.decode("latin-1") for k in expected if k in self.view and self.view[k] != expected[k])
        if extra or missing or differ:
            world.history.violation(
                f"{self.name}: the view built from the changelog is not the store: keys the store does not "
                f"have {extra[:8]}, keys it lacks {missing[:8]}, other values for {differ[:8]}")

    def _close(self) -> None:
        if self.store is not None:
            try:
                self.store.close()
            except KvlogError as e:
                self.world.log(f"{self.name}: close raised {classify(e)}")
            self.store = None
        if self.storage is not None:
            self.storage.close()


class StartHeld(Action):
    """Start a :class:`HeldReader` (a hold that starts mid-run, at the start of the log)."""

    def __init__(self, name: str, seed: int, max_records: int, pause_ms: int) -> None:
        self.name = name
        self.seed = seed
        self.max_records = max_records
        self.pause_ms = pause_ms

    def run(self, run: Run) -> None:
        reader = HeldReader(run.world, self.name, seed=self.seed, max_records=self.max_records,
                            pause_ms=self.pause_ms)
        run.add(self.name, reader)
        reader.start()


class HeldStill(Action):
    """Every held reader catches up, commits, and reads no more until the final check."""

    def run(self, run: Run) -> None:
        for actor in run.actors.values():
            if isinstance(actor, HeldReader):
                actor.still.set()


class HeldCrash(Action):
    """Crash a held reader between two polls (it restarts from its last commit)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, run: Run) -> None:
        actor = run.actors.get(self.name)
        if isinstance(actor, HeldReader):
            actor.crash_requested.set()


#: Writer operations of the ``held`` scenario: more deletes than the default mix.
HELD_WEIGHTS = {**DEFAULT_WEIGHTS, "delete": 12, "delete_sync": 8}


@scenario("held", weight=1.0)
def held(rng: random.Random) -> Scenario:
    """Writers, faults, crashes, compaction and GC with a short delete retention, while one or
    two slow members of groups that hold tombstones read the changelog."""
    threads = rng.randint(1, 3)
    processes = rng.randint(0, 1)
    actions = _writers(rng, threads, processes, weights=HELD_WEIGHTS)
    readers = [f"h{i}" for i in range(rng.randint(1, 2))]
    actions.append(StartHeld(readers[0], rng.getrandbits(32), rng.choice([1, 3, 8]), rng.choice([5, 20, 60])))
    state: dict[str, Any] = {}
    if rng.random() < 0.5:
        actions.append(Spawn("reader", "r0", intensity=rng.choice([0.0, 0.5])))
        state["reader"] = True
    actions.append(WaitOps(rng.randint(20, 60)))
    thread_names = [f"t{i}" for i in range(threads)]
    process_names = [f"p{i}" for i in range(processes)]
    episodes = {**MIXED_EPISODES, "compact": 8.0, "advance_gc": 3.0, "held_crash": 2.0, "held_start": 1.0}
    for _ in range(rng.randint(8, 14)):
        kind = rng.choices(sorted(episodes), [episodes[n] for n in sorted(episodes)])[0]
        if kind == "held_crash":
            actions.append(HeldCrash(rng.choice(readers[:1] + [r for r in readers[1:] if state.get(r)])))
        elif kind == "held_start" and len(readers) > 1 and not state.get(readers[1]):
            state[readers[1]] = True
            actions.append(StartHeld(readers[1], rng.getrandbits(32), rng.choice([1, 3, 8]), rng.choice([5, 20, 60])))
        else:
            actions.extend(_episode(rng, {kind: 1.0}, thread_names, process_names, state))
        actions.append(WaitOps(rng.randint(10, 40)))
    # The end: the groups caught up (they read every put so far), then lag behind rounds that
    # remove every delete they do not hold.
    actions.append(HeldStill())
    for _ in range(rng.randint(2, 4)):
        actions.extend([WaitOps(rng.randint(20, 40)), Compact(force=True), Advance(1100), Compact(force=True)])
    # No delete retention: a tombstone goes by the round after the one that first keeps it,
    # unless a group holds it (the default mix of writer settings keeps most for a day).
    return Scenario("held", rng.choice([1, 2, 3]), actions, settings={"delete_retention_ms": 0})
