"""A representative part of the suite with ``KVLOG_PURE_PYTHON=1``: the store, its index runs,
its damaged caches and its compaction running on the Python twins alone.

The extensions' own tests run against both implementations in this process (the ``native``
fixture); this runs the layers above them, in a child process where every twin is forced (the
variable is read once, at import), so the whole suite need not run twice. ``make test-pure``
runs all of the fast suite that way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SUBSET = [
    "tests/store/test_store_api.py", "tests/index/test_store_index_runs.py", "tests/store/test_cache_damage.py",
    "tests/compaction/test_scenarios.py", "tests/log/test_log_basics.py",
]
#: Left to ``make test-pure``: the random cache damage (50 s on the twins, most of this subset).
DESELECT = "not test_random_damage_never_gives_a_wrong_answer"


@pytest.mark.slow
def test_a_representative_subset_passes_on_the_python_twins(tmp_path: Path) -> None:
    env = dict(os.environ, KVLOG_PURE_PYTHON="1", PYTHONPATH=str(REPO))
    check = subprocess.run(
        [sys.executable, "-c", "import kvlog, kvlog._native as n; print(sorted(set(n.active().values())))"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert check.stdout.strip() == "['python']", check.stdout + check.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow and not s3 and not spark",
         "-k", DESELECT, "--basetemp", str(tmp_path / "pytest"), *SUBSET],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
