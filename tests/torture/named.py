"""Named checkpoints and consumer-group commits under torture (the ``checkpoints`` scenario).

While writers, readers, compaction, GC and crashes go on:

* :class:`MakeCheckpoint` - the maintainer pins a named checkpoint, then opens it read-only (a
  fresh cache) and records exactly what it reads: every item, each partition's offsets, every
  changelog record. The values read must be values some writer wrote (the history checks that).
* :class:`VerifyCheckpoints` - every recorded checkpoint is opened again (a fresh cache, or the
  one already loaded) and must read exactly what was recorded, however much compaction and GC
  happened since. Only a checkpoint created after a backup the root was restored from may be
  gone (:class:`~kvlog.errors.CheckpointNotFoundError`).
* :class:`DeleteCheckpoint` - the oldest one is deleted; opening it must then fail.
* :class:`GroupCommit` - the maintainer's consumer of group ``torture`` polls some records and
  commits its positions; a fresh read-only handle must see exactly the last committed positions
  (either of two when a commit's outcome was unknown), unless the root was restored since.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import kvlog
from kvlog.errors import CheckpointNotFoundError, KvlogError
from kvlog.storage.faulty import SimulatedCrash

from .ops import classify
from .scenarios import (
    GC,
    MIXED_EPISODES,
    Action,
    Advance,
    Scenario,
    Spawn,
    WaitOps,
    _episode,
    _writers,
    scenario,
)
from .storage import FaultSpec

if TYPE_CHECKING:
    from .runner import Run

__all__ = ["DeleteCheckpoint", "GroupCommit", "MakeCheckpoint", "NamedState", "VerifyCheckpoints", "checkpoints"]

GROUP = "torture"


@dataclass
class Pinned:
    """What a checkpoint read when it was made."""

    restores: int
    items: list[tuple[bytes, bytes]]
    offsets: list[tuple[int, int]]
    changes: list[tuple[int, int, bytes, bytes | None]]


@dataclass
class NamedState:
    """The checkpoints and group offsets a run made (kept on the run)."""

    pinned: dict[str, Pinned] = field(default_factory=dict)
    deleted: list[tuple[str, int]] = field(default_factory=list)
    made: int = 0
    #: The positions a later read may find committed (two when a commit's outcome was unknown),
    #: and the restore count when they were committed.
    offsets: list[dict[int, int]] = field(default_factory=list)
    offsets_restores: int = 0


def _state(run: Run) -> NamedState:
    state: NamedState | None = getattr(run, "named", None)
    if state is None:
        state = NamedState()
        run.named = state  # type: ignore[attr-defined]
    return state


def _read(store: kvlog.Store) -> tuple[list[tuple[bytes, bytes]], list[tuple[int, int]],
                                       list[tuple[int, int, bytes, bytes | None]]]:
    log = store.log
    items = list(store.scan())
    offsets = [(log.start_offset(p), log.end_offset(p)) for p in range(log.partitions)]
    changes = [(r.partition, r.offset, r.key, r.value) for r in store.changes()]
    return items, offsets, changes


def _open_at(run: Run, name: str, cache_name: str | None = None) -> kvlog.Store:
    world = run.world
    cache = world.fresh_cache("cp") if cache_name is None else world.cache_dir(cache_name)
    store, _storage = world.open(f"cp-{name}", cache, FaultSpec(seed=0), read_only=True, checkpoint=name)
    return store


class MakeCheckpoint(Action):
    """The maintainer pins checkpoint ``cp<n>`` and records what opening it reads."""

    def run(self, run: Run) -> None:
        state = _state(run)
        state.made += 1
        name = f"cp{state.made}"
        world, maintainer = run.world, run.maintainer
        restores = world.restore_count
        with maintainer.lock:
            if maintainer.store is None or (maintainer.storage is not None and maintainer.storage.dead):
                maintainer.open()
            assert maintainer.store is not None
            try:
                cp = maintainer.store.checkpoint(name)
            except SimulatedCrash as e:
                world.log(f"checkpoint {name}: crashed ({e})")
                maintainer.open()
                return
            except KvlogError as e:
                world.log(f"checkpoint {name}: {classify(e)}")
                if type(e).__name__ in ("StorageBehindError", "CommitStateUnknownError", "CorruptDataError"):
                    maintainer.open()
                return
        try:
            with _open_at(run, name) as store:
                items, offsets, changes = _read(store)
        except CheckpointNotFoundError as e:
            if world.restore_count == restores:
                world.history.violation(f"checkpoint {name} (version {cp.version}) vanished at once: {classify(e)}")
            return
        except KvlogError as e:
            world.history.violation(f"opening checkpoint {name} just made raised {classify(e)}")
            return
        for key, value in items:
            world.history.saw(key.decode("latin-1"), value, committed=True, where=f"checkpoint {name}")
        state.pinned[name] = Pinned(restores, items, offsets, changes)
        world.log(f"checkpoint {name} at version {cp.version}: {len(items)} items, {len(changes)} records")


class VerifyCheckpoints(Action):
    """Every recorded checkpoint reads exactly what it read when made; deleted ones are gone."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def run(self, run: Run) -> None:
        state = _state(run)
        world = run.world
        rng = random.Random(self.seed)
        for name, pinned in sorted(state.pinned.items()):
            reuse = rng.random() < 0.5
            try:
                with _open_at(run, name, f"cp-keep-{name}" if reuse else None) as store:
                    got = _read(store)
            except CheckpointNotFoundError as e:
                if world.restore_count == pinned.restores:
                    world.history.violation(f"checkpoint {name} is gone though never deleted: {classify(e)}")
                else:
                    world.log(f"checkpoint {name} went with a restore of the root")
                continue
            except KvlogError as e:
                world.history.violation(f"opening checkpoint {name} raised {classify(e)}")
                continue
            if got != (pinned.items, pinned.offsets, pinned.changes):
                world.history.violation(
                    f"checkpoint {name} reads otherwise than when it was made: {len(got[0])} items "
                    f"(made: {len(pinned.items)}), offsets {got[1]} (made: {pinned.offsets}), "
                    f"{len(got[2])} records (made: {len(pinned.changes)})")
            else:
                world.log(f"checkpoint {name} verified ({'reused cache' if reuse else 'fresh cache'})")
        for name, restores in state.deleted:
            if world.restore_count != restores:
                continue  # a restore may bring it back
            try:
                with _open_at(run, name):
                    world.history.violation(f"deleted checkpoint {name} still opens")
            except CheckpointNotFoundError:
                pass
            except KvlogError as e:
                world.history.violation(f"opening deleted checkpoint {name} raised {classify(e)}")


