"""What the writers did and what the store must show for it: journals, history, checker.

Every writer (a thread lane, a process incarnation, a storm participant) owns its keys, so the
order of the writes to a key is the writer's program order, numbered by a per-writer counter
that keeps growing across reopens and process incarnations. Every value is unique and names its
writer, key and counter (:func:`make_value`), so a value read anywhere says which write it is.

A write is *acknowledged* when kvlog said it is durable: ``put(sync=True)``/``delete(sync=True)``
returned, a ``with store.batch()`` exited normally, ``flush()`` or ``close()`` returned after it
(each acknowledges every earlier write of its handle). A write whose call raised, or that was
buffered when its handle crashed, is a *maybe*: it may or may not be there. A write a read-only
handle (or any changelog read) saw is committed, hence durable too (an *observation*).

After a run, for every key: the value read must be the one of the latest firm write of the key
(acknowledged or observed) or of a later write (a maybe or a newer one); with no firm write the
key may also be absent. A restore of the root from an older snapshot makes a firm write a maybe
again when its commit may have landed between the snapshot and the end of the restore (that loss
is the restore's). A write's commit lands at some moment between the start of the call that made
the write and its acknowledgement, so the write is a maybe again when that span, not only its
acknowledgement, meets the restore's: a ``put_sync`` whose commit landed before the restore put
the old files back, but whose call returned after it, lost its write to the restore; so did a
buffered ``put`` that a background flush committed before the restore and a ``flush()`` after
the restore acknowledged.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "make_value", "parse_value", "key_name", "Write", "Journal", "History", "FinalView",
    "check_final", "check_changelog_chunk",
]

#: Values above ``inline_value_bytes`` live in data files only; the pad makes some of them so.
SEP = "|"


def key_name(writer: str, index: int) -> str:
    """The ``index``-th key of ``writer`` (keys name their owner; owners never share keys)."""
    return f"{writer}/k{index:03d}"


def owner_of(key: str) -> str:
    """The writer that owns ``key``."""
    return key.rsplit("/", 1)[0]


def make_value(writer: str, key: str, counter: int, pad: int) -> bytes:
    """The unique value of the ``counter``-th write of ``writer``, to ``key``, padded by ``pad`` bytes."""
    head = f"{writer}{SEP}{key}{SEP}{counter}{SEP}".encode()
    return head + bytes(ord("a") + (counter + i) % 26 for i in range(pad))


def parse_value(value: bytes) -> tuple[str, str, int] | None:
    """``(writer, key, counter)`` of a value :func:`make_value` made (None if malformed)."""
    try:
        writer, key, counter, pad = value.decode("ascii").split(SEP, 3)
        n = int(counter)
    except (UnicodeDecodeError, ValueError):
        return None
    if any(c != chr(ord("a") + (n + i) % 26) for i, c in enumerate(pad)):
        return None
    return writer, key, n


@dataclass
class Write:
    """One write (a put, or a delete when ``value`` is None) and what is known of its fate.

    ``made_ns``: when the call that made it began (monotonic); ``acked_ns``: when kvlog said it
    is durable. Its commit landed in between, if it landed.
    """

    writer: str
    counter: int
    key: str
    value: bytes | None
    gen: int
    made_ns: int
    acked_ns: int | None = None

    @property
    def label(self) -> str:
        what = "delete" if self.value is None else f"put {len(self.value)} B"
        return f"{self.writer}#{self.counter} {what} {self.key} (gen {self.gen})"


class Journal:
    """The writes of one writer in program order, and their acknowledgements.

    In a process the journal is also a file of JSON lines (one line per write before it is
    made, one per acknowledgement after it), so a killed process leaves its story behind.
    """

    def __init__(self, writer: str, counter_start: int = 0, path: Path | None = None) -> None:
        self.writer = writer
        self.writes: list[Write] = []
        self.counter = counter_start
        self._pending: list[Write] = []
        self._file = open(path, "a", buffering=1) if path is not None else None  # noqa: SIM115
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def line(self, obj: dict[str, Any]) -> None:
        """Append a JSON line to the journal file (processes only)."""
        if self._file is not None:
            self._file.write(json.dumps(obj) + "\n")

    def record(self, key: str, value: bytes | None, gen: int) -> Write:
        """Record a write about to be made (stamped with the time its call begins) and return it."""
        with self._lock:
            self.counter += 1
            w = Write(self.writer, self.counter, key, value, gen, time.monotonic_ns())
            self.writes.append(w)
            self._pending.append(w)
        self.line({"t": "w", "c": w.counter, "k": key, "v": None if value is None else value.decode("latin-1"),
                   "g": gen, "ns": w.made_ns})
        return w

    def next_value(self, key: str, pad: int) -> bytes:
        """The value the next write to ``key`` will carry."""
        return make_value(self.writer, key, self.counter + 1, pad)

    def ack(self, gen: int) -> None:
        """Every write of generation ``gen`` made so far is durable."""
        now = time.monotonic_ns()
        with self._lock:
            keep = []
            last = 0
            for w in self._pending:
                if w.gen == gen:
                    w.acked_ns = now
                    last = max(last, w.counter)
                elif w.gen > gen:
                    keep.append(w)
            self._pending = keep
        if last:
            self.line({"t": "a", "g": gen, "c": last, "ns": now})

    @staticmethod
    def parse(path: Path, writer: str) -> tuple[list[Write], list[dict[str, Any]]]:
        """The writes of a process journal file, and its other lines (errors, observations, notes)."""
        writes: list[Write] = []
        other: list[dict[str, Any]] = []
        if not path.exists():
            return writes, other
        pending: list[Write] = []
        for raw in path.read_text(errors="replace").splitlines():
            try:
                obj = json.loads(raw)
            except ValueError:
                continue  # the last line of a killed process may be cut
            kind = obj.get("t")
            if kind == "w":
                value = None if obj["v"] is None else obj["v"].encode("latin-1")
                w = Write(writer, int(obj["c"]), obj["k"], value, int(obj["g"]), int(obj["ns"]))
                writes.append(w)
                pending.append(w)
            elif kind == "a":
                keep = []
                for w in pending:
                    if w.gen == obj["g"] and w.counter <= obj["c"]:
                        w.acked_ns = int(obj["ns"])
                    elif w.gen >= obj["g"]:
                        keep.append(w)
                pending = keep
            else:
                other.append(obj)
        return writes, other


@dataclass
class Observation:
    """A committed write seen by a read (counter of the newest write of ``key`` seen, and when)."""

    key: str
    counter: int
    at_ns: int


class History:
    """Everything a run did that the checker needs: writes, observations, restores, violations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.journals: list[Journal] = []
        self.extra_writes: list[Write] = []  # parsed from process journals at the end
        self.observed: dict[str, Observation] = {}
        self.seen_values: set[bytes] = set()
        #: (snapshot taken, restore's files in place), monotonic ns: a commit that landed in
        #: between is gone after the restore.
        self.restores: list[tuple[int, int]] = []
        self.violations: list[str] = []
        self.notes: list[str] = []

    def journal(self, writer: str, counter_start: int = 0) -> Journal:
        j = Journal(writer, counter_start)
        with self._lock:
            self.journals.append(j)
        return j

    def violation(self, text: str) -> None:
        with self._lock:
            if len(self.violations) < 200:
                self.violations.append(text)

    def note(self, text: str) -> None:
        with self._lock:
            self.notes.append(text)

    def saw(self, key: str, value: bytes | None, *, committed: bool, where: str) -> None:
        """A read returned ``value`` for ``key``: it must be a value written to ``key``; a committed
        read (read-only handle, changelog) also makes that write durable."""
        if value is None:
            return
        parsed = parse_value(value)
        if parsed is None or parsed[1] != key or owner_of(key) != parsed[0]:
            self.violation(f"{where}: {key!r} read a malformed or foreign value {value[:60]!r}")
            return
        with self._lock:
            self.seen_values.add(value)
            if committed:
                now = time.monotonic_ns()
                old = self.observed.get(key)
                if old is None or old.counter < parsed[2]:
                    self.observed[key] = Observation(key, parsed[2], now)

    def all_writes(self) -> list[Write]:
        out = [w for j in self.journals for w in j.writes]
        out.extend(self.extra_writes)
        return out

    def demoted(self, first_ns: int, last_ns: int) -> bool:
        """Whether a commit known to have landed between ``first_ns`` and ``last_ns`` may have
        been undone by a restore: that span meets a restore's, from its snapshot to the moment
        its files were in place (a commit before the snapshot is in the copy put back; one after
        the restore stays)."""
        return any(first_ns <= end and start <= last_ns for start, end in self.restores)


