"""``python -m kvlog``: the ``kvlog`` command line, for an environment whose scripts are not on PATH."""

import sys

from kvlog.cli import main

sys.exit(main())
