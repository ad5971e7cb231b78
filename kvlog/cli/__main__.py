"""``python -m kvlog.cli``: the ``kvlog`` command line (as ``python -m kvlog``)."""

import sys

from kvlog.cli import main

if __name__ == "__main__":  # imported (by pydoc, a module walk), it runs nothing
    sys.exit(main())
