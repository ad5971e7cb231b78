"""A SparkSession fit for kvlog on a small machine, local mode by default."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any, TextIO

from kvlog.errors import ConfigError

__all__ = ["get_session", "check_java", "console_progress", "SESSION_DEFAULTS"]

#: The settings :func:`get_session` gives a Spark session it builds (a keyword or ``ui`` overrides them).
SESSION_DEFAULTS: dict[str, str] = {
    # 16 shuffle partitions: Spark's 200 made deduplication about 1.8x slower on 2 cores.
    "spark.sql.shuffle.partitions": "16",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.python.filterPushdown.enabled": "true",
}


def console_progress(stream: TextIO) -> str:
    """``spark.ui.showConsoleProgress`` for a Spark session whose stderr is ``stream``: on a terminal only."""
    return "true" if stream.isatty() else "false"


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


def get_session(master: str | None = None, *, app_name: str = "kvlog", ui: bool | str = False,
                **conf: Any) -> Any:
    """A SparkSession: the active one if any, else a new one, ``local[*]`` unless ``master`` is given.

    A new Spark session gets ``SESSION_DEFAULTS`` (16 shuffle partitions, Arrow transfers, filter pushdown into Python data sources), ``PYSPARK_PYTHON`` set to
    this interpreter (so workers import pyarrow and kvlog) and passed to the executors, and
    binds to loopback in local mode. The console progress bar is on when stderr is a
    terminal. The web UI is off unless ``ui=True`` (or ``"true"``, or
    ``spark.ui.enabled`` is given): it keeps every job's details in the driver's memory,
    which a small machine needs for the jobs. (``ui`` takes Spark's text too, so a
    ``**dict[str, str]`` of settings type-checks.) Each keyword is a Spark setting
    (``**{"spark.driver.memory": "4g"}``) and wins over these defaults.

    The active Spark session is returned as it is, with only the keywords applied (the ones Spark
    can change at run time): the defaults never override the settings of a Spark session the
    caller built.
    """
    check_java()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return SparkSession.builder.config(map=conf).getOrCreate() if conf else active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master is None or master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings: dict[str, Any] = {
        **SESSION_DEFAULTS,
        "spark.ui.enabled": ui,
        # The console progress bar (stages running longer than 0.5 s, on stderr) on a terminal, so
        # a long job is never silent there; a log file or a pipe gets no bar lines.
        "spark.ui.showConsoleProgress": console_progress(sys.stderr),
        "spark.executorEnv.PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
        **conf,
    }
    builder = SparkSession.builder.appName(app_name).master(master or os.environ.get("KVLOG_SPARK_MASTER", "local[*]"))
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