@dataclass
class FinalView:
    """What one reader saw at the end: scan, gets, changelog, ends, check findings, errors."""

    name: str
    scan: dict[str, bytes] | None
    gets: dict[str, bytes | None | str]  # str: the error the get raised
    changes: dict[int, list[tuple[int, str, bytes | None]]] | None
    ends: dict[int, int]
    findings: list[str]
    errors: list[str] = field(default_factory=list)
    partitions: int = 0

    @staticmethod
    def from_json(obj: dict[str, Any]) -> FinalView:
        def b(v: str | None) -> bytes | None:
            return None if v is None else v.encode("latin-1")

        gets: dict[str, bytes | None | str] = {}
        for k, v in obj["gets"].items():
            gets[k] = v["err"] if isinstance(v, dict) else b(v)
        return FinalView(
            obj["name"],
            None if obj["scan"] is None else {k: b(v) for k, v in obj["scan"].items()},  # type: ignore[misc]
            gets,
            None if obj["changes"] is None else {
                int(p): [(int(o), k, b(v)) for o, k, v in recs] for p, recs in obj["changes"].items()},
            {int(p): int(e) for p, e in obj["ends"].items()},
            list(obj["findings"]),
            list(obj["errors"]),
            int(obj.get("partitions", 0)),
        )


