"""The ``kvlog`` command line. Errors print one line and exit non-zero.

Exit codes: 0 success, 1 a failed command (a missing key, a refused write, any
error), 2 a usage error (bad arguments, ``--storage-options``, ``--set``, bad hex, an
unreadable ``--key-file``/``--value-file``; also ``kvlog bench``, which names where the
benchmark suite runs: ``python -m benchmarks`` in a source checkout),
130 interrupted (SIGINT), 143 terminated (SIGTERM: ``consume`` stops cleanly on both),
141 the output pipe was closed (``kvlog scan URI | head``).

Each command group is a module with a ``register(subparsers)`` function, listed once in
:data:`COMMANDS`: :mod:`kvlog.cli.data` (put, get, delete, scan) and :mod:`kvlog.cli.admin`
(stats, check, compact, spark, demo, bench), :mod:`kvlog.cli.consume` (consume). Byte input and the output formats are
:mod:`kvlog.cli.encoding`; the ``stats`` summary is :mod:`kvlog.cli.summary`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from kvlog.cli import admin, consume, data
from kvlog.cli.common import Parser, Subparsers, one_line
from kvlog.cli.encoding import InputError
from kvlog.errors import KvlogError

__all__ = ["main", "build_parser", "COMMANDS"]

#: Every command group, in the order ``kvlog --help`` lists them.
COMMANDS: tuple[Callable[[Subparsers], None], ...] = (data.register, consume.register, admin.register)


def _version() -> str:
    """kvlog's version from the installed package's metadata (the source's own when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvlog")
    except PackageNotFoundError:
        import kvlog

        return kvlog.__version__


def build_parser() -> argparse.ArgumentParser:
    """The ``kvlog`` argument parser with every command."""
    parser = Parser(prog="kvlog", description="kvlog: a key-value store on a compacted log")
    parser.add_argument("--version", action="version", version=f"kvlog {_version()}",
                        help="print kvlog's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to do")
    for register in COMMANDS:
        register(sub)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``argv`` parsed, with positional arguments given after options kept in order.

    argparse fills a ``nargs="*"`` positional from the run of arguments before the first
    option only (``put URI --hex KEY VALUE`` would leave KEY and VALUE unrecognized); a
    command whose positionals are ``items`` takes the rest as more of them. Anything that
    looks like an option is still refused (give ``--`` before a key that starts with ``-``).
    """
    args, extra = parser.parse_known_args(argv)
    if extra:
        items = getattr(args, "items", None)
        if items is None or any(arg.startswith("-") and arg != "-" for arg in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        items.extend(extra)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (a usage error exits 2 through ``SystemExit``).

    Every failure is one line on stderr: a kvlog error names its class, anything else is
    ``kvlog: error: ...``; an interrupt exits 130 and a closed output pipe 141, like a shell.
    """
    command = "kvlog"
    try:
        args = _parse(build_parser(), argv)
        command = f"kvlog {args.command}"
        code: int = args.func(args)
        sys.stdout.flush()  # a closed pipe is reported here, not at interpreter exit
        return code
    except InputError as e:
        print(f"{command}: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KvlogError as e:
        print(f"kvlog: {type(e).__name__}: {one_line(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kvlog: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``kvlog scan ... | head``): drop what is left of the output.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141
    except Exception as e:  # noqa: BLE001 - the one place every other failure becomes one line
        detail = one_line(str(e))
        print(f"kvlog: error: {type(e).__name__}{': ' + detail if detail else ''}", file=sys.stderr)
        return 1
