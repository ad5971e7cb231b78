"""The harness's child processes: ``python -m tests.torture.worker SPEC.json``.

``mode`` in the spec:

``writer``
    open the store (through a :class:`~.storage.TortureStorage` with the spec's faults) and run
    one writer's seeded operations until the stop file appears, journaling every write and
    acknowledgement to the journal file; a simulated crash ends the process at once
    (``os._exit``), as a real crash would. The parent may also ``kill -9`` it at any moment.
``verify``
    open the store read-only with a brand-new cache and write what it sees (scan, a get of every
    key, the whole changelog, end offsets, ``check()`` findings) as JSON to the output file.

Storage options (they hold a secret) come in the environment, never in the spec file.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import kvlog
from kvlog.errors import KvlogError
from kvlog.storage import LocalStorage, Storage, open_storage
from kvlog.storage.faulty import SimulatedCrash

from .model import Journal
from .ops import Lane, OpMix, classify, next_op
from .storage import FaultSpec, TortureStorage

__all__ = ["OPTIONS_ENV", "raw_storage", "main"]

#: The environment variable that carries the storage options of an s3 root.
OPTIONS_ENV = "KVLOG_TORTURE_STORAGE_OPTIONS"
#: Exit status of a child whose storage simulated a crash.
CRASH_EXIT = 77


def raw_storage(spec: dict[str, Any]) -> Storage:
    """A fault-free storage of the spec's root (local without fsync: the harness only needs order)."""
    if spec["backend"] == "local":
        return LocalStorage(spec["root"], fsync=False)
    return open_storage(spec["root"], json.loads(os.environ.get(OPTIONS_ENV, "{}")))


