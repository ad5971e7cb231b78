"""The actors of a run: writer threads, writer processes, readers, the maintainer.

* :class:`ThreadWriter`: one store handle in this process, used by one or two lanes (threads),
  each a writer of its own keys; it reopens after crashes, on request and when kvlog says so.
* :class:`ProcessWriter`: a writer in child processes (:mod:`.worker`), restarted as a new
  incarnation after it crashes or is killed with SIGKILL.
* :class:`Reader`: a read-only handle checking gets, scans and changelogs as it goes.
* :class:`Maintainer`: a writable handle the schedule uses for compaction, GC and interference.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kvlog
from kvlog.errors import KvlogError
from kvlog.storage.faulty import SimulatedCrash

from .model import Journal, check_changelog_chunk, parse_value
from .ops import LIFECYCLE, Lane, OpMix, classify, next_op
from .storage import TortureStorage
from .world import REPO, World, derive_seed

__all__ = ["ThreadWriter", "ProcessWriter", "Reader", "Maintainer"]

#: Opening a store is retried this many times (faults may fail it) before it is a finding.
OPEN_ATTEMPTS = 25


def _safe_close(store: kvlog.Store | None, *, flush: bool) -> BaseException | None:
    """Close ``store``; the error it raised, if any (a crashed handle's close may fail)."""
    if store is None:
        return None
    try:
        store.close(flush=flush)
    except BaseException as e:  # noqa: BLE001 - the caller decides
        return e
    return None


class HandleBox:
    """A store handle shared by lanes: shared use for operations, exclusive use to reopen it."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.users = 0
        self.exclusive = False
        self.store: kvlog.Store | None = None
        self.storage: TortureStorage | None = None
        self.gen = 0

    @contextmanager
    def shared(self) -> Iterator[tuple[kvlog.Store | None, int, TortureStorage | None]]:
        with self.cond:
            while self.exclusive:
                self.cond.wait()
            self.users += 1
        try:
            yield self.store, self.gen, self.storage
        finally:
            with self.cond:
                self.users -= 1
                self.cond.notify_all()

    @contextmanager
    def alone(self) -> Iterator[None]:
        with self.cond:
            while self.exclusive:
                self.cond.wait()
            self.exclusive = True
            while self.users:
                self.cond.wait()
        try:
            yield
        finally:
            with self.cond:
                self.exclusive = False
                self.cond.notify_all()


class ThreadWriter:
    """A writer handle in this process, with ``lanes`` threads writing their own keys through it."""

    def __init__(self, world: World, name: str, *, lanes: int = 1, producer_id: int | None = None,
                 mix: OpMix | None = None, intensity: float = 0.5, background_compaction: bool = True,
                 max_ops: int | None = None, go: threading.Event | None = None,
                 allowed_ops: frozenset[str] | None = None, recover: bool = True,
                 final: str = "close", slow_commit_ms: int = 0) -> None:
        self.world = world
        self.name = name
        self.slow_commit_ms = slow_commit_ms
        self.producer_id = producer_id
        self.mix = mix or OpMix()
        self.intensity = intensity
        self.background_compaction = background_compaction
        self.max_ops = max_ops
        self.go = go
        self.allowed_ops = allowed_ops
        self.recover = recover
        self.final = final
        self.box = HandleBox()
        self.cache = world.cache_dir(name)
        self.rng = world.rng_for(name, "faults")
        self.lanes: list[Lane] = []
        for i in range(lanes):
            writer = f"{name}{chr(ord('a') + i)}"
            journal = world.history.journal(writer)
            self.lanes.append(Lane(writer, journal, world.history, self.mix))
            world.universe.extend(self.lanes[-1].keys)
        self.stop = threading.Event()
        self.requests: list[str] = []
        self.threads: list[threading.Thread] = []
        self.finished = False
        self.gave_up = False
        self._pause_cond = threading.Condition()
        self._pausing = False
        self._parked = 0
        self._running = 0

    # -- life ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.threads = [threading.Thread(target=self._lane_main, args=(i,), name=f"torture-{self.name}-{i}",
                                         daemon=True) for i in range(len(self.lanes))]
        for t in self.threads:
            t.start()

    def request(self, what: str) -> None:
        """Ask the writer to ``crash`` or ``reopen`` at its next operation boundary."""
        with self.box.cond:
            self.requests.append(what)

    def crash_now(self, op: str = "*", pattern: str | None = None, when: str = "before") -> None:
        """Make the handle's next storage call matching ``op``/``pattern`` a crash (mid-operation)."""
        storage = self.box.storage
        if storage is not None:
            storage.arm_crash(op, pattern, when)

    def ops_done(self) -> int:
        return sum(lane.ops for lane in self.lanes)

    def _park(self) -> None:
        with self._pause_cond:
            if not self._pausing:
                return
            self._parked += 1
            self._pause_cond.notify_all()
            while self._pausing and not self.stop.is_set():
                self._pause_cond.wait(0.1)
            self._parked -= 1

    def quiesce(self, timeout: float = 60.0) -> bool:
        """Park every lane between operations and flush the handle, so that no storage flow of
        this writer is under way (background compaction aside); False if it did not settle."""
        with self._pause_cond:
            self._pausing = True
            deadline = time.monotonic() + timeout
            while self._parked < self._running and time.monotonic() < deadline:
                self._pause_cond.wait(0.05)
            parked = self._parked >= self._running
        with self.box.alone():
            store, storage, gen = self.box.store, self.box.storage, self.box.gen
            if store is None or storage is None:
                return parked
            if storage.dead:
                self._close("crash")
                self._open()
                store, storage, gen = self.box.store, self.box.storage, self.box.gen
                if store is None or storage is None:
                    return parked
            storage.suspended = True
            try:
                store.flush()
                for lane in self.lanes:
                    lane.journal.ack(gen)
            except KvlogError as e:
                self.world.log(f"{self.name}: quiescing flush raised {classify(e)}")
                parked = False
            finally:
                storage.suspended = False
        return parked

    def resume(self) -> None:
        with self._pause_cond:
            self._pausing = False
            self._pause_cond.notify_all()

    def _open(self) -> None:
        """Open a new generation of the handle (called alone)."""
        for attempt in range(1, OPEN_ATTEMPTS + 1):
            spec = self.world.fault_spec(self.rng, self.intensity if attempt < OPEN_ATTEMPTS // 2 else 0)
            spec.slow_commit_ms = self.slow_commit_ms
            try:
                store, storage = self.world.open(self.name, self.cache, spec, producer_id=self.producer_id,
                                                 background_compaction=self.background_compaction)
            except (KvlogError, SimulatedCrash) as e:
                self.world.log(f"{self.name}: open #{attempt} raised {classify(e)}")
                if type(e).__name__ == "ProducerFencedError" and not self.recover:
                    break
                time.sleep(0.005 * attempt)
                continue
            except Exception as e:  # noqa: BLE001 - a finding
                self.world.history.violation(f"{self.name}: open raised an unexpected {classify(e)}\n"
                                             f"{traceback.format_exc(limit=8)}")
                time.sleep(0.01)
                continue
            self.box.store, self.box.storage = store, storage
            self.box.gen += 1
            for lane in self.lanes:
                lane.new_generation()
            epoch = store.stats()["producer_epoch"]
            self.world.log(f"{self.name}: gen {self.box.gen} open (epoch {epoch}, faults {spec.describe()})")
            return
        self.box.store = self.box.storage = None
        self.gave_up = True
        if self.recover:
            self.world.history.violation(f"{self.name}: could not open the store in {OPEN_ATTEMPTS} attempts")
        else:
            self.world.log(f"{self.name}: gave up opening")

    def _close(self, how: str) -> None:
        """Close the current generation: ``close`` (flush, acknowledging) or ``crash``."""
        store, storage, gen = self.box.store, self.box.storage, self.box.gen
        self.box.store = self.box.storage = None
        if store is None:
            return
        if how == "close" and storage is not None and not storage.dead:
            error = _safe_close(store, flush=True)
            if error is None:
                for lane in self.lanes:
                    lane.journal.ack(gen)
                self.world.log(f"{self.name}: gen {gen} closed cleanly")
                return
            if not isinstance(error, KvlogError | SimulatedCrash):
                self.world.history.violation(f"{self.name}: close raised an unexpected {classify(error)}")
            self.world.log(f"{self.name}: gen {gen} close raised {classify(error)}")
            _safe_close(store, flush=False)
            return
        if storage is not None:
            storage.dead = True  # the process it stands for is gone: nothing more reaches storage
            storage.death = storage.death or "crash requested"
        error = _safe_close(store, flush=False)
        if error is not None and not isinstance(error, KvlogError | SimulatedCrash):
            self.world.history.violation(f"{self.name}: close(flush=False) raised an unexpected {classify(error)}")
        self.world.log(f"{self.name}: gen {gen} crashed ({storage.death if storage else ''})")

    def _lifecycle(self, what: str, seen_gen: int) -> None:
        with self.box.alone():
            if self.box.gen != seen_gen or self.stop.is_set() and what != "final":
                return  # another lane already handled it (or we are stopping)
            self._close("close" if what == "reopen" else "crash")
            if self.recover or what == "reopen":
                self._open()

    def _lane_main(self, index: int) -> None:
        lane = self.lanes[index]
        rng = self.world.rng_for(self.name, index, "ops")
        try:
            if self.go is not None:
                self.go.wait(60)
            if index == 0:
                with self.box.alone():
                    self._open()
            else:
                while self.box.gen == 0 and not self.gave_up and not self.stop.is_set():
                    time.sleep(0.002)
            with self._pause_cond:
                self._running += 1
            allowed = self.allowed_ops
            if index > 0:
                allowed = frozenset(n for n in (allowed or self.mix.weights) if n not in LIFECYCLE)
            while not self.stop.is_set() and not self.gave_up:
                if self.max_ops is not None and lane.ops >= self.max_ops:
                    break
                if self._pausing:
                    self._park()
                    continue
                if index == 0 and self.requests:
                    with self.box.cond:
                        what = self.requests.pop(0)
                    self.world.log(f"{self.name}: {what} (requested)")
                    self._lifecycle(what, self.box.gen)
                    continue
                op = next_op(rng, self.mix, allowed)
                with self.box.shared() as (store, gen, storage):
                    if store is None:
                        outcome: str | None = "dead"
                    elif storage is not None and storage.dead:
                        outcome = "dead"
                    else:
                        try:
                            outcome = lane.run(store, gen, op)
                        except SimulatedCrash:
                            outcome = "dead"
                if outcome is not None:
                    if outcome != "reopen" and not self.recover:
                        self.world.log(f"{self.name}: {outcome}; stops (does not recover)")
                        with self.box.alone():
                            if self.box.gen == gen:
                                self._close("crash")
                        break
                    if store is None and self.gave_up:
                        break
                    self.world.log(f"{lane.writer}: {op['op']} -> {outcome}")
                    self._lifecycle(outcome, gen)
        except BaseException as e:  # noqa: BLE001 - a harness or kvlog failure, reported
            self.world.history.violation(f"{lane.writer}: lane died: {classify(e)}\n{traceback.format_exc()}")
        finally:
            with self._pause_cond:
                self._running = max(0, self._running - 1)
                self._pause_cond.notify_all()
            if index == 0:
                self.finished = True

    def finish(self, timeout: float = 120.0) -> None:
        """Stop the lanes and close the handle as ``final`` says (``close`` or ``crash``)."""
        self.stop.set()
        self.resume()
        hung = False
        for t in self.threads:
            t.join(timeout)
            if t.is_alive():
                hung = True
                self.world.history.violation(f"{self.name}: lane {t.name} did not stop within {timeout} s "
                                             "(a kvlog call hangs?)")
        if hung:
            return  # its handle stays open: closing would wait for the hung call
        with self.box.alone():
            self._close(self.final)


class ProcessWriter:
    """A writer living in child processes; a crash or SIGKILL starts its next incarnation."""

    def __init__(self, world: World, name: str, *, producer_id: int | None = None, mix: OpMix | None = None,
                 intensity: float = 0.5, background_compaction: bool = True, respawn: bool = True,
                 max_ops: int | None = None, go_file: Path | None = None,
                 allowed_ops: frozenset[str] | None = None, slow_commit_ms: int = 0) -> None:
        self.world = world
        self.name = name
        self.writer = name
        self.slow_commit_ms = slow_commit_ms
        self.producer_id = producer_id
        self.mix = mix or OpMix()
        self.intensity = intensity
        self.background_compaction = background_compaction
        self.respawn = respawn
        self.max_ops = max_ops
        self.go_file = go_file
        self.allowed_ops = allowed_ops
        self.rng = world.rng_for(name, "process")
        self.incarnation = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.journals: list[Path] = []
        self.stopping = False
        self.stop_file = world.workdir / f"{name}.stop"
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._monitor: threading.Thread | None = None
        self.exits: list[int] = []
        self._counted: dict[Path, tuple[int, int]] = {}
        world.universe.extend(f"{name}/k{i:03d}" for i in range(self.mix.keys))

    def _spec(self) -> dict[str, Any]:
        self.incarnation += 1
        spec_path = self.world.workdir / f"{self.name}.{self.incarnation}.spec.json"
        journal = self.world.workdir / f"{self.name}.{self.incarnation}.journal"
        self.journals.append(journal)
        faults = self.world.fault_spec(self.rng, self.intensity)
        faults.slow_commit_ms = self.slow_commit_ms
        spec = {
            "mode": "writer", "writer": self.name, "backend": self.world.backend.kind,
            "root": self.world.backend.root, "cache_dir": str(self.world.cache_dir(self.name)),
            "restored_file": str(self.world.restored_file),
            "settings": {**self.world.settings, "background_compaction": self.background_compaction,
                         **self.world.forced},
            "producer_id": self.producer_id, "counter_start": self.incarnation * 1_000_000,
            "gen": self.incarnation, "journal": str(journal), "stop_file": str(self.stop_file),
            "go_file": None if self.go_file is None else str(self.go_file), "max_ops": self.max_ops,
            "ops": sorted(self.allowed_ops) if self.allowed_ops else None,
            "seed": derive_seed(self.world.seed, self.name, self.incarnation), "mix": self.mix.to_json(),
            "faults": faults.to_json(), "final": self.rng.choice(["close", "close", "crash"]),
        }
        spec_path.write_text(json.dumps(spec))
        self.world.log(f"{self.name}: incarnation {self.incarnation} (faults {faults.describe()}, "
                       f"final {spec['final']})")
        return {"path": spec_path, **spec}

    def _spawn(self) -> None:
        spec = self._spec()
        stderr = open(self.world.workdir / f"{self.name}.{self.incarnation}.stderr", "wb")  # noqa: SIM115
        self.ready.clear()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.torture.worker", str(spec["path"])], cwd=REPO,
            env=self.world.backend.child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
        )
        stderr.close()
        self.proc = proc

        def wait_ready() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == b"ready":
                    self.ready.set()
            proc.stdout.close()

        threading.Thread(target=wait_ready, daemon=True, name=f"torture-{self.name}-ready").start()

    def start(self) -> None:
        with self._lock:
            self._spawn()
        self._monitor = threading.Thread(target=self._watch, daemon=True, name=f"torture-{self.name}-watch")
        self._monitor.start()

    def _watch(self) -> None:
        while True:
            with self._lock:
                proc = self.proc
            assert proc is not None
            code = proc.wait()
            with self._lock:
                self.exits.append(code)
                if code not in (0, 77, -signal.SIGKILL):
                    tail = (self.world.workdir / f"{self.name}.{self.incarnation}.stderr").read_text(errors="replace")
                    self.world.history.violation(f"{self.name}: incarnation {self.incarnation} exited with "
                                                 f"{code}:\n{tail[-3000:]}")
                self.world.log(f"{self.name}: incarnation {self.incarnation} exited with {code}")
                if self.stopping or not self.respawn or code == 0:
                    return
                self._spawn()

    def kill(self) -> None:
        """SIGKILL the current incarnation (the next one starts by itself)."""
        with self._lock:
            proc = self.proc
            if proc is not None and proc.poll() is None:
                self.world.log(f"{self.name}: kill -9 incarnation {self.incarnation} (pid {proc.pid})")
                proc.kill()  # Popen's kill: nothing if the monitor thread reaped it meanwhile

    def ops_done(self) -> int:
        """Operations the incarnations journaled so far (read incrementally)."""
        for journal in list(self.journals):
            offset, count = self._counted.get(journal, (0, 0))
            try:
                with open(journal, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk.rfind(b"\n") + 1
            count += chunk[:complete].count(b'{"t": "op"')
            self._counted[journal] = (offset + complete, count)
        return sum(count for _offset, count in self._counted.values())

    def finish(self, timeout: float = 120.0, *, kill: bool = False) -> None:
        """Stop: the stop file (the child closes as its spec says), or SIGKILL."""
        with self._lock:
            self.stopping = True
            proc = self.proc
        self.stop_file.touch()
        if kill:
            self.kill()
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.world.history.violation(f"{self.name}: did not stop within {timeout} s; killed")
                proc.kill()
                proc.wait()
        if self._monitor is not None:
            self._monitor.join(30)

    def collect(self) -> None:
        """Read every incarnation's journal into the history."""
        history = self.world.history
        for journal in self.journals:
            writes, other = Journal.parse(journal, self.name)
            history.extra_writes.extend(writes)
            for obj in other:
                kind = obj.get("t")
                if kind == "x":
                    history.violation(f"{self.name} ({journal.name}): {obj['text']}")
                elif kind == "o":
                    history.saw(obj["k"], obj["v"].encode("latin-1"), committed=bool(obj["c"]),
                                where=f"{self.name} {obj['where']}")


class Reader:
    """A read-only handle that reads while everything else happens, checking what it sees."""

    def __init__(self, world: World, name: str, *, intensity: float = 0.3) -> None:
        self.world = world
        self.name = name
        self.intensity = intensity
        self.rng = world.rng_for(name, "reads")
        self.fault_rng = world.rng_for(name, "faults")
        self.cache = world.cache_dir(name)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.reads = 0
        self.tolerated = 0
        self.store: kvlog.Store | None = None
        self.storage: TortureStorage | None = None
        self._last: dict[str, int] = {}
        self._restores = 0
        self._pause_cond = threading.Condition()
        self._pausing = False
        self._parked = False

    def start(self) -> None:
        self.thread = threading.Thread(target=self._main, name=f"torture-{self.name}", daemon=True)
        self.thread.start()

    def pause(self, timeout: float = 30.0) -> None:
        """Wait until the reader is between operations, and keep it there until :meth:`resume`."""
        with self._pause_cond:
            self._pausing = True
            deadline = time.monotonic() + timeout
            while not self._parked and self.thread is not None and self.thread.is_alive() \
                    and time.monotonic() < deadline:
                self._pause_cond.wait(0.05)

    def resume(self) -> None:
        with self._pause_cond:
            self._pausing = False
            self._pause_cond.notify_all()

    def _park(self) -> None:
        with self._pause_cond:
            self._parked = True
            self._pause_cond.notify_all()
            while self._pausing and not self.stop.is_set():
                self._pause_cond.wait(0.1)
            self._parked = False

    def _open(self, fresh: bool = False) -> None:
        _safe_close(self.store, flush=False)
        self.store = None
        if fresh:
            self.cache = self.world.fresh_cache(self.name)
        for attempt in range(1, OPEN_ATTEMPTS + 1):
            spec = self.world.fault_spec(self.fault_rng, self.intensity if attempt < 5 else 0, crashes=False)
            try:
                self.store, self.storage = self.world.open(self.name, self.cache, spec, read_only=True)
                self._last.clear()
                self.world.log(f"{self.name}: opened ({'fresh cache' if fresh else 'its cache'})")
                return
            except (KvlogError, SimulatedCrash) as e:
                self.world.log(f"{self.name}: open #{attempt} raised {classify(e)}")
                time.sleep(0.01)
            except Exception as e:  # noqa: BLE001 - a finding
                self.world.history.violation(f"{self.name}: read-only open raised an unexpected {classify(e)}")
                time.sleep(0.01)
        self.world.history.violation(f"{self.name}: could not open read-only in {OPEN_ATTEMPTS} attempts")

    def _seen(self, key: str, value: bytes | None, where: str) -> None:
        self.world.history.saw(key, value, committed=True, where=f"{self.name} {where}")
        if value is None:
            return
        parsed = parse_value(value)
        if parsed is None:
            return
        if self.world.restore_count != self._restores:
            self._restores = self.world.restore_count
            self._last.clear()
        last = self._last.get(key)
        if last is not None and parsed[2] < last:
            self.world.history.violation(f"{self.name}: {where} of {key!r} went back from write #{last} to "
                                         f"#{parsed[2]} (a read-only handle's view moved backwards)")
        self._last[key] = max(parsed[2], last or 0)

    def _main(self) -> None:
        try:
            self._open()
            while not self.stop.is_set():
                if self._pausing:
                    self._park()
                    continue
                if self.store is None:
                    break
                choice = self.rng.random()
                try:
                    if choice < 0.5 and self.world.universe:
                        key = self.rng.choice(self.world.universe)
                        self._seen(key, self.store.get(key), "get")
                    elif choice < 0.7:
                        for k, v in self.store.scan():
                            self._seen(k.decode("latin-1"), v, "scan")
                    elif choice < 0.85:
                        p = self.rng.randrange(self.store.log.partitions)
                        records = [(r.offset, r.key.decode("latin-1"), r.value) for r in self.store.changes(p)]
                        for line in check_changelog_chunk(f"{self.name} changes()", p, records, None):
                            self.world.history.violation(line)
                        for _o, record_key, record_value in records:
                            self.world.history.saw(record_key, record_value, committed=True,
                                                   where=f"{self.name} changes()")
                    elif choice < 0.985:
                        self.store.refresh()
                    else:
                        self._open(fresh=self.rng.random() < 0.5)
                        continue
                    self.reads += 1
                except SimulatedCrash:
                    self._open()
                except KvlogError as e:
                    # Injected faults, and reads racing GC of replaced files (documented): tolerated
                    # here; the final checks read everything again with no faults.
                    self.tolerated += 1
                    if self.tolerated % 50 == 1:
                        self.world.log(f"{self.name}: tolerated {classify(e)}")
                time.sleep(self.rng.random() * 0.01)
        except BaseException as e:  # noqa: BLE001 - reported
            self.world.history.violation(f"{self.name}: died: {classify(e)}\n{traceback.format_exc()}")

    def finish(self) -> None:
        self.stop.set()
        self.resume()
        if self.thread is not None:
            self.thread.join(60)
        _safe_close(self.store, flush=False)
        self.store = None
        self.world.log(f"{self.name}: {self.reads} reads, {self.tolerated} tolerated errors")


class Maintainer:
    """A writable handle the schedule drives: compaction, GC, and writes of its own keys."""

    def __init__(self, world: World, name: str = "m", *, intensity: float = 0.2,
                 background_compaction: bool = False) -> None:
        self.world = world
        self.name = name
        self.intensity = intensity
        self.background_compaction = background_compaction
        self.cache = world.cache_dir(name)
        self.rng = world.rng_for(name, "faults")
        self.mix = OpMix(keys=6)
        self.lane = Lane(name, world.history.journal(name), world.history, self.mix)
        world.universe.extend(self.lane.keys)
        self.store: kvlog.Store | None = None
        self.storage: TortureStorage | None = None
        self.gen = 0
        self.lock = threading.RLock()

    def open(self, *, quiet: bool = False) -> None:
        with self.lock:
            _safe_close(self.store, flush=False)
            self.store = None
            for attempt in range(1, OPEN_ATTEMPTS + 1):
                spec = self.world.fault_spec(self.rng, 0 if quiet or attempt > 5 else self.intensity, crashes=False)
                try:
                    # The final reopen (quiet) compacts nothing, so every final view reads one state.
                    self.store, self.storage = self.world.open(
                        self.name, self.cache, spec, background_compaction=self.background_compaction and not quiet)
                except (KvlogError, SimulatedCrash) as e:
                    self.world.log(f"{self.name}: open #{attempt} raised {classify(e)}")
                    continue
                self.gen += 1
                self.lane.new_generation()
                self.world.log(f"{self.name}: gen {self.gen} open (faults {spec.describe()})")
                return
            raise RuntimeError(f"{self.name}: could not open the store")

    def do(self, what: str, **kwargs: Any) -> Any:
        """Run a store method (``compact``, ``gc``, ``flush``, ``refresh``...) and log what it did."""
        with self.lock:
            if self.store is None or (self.storage is not None and self.storage.dead):
                self.open()
            assert self.store is not None
            try:
                result = getattr(self.store, what)(**kwargs)
            except SimulatedCrash as e:
                self.world.log(f"{self.name}: {what} crashed: {e}")
                self.open()
                return None
            except KvlogError as e:
                self.world.log(f"{self.name}: {what} raised {classify(e)}")
                if type(e).__name__ in ("StorageBehindError", "ProducerFencedError", "CorruptDataError"):
                    self.open()
                return None
            if hasattr(result, "to_dict"):
                info = {k: v for k, v in result.to_dict().items() if v and k in (
                    "kind", "rounds", "refused", "partial", "records_removed", "files_in", "files_out", "version")}
                self.world.log(f"{self.name}: {what} -> {info}")
            else:
                self.world.log(f"{self.name}: {what} -> {result}")
            return result

    def write(self, op: dict[str, Any]) -> str | None:
        """One writer operation on the maintainer's own keys."""
        with self.lock:
            if self.store is None or (self.storage is not None and self.storage.dead):
                self.open()
            assert self.store is not None
            try:
                outcome = self.lane.run(self.store, self.gen, op)
            except SimulatedCrash:
                outcome = "crash"
            if outcome in ("crash", "recover"):
                self.open()
            return outcome

    def quiet(self) -> bool:
        """Reopen without faults (for the final checks), flushing what it can first; False if it
        cannot be opened (reported)."""
        with self.lock:
            if self.store is not None and self.storage is not None and not self.storage.dead:
                self.storage.quiet()
                try:
                    self.store.flush()
                    self.lane.journal.ack(self.gen)
                except KvlogError as e:
                    self.world.log(f"{self.name}: final flush raised {classify(e)}")
            try:
                self.open(quiet=True)
            except RuntimeError as e:
                self.world.history.violation(f"{e} with its long-lived cache at the end of the run")
                return False
            return True

    def close(self) -> None:
        with self.lock:
            error = _safe_close(self.store, flush=True)
            if error is None and self.store is not None:
                self.lane.journal.ack(self.gen)
            self.store = None
