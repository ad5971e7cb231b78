"""Schedules: scenarios are lists of actions, drawn from a seed.

A scenario is a function ``(rng) -> Scenario``, registered with :func:`scenario`; it returns the
store's partition count, setting overrides and the list of :class:`Action` the runner performs in
order while the actors it spawned run concurrently. To add a scenario, write such a function (or
a new :class:`Action` subclass, with ``describe`` and ``run``) and register it::

    @scenario("my-case", weight=1.0)
    def my_case(rng: random.Random) -> Scenario:
        return Scenario("my-case", partitions=2, actions=[
            Spawn("thread", "t0"), WaitOps(50), Compact(force=True), Advance(1100), GC(), WaitOps(30),
        ])

Actions that aim at known failure modes:

* :class:`Storm` - several writers (threads and processes) open the store at the same instant
  with the same explicit ``producer_id`` and write at once (two must never share an epoch);
* :class:`SlowCompaction` - a compaction job's replace commit stalls past
  ``file_delete_delay_ms`` while another writer commits and runs ``gc()`` with the clock advanced;
* :class:`Snapshot` / :class:`Restore` - the root is copied, and later copied back while writers
  keep their caches (what they acknowledge afterwards must survive);
* :class:`Crash`, :class:`Reopen`, :class:`Advance` + :class:`GC` - crashes mid-operation,
  kill -9, clean reopens, GC at the moment the clock passes every delay.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvlog.errors import KvlogError
from kvlog.format.commit import decode_commit
from kvlog.log.head import HEAD_NAME
from kvlog.log.naming import DATA_PREFIX, commit_name, parse_log_name
from kvlog.storage.faulty import SimulatedCrash

from .actors import ProcessWriter, Reader, ThreadWriter
from .ops import DEFAULT_WEIGHTS, OpMix, classify
from .storage import FaultSpec, Hook

if TYPE_CHECKING:
    from .runner import Run
    from .world import World

__all__ = [
    "Action", "Scenario", "SCENARIOS", "scenario", "pick_scenario", "Spawn", "WaitOps", "Pause", "Compact",
    "GC", "Advance", "Crash", "Reopen", "Storm", "SlowAppend", "SlowCompaction", "Snapshot", "Restore", "ReaderReopen",
    "MaintainerWrites",
]


class Action:
    """One step of a schedule: ``describe()`` for the log, ``run(run)`` to do it."""

    def describe(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"

    def run(self, run: Run) -> None:
        raise NotImplementedError


@dataclass
class Scenario:
    """A schedule: partitions, setting overrides, and the actions in order."""

    name: str
    partitions: int
    actions: list[Action]
    settings: dict[str, Any] = field(default_factory=dict)
    #: Settings every handle gets, whatever its actor asks for.
    forced: dict[str, Any] = field(default_factory=dict)
    #: Called with the world before the store is created (e.g. to mount a small disk under it).
    prepare: Callable[[World], None] | None = None


ScenarioFn = Callable[[random.Random], Scenario]
#: Registered scenarios: name -> (builder, weight among the seeds).
SCENARIOS: dict[str, tuple[ScenarioFn, float]] = {}


def scenario(name: str, weight: float = 1.0) -> Callable[[ScenarioFn], ScenarioFn]:
    """Register a scenario builder under ``name``; ``weight`` is its share of seeds."""

    def register(fn: ScenarioFn) -> ScenarioFn:
        SCENARIOS[name] = (fn, weight)
        return fn

    return register


def pick_scenario(seed: int, name: str | None = None) -> Scenario:
    """The scenario of ``seed`` (drawn by weight, or the one named), built from the seed."""
    rng = random.Random(seed)
    if name is None:
        names = sorted(SCENARIOS)
        name = rng.choices(names, [SCENARIOS[n][1] for n in names])[0]
    return SCENARIOS[name][0](rng)


# -- actions -----------------------------------------------------------------------------------------

class Spawn(Action):
    """Start an actor: ``thread`` (a writer handle with lanes), ``process`` or ``reader``."""

    def __init__(self, kind: str, name: str, **params: Any) -> None:
        self.kind = kind
        self.name = name
        self.params = params

    def run(self, run: Run) -> None:
        params = dict(self.params)
        if "keys" in params or "weights" in params:
            mix = OpMix(keys=params.pop("keys", 12))
            if "weights" in params:
                mix.weights = dict(params.pop("weights"))
            params["mix"] = mix
        if self.kind == "thread":
            actor: Any = ThreadWriter(run.world, self.name, **params)
        elif self.kind == "process":
            actor = ProcessWriter(run.world, self.name, **params)
        elif self.kind == "reader":
            actor = Reader(run.world, self.name, **params)
        else:
            raise ValueError(f"unknown actor kind {self.kind!r}")
        run.add(self.name, actor)
        actor.start()


class Pause(Action):
    """Let the actors run for ``ms`` milliseconds."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def run(self, run: Run) -> None:
        time.sleep(self.ms / 1000.0)