class DeleteCheckpoint(Action):
    """The maintainer deletes the oldest recorded checkpoint."""

    def run(self, run: Run) -> None:
        state = _state(run)
        if not state.pinned:
            return
        name = min(state.pinned, key=lambda n: int(n[2:]))
        world, maintainer = run.world, run.maintainer
        with maintainer.lock:
            if maintainer.store is None or (maintainer.storage is not None and maintainer.storage.dead):
                maintainer.open()
            assert maintainer.store is not None
            try:
                maintainer.store.refresh()
                maintainer.store.delete_checkpoint(name)
            except CheckpointNotFoundError:
                if world.restore_count == state.pinned[name].restores:
                    world.history.violation(f"deleting checkpoint {name}: not found, though never deleted")
                del state.pinned[name]
                return
            except (KvlogError, SimulatedCrash) as e:
                world.log(f"deleting checkpoint {name}: {classify(e)}")
                maintainer.open()
                return  # the outcome is unknown: it stays recorded only if it still opens
        del state.pinned[name]
        state.deleted.append((name, world.restore_count))
        world.log(f"checkpoint {name} deleted")


class GroupCommit(Action):
    """The maintainer's consumer polls up to ``records`` records and commits its positions; a
    fresh read-only handle then reads the group's committed offsets back."""

    def __init__(self, records: int) -> None:
        self.records = records

    def run(self, run: Run) -> None:
        state = _state(run)
        world, maintainer = run.world, run.maintainer
        with maintainer.lock:
            if maintainer.store is None or (maintainer.storage is not None and maintainer.storage.dead):
                maintainer.open()
            assert maintainer.store is not None
            if world.restore_count != state.offsets_restores:
                state.offsets, state.offsets_restores = [], world.restore_count
            try:
                with maintainer.store.consumer(GROUP) as consumer:
                    consumer.poll(timeout_s=0, max_records=self.records)
                    positions = {p: consumer.position(p) for p in consumer.partitions}
                    try:
                        consumer.commit()
                    except (KvlogError, SimulatedCrash) as e:
                        world.log(f"group commit: {classify(e)}")
                        state.offsets = [*state.offsets[-1:], positions]  # landed or not
                        maintainer.open()
                        return
            except (KvlogError, SimulatedCrash) as e:
                world.log(f"group poll: {classify(e)}")
                maintainer.open()
                return
        state.offsets = [positions]
        world.log(f"group {GROUP} committed {positions}")
        self._check(run, state)

    def _check(self, run: Run, state: NamedState) -> None:
        world = run.world
        try:
            with world.open("offsets", world.fresh_cache("offsets"), FaultSpec(seed=0), read_only=True)[0] as store:
                with store.consumer(GROUP) as consumer:
                    got = {p: consumer.committed(p) for p in consumer.partitions}
        except KvlogError as e:
            world.history.violation(f"reading group {GROUP}'s offsets raised {classify(e)}")
            return
        if world.restore_count == state.offsets_restores and got not in state.offsets:
            world.history.violation(f"group {GROUP}'s committed offsets read back as {got}, "
                                    f"but the last commit was {state.offsets}")


