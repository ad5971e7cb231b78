"""The ``native`` fixture (shared by tests/conftest.py): the tests of kvlog's compiled loops run once against each C extension
and once against its pure-Python twin.

A test module that asks for it (``pytestmark = pytest.mark.usefixtures("native")`` or an
argument) runs twice, ids ``c`` and ``python``; meanwhile every wrapper (kvlog.format.columns,
kvlog.index and its cache check, the flusher, the offset map's kernels) calls the implementation of
that run, and the test reaches the raw entry points through the returned :class:`Native`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

import pytest

#: (C extension, its twin, the attributes of wrapper modules that hold the chosen module).
MODULES = {
    "kernels": ("kvlog.compaction._kernels", "kvlog.compaction._kernels_py", ["kvlog.compaction.kernels._kernels"]),
    "columns": ("kvlog.format._columns", "kvlog.format._columns_py", ["kvlog.format.columns._columns"]),
    "runs": ("kvlog.index._runs", "kvlog.index._runs_py",
             ["kvlog.index.runs._runs", "kvlog.index.entry._runs", "kvlog.index.merged._runs",
              "kvlog.index.scan._runs", "kvlog.index.reads._runs"]),
    "merge": ("kvlog.index._merge", "kvlog.index._merge_py", ["kvlog.index.merge._merge"]),
    "cache_check": ("kvlog.index._cache_check", "kvlog.index._cache_check_py", ["kvlog.index.entry._cache_check"]),
    "writebuffer": ("kvlog.log._writebuffer", "kvlog.log._writebuffer_py", []),
}


@dataclass(frozen=True)
class Native:
    """One implementation of the compiled loops: ``c`` or ``python``."""

    name: str
    kernels: ModuleType
    columns: ModuleType
    runs: ModuleType
    merge: ModuleType
    cache_check: ModuleType
    writebuffer: ModuleType

    @property
    def WriteBuffer(self) -> type:  # noqa: N802 - the class it stands for
        cls: type = self.writebuffer.WriteBuffer
        return cls


def implementation(name: str) -> Native:
    """The modules of implementation ``name`` (``c`` imports the extensions: they must be built)."""
    chosen = {key: importlib.import_module(c if name == "c" else twin) for key, (c, twin, _) in MODULES.items()}
    return Native(name, **chosen)


#: The implementations the fixture runs: both, or the one ``KVLOG_NATIVE_ONLY`` names (the
#: AddressSanitizer run, tests/test_sanitized_extensions.py, checks the C extensions alone).
IMPLEMENTATIONS = [name for name in ("c", "python") if os.environ.get("KVLOG_NATIVE_ONLY", name) == name]


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def native(request: pytest.FixtureRequest) -> Iterator[Native]:
    chosen = implementation(request.param)
    with pytest.MonkeyPatch.context() as patch:
        for key, (_c, _twin, holders) in MODULES.items():
            for holder in holders:
                module_name, attribute = holder.rsplit(".", 1)
                patch.setattr(importlib.import_module(module_name), attribute, getattr(chosen, key))
        patch.setattr(importlib.import_module("kvlog.log.flusher"), "WriteBuffer", chosen.WriteBuffer)
        for holder in ("kvlog.index.entry", "kvlog.index.index"):  # the get path's inline check, bound by name
            patch.setattr(importlib.import_module(holder), "index_inline", chosen.runs.inline)
        yield chosen
