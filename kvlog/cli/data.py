"""``put``, ``get``, ``delete`` and ``scan``: keys and values in and out, byte for byte."""

from __future__ import annotations

import argparse
import itertools
import sys

from kvlog.cli.common import (
    ExitCode,
    Subparsers,
    add_store_arguments,
    open_store,
    positive_count,
    store_config,
)
from kvlog.cli.encoding import (
    InputError,
    arg_bytes,
    escape_tsv,
    from_hex,
    json_record,
    read_source,
    write_bytes,
)
from kvlog.config import KEY_BYTES_LIMIT
from kvlog.errors import InvalidRecordError
from kvlog.log.records import to_key

__all__ = ["register"]

_HEX_HELP = "KEY, VALUE and key bounds given on the command line are hex digits (output is hex too)"


def _argument(arg: str, what: str, as_hex: bool) -> bytes:
    return from_hex(arg, what) if as_hex else arg_bytes(arg)


def _inputs(args: argparse.Namespace, names: tuple[str, ...]) -> list[bytes]:
    """The key (and value) of a command, from its positional arguments and ``--*-file`` options.

    ``names`` is ``("KEY",)`` or ``("KEY", "VALUE")``; a name given by its file option takes
    no positional argument. Files are read as raw bytes whatever ``--hex`` says. At most one
    source may be stdin.
    """
    files = {"KEY": args.key_file, "VALUE": getattr(args, "value_file", None)}
    if sum(1 for n in names if files[n] == "-") > 1:
        raise InputError("--key-file - and --value-file - cannot both read stdin")
    wanted = [n for n in names if files[n] is None]
    given = list(args.items)
    if len(given) != len(wanted):
        from_files = [n for n in names if files[n] is not None]
        if len(given) > len(wanted) and from_files:
            both = from_files[-1]
            raise InputError(f"give {both} as an argument or with --{both.lower()}-file, not both")
        expected = " ".join(wanted) or "no positional argument"
        raise InputError(f"expected {expected} after the URI, got {len(given)} argument(s)")
    out: list[bytes] = []
    for name in names:
        if files[name] is None:
            out.append(_argument(given.pop(0), name, args.hex))
        else:
            out.append(read_source(files[name], f"--{name.lower()}-file"))
    return out


def _check_key(key: bytes, limit: int) -> None:
    """:class:`InvalidRecordError` for a key the store refuses (empty, longer than ``limit``),
    raised before the store is opened so that a refused key changes no file."""
    to_key(key, limit)


def _check_record(key: bytes, value: bytes, args: argparse.Namespace) -> None:
    """:class:`InvalidRecordError` for a put the store refuses, by the limits it opens with
    (``max_key_bytes``, ``max_record_bytes``, defaults or ``--set``), before it is opened."""
    config = store_config(args)
    _check_key(key, config.max_key_bytes)
    size = len(key) + len(value)
    if size > config.max_record_bytes:
        raise InvalidRecordError(
            f"a record of {size} bytes is larger than max_record_bytes={config.max_record_bytes}")


def _cmd_put(args: argparse.Namespace) -> int:
    key, value = _inputs(args, ("KEY", "VALUE"))  # read before anything is created
    _check_record(key, value, args)
    with open_store(args) as store:
        store.put(key, value, sync=True)
    return ExitCode.OK


def _cmd_get(args: argparse.Namespace) -> int:
    (key,) = _inputs(args, ("KEY",))
    _check_key(key, KEY_BYTES_LIMIT)  # reads take any key a store may hold
    with open_store(args, create=False, read_only=True) as store:
        value = store.get(key)
    if value is None:
        print(f"kvlog: key not found: {escape_tsv(key)}", file=sys.stderr)
        return ExitCode.NEGATIVE
    if args.format == "json":
        write_bytes(json_record(key, value, as_hex=args.hex).encode("utf-8") + b"\n")
    elif args.hex:
        write_bytes(value.hex().encode("ascii") + b"\n")
    else:
        # The exact bytes, as ``cat`` would give them; a terminal gets a line break after a
        # value that has none, so the prompt starts on a line of its own.
        tail = b"\n" if sys.stdout.isatty() and not value.endswith(b"\n") else b""
        write_bytes(value + tail)
    return ExitCode.OK