#: Episodes of the ``checkpoints`` scenario besides the mixed ones.
NAMED_EPISODES = {"make_checkpoint": 3, "verify_checkpoints": 1.5, "delete_checkpoint": 1, "group_commit": 2}


@scenario("checkpoints", weight=1.5)
def checkpoints(rng: random.Random) -> Scenario:
    """Mixed writers, faults, crashes, compaction and GC, while named checkpoints are made,
    verified and deleted and a consumer group commits."""
    threads = rng.randint(1, 3)
    processes = rng.randint(0, 1)
    actions = _writers(rng, threads, processes)
    mixed_state: dict[str, Any] = {}
    if rng.random() < 0.7:
        actions.append(Spawn("reader", "r0", intensity=rng.choice([0.0, 0.5])))
        mixed_state["reader"] = True
    actions.append(WaitOps(rng.randint(20, 60)))
    thread_names = [f"t{i}" for i in range(threads)]
    process_names = [f"p{i}" for i in range(processes)]
    episodes: dict[str, float] = {**MIXED_EPISODES, **NAMED_EPISODES}
    if not processes:
        episodes.update(snapshot=0.7, restore=0.7)
    actions.append(MakeCheckpoint())
    for _ in range(rng.randint(5, 10)):
        kind = rng.choices(sorted(episodes), [episodes[n] for n in sorted(episodes)])[0]
        if kind == "make_checkpoint":
            actions.append(MakeCheckpoint())
        elif kind == "verify_checkpoints":
            actions.append(VerifyCheckpoints(rng.getrandbits(32)))
        elif kind == "delete_checkpoint":
            actions.append(DeleteCheckpoint())
        elif kind == "group_commit":
            actions.append(GroupCommit(rng.randint(1, 200)))
        else:
            actions.extend(_episode(rng, {kind: 1.0}, thread_names, process_names, mixed_state))
        if rng.random() < 0.5:
            actions.extend([Advance(rng.choice([1100, 8000])), GC()])
        actions.append(WaitOps(rng.randint(10, 40)))
    actions.append(VerifyCheckpoints(rng.getrandbits(32)))
    return Scenario("checkpoints", rng.choice([1, 2, 3, 4]), actions,
                    settings={"checkpoint_interval": rng.choice([2, 3, 20])})
