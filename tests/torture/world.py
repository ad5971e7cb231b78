"""One run's shared world: the root, the clock, the gate, the history, the log, the actors.

Everything random in a run comes from the run's seed: :meth:`World.rng_for` gives each actor its
own ``random.Random`` derived from the seed and the actor's name, so adding an actor does not
change what the others do.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kvlog
from kvlog.storage import LocalStorage, Storage, open_storage

from .model import History
from .storage import FaultSpec, SimClock, StorageGate, TortureStorage

__all__ = ["Backend", "World", "REPO", "derive_seed", "store_settings"]

#: The repository root (the directory holding ``tests/``): child processes run from it.
REPO = Path(__file__).resolve().parents[2]
DAY_MS = 24 * 3600 * 1000


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from the run's seed and names (stable across Python versions)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass
class Backend:
    """Where the store lives: a local directory, or an ``s3://`` prefix on SeaweedFS."""

    kind: str
    root: str
    storage_options: dict[str, Any] | None = None

    def raw(self) -> Storage:
        """A fault-free storage of the root."""
        if self.kind == "local":
            return LocalStorage(self.root, fsync=False)
        return open_storage(self.root, self.storage_options)

    def child_env(self) -> dict[str, str]:
        """The environment of a child process: this repository first, the options apart."""
        from .worker import OPTIONS_ENV

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        if self.storage_options:
            env[OPTIONS_ENV] = json.dumps(self.storage_options)
        return env


def store_settings(rng: random.Random) -> dict[str, Any]:
    """Small settings, so that flushes, merges, checkpoints and GC happen within seconds."""
    max_record = 64 * 1024
    settings = {
        "flush_interval_ms": rng.choice([5, 20, 60, 200]),
        "flush_bytes": rng.choice([2048, 16 * 1024, 1 << 20]),
        "max_unflushed_bytes": rng.choice([max_record, 4 * max_record]),
        "max_record_bytes": max_record,
        "file_delete_delay_ms": 1000,
        "l0_merge_files": rng.choice([2, 2, 3, 4]),
        "checkpoint_interval": rng.randint(3, 5),
        "min_cleanable_dirty_ratio": rng.choice([0.0, 0.0, 0.3]),
        "compaction_interval_ms": rng.choice([50, 150, 400]),
        "inline_value_bytes": rng.choice([0, 64, 1024]),
        "index_run_limit": rng.choice([0, 2, 32]),
        "refresh_interval_ms": rng.choice([0, 50, 1000]),
        "commit_retention_ms": rng.choice([1000, 5000, 7 * DAY_MS]),
        "delete_retention_ms": rng.choice([0, 1000, DAY_MS]),
        "cache_bytes": rng.choice([64 * 1024, 32 << 20]),
        "compression": rng.choice(["zstd", "lz4", "none"]),
        "offset_map_bytes": rng.choice([2048, 128 << 20]),
        # 0: every flush writes a data file before its commit (what GC may collect under a slow
        # writer); else flushes up to this size travel inside their commit.
        "commit_inline_bytes": rng.choice([0, 1024, 64 * 1024]),
        "commit_retries": 400,
    }
    if rng.random() < 0.25:
        # Commit GC keeps only the newest checkpoint, the commit below it and the ones after.
        settings["commit_retention_ms"] = 0
    return settings


