"""Run kvlog's benchmark suite: ``python benchmarks/run.py [--quick] [--out FILE]``.

A thin wrapper over :mod:`kvlog.bench` (the same as ``kvlog bench``); see
``benchmarks/README.md`` for the method and the results.
"""

from __future__ import annotations

import sys

from kvlog.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
