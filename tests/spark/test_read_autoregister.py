"""A session built the plain way (``SparkSession.builder.getOrCreate()``, Spark's defaults)
reads kvlog stores without ``register``, and ``register`` then gives it pushdown.

Needs a fresh JVM whose settings nobody touched, so it runs in a subprocess (30-60 s);
everything that needs such a session is in this one test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

SCRIPT = r"""
import json, sys
from pyspark.sql import SparkSession

path = sys.argv[1]
conf = "spark.sql.python.filterPushdown.enabled"
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
out = {"conf_before": spark.conf.get(conf, None)}

def read(**options):
    r = spark.read.format("kvlog")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(path)

def plan(df):
    return df._jdf.queryExecution().executedPlan().toString()

def rows(df):
    return sorted([r["partition"], r["offset"], bytes(r["key"]).decode()] for r in df.collect())

# Found by PySpark on its own (the module pyspark_kvlog): no register call.
plain = read().where("partition = 1")
out["plain_rows"] = rows(plain)
out["plain_filter_in_spark"] = " = 1)" in plan(plain)
out["plain_offsets"] = rows(read(startingOffsets='{"2": 5}', endingOffsets='{"2": 9}').where("partition = 2"))
try:
    read(veiw="log")
    out["unknown_option"] = "accepted"
except Exception as e:
    out["unknown_option"] = str(e)

import spark_ext
spark_ext.register(spark)
out["conf_after"] = spark.conf.get(conf, None)
pushed = read().where("partition = 1")
out["pushed_rows"] = rows(pushed)
out["pushed_filter_in_spark"] = " = 1)" in plan(pushed)
spark.stop()
print("RESULT " + json.dumps(out))
"""


def test_a_plain_session_reads_without_register_and_register_adds_pushdown(kv: Any, tmp_path: Path) -> None:
    # What an install ships: the top-level module PySpark looks up.
    from setuptools.config.setupcfg import read_configuration

    assert "pyspark_kvlog" in read_configuration(str(ROOT / "setup.cfg"))["options"]["py_modules"]
    path = tmp_path / "store"
    with kv.open_store(path) as store:
        kv.fill(store, ops=200, keys=30, seed=9)
        everything = kv.log_rows(store)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", JDK_JAVA_OPTIONS=FAST_JVM, XDG_CACHE_HOME=str(tmp_path / "xdg"),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(lines[0].removeprefix("RESULT "))
    want = sorted([p, o, k.decode()] for p, o, _t, k, _v in everything if p == 1)
    assert out["conf_before"] is None
    assert out["plain_rows"] == want and out["plain_filter_in_spark"]
    assert out["plain_offsets"] == sorted([p, o, k.decode()] for p, o, _t, k, _v in everything
                                          if p == 2 and 5 <= o < 9)
    assert "unknown option 'veiw' of the kvlog data source (did you mean 'view'?)" in out["unknown_option"]
    # register set the setting the user left unset and replaced the found data source.
    assert out["conf_after"] == "true"
    assert out["pushed_rows"] == want and not out["pushed_filter_in_spark"]