def _allowed(writes: list[Write], history: History, use_observations: bool) -> tuple[set[bytes | None], str]:
    """The values ``key`` may hold at the end (None: absent) and the firm write they follow."""
    firm = -1
    for i, w in enumerate(writes):
        if w.acked_ns is not None and not history.demoted(w.made_ns, w.acked_ns):
            firm = i
    if use_observations and writes:
        obs = history.observed.get(writes[0].key)
        # The commit a read saw landed at some moment before the read returned.
        if obs is not None and not history.demoted(0, obs.at_ns):
            for i, w in enumerate(writes):
                if w.counter == obs.counter:
                    firm = max(firm, i)
    if firm < 0:
        return {None} | {w.value for w in writes}, "no firm write"
    return {w.value for w in writes[firm:]}, writes[firm].label


def check_changelog_chunk(
    where: str, partition: int, records: Iterable[tuple[int, str, bytes | None]], history: History | None,
    *, committed: bool = True,
) -> list[str]:
    """Offsets strictly increasing, no value twice, each key's writes in counter order."""
    out: list[str] = []
    last_offset = -1
    values: set[bytes] = set()
    last_counter: dict[str, int] = {}
    for offset, key, value in records:
        if offset <= last_offset:
            out.append(f"{where}: partition {partition} offset {offset} after {last_offset} (not increasing)")
        last_offset = offset
        if value is None:
            continue
        if value in values:
            out.append(f"{where}: partition {partition}: the write {value[:40]!r} appears twice (a duplicate)")
        values.add(value)
        parsed = parse_value(value)
        if parsed is None or parsed[1] != key:
            out.append(f"{where}: partition {partition} offset {offset}: malformed value for {key!r}")
            continue
        if parsed[2] <= last_counter.get(key, -1):
            out.append(f"{where}: partition {partition} offset {offset}: {key!r} write #{parsed[2]} after "
                       f"#{last_counter[key]} (out of order)")
        last_counter[key] = parsed[2]
        if history is not None:
            history.saw(key, value, committed=committed, where=where)
    return out


