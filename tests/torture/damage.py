"""The damage scenario: storage damaged under a store; ``check()`` must say so, reads must not lie.

A writer fills a store (durable puts, batches, deletes, a compaction now and then), reads some
keys back (so some batches sit decoded in its cache), and then the seed damages the root in one
of these ways:

``flip``
    one byte of a live batch of a live data file is flipped (read, change, write back);
``flip-file``
    one byte anywhere in a live data file is flipped;
``delete-commit``
    the newest commit is deleted: the head (``log/head.json``) and its copy ``log/<v>.json``
    (the copy alone is no loss: a writer puts it back from the head).

Expected: ``check()`` on the writer's handle names the damaged object (its name, or the commit's
version), and so does a handle with a new cache (its ``check()``, or its open failing with the
name) for damaged data files; no read (get, scan, changelog) on either handle returns a value
the key never had - an error is fine, a wrong answer is not. After ``delete-commit`` the new handle
may show the key as it was before the lost commit (the damage lost that write), never anything else.
"""

from __future__ import annotations

import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import kvlog
from kvlog.errors import KvlogError, StorageBehindError
from kvlog.log.head import HEAD_NAME
from kvlog.log.naming import commit_name

from .model import make_value, parse_value
from .ops import classify
from .runner import RunResult
from .storage import FaultSpec
from .world import Backend, World, store_settings

__all__ = ["DAMAGES", "run_damage"]

DAMAGES = ("flip", "flip", "flip-file", "delete-commit")


def _fill(store: kvlog.Store, rng: random.Random, keys: list[str]) -> dict[str, list[bytes | None]]:
    """Durable writes; returns every key's values in order (None: deleted)."""
    history: dict[str, list[bytes | None]] = {k: [] for k in keys}
    counter = 0
    for _round in range(rng.randint(4, 10)):
        with store.batch() as b:
            for _ in range(rng.randint(1, 8)):
                key = rng.choice(keys)
                counter += 1
                if rng.random() < 0.15:
                    b.delete(key)
                    history[key].append(None)
                else:
                    value = make_value("d", key, counter, rng.choice([0, 30, 200, 1500]))
                    b.put(key, value)
                    history[key].append(value)
        for _ in range(rng.randint(0, 4)):
            key = rng.choice(keys)
            counter += 1
            value = make_value("d", key, counter, rng.choice([0, 30, 1500]))
            store.put(key, value, sync=True)
            history[key].append(value)
        if rng.random() < 0.3:
            store.compact(force=True)
    return history


def _live_batches(store: kvlog.Store) -> list[dict[str, Any]]:
    parts = store.log.partitions
    return list(store.log.snapshot(lambda r: [b for p in range(parts) for b in r.iter_batches(p, 0)]))


def _names_damage(findings: list[str], damaged: str, version: int | None) -> bool:
    for line in findings:
        if damaged in line:
            return True
        if version is not None and re.search(rf"(?<!\d){version}(?!\d)", line) and "commit" in line.lower():
            return True
    return False


