"""Tombstone holds across processes: a writer process compacts in a loop (forced rounds,
``delete_retention_ms=0``, garbage collection with the shortest delay) while this process
starts holds at random moments, crashes and restarts its consumer (its view back to the last
commit), seeks back and commits lower offsets, and deletes and recreates its group. Every
incarnation of the group ends with a view, built from the changelog, that is exactly the
store's keys: no delete or expired record after a committed offset is lost once the hold
has landed, whatever round was in flight when it did."""

from __future__ import annotations

import random
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH, Root, child_env, python_script

import kvlog

View = dict[bytes, tuple[bytes, "int | None"]]


class _Member:
    """This process's member of a holding group, with the view it builds and the view as of
    its last commit (what a crash leaves it)."""

    def __init__(self, store: kvlog.Store, group: str) -> None:
        self.store = store
        self.group = group
        self.consumer = store.consumer(group, hold_tombstones=True)
        self.view: View = {}
        self.committed: View = {}
        self.incarnations = 1

    def read(self, max_records: int) -> int:
        records = self.consumer.poll(timeout_s=0, max_records=max_records)
        for record in records:
            if record.value is None:
                self.view.pop(record.key, None)
            else:
                self.view[record.key] = (record.value, record.expires_ms)
        return len(records)

    def commit(self) -> None:
        self.consumer.commit()
        self.committed = dict(self.view)

    def act(self, rng: random.Random) -> None:
        """One step: mostly read a few records and commit; sometimes crash and restart, seek
        back and commit, or delete the group and start it again."""
        roll = rng.random()
        if roll < 0.75:
            self.read(rng.randint(1, 6))
            self.commit()
        elif roll < 0.85:
            self.consumer.close()
            self.consumer = self.store.consumer(self.group, hold_tombstones=True)
            self.view = dict(self.committed)
        elif roll < 0.95:
            for p in self.consumer.partitions:
                position = self.consumer.position(p)
                self.consumer.seek(p, rng.randint(max(0, position - 20), position))
            self.commit()
        else:
            self.consumer.close()
            self.store.delete_group(self.group)
            self.consumer = self.store.consumer(self.group, hold_tombstones=True)
            self.view, self.committed = {}, {}
            self.incarnations += 1

    def live(self) -> dict[bytes, bytes]:
        now = self.store.clock.now_ms()
        return {k: v for k, (v, expires) in self.view.items() if expires is None or now < expires}


class _Process:
    """The writer-compactor process, its progress lines read as they come."""

    def __init__(self, spec: dict[str, Any], stderr: Path) -> None:
        self.stderr = stderr
        with open(stderr, "w") as err:  # a file: a pipe nobody reads would fill and stall it
            self.proc = subprocess.Popen(python_script("hold_compactor_proc.py"), env=child_env(spec), text=True,
                                         stdout=subprocess.PIPE, stderr=err)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    @property
    def rounds(self) -> int:
        return sum(1 for line in self.lines if line.startswith('{"round"'))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.reader.join()

    def finish(self) -> tuple[str, str]:
        """Wait for the end; (its last line, its stderr)."""
        self.proc.wait(600)
        self.reader.join()
        return (self.lines[-1] if self.lines else ""), self.stderr.read_text()


