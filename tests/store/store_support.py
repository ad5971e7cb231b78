"""Shared helpers of the Store tests: where a store lives, how to open it, subprocesses.

A :class:`Root` is one store location (a local directory or an ``s3://`` prefix
on the test SeaweedFS server) plus a private directory for metadata caches.
``root.open()`` opens the store the way a process with cache ``"main"`` would;
``root.open(cache="other")`` gives the handle its own LMDB cache, as a second
process would have, so it only learns about commits by replaying the log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kvlog

#: The repository root, put on a child process's PYTHONPATH so it imports this kvlog.
REPO = Path(kvlog.__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent

#: Nothing flushes except explicit flush(), sync writes, batch exits and close():
#: the durable state is exactly what the model says (crash-and-reopen semantics).
EXPLICIT_FLUSH: dict[str, Any] = {
    "flush_interval_ms": 0,
    "flush_bytes": 1 << 30,
    "max_unflushed_bytes": 1 << 30,
    "background_compaction": False,
}

#: The env variable that carries a child's JSON spec (storage options hold a secret: not argv).
SPEC_ENV = "KVLOG_TEST_SPEC"


@dataclass
class Root:
    """One store location and a directory for its metadata caches."""

    kind: str
    uri: str
    storage_options: dict[str, Any] | None
    workdir: Path

    def cache_dir(self, cache: str | None) -> Path | None:
        """The LMDB cache of handle ``cache`` (None on a local store: the store's own cache)."""
        if cache is None and self.kind == "local":
            return None
        return self.workdir / f"cache-{cache or 'main'}"

    def open(self, *, cache: str | None = None, **kwargs: Any) -> kvlog.Store:
        """Open the store with the LMDB cache of handle ``cache``."""
        return kvlog.open(
            self.uri, storage_options=self.storage_options, cache_dir=self.cache_dir(cache), **kwargs
        )

    def spec(self, cache: str | None = None, **extra: Any) -> dict[str, Any]:
        """A JSON-able description a child process opens the store from."""
        cache_dir = self.cache_dir(cache)
        return {
            "uri": self.uri,
            "storage_options": self.storage_options,
            "cache_dir": None if cache_dir is None else str(cache_dir),
            **extra,
        }


def child_env(spec: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment of a child process: this kvlog importable, the spec in :data:`SPEC_ENV`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if spec is not None:
        env[SPEC_ENV] = json.dumps(spec)
    return env


def python_script(name: str) -> list[str]:
    """argv that runs helper script ``name`` of this directory with this interpreter."""
    return [sys.executable, str(HERE / name)]


def run_script(name: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run a helper script to completion and return the JSON it prints last."""
    done = subprocess.run(
        python_script(name), env=child_env(spec), capture_output=True, text=True, timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{name} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, f"{name} printed nothing; stderr:\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


#: Values past ``inline_value_bytes``: they live in the data files only.
PAD = "x" * 1100


def fill_old(root: Root, keys: int, flushes: int, settings: dict[str, Any], partitions: int = 2,
             width: int = 3) -> list[str]:
    """Write ``keys`` keys ``k000``… (``width`` digits) with the value ``old-<key>|`` and
    :data:`PAD`, in ``flushes`` flushes (so as many data files); the key names."""
    names = [f"k{i:0{width}d}" for i in range(keys)]
    with root.open(partitions=partitions, **settings) as store:
        for n, key in enumerate(names):
            store.put(key, f"old-{key}|{PAD}")
            if (n + 1) % (keys // flushes) == 0:
                store.flush()
    return names


def replay_from(root: Root, positions: dict[int, int]) -> list[tuple[int, int, bytes, bytes | None]]:
    """What a fresh reader of ``root`` reads from ``positions`` (offset by partition), as
    ``(partition, offset, key, value)``."""
    with root.open(cache="fresh", read_only=True) as fresh:
        return [(r.partition, r.offset, r.key, r.value)
                for p, at in sorted(positions.items()) for r in fresh.log.read(p, at)]


def visible(store: kvlog.Store) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of ``store`` in key order."""
    return list(store.scan())


def apply_records(view: dict[bytes, bytes], records: list[kvlog.Record]) -> None:
    """Apply changelog ``records`` to ``view`` in order, as a consumer's view does (a tombstone
    removes its key)."""
    for record in records:
        if record.value is None:
            view.pop(record.key, None)
        else:
            view[record.key] = record.value