def check_final(history: History, views: list[FinalView], universe: list[str],
                partition_of: Any) -> list[str]:
    """The end-of-run invariants over every final view; a list of violations (empty: all good)."""
    out: list[str] = []
    writes_by_key: dict[str, list[Write]] = {}
    by_value: dict[bytes, Write] = {}
    deleted: set[str] = set()
    for w in history.all_writes():
        writes_by_key.setdefault(w.key, []).append(w)
        if w.value is not None:
            by_value[w.value] = w
        else:
            deleted.add(w.key)
    for items in writes_by_key.values():
        items.sort(key=lambda w: w.counter)
    known = set(universe) | set(writes_by_key)
    use_observations = not history.restores
    for value in history.seen_values:
        if value not in by_value:
            out.append(f"a read during the run returned {value[:60]!r}, which no writer ever wrote")
    wrong: dict[str, list[str]] = {}  # key -> what each view got wrong about it
    for view in views:
        for err in view.errors:
            out.append(f"{view.name}: {err}")
        for finding in view.findings[:5]:
            out.append(f"{view.name}: check() found: {finding}")
        if len(view.findings) > 5:
            out.append(f"{view.name}: check() found {len(view.findings) - 5} more")
        for key in sorted(known):
            writes = writes_by_key.get(key, [])
            allowed, _after = _allowed(writes, history, use_observations)
            got = view.gets.get(key, None) if key in view.gets else None
            if isinstance(got, str):
                wrong.setdefault(key, []).append(f"{view.name}: get raised {got}")
                continue
            if key in view.gets and got not in allowed:
                wrong.setdefault(key, []).append(f"{view.name}: get = {_show(got, by_value)}")
            if view.scan is not None:
                scanned = view.scan.get(key)
                if scanned not in allowed:
                    wrong.setdefault(key, []).append(f"{view.name}: scan = {_show(scanned, by_value)}")
                if key in view.gets and not isinstance(got, str) and scanned != got:
                    out.append(f"{view.name}: scan and get disagree on {key!r}")
        if view.scan is not None:
            for key in view.scan:
                if key not in known:
                    out.append(f"{view.name}: scan holds {key!r}, a key nobody wrote")
        if view.changes is not None:
            latest: dict[str, bytes | None] = {}
            for p, records in sorted(view.changes.items()):
                out.extend(check_changelog_chunk(f"{view.name} changes()", p, records, None))
                for offset, key, record_value in records:
                    if key not in known:
                        out.append(f"{view.name}: changelog holds {key!r}, a key nobody wrote")
                        continue
                    if partition_of(key) != p:
                        out.append(f"{view.name}: {key!r} is in partition {p}, not {partition_of(key)}")
                    if offset >= view.ends.get(p, offset + 1):
                        out.append(f"{view.name}: partition {p} offset {offset} >= end offset {view.ends[p]}")
                    if record_value is None and key not in deleted:
                        out.append(f"{view.name}: a tombstone of {key!r}, which nobody deleted")
                    elif record_value is not None and record_value not in by_value:
                        out.append(f"{view.name}: changelog holds {record_value[:60]!r}, which nobody wrote")
                    latest[key] = record_value
            if view.scan is not None:
                for key in sorted(known):
                    if latest.get(key) != view.scan.get(key):
                        out.append(f"{view.name}: the changelog's latest record of {key!r} is "
                                   f"{_show(latest.get(key), by_value)} but the key index says "
                                   f"{_show(view.scan.get(key), by_value)}")
    for key, problems in sorted(wrong.items()):
        allowed, after = _allowed(writes_by_key.get(key, []), history, use_observations)
        out.append(f"{key!r}: the latest firm write is {after}, allowed {sorted(_show(v, by_value) for v in allowed)}; "
                   + "; ".join(problems))
    if len(views) > 1:
        first = views[0]
        for other in views[1:]:
            if first.changes is not None and other.changes is not None:
                for p in sorted(set(first.changes) | set(other.changes)):
                    mine, theirs = first.changes.get(p, []), other.changes.get(p, [])
                    if mine != theirs:
                        at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                                  min(len(mine), len(theirs)))
                        out.append(f"{first.name} and {other.name} disagree on partition {p}'s changelog "
                                   f"({len(mine)} vs {len(theirs)} records, first difference at record {at})")
                if first.ends != other.ends:
                    out.append(f"{first.name} and {other.name} disagree on end offsets: {first.ends} vs {other.ends}")
            if first.scan is not None and other.scan is not None and first.scan != other.scan:
                diff = sorted(k for k in set(first.scan) | set(other.scan) if first.scan.get(k) != other.scan.get(k))
                out.append(f"{first.name} and {other.name} disagree on {len(diff)} keys, e.g. "
                           + "; ".join(f"{k}: {_show(first.scan.get(k), by_value)} vs "
                                       f"{_show(other.scan.get(k), by_value)}" for k in diff[:3]))
    return out


def _show(value: bytes | None | str, by_value: dict[bytes, Write]) -> str:
    if value is None:
        return "absent"
    if isinstance(value, str):
        return value
    w = by_value.get(value)
    if w is None:
        return f"unknown {value[:40]!r}"
    state = "acked" if w.acked_ns is not None else "maybe"
    return f"{w.writer}#{w.counter}({state})"
