"""Running one seed: build the world, perform the schedule, stop everything, check, report.

:func:`run_seed` is what the tests and the command line call. A run's work directory keeps
``run.log`` (the schedule as performed, every reopen, crash and fault plan), the writer
processes' journals and specs, and ``result.json``; it is deleted after a passing run unless
``keep`` is set.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kvlog
from kvlog.errors import KvlogError
from kvlog.storage.faulty import SimulatedCrash

from . import lifecycle, named  # noqa: F401 - register the checkpoints and lifecycle scenarios
from .actors import Maintainer, ProcessWriter, Reader, ThreadWriter
from .held import HeldReader
from .model import FinalView, check_final
from .ops import classify
from .scenarios import Scenario, pick_scenario
from .world import REPO, Backend, World, store_settings

__all__ = ["Run", "RunResult", "run_seed", "replay_command"]


def replay_command(seed: int, backend: str = "local", scenario: str | None = None) -> str:
    """The command that runs ``seed`` again (``scenario``: when the run forced one)."""
    extra = "" if backend == "local" else f" --backend {backend}"
    if scenario is not None:
        extra += f" --scenario {scenario}"
    return f"python -m tests.torture --seed {seed}{extra}"


@dataclass
class RunResult:
    """The outcome of one seed."""

    seed: int
    backend: str
    scenario: str
    violations: list[str]
    seconds: float
    workdir: Path
    notes: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    forced: str | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self, limit: int = 25) -> str:
        """A human report: verdict, replay command, where the log is, the first violations."""
        head = (f"seed {self.seed} ({self.scenario}, {self.backend}): "
                f"{'ok' if self.ok else f'{len(self.violations)} violation(s)'} in {self.seconds:.1f} s")
        if self.ok:
            return head
        lines = [head, f"  replay: {replay_command(self.seed, self.backend, self.forced)}", f"  log: {self.workdir / 'run.log'}"]
        lines += [f"  - {v}" for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"  ... and {len(self.violations) - limit} more")
        return "\n".join(lines)


class Run:
    """A run in progress: the world, its actors, the maintainer and snapshots."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.actors: dict[str, Any] = {}
        self.order: list[str] = []
        self.snapshots: dict[str, tuple[int, dict[str, bytes]]] = {}
        self.maintainer = Maintainer(world, intensity=world.rng.choice([0.0, 0.3]),
                                     background_compaction=world.rng.random() < 0.5)
        #: Waits scale with this (a loaded machine runs slower, not differently).
        self.slowness = float(os.environ.get("KVLOG_TORTURE_SLOWNESS", "1"))

    def add(self, name: str, actor: Any) -> None:
        self.actors[name] = actor
        self.order.append(name)

    def writer_ops(self) -> int:
        total = 0
        for actor in list(self.actors.values()):
            if isinstance(actor, ThreadWriter | ProcessWriter):
                total += actor.ops_done()
        return total

    def writers_alive(self) -> bool:
        for actor in list(self.actors.values()):
            if isinstance(actor, ThreadWriter) and not actor.finished and not actor.stop.is_set():
                return True
            if isinstance(actor, ProcessWriter) and not actor.stopping and actor.respawn:
                return True
        return False


def _view_in_process(store: kvlog.Store, name: str, keys: list[str], *, full: bool) -> FinalView:
    view = FinalView(name, None, {}, None, {}, [], [], store.log.partitions)
    try:
        view.findings.extend(store.check())
    except Exception as e:  # noqa: BLE001 - a finding
        view.errors.append(f"check() raised {classify(e)}")
    try:
        view.scan = {k.decode("latin-1"): v for k, v in store.scan()}
    except Exception as e:  # noqa: BLE001 - a finding
        view.errors.append(f"scan() raised {classify(e)}")
    if full:
        for key in keys:
            try:
                view.gets[key] = store.get(key)
            except Exception as e:  # noqa: BLE001 - a finding
                view.gets[key] = classify(e)
        try:
            view.changes = {p: [(r.offset, r.key.decode("latin-1"), r.value) for r in store.changes(p)]
                            for p in range(store.log.partitions)}
            view.ends = {p: store.log.end_offset(p) for p in range(store.log.partitions)}
        except Exception as e:  # noqa: BLE001 - a finding
            view.errors.append(f"changes() raised {classify(e)}")
    return view


