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
nitpicky = False
suppress_warnings: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}

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
