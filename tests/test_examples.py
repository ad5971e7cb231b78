"""Every program in examples/ runs to completion and prints what it promises."""

from __future__ import annotations

import os
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
    "spark_pipeline.py": "spark pipeline: done",  # run by tests/spark and by the test below
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
        pytest.param("object_storage.py", marks=pytest.mark.s3),  # starts its own SeaweedFS
    ],
)
def test_example_runs(name: str) -> None:
    result = run(name)
    assert result.returncode == 0, f"{name} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    assert EXPECTED[name] in result.stdout.splitlines(), result.stdout


@pytest.mark.spark
@pytest.mark.slow
def test_spark_example_runs_as_a_script(tmp_path: Path) -> None:
    # Its own JVM (30-60 s on a loaded 2-core machine); tests/spark runs its main() on the
    # tests' session too. Its Spark driver keeps its metadata caches under XDG_CACHE_HOME.
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), SPARK_LOCAL_IP="127.0.0.1",
               JDK_JAVA_OPTIONS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    result = subprocess.run([sys.executable, str(EXAMPLES / "spark_pipeline.py")], capture_output=True,
                            text=True, timeout=600, cwd=EXAMPLES.parent, env=env)
    assert result.returncode == 0, f"exited with {result.returncode}:\n{result.stdout}\n{result.stderr[-3000:]}"
    assert EXPECTED["spark_pipeline.py"] in result.stdout.splitlines(), result.stdout