class WaitOps(Action):
    """Let the writers run until they did ``ops`` more operations between them (or ``limit_s``)."""

    def __init__(self, ops: int, limit_s: float = 8.0) -> None:
        self.ops = ops
        self.limit_s = limit_s

    def run(self, run: Run) -> None:
        start = run.writer_ops()
        deadline = time.monotonic() + self.limit_s * run.slowness
        while run.writer_ops() - start < self.ops and time.monotonic() < deadline and run.writers_alive():
            time.sleep(0.01)


class MaintainerWrites(Action):
    """The maintainer writes ``count`` durable puts of its own keys (data for a compaction)."""

    def __init__(self, count: int, seed: int) -> None:
        self.count = count
        self.seed = seed

    def run(self, run: Run) -> None:
        rng = random.Random(self.seed)
        for _ in range(self.count):
            run.maintainer.write({"op": "put_sync", "key": rng.randrange(run.maintainer.mix.keys),
                                  "pad": rng.choice([0, 40, 700])})


class Compact(Action):
    """``store.compact(force=...)`` on the maintainer."""

    def __init__(self, force: bool = True) -> None:
        self.force = force

    def run(self, run: Run) -> None:
        run.maintainer.do("compact", force=self.force)


class GC(Action):
    """``store.gc()`` on the maintainer."""

    def run(self, run: Run) -> None:
        run.maintainer.do("gc")


class Advance(Action):
    """Move the shared clock ``ms`` ahead (GC delays, retention and intervals pass at once)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def run(self, run: Run) -> None:
        lead = run.world.clock.advance(self.ms)
        run.world.log(f"clock lead is now {lead} ms")


class Crash(Action):
    """Crash a writer: ``boundary`` (close without flushing between operations), ``storage`` (the
    next storage call matching ``op``/``pattern`` raises SimulatedCrash, ``when`` before or after
    it is performed), or ``kill`` (SIGKILL of a writer process)."""

    def __init__(self, name: str, how: str, op: str = "*", pattern: str | None = None, when: str = "before") -> None:
        self.name = name
        self.how = how
        self.op = op
        self.pattern = pattern
        self.when = when

    def run(self, run: Run) -> None:
        actor = run.actors.get(self.name)
        if isinstance(actor, ProcessWriter):
            actor.kill()
        elif isinstance(actor, ThreadWriter):
            if self.how == "storage":
                actor.crash_now(self.op, self.pattern, self.when)
            else:
                actor.request("crash")


class Reopen(Action):
    """A clean close and reopen of a writer thread's handle."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, run: Run) -> None:
        actor = run.actors.get(self.name)
        if isinstance(actor, ThreadWriter):
            actor.request("reopen")


class ReaderReopen(Action):
    """Reopen a reader, with its own cache or a brand-new one."""

    def __init__(self, name: str, fresh: bool) -> None:
        self.name = name
        self.fresh = fresh

    def run(self, run: Run) -> None:
        actor = run.actors.get(self.name)
        if isinstance(actor, Reader):
            actor.finish()
            reader = Reader(run.world, self.name)
            if self.fresh:
                reader.cache = run.world.fresh_cache(self.name)
            run.actors[self.name] = reader
            reader.start()


STORM_MIX = {"put_sync": 6, "batch": 2, "put": 2, "flush": 2, "delete_sync": 1, "get": 1}


