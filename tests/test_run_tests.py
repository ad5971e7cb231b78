"""``make test`` ends with one line saying what passed: scripts/run_tests.py, run on small test
modules by a real pytest, counts each outcome, and fails when a test fails, when no test is
collected, or when the docs build fails.

The docs builder is the one thing stood in for: ``true`` and ``false`` play a sphinx-build that
succeeds and one that fails, since the script only reads its exit status (the real build runs in
``make test`` and ``make docs``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MIXED = '''
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("a fixture that fails")

def test_passes(): pass
def test_fails(): assert 1 == 2
def test_errors(broken): pass
@pytest.mark.skipif(True, reason="never runs")
def test_skipped(): pass
@pytest.mark.xfail(strict=True)
def test_expected_to_fail(): assert 1 == 2
'''


def _run(tmp_path: Path, *args: str) -> tuple[int, str]:
    module = tmp_path / "test_sample.py"
    module.write_text(MIXED)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_tests.py"), "-q",
                           "-p", "no:cacheprovider", str(module), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    lines = done.stdout.strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


def test_every_outcome_is_counted_and_a_failure_fails(tmp_path: Path) -> None:
    status, last = _run(tmp_path)
    assert last == "kvlog test summary: 1 passed, 1 failed, 1 error, 1 skipped, 1 xfailed"
    assert status == 1


def test_a_clean_run_with_the_docs_built_succeeds(tmp_path: Path) -> None:
    true = shutil.which("true")
    assert true is not None
    status, last = _run(tmp_path, "-k", "passes or skipped or expected", f"--docs={true}")
    assert last == "kvlog test summary: 1 passed, 0 failed, 1 skipped, 1 xfailed; docs built (sphinx -n -W)"
    assert status == 0


def test_a_failed_docs_build_fails_the_run(tmp_path: Path) -> None:
    false = shutil.which("false")
    assert false is not None
    status, last = _run(tmp_path, "-k", "passes", f"--docs={false}")
    assert last == ("kvlog test summary: 1 passed, 0 failed, 0 skipped; "
                    "docs failed (sphinx -n -W exited with status 1)")
    assert status == 1


def test_no_test_collected_is_a_failure(tmp_path: Path) -> None:
    status, last = _run(tmp_path, "-k", "no_test_has_this_name")
    assert last == "kvlog test summary: 0 passed, 0 failed, 0 skipped, pytest collected no tests"
    assert status == 1
