"""Builds kvlog's C extensions; everything else about the package is in setup.cfg.

Each extension has a pure-Python twin (``kvlog._native`` picks one): an extension that does
not build (no C compiler, no Python headers) is left out with one line saying so, and the
install goes on without it.
"""

import os
import re
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: A failed compiler run, as distutils words it (the command as a list, or as a name).
_FAILED_COMMAND = re.compile(
    r"command '\[?'?(?P<program>[^',\]]+)'?.*?(?:returned non-zero exit status|failed with exit code)"
    r" (?P<status>-?\d+)", re.IGNORECASE | re.DOTALL)


def _reason(error: Exception) -> str:
    """Why an extension did not build, in a few words: the compiler and its exit status when a
    compiler ran (its own messages are printed above), else the error's first line."""
    text = " ".join(str(error).split())
    found = _FAILED_COMMAND.search(text)
    if found:
        return f"{os.path.basename(found['program'])} exited with status {found['status']}"
    return f"{type(error).__name__}: {text[:160]}" if text else type(error).__name__


class OptionalBuildExt(build_ext):
    """build_ext that skips, with one line on stderr, each extension that fails to compile."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001 - CCompilerError, DistutilsExecError, OSError, ...
            print(f"kvlog: building {ext.name} failed ({_reason(e)}); "
                  f"kvlog will use its pure-Python twin, which is slower", file=sys.stderr)


COMPILE = ["-O3", "-std=c11"]
#: The headers the key index's extensions include.
INDEX_HEADERS = ["kvlog/index/_index_entry.h", "kvlog/_key_order.h", "kvlog/_crc32c.h"]

setup(
    cmdclass={"build_ext": OptionalBuildExt},
    ext_modules=[
        Extension("kvlog.compaction._kernels", sources=["kvlog/compaction/_kernels.c"],
                  extra_compile_args=COMPILE),
        Extension("kvlog.log._writebuffer", sources=["kvlog/log/_writebuffer.c"], extra_compile_args=COMPILE),
        Extension("kvlog.format._columns", sources=["kvlog/format/_columns.c"],
                  depends=["kvlog/_key_order.h", "kvlog/_crc32c.h"], extra_compile_args=COMPILE),
        Extension("kvlog.index._runs", sources=["kvlog/index/_runs.c"],
                  depends=[*INDEX_HEADERS, "kvlog/index/_scan_walk.h", "kvlog/index/_run_merge.h",
                           "kvlog/index/_runs_get.h", "kvlog/index/_runs_store_get.h"],
                  extra_compile_args=COMPILE),
        Extension("kvlog.index._merge", sources=["kvlog/index/_merge.c"],
                  depends=INDEX_HEADERS, extra_compile_args=COMPILE),
        Extension("kvlog.index._cache_check", sources=["kvlog/index/_cache_check.c"],
                  depends=INDEX_HEADERS, extra_compile_args=COMPILE),
    ],
)