def run_damage(seed: int, backend: Backend, workdir: Path, *, keep: bool = False, kind: str | None = None) -> RunResult:
    """Run the damage scenario of ``seed``; violations as in :class:`RunResult`."""
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rng = random.Random(seed)
    world = World(seed, backend, workdir)
    kind = kind or rng.choice(DAMAGES)
    partitions = rng.choice([1, 2, 4])
    world.partitions = partitions
    world.settings = {**store_settings(random.Random(seed + 1)), "background_compaction": False,
                      "flush_interval_ms": 0}
    world.log(f"damage seed {seed} kind {kind} partitions {partitions} backend {backend.kind}")
    violations: list[str] = []
    keys = [f"d/k{i:03d}" for i in range(rng.randint(4, 30))]
    writer = fresh = None
    try:
        writer, _storage = world.open("writer", world.cache_dir("writer"), FaultSpec(), partitions=partitions)
        history = _fill(writer, rng, keys)
        latest = {k: (v[-1] if v else None) for k, v in history.items()}
        warm = rng.random() < 0.7
        if warm:
            for key in keys:
                writer.get(key)
            list(writer.changes())
        raw = backend.raw()
        version: int | None = None
        if kind == "delete-commit":
            version = writer.log.version
            damaged = commit_name(version)
            raw.delete(damaged)
            raw.delete(HEAD_NAME)
        else:
            batches = _live_batches(writer)
            batch = rng.choice(batches)
            damaged = batch.path
            data = bytearray(raw.read(damaged))
            if kind == "flip":
                at = batch.position + rng.randrange(batch.length)
            else:
                at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
            raw.put(damaged, bytes(data))
            world.log(f"flipped byte {at} of {damaged} (batch at {batch.position}+{batch.length} of "
                      f"{len(data)} bytes)")
        raw.close()
        world.log(f"damaged {damaged} (cache warm: {warm})")
        # The writer's handle: check() names it, reads never lie.
        findings = writer.check()
        world.log(f"writer check(): {findings}")
        if not _names_damage(findings, damaged, version):
            violations.append(f"the writer's check() does not name the damaged {damaged} ({kind}, cache "
                              f"{'warm' if warm else 'cold'}): {findings[:5]}")
        violations += _reads(writer, "the writer", keys, latest, history, strict=True)
        # A handle with a new cache.
        try:
            fresh = kvlog.open(backend.raw(), read_only=True, cache_dir=world.fresh_cache("fresh"), **world.settings)
        except KvlogError as e:
            world.log(f"a new cache: open raised {classify(e)}")
            if kind != "delete-commit" and damaged not in str(e):
                violations.append(f"a new cache: open raised {classify(e)}, not naming {damaged}")
        else:
            findings = fresh.check()
            world.log(f"a new cache: check(): {findings}")
            if kind != "delete-commit" and not _names_damage(findings, damaged, None):
                violations.append(f"a new cache: check() does not name the damaged {damaged} ({kind}): {findings[:5]}")
            violations += _reads(fresh, "a new cache", keys, latest, history, strict=kind != "delete-commit")
        # The writer's cache reopened: after ``delete-commit`` it holds a commit storage lost, so
        # the open names it and changes nothing, until the loss is accepted.
        writer.close(flush=False)
        writer = None
        if kind == "delete-commit":
            violations += _reopen_behind(world, damaged)
    except Exception as e:  # noqa: BLE001 - reported
        import traceback

        violations.append(f"the damage run itself failed: {classify(e)}\n{traceback.format_exc()}")
    finally:
        for store in (fresh, writer):
            if store is not None:
                try:
                    store.close(flush=False)
                except Exception:  # noqa: BLE001 - closing a damaged store may fail
                    pass
    result = RunResult(seed, backend.kind, f"damage:{kind}", violations, time.monotonic() - started, workdir)
    world.log(result.report(limit=100))
    world.close()
    if result.ok and not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _reopen_behind(world: World, damaged: str) -> list[str]:
    """Reopen the writer's cache after its newest commit was deleted: the default open raises
    :class:`StorageBehindError` naming the commit; ``on_storage_behind="rebuild"`` opens, and
    its ``check()`` is clean."""
    try:
        store, _storage = world.open("writer", world.cache_dir("writer"), FaultSpec(), on_storage_behind="raise")
    except StorageBehindError as e:
        if damaged not in str(e):
            return [f"reopening the writer's cache raised StorageBehindError not naming {damaged}: {e}"]
        world.log(f"reopening the writer's cache: {classify(e)}")
    else:
        store.close()
        return [f"reopening the writer's cache after {damaged} was deleted did not raise StorageBehindError"]
    store, _storage = world.open("writer", world.cache_dir("writer"), FaultSpec(), on_storage_behind="rebuild")
    try:
        findings = store.check()
    finally:
        store.close(flush=False)
    return [f"the writer's cache rebuilt: check() found {findings[:5]}"] if findings else []


def _reads(store: kvlog.Store, who: str, keys: list[str], latest: dict[str, bytes | None],
           history: dict[str, list[bytes | None]], *, strict: bool) -> list[str]:
    """Every read either raises or returns the key's latest value (``strict``) or one it had."""
    out: list[str] = []

    def allowed(key: str, value: bytes | None) -> bool:
        if strict:
            return value == latest.get(key)
        return value is None or value in history.get(key, [])

    for key in keys:
        try:
            got = store.get(key)
        except KvlogError:
            continue
        if not allowed(key, got):
            out.append(f"{who}: get({key!r}) returned {got[:40] if got else got!r}, which is wrong")
    try:
        for k, v in store.scan():
            key = k.decode("latin-1")
            if key not in history or not allowed(key, v):
                out.append(f"{who}: scan returned {key!r} = {v[:40]!r}, which is wrong")
    except KvlogError:
        pass
    try:
        for record in store.changes():
            if record.value is None:
                continue
            parsed = parse_value(record.value)
            key = record.key.decode("latin-1")
            if parsed is None or parsed[1] != key or record.value not in history.get(key, []):
                out.append(f"{who}: changes() returned {key!r} = {record.value[:40]!r}, never written")
    except KvlogError:
        pass
    return out
