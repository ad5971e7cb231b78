"""Which implementation of kvlog's compiled loops runs: the C extension, or its Python twin.

Each C extension of kvlog has a pure-Python twin next to it (``_columns`` and
``_columns_py``, for instance) with the same functions, arguments, results and errors.
:func:`load` imports the extension when it was built and the twin otherwise, so that kvlog
installs and runs where no C compiler was available; the twins are slower, and the first
module that falls back logs one warning saying so (logger ``kvlog``). Setting the environment
variable ``KVLOG_PURE_PYTHON=1`` makes every module take its twin, whether the extensions
were built or not (to test the twins, or to rule the C code out); it is read once, when this
module is imported.

:func:`active` tells which implementation each loaded module runs (``kvlog stats`` and the
tests read it).

This module does no I/O.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType
from typing import Literal

__all__ = ["FORCED", "Implementation", "active", "load"]

Implementation = Literal["c", "python"]

#: Whether ``KVLOG_PURE_PYTHON`` forces the twins (read once, at import).
FORCED = os.environ.get("KVLOG_PURE_PYTHON", "").strip().lower() in ("1", "true", "yes", "on")

_log = logging.getLogger("kvlog")
_active: dict[str, Implementation] = {}
_warned = False


def load(compiled: str, twin: str) -> ModuleType:
    """The module ``compiled`` (a C extension) if it imports and is not ruled out by
    ``KVLOG_PURE_PYTHON``, else the module ``twin`` (its pure-Python equivalent)."""
    global _warned
    if not FORCED:
        try:
            module = importlib.import_module(compiled)
        except ImportError:
            pass
        else:
            _active[compiled] = "c"
            return module
    _active[compiled] = "python"
    if not FORCED and not _warned:
        _warned = True
        # A warning, not an info line: the fallback costs a large factor on puts and commits,
        # which an operator should see once rather than discover in latency graphs.
        _log.warning("kvlog runs without its compiled extensions (%s did not import): "
                     "it works, but puts and commits are slower; reinstall with a C compiler "
                     "to build them", compiled)
    return importlib.import_module(twin)


def active() -> dict[str, Implementation]:
    """Each loaded extension's module name and the implementation that runs it."""
    return dict(_active)
