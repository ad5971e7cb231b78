"""The ``kvlog`` command line. Errors print one line and exit non-zero.

Exit codes: 0 success, 1 a failed command (a missing key, a refused write, any
error), 2 a usage error (bad arguments or ``--storage-options``; also ``kvlog bench``, which
names where the benchmark suite runs: ``python -m benchmarks`` in a source checkout),
130 interrupted,
141 the output pipe was closed (``kvlog scan URI | head``).
Keys, values and key bounds are taken as the bytes given on the command line
(``os.fsencode`` undoes Python's ``surrogateescape`` decoding), so binary keys work.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import unquote, urlparse

from kvlog.errors import KvlogError
from kvlog.format.identity import IDENTITY_NAME

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message>`` as one line (the usage is under ``--help``) and exit 2."""
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) as one space: an error stays one line."""
    return " ".join(text.split())


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def _arg_bytes(arg: str) -> bytes:
    """A key, value or key bound as the bytes given on the command line.

    Python decodes ``argv`` with ``surrogateescape``; ``os.fsencode`` gives the original bytes
    back, so a key that is not UTF-8 is stored as given rather than failing to encode.
    """
    try:
        return os.fsencode(arg)
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"{arg!r} has no byte form ({e.reason})") from None


def _require_utf8(arg: str) -> None:
    """A usage error naming where ``arg`` stops being UTF-8 text, if it does."""
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"{arg!r} is not valid UTF-8 (at character {e.start})") from None


def _uri(arg: str) -> str:
    """A store URI, refused before anything is created unless it is UTF-8 text.

    The metadata cache and object stores need the location as text, so a path that is not
    UTF-8 would fail only after its directory was made.
    """
    _require_utf8(arg)
    return arg


def _storage_options(text: str) -> dict[str, Any]:
    """``--storage-options``: a JSON object in UTF-8, refused as a usage error otherwise."""
    _require_utf8(text)
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(
            f"must be a JSON object such as '{{\"region\": \"us-east-1\"}}', not {type(options).__name__}")
    return options


def _local_dir(uri: str) -> Path | None:
    """The directory of a local store URI (a path or ``file:///abs/dir``); None for object stores.

    A ``file://`` URI naming a host is left to :func:`kvlog.open`, which refuses it.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "":
        return Path(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(unquote(parsed.path))
    return None


def _refuse_to_create(uri: str, create: bool) -> str | None:
    """Why a write must not make a store at ``uri``, or None when it may go on.

    A write creates a store in a missing or empty directory, or anywhere with ``--create``;
    an existing store (one with ``kvlog.json``) is written as is. Anything else is refused
    before a file is made, so a mistyped path never turns a directory into a store.
    Object-store prefixes are always written: the prefix is the store.
    """
    directory = _local_dir(uri)
    if directory is None or create or not os.path.lexists(directory):
        return None
    if not directory.is_dir():
        return f"{uri} is not a directory"
    if (directory / IDENTITY_NAME).exists() or not any(directory.iterdir()):
        return None
    return (f"{uri} is not empty and is not a kvlog store (no {IDENTITY_NAME}): "
            "give --create to make a store there anyway")


def _open(args: argparse.Namespace, **kwargs: Any) -> Any:
    import kvlog

    return kvlog.open(args.uri, storage_options=args.storage_options, background_compaction=False, **kwargs)


def _writer_id() -> int:
    """A producer id of its own for a one-off command, so it never fences an application."""
    from kvlog.clock import SystemIdSource

    return int.from_bytes(SystemIdSource().token(8), "big") >> 1


def _cmd_put(args: argparse.Namespace) -> int:
    refusal = _refuse_to_create(args.uri, args.create)
    if refusal is not None:
        print(f"kvlog: {refusal}", file=sys.stderr)
        return 1
    with _open(args, producer_id=_writer_id()) as store:
        store.put(args.key, args.value, sync=True)
    return 0


def _cmd_get(args: argparse.Namespace) -> int:
    with _open(args, create=False, read_only=True) as store:
        value = store.get(args.key)
    if value is None:
        print(f"kvlog: key not found: {_text(args.key)}", file=sys.stderr)
        return 1
    print(_text(value))
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    with _open(args, create=False, producer_id=_writer_id()) as store:
        store.delete(args.key, sync=True)
    return 0


def _cmd_scan(args: argparse.Namespace) -> int:
    with _open(args, create=False, read_only=True) as store:
        for key, value in store.scan(args.start, args.stop, prefix=args.prefix, reverse=args.reverse):
            print(f"{_text(key)}\t{_text(value)}")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    with _open(args, create=False, read_only=True) as store:
        print(json.dumps(store.stats(), indent=2, sort_keys=True, default=str))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    with _open(args, create=False, read_only=True) as store:
        findings = store.check()
    for line in findings:
        print(line)
    if findings:
        print(f"kvlog: {len(findings)} problem(s) found", file=sys.stderr)
        return 1
    print("ok")
    return 0


def _cmd_compact(args: argparse.Namespace) -> int:
    # A job needs no producer: opening a Store would take over (fence) the producer of an
    # application using the same cache, so the compactor runs on the log alone.
    from kvlog.compaction import Compactor
    from kvlog.log import open_log

    the_log = open_log(args.uri, create=False, storage_options=args.storage_options)
    try:
        report = Compactor(the_log).run_once(force=args.force)
    finally:
        the_log.close()
    print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    return 0


def _cmd_spark(args: argparse.Namespace) -> int:
    # kvlog never imports spark_ext; the command line is the one place that may (docs/architecture.rst).
    try:
        import spark_ext
    except ImportError as e:
        print(f"kvlog: the Spark extension needs pyspark: pip install 'kvlog[spark]' ({e})", file=sys.stderr)
        return 1
    options = args.storage_options
    spark = spark_ext.get_session(args.master)
    try:
        if args.spark_command == "compact":
            result: Any = spark_ext.compact(spark, args.uri, storage_options=options, force=args.force).to_dict()
        elif args.spark_command == "materialize":
            result = spark_ext.materialize(spark, args.uri, args.out, storage_options=options)
        else:
            result = spark_ext.rebuild_index(spark, args.uri, args.cache_dir, storage_options=options)
    finally:
        spark.stop()
    print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from kvlog.demo import run_demo

    materialize = None
    if not args.no_spark:
        # The Spark step comes from the command line, so kvlog itself never imports spark_ext.
        import spark_ext

        def materialize(uri: str, out: str) -> Any:
            spark = spark_ext.get_session("local[2]")
            spark.sparkContext.setLogLevel("ERROR")
            try:
                return spark_ext.materialize(spark, uri, out)
            finally:
                spark.stop()

    result = run_demo(args.path, records=args.records, materialize=materialize)
    return 1 if result.failures else 0


_BENCH_POINTER = (
    "kvlog: the benchmark suite is not installed with kvlog; from a source checkout run "
    "`make bench` or `python -m benchmarks [--quick] [--only ID] [--out FILE]`"
)


def _cmd_bench(args: argparse.Namespace) -> int:
    """Say where the benchmark suite is: it lives beside the library, in a source checkout."""
    print(_BENCH_POINTER, file=sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvlog", description="kvlog: a key-value store on a compacted log")
    sub = parser.add_subparsers(dest="command", required=True)

    def store_cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("uri", type=_uri, help="a directory, file:///abs/dir or s3://bucket/prefix")
        p.add_argument("--storage-options", type=_storage_options, help="JSON object of object-store options")
        return p

    p = store_cmd("put", "set a key (creates the store in a missing or empty directory)")
    p.add_argument("key", type=_arg_bytes)
    p.add_argument("value", type=_arg_bytes)
    p.add_argument("--create", action="store_true",
                   help="create the store even in a directory that holds other files")
    p.set_defaults(func=_cmd_put)
    p = store_cmd("get", "print a key's value")
    p.add_argument("key", type=_arg_bytes)
    p.set_defaults(func=_cmd_get)
    p = store_cmd("delete", "delete a key of an existing store")
    p.add_argument("key", type=_arg_bytes)
    p.set_defaults(func=_cmd_delete)
    p = store_cmd("scan", "print key<TAB>value lines in key order")
    p.add_argument("--prefix", type=_arg_bytes)
    p.add_argument("--start", type=_arg_bytes)
    p.add_argument("--stop", type=_arg_bytes)
    p.add_argument("--reverse", action="store_true")
    p.set_defaults(func=_cmd_scan)
    store_cmd("stats", "print statistics as JSON").set_defaults(func=_cmd_stats)
    store_cmd("check", "verify the store's invariants").set_defaults(func=_cmd_check)
    p = store_cmd("compact", "run one compaction job (with a progress bar on a terminal)")
    p.add_argument("--force", action="store_true", help="clean every partition even if none is eligible")
    p.set_defaults(func=_cmd_compact)
    spark = sub.add_parser("spark", help="cluster-sized work on Spark (local mode by default)")
    spark_sub = spark.add_subparsers(dest="spark_command", required=True)
    for name, help_text in (("compact", "exact compaction on Spark"),
                            ("materialize", "write the latest state as Parquet"),
                            ("rebuild-index", "build the key index on Spark into a cache directory")):
        p = spark_sub.add_parser(name, help=help_text)
        p.add_argument("uri", type=_uri)
        if name == "materialize":
            p.add_argument("out", help="output directory of the Parquet table")
        if name == "rebuild-index":
            p.add_argument("cache_dir", help="the LMDB cache directory to build")
        if name == "compact":
            p.add_argument("--force", action="store_true")
        p.add_argument("--master", help="Spark master, e.g. spark://127.0.0.1:7077 (default local[*])")
        p.add_argument("--storage-options", type=_storage_options, help="JSON object of object-store options")
        p.set_defaults(func=_cmd_spark)
    p = sub.add_parser("demo", help="the end-to-end demo on a local store")
    p.add_argument("--path", help="store directory (default: a new temporary directory)")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--no-spark", action="store_true", help="skip the Spark materialization step")
    p.set_defaults(func=_cmd_demo)
    # The suite's own options are taken as given (``+`` is this parser's only option prefix),
    # so any ``kvlog bench ...`` line gets the pointer to the suite, not a usage error.
    p = sub.add_parser("bench", help="where the benchmark suite is (python -m benchmarks, in a checkout)",
                       prefix_chars="+", add_help=False)
    p.add_argument("suite_args", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (a usage error exits 2 through ``SystemExit``).

    Every failure is one line on stderr: a kvlog error names its class, anything else is
    ``kvlog: error: ...``; an interrupt exits 130 and a closed output pipe 141, like a shell.
    """
    try:
        args = _parser().parse_args(argv)
        code: int = args.func(args)
        sys.stdout.flush()  # a closed pipe is reported here, not at interpreter exit
        return code
    except KvlogError as e:
        print(f"kvlog: {type(e).__name__}: {_one_line(str(e))}", file=sys.stderr)
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
        detail = _one_line(str(e))
        print(f"kvlog: error: {type(e).__name__}{': ' + detail if detail else ''}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
