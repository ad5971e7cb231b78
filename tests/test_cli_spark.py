"""``kvlog spark ...`` and ``kvlog demo`` with Spark, run as real commands in subprocesses.

Each command starts its own JVM (30-60 s on a loaded 2-core machine), hence
the generous timeouts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import kvlog

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KVLOG = str(Path(sys.executable).with_name("kvlog"))
TIMEOUT_S = 600
#: C1 only and the serial collector: the command's short-lived JVM starts and runs about 30 % faster.
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def run_command(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # XDG_CACHE_HOME: the driver's private metadata caches go with the temporary stores.
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", JDK_JAVA_OPTIONS=FAST_JVM, XDG_CACHE_HOME=str(cwd / "xdg-cache"))
    return subprocess.run([KVLOG, *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd,
                          env=env, check=False)


def test_spark_materialize_command(tmp_path: Path) -> None:
    path = tmp_path / "store"
    model: dict[bytes, bytes] = {}
    with kvlog.open(str(path), partitions=4, background_compaction=False) as store:
        for i in range(3000):
            key, value = b"k%04d" % (i % 700), b"v%d" % i
            if i % 9 == 0:
                store.delete(key)
                model.pop(key, None)
            else:
                store.put(key, value)
                model[key] = value
    out = tmp_path / "latest"
    # --conf reaches the job's session: the Parquet files come out with the codec it names.
    done = run_command("spark", "materialize", str(path), str(out), "--master", "local[2]",
                       "--conf", "spark.sql.parquet.compression.codec=gzip", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["rows"] == len(model)
    table = pq.read_table(out, columns=["key", "value"])
    assert dict(zip(*(c.to_pylist() for c in table.columns), strict=True)) == model
    parts = sorted(out.glob("*.parquet"))
    assert parts and all(pq.ParquetFile(part).metadata.row_group(0).column(0).compression == "GZIP"
                         for part in parts if pq.ParquetFile(part).metadata.num_row_groups)


@pytest.mark.parametrize("bad", ["spark.driver.memory", "=4g"])
def test_spark_bad_conf_is_one_line(bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvlog.cli import main

    path = tmp_path / "store"
    with kvlog.open(str(path), partitions=2) as store:
        store.put("k", "v")
    with pytest.raises(SystemExit) as exit_info:
        main(["spark", "compact", str(path), "--conf", "spark.ui.enabled=true", "--conf", bad])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("kvlog spark compact: error: argument --conf:") and "KEY=VALUE" in err, err


def test_demo_with_spark(tmp_path: Path) -> None:
    """The whole demo with ``--keep``: it passes, every line it prints is its own (the JVM's
    banner and log lines go to ``spark.log`` in the store), each step says when it starts and
    how long it took, and the store is kept where the first and last lines say."""
    path = tmp_path / "demo"
    done = run_command("demo", "--records", "20000", "--path", str(path), "--keep", cwd=tmp_path)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0] == f"kvlog demo: store at {path} (kept at the end)"
    assert lines[-2:] == ["all checks passed", f"kept the demo store at {path}"]
    assert "Spark materialization" in done.stdout
    spark = [line for line in lines if line.startswith("materializing the latest state with Spark")]
    assert len(spark) == 2 and spark[0].endswith(" ...") and " done in " in spark[1], lines
    steps = [line for line in lines if line.endswith(" ...")]
    assert len(steps) >= 6 and all(f"{line[:-4]}: done in " in done.stdout for line in steps)
    own = ("kvlog demo: ", "summary", "  ", "all checks passed", "kept the demo store")
    assert [line for line in lines if line and not line.startswith(own) and not line.endswith(" ...")
            and ": done in " not in line] == []
    assert (path / "kvlog.json").is_file()
    assert "log4j" in (path / "spark.log").read_text()  # what would have been noise
