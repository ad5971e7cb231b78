"""The lifecycle scenarios' child processes: ``python -m tests.torture.lifeworker SPEC.json``.

Each child opens the store as an application does - ``kvlog.open(path, cache_dir=...)``, no
producer id, no fault injection, the default settings unless the spec gives some - and ends as
the spec's ``end`` says, the way programs end:

``exit``
    returns from ``main`` without ever calling ``close()`` (the interpreter exits normally);
``close``
    ``store.close()`` then exits;
``sigterm-handler`` / ``sigint`` / ``sigterm-raw``
    writes on until the parent sends SIGTERM (with the ``sys.exit(143)`` handler installed),
    SIGINT (Python's KeyboardInterrupt) or SIGTERM with no handler (a crash).

Before its end, ``drops`` times, it drops its handle (``del store; gc.collect()``) and opens a
new one. ``mode``:

``life``
    a writer (above) of its own keys;
``fill``
    a writer of large values with ``put(sync=True)`` until the disk is full: writes must fail
    with :class:`kvlog.StorageError`, never anything else, and the process must not crash;
``consumer``
    a member of a consumer group: reads part of the log, commits, says ``idle`` and waits for
    the go file, then reads on until it reaches the end offsets the go file names.

The journal (JSON lines) tells the parent everything: ``w`` a write about to be made (as
:class:`~.model.Journal` writes them), ``ret`` the counters of writes whose call returned,
``ack`` writes kvlog said are durable (``cs``: those counters; ``upto``: every returned write of
handle ``g`` up to that counter), ``rec`` a record a consumer read, ``x`` a violation, ``n`` a
note. Which writes a normal exit or a handled signal acknowledges is the parent's to decide (it
sees the exit status).
"""

from __future__ import annotations

import gc
import json
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import kvlog
from kvlog.errors import KvlogError, ProducerFencedError, StorageError

from .model import Journal, key_name
from .ops import classify

__all__ = ["main", "LIFE_OPS"]

#: A lifecycle writer's operations and their weights (mostly buffered puts: what an exit must flush).
LIFE_OPS = {"put": 8, "put_sync": 1, "delete": 1, "batch": 1, "flush": 0.4, "get": 1}


