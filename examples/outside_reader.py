"""Read a local kvlog store without kvlog: the standard library and pyarrow only.

This program follows the on-storage format (``docs/format.rst``) and nothing else: it finds
the newest metadata checkpoint, replays the commits after it with the replay rules
(producer duplicates and fencing, refused replaces, condemned files, commits written after
a gap), gives every live record its (partition, offset), and derives the latest state.

    python examples/outside_reader.py STORE_DIR [OUT_DIR [NOW_MS]]

prints a summary; with OUT_DIR it also writes ``changelog.arrow`` (every live record:
partition, offset, timestamp, key, value, expires) and ``latest.arrow`` (one row per live
key, hiding the records expired at NOW_MS, by default the reader's clock) there as Arrow IPC
files, for DuckDB, Polars or any Arrow tool.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import sys
import time
from typing import Any

import pyarrow as pa

FORMATS = (1, 2)  # format 2: a document (a commit) may carry attached bytes after its body
SEQUENCE_MODULUS = 2**31
WINDOW = 5
PRODUCER_ID_EXPIRATION_MS = 86_400_000  # the writers' ``producer_id_expiration_ms`` (default 1 day)


class Refused(Exception):
    """Replay refuses a whole commit: it keeps its version and changes nothing else."""


# -- checksums and documents --------------------------------------------------------------------

def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC32C (Castagnoli), reflected, initial value and final XOR 0xFFFFFFFF."""
    c = 0xFFFFFFFF
    for byte in data:
        c = _TABLE[(c ^ byte) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def read_document(path: str, kind: str) -> dict[str, Any]:
    """The body of the envelope at ``path``, checked as the format says. A commit's inline
    file becomes its first added file, at the commit's own name (``log/<file name>``), its
    batch positions counted from the start of the commit object."""
    with open(path, "rb") as f:
        data = f.read()
    header_line, _, rest = data.partition(b"\n")
    header = json.loads(header_line)
    if header.get("kvlog") != kind or header.get("format") not in FORMATS:
        raise ValueError(f"{path}: not a {kind} of format {FORMATS}")
    length, attached = header["length"], header.get("data", 0) if header["format"] == 2 else 0
    body = rest[:length]
    if rest[length:length + 1] != b"\n" or len(rest) != length + 1 + attached or crc32c(body) != header["crc32c"]:
        raise ValueError(f"{path}: truncated or damaged")
    doc: dict[str, Any] = json.loads(body)
    if "inline" in doc:
        start = len(header_line) + 1 + length + 1
        inline = dict(doc.pop("inline"), path="log/" + os.path.basename(path))
        inline["batches"] = [{**b, "pos": b["pos"] + start} for b in inline["batches"]]
        doc["add"] = [inline, *doc["add"]]
    return doc


def data_start(f: Any, name: str) -> int:
    """Where the Arrow IPC file ``name`` starts in the open object ``f``: 0 for a data file,
    the attached bytes of a commit (``log/…``) that carries the file inline."""
    if not name.startswith("log/"):
        return 0
    f.seek(0)
    header_line = f.readline()
    return len(header_line) + json.loads(header_line)["length"] + 1


# -- roaring bitmaps (portable format) ----------------------------------------------------------

def roaring_values(text: str) -> list[int]:
    """The values, ascending, of a base64 portable-format roaring bitmap."""
    data = base64.b64decode(text, validate=True)
    cookie = struct.unpack_from("<I", data, 0)[0]
    if cookie & 0xFFFF == 12347:  # with run containers
        size, pos = (cookie >> 16) + 1, 4
        runs, pos = data[pos:pos + (size + 7) // 8], pos + (size + 7) // 8
    elif cookie == 12346:
        size, pos, runs = struct.unpack_from("<I", data, 4)[0], 8, b""
    else:
        raise ValueError("not a portable roaring bitmap")
    headers = [struct.unpack_from("<HH", data, pos + 4 * i) for i in range(size)]
    pos += 4 * size
    if not runs or size >= 4:
        pos += 4 * size  # the offset header, not needed when reading every container in order
    values: list[int] = []
    for i, (key, cardinality_minus_one) in enumerate(headers):
        high = key << 16
        if runs and runs[i // 8] >> (i % 8) & 1:
            (count,) = struct.unpack_from("<H", data, pos)
            for j in range(count):
                start, length = struct.unpack_from("<HH", data, pos + 2 + 4 * j)
                values.extend(range(high | start, (high | start) + length + 1))
            pos += 2 + 4 * count
        elif cardinality_minus_one < 4096:
            lows = struct.unpack_from(f"<{cardinality_minus_one + 1}H", data, pos)
            values.extend(high | low for low in lows)
            pos += 2 * (cardinality_minus_one + 1)
        else:
            words = struct.unpack_from("<1024Q", data, pos)
            values.extend(high | (64 * w + b) for w, word in enumerate(words) for b in range(64) if word >> b & 1)
            pos += 8192
    return values


# -- replay -------------------------------------------------------------------------------------

class State:
    """What replay keeps: live files and batches, partition ends, producers, condemned paths."""

    def __init__(self) -> None:
        self.version = 0
        self.head_id: str | None = None
        self.now = 0
        self.files: dict[str, dict[str, Any]] = {}      # file id -> {"path", "batches": [(p, last)]}
        self.batches: dict[tuple[int, int], dict[str, Any]] = {}  # (p, last) -> batch entry with base/last
        self.ends: dict[int, int] = {}
        self.producers: dict[int, dict[str, Any]] = {}
        self.pending: set[str] = set()
        self.condemned: set[str] = set()
        self.pins: dict[str, list[str]] = {}
        # Consumer groups: their committed offsets and states ({"last_commit_ms", "hold_ms"}),
        # and the version of the last ``offsets`` commit that started a tombstone hold or moved
        # one back (a cleaning round that read the holds before it is refused).
        self.group_offsets: dict[str, dict[int, int]] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.holds_changed = 0

    @classmethod
    def from_checkpoint(cls, body: dict[str, Any]) -> State:
        state = cls()
        state.version, state.head_id, state.now = body["version"], body.get("commit_id"), body["last_commit_ms"]
        state.files = {fid: {"path": f["path"], "batches": [tuple(b) for b in f["batches"]]}
                       for fid, f in body["files"].items()}
        state.batches = {(b["p"], b["last"]): b for b in body["batches"]}
        state.ends = {int(p): info["end"] for p, info in body["parts"].items()}
        state.producers = {obj["id"]: obj for obj in body["producers"]}
        state.pending = set(body["pending"])
        state.condemned = set(body.get("condemned", {}))
        state.pins = {name: pin["paths"] for name, pin in body.get("pins", {}).items()}
        for group, p, offset in body.get("offsets", []):
            state.group_offsets.setdefault(group, {})[p] = offset
        state.groups = dict(body.get("groups", {}))
        state.holds_changed = body.get("holds_changed", 0)
        return state

    def apply(self, commit: dict[str, Any]) -> None:
        """Apply the next commit; a refused one changes nothing but the version and "now"."""
        self.now = max(self.now, commit["ts"])
        previous, self.head_id, self.version = self.head_id, commit["id"], commit["version"]
        if commit.get("prev") is not None and previous is not None and commit["prev"] != previous:
            raise ValueError(f"commit {commit['version']} does not follow the commit before it: "
                             "the root does not hold one history (restored in part?)")
        kind = commit["kind"]
        try:
            if kind in ("append", "replace"):
                if any(f["path"] in self.condemned for f in commit["add"]):
                    raise Refused("adds a condemned file")
                (self._append if kind == "append" else self._replace)(commit)
            elif kind == "producer":
                if commit.get("pid") is None or commit.get("epoch") is None:
                    raise Refused("no producer")
                self._register(commit["pid"], commit["epoch"])
            elif kind == "gc":
                live = {f["path"] for f in self.files.values()}
                kept = live | self.pending | {p for paths in self.pins.values() for p in paths}
                self.condemned.update(path for path in commit["remove"] if path not in kept)
            elif kind in ("pin", "unpin"):
                self._pin(commit)
            elif kind == "offsets":  # no record changes, but a tombstone hold may start
                self._offsets(commit)
            else:
                raise ValueError(f"unknown commit kind {kind!r}")
        except Refused:
            return  # a refused commit keeps its version and changes nothing else

    def _append(self, commit: dict[str, Any]) -> None:
        ends: dict[int, int] = {}
        producers: dict[int, dict[str, Any] | None] = {}
        accepted: list[tuple[str, dict[str, Any], int]] = []
        for file in commit["add"]:
            for batch in file["batches"]:
                p, n = batch["p"], batch["n"]
                end = ends.setdefault(p, self.ends.get(p, 0))
                pid = batch.get("pid")
                if pid is not None:
                    if pid not in producers:
                        producers[pid] = self.producers.get(pid)
                    if is_duplicate(producers[pid], p, batch, self.now):
                        continue  # the resend of a batch the producer already wrote: never live
                    producers[pid] = accept(producers[pid], pid, p, batch, end, self.now)
                accepted.append((file["id"], {**batch, "path": file["path"], "base": end, "last": end + n - 1},
                                 p))
                ends[p] = end + n
        for fid, batch, p in accepted:
            self.batches[(p, batch["last"])] = batch
            path = next(f["path"] for f in commit["add"] if f["id"] == fid)
            self.files.setdefault(fid, {"path": path, "batches": []})["batches"].append((p, batch["last"]))
        self.ends.update(ends)
        self.producers.update({pid: s for pid, s in producers.items() if s is not None})

    def _replace(self, commit: dict[str, Any]) -> None:
        info = commit.get("info") or {}
        if info.get("cleaner"):  # a cleaning round: it may have removed what a new hold covers
            at = info.get("holds_at")
            if type(at) is not int or not 0 <= at < commit["version"]:
                at = None
            if self.holds_changed and (at is None or self.holds_changed > at):
                raise Refused("a tombstone hold started or moved back after the round read the holds")
        if any(fid not in self.files for fid in commit["remove"]):
            raise Refused("an input is no longer live")
        removed = {b for fid in commit["remove"] for b in map(tuple, self.files[fid]["batches"])}
        for file in commit["add"]:
            for b in file["batches"]:
                if "base" not in b:
                    raise Refused("an output batch without offsets")
                if any(q == b["p"] and (q, last) not in removed and other["base"] <= b["last"] and last >= b["base"]
                       for (q, last), other in self.batches.items()):
                    raise Refused("an output batch overlaps a live batch")
        for fid in commit["remove"]:
            for key in self.files[fid]["batches"]:
                del self.batches[tuple(key)]
            self.pending.add(self.files.pop(fid)["path"])
        for file in commit["add"]:
            if file["batches"]:
                self.files[file["id"]] = {"path": file["path"], "batches": [(b["p"], b["last"]) for b in file["batches"]]}
            for b in file["batches"]:
                self.batches[(b["p"], b["last"])] = {**b, "path": file["path"]}

    def _offsets(self, commit: dict[str, Any]) -> None:
        """A group's committed offsets, its hold, or its deletion (the rules of docs/format.rst)."""
        info = commit["info"]
        group, offsets, hold_ms, delete = (info.get("group"), info.get("offsets"), info.get("hold_ms"),
                                           info.get("delete", False))
        try:
            named = isinstance(group, str) and 0 < len(group.encode()) <= 255 and "\x00" not in group
        except UnicodeEncodeError:
            named = False
        if not named or not isinstance(offsets, dict):
            raise Refused("no group, or no offsets")
        if hold_ms is not None and (type(hold_ms) is not int or not 0 <= hold_ms < 2**63):
            raise Refused("malformed hold_ms")
        if type(delete) is not bool or (delete and (offsets or hold_ms is not None)):
            raise Refused("a deletion carries no offsets and no hold")
        parsed = {}
        for p, offset in offsets.items():
            if not (p.isascii() and p.isdigit() and int(p) < 2**16 and type(offset) is int and 0 <= offset < 2**63):
                raise Refused("malformed offset")
            parsed[int(p)] = offset
        if delete:
            self.groups.pop(group, None)
            self.group_offsets.pop(group, None)
            return

        def holding(state: dict[str, Any] | None) -> bool:
            return (state is not None and state["hold_ms"] is not None
                    and self.now < state["last_commit_ms"] + state["hold_ms"])

        old, before = self.groups.get(group), self.group_offsets.get(group, {})
        if hold_ms is None and old is not None:
            hold_ms = old["hold_ms"]
        state = {"last_commit_ms": self.now, "hold_ms": hold_ms}
        # A hold that starts (new, or lapsed at this commit's time) or moves back (a partition
        # it had no offset for, or a lower one) makes every cleaning round planned before refused.
        moved_back = any(p not in before or o < before[p] for p, o in parsed.items())
        if holding(state) and (not holding(old) or moved_back):
            self.holds_changed = commit["version"]
        self.group_offsets[group] = {**before, **parsed}
        self.groups[group] = state

    def _register(self, pid: int, epoch: int) -> None:
        state = self.producers.get(pid)
        if state is None or self.now - state["last_ms"] > PRODUCER_ID_EXPIRATION_MS:
            self.producers[pid] = {"id": pid, "epoch": epoch, "last_ms": self.now, "parts": {}}
        elif epoch <= state["epoch"]:
            raise Refused("fenced: not a newer epoch")
        else:
            self.producers[pid] = {**state, "epoch": epoch, "last_ms": max(state["last_ms"], self.now)}

    def _pin(self, commit: dict[str, Any]) -> None:
        name, info = commit["info"].get("name"), commit["info"]
        if not isinstance(name, str) or not name:
            raise Refused("no name")
        if commit["kind"] == "unpin":
            if self.pins.pop(name, None) is None:
                raise Refused("no such checkpoint")
        elif name in self.pins or info.get("version") != commit["version"] - 1:
            raise Refused("name taken, or not the version before")
        else:
            self.pins[name] = list(info.get("paths", []))


def is_duplicate(state: dict[str, Any] | None, p: int, batch: dict[str, Any], now: int) -> bool:
    """The producer rules: True for a duplicate; raises Refused for a fenced or out-of-order batch."""
    epoch, first, n = batch["epoch"], batch["seq"], batch["n"]
    if n < 1 or not 0 <= first < SEQUENCE_MODULUS:
        raise Refused("malformed batch")
    if state is None or now - state["last_ms"] > PRODUCER_ID_EXPIRATION_MS:
        return False
    if epoch < state["epoch"]:
        raise Refused("fenced")
    part = state["parts"].get(str(p))
    if part is None or now - part["last_ms"] > PRODUCER_ID_EXPIRATION_MS:
        if epoch > state["epoch"] and first != 0:
            raise Refused("a new epoch starts at sequence 0")
        return False
    if epoch < part["epoch"]:
        raise Refused("fenced on this partition")
    if epoch > part["epoch"]:
        if first != 0:
            raise Refused("a new epoch starts at sequence 0")
        return False
    last = (first + n - 1) % SEQUENCE_MODULUS
    for meta in part["batches"]:
        if meta[0] == first and meta[1] == last:
            if batch.get("digest") is not None and len(meta) > 5 and batch["digest"] != meta[5]:
                raise Refused("fenced: another batch with the same sequences")
            return True
    expected = (part["batches"][-1][1] + 1) % SEQUENCE_MODULUS if part["batches"] else 0
    if first != expected:
        raise Refused("out of order")
    return False


def accept(state: dict[str, Any] | None, pid: int, p: int, batch: dict[str, Any], base: int,
           now: int) -> dict[str, Any]:
    """The producer's state after accepting ``batch`` at offsets ``base``..``base + n - 1``."""
    epoch, first, n = batch["epoch"], batch["seq"], batch["n"]
    if state is None or now - state["last_ms"] > PRODUCER_ID_EXPIRATION_MS:
        state = {"id": pid, "epoch": epoch, "last_ms": now, "parts": {}}
    part = state["parts"].get(str(p))
    if part is None or part["epoch"] != epoch or now - part["last_ms"] > PRODUCER_ID_EXPIRATION_MS:
        part = {"epoch": epoch, "last_ms": now, "batches": []}
    meta = [first, (first + n - 1) % SEQUENCE_MODULUS, base, base + n - 1, now]
    if batch.get("digest") is not None:
        meta.append(batch["digest"])
    part = {"epoch": part["epoch"], "last_ms": max(part["last_ms"], now),
            "batches": [*part["batches"], meta][-WINDOW:]}
    return {"id": pid, "epoch": max(state["epoch"], epoch), "last_ms": max(state["last_ms"], now),
            "parts": {**state["parts"], str(p): part}}


def replay(root: str) -> State:
    """The state at the newest version: the newest usable checkpoint, then the commits after it."""
    log_dir = os.path.join(root, "log")
    names = set(os.listdir(log_dir))
    checkpoints = sorted((int(n[:20]) for n in names if n.endswith(".checkpoint.json")), reverse=True)
    state = State()
    for version in checkpoints:
        if f"{version:020d}.json" not in names:
            continue  # its commit is gone: a history the root no longer holds
        body = read_document(os.path.join(log_dir, f"{version:020d}.checkpoint.json"), "checkpoint")
        commit = read_document(os.path.join(log_dir, f"{version:020d}.json"), "commit")
        if body.get("commit_id") in (None, commit["id"]):
            state = State.from_checkpoint(body)
            state.head_id = commit["id"]
            break
    # The store's version is the head's (a store of format 1 has no head: its highest commit).
    if "head.json" in names:
        newest = read_document(os.path.join(log_dir, "head.json"), "commit")["version"]
    else:
        newest = max((int(n[:20]) for n in names if n.endswith(".json") and n[:20].isdigit()
                      and not n.endswith(".checkpoint.json")), default=0)
    while state.version < newest:
        name = f"{state.version + 1:020d}.json"
        # Only the head's own copy may be missing (its writer died between the swap and the copy).
        path = os.path.join(log_dir, name if name in names else "head.json")
        state.apply(read_document(path, "commit"))
    return state


# -- records ------------------------------------------------------------------------------------

def records(root: str, state: State) -> pa.Table:
    """Every live record with its partition and offset, in partition then offset order."""
    schemas: dict[str, pa.Schema] = {}
    tables = []
    for (p, _last), b in sorted(state.batches.items(), key=lambda item: (item[0][0], item[1]["base"])):
        path = os.path.join(root, b["path"])
        with open(path, "rb") as f:
            if b["path"] not in schemas:
                f.seek(data_start(f, b["path"]))
                head = f.read(16)
                (length,) = struct.unpack_from("<i", head, 12)
                schemas[b["path"]] = pa.ipc.read_schema(pa.py_buffer(head[8:] + f.read(length)))
            f.seek(b["pos"])
            data = f.read(b["len"])
        if len(data) != b["len"] or crc32c(data) != b["crc"]:
            raise ValueError(f"{path}: damaged batch at {b['pos']}")
        batch = pa.ipc.read_record_batch(pa.py_buffer(data), schemas[b["path"]])
        if batch.num_rows != b["n"]:
            raise ValueError(f"{path}: batch at {b['pos']} holds {batch.num_rows} rows, not {b['n']}")
        relative = roaring_values(b["present"]) if "present" in b else range(b["n"])
        offsets = [b["base"] + r for r in relative]
        expires = batch.column("expires") if "expires" in batch.schema.names else pa.nulls(b["n"], pa.int64())
        tables.append(pa.table({
            "partition": pa.array([p] * b["n"], pa.int32()), "offset": pa.array(offsets, pa.int64()),
            "timestamp": batch.column("timestamp"), "key": batch.column("key"), "value": batch.column("value"),
            "expires": expires.cast(pa.int64()),
        }))
    schema = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.int64()),
                        ("key", pa.binary()), ("value", pa.binary()), ("expires", pa.int64())])
    return pa.concat_tables(tables) if tables else schema.empty_table()


def latest(changelog: pa.Table, now_ms: int) -> pa.Table:
    """One row per live key: its latest record, unless that is a tombstone or expired at ``now_ms``."""
    newest: dict[bytes, dict[str, Any]] = {}
    for row in changelog.to_pylist():  # offset order within a partition; a key lives in one partition
        newest[row["key"]] = row
    rows = [row for row in newest.values()
            if row["value"] is not None and (row["expires"] is None or row["expires"] > now_ms)]
    rows.sort(key=lambda row: row["key"])
    return pa.Table.from_pylist(rows, schema=changelog.schema)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    state = replay(argv[1])
    changelog = records(argv[1], state)
    state_now = latest(changelog, int(argv[3]) if len(argv) == 4 else int(time.time() * 1000))
    if len(argv) >= 3:
        for name, table in (("changelog", changelog), ("latest", state_now)):
            with pa.OSFile(os.path.join(argv[2], f"{name}.arrow"), "wb") as sink, \
                    pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
    print(f"version {state.version}: {changelog.num_rows} live records, {state_now.num_rows} live keys")
    print("outside reader: done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
