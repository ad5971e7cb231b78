"""The ``kvlog`` command line. Errors print one line and exit non-zero."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from kvlog.errors import KvlogError

__all__ = ["main"]


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def _open(args: argparse.Namespace, **kwargs: Any) -> Any:
    import kvlog

    options = json.loads(args.storage_options) if args.storage_options else None
    return kvlog.open(args.uri, storage_options=options, background_compaction=False, **kwargs)


def _writer_id() -> int:
    """A producer id of its own for a one-off command, so it never fences an application."""
    from kvlog.clock import SystemIdSource

    return int.from_bytes(SystemIdSource().token(8), "big") >> 1


def _cmd_put(args: argparse.Namespace) -> int:
    with _open(args, producer_id=_writer_id()) as store:
        store.put(args.key, args.value, sync=True)
    return 0


def _cmd_get(args: argparse.Namespace) -> int:
    with _open(args, create=False, read_only=True) as store:
        value = store.get(args.key)
    if value is None:
        print(f"kvlog: key not found: {args.key}", file=sys.stderr)
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
    from kvlog.log.log import open_log

    options = json.loads(args.storage_options) if args.storage_options else None
    the_log = open_log(args.uri, create=False, storage_options=options)
    try:
        report = Compactor(the_log).run_once(force=args.force)
    finally:
        the_log.close()
    print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    return 0


def _cmd_spark(args: argparse.Namespace) -> int:
    # kvlog never imports spark_ext; the command line is the one place that may (DESIGN §2).
    try:
        import spark_ext
    except ImportError as e:
        print(f"kvlog: the Spark extension needs pyspark: pip install 'kvlog[spark]' ({e})", file=sys.stderr)
        return 1
    options = json.loads(args.storage_options) if args.storage_options else None
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


def _cmd_bench(args: argparse.Namespace) -> int:
    from kvlog.bench import main_from_args

    return main_from_args(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvlog", description="kvlog: a key-value store on a compacted log")
    sub = parser.add_subparsers(dest="command", required=True)

    def store_cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("uri", help="a directory, file:///abs/dir or s3://bucket/prefix")
        p.add_argument("--storage-options", help="JSON object of object-store options")
        return p

    p = store_cmd("put", "set a key")
    p.add_argument("key")
    p.add_argument("value")
    p.set_defaults(func=_cmd_put)
    p = store_cmd("get", "print a key's value")
    p.add_argument("key")
    p.set_defaults(func=_cmd_get)
    p = store_cmd("delete", "delete a key")
    p.add_argument("key")
    p.set_defaults(func=_cmd_delete)
    p = store_cmd("scan", "print key<TAB>value lines in key order")
    p.add_argument("--prefix")
    p.add_argument("--start")
    p.add_argument("--stop")
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
        p.add_argument("uri")
        if name == "materialize":
            p.add_argument("out", help="output directory of the Parquet table")
        if name == "rebuild-index":
            p.add_argument("cache_dir", help="the LMDB cache directory to build")
        if name == "compact":
            p.add_argument("--force", action="store_true")
        p.add_argument("--master", help="Spark master, e.g. spark://127.0.0.1:7077 (default local[*])")
        p.add_argument("--storage-options", help="JSON object of object-store options")
        p.set_defaults(func=_cmd_spark)
    p = sub.add_parser("demo", help="the end-to-end demo on a local store")
    p.add_argument("--path", help="store directory (default: a new temporary directory)")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--no-spark", action="store_true", help="skip the Spark materialization step")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("bench", help="benchmarks side by side with LMDB, sqlite3 and raw S3")
    from kvlog.bench import add_arguments

    add_arguments(p)
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except KvlogError as e:
        print(f"kvlog: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except json.JSONDecodeError as e:
        print(f"kvlog: --storage-options is not valid JSON: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
