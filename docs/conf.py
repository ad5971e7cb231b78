"""Sphinx configuration of the kvlog documentation."""

from __future__ import annotations

import os
import sys

# Import kvlog from this checkout, installed or not.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

project = "kvlog"
author = "the kvlog authors"
copyright = "the kvlog authors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
]

# No network access while building: intersphinx stays off.
html_theme = "furo"
html_title = "kvlog"
exclude_patterns = ["_build"]
nitpicky = True
suppress_warnings: list[str] = []

# Every cross-reference must resolve (nitpicky), except to these types, which have no
# inventory here: intersphinx is off, so Python's own and third-party documentation cannot
# be linked. Each entry is a type that appears in a public signature or a page.
nitpick_ignore = [
    # The standard library (https://docs.python.org/3/ has the inventory; no network here).
    ("py:mod", "logging"),
    ("py:class", "asyncio.Event"),
    ("py:class", "Future"),  # concurrent.futures.Future, in kvlog.aio.AsyncConsumer's signature
    ("py:class", "logging.NullHandler"),
    ("py:mod", "multiprocessing"),
    ("py:class", "os.PathLike"),
    ("py:class", "pathlib.Path"),
    ("py:class", "Path"),
    ("py:class", "collections.Counter"),
    ("py:class", "collections.abc.AsyncGenerator"),
    ("py:class", "collections.abc.Callable"),
    ("py:class", "collections.abc.Iterable"),
    ("py:class", "collections.abc.Iterator"),
    ("py:class", "collections.abc.Mapping"),
    ("py:class", "collections.abc.MutableMapping"),
    ("py:class", "collections.abc.Sequence"),
    ("py:class", "concurrent.futures.ThreadPoolExecutor"),
    ("py:class", "contextlib.AbstractContextManager"),
    # Third-party libraries in kvlog's signatures (pyarrow, numpy, pyroaring).
    ("py:class", "pyarrow.lib.RecordBatch"),
    ("py:class", "CollectorRegistry"),  # prometheus_client's, in kvlog.metrics.register
    ("py:class", "INotify"),  # inotify_simple's, in kvlog.storage.watch.RenameWatch
    ("py:class", "pyarrow.lib.MemoryPool"),
    ("py:class", "numpy.ndarray"),
    ("py:class", "numpy.integer"),
    ("py:class", "numpy.dtype"),
    ("py:class", "pyroaring.BitMap"),
    # A type variable of AsyncStore.call's signature, rendered as a class reference.
    ("py:class", "kvlog.aio._R"),
    # Internal names in public signatures: the Literal alias of fault kinds ("error",
    # "timeout_after_success", "crash", described with FaultyStorage) and the local
    # implementation of kvlog.storage.ForwardStream that LocalStorage.open_stream returns.
    ("py:class", "FaultKind"),
    ("py:class", "kvlog.storage.local.LocalStream"),
    # Constructor parameters of kvlog.Log and kvlog.Snapshot, which applications never
    # construct (kvlog.open and Store.snapshot do): the store's internal cache, index view
    # and file pin.
    ("py:class", "LmdbEnv"),
    ("py:class", "IndexView"),
    ("py:class", "Pin"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"undoc-members": False}

napoleon_google_docstring = True
napoleon_numpy_docstring = True


def _plain_attribute_docstrings(app, what, name, obj, options, lines):
    """Keep napoleon from reading a colon in an attribute's first line as a type.

    kvlog documents attributes in plain sentences ("... (Kafka: num.partitions)"),
    never as ``type: description``; napoleon would render "Kafka" as the type.
    Napoleon reads only the first line that way, so an empty reST comment put
    first (it renders as nothing) leaves the sentence as it is.
    """
    if what in ("attribute", "data", "property") and lines and ":" in lines[0]:
        lines[0:0] = ["..", ""]


def setup(app):
    # Before napoleon, which handles the same event at the default priority 500.
    app.connect("autodoc-process-docstring", _plain_attribute_docstrings, priority=400)
    return {"parallel_read_safe": True}
