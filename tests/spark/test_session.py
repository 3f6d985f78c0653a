"""``spark_session``: a JVM that cannot start is a clear ``SparkUnavailableError``; the console's
progress bar is on unless the caller prints progress of its own.

Run in a process of its own: the test run's Spark gateway, once launched, is reused by
``getOrCreate`` in this one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

SCRIPT = """
from waltz.spark.errors import SparkUnavailableError
from waltz.spark.session import spark_session
try:
    spark_session("local[1]")
except SparkUnavailableError as e:
    print("REFUSED:", e)
else:
    print("STARTED")
"""


def test_a_java_home_without_java_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-jdk"
    env = {**os.environ, "JAVA_HOME": str(missing)}
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert "STARTED" not in run.stdout, run.stdout + run.stderr
    assert "REFUSED: Spark's JVM exited before it started" in run.stdout, run.stdout + run.stderr
    assert f"JAVA_HOME: {missing}" in run.stdout


PROGRESS = """
from waltz.spark.session import spark_session
spark = spark_session("local[1]", console_progress={progress})
print("PROGRESS:", spark.sparkContext.getConf().get("spark.ui.showConsoleProgress"))
spark.stop()
"""


def test_the_console_progress_bar_is_on_unless_turned_off() -> None:
    shown = {}
    for progress in (True, False):
        run = subprocess.run(
            [sys.executable, "-c", PROGRESS.format(progress=progress)],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        shown[progress] = next(line for line in run.stdout.splitlines() if line.startswith("PROGRESS:"))
    assert shown == {True: "PROGRESS: true", False: "PROGRESS: false"}
