"""A Spark session set up for Waltz: loopback, no UI, our Python, JDBC jars (and a check for them).

Source: ``docs/spark.md`` ("``waltz rebuild``": ``local[*]`` by default, any master with
``--master``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waltz.spark.errors import SparkUnavailableError

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_JDBC_DIR",
    "JDBC_DIR_ENV",
    "JDBC_DRIVERS",
    "JDBC_JARS",
    "QUIET_LOG4J",
    "UTC_JVM_OPTION",
    "JdbcDriver",
    "is_local_master",
    "jdbc_dir",
    "jdbc_jars",
    "register",
    "require_jdbc_driver",
    "require_spark",
    "spark_session",
]


@dataclass(frozen=True, slots=True)
class JdbcDriver:
    """A database's JDBC driver, as the rebuild finds it (docs/spark.md, "``waltz rebuild``").

    Attributes:
        database: the database's name in messages (``PostgreSQL``).
        jar: the jar's file name in :func:`jdbc_dir` (Debian's name).
        debian_package: the Debian package that installs it there.
        maven: the driver's Maven Central coordinates, where its jar can be downloaded.
    """

    database: str
    jar: str
    debian_package: str
    maven: str


#: The JDBC drivers by SQLAlchemy backend name: Debian's (``libpostgresql-jdbc-java``,
#: ``libmariadb-java``), whose jars a Spark session takes from :func:`jdbc_dir` when present.
JDBC_DRIVERS = {
    "postgresql": JdbcDriver(
        "PostgreSQL", "postgresql.jar", "libpostgresql-jdbc-java", "org.postgresql:postgresql"
    ),
    "mariadb": JdbcDriver(
        "MariaDB", "mariadb-java-client.jar", "libmariadb-java", "org.mariadb.jdbc:mariadb-java-client"
    ),
}
JDBC_DRIVERS["mysql"] = JDBC_DRIVERS["mariadb"]  # the MariaDB driver writes MySQL URLs' databases too

#: The environment variable naming the directory of the JDBC drivers' jars (docs/spark.md).
JDBC_DIR_ENV = "WALTZ_SPARK_JDBC_DIR"

#: Where Debian installs the JDBC drivers: the directory when :data:`JDBC_DIR_ENV` is not set.
DEFAULT_JDBC_DIR = "/usr/share/java"

#: The JDBC drivers' jars in :data:`DEFAULT_JDBC_DIR`.
JDBC_JARS = tuple(str(Path(DEFAULT_JDBC_DIR) / d.jar) for d in dict.fromkeys(JDBC_DRIVERS.values()))

#: The log4j 2 configuration of ``quiet_start``: Spark's warnings and errors, without its start-up
#: notices, Hadoop's native-library warning and a failed task's traceback logged before the job's
#: failure carries it (docs/spark.md, its opening).
QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")

#: The JVM option that makes UTC the default time zone of Spark's driver and executors.
UTC_JVM_OPTION = "-Duser.timezone=UTC"

#: The Spark settings that carry :data:`UTC_JVM_OPTION` to the driver's and the executors' JVMs.
_JAVA_OPTIONS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")

#: The environment variable log4j 2 reads its configuration file from (a ``-Dlog4j2.configurationFile``
#: system property, as in ``spark.driver.extraJavaOptions``, takes precedence over it).
_LOG4J_ENV = "LOG4J_CONFIGURATION_FILE"

#: The files log4j 2 finds on the classpath by itself, which the environment variable would override.
_LOG4J_FILES = tuple(
    f"{stem}.{extension}"
    for stem in ("log4j2-test", "log4j2")
    for extension in ("properties", "yaml", "yml", "json", "jsn", "xml")
)


def register(spark: Any) -> None:
    """Register the ``waltz`` data source with ``spark`` (a ``pyspark.sql.SparkSession``).

    Raises:
        SparkUnavailableError: PySpark or pyarrow is not importable.
    """
    require_spark()
    from waltz.spark.source import WaltzDataSource

    spark.dataSource.register(WaltzDataSource)


def require_spark() -> None:
    """Check that PySpark and pyarrow are importable.

    Raises:
        SparkUnavailableError: either is missing, saying what to install.
    """
    missing = []
    for module in ("pyspark", "pyarrow"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise SparkUnavailableError(
            f"{' and '.join(missing)} not importable: install the spark extra "
            "(pip install 'waltz-py[spark]'; in a clone, WALTZ_EXTRAS=dev,sql,spark scripts/setup)"
        )


def jdbc_dir() -> Path:
    """The directory of the JDBC drivers' jars: :data:`JDBC_DIR_ENV` when set and not empty,
    else :data:`DEFAULT_JDBC_DIR` (docs/spark.md, "``waltz rebuild``")."""
    return Path(os.environ.get(JDBC_DIR_ENV) or DEFAULT_JDBC_DIR)


def jdbc_jars() -> list[Path]:
    """The JDBC drivers' jars that :func:`jdbc_dir` holds (of :data:`JDBC_DRIVERS`), which a
    Spark session puts on ``spark.jars``."""
    found = (jdbc_dir() / d.jar for d in dict.fromkeys(JDBC_DRIVERS.values()))
    return [jar for jar in found if jar.is_file()]


def require_jdbc_driver(url: str, option: str) -> None:
    """Check, before Spark starts, that the JDBC driver a database URL needs is in
    :func:`jdbc_dir`: Spark reads and writes PostgreSQL and MariaDB over JDBC, and without the
    driver fails only when it first connects, after reading the whole log (docs/spark.md,
    "``waltz rebuild``"). A SQLite URL, or one that does not parse, needs none (the database's own
    check reports the latter).

    Args:
        url: the database's SQLAlchemy URL.
        option: what names the URL in the message (``--db``).

    Raises:
        ConfigurationError: the driver's jar is missing, naming it, the Debian package that
            installs it and where else to get it.
    """
    from waltz.errors import ConfigurationError

    scheme = url.split("://", 1)[0] if "://" in url else ""
    driver = JDBC_DRIVERS.get(scheme.split("+", 1)[0].lower())
    if driver is None:
        return
    jar = jdbc_dir() / driver.jar
    if jar.is_file():
        return
    raise ConfigurationError(
        f"{option}: Spark reaches {driver.database} databases through the JDBC driver {jar}, which is "
        f"missing: install the Debian package {driver.debian_package}, or download the driver's jar "
        f"(Maven Central {driver.maven}) as {driver.jar} into a directory and name it in {JDBC_DIR_ENV}"
    )


def spark_session(
    master: str | None = None,
    *,
    app_name: str = "waltz",
    shuffle_partitions: int | None = None,
    console_progress: bool = True,
    quiet_start: bool = False,
) -> Any:
    """Get or create a Spark session with the ``waltz`` data source registered.

    For a local master (``local``, ``local[N]``, ``local[*]``, the default) it keeps everything on
    this machine's loopback: ``SPARK_LOCAL_IP=127.0.0.1`` and the driver bound to it (unless
    ``SPARK_LOCAL_IP`` is set), and ``PYSPARK_PYTHON`` set to this interpreter so workers import
    waltz. For any other master it sets none of these: the cluster's executors must reach the
    driver, and run a Python with waltz-py installed (``PYSPARK_PYTHON`` on the executors, as
    Spark documents). Always: no UI, no Python data source filter pushdown, the JDBC drivers'
    jars that exist in :func:`jdbc_dir` (``spark.jars``, shipped to the executors), and UTC as the
    time zone of the SQL session and of the driver's and executors' JVMs
    (:data:`UTC_JVM_OPTION` after the ``spark.driver.extraJavaOptions`` and
    ``spark.executor.extraJavaOptions`` that ``spark-defaults.conf`` gives): the JDBC drivers
    convert timestamps in the JVM's zone, and a naive timestamp written or read in another one
    moves (docs/design/spark.md, "Swapping tables with the marks"). A warning is logged when the
    session's settings lack it (a session made before, or ``PYSPARK_SUBMIT_ARGS`` giving Java
    options of its own).

    Args:
        master: the Spark master URL (default ``local[*]``).
        app_name: the application name.
        shuffle_partitions: ``spark.sql.shuffle.partitions`` (default: 2 x the local cores).
        console_progress: ``spark.ui.showConsoleProgress``: Spark draws each stage's progress bar
            on standard error. Off for a caller that prints progress lines of its own, which the
            bar would be drawn over (``waltz demo``). Like every setting here, it applies only
            when this call creates the session.
        quiet_start: start Spark's JVM with :data:`QUIET_LOG4J` as its log4j configuration, so that
            standard error gets Spark's warnings and errors but not the lines it prints on every
            start (its default log4j profile, the default level and how to change it, Hadoop's
            missing native library), nor a failed task's traceback before the job's failure,
            which carries it: for commands whose own lines they would interrupt
            (``waltz demo``, ``waltz rebuild``). Only when this call launches the JVM (the
            process's first session; not under ``PYSPARK_GATEWAY_PORT``), and only when nothing
            else configures log4j: the ``LOG4J_CONFIGURATION_FILE`` environment variable, or a
            ``log4j2.*`` or ``log4j2-test.*`` file in Spark's configuration directory
            (``SPARK_CONF_DIR``, else ``SPARK_HOME/conf``, else the ``conf`` directory of the
            installed PySpark); a ``-Dlog4j2.configurationFile`` in
            ``spark.driver.extraJavaOptions`` wins over it. A log4j file elsewhere on Spark's
            classpath (``HADOOP_CONF_DIR``, ``spark.driver.extraClassPath``) is not looked for:
            name it in ``LOG4J_CONFIGURATION_FILE``. The variable is in this process's environment
            while the JVM starts, so a subprocess another thread starts then inherits it. The
            JVM's own ``WARNING: Using incubator modules`` line stays.

    Returns:
        A ``pyspark.sql.SparkSession``.

    Raises:
        SparkUnavailableError: PySpark or pyarrow is missing, or Spark's JVM exited before it
            started (no ``java`` on ``PATH`` nor in ``JAVA_HOME``, or the JVM could not start: its
            own output, on this process's standard error, says why).
    """
    require_spark()
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    master = master or "local[*]"
    local = is_local_master(master)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    jars = ",".join(str(jar) for jar in jdbc_jars())
    shuffle = shuffle_partitions or max(2, 2 * (os.cpu_count() or 1))
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true" if console_progress else "false")
        # The waltz source pushes no filters down (decision 0097): PySpark 4.3 reuses a pushed
        # plan for the next query of the same DataFrame that pushes none.
        .config("spark.sql.python.filterPushdown.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle))
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key in _JAVA_OPTIONS:
        builder = builder.config(key, _with_utc(_spark_defaults().get(key, "")))
    if local:
        builder = builder.config("spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"])
    if jars:
        builder = builder.config("spark.jars", jars)
    try:
        with _log4j_for_start(quiet_start):
            spark = builder.getOrCreate()
    except PySparkRuntimeError as e:
        if e.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        java_home = os.environ.get("JAVA_HOME")
        raise SparkUnavailableError(
            "Spark's JVM exited before it started; its own output, above on standard error, says "
            f"why (java: {shutil.which('java') or 'not on PATH'}, "
            f"JAVA_HOME: {java_home or 'not set'})"
        ) from e
    _warn_unless_utc(spark)
    register(spark)
    return spark


def _with_utc(options: str) -> str:
    """Java options, as given, with :data:`UTC_JVM_OPTION` after them (the last
    ``-Duser.timezone`` wins)."""
    return f"{options.strip()} {UTC_JVM_OPTION}".strip()


def _warn_unless_utc(spark: Any) -> None:
    """Log a warning when the session's JVMs were not given :data:`UTC_JVM_OPTION` (a session made
    before, or ``PYSPARK_SUBMIT_ARGS`` giving Java options of its own): their time zone then
    shifts naive timestamps in JDBC writes and reads."""
    conf = spark.sparkContext.getConf()
    missing = [key for key in _JAVA_OPTIONS if UTC_JVM_OPTION not in (conf.get(key) or "").split()]
    if missing:
        log.warning(
            "the Spark session's %s lack %s: a JVM in another time zone shifts naive timestamps written "
            "to or read from a database; add it (docs/spark.md, the `waltz rebuild` section)",
            " and ".join(missing),
            UTC_JVM_OPTION,
        )


def _spark_conf_dir() -> Path:
    """Spark's configuration directory, as its launch scripts choose it: ``SPARK_CONF_DIR``, else
    ``SPARK_HOME/conf``, else the installed PySpark's ``conf``."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        home = os.environ.get("SPARK_HOME")
        if not home:
            import pyspark

            home = os.path.dirname(pyspark.__file__)
        conf_dir = os.path.join(home, "conf")
    return Path(conf_dir)


def _spark_defaults() -> dict[str, str]:
    """The settings of ``spark-defaults.conf`` in :func:`_spark_conf_dir` (none when it is absent
    or unreadable): a setting this module gives replaces the file's, so it keeps the file's own
    Java options beside :data:`UTC_JVM_OPTION`."""
    try:
        lines = (_spark_conf_dir() / "spark-defaults.conf").read_text().splitlines()
    except OSError:
        return {}
    settings: dict[str, str] = {}
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")):
            continue
        found = re.match(r"(\S+?)(?:\s*[=:]\s*|\s+)(.*)$", stripped)
        if found is None:
            settings[stripped] = ""
        else:
            settings[found.group(1)] = found.group(2).strip()
    return settings


@contextlib.contextmanager
def _log4j_for_start(quiet: bool) -> Iterator[None]:
    """While Spark's JVM starts: ``LOG4J_CONFIGURATION_FILE`` naming :data:`QUIET_LOG4J` when
    ``quiet`` and nothing else configures log4j (see ``spark_session``), then the environment as
    it was (the JVM is the only process that needs it)."""
    if not quiet or _LOG4J_ENV in os.environ or _spark_conf_configures_log4j():
        yield
        return
    os.environ[_LOG4J_ENV] = str(QUIET_LOG4J)
    try:
        yield
    finally:
        os.environ.pop(_LOG4J_ENV, None)


def _spark_conf_configures_log4j() -> bool:
    """Whether Spark's configuration directory (on the JVM's classpath) holds a log4j 2 file of
    the operator's: ``SPARK_CONF_DIR``, else ``SPARK_HOME/conf``, else the installed PySpark's
    ``conf``, as Spark's launch scripts choose it (its ``*.template`` files are not)."""
    return any((_spark_conf_dir() / name).is_file() for name in _LOG4J_FILES)


def is_local_master(master: str) -> bool:
    """True for Spark's in-process masters: ``local``, ``local[N]``, ``local[*]``, ``local[N,F]``."""
    return master == "local" or master.startswith("local[")
