"""``python -m tests.torture``: run torture seeds.

    python -m tests.torture --seeds 500                # seeds 0..499 on local storage
    python -m tests.torture --seeds 50 --start 1000    # seeds 1000..1049
    python -m tests.torture --seed 17                  # replay one seed (its log is kept)
    python -m tests.torture --seeds 20 --backend s3    # on a SeaweedFS server started for the run
    python -m tests.torture --seeds 40 --damage        # the damage scenario instead

A failing seed prints its violations, the replay command and where its log is; the exit status
is 1 when any seed failed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from .runner import RunResult, replay_command, run_seed
from .scenarios import SCENARIOS
from .world import Backend


@contextlib.contextmanager
def _backends(kind: str) -> Iterator[object]:
    if kind == "local":
        yield None
        return
    from kvlog.testing import SeaweedServer

    with SeaweedServer() as server:
        server.create_bucket("torture")
        yield server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.torture", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=None, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="the first seed (with --seeds)")
    parser.add_argument("--seed", type=int, action="append", default=None, help="run this seed (repeatable)")
    parser.add_argument("--backend", choices=["local", "s3"], default="local")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default=None, help="force one scenario")
    parser.add_argument("--damage", action="store_true", help="run the damage scenario")
    parser.add_argument("--workdir", type=Path, default=None, help="where run directories go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep every run's directory, passing or not")
    parser.add_argument("--echo", action="store_true", help="print each run's log as it happens")
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first failing seed")
    args = parser.parse_args(argv)
    logging.getLogger("kvlog").propagate = False  # kvlog's log lines go to each run's run.log
    if args.seed:
        seeds = list(args.seed)
        keep = True
    else:
        seeds = list(range(args.start, args.start + (args.seeds if args.seeds is not None else 10)))
        keep = args.keep
    base = args.workdir or Path(tempfile.mkdtemp(prefix="kvlog-torture-"))
    base.mkdir(parents=True, exist_ok=True)
    failed: list[RunResult] = []
    began = time.monotonic()
    with _backends(args.backend) as server:
        for seed in seeds:
            workdir = base / f"seed-{seed}{'-damage' if args.damage else ''}"
            if args.backend == "local":
                backend = Backend("local", str(workdir / "root"))
            else:
                backend = Backend("s3", server.uri("torture", f"seed-{seed}-{uuid.uuid4().hex[:8]}"),  # type: ignore[attr-defined]
                                  dict(server.storage_options))  # type: ignore[attr-defined]
            if args.damage:
                from .damage import run_damage

                result = run_damage(seed, backend, workdir, keep=keep)
            else:
                result = run_seed(seed, backend, workdir, scenario=args.scenario, keep=keep, echo=args.echo)
            print(result.report(), flush=True)
            if not result.ok:
                failed.append(result)
                if args.stop_on_failure:
                    break
    print(f"\n{len(seeds)} seed(s), {len(failed)} failed, {time.monotonic() - began:.0f} s; runs under {base}")
    for result in failed:
        print(f"  seed {result.seed} ({result.scenario}): {replay_command(result.seed, result.backend, result.forced)}"
              f"{' --damage' if args.damage else ''}  # {result.violations[0].splitlines()[0][:150]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
