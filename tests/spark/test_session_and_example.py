"""``spark_ext.get_session``'s settings, and ``examples/spark_pipeline.py`` on the tests' session."""

from __future__ import annotations

import importlib.util
import os
import pty
from pathlib import Path
from typing import Any

import pytest

import spark_ext

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def test_a_new_session_shows_progress_on_a_terminal_and_no_ui(spark: Any) -> None:
    # The tests' session was built by get_session under pytest's captured stderr: no bar lines.
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.ui.showConsoleProgress") == "false"
    with open(os.devnull, "w") as plain:
        assert spark_ext.console_progress(plain) == "false"
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w") as terminal:
            assert spark_ext.console_progress(terminal) == "true"
    finally:
        os.close(leader)
    assert conf.get("spark.ui.enabled") == "false" and spark.sparkContext.uiWebUrl is None
    assert spark.conf.get("spark.sql.python.filterPushdown.enabled") == "true"


def test_the_active_session_is_returned_with_only_the_given_settings(spark: Any) -> None:
    # The defaults (16 shuffle partitions) never override the settings of a session the caller built.
    assert spark_ext.get_session() is spark
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"
    try:
        assert spark_ext.get_session(**{"spark.sql.shuffle.partitions": "3"}) is spark
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "4")


def test_the_spark_pipeline_example(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("spark_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(spark, str(tmp_path))
    out = capsys.readouterr().out
    assert "FAILED" not in out and out.splitlines()[-1] == "spark pipeline: done", out
    assert out.count("  ok: ") == 6, out