def churn(root: Root, *, seed: int, seconds: float, writes: int, partitions: int = 2,
          offset_map_bytes: int = 1 << 20, kill_after_rounds: int | None = None,
          min_rounds: int = 0, min_kills: int = 0) -> dict[str, Any]:
    """Run the writer-compactor process against holders in this process for ``seconds`` (or
    until it wrote ``writes`` records), and on until it made ``min_rounds`` rounds and was
    killed ``min_kills`` times (a slow machine starts processes slowly; at most a minute);
    with ``kill_after_rounds``, the process is killed (SIGKILL) once it has reported 1 to
    that many rounds, and a moment more (mid-round or mid-commit as it happens), and started
    again on its cache. The mismatches and what happened."""
    rng = random.Random(seed)
    settings: dict[str, Any] = {**EXPLICIT_FLUSH, "file_delete_delay_ms": 1000, "delete_retention_ms": 0}
    with root.open(partitions=partitions, **settings) as store:
        store.put("k000", "first")
    stop = root.workdir / "stop"
    root.workdir.mkdir(parents=True, exist_ok=True)
    spec = root.spec(cache="writer", seed=seed, writes=writes, keys=40, stop_file=str(stop),
                     offset_map_bytes=offset_map_bytes)
    problems: list[str] = []
    with root.open(cache="holder", **settings) as store:
        members = [_Member(store, "first")]
        writer = _Process(spec, root.workdir / "writer.stderr")
        kills = rounds_before_kills = 0

        def kill_at() -> tuple[int, float]:
            """After how many rounds of the new process, and how long after, it is killed."""
            return (1 if kill_after_rounds is None else rng.randint(1, kill_after_rounds)), rng.random() * 0.05

        after, delay = kill_at()
        try:
            deadline, cap = time.monotonic() + seconds, time.monotonic() + 60

            def going() -> bool:
                now = time.monotonic()
                short = rounds_before_kills + writer.rounds < min_rounds or kills < min_kills
                return (now < deadline or (short and now < cap)) and writer.proc.poll() is None

            while going():
                if len(members) < 3 and rng.random() < 0.01:
                    members.append(_Member(store, f"late{len(members)}"))  # a hold starts mid-flight
                rng.choice(members).act(rng)
                time.sleep(rng.random() * 0.01)
                if kill_after_rounds is not None and writer.rounds >= after:
                    time.sleep(delay)
                    writer.kill()
                    kills += 1
                    rounds_before_kills += writer.rounds
                    writer = _Process(spec, root.workdir / f"writer-{kills}.stderr")
                    after, delay = kill_at()
            stop.touch()
            out, err = writer.finish()
            assert writer.proc.returncode == 0, err[-4000:]
            time.sleep(0.1)  # every short time to live has run out
            store.refresh()
            expected = dict(store.scan())
            for member in members:
                while member.read(1000):
                    pass
                if member.live() != expected:
                    problems.append(f"{member.group} (incarnation {member.incarnations}): view has "
                                    f"{sorted(set(member.live()) - set(expected))[:10]} more, lacks "
                                    f"{sorted(set(expected) - set(member.live()))[:10]}, differs on "
                                    f"{sorted(k for k in expected if k in member.live() and member.live()[k] != expected[k])[:10]}")
            problems.extend(store.check())
            store.gc()
        finally:
            if writer.proc.poll() is None:
                writer.kill()
    if kill_after_rounds is not None:  # the killed process's cache reopens consistent
        with root.open(cache="writer", **settings) as reopened:
            problems.extend(f"the writer's cache: {line}" for line in reopened.check())
            if dict(reopened.scan()) != expected:
                problems.append("the writer's cache reads other keys than the holder's")
    return {"problems": problems, "writer": out,
            "incarnations": sum(m.incarnations for m in members), "kills": kills,
            "rounds": rounds_before_kills + writer.rounds}


def test_holds_that_start_move_back_and_restart_lose_no_delete_beside_a_compacting_process(
        local_root: Root) -> None:
    """At least twenty forced rounds (a tiny offset map: they end early) of another process
    while holds start, move back, restart and are deleted and started again here."""
    result = churn(local_root, seed=3, seconds=2.5, writes=100_000, offset_map_bytes=256, min_rounds=20)
    assert result["rounds"] >= 20 and result["problems"] == [], result


def test_holds_change_while_the_compacting_process_is_killed_mid_round(local_root: Root) -> None:
    """The compacting process is killed (SIGKILL) after a few rounds, mid-round or mid-commit,
    and started again on its cache, while the holds change: nothing a hold covers is lost, and
    every cache (the killed one's included) checks clean."""
    result = churn(local_root, seed=11, seconds=2.5, writes=100_000, offset_map_bytes=256, kill_after_rounds=3,
                   min_kills=2)
    assert result["kills"] >= 2 and result["problems"] == [], result


@pytest.mark.s3
def test_holds_churn_beside_a_compacting_process_on_object_storage(s3_store_root: Root) -> None:
    """The same on SeaweedFS: commits race through the object store's conditional writes."""
    result = churn(s3_store_root, seed=5, seconds=2.5, writes=100_000, min_rounds=10)
    assert result["rounds"] >= 10 and result["problems"] == [], result
