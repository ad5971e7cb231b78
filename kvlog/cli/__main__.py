"""``python -m kvlog.cli``: the ``kvlog`` command line (as ``python -m kvlog``)."""

import sys

from kvlog.cli import main

sys.exit(main())