def _view_in_child(world: World, keys: list[str]) -> FinalView:
    out = world.workdir / "verify.json"
    spec = {"mode": "verify", "name": "a new process (new cache)", "backend": world.backend.kind,
            "root": world.backend.root, "cache_dir": str(world.fresh_cache("verify")), "keys": keys,
            "output": str(out)}
    spec_path = world.workdir / "verify.spec.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-m", "tests.torture.worker", str(spec_path)], cwd=REPO,
                          env=world.backend.child_env(), capture_output=True, timeout=300, check=False)
    if proc.returncode != 0 or not out.exists():
        return FinalView("a new process (new cache)", None, {}, None, {}, [],
                         [f"the verifying process failed ({proc.returncode}): {proc.stderr.decode()[-3000:]}"])
    return FinalView.from_json(json.loads(out.read_text()))


class _ToRunLog(logging.Handler):
    """kvlog's log records (warnings of retried flushes, failed compactions...) into ``run.log``."""

    def __init__(self, world: World) -> None:
        super().__init__(logging.INFO)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING and record.name == "kvlog.compaction":
            return  # one line per compaction round: too many to be useful
        try:
            self.world.log(f"[{record.name} {record.levelname.lower()}] {record.getMessage()[:300]}")
        except Exception:  # noqa: BLE001 - logging never fails a run
            pass


def _install_excepthook(world: World) -> Any:
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.exc_value, SimulatedCrash):
            world.log(f"thread {args.thread.name if args.thread else '?'} ended by {args.exc_value}")
            return
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        world.history.violation(f"a thread ({args.thread.name if args.thread else '?'}) died: {text[-3000:]}")

    threading.excepthook = hook
    return previous