def _cmd_delete(args: argparse.Namespace) -> int:
    (key,) = _inputs(args, ("KEY",))
    # A longer key than max_key_bytes may still be deleted if the store holds it, which only
    # the store can tell; every key longer than any store holds is refused here.
    _check_key(key, KEY_BYTES_LIMIT)
    with open_store(args, create=False) as store:
        store.delete(key, sync=True)
    return ExitCode.OK


def _cmd_scan(args: argparse.Namespace) -> int:
    """Print the records in range, in key order (``--reverse``: descending), the first
    ``--limit`` of them if given: the scan stops there and reads no further."""
    def bound(arg: str | None, what: str) -> bytes | None:
        return None if arg is None else _argument(arg, what, args.hex)

    prefix, start, stop = bound(args.prefix, "--prefix"), bound(args.start, "--start"), bound(args.stop, "--stop")
    with open_store(args, create=False, read_only=True) as store:
        records = store.scan(start, stop, prefix=prefix, reverse=args.reverse)
        for key, value in itertools.islice(records, args.limit):  # a limit of None: every record
            if args.format == "json":
                line = json_record(key, value, as_hex=args.hex)
            elif args.hex:
                line = f"{key.hex()}\t{value.hex()}"
            else:
                line = f"{escape_tsv(key)}\t{escape_tsv(value)}"
            write_bytes(line.encode("utf-8") + b"\n")
    return ExitCode.OK


def _key_arguments(p: argparse.ArgumentParser, with_value: bool) -> None:
    if with_value:
        p.add_argument("items", nargs="*", metavar="KEY VALUE",
                       help="the key and the value (leave out the one given with --key-file or --value-file)")
        p.add_argument("--value-file", metavar="FILE",
                       help="read the value's raw bytes from FILE ('-' reads stdin) instead of VALUE")
    else:
        p.add_argument("items", nargs="*", metavar="KEY", help="the key (left out with --key-file)")
    p.add_argument("--key-file", metavar="FILE",
                   help="read the key's raw bytes from FILE ('-' reads stdin) instead of KEY")
    p.add_argument("--hex", action="store_true", help=_HEX_HELP)


def register(sub: Subparsers) -> None:
    """Add ``put``, ``get``, ``delete`` and ``scan`` to the command line."""
    p = sub.add_parser("put", help="set a key (creates the store in a missing or empty directory)")
    add_store_arguments(p)
    _key_arguments(p, with_value=True)
    p.add_argument("--create", action="store_true",
                   help="create the store even in a directory that holds other files")
    p.set_defaults(func=_cmd_put)

    p = sub.add_parser("get", help="write a key's value to stdout (exit 1 if the key is not there)")
    add_store_arguments(p)
    _key_arguments(p, with_value=False)
    p.add_argument("--format", choices=("raw", "json"), default="raw",
                   help="raw: the value's bytes as stored (hex with --hex); json: one JSON object "
                        "{\"key\": ..., \"value\": ...} (default raw)")
    p.set_defaults(func=_cmd_get)

    p = sub.add_parser("delete", help="delete a key of an existing store")
    add_store_arguments(p)
    _key_arguments(p, with_value=False)
    p.set_defaults(func=_cmd_delete)

    p = sub.add_parser("scan", help="print the keys and values in key order")
    add_store_arguments(p)
    p.add_argument("--prefix", help="only keys starting with these bytes")
    p.add_argument("--start", help="only keys at or after this one")
    p.add_argument("--stop", help="only keys before this one")
    p.add_argument("--reverse", action="store_true", help="descending key order")
    p.add_argument("--limit", type=positive_count, metavar="N",
                   help="print at most N records (the first N in the scan's order; N above zero)")
    p.add_argument("--hex", action="store_true",
                   help="--prefix, --start and --stop are hex digits, and keys and values are printed as hex")
    p.add_argument("--format", choices=("tsv", "json"), default="tsv",
                   help="tsv: key<TAB>value lines, escaped; json: one JSON object a line (default tsv)")
    p.set_defaults(func=_cmd_scan)
