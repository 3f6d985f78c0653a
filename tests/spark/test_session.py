"""``spark_session``: a JVM that cannot start is a clear ``SparkUnavailableError``; the console's
progress bar is on unless the caller prints progress of its own; ``quiet_start`` leaves Spark's
start-up notices out unless the operator configured log4j.

Run in a process of its own: the test run's Spark gateway, once launched, is reused by
``getOrCreate`` in this one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from waltz.spark import session

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


QUIET = """
import os
from waltz.spark.session import spark_session
spark = spark_session("local[1]", console_progress=False, quiet_start={quiet})
print("COUNT:", spark.range(5).count())
print("ENV:", os.environ.get("LOG4J_CONFIGURATION_FILE"))
spark.stop()
"""

#: What Spark and Hadoop print on standard error when the JVM starts with Spark's default profile.
START_NOTICES = (
    "Using Spark's default log4j profile",
    'Setting default log level to "WARN"',
    "To adjust logging level use sc.setLogLevel",
    "NativeCodeLoader",
)


def _start(quiet: bool, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(
        [sys.executable, "-c", QUIET.format(quiet=quiet)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "COUNT: 5" in run.stdout
    return run


def test_a_quiet_start_leaves_out_sparks_start_up_notices() -> None:
    loud = _start(quiet=False)
    assert "Using Spark's default log4j profile" in loud.stderr, loud.stderr  # what the option removes
    quiet = _start(quiet=True)
    assert [n for n in START_NOTICES if n in quiet.stderr] == [], quiet.stderr
    # The file is handed to the JVM only: the caller's environment is as it was.
    assert "ENV: None" in quiet.stdout


def test_a_quiet_start_leaves_the_operators_log4j_file(tmp_path: Path) -> None:
    own = tmp_path / "log4j2.properties"
    own.write_text(
        "rootLogger.level = info\n"
        "rootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = OWN %p %c{1}: %m%n\n"
        "logger.context.name = org.apache.spark.SparkContext\n"
        "logger.context.level = info\n"
    )
    run = _start(quiet=True, env={"LOG4J_CONFIGURATION_FILE": str(own)})
    # The operator's layout and levels (PySpark sets the root logger to WARN; a logger of its own
    # keeps INFO).
    assert "OWN INFO SparkContext: Running Spark version" in run.stderr, run.stderr[-3000:]
    assert f"ENV: {own}" in run.stdout


def test_a_log4j_file_in_sparks_configuration_directory_is_the_operators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOG4J_CONFIGURATION_FILE", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    with session._log4j_for_start(quiet=True):
        assert os.environ["LOG4J_CONFIGURATION_FILE"] == str(session.QUIET_LOG4J)
    assert "LOG4J_CONFIGURATION_FILE" not in os.environ
    (tmp_path / "log4j2.properties").write_text("rootLogger.level = info\n")
    with session._log4j_for_start(quiet=True):
        assert "LOG4J_CONFIGURATION_FILE" not in os.environ
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path.parent))
    (tmp_path.parent / "conf").mkdir(exist_ok=True)
    (tmp_path.parent / "conf" / "log4j2.xml").write_text("<Configuration/>\n")
    with session._log4j_for_start(quiet=True):
        assert "LOG4J_CONFIGURATION_FILE" not in os.environ
    with session._log4j_for_start(quiet=False):
        assert "LOG4J_CONFIGURATION_FILE" not in os.environ


def test_the_quiet_configuration_is_installed_with_the_package() -> None:
    text = session.QUIET_LOG4J.read_text()
    assert "rootLogger.level = warn" in text
    assert "logger.nativeloader.level = error" in text
