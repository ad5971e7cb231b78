"""``python -m kvlog``: the ``kvlog`` command line, for an environment whose scripts are not on PATH.

It runs exactly what the ``kvlog`` console script runs, ``sys.exit(kvlog.cli.main())``, so
the output, the messages and the exit codes are the same (tests/test_cli.py compares them).
"""

import sys

from kvlog.cli import main

if __name__ == "__main__":  # imported (by pydoc, a module walk), it runs nothing
    sys.exit(main())
