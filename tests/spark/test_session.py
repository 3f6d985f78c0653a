"""``spark_session``: a JVM that cannot start is a clear ``SparkUnavailableError``; the console's
progress bar is on unless the caller prints progress of its own; ``quiet_start`` leaves Spark's
start-up notices out unless the operator configured log4j.

Run in a process of its own: the test run's Spark gateway, once launched, is reused by
``getOrCreate`` in this one.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tomllib
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


#: A session started as ``spark_session`` starts it, in a process of its own; what it shows.
SESSION = """
import os
from waltz.spark.session import spark_session
spark = spark_session("local[1]", console_progress={progress}, quiet_start={quiet})
print("COUNT:", spark.range(5).count())
print("PROGRESS:", spark.sparkContext.getConf().get("spark.ui.showConsoleProgress"))
print("ENV:", os.environ.get("LOG4J_CONFIGURATION_FILE"))
try:  # cached, as a rebuild caches the decoded log: the block of the failed task is not stored
    spark.sparkContext.parallelize([0], 1).map(lambda x: 1 // x).cache().collect()
except Exception as exc:
    print("TASK FAILED:", "ZeroDivisionError" in str(exc))
spark.stop()
"""


def _start(
    quiet: bool, env: dict[str, str] | None = None, *, progress: bool = False
) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(
        [sys.executable, "-c", SESSION.format(progress=progress, quiet=quiet)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "COUNT: 5" in run.stdout
    return run


@functools.cache
def _started(quiet: bool) -> subprocess.CompletedProcess[str]:
    """``_start`` in the environment of its first call, once per test run for each ``quiet``: the
    loud start without the progress bar, the quiet one with it (a JVM's start takes seconds, and
    each setting is independent of the other; one test reads both starts, so that two test
    processes never start them twice)."""
    return _start(quiet, progress=quiet)


#: What Spark prints on standard error when its JVM starts with Spark's default profile.
SPARK_NOTICES = (
    "Using Spark's default log4j profile",
    'Setting default log level to "WARN"',
    "To adjust logging level use sc.setLogLevel",
)
#: What Spark logs of a task that raised, each time with the worker's traceback: the executor,
#: the scheduler, and the block manager when the task computed a cached partition.
TASK_LOGS = ("Exception in task", "Lost task", "Putting block")
#: Hadoop's warning that its native library is missing (absent where the library is installed).
NATIVE_LOADER = "NativeCodeLoader"


@pytest.mark.slow  # two JVM starts; the static tests below check the file that quiets them
def test_a_quiet_start_leaves_out_sparks_notices_and_the_progress_bar_is_on_unless_turned_off() -> None:
    loud = _started(quiet=False)
    assert [n for n in SPARK_NOTICES if n not in loud.stderr] == [], loud.stderr  # what it removes
    quiet = _started(quiet=True)
    assert [n for n in SPARK_NOTICES if n in quiet.stderr] == [], quiet.stderr
    if NATIVE_LOADER in loud.stderr:
        assert NATIVE_LOADER not in quiet.stderr, quiet.stderr
    # The file is handed to the JVM only: the caller's environment is as it was.
    assert "ENV: None" in quiet.stdout
    # A task that raised: its error reaches the caller, which says it in its own words, without the
    # worker's traceback logged twice before (by the executor, then as the lost task).
    for run in (loud, quiet):
        assert "TASK FAILED: True" in run.stdout, run.stdout + run.stderr
    assert [n for n in TASK_LOGS if n not in loud.stderr] == [], loud.stderr  # what it removes
    assert "Traceback" in loud.stderr, loud.stderr
    assert [n for n in TASK_LOGS if n in quiet.stderr] == [], quiet.stderr
    assert "Traceback" not in quiet.stderr, quiet.stderr
    shown = {
        progress: next(line for line in run.stdout.splitlines() if line.startswith("PROGRESS:"))
        for progress, run in ((True, quiet), (False, loud))
    }
    assert shown == {True: "PROGRESS: true", False: "PROGRESS: false"}


# A JVM start: test_a_log4j_file_in_sparks_configuration_directory_is_the_operators checks the choice.
@pytest.mark.slow
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


def _quiet_file_set() -> bool:
    with session._log4j_for_start(quiet=True):
        value = os.environ.get("LOG4J_CONFIGURATION_FILE")
    assert "LOG4J_CONFIGURATION_FILE" not in os.environ  # as it was
    assert value in (None, str(session.QUIET_LOG4J))
    return value is not None


@pytest.fixture
def no_log4j_settings(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("LOG4J_CONFIGURATION_FILE", "SPARK_CONF_DIR", "SPARK_HOME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_log4j_file_in_sparks_configuration_directory_is_the_operators(
    tmp_path: Path, no_log4j_settings: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    no_log4j_settings.setenv("SPARK_CONF_DIR", str(conf))
    (conf / "log4j2.properties.template").write_text("rootLogger.level = info\n")  # as Spark ships
    assert _quiet_file_set()
    (conf / "log4j2-test.xml").write_text("<Configuration/>\n")
    assert not _quiet_file_set()
    with session._log4j_for_start(quiet=False):
        assert "LOG4J_CONFIGURATION_FILE" not in os.environ


def test_sparks_configuration_directory_is_found_as_its_scripts_find_it(
    tmp_path: Path, no_log4j_settings: pytest.MonkeyPatch
) -> None:
    import pyspark

    installed = Path(pyspark.__file__).parent / "conf"
    # No SPARK_HOME: the installed PySpark's conf; as shipped, no log4j file.
    assert _quiet_file_set() == (not any((installed / n).is_file() for n in session._LOG4J_FILES))
    package = tmp_path / "site-packages" / "pyspark"
    (package / "conf").mkdir(parents=True)
    (package / "conf" / "log4j2.properties").write_text("rootLogger.level = info\n")
    no_log4j_settings.setattr(pyspark, "__file__", str(package / "__init__.py"))
    assert not _quiet_file_set()
    home = tmp_path / "spark-home"
    (home / "conf").mkdir(parents=True)
    no_log4j_settings.setenv("SPARK_HOME", str(home))
    assert _quiet_file_set()
    (home / "conf" / "log4j2.yaml").write_text("Configuration: {}\n")
    assert not _quiet_file_set()
    # SPARK_CONF_DIR, when set, is the directory, in place of SPARK_HOME/conf.
    empty = tmp_path / "conf"
    empty.mkdir()
    no_log4j_settings.setenv("SPARK_CONF_DIR", str(empty))
    assert _quiet_file_set()


def test_the_environment_is_restored_when_the_start_fails(no_log4j_settings: pytest.MonkeyPatch) -> None:
    no_log4j_settings.setenv("SPARK_CONF_DIR", "/nonexistent")
    with pytest.raises(RuntimeError), session._log4j_for_start(quiet=True):
        assert os.environ["LOG4J_CONFIGURATION_FILE"] == str(session.QUIET_LOG4J)
        raise RuntimeError("the JVM did not start")
    assert "LOG4J_CONFIGURATION_FILE" not in os.environ


def test_the_quiet_configuration_keeps_what_sparks_default_profile_quiets() -> None:
    """Every logger Spark's own default profile sets is set alike in ``QUIET_LOG4J`` (or quieter,
    as the shell's ``repl`` loggers, which the root level covers), and the file is package data."""
    import zipfile

    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-common-utils*.jar"))
    assert jars, "no spark-common-utils jar in the installed PySpark"
    with zipfile.ZipFile(jars[0]) as jar:
        defaults = jar.read("org/apache/spark/log4j2-defaults.properties").decode()

    def loggers(text: str) -> dict[str, str]:
        """Logger name -> level, from the ``logger.<id>.name`` and ``logger.<id>.level`` lines."""
        pairs = {
            key.strip(): value.strip()
            for key, _, value in (line.partition("=") for line in text.splitlines())
            if key.startswith("logger.")
        }
        return {
            name: pairs[key.removesuffix(".name") + ".level"]
            for key, name in pairs.items()
            if key.endswith(".name")
        }

    ours = loggers(session.QUIET_LOG4J.read_text())
    theirs = {name: level for name, level in loggers(defaults).items() if ".repl." not in name}
    assert {name: ours.get(name) for name in theirs} == theirs
    assert ours["org.apache.hadoop.util.NativeCodeLoader"] == "error"
    # A failed task's traceback, logged by each of these before the job's failure carries it.
    assert ours["org.apache.spark.executor.Executor"] == "fatal"
    assert ours["org.apache.spark.scheduler.TaskSetManager"] == "error"
    assert ours["org.apache.spark.storage.BlockManager"] == "error"
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert "spark/log4j2-quiet.properties" in pyproject["tool"]["setuptools"]["package-data"]["waltz"]
