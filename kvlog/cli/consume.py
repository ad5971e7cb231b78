"""``consume``: print a consumer group's records from its committed offsets, and commit.

The group's offsets live in the store, like any :meth:`kvlog.Store.consumer`'s: a second
``kvlog consume URI GROUP`` prints only what was written since the first committed. Without
``--follow`` the command prints what the log holds past the group's position and exits;
with it, it waits for new records (other processes' too) until stopped. Each poll's lines
are written and flushed before its offsets are committed, so every committed record is out
of the process whatever stops it (at least once: a poll a SIGKILL catches between its flush
and its commit prints again). SIGTERM and SIGINT stop it between polls, with what it printed
committed (exit 143 and 130); a closed output pipe stops it without committing the poll it
could not write (exit 141). ``--from earliest|latest|OFFSET`` starts every partition there
instead of at the group's committed offsets (kcat's ``-o``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

from kvlog.cli.common import (
    ExitCode,
    Subparsers,
    add_store_arguments,
    store_config,
    stored_partitions,
)
from kvlog.cli.encoding import InputError, escape_tsv, write_bytes
from kvlog.consumer import Consumer
from kvlog.errors import StoreNotFoundError
from kvlog.log import open_log
from kvlog.log.group_offsets import check_group
from kvlog.log.records import Record
from kvlog.meta.group_offsets import OFFSET_LIMIT

__all__ = ["register", "format_record"]

#: A tombstone's value in ``tsv`` output (a value's own backslash is escaped, so it is unambiguous).
TSV_TOMBSTONE = "\\N"


def _field(name: str, data: bytes, as_hex: bool) -> tuple[str, str]:
    if not as_hex:
        try:
            return name, data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return f"{name}_hex", data.hex()


def format_record(record: Record, output: str, as_hex: bool) -> str:
    """One line for ``record``: ``tsv`` is partition, offset, timestamp, key and value separated
    by tabs (escaped as ``scan`` escapes them, a tombstone's value ``\\N``); ``json`` is an
    object with ``partition``, ``offset``, ``timestamp_ms``, the key as ``key`` or ``key_hex``
    and the value as ``value`` or ``value_hex`` (``"value": null`` for a tombstone)."""
    if output == "json":
        key_name, key_text = _field("key", record.key, as_hex)
        obj: dict[str, object] = {"partition": record.partition, "offset": record.offset,
                                  "timestamp_ms": record.timestamp_ms, key_name: key_text}
        if record.value is None:
            obj["value"] = None
        else:
            value_name, value_text = _field("value", record.value, as_hex)
            obj[value_name] = value_text
        return json.dumps(obj, ensure_ascii=False)
    def text(data: bytes) -> str:
        return data.hex() if as_hex else escape_tsv(data)

    key = text(record.key)
    value = TSV_TOMBSTONE if record.value is None else text(record.value)
    return f"{record.partition}\t{record.offset}\t{record.timestamp_ms}\t{key}\t{value}"


#: How long one poll of ``--follow`` waits for records: the longest a stop signal waits to be seen.
_FOLLOW_POLL_S = 0.5

#: The signals that stop ``consume`` between two polls, and the line each leaves on stderr.
_STOP_SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


class _StopRequest:
    """Which stop signal (SIGINT, SIGTERM) arrived while ``consume`` ran, if any.

    While installed, the two signals only set :attr:`signum`; the loop sees it between polls,
    so a stop never falls inside a write or a commit: what was printed is committed, and
    nothing else. Installed in the main thread only (Python runs handlers there alone).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> _StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in _STOP_SIGNALS:
                self._saved[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)


def _partitions(args: argparse.Namespace) -> list[int] | None:
    """The ``--partition`` values, checked against the store's identity before it is opened:
    one the store does not have, or one given twice, is a usage error."""
    if not args.partition:
        return None
    given: list[int] = args.partition
    twice = sorted({p for p in given if given.count(p) > 1})
    if twice:
        raise InputError(f"--partition {twice[0]} is given more than once")
    count = stored_partitions(args.uri, args.storage_options)
    if count is None:
        raise StoreNotFoundError(f"no kvlog store at {args.uri!r}")
    for p in given:
        if not 0 <= p < count:
            raise InputError(f"--partition {p} is not in [0, {count}): the store has {count} partitions")
    return given


def _cmd_consume(args: argparse.Namespace) -> int:
    # Everything the arguments can be refused for is refused before the store is opened:
    # opening writes the metadata cache, and refused input changes no file.
    if args.max_records <= 0:
        raise InputError(f"--max-records must be positive, not {args.max_records}")
    check_group(args.group)
    config = store_config(args)
    partitions = _partitions(args)
    # No producer: offsets are commits of the log itself, and a producer would take over
    # (fence) the one of an application writing through the same cache.
    with _StopRequest() as stop:
        the_log = open_log(args.uri, create=False, read_only=args.no_commit,
                           storage_options=args.storage_options, config=config)
        try:
            with Consumer(the_log, args.group, partitions) as consumer:
                if args.start == "earliest":
                    consumer.seek_to_beginning()
                elif args.start == "latest":
                    consumer.seek_to_end()
                elif isinstance(args.start, int):
                    consumer.seek_all(dict.fromkeys(consumer.partitions, args.start))
                while stop.signum is None:
                    records = consumer.poll(timeout_s=_FOLLOW_POLL_S if args.follow else 0.0,
                                            max_records=args.max_records)
                    if records:
                        out = "".join(format_record(r, args.format, args.hex) + "\n" for r in records)
                        # Written and flushed before the commit: a committed offset is always
                        # one whose record is out of this process, whatever stops it next
                        # (a closed pipe raises here, before anything is committed).
                        write_bytes(out.encode("utf-8"), flush=True)
                        if not args.no_commit:
                            consumer.commit()
                    elif not args.follow:
                        return ExitCode.OK
        finally:
            the_log.close()
    print(f"kvlog: {_STOP_SIGNALS[signal.Signals(stop.signum)]}", file=sys.stderr)
    return 128 + stop.signum


def _start(value: str) -> str | int:
    """``--from``: ``earliest``, ``latest`` or an offset (an integer in [0, 2**63))."""
    if value in ("earliest", "latest"):
        return value
    if value.isascii() and value.isdigit() and int(value) < OFFSET_LIMIT:
        return int(value)
    raise argparse.ArgumentTypeError(f"{value!r} is not earliest, latest or an offset in [0, 2**63)")


def register(sub: Subparsers) -> None:
    """Add ``consume`` to the command line."""
    p = sub.add_parser("consume", help="print a consumer group's records past its committed offsets, "
                                       "and commit them")
    add_store_arguments(p)
    p.add_argument("group", help="the consumer group's name (its offsets are kept in the store)")
    p.add_argument("--follow", action="store_true",
                   help="keep waiting for new records (until interrupted) instead of exiting at the end")
    p.add_argument("--partition", type=int, action="append", metavar="P",
                   help="only this partition (repeatable; default: every partition)")
    p.add_argument("--max-records", type=int, default=500, metavar="N",
                   help="records per poll, committed together (default 500)")
    p.add_argument("--from", dest="start", type=_start, default=None, metavar="WHERE",
                   help="start every partition read at earliest (its first offset), latest (its end: "
                        "only new records) or OFFSET, instead of the group's committed offsets")
    p.add_argument("--no-commit", action="store_true",
                   help="print without committing offsets (opens the store read-only)")
    p.add_argument("--hex", action="store_true", help="print keys and values as hex")
    p.add_argument("--format", choices=("tsv", "json"), default="tsv",
                   help="tsv: partition, offset, timestamp, key, value separated by tabs, escaped as "
                        "scan escapes them, a tombstone's value \\N; json: one JSON object a line")
    p.set_defaults(func=_cmd_consume)
