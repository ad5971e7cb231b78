"""Everyday lifecycles under torture: how applications really open, leave and read a store.

The other scenarios model the engine's faults; these model what programs do (children run
:mod:`.lifeworker`, opening the store with default arguments, no fault injection):

* ``lifecycle`` - writer processes that exit normally without calling ``close()`` (a write made
  before the exit, never flushed, is acknowledged by the exit: it must be readable afterwards),
  that drop their handle (``del store; gc.collect()``; acknowledged at that point) and go on
  with a new one, that are stopped by SIGTERM with the ``signal.signal(SIGTERM, lambda *_:
  sys.exit(143))`` recipe installed or by SIGINT (both flush: acknowledged by the exit status),
  or by SIGTERM with no handler (a crash: only what was flushed or synced is acknowledged);
  and rounds of several such processes opening the store at one instant (a barrier) with
  default arguments, each writing: none may be fenced.
* ``consumer-idle`` - consumer processes (``store.consumer(group)``) read part of the log,
  commit and idle while other handles overwrite, compact and collect garbage past the delay
  (a small ``file_delete_delay_ms``, or the 60 s default with the clock moved past it); resumed,
  each must read every record still in the log past its committed offset, and never raise.
* ``cli-consume`` - ``kvlog consume URI GROUP --follow`` processes (stdout to a file) ended by
  SIGTERM, SIGINT, SIGKILL or a closed pipe, and restarted: the union of their outputs holds
  every record below the group's committed offsets (at least once).
* ``full-disk`` - a 4 MB tmpfs under the data (the root) or under a writer's cache fills up: the
  writes fail with :class:`kvlog.StorageError` (the process never dies of it), and once space is
  freed (the tmpfs remounted bigger, filler files deleted) and the store reopened, nothing
  acknowledged is lost.

Every write the children make is journaled and checked by the run's usual final checks
(:func:`~.model.check_final`: acknowledged writes readable, nothing never written, ``check()``
clean, a fresh process agreeing); the consumer checks are made by the actions themselves.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlog.errors import KvlogError, StorageError

from .model import Journal, Write, check_changelog_chunk
from .ops import classify
from .scenarios import (
    GC,
    Action,
    Advance,
    Compact,
    MaintainerWrites,
    Scenario,
    Spawn,
    WaitOps,
    scenario,
)
from .storage import FaultSpec
from .world import REPO, World, derive_seed

if TYPE_CHECKING:
    from .runner import Run

__all__ = ["LifeProcs", "ConsumerIdle", "CliConsume", "FullDisk", "ENDS", "FLUSHING_EXITS", "lifecycle",
           "consumer_idle", "cli_consume", "full_disk"]

#: How a lifecycle writer process ends (see :mod:`.lifeworker`).
ENDS = ("exit", "close", "sigterm-handler", "sigint", "sigterm-raw")
#: The exit statuses of an end that flushes (its returned writes are acknowledged by it).
FLUSHING_EXITS: dict[str, tuple[int, ...]] = {
    "exit": (0,), "close": (0,), "sigterm-handler": (143,), "sigint": (-signal.SIGINT, 130),
}
#: The exit statuses an end may have; anything else is a violation.
EXPECTED_EXITS: dict[str, tuple[int, ...]] = {**FLUSHING_EXITS, "sigterm-raw": (-signal.SIGTERM,)}


def _timeout(run: Run, seconds: float) -> float:
    return seconds * run.slowness


#: How an application reaches an object store with default arguments: the standard variables.
_AWS_VARIABLES = {"endpoint_override": "AWS_ENDPOINT_URL", "access_key": "AWS_ACCESS_KEY_ID",
                  "secret_key": "AWS_SECRET_ACCESS_KEY", "region": "AWS_REGION"}


def _child_env(world: World) -> dict[str, str]:
    env = world.backend.child_env()
    for option, variable in _AWS_VARIABLES.items():
        value = (world.backend.storage_options or {}).get(option)
        if value is not None:
            env[variable] = str(value)
    env["XDG_CACHE_HOME"] = str(world.workdir / "xdg-cache")  # a default cache dir inside the run
    env.pop("PYTHONUNBUFFERED", None)  # stdout buffered as an application's is
    return env


@dataclass
class Child:
    """A child process of a lifecycle action and what the parent knows of it."""

    name: str
    spec: dict[str, Any]
    journal: Path
    proc: subprocess.Popen[bytes]
    stderr: Path
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    idle: threading.Event = field(default_factory=threading.Event)
    exited_ns: int = 0

    def watch(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            text = raw.decode(errors="replace").strip()
            self.lines.append(text)
            if text == "ready":
                self.ready.set()
            elif text == "idle":
                self.idle.set()
        self.proc.stdout.close()

    def journal_has(self, kind: str) -> bool:
        try:
            return f'"t": "{kind}"' in self.journal.read_text(errors="replace")
        except FileNotFoundError:
            return False

    def stderr_tail(self) -> str:
        try:
            return self.stderr.read_text(errors="replace")[-2500:]
        except FileNotFoundError:
            return ""


def spawn_child(world: World, name: str, spec: dict[str, Any]) -> Child:
    """Start ``python -m tests.torture.lifeworker`` with ``spec`` (journal and paths filled in)."""
    journal = world.workdir / f"{name}.journal"
    spec = {"writer": name, "root": world.backend.root, "journal": str(journal),
            "seed": derive_seed(world.seed, name), **spec}
    spec_path = world.workdir / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    stderr_path = world.workdir / f"{name}.stderr"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "tests.torture.lifeworker", str(spec_path)], cwd=REPO,
                                env=_child_env(world), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=stderr)
    child = Child(name, spec, journal, proc, stderr_path)
    threading.Thread(target=child.watch, daemon=True, name=f"torture-{name}-out").start()
    world.log(f"{name}: started pid {proc.pid}: {json.dumps({k: v for k, v in spec.items() if k not in ('root', 'journal')})}")
    return child


def wait_child(run: Run, child: Child, seconds: float) -> int | None:
    """Wait for ``child`` to exit; SIGKILL it (a violation) when it hangs. Its exit status."""
    try:
        code = child.proc.wait(_timeout(run, seconds))
    except subprocess.TimeoutExpired:
        run.world.history.violation(f"{child.name}: did not exit within {seconds} s (a hang at exit?); "
                                    f"killed. stderr: {child.stderr_tail()}")
        child.proc.kill()
        child.proc.wait()
        return None
    child.exited_ns = time.monotonic_ns()
    run.world.log(f"{child.name}: exited with {code}")
    return code


def collect_writes(run: Run, child: Child, flushed_gen: int | None) -> list[Write]:
    """Read ``child``'s journal into the history: its writes, acknowledged where it said so, and
    (``flushed_gen``) every returned write of that handle acknowledged by the exit itself."""
    history = run.world.history
    writes, other = Journal.parse(child.journal, child.name)
    by_counter = {w.counter: w for w in writes}
    returned: set[int] = set()
    for obj in other:
        kind = obj.get("t")
        if kind == "ret":
            returned.update(int(c) for c in obj["cs"])
        elif kind == "ack":
            if "cs" in obj:
                for c in obj["cs"]:
                    if c in by_counter and c in returned:
                        by_counter[c].acked_ns = by_counter[c].acked_ns or int(obj["ns"])
            else:
                for w in writes:
                    if w.gen == obj["g"] and w.counter <= obj["upto"] and w.counter in returned:
                        w.acked_ns = w.acked_ns or int(obj["ns"])
        elif kind == "x":
            history.violation(f"{child.name}: {obj['text']}")
        elif kind == "o":
            history.saw(obj["k"], obj["v"].encode("latin-1"), committed=bool(obj["c"]),
                        where=f"{child.name} {obj['where']}")
    if flushed_gen is not None:
        for w in writes:
            if w.gen == flushed_gen and w.counter in returned and w.acked_ns is None:
                w.acked_ns = child.exited_ns
    history.extra_writes.extend(writes)
    run.world.universe.extend(sorted({w.key for w in writes}))
    return writes


def _last_gen(child: Child) -> int:
    gen = int(child.spec["gen"])
    writes, other = Journal.parse(child.journal, child.name)
    for obj in other:
        if obj.get("t") == "open":
            gen = max(gen, int(obj["g"]))
    return gen


class LifeProcs(Action):
    """Writer processes with the given ``ends`` (one each), dropping their handle ``drops`` times;
    ``barrier``: they open the store at one instant (a go file all of them wait for)."""

    def __init__(self, tag: str, ends: list[str], drops: list[int], ops: int, barrier: bool,
                 signal_ms: int) -> None:
        self.tag = tag
        self.ends = ends
        self.drops = drops
        self.ops = ops
        self.barrier = barrier
        self.signal_ms = signal_ms

    def run(self, run: Run) -> None:
        world = run.world
        go_file = world.workdir / f"life-{self.tag}.go"
        children = []
        for i, (end, drops) in enumerate(zip(self.ends, self.drops, strict=True)):
            name = f"L{self.tag}x{i}"
            spec = {"mode": "life", "end": end, "drops": drops, "ops": self.ops, "keys": 6, "gen": 1,
                    "cache_dir": str(world.cache_dir(name)), "counter_start": 0,
                    "go_file": str(go_file) if self.barrier else None}
            children.append(spawn_child(world, name, spec))
        if self.barrier:
            for child in children:
                child.ready.wait(_timeout(run, 60))
            go_file.touch()
            world.log(f"life {self.tag}: go ({len(children)} openers at once)")
        rng = random.Random(derive_seed(world.seed, "life-signals", self.tag))
        deadline = time.monotonic() + _timeout(run, 90)
        for child in children:
            end = child.spec["end"]
            if end not in ("sigterm-handler", "sigint", "sigterm-raw"):
                continue
            while not child.journal_has("waiting") and child.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.randint(0, self.signal_ms) / 1000.0)
            sig = signal.SIGINT if end == "sigint" else signal.SIGTERM
            if child.proc.poll() is None:
                world.log(f"{child.name}: sending {sig.name}")
                child.proc.send_signal(sig)
        for child in children:
            end = child.spec["end"]
            code = wait_child(run, child, 90)
            if code is not None and code not in EXPECTED_EXITS[end]:
                world.history.violation(f"{child.name} (end {end}): exited with {code}, expected "
                                        f"{EXPECTED_EXITS[end]}; stderr: {child.stderr_tail()}")
            flushed = code is not None and code in FLUSHING_EXITS.get(end, ())
            writes = collect_writes(run, child, _last_gen(child) if flushed else None)
            acked = sum(1 for w in writes if w.acked_ns is not None)
            world.log(f"{child.name}: {len(writes)} writes, {acked} acknowledged (end {end}, exit {code})")


class ConsumerIdle(Action):
    """Consumer processes read ``first`` records each (their own groups), commit and idle while
    the maintainer overwrites, compacts and collects garbage with the clock ``advance_ms`` ahead;
    then they resume and must read every record still in the log past their committed offsets."""

    def __init__(self, tag: str, firsts: list[int], rounds: int, advance_ms: int, overwrites: int) -> None:
        self.tag = tag
        self.firsts = firsts
        self.rounds = rounds
        self.advance_ms = advance_ms
        self.overwrites = overwrites

    def run(self, run: Run) -> None:
        world = run.world
        go_file = world.workdir / f"idle-{self.tag}.go"
        children = []
        for i, first in enumerate(self.firsts):
            name = f"C{self.tag}x{i}"
            spec = {"mode": "consumer", "group": f"idle-{self.tag}-{i}", "first": first,
                    "cache_dir": str(world.cache_dir(name)), "go_file": str(go_file)}
            children.append(spawn_child(world, name, spec))
        for child in children:
            if not child.idle.wait(_timeout(run, 60)):
                world.history.violation(f"{child.name}: never went idle; stderr: {child.stderr_tail()}")
        rng = random.Random(derive_seed(world.seed, "idle", self.tag))
        for _ in range(self.rounds):
            MaintainerWrites(self.overwrites, rng.getrandbits(32)).run(run)
            Compact(force=True).run(run)
            Advance(self.advance_ms).run(run)
            GC().run(run)
        ends = self._ends(run)
        staged = go_file.with_suffix(".tmp")
        staged.write_text(json.dumps({str(p): e for p, e in ends.items()}))
        staged.rename(go_file)  # the consumers read it whole or not at all
        world.log(f"idle {self.tag}: consumers resume; end offsets {ends}")
        for child in children:
            code = wait_child(run, child, 120)
            if code != 0:
                world.history.violation(f"{child.name}: exited with {code}; stderr: {child.stderr_tail()}")
            self._check(run, child, ends)

    def _ends(self, run: Run) -> dict[int, int]:
        run.maintainer.do("flush")
        store = run.maintainer.store
        if store is None:
            return {}
        try:
            store.refresh()
        except KvlogError as e:
            run.world.log(f"maintainer refresh raised {classify(e)}")
        return {p: store.log.end_offset(p) for p in range(store.log.partitions)}

    def _check(self, run: Run, child: Child, ends: dict[int, int]) -> None:
        world = run.world
        history = world.history
        writes, other = Journal.parse(child.journal, child.name)
        committed: dict[int, int] | None = None
        after: dict[int, list[tuple[int, str, bytes | None]]] = {}
        everything: dict[int, list[tuple[int, str, bytes | None]]] = {}
        for obj in other:
            kind = obj.get("t")
            if kind == "x":
                history.violation(obj["text"])
            elif kind == "committed":
                committed = {int(p): int(o) for p, o in obj["pos"].items()}
            elif kind == "rec":
                rec = (int(obj["o"]), str(obj["k"]), None if obj["v"] is None else obj["v"].encode("latin-1"))
                everything.setdefault(int(obj["p"]), []).append(rec)
                if committed is not None:
                    after.setdefault(int(obj["p"]), []).append(rec)
        for p, records in everything.items():
            for line in check_changelog_chunk(f"{child.name} poll()", p, records, history):
                history.violation(line)
        if committed is None:
            history.violation(f"{child.name}: never committed; stderr: {child.stderr_tail()}")
            return
        try:
            store, storage = world.open(f"{child.name}-check", world.fresh_cache(f"{child.name}-check"), FaultSpec(),
                                        read_only=True)
        except KvlogError as e:
            history.violation(f"{child.name}: opening a checker read-only raised {classify(e)}")
            return
        try:
            missing = 0
            for p, start in sorted(committed.items()):
                seen = {(o, v) for o, _k, v in after.get(p, [])}
                for r in store.changes(p, start):
                    if r.offset >= ends.get(p, 0):
                        break
                    if (r.offset, r.value) not in seen:
                        missing += 1
                        if missing <= 5:
                            history.violation(
                                f"{child.name}: resumed from committed offset {start} of partition {p} but never "
                                f"read record {r.offset} ({r.key.decode('latin-1')!r}), which is still in the log")
            world.log(f"{child.name}: committed {committed}, read {sum(map(len, after.values()))} records after; "
                      f"{missing} missing")
        finally:
            store.close()
            storage.close()


def _cli_command(world: World, group: str) -> list[str]:
    code = "import sys; from kvlog.cli import main; sys.argv[0] = 'kvlog'; sys.exit(main())"
    return [sys.executable, "-c", code, "consume", world.backend.root, group, "--follow", "--max-records", "7"]


#: How a ``kvlog consume --follow`` round ends, and the exit statuses it may have.
CLI_ENDS: dict[str, tuple[int, ...]] = {
    "sigterm": (-signal.SIGTERM, 143, 130), "sigint": (130, -signal.SIGINT), "sigkill": (-signal.SIGKILL,),
    "pipe": (141, -signal.SIGPIPE),
}


class CliConsume(Action):
    """Rounds of ``kvlog consume URI GROUP --follow``, each ended as ``ends`` says after
    ``after_ms``; then every record below the group's committed offsets that is still in the log
    must be in some round's output (a round ended by a closed pipe excuses what it committed:
    its reader dropped what the pipe held)."""

    def __init__(self, tag: str, ends: list[str], after_ms: list[int]) -> None:
        self.tag = tag
        self.ends = ends
        self.after_ms = after_ms

    def run(self, run: Run) -> None:
        world = run.world
        group = f"cli-{self.tag}"
        printed: set[tuple[int, int, bytes | None]] = set()
        excused: list[tuple[dict[int, int], dict[int, int]]] = []
        rng = random.Random(derive_seed(world.seed, "cli", self.tag))
        for i, (end, after_ms) in enumerate(zip(self.ends, self.after_ms, strict=True)):
            before = self._committed(run, group)
            name = f"K{self.tag}x{i}"
            out_path = world.workdir / f"{name}.out"
            stderr_path = world.workdir / f"{name}.stderr"
            with open(out_path, "wb") as out, open(stderr_path, "wb") as err:
                proc = subprocess.Popen(_cli_command(world, group), cwd=REPO, env=_child_env(world),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if end == "pipe" else out,
                                        stderr=err)
            world.log(f"{name}: kvlog consume {group} --follow (pid {proc.pid}), ends by {end} after {after_ms} ms")
            MaintainerWrites(rng.randint(3, 12), rng.getrandbits(32)).run(run)
            if end != "pipe":
                # The end comes mid-output: once the command printed something (startup aside).
                limit = time.monotonic() + _timeout(run, 20)
                while out_path.stat().st_size == 0 and proc.poll() is None and time.monotonic() < limit:
                    time.sleep(0.01)
            if end == "pipe":
                assert proc.stdout is not None
                fd = proc.stdout.fileno()
                deadline = time.monotonic() + after_ms / 1000.0
                with open(out_path, "ab") as out:
                    while time.monotonic() < deadline:
                        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
                        if ready:
                            chunk = os.read(fd, 65536)
                            if not chunk:
                                break
                            out.write(chunk)
                proc.stdout.close()
                world.log(f"{name}: closed the pipe")
                MaintainerWrites(3, rng.getrandbits(32)).run(run)  # something to print into it
            else:
                time.sleep(after_ms / 1000.0)
                sig = {"sigterm": signal.SIGTERM, "sigint": signal.SIGINT, "sigkill": signal.SIGKILL}[end]
                world.log(f"{name}: sending {sig.name}")
                proc.send_signal(sig)
            try:
                code = proc.wait(_timeout(run, 60))
            except subprocess.TimeoutExpired:
                world.history.violation(f"{name}: kvlog consume did not exit within 60 s of {end} (after which "
                                        "new records were written); killed")
                proc.kill()
                code = proc.wait()
            stderr = stderr_path.read_text(errors="replace")
            world.log(f"{name}: exited with {code}; stderr {stderr.strip()[-300:]!r}")
            if code not in CLI_ENDS[end] or "Traceback" in stderr:
                world.history.violation(f"{name}: kvlog consume ended by {end} exited with {code} (expected "
                                        f"{CLI_ENDS[end]}); stderr: {stderr[-1500:]}")
            printed |= self._read_output(run, name, out_path)
            if end == "pipe":
                excused.append((before, self._committed(run, group)))
        self._check(run, group, printed, excused)

    def _committed(self, run: Run, group: str) -> dict[int, int]:
        from kvlog.log.group_offsets import committed_offsets

        store = run.maintainer.store
        if store is None:
            return {}
        try:
            store.refresh()
            return dict(committed_offsets(store.log, group))
        except KvlogError as e:
            run.world.log(f"reading {group}'s offsets raised {classify(e)}")
            return {}

    def _read_output(self, run: Run, name: str, path: Path) -> set[tuple[int, int, bytes | None]]:
        out: set[tuple[int, int, bytes | None]] = set()
        data = path.read_bytes()
        lines = data.split(b"\n")
        complete = lines[:-1]  # a line cut by the kill has no newline
        by_partition: dict[int, list[tuple[int, str, bytes | None]]] = {}
        for raw in complete:
            fields = raw.decode("latin-1").split("\t")
            if len(fields) != 5:
                run.world.history.violation(f"{name}: a malformed output line {raw[:80]!r}")
                continue
            p, o, key = int(fields[0]), int(fields[1]), fields[3]
            value = None if fields[4] == "\\N" else fields[4].encode("latin-1")
            out.add((p, o, value))
            by_partition.setdefault(p, []).append((o, key, value))
        for p, records in by_partition.items():
            for line in check_changelog_chunk(f"{name} output", p, records, run.world.history):
                run.world.history.violation(line)
        run.world.log(f"{name}: printed {len(complete)} records")
        return out

    def _check(self, run: Run, group: str, printed: set[tuple[int, int, bytes | None]],
               excused: list[tuple[dict[int, int], dict[int, int]]]) -> None:
        world = run.world
        committed = self._committed(run, group)
        store = run.maintainer.store
        if store is None:
            return
        for attempt in range(5):
            try:
                # The maintainer's storage injects faults: a read that met one is read again.
                below = [(p, upto, list(itertools.takewhile(lambda r, upto=upto: r.offset < upto,
                                                            store.changes(p))))
                         for p, upto in sorted(committed.items())]
                break
            except StorageError as e:
                world.log(f"{group}: reading the changelog raised {classify(e)} (attempt {attempt + 1})")
        else:
            world.history.violation(f"{group}: the changelog could not be read in 5 attempts")
            return
        missing = 0
        for p, upto, records in below:
            for r in records:
                if (p, r.offset, r.value) in printed:
                    continue
                if any(b.get(p, 0) <= r.offset < a.get(p, 0) for b, a in excused):
                    continue
                missing += 1
                if missing <= 5:
                    world.history.violation(
                        f"{group}: record {r.offset} of partition {p} ({r.key.decode('latin-1')!r}) is below the "
                        f"committed offset {upto} and still in the log, but no kvlog consume round printed it")
        world.log(f"{group}: committed {committed}; {len(printed)} records printed; {missing} missing")


def _mount(world: World, path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    world.log(f"mounted a {size} tmpfs on {path}")
    world.cleanups.append(lambda: _unmount(world, path))


def _unmount(world: World, path: Path) -> None:
    done = subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)
    world.log(f"unmounted {path} ({done.returncode})")


class FullDisk(Action):
    """A writer process fills the 4 MB tmpfs under ``where`` (``data``: the root, mounted before
    the store was created; ``cache``: its cache directory, partly taken by a filler file); its
    writes must fail with StorageError and the process live on. Then the space is freed (the
    root's tmpfs remounted at 64 MB, or the filler deleted), and a new process reopens the same
    cache and writes and closes cleanly."""

    def __init__(self, where: str, filler_kb: int, pad: int) -> None:
        self.where = where
        self.filler_kb = filler_kb
        self.pad = pad

    def run(self, run: Run) -> None:
        world = run.world
        cache = world.workdir / "tmpfs-cache" / "cache" if self.where == "cache" else world.cache_dir("F0")
        filler = world.workdir / "tmpfs-cache" / "filler"
        if self.where == "cache":
            _mount(world, cache.parent, "4m")
            filler.write_bytes(b"\0" * (self.filler_kb * 1024))
        # Values up to 1 KB live in the cache too (inline): the cache grows with every new key.
        spec = {"mode": "fill", "end": "exit", "drops": 0, "ops": 4000, "keys": 4000, "gen": 1, "pad": self.pad,
                "cache_dir": str(cache), "counter_start": 0, "full_errors": 3}
        child = spawn_child(world, "F0", spec)
        code = wait_child(run, child, 180)
        if code not in (0,):
            world.history.violation(f"F0 (filling the {self.where} disk) exited with {code}"
                                    f"{' (SIGBUS)' if code == -signal.SIGBUS else ''}; stderr: {child.stderr_tail()}")
        text = child.journal.read_text(errors="replace") if child.journal.exists() else ""
        filled = "StorageError" in text
        world.log(f"F0: the {self.where} disk {'filled' if filled else 'did not fill'}")
        collect_writes(run, child, None)  # nothing is acknowledged by this exit: the disk was full
        if self.where == "cache":
            filler.unlink(missing_ok=True)
        else:
            subprocess.run(["mount", "-o", "remount,size=64m", world.backend.root], check=True)
            world.log("remounted the root's tmpfs at 64m")
        again = {"mode": "life", "end": "close", "drops": 0, "ops": 40, "keys": 6, "gen": 1,
                 "cache_dir": str(cache), "counter_start": 0}
        child2 = spawn_child(world, "F1", again)
        code = wait_child(run, child2, 120)
        if code != 0:
            world.history.violation(f"F1 (reopening after space was freed) exited with {code}; "
                                    f"stderr: {child2.stderr_tail()}")
        collect_writes(run, child2, _last_gen(child2) if code == 0 else None)


def _prepare_full_data(world: World) -> None:
    _mount(world, Path(world.backend.root), "4m")


# -- scenarios ---------------------------------------------------------------------------------------

def _background(rng: random.Random) -> list[Action]:
    """A writer thread of the harness (default producer or not) writing beside the children."""
    return [Spawn("thread", "t0", lanes=1, producer_id=rng.choice([None, 1000]), intensity=0.0,
                  background_compaction=rng.random() < 0.5, keys=8), WaitOps(10)]


@scenario("lifecycle", weight=1.0)
def lifecycle(rng: random.Random) -> Scenario:
    """Writer processes exiting without close, dropping handles, stopped by signals; default openers at once."""
    actions = _background(rng) if rng.random() < 0.7 else []
    for round_ in range(rng.randint(2, 3)):
        n = rng.randint(2, 4)
        barrier = rng.random() < 0.5
        ends = [rng.choice(ENDS) for _ in range(n)]
        drops = [rng.choice([0, 0, 1, 2]) for _ in range(n)]
        actions.append(LifeProcs(str(round_), ends, drops, rng.randint(5, 30), barrier, rng.choice([0, 30, 150])))
        if rng.random() < 0.4:
            actions += [Compact(force=True), Advance(1100), GC()]
    # Zero included: a process left behind the retention window catches up in place, as the
    # programs these actors model (which never reopen) need.
    retention = {"commit_retention_ms": rng.choice([0, 1000, 5000, 7 * 86_400_000])}
    return Scenario("lifecycle", rng.choice([1, 2, 4]), actions, settings=retention)


@scenario("consumer-idle", weight=1.0)
def consumer_idle(rng: random.Random) -> Scenario:
    """Consumer processes idle while others overwrite, compact and collect garbage, then resume."""
    default_delay = rng.random() < 0.5
    actions: list[Action] = [MaintainerWrites(rng.randint(20, 60), rng.getrandbits(32))]
    actions += _background(rng) if rng.random() < 0.5 else []
    for round_ in range(rng.randint(1, 2)):
        firsts = [rng.randint(1, 40) for _ in range(rng.randint(1, 3))]
        actions.append(ConsumerIdle(str(round_), firsts, rng.randint(1, 3), 61_000 if default_delay else 1100,
                                    rng.randint(10, 40)))
    settings = {"file_delete_delay_ms": 60_000} if default_delay else {}
    return Scenario("consumer-idle", rng.choice([1, 2, 4]), actions, settings=settings)


@scenario("cli-consume", weight=1.0)
def cli_consume(rng: random.Random) -> Scenario:
    """``kvlog consume --follow`` ended by SIGTERM, SIGINT, SIGKILL, a closed pipe, and restarted."""
    actions: list[Action] = [MaintainerWrites(rng.randint(10, 40), rng.getrandbits(32))]
    actions += _background(rng) if rng.random() < 0.6 else []
    rounds = rng.randint(3, 6)
    ends = [rng.choice(sorted(CLI_ENDS)) for _ in range(rounds)]
    actions.append(CliConsume("0", ends, [rng.randint(300, 1500) for _ in range(rounds)]))
    if rng.random() < 0.5:
        actions += [Compact(force=True), Advance(1100), GC()]
    return Scenario("cli-consume", rng.choice([1, 2, 4]), actions)


@scenario("full-disk", weight=0.5)
def full_disk(rng: random.Random) -> Scenario:
    """A 4 MB tmpfs under the data or a cache fills up; space is freed; nothing acknowledged is lost."""
    where = rng.choice(["data", "cache"])
    action = FullDisk(where, rng.randint(3000, 3800), rng.choice([1000, 1000, 8000]))
    return Scenario("full-disk", rng.choice([1, 2]), [action],
                    forced={"background_compaction": False},
                    prepare=_prepare_full_data if where == "data" else None)

