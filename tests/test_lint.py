"""The code passes ruff and mypy --strict (with no unused ``type: ignore``), as ``make lint`` checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)


def test_ruff_is_clean() -> None:
    done = _run("ruff", "check", "kvlog", "spark_ext", "tests", "benchmarks", "examples")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_mypy_strict_is_clean() -> None:
    done = _run("mypy")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout
