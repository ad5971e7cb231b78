"""A SparkSession fit for kvlog on a small machine, local mode by default."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

from kvlog.errors import ConfigError

__all__ = ["get_session", "check_java"]


def check_java() -> None:
    """Raise a clear ``ConfigError`` when no Java 17+ runtime is available."""
    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) if os.environ.get(
        "JAVA_HOME") else shutil.which("java")
    if java is None:
        raise ConfigError("Spark needs Java 17 or newer: install openjdk-17-jre-headless or set JAVA_HOME")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    try:
        version = out.split('"')[1]
        major = int(version.split(".")[1] if version.startswith("1.") else version.split(".")[0])
    except (IndexError, ValueError):
        return
    if major < 17:
        raise ConfigError(f"Spark needs Java 17 or newer, found {version}: install openjdk-17-jre-headless")


def get_session(master: str | None = None, *, app_name: str = "kvlog", **conf: Any) -> Any:
    """A SparkSession (the active one if any): ``local[*]`` unless ``master`` is given.

    Sets ``PYSPARK_PYTHON`` to this interpreter (so workers import pyarrow and kvlog),
    16 shuffle partitions (200 made dedup about 1.8x slower on 2 cores), Arrow
    transfers, and binds to loopback in local mode.
    """
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master is None or master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or os.environ.get("KVLOG_SPARK_MASTER", "local[*]"))
        .config("spark.sql.shuffle.partitions", "16")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
