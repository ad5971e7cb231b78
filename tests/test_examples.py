"""Every program in examples/ runs to completion and prints what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: example -> a line its output must contain
EXPECTED = {
    "basic_usage.py": "basic usage: done",
    "tail_changelog.py": "the rebuilt dict equals the store",
    "object_storage.py": "object storage: done",
    "cache_rebuilder.py": "the rebuilt cache equals the store",
    "materialized_view.py": "the view equals the store",
    "spark_pipeline.py": "spark pipeline: done",  # its main() runs on the Spark tests' session (tests/spark)
    "outside_reader.py": "outside reader: done",  # run on a store by tests/format/test_outside_reader.py
}


def run(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True, text=True, timeout=120, cwd=EXAMPLES.parent,
    )


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize(
    "name",
    [
        "basic_usage.py",
        "tail_changelog.py",
        "cache_rebuilder.py",
        "materialized_view.py",
        pytest.param("object_storage.py", marks=pytest.mark.s3),  # starts its own SeaweedFS
    ],
)
def test_example_runs(name: str) -> None:
    result = run(name)
    assert result.returncode == 0, f"{name} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    assert EXPECTED[name] in result.stdout.splitlines(), result.stdout
