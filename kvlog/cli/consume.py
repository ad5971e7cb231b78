"""``consume``: print a consumer group's records from its committed offsets, and commit.

The group's offsets live in the store, like any :meth:`kvlog.Store.consumer`'s: a second
``kvlog consume URI GROUP`` prints only what was written since the first committed. Without
``--follow`` the command prints what the log holds past the group's position and exits;
with it, it waits for new records (other processes' too) until interrupted. Offsets are
committed after each printed poll, so an interrupted run resumes after the last record it
printed (at least once: a record printed just before an interrupt may print again).
"""

from __future__ import annotations

import argparse
import json

from kvlog.cli.common import Subparsers, add_store_arguments, open_store, writer_id
from kvlog.cli.encoding import InputError, escape_tsv, write_bytes
from kvlog.log.records import Record

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


def _cmd_consume(args: argparse.Namespace) -> int:
    if args.max_records <= 0:
        raise InputError(f"--max-records must be positive, not {args.max_records}")
    kwargs = {"read_only": True} if args.no_commit else {"producer_id": writer_id()}
    with open_store(args, create=False, **kwargs) as store, \
            store.consumer(args.group, partitions=args.partition or None) as consumer:
        while True:
            records = consumer.poll(timeout_s=1.0 if args.follow else 0.0, max_records=args.max_records)
            if records:
                out = "".join(format_record(r, args.format, args.hex) + "\n" for r in records)
                write_bytes(out.encode("utf-8"))
                if not args.no_commit:
                    consumer.commit()
            elif not args.follow:
                return 0


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
    p.add_argument("--no-commit", action="store_true",
                   help="print without committing offsets (opens the store read-only)")
    p.add_argument("--hex", action="store_true", help="print keys and values as hex")
    p.add_argument("--format", choices=("tsv", "json"), default="tsv",
                   help="tsv: partition, offset, timestamp, key, value separated by tabs, escaped as "
                        "scan escapes them, a tombstone's value \\N; json: one JSON object a line")
    p.set_defaults(func=_cmd_consume)
