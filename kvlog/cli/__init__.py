"""The ``kvlog`` command line. Errors print one line and exit non-zero.

Exit codes (:class:`~kvlog.cli.common.ExitCode`), so that a script can tell outcomes apart
without reading stderr:

* 0 success.
* 1 the command ran and its answer is no: ``get`` of a key that is not there
  (``kvlog: key not found: KEY``), ``check`` found problems (and ``demo``'s own checks).
* 2 a usage error: bad arguments, ``--storage-options``, ``--set``, bad hex, an unreadable
  ``--key-file``/``--value-file``, a bad ``--limit``; also ``kvlog bench``, which is not
  available in an installed kvlog and names where the benchmark suite runs
  (``python -m benchmarks`` in a source checkout).
* 3 what the command names is not there: no store at the URI, no such named checkpoint or
  consumer group (:class:`~kvlog.errors.StoreNotFoundError` and its subclasses).
* 4 any other failure: any other :class:`~kvlog.errors.KvlogError` (storage, corrupt data,
  read-only, a refused record or setting, a missing extra) and any other exception.
* 130 interrupted (SIGINT), 143 terminated (SIGTERM: ``consume`` stops cleanly on both),
  141 the output pipe was closed (``kvlog scan URI | head``).

Messages are for people, one line on stderr, never a traceback: a kvlog error is
``kvlog: <message>``, a usage error ``kvlog COMMAND: error: <message>``, and any other
exception ``kvlog: error: <Type>: <message>`` (it is a bug or an OS error, and its type is
what a report needs). ``-v``/``--verbose`` (before or after the command) names the kvlog
error's type too and adds a line ``  caused by: <Type>: <message>`` for each exception of
its cause chain.

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
from kvlog.cli.common import ExitCode, Parser, Subparsers, one_line
from kvlog.cli.encoding import InputError
from kvlog.errors import KvlogError, StoreNotFoundError

__all__ = ["main", "build_parser", "COMMANDS", "ExitCode", "exit_code_of", "error_lines"]

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


_VERBOSE_HELP = "on an error, also name its type and every exception that caused it (never a traceback)"


def build_parser() -> argparse.ArgumentParser:
    """The ``kvlog`` argument parser with every command."""
    parser = Parser(prog="kvlog", description="kvlog: a key-value store on a compacted log")
    parser.add_argument("--version", action="version", version=f"kvlog {_version()}",
                        help="print kvlog's version and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to do")
    for register in COMMANDS:
        register(sub)
    _verbose_after_the_command(parser)
    return parser


def _verbose_after_the_command(parser: argparse.ArgumentParser) -> None:
    """Let every command (and Spark job) take ``-v``/``--verbose`` among its own options too.

    The command's copy has no default (``SUPPRESS``), so a ``-v`` given before the command is
    kept when none follows it: argparse copies only what the command's parser set. A parser
    whose options do not start with ``-`` (``bench`` takes any argument as given) is left out.
    """
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for command in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
            if "-" in command.prefix_chars:
                command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                     help=_VERBOSE_HELP)
                _verbose_after_the_command(command)


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


def exit_code_of(error: BaseException) -> int:
    """The exit code of a command that raised ``error`` (the table of the module doc).

    A usage error (:class:`~kvlog.cli.encoding.InputError`) is 2; a store, checkpoint or
    group that is not there (:class:`~kvlog.errors.StoreNotFoundError` and its subclasses)
    is 3; every other exception, kvlog's or not, is 4.
    """
    if isinstance(error, InputError):
        return int(ExitCode.USAGE)
    if isinstance(error, StoreNotFoundError):
        return int(ExitCode.NO_STORE)
    return int(ExitCode.FAILURE)


def _described(error: BaseException) -> str:
    """``Type: message`` of ``error`` on one line (``Type`` alone when it has no message)."""
    detail = one_line(str(error))
    return f"{type(error).__name__}: {detail}" if detail else type(error).__name__


def _causes(error: BaseException) -> list[BaseException]:
    """The exceptions ``error`` was raised from or while handling, nearest first.

    Follows ``__cause__`` (``raise ... from e``), else ``__context__`` unless ``raise ... from
    None`` suppressed it, as a traceback would; each exception once (a chain may loop).
    """
    chain: list[BaseException] = []
    seen = {id(error)}
    current: BaseException | None = error
    while current is not None:
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
        if current is None or id(current) in seen:
            break
        seen.add(id(current))
        chain.append(current)
    return chain


def error_lines(error: BaseException, command: str = "kvlog", verbose: bool = False) -> list[str]:
    """The lines ``kvlog`` prints on stderr for ``error`` (``command`` is ``kvlog put``...).

    Without ``verbose``, one line: a usage error is ``kvlog put: error: <message>`` (argparse's
    form), a kvlog error ``kvlog: <message>`` (its message is written for people; the type
    adds nothing to them), any other exception ``kvlog: error: <Type>: <message>`` (a bug or
    an OS error: its type is what a report needs). With ``verbose``, a kvlog error's line names
    its type too, and a line ``  caused by: <Type>: <message>`` follows for each exception of
    the cause chain.
    """
    detail = one_line(str(error))
    if isinstance(error, InputError):
        first = f"{command}: error: {detail}"
    elif isinstance(error, KvlogError):
        first = f"kvlog: {_described(error)}" if verbose or not detail else f"kvlog: {detail}"
    else:
        first = f"kvlog: error: {_described(error)}"
    if not verbose:
        return [first]
    return [first, *(f"  caused by: {_described(cause)}" for cause in _causes(error))]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (a usage error exits 2 through ``SystemExit``).

    Every failure is reported by :func:`error_lines` on stderr (one line unless ``-v``) and
    exits with :func:`exit_code_of`'s code; an interrupt exits 130 and a closed output pipe
    141, like a shell.
    """
    command = "kvlog"
    verbose = False
    try:
        args = _parse(build_parser(), argv)
        command, verbose = f"kvlog {args.command}", args.verbose
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe is reported here, not at interpreter exit
        return code
    except KeyboardInterrupt:
        print("kvlog: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        # The reader went away (``kvlog scan ... | head``): drop what is left of the output.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return int(ExitCode.BROKEN_PIPE)
    except Exception as e:  # noqa: BLE001 - the one place every other failure becomes a message
        for line in error_lines(e, command, verbose):
            print(line, file=sys.stderr)
        return exit_code_of(e)