class World:
    """The state of one run that every actor and action shares."""

    def __init__(self, seed: int, backend: Backend, workdir: Path, *, echo: bool = False) -> None:
        self.seed = seed
        self.backend = backend
        self.workdir = workdir
        self.echo = echo
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.gate = StorageGate()
        self.history = History()
        self.settings: dict[str, Any] = {}
        #: Settings every handle gets whatever its actor asks for (a scenario's).
        self.forced: dict[str, Any] = {}
        self.partitions = 1
        self.universe: list[str] = []
        self.actors: dict[str, Any] = {}
        self.started = time.monotonic()
        self._log_lock = threading.Lock()
        self._log_file = open(workdir / "run.log", "a", buffering=1)  # noqa: SIM115
        self._names = 0
        self.restore_count = 0
        #: The objects the last restore put back (name to bytes).
        self.restored_copy: dict[str, bytes] = {}
        #: Made by the first restore, for writer processes: from then on a cache may hold commits
        #: the restore took away, and reopening it accepts their loss.
        self.restored_file = workdir / "restored"
        #: Called (last first) when the run ends, whatever happened: unmounts and the like.
        self.cleanups: list[Callable[[], None]] = []

    # -- logging ------------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        """A line of the run's log (``run.log`` in the work directory)."""
        line = f"{time.monotonic() - self.started:8.3f} {text}"
        with self._log_lock:
            self._log_file.write(line + "\n")
            if self.echo:
                print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        with self._log_lock:
            self._log_file.close()

    # -- randomness ---------------------------------------------------------------------------------
    def rng_for(self, *names: Any) -> random.Random:
        """An actor's own generator, derived from the run's seed and its name."""
        return random.Random(derive_seed(self.seed, *names))

    def fault_spec(self, rng: random.Random, intensity: float, *, crashes: bool = True,
                   reads_only: bool = False) -> FaultSpec:
        """A handle's faults: ``intensity`` 0 (none) to 1 (a lot), crashes planned at random calls."""
        spec = FaultSpec(seed=rng.getrandbits(62))
        if intensity <= 0:
            return spec
        spec.error_rate = round(rng.uniform(0.0, 0.04) * intensity, 4)
        spec.slow_rate = round(rng.uniform(0.0, 0.2) * intensity, 3)
        spec.slow_max_ms = rng.choice([2, 10, 30])
        if crashes and not reads_only and rng.random() < 0.5 * intensity:
            # Crashes before or after a storage call of each kind, or at any named crash point
            # library code marks (none fires where the library marks none).
            op, pattern = rng.choice([
                ("put", "data/*"), ("swap", "log/head.json"), ("swap", "log/head.json"), ("read", "log/*"),
                ("read_range", None), ("list", None), ("delete", None), ("stat", None), ("put", None),
                ("crash_point", None),
            ])
            spec.crashes.append([op, pattern, rng.randint(1, 40), rng.choice(["before", "after"])])
        return spec

    # -- handles --------------------------------------------------------------------------------------
    def cache_dir(self, name: str) -> Path:
        return self.workdir / "caches" / name

    def fresh_cache(self, prefix: str) -> Path:
        self._names += 1
        return self.cache_dir(f"{prefix}-{self._names}")

    def storage(self, label: str, spec: FaultSpec) -> TortureStorage:
        """A faulty storage of the root for one in-process handle (behind the gate)."""
        return TortureStorage(self.backend.raw(), spec, label=label, gate=self.gate)

    def open(self, label: str, cache: Path, spec: FaultSpec, *, read_only: bool = False,
             producer_id: int | None = None, **overrides: Any) -> tuple[kvlog.Store, TortureStorage]:
        """Open the store in this process (the shared clock, the run's settings plus ``overrides``)."""
        self.put_back_race_deleted()
        storage = self.storage(label, spec)
        settings = {"on_storage_behind": self.on_storage_behind(), **self.settings, **overrides, **self.forced}
        try:
            store = kvlog.open(storage, cache_dir=cache, clock=self.clock, read_only=read_only,
                               producer_id=None if read_only else producer_id, **settings)
        except BaseException:
            storage.close()
            raise
        return store, storage

    def put_back_race_deleted(self) -> None:
        """The operator's repair after garbage collection raised that it was deleting while the
        root was put back: the objects of the copy deleted by a thread that had not read the
        head since the restore go back (only those; any other missing object stays a finding)."""
        gate = self.gate
        if not gate.race_deleted:
            return
        raw = self.backend.raw()
        try:
            with gate.exclusive():
                names = sorted(n for n in gate.race_deleted if n in self.restored_copy and not raw.exists(n))
                for name in names:
                    raw.put(name, self.restored_copy[name])
                gate.race_deleted.clear()
        finally:
            raw.close()
        if names:
            self.log(f"put back {len(names)} object(s) of the copy deleted by garbage collection "
                     f"decided before the restore: {', '.join(names[:4])}{' …' if len(names) > 4 else ''}")

    def on_storage_behind(self) -> str:
        """What an open does with a cache of commits storage lost: a deliberate restore of the
        root takes commits away, so after one the loss is accepted ("rebuild"); before any, a
        cache ahead of storage is a finding, and opening raises."""
        return "rebuild" if self.restore_count else "raise"

    def partition_of(self, key: str) -> int:
        from kvlog.log.records import partition_for_key

        return partition_for_key(key.encode(), self.partitions)
