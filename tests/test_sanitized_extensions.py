"""The C extensions' tests again, against a build with AddressSanitizer.

A read or write outside a buffer does not always crash; AddressSanitizer makes each one fail
the run. The five extensions are compiled with ``-fsanitize=address`` into a copy of the
``kvlog`` package in a temporary directory, and pytest runs, in a child process with
``libasan`` preloaded (the interpreter itself is not instrumented), the tests that drive them:
the column and index-run tests, the malformed-input fuzzing of every entry point and decoder
(the cache file check among them), the offset map's kernels and the write buffer, each against
the C extensions only (``KVLOG_NATIVE_ONLY=c``: their runs against the Python twins need no
sanitizer, and the suite makes them anyway). Leak checking is off: CPython keeps memory until
exit on purpose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXTENSIONS = {
    "kvlog/compaction/_kernels": "kvlog/compaction/_kernels.c",
    "kvlog/log/_writebuffer": "kvlog/log/_writebuffer.c",
    "kvlog/format/_columns": "kvlog/format/_columns.c",
    "kvlog/index/_runs": "kvlog/index/_runs.c",
    "kvlog/index/_cache_check": "kvlog/index/_cache_check.c",
    "kvlog/index/_merge": "kvlog/index/_merge.c",
}
#: The tests that call the extensions (the other format tests are Python and pyarrow alone).
TESTS = [
    "tests/format/test_columns.py", "tests/format/test_latest_rows.py", "tests/index/test_index_run_format.py",
    "tests/format/test_fuzz_extensions.py", "tests/format/test_fuzz_decoders.py",
    "tests/compaction/test_offset_map.py", "tests/log/test_writebuffer.py",
    "tests/index/test_settle_merge.py", "tests/index/test_merged_scan.py", "tests/index/test_reused_reads.py",
]


def _libasan() -> str | None:
    """The shared AddressSanitizer runtime of the system's gcc, if there is one."""
    if shutil.which("gcc") is None:
        return None
    try:
        found = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                               timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return found if os.path.isabs(found) and os.path.exists(found) else None


def _build(package: Path) -> None:
    """Compile the extensions with AddressSanitizer into ``package`` (a copy of kvlog)."""
    include = sysconfig.get_paths()["include"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for module, source in EXTENSIONS.items():
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-std=c11", "-O1", "-g", "-fsanitize=address",
             "-fno-omit-frame-pointer", f"-I{include}", str(REPO / source),
             "-o", str(package.parent / (module + suffix))],
            check=True, capture_output=True, timeout=300,
        )


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the run it starts has its own 1200 s guard; the suite's is 600 s a test
def test_extensions_under_address_sanitizer(tmp_path: Path) -> None:
    libasan = _libasan()
    # The machines this project runs on ship gcc with libasan: its absence is a broken setup.
    assert libasan is not None, "no gcc with a shared AddressSanitizer runtime (libasan) on PATH"
    package = tmp_path / "kvlog"
    shutil.copytree(REPO / "kvlog", package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    _build(package)
    # PYTHONMALLOC=malloc: every Python object in a heap block of its own, with red zones (in
    # pymalloc's arenas a read past a small bytes object would go unseen).
    # kvlog from the copy, first on the path; the tests' shared helpers (tests.native) from the
    # repository.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]), LD_PRELOAD=libasan, PYTHONDONTWRITEBYTECODE="1",
               PYTHONMALLOC="malloc", ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1")
    env.pop("KVLOG_FUZZ_EXAMPLES", None)
    env.pop("KVLOG_PURE_PYTHON", None)  # the wrappers call the instrumented extensions
    env["KVLOG_NATIVE_ONLY"] = "c"  # the tests' Python-twin runs need no sanitizer (the suite runs them)
    # The child imports kvlog from the copy (the working directory is not the repository).
    where = subprocess.run(
        [sys.executable, "-c", "import kvlog.index._runs as m, kvlog.index._cache_check as k, "
         "kvlog.format._columns as c; print(m.__file__, k.__file__, c.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(path.startswith(str(package)) for path in where.stdout.split()), where.stdout
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--rootdir", str(REPO),
         "-c", str(REPO / "pyproject.toml"), "-o", "pythonpath=", "-m", "not slow",
         *[str(REPO / test) for test in TESTS]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200,  # a hang guard, not a budget
    )
    output = run.stdout[-4000:] + run.stderr[-4000:]
    assert "AddressSanitizer" not in run.stderr, output
    assert run.returncode == 0, output
