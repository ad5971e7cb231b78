"""Optional parts of kvlog and the extra that installs each: one check before any work starts.

The core (local stores, the command line, the demo without Spark) needs no optional
package. ``pip install 'kvlog[s3]'`` adds obstore for ``s3://`` stores, ``kvlog[spark]``
adds PySpark and pandas for the Spark jobs (Spark also needs a Java 17 runtime), and
``kvlog[metrics]`` prometheus_client for :mod:`kvlog.metrics`, and ``kvlog[bench]`` what the
benchmark suite of a source checkout uses. :func:`require`
imports what a piece of work needs and, when something is missing, raises
:class:`~kvlog.errors.MissingExtraError` naming the extra, so a command refuses in one
line instead of failing with a traceback after minutes of work.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from kvlog.errors import MissingExtraError

__all__ = ["EXTRAS", "require"]

#: The modules each extra installs that kvlog imports.
EXTRAS: dict[str, tuple[str, ...]] = {
    "s3": ("obstore",),
    "spark": ("pyspark", "pandas"),
    "bench": ("matplotlib", "rocksdict", "obstore", "pyspark", "pandas"),
    "metrics": ("prometheus_client",),
}

_NOTES = {"spark": " (Spark also needs Java 17 or newer)"}


def require(extra: str, modules: Iterable[str] | None = None, *, purpose: str) -> None:
    """Import ``modules`` (by default every module of ``extra``), or raise
    :class:`~kvlog.errors.MissingExtraError` naming ``extra`` and what ``purpose`` needed it.

    >>> try:
    ...     require("s3", ["no_such_module"], purpose="this example")
    ... except MissingExtraError as e:
    ...     print(e)
    this example needs no_such_module, which is not installed: pip install 'kvlog[s3]'
    """
    for module in EXTRAS[extra] if modules is None else modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            # A module that is there but fails to import names its own cause.
            missing = e.name is not None and module.startswith(e.name)
            detail = "" if missing else f"; importing it failed: {e}"
            raise MissingExtraError(extra, module, purpose, _NOTES.get(extra, "") + detail) from e
