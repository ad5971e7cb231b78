"""``python -m kvlog.bench``: the benchmark suite."""

import sys

from kvlog.bench import main

sys.exit(main())
