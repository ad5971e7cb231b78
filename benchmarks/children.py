"""The environment of the suite's child processes: they import this ``benchmarks`` and this kvlog.

Several benchmarks run a fresh process (``python -m benchmarks.rss``, ``python -m
benchmarks.compaction --child-compact``, the recovery writers and reopens) so that its
memory or its start-up can be measured. Such a child must import the same ``benchmarks``
package and the same ``kvlog`` as the parent whatever its working directory: the
directories holding both go first on its ``PYTHONPATH`` (one directory in a source
checkout; two when kvlog is installed and the suite runs from a checkout).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["child_env", "import_roots"]


def import_roots() -> list[str]:
    """The directories from which kvlog and this ``benchmarks`` package are imported, kvlog's
    first (so that a checkout's ``kvlog/`` never shadows the kvlog this process runs).

    kvlog is located without importing it (its import is one of the measured figures).
    """
    from importlib.util import find_spec

    roots = []
    spec = find_spec("kvlog")
    if spec is not None and spec.origin is not None:
        roots.append(str(Path(spec.origin).resolve().parents[1]))
    own = str(Path(__file__).resolve().parents[1])
    if own not in roots:
        roots.append(own)
    return roots


def child_env() -> dict[str, str]:
    """This process's environment with :func:`import_roots` first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*import_roots(), *filter(None, [env.get("PYTHONPATH")])])
    return env