class ChildSink:
    """Reports of a child, as journal lines the parent reads back."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._lock = threading.Lock()
        self._observed: dict[str, tuple[int, str]] = {}

    def violation(self, text: str) -> None:
        with self._lock:
            self.journal.line({"t": "x", "text": text})

    def note(self, text: str) -> None:
        with self._lock:
            self.journal.line({"t": "n", "text": text})

    def saw(self, key: str, value: bytes | None, *, committed: bool, where: str) -> None:
        if value is None:
            return
        with self._lock:
            self.journal.line({"t": "o", "k": key, "v": value.decode("latin-1"), "c": committed, "where": where})


def _wait_for(path: str | None) -> None:
    if path is None:
        return
    while not os.path.exists(path):
        time.sleep(0.0005)


def _crash_hook(args: threading.ExceptHookArgs) -> None:
    if isinstance(args.exc_value, SimulatedCrash):
        os._exit(CRASH_EXIT)
    sys.__excepthook__(args.exc_type, args.exc_value, args.exc_traceback)  # type: ignore[arg-type]


def run_writer(spec: dict[str, Any]) -> None:
    """One writer process: open, write until told to stop, close as the spec says."""
    threading.excepthook = _crash_hook
    journal = Journal(spec["writer"], int(spec["counter_start"]), Path(spec["journal"]))
    sink = ChildSink(journal)
    mix = OpMix.from_json(spec["mix"])
    lane = Lane(spec["writer"], journal, sink, mix)
    rng = random.Random(spec["seed"])
    gen = int(spec["gen"])
    max_ops = spec.get("max_ops")
    print("ready", flush=True)
    _wait_for(spec.get("go_file"))
    journal.line({"t": "n", "text": f"started pid {os.getpid()}"})
    store: kvlog.Store | None = None
    try:
        opens = 0
        while store is None:
            opens += 1
            faults = FaultSpec.from_json(spec["faults"])
            # Seeded faults repeat with the same seed: each attempt draws afresh, the later ones none.
            faults.seed += opens
            if opens > 5:
                faults = FaultSpec()
            storage = TortureStorage(raw_storage(spec), faults, label=spec["writer"])
            try:
                # After a deliberate restore of the root, the cache may hold commits it took away.
                behind = "rebuild" if os.path.exists(spec["restored_file"]) else "raise"
                store = kvlog.open(storage, cache_dir=spec["cache_dir"], producer_id=spec.get("producer_id"),
                                   on_storage_behind=behind, **spec["settings"])
            except KvlogError as e:
                sink.note(f"open #{opens} raised {classify(e)}")
                if opens >= 20:
                    sink.violation(f"{spec['writer']}: could not open the store in {opens} attempts: {classify(e)}")
                    return
                storage.quiet()
                time.sleep(0.01)
        journal.line({"t": "open", "g": gen, "epoch": store.stats()["producer_epoch"]})
        done = 0
        while not os.path.exists(spec["stop_file"]) and (max_ops is None or done < max_ops):
            op = next_op(rng, mix, frozenset(spec["ops"]) if spec.get("ops") else None)
            journal.line({"t": "op", "op": op})
            outcome = lane.run(store, gen, op)
            done += 1
            if outcome in ("crash", "recover"):
                # A writer process that crashes, or that kvlog told to reopen: the parent starts the
                # next incarnation (a new epoch); whatever was buffered here is lost.
                journal.line({"t": "n", "text": f"ends with {outcome}"})
                journal.close()
                os._exit(CRASH_EXIT)
            if outcome == "reopen":
                store.close()
                lane._ack(gen)
                journal.close()
                os._exit(CRASH_EXIT)
        if spec.get("final") == "crash":
            journal.line({"t": "n", "text": "final: close(flush=False)"})
            store.close(flush=False)
        else:
            store.close()
            lane._ack(gen)
        store = None
        journal.line({"t": "done"})
    except SimulatedCrash as e:
        journal.line({"t": "n", "text": f"simulated crash: {e}"})
        journal.close()
        os._exit(CRASH_EXIT)
    except KvlogError as e:
        journal.line({"t": "n", "text": f"close raised {classify(e)}"})
    finally:
        journal.close()


def run_verify(spec: dict[str, Any]) -> None:
    """Open read-only with a fresh cache and report everything the store shows."""
    out: dict[str, Any] = {"name": spec["name"], "scan": None, "gets": {}, "changes": None, "ends": {},
                           "findings": [], "errors": []}
    try:
        store = kvlog.open(raw_storage(spec), read_only=True, cache_dir=spec["cache_dir"],
                           **spec.get("settings", {}))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        out["errors"].append(f"opening raised {classify(e)}")
        Path(spec["output"]).write_text(json.dumps(out))
        return
    try:
        out["partitions"] = store.log.partitions
        for step in ("check", "deep", "scan", "gets", "changes"):
            try:
                if step == "check":
                    out["findings"].extend(store.check())
                elif step == "deep":
                    from kvlog.check import check_store

                    deep = [f for f in check_store(store.log, deep=True) if f not in out["findings"]]
                    out["findings"].extend(f"(deep) {f}" for f in deep)
                elif step == "scan":
                    out["scan"] = {k.decode("latin-1"): v.decode("latin-1") for k, v in store.scan()}
                elif step == "gets":
                    for key in spec["keys"]:
                        try:
                            v = store.get(key)
                            out["gets"][key] = None if v is None else v.decode("latin-1")
                        except Exception as e:  # noqa: BLE001 - a get that raises is a finding
                            out["gets"][key] = {"err": classify(e)}
                else:
                    changes: dict[str, list[Any]] = {}
                    for p in range(store.log.partitions):
                        changes[str(p)] = [[r.offset, r.key.decode("latin-1"),
                                            None if r.value is None else r.value.decode("latin-1")]
                                           for r in store.changes(p)]
                        out["ends"][str(p)] = store.log.end_offset(p)
                    out["changes"] = changes
            except Exception as e:  # noqa: BLE001 - reported to the parent
                out["errors"].append(f"{step} raised {classify(e)}\n{traceback.format_exc(limit=6)}")
    finally:
        store.close()
    Path(spec["output"]).write_text(json.dumps(out))


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    if spec["mode"] == "writer":
        run_writer(spec)
    elif spec["mode"] == "verify":
        run_verify(spec)
    else:
        raise SystemExit(f"unknown mode {spec['mode']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
