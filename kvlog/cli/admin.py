"""``stats``, ``check``, ``compact``, ``spark``, ``demo`` and ``bench``: looking after a store."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvlog.cli.common import (
    ExitCode,
    Subparsers,
    add_store_arguments,
    cli_spelling,
    one_line,
    open_store,
    positive_count,
    require_store,
    settings_of,
    storage_options_arg,
    uri_arg,
)
from kvlog.cli.summary import render_stats
from kvlog.errors import ConfigError, StorageBehindError
from kvlog.extras import require

__all__ = ["register"]


def _cmd_stats(args: argparse.Namespace) -> int:
    from kvlog.clock import SystemClock

    if args.prometheus:
        require("metrics", purpose="kvlog stats --prometheus")  # before anything is opened
        from kvlog.metrics import text

        with open_store(args, create=False, read_only=True) as store:
            sys.stdout.write(text(store))
        return ExitCode.OK
    with open_store(args, create=False, read_only=True) as store:
        stats = store.stats()
        ratio = store.log.config.min_cleanable_dirty_ratio
        disk = None if args.json else store.disk_usage()
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
    else:
        sys.stdout.write(render_stats(stats, SystemClock().now_ms(), min_dirty_ratio=ratio, disk=disk))
    return ExitCode.OK


def _cmd_check(args: argparse.Namespace) -> int:
    try:
        with open_store(args, create=False, read_only=True) as store:
            findings = store.check()
    except StorageBehindError as e:  # the cache applied commits storage lost: a finding
        findings = [one_line(str(e))]
    for line in findings:
        print(line)
    if findings:
        print(f"kvlog: {len(findings)} problem(s) found", file=sys.stderr)
        return ExitCode.NEGATIVE  # the check ran; its answer is "not sound"
    print("ok")
    return ExitCode.OK


def _cmd_compact(args: argparse.Namespace) -> int:
    # A job needs no producer: opening a Store would take over (fence) the producer of an
    # application using the same cache, so the compactor runs on the log alone.
    from kvlog.compaction import Compactor
    from kvlog.config import StoreConfig
    from kvlog.log import open_log

    config = StoreConfig.from_settings(**settings_of(args))
    with cli_spelling():
        the_log = open_log(args.uri, create=False, storage_options=args.storage_options, config=config,
                           on_storage_behind=args.on_storage_behind)
    try:
        report = Compactor(the_log).run_once(force=args.force)
    finally:
        the_log.close()
    print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    return ExitCode.OK


def _check_spark_job(args: argparse.Namespace) -> None:
    """Everything a Spark job's arguments can be checked for without a JVM, before one starts:
    the store exists (and its storage options fit its URI), the output and cache paths are not
    files, pyspark and pandas import (the ``spark`` extra), and Java 17 is there."""
    require_store(args.uri, args.storage_options)
    for name in ("out", "cache_dir"):
        target = getattr(args, name, None)
        if target is not None and os.path.lexists(target) and not os.path.isdir(target):
            raise ConfigError(f"{name.upper()} {target!r} is a file, not a directory")
    require("spark", purpose=f"kvlog spark {args.spark_command}")
    from spark_ext import check_java

    check_java()


def _cmd_spark(args: argparse.Namespace) -> int:
    # kvlog never imports spark_ext; the command line is the one place that may (docs/architecture.rst).
    _check_spark_job(args)
    import spark_ext

    options = args.storage_options
    spark = spark_ext.get_session(args.master, **dict(args.spark_conf))
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
    return ExitCode.OK


@contextmanager
def _stderr_to(path: str) -> Iterator[None]:
    """Send this process's standard error (file descriptor 2) to ``path`` for the block.

    A process started inside the block keeps ``path`` as its standard error for good: the
    demo starts Spark's JVM so, and the JVM's banner and log lines go to the file.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def _spark_step(uri: str, out: str) -> Any:
    """The demo's Spark step: materialize ``uri`` into ``out`` on a quiet local Spark session.

    The JVM's own output (its banner, log4j's, Spark's warnings) goes to ``spark.log`` in the
    store's directory instead of the terminal, and Spark logs errors only.
    """
    import spark_ext

    with _stderr_to(os.path.join(uri, "spark.log")):
        spark = spark_ext.get_session("local[2]", **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        return spark_ext.materialize(spark, uri, out)
    finally:
        spark.stop()


def _cmd_demo(args: argparse.Namespace) -> int:
    from kvlog.demo import run_demo

    materialize = None
    if not args.no_spark:
        # Checked before the demo writes anything; the Spark step comes from the command line,
        # so kvlog itself never imports spark_ext.
        require("spark", purpose="the Spark step of kvlog demo (--no-spark skips it)")
        from spark_ext import check_java

        check_java()
        materialize = _spark_step
    result = run_demo(args.path, records=args.records, materialize=materialize, keep=args.keep)
    # Like check's findings: the demo ran to its end and its own checks said no.
    return ExitCode.NEGATIVE if result.failures else ExitCode.OK


def _spark_conf_arg(text: str) -> tuple[str, str]:
    """``--conf KEY=VALUE``: a Spark setting, refused as a usage error unless it has a key and ``=``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. spark.driver.memory=4g)")
    return key.strip(), value


_BENCH_POINTER = (
    "kvlog: the benchmark suite is not installed with kvlog; from a source checkout run "
    "`make bench` or `python -m benchmarks [--quick] [--only ID] [--out FILE]`"
)


def _cmd_bench(args: argparse.Namespace) -> int:
    """Say where the benchmark suite is: it lives beside the library, in a source checkout.

    Exits 2 (:attr:`ExitCode.USAGE`): the command is not available in an installed kvlog, a
    matter of how it was called, not a failure of a store.
    """
    print(_BENCH_POINTER, file=sys.stderr)
    return ExitCode.USAGE


def register(sub: Subparsers) -> None:
    """Add the commands that inspect, check and compact a store, and the Spark, demo and bench ones."""
    p = sub.add_parser("stats", help="a short summary of the store (sizes, ages, dirty ratios, errors)")
    add_store_arguments(p)
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print every figure of Store.stats() as JSON")
    shown.add_argument("--prometheus", action="store_true",
                       help="print the store's metrics in Prometheus's text format (the metrics extra)")
    p.set_defaults(func=_cmd_stats)
    p = sub.add_parser("check", help="verify the store's invariants")
    add_store_arguments(p)
    p.set_defaults(func=_cmd_check)
    p = sub.add_parser("compact", help="run one compaction job (with a progress bar on a terminal)")
    add_store_arguments(p)
    p.add_argument("--force", action="store_true", help="clean every partition even if none is eligible")
    p.set_defaults(func=_cmd_compact)

    spark = sub.add_parser("spark", help="cluster-sized work on Spark (local mode by default)")
    spark_sub = spark.add_subparsers(dest="spark_command", required=True, metavar="JOB",
                                     help="the Spark job to run")
    for name, help_text in (("compact", "exact compaction on Spark"),
                            ("materialize", "write the latest state as Parquet"),
                            ("rebuild-index", "build the key index on Spark into a cache directory")):
        p = spark_sub.add_parser(name, help=help_text)
        p.add_argument("uri", type=uri_arg, help="the store: a directory, file:///abs/dir or s3://bucket/prefix")
        if name == "materialize":
            p.add_argument("out", help="output directory of the Parquet table")
        if name == "rebuild-index":
            p.add_argument("cache_dir", help="the LMDB cache directory to build")
        if name == "compact":
            p.add_argument("--force", action="store_true", help="clean every partition even if none is eligible")
        p.add_argument("--master", help="Spark master, e.g. spark://127.0.0.1:7077 (default local[*])")
        p.add_argument("--conf", dest="spark_conf", type=_spark_conf_arg, action="append", default=[],
                       metavar="KEY=VALUE", help="a Spark setting for the job's Spark session; repeatable")
        p.add_argument("--storage-options", type=storage_options_arg, metavar="JSON",
                       help="JSON object of object-store options")
        p.set_defaults(func=_cmd_spark)

    p = sub.add_parser("demo", help="the end-to-end demo on a local store")
    p.add_argument("--path", type=uri_arg,
                   help="store directory, missing or empty (default: a new temporary directory)")
    p.add_argument("--records", type=positive_count, default=1_000_000,
                   help="how many records to write (default 1000000)")
    p.add_argument("--no-spark", action="store_true", help="skip the Spark materialization step")
    p.add_argument("--keep", action="store_true", help="keep the store at the end (it is removed otherwise)")
    p.set_defaults(func=_cmd_demo)
    # The suite's own options are taken as given (``+`` is this parser's only option prefix),
    # so any ``kvlog bench ...`` line gets the pointer to the suite, not a usage error.
    p = sub.add_parser("bench", help="where the benchmark suite is (python -m benchmarks, in a checkout)",
                       prefix_chars="+", add_help=False)
    p.add_argument("suite_args", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_bench)
