"""``spark_session``: a JVM that cannot start is a clear ``SparkUnavailableError``.

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
