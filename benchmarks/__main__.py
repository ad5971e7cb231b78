"""``python -m benchmarks``: the benchmark suite."""

import sys

from benchmarks import main

sys.exit(main())