class Storm(Action):
    """``threads`` + ``processes`` writers open the store at one instant with the same
    ``producer_id``, each writing ``ops`` operations of its own keys, and close.

    Exactly one of them may hold the producer's newest epoch; the others must be fenced (their
    writes raise), never acknowledged and then dropped as duplicates of another's batches.
    """

    def __init__(self, tag: str, producer_id: int, threads: int, processes: int, ops: int,
                 slow_commit_ms: int = 0) -> None:
        self.tag = tag
        self.producer_id = producer_id
        self.threads = threads
        self.processes = processes
        self.ops = ops
        self.slow_commit_ms = slow_commit_ms

    def run(self, run: Run) -> None:
        world = run.world
        go_file = world.workdir / f"storm-{self.tag}.go"
        go = threading.Event()
        mix = OpMix(weights=dict(STORM_MIX), keys=4, max_pad=60, big_pad=60, max_batch=3)
        procs = [ProcessWriter(world, f"s{self.tag}p{i}", producer_id=self.producer_id, mix=mix, intensity=0.0,
                               background_compaction=False, respawn=False, max_ops=self.ops, go_file=go_file,
                               allowed_ops=frozenset(STORM_MIX), slow_commit_ms=self.slow_commit_ms)
                 for i in range(self.processes)]
        threads = [ThreadWriter(world, f"s{self.tag}t{i}", producer_id=self.producer_id, mix=mix, intensity=0.0,
                                background_compaction=False, max_ops=self.ops, go=go, recover=False,
                                allowed_ops=frozenset(STORM_MIX), slow_commit_ms=self.slow_commit_ms)
                   for i in range(self.threads)]
        for p in procs:
            run.add(p.name, p)
            p.start()
        for t in threads:
            run.add(t.name, t)
            t.start()
        deadline = time.monotonic() + 60 * run.slowness
        for p in procs:
            p.ready.wait(max(0.0, deadline - time.monotonic()))
        go_file.touch()
        go.set()
        world.log(f"storm {self.tag}: go")
        for p in procs:
            assert p.proc is not None
            try:
                p.proc.wait(max(1.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - finish() reports and kills
                pass
            p.finish()
        for t in threads:
            while not t.finished and time.monotonic() < deadline:
                time.sleep(0.01)
            t.finish()


class _Stall(Action):
    """An action, drawn from its own ``seed``, that stalls a commit past ``file_delete_delay_ms``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def _start(self, run: Run) -> tuple[World, random.Random, int]:
        """The world, this action's random numbers, and the delay to stall past."""
        return run.world, random.Random(self.seed), int(run.world.settings["file_delete_delay_ms"])


class SlowCompaction(_Stall):
    """A compaction job whose replace commit stalls past ``file_delete_delay_ms``.

    A fresh handle compacts (``force=True``); just before its replace commit reaches storage, a
    hook moves the shared clock past the delay, waits the delay out in real time (storage times
    are real), and has the maintainer commit a write and run ``gc()``. The job's output is then
    older than the delay and not live yet: GC must not make the commit that follows lose it.
    """

    def run(self, run: Run) -> None:
        world, rng, delay = self._start(run)
        name = f"c{rng.randrange(10**6)}"
        try:
            store, storage = world.open(name, world.fresh_cache(name), FaultSpec(), background_compaction=False)
        except (KvlogError, SimulatedCrash) as e:
            world.log(f"{name}: open raised {classify(e)}; no slow compaction")
            return
        fired = []

        def outputs() -> list[str]:
            return sorted({e.name for e in storage.history if e.op == "put" and e.name.startswith("data/")})

        def stall(op: str, obj: str) -> None:
            fired.append(obj)
            world.log(f"{name}: stalling {op} {obj}: clock +{delay + 1} ms, sleep {delay + 150} ms, "
                      f"then the maintainer commits and collects garbage (job outputs {outputs()})")
            world.clock.advance(delay + 1)
            time.sleep((delay + 150) / 1000.0)
            run.maintainer.write({"op": "put_sync", "key": rng.randrange(run.maintainer.mix.keys), "pad": 10})
            run.maintainer.do("gc")
            raw = world.backend.raw()
            world.log(f"{name}: after gc, job outputs still in storage: {[p for p in outputs() if raw.exists(p)]}")
            raw.close()

        storage.add_hook(Hook("swap", HEAD_NAME, stall, times=1))
        try:
            report = store.compact(force=True)
            world.log(f"{name}: compact -> kind={report.kind} refused={report.refused} version={report.version} "
                      f"files {report.files_in}->{report.files_out} (stalled: {bool(fired)})")
        except (KvlogError, SimulatedCrash) as e:
            world.log(f"{name}: compact raised {classify(e)}")
        finally:
            storage.quiet()
            try:
                store.close()
            except KvlogError as e:
                world.log(f"{name}: close raised {classify(e)}")


class SlowAppend(_Stall):
    """The maintainer's durable write whose commit stalls past ``file_delete_delay_ms``.

    Only where a flush writes a data file before its commit (``commit_inline_bytes`` below
    the write): just before the maintainer's swap of the head, a hook moves the shared clock
    past the delay, waits it out in real time, and has a fresh handle commit (a producer's
    registration) and run ``gc()``, which condemns the waiting data file as an orphan. The
    stalled swap is then refused; the write must be written again and acknowledged once, or
    fail, never lost after an acknowledgement.
    """

    def run(self, run: Run) -> None:
        world, rng, delay = self._start(run)
        pad = 2048
        maintainer = run.maintainer
        if int(world.settings["commit_inline_bytes"]) >= pad or maintainer.storage is None:
            world.log("slow append: flushes travel inside their commit here; none")
            return
        name = f"a{rng.randrange(10**6)}"

        def stall(op: str, obj: str) -> None:
            world.log(f"{name}: stalling the maintainer's {op} {obj}: clock +{delay + 1} ms, sleep "
                      f"{delay + 150} ms, then {name} commits and collects garbage")
            world.clock.advance(delay + 1)
            time.sleep((delay + 150) / 1000.0)
            try:
                store, storage = world.open(name, world.fresh_cache(name), FaultSpec(), background_compaction=False)
            except (KvlogError, SimulatedCrash) as e:
                world.log(f"{name}: open raised {classify(e)}")
                return
            try:
                store.log.register_producer(rng.randrange(10**6, 2 * 10**6), 0)
                world.log(f"{name}: gc -> {store.gc()}")
            except (KvlogError, SimulatedCrash) as e:
                world.log(f"{name}: commit or gc raised {classify(e)}")
            finally:
                storage.quiet()
                store.close()

        maintainer.storage.add_hook(Hook("swap", HEAD_NAME, stall, times=1))
        outcome = maintainer.write({"op": "put_sync", "key": rng.randrange(maintainer.mix.keys), "pad": pad})
        world.log(f"{name}: the maintainer's stalled write -> {outcome}")


class Snapshot(Action):
    """Copy every object of the root (between storage calls of the in-process handles)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def run(self, run: Run) -> None:
        raw = run.world.backend.raw()
        with run.world.gate.exclusive():
            taken = time.monotonic_ns()
            objects = {}
            for info in raw.list(""):
                objects[info.name] = raw.read(info.name)
        raw.close()
        run.snapshots[self.tag] = (taken, objects)
        run.world.log(f"snapshot {self.tag}: {len(objects)} objects")


class Restore(Action):
    """Put the root back as snapshot ``tag`` left it, while the writers keep their caches.

    ``quiesce``: first park every reader and writer thread between operations and flush the
    writers (they stay open with their caches, idle, as after a pause); otherwise the restore
    lands between any two storage calls, possibly inside a commit or an open.
    """

    def __init__(self, tag: str, quiesce: bool = True, head_only: bool = False, keep_head: bool = False) -> None:
        self.tag = tag
        self.quiesce = quiesce
        #: Put back everything but the head, which keeps its newer version: the commits after the
        #: copy leave a hole below the head. Before anyone resumes, the operator opens the store
        #: (with ``on_storage_behind="rebuild"``), which must refuse, naming the hole, and change
        #: nothing; then puts the copy's head back as the refusal says and rebuilds. The restore
        #: is over once that rebuild is.
        self.keep_head = keep_head and quiesce
        #: Put back the head (``log/head.json``) alone, leaving every newer commit, checkpoint and
        #: data file where it is: the store is then the head's older version, as after a whole
        #: restore, and the newer commits beyond the head are never read again. Only while the
        #: history below the old head is whole: once GC collected the commits and checkpoints it
        #: needs, no copy holds that history, and the whole root is put back instead.
        self.head_only = head_only

    def run(self, run: Run) -> None:
        if self.tag not in run.snapshots:
            return
        writers = [a for a in run.actors.values() if isinstance(a, ThreadWriter) and not a.finished]
        readers = [a for a in run.actors.values() if isinstance(a, Reader)]
        try:
            if self.quiesce:
                for reader in readers:
                    reader.pause()
                for writer in writers:
                    if not writer.quiesce():
                        run.world.log(f"restore {self.tag}: {writer.name} did not settle")
            self._restore(run)
        finally:
            for writer in writers:
                writer.resume()
            for reader in readers:
                reader.resume()

    def _restore(self, run: Run) -> None:
        # Data files newer than the copy stay, as the operations guide says: a compaction or a
        # flush still running may commit one it wrote before the restore (a cache at the copy's
        # head sees nothing behind it), and garbage collection condemns the others.
        taken, objects = run.snapshots[self.tag]
        raw = run.world.backend.raw()
        with run.world.gate.exclusive():
            removed = 0
            if self.head_only and not _history_whole(raw, objects.get(HEAD_NAME)):
                run.world.log(f"restore {self.tag}: GC collected the history below the old head: "
                              "the whole root is put back instead")
                self.head_only = False
            if self.keep_head:
                objects = {name: data for name, data in objects.items() if name != HEAD_NAME}
                for info in raw.list(""):
                    if info.name not in objects and info.name != HEAD_NAME and not info.name.startswith(DATA_PREFIX):
                        raw.delete(info.name)
                        removed += 1
                for name, data in objects.items():
                    raw.put(name, data)
            elif self.head_only:
                if HEAD_NAME in objects:
                    raw.put(HEAD_NAME, objects[HEAD_NAME])
                else:
                    raw.delete(HEAD_NAME)
                objects = {HEAD_NAME: b""}
            else:
                for info in raw.list(""):
                    if info.name not in objects and not info.name.startswith(DATA_PREFIX):
                        raw.delete(info.name)
                        removed += 1
                for name, data in objects.items():
                    raw.put(name, data)
            run.world.restored_file.touch()
            run.world.restore_count += 1
            run.world.gate.restores += 1
            run.world.restored_copy = dict(run.snapshots[self.tag][1])
        raw.close()
        what = "the head alone" if self.head_only else f"{removed} newer objects removed, {len(objects)}"
        run.world.log(f"restore {self.tag}: {what} put back{' (the head kept)' if self.keep_head else ''}")
        if self.keep_head:
            self._rebuild(run, run.snapshots[self.tag][1].get(HEAD_NAME))
        run.world.history.restores.append((taken, time.monotonic_ns()))

    def _rebuild(self, run: Run, head: bytes | None) -> None:
        """The operator after a restore without the head (see ``keep_head``): an open refused,
        the copy's head put back, a rebuild."""
        world = run.world
        raw = world.backend.raw()
        hole = _history_whole(raw, raw.read(HEAD_NAME) if raw.exists(HEAD_NAME) else None) is False
        for attempt in ("refused", "rebuilt"):
            if attempt == "rebuilt":
                if head is None:
                    raw.delete(HEAD_NAME)
                else:
                    raw.put(HEAD_NAME, head)
            try:
                store, storage = world.open(f"operator-{attempt}", world.fresh_cache("operator"), FaultSpec(),
                                            on_storage_behind="rebuild", background_compaction=False)
            except (KvlogError, SimulatedCrash) as e:
                if attempt == "rebuilt" or not (hole and type(e).__name__ == "StorageBehindError"):
                    world.history.violation(f"restore {self.tag}: the operator's open ({attempt}) raised {classify(e)}")
                world.log(f"restore {self.tag}: the operator's open raised {classify(e)}")
                continue
            try:
                if attempt == "refused" and hole:
                    world.history.violation(f"restore {self.tag}: a root with a hole below its head opened "
                                            f"at version {store.log.version}")
                world.log(f"restore {self.tag}: the operator's open ({attempt}) at version {store.log.version}")
            finally:
                store.close()
                storage.close()
        raw.close()


def _history_whole(raw: Any, head: bytes | None) -> bool:
    """Whether ``raw`` still holds the history the head ``head`` (bytes, None: no head) ends: a
    checkpoint at or below it whose commit is there (or none needed), and every commit after it."""
    if head is None:
        return True
    top = decode_commit(HEAD_NAME, head).version
    names = {info.name for info in raw.list("log/")}
    floor = max((p[0] for p in map(parse_log_name, names)
                 if p is not None and p[1] == "checkpoint" and p[0] <= top and commit_name(p[0]) in names),
                default=0)
    return all(commit_name(v) in names for v in range(max(floor, 1), top + 1))


# -- scenarios ---------------------------------------------------------------------------------------

def _writers(rng: random.Random, threads: int, processes: int, *, keys: int = 10,
             weights: dict[str, float] | None = None) -> list[Action]:
    out: list[Action] = []
    for i in range(threads):
        extra: dict[str, Any] = {} if weights is None else {"weights": weights}
        out.append(Spawn("thread", f"t{i}", lanes=rng.choice([1, 1, 2]),
                         producer_id=rng.choice([None, None, 1000 + i]), intensity=rng.choice([0.0, 0.5, 1.0]),
                         background_compaction=rng.random() < 0.5, keys=keys, **extra))
    for i in range(processes):
        out.append(Spawn("process", f"p{i}", producer_id=rng.choice([None, 2000 + i]),
                         intensity=rng.choice([0.0, 0.5, 1.0]), background_compaction=rng.random() < 0.5, keys=keys))
    return out


def _episode(rng: random.Random, kinds: dict[str, float], threads: list[str], processes: list[str],
             state: dict[str, Any]) -> list[Action]:
    names = sorted(kinds)
    kind = rng.choices(names, [kinds[n] for n in names])[0]
    if kind == "compact":
        return [Compact(force=rng.random() < 0.7)]
    if kind == "gc":
        return [GC()]
    if kind == "advance_gc":
        return [Advance(rng.choice([1100, 2500, 8000])), GC()]
    if kind == "advance":
        return [Advance(rng.choice([300, 1100, 6000]))]
    if kind == "crash" and threads:
        how = rng.choice(["boundary", "storage", "storage"])
        op, pattern = rng.choice([("swap", "log/head.json"), ("put", "data/*"), ("read", "log/*"),
                                  ("*", None), ("delete", None), ("list", None)])
        return [Crash(rng.choice(threads), how, op, pattern, rng.choice(["before", "after"]))]
    if kind == "kill" and processes:
        return [Crash(rng.choice(processes), "kill")]
    if kind == "reopen" and threads:
        return [Reopen(rng.choice(threads))]
    if kind == "storm":
        state["storms"] = state.get("storms", 0) + 1
        return [Storm(str(state["storms"]), 777, rng.randint(0, 1), rng.randint(2, 3), rng.randint(3, 8),
                      rng.choice([0, 20, 50]))]
    if kind == "slow_compaction":
        return [MaintainerWrites(3, rng.getrandbits(32)), SlowCompaction(rng.getrandbits(32))]
    if kind == "snapshot":
        state["snaps"] = state.get("snaps", 0) + 1
        tag = str(state["snaps"])
        state.setdefault("pending_restores", []).append(tag)
        return [Snapshot(tag)]
    if kind == "restore" and state.get("pending_restores"):
        return [Restore(state["pending_restores"].pop(0))]
    if kind == "reader_reopen" and state.get("reader"):
        return [ReaderReopen("r0", fresh=rng.random() < 0.5)]
    return [WaitOps(rng.randint(10, 40))]


MIXED_EPISODES = {
    "compact": 3, "gc": 2, "advance_gc": 2, "advance": 1, "crash": 3, "kill": 2, "reopen": 1.5, "storm": 1,
    "slow_compaction": 0.7, "reader_reopen": 1, "run": 3,
}


@scenario("mixed", weight=4.0)
def mixed(rng: random.Random) -> Scenario:
    """Everything at once: writer threads and processes, a reader, faults, crashes, compaction, GC."""
    threads = rng.randint(1, 3)
    processes = rng.randint(0, 2)
    actions = _writers(rng, threads, processes)
    state: dict[str, Any] = {}
    if rng.random() < 0.8:
        actions.append(Spawn("reader", "r0", intensity=rng.choice([0.0, 0.5])))
        state["reader"] = True
    actions.append(WaitOps(rng.randint(20, 60)))
    thread_names = [f"t{i}" for i in range(threads)]
    process_names = [f"p{i}" for i in range(processes)]
    episodes = dict(MIXED_EPISODES)
    if not processes:
        # A restore puts back what in-process handles see between their storage calls; writer
        # processes are outside that gate, so only runs without them restore.
        episodes.update(snapshot=0.7, restore=0.7)
    for _ in range(rng.randint(4, 8)):
        actions.extend(_episode(rng, episodes, thread_names, process_names, state))
        actions.append(WaitOps(rng.randint(10, 40)))
    return Scenario("mixed", rng.choice([1, 2, 3, 4, 8]), actions)


@scenario("storm", weight=1.5)
def storm(rng: random.Random) -> Scenario:
    """Rounds of same-producer-id openers at one instant, beside a writer, compaction and GC."""
    actions = _writers(rng, 1, 0)
    actions.append(WaitOps(20))
    for round_ in range(rng.randint(2, 3)):
        actions.append(Storm(str(round_ + 1), 4242, rng.randint(0, 1), rng.randint(2, 4), rng.randint(3, 8),
                             rng.choice([0, 20, 50, 50])))
        if rng.random() < 0.5:
            actions.append(Compact(force=True))
        actions.append(WaitOps(10))
    return Scenario("storm", rng.choice([1, 1, 2]), actions)


@scenario("slow-compaction", weight=1.0)
def slow_compaction(rng: random.Random) -> Scenario:
    """Compaction jobs (or a durable write) whose commit stalls while another writer commits
    and collects garbage."""
    weights = {k: v for k, v in DEFAULT_WEIGHTS.items() if k != "compact"}
    actions = _writers(rng, rng.randint(1, 2), 0, weights=weights)
    actions.append(WaitOps(30))
    for _ in range(rng.randint(1, 2)):
        actions.extend([MaintainerWrites(4, rng.getrandbits(32)),
                        SlowAppend(rng.getrandbits(32)) if rng.random() < 0.4 else SlowCompaction(rng.getrandbits(32)),
                        WaitOps(rng.randint(10, 30))])
        if rng.random() < 0.5:
            actions.extend([Advance(1100), GC()])
    return Scenario("slow-compaction", rng.choice([1, 2, 4]), actions, forced={"background_compaction": False})


@scenario("restore", weight=1.0)
def restore(rng: random.Random) -> Scenario:
    """The root is restored from an older copy (or its head alone is, or all of it but the head,
    followed by the operator's rebuild) while writer threads keep their caches and write on."""
    threads = rng.randint(1, 2)
    actions = _writers(rng, threads, 0)
    if rng.random() < 0.6:
        actions.append(Spawn("reader", "r0", intensity=0.0))
    actions.append(WaitOps(rng.randint(20, 50)))
    for round_ in range(rng.randint(1, 2)):
        tag = f"r{round_}"
        actions.append(Snapshot(tag))
        actions.append(WaitOps(rng.randint(30, 80)))
        compacted = rng.random() < 0.5
        if compacted:
            actions.append(Compact(force=True))
        way = rng.random()
        actions.append(Restore(tag, head_only=not compacted and way < 0.4, keep_head=0.4 <= way < 0.7))
        actions.append(WaitOps(rng.randint(30, 80)))
        if rng.random() < 0.5:
            actions.append(Reopen(f"t{rng.randrange(threads)}"))
            actions.append(WaitOps(20))
    return Scenario("restore", rng.choice([1, 2, 4]), actions, forced={"background_compaction": False})


@scenario("restore-under-load", weight=0.5)
def restore_under_load(rng: random.Random) -> Scenario:
    """As ``restore``, but the root is put back while writers and compactors are mid-flow."""
    threads = rng.randint(1, 2)
    actions = _writers(rng, threads, 0)
    actions.append(WaitOps(rng.randint(20, 50)))
    for round_ in range(rng.randint(1, 2)):
        tag = f"r{round_}"
        actions += [Snapshot(tag), WaitOps(rng.randint(30, 80)), Restore(tag, quiesce=False),
                    WaitOps(rng.randint(30, 80))]
    return Scenario("restore-under-load", rng.choice([1, 2, 4]), actions)