def run_seed(seed: int, backend: Backend, workdir: Path, *, scenario: str | None = None, keep: bool = False,
             echo: bool = False) -> RunResult:
    """Run ``seed`` against ``backend`` in ``workdir`` (created; removed after a pass unless ``keep``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    world = World(seed, backend, workdir, echo=echo)
    plan: Scenario = pick_scenario(seed, scenario)
    world.partitions = plan.partitions
    world.settings = {**store_settings(world.rng_for("settings")), **plan.settings}
    world.forced = dict(plan.forced)
    world.log(f"seed {seed} scenario {plan.name} backend {backend.kind} root {backend.root}")
    world.log(f"kvlog {kvlog.__file__}")
    world.log(f"partitions {plan.partitions} settings {json.dumps(world.settings, sort_keys=True)}")
    for i, action in enumerate(plan.actions):
        world.log(f"schedule {i:2d}: {action.describe()}")
    previous_hook = _install_excepthook(world)
    handler = _ToRunLog(world)
    kvlog_logger = logging.getLogger("kvlog")
    previous_level = kvlog_logger.level
    kvlog_logger.addHandler(handler)
    kvlog_logger.setLevel(logging.INFO)
    run = Run(world)
    stats: dict[str, Any] = {}
    try:
        if plan.prepare is not None:
            plan.prepare(world)
        with kvlog.open(backend.raw(), partitions=plan.partitions, cache_dir=world.cache_dir("creator"),
                        **{**world.settings, "background_compaction": False}):
            pass
        run.maintainer.open()
        for i, action in enumerate(plan.actions):
            world.log(f"step {i}: {action.describe()}")
            try:
                action.run(run)
            except Exception as e:  # noqa: BLE001 - a harness or kvlog failure, reported
                world.history.violation(f"action {action.describe()} raised {classify(e)}\n"
                                        f"{traceback.format_exc(limit=10)}")
        _finish(run)
        _final_checks(run)
        stats = _stats(run)
    except Exception as e:  # noqa: BLE001 - reported as the run's failure
        world.history.violation(f"the run itself failed: {classify(e)}\n{traceback.format_exc()}")
        try:
            _finish(run)
        except Exception:  # noqa: BLE001 - best effort
            pass
    finally:
        threading.excepthook = previous_hook
        kvlog_logger.removeHandler(handler)
        kvlog_logger.setLevel(previous_level)
    result = RunResult(seed, backend.kind, plan.name, list(world.history.violations),
                       time.monotonic() - started, workdir, list(world.history.notes), stats, scenario)
    world.log(result.report(limit=1000))
    (workdir / "result.json").write_text(json.dumps(
        {"seed": seed, "scenario": plan.name, "backend": backend.kind, "ok": result.ok,
         "violations": result.violations, "seconds": round(result.seconds, 2), "stats": stats}, indent=1))
    for cleanup in reversed(world.cleanups):
        try:
            cleanup()
        except Exception as e:  # noqa: BLE001 - a cleanup never hides the run's result
            world.log(f"cleanup failed: {classify(e)}")
    world.close()
    if result.ok and not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _finish(run: Run) -> None:
    """Stop every actor: writers close (cleanly or crashing, as drawn), processes too or are killed."""
    world = run.world
    rng = world.rng_for("finish")
    for name in list(run.order):
        actor = run.actors[name]
        if isinstance(actor, ThreadWriter):
            if not actor.stop.is_set() or not actor.finished:
                actor.final = rng.choice(["close", "close", "crash"])
            actor.finish()
        elif isinstance(actor, ProcessWriter):
            actor.finish(kill=rng.random() < 0.2)
        elif isinstance(actor, Reader | HeldReader):
            actor.finish()
    for actor in run.actors.values():
        if isinstance(actor, ProcessWriter):
            actor.collect()


def _final_checks(run: Run) -> None:
    world = run.world
    history = world.history
    keys = sorted(set(world.universe))
    world.put_back_race_deleted()
    # The maintainer reopens without background compaction first: from here on nothing changes
    # the store, so every view below must read the very same state.
    quiet = run.maintainer.quiet()
    views = [_view_in_child(world, keys)]
    if quiet:
        store = run.maintainer.store
        assert store is not None
        try:
            store.refresh()
        except KvlogError as e:
            history.violation(f"the maintainer's final refresh raised {classify(e)}")
        views.append(_view_in_process(store, "the maintainer (long-lived cache)", keys, full=True))
        run.maintainer.close()
    for actor in run.actors.values():
        if isinstance(actor, HeldReader):
            actor.final_check()  # nothing changes the store any more: its view must be the store
    for name in run.order:
        actor = run.actors[name]
        if isinstance(actor, ThreadWriter) and actor.cache.exists():
            try:
                with kvlog.open(world.backend.raw(), read_only=True, cache_dir=actor.cache,
                                on_storage_behind=world.on_storage_behind(), **world.settings) as reopened:
                    views.append(_view_in_process(reopened, f"{name}'s cache reopened", keys, full=False))
            except Exception as e:  # noqa: BLE001 - a finding
                history.violation(f"reopening {name}'s cache read-only raised {classify(e)}")
    problems = check_final(history, views, keys, world.partition_of)
    for line in problems:
        history.violation(line)
    if problems:
        _dump_views(world, views)


def _dump_views(world: World, views: list[FinalView]) -> None:
    """Write what every final view saw to ``views.json`` (kept with a failing run's log)."""

    def text(value: bytes | None | str) -> str | None:
        return value.decode("latin-1") if isinstance(value, bytes) else value

    out = []
    for view in views:
        out.append({
            "name": view.name, "errors": view.errors, "findings": view.findings, "ends": view.ends,
            "scan": None if view.scan is None else {k: text(v) for k, v in view.scan.items()},
            "changes": None if view.changes is None else {
                str(p): [[o, k, text(v)] for o, k, v in recs] for p, recs in view.changes.items()},
        })
    (world.workdir / "views.json").write_text(json.dumps(out, indent=1))


def _stats(run: Run) -> dict[str, Any]:
    writes = run.world.history.all_writes()
    acked = sum(1 for w in writes if w.acked_ns is not None)
    return {"writes": len(writes), "acked": acked, "maybe": len(writes) - acked,
            "restores": len(run.world.history.restores), "clock_lead_ms": run.world.clock.lead_ms}