class Child:
    """The journal of a child, with helpers for the lines the parent reads."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.writer = str(spec["writer"])
        self.journal = Journal(self.writer, int(spec.get("counter_start", 0)), Path(spec["journal"]))
        self.returned: list[int] = []

    def line(self, obj: dict[str, Any]) -> None:
        self.journal.line(obj)

    def violation(self, text: str) -> None:
        self.line({"t": "x", "text": f"{self.writer}: {text}"})

    def note(self, text: str) -> None:
        self.line({"t": "n", "text": text})

    def open(self, **extra: Any) -> kvlog.Store:
        settings = dict(self.spec.get("settings") or {})
        settings.update(extra)
        return kvlog.open(self.spec["root"], cache_dir=self.spec["cache_dir"], **settings)


def _write_op(child: Child, store: kvlog.Store, gen: int, rng: random.Random, keys: int, pad: int) -> None:
    """One operation of a lifecycle writer, journaled: ``w`` before, ``ret``/``ack`` after."""
    names = sorted(LIFE_OPS)
    kind = rng.choices(names, [LIFE_OPS[n] for n in names])[0]
    journal = child.journal

    def key() -> str:
        return key_name(child.writer, rng.randrange(keys))

    def size() -> int:
        return rng.randint(pad // 2, pad) if pad else rng.randint(0, 200)

    made: list[int] = []
    if kind in ("put", "put_sync"):
        k = key()
        value = journal.next_value(k, size())
        made.append(journal.record(k, value, gen).counter)
        store.put(k, value, sync=kind == "put_sync")
    elif kind == "delete":
        k = key()
        made.append(journal.record(k, None, gen).counter)
        store.delete(k)
    elif kind == "batch":
        with store.batch() as b:
            for _ in range(rng.randint(1, 4)):
                k = key()
                value = journal.next_value(k, size())
                made.append(journal.record(k, value, gen).counter)
                b.put(k, value)
    elif kind == "flush":
        store.flush()
        child.line({"t": "ack", "g": gen, "upto": journal.counter, "ns": time.monotonic_ns()})
        return
    else:
        k = key()
        got = store.get(k)
        if got is not None:
            child.line({"t": "o", "k": k, "v": got.decode("latin-1"), "c": False, "where": "get"})
        return
    child.line({"t": "ret", "cs": made})
    if kind in ("put_sync", "batch"):
        child.line({"t": "ack", "cs": made, "ns": time.monotonic_ns()})


def _guarded(child: Child, store: kvlog.Store, gen: int, rng: random.Random, keys: int, pad: int,
             expect_full: bool) -> str | None:
    """One operation; the name of the error it raised (None if none). A fenced default-producer
    handle, or any error outside a full disk, is a violation."""
    try:
        _write_op(child, store, gen, rng, keys, pad)
    except ProducerFencedError as e:
        child.violation(f"a handle opened with default arguments was fenced: {classify(e)}")
        return type(e).__name__
    except StorageError as e:
        if not expect_full:
            child.violation(f"a write raised {classify(e)}")
        child.note(f"write raised {classify(e)}")
        return type(e).__name__
    except KvlogError as e:
        if expect_full:
            child.violation(f"a write on a full disk raised {classify(e)}, not StorageError")
        else:
            child.violation(f"a write raised {classify(e)}\n{traceback.format_exc(limit=6)}")
        return type(e).__name__
    return None


def run_life(child: Child, *, expect_full: bool = False) -> int:
    spec = child.spec
    rng = random.Random(spec["seed"])
    end = spec["end"]
    keys = int(spec.get("keys", 8))
    pad = int(spec.get("pad", 0))
    if end == "sigterm-handler":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print("ready", flush=True)
    go = spec.get("go_file")
    if go:
        while not os.path.exists(go):
            time.sleep(0.0005)
    gen = int(spec["gen"])
    try:
        store = child.open()
    except KvlogError as e:
        child.violation(f"opening with default arguments raised {classify(e)}")
        return 0
    child.line({"t": "open", "g": gen})
    errors = 0
    for phase in range(int(spec.get("drops", 0)) + 1):
        if phase:
            # Drop the handle without closing it: what it buffered must reach the store.
            del store
            gc.collect()
            child.line({"t": "ack", "g": gen, "upto": child.journal.counter, "ns": time.monotonic_ns(),
                        "why": "dropped"})
            gen += 1
            try:
                store = child.open()
            except KvlogError as e:
                child.violation(f"opening again after dropping a handle raised {classify(e)}")
                return 0
            child.line({"t": "open", "g": gen})
        for _ in range(int(spec["ops"])):
            if _guarded(child, store, gen, rng, keys, pad, expect_full) is not None:
                errors += 1
                if expect_full and errors >= int(spec.get("full_errors", 3)):
                    break
    child.line({"t": "phase", "g": gen, "text": "ops done"})
    if end in ("sigterm-handler", "sigint", "sigterm-raw"):
        child.line({"t": "waiting"})
        while True:  # until the signal; a handled one raises here (or inside kvlog)
            _guarded(child, store, gen, rng, keys, pad, expect_full)
    if end == "close":
        try:
            store.close()
            child.line({"t": "ack", "g": gen, "upto": child.journal.counter, "ns": time.monotonic_ns(),
                        "why": "closed"})
        except StorageError as e:
            if not expect_full:
                child.violation(f"close raised {classify(e)}")
            child.note(f"close raised {classify(e)}")
    child.line({"t": "end", "g": gen})
    return 0  # "exit": the store is still open; the interpreter's exit is the acknowledgement point


def run_consumer(child: Child) -> int:
    spec = child.spec
    try:
        store = child.open()
        consumer = store.consumer(spec["group"])
        first = int(spec["first"])
        got = 0
        while got < first:
            records = consumer.poll(timeout_s=0.2, max_records=rng_max(spec, got))
            if not records:
                break
            for r in records:
                child.line({"t": "rec", "p": r.partition, "o": r.offset, "k": r.key.decode("latin-1"),
                            "v": None if r.value is None else r.value.decode("latin-1")})
            got += len(records)
        consumer.commit()
        child.line({"t": "committed", "pos": {str(p): consumer.position(p) for p in consumer.partitions}})
        print("idle", flush=True)
        go = Path(spec["go_file"])
        while not go.exists():
            time.sleep(0.005)
        ends = {int(p): int(e) for p, e in json.loads(go.read_text()).items()}
        deadline = time.monotonic() + float(spec.get("limit_s", 60))
        while time.monotonic() < deadline:
            if all(consumer.position(p) >= ends.get(p, 0) for p in consumer.partitions):
                break
            records = consumer.poll(timeout_s=0.2, max_records=200)
            for r in records:
                child.line({"t": "rec", "p": r.partition, "o": r.offset, "k": r.key.decode("latin-1"),
                            "v": None if r.value is None else r.value.decode("latin-1")})
        else:
            child.violation(f"the consumer did not reach the end offsets {ends} in time: positions "
                            f"{ {p: consumer.position(p) for p in consumer.partitions} }")
        consumer.commit()
        child.line({"t": "end", "pos": {str(p): consumer.position(p) for p in consumer.partitions}})
        consumer.close()
        store.close()
    except Exception as e:  # noqa: BLE001 - a consumer that raises is the finding
        child.violation(f"the consumer raised {classify(e)}\n{traceback.format_exc(limit=8)}")
    return 0


def rng_max(spec: dict[str, Any], got: int) -> int:
    """Records per poll before idling: at most what is left of ``first``."""
    return max(1, min(int(spec.get("batch", 7)), int(spec["first"]) - got))


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    child = Child(spec)
    mode = spec["mode"]
    if mode == "life":
        return run_life(child)
    if mode == "fill":
        return run_life(child, expect_full=True)
    if mode == "consumer":
        return run_consumer(child)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
