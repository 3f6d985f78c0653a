"""``waltz rebuild`` with a PostgreSQL or MariaDB database whose JDBC driver is missing: refused
before the log is planned and Spark starts, in one line naming the jar and how to install it
(docs/spark.md, "``waltz rebuild``"); the directory of the jars is ``WALTZ_SPARK_JDBC_DIR``."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from waltz.cli.main import app
from waltz.spark.session import jdbc_jars, require_jdbc_driver

#: Wide: rich wraps errors at the terminal width.
_ENV = {"COLUMNS": "300"}


def _rebuild(tmp_path: Path, option: str, url: str, jdbc_dir: Path) -> tuple[int, str]:
    """A rebuild from storage directories that hold no replica, with ``option`` naming ``url``."""
    (tmp_path / "s0").mkdir(exist_ok=True)
    source = ["--storage-dir", str(tmp_path / "s0"), "--replicas", "1"]
    result = CliRunner().invoke(
        app,
        ["rebuild", "--app", "waltz_examples.ledger", *source, option, url],
        env={**_ENV, "WALTZ_SPARK_JDBC_DIR": str(jdbc_dir)},
    )
    return result.exit_code, result.output


@pytest.mark.parametrize("option", ["--db", "--verify-against"])
@pytest.mark.parametrize(
    ("database", "jar", "package"),
    [
        ("postgres_url", "postgresql.jar", "libpostgresql-jdbc-java"),
        ("mariadb_url", "mariadb-java-client.jar", "libmariadb-java"),
    ],
)
def test_a_database_whose_jdbc_driver_is_missing_is_refused_before_spark_starts(
    request: pytest.FixtureRequest, tmp_path: Path, option: str, database: str, jar: str, package: str
) -> None:
    url = str(request.getfixturevalue(database))
    jars = tmp_path / "jars"
    jars.mkdir()
    code, output = _rebuild(tmp_path, option, url, jars)
    assert code == 2, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    assert f"error: {option}: Spark reaches" in errors[0], output
    missing = f"the JDBC driver {jars / jar}, which is missing: install the Debian package {package}"
    assert missing in errors[0], output
    assert "WALTZ_SPARK_JDBC_DIR" in errors[0], output
    assert "planning the log" not in output and "starting Spark" not in output, output
    # With the jar in the directory, the command goes on: to the log, which these directories lack
    # (a live database to verify against is one with the framework's tables).
    (jars / jar).write_bytes(b"")
    if option == "--verify-against":
        from waltz.jdbc_style import migrations_api

        migrations_api.upgrade(url)
    code, output = _rebuild(tmp_path, option, url, jars)
    assert code == 2, output
    assert "planning the log" in output and "JDBC driver" not in output, output


def test_the_jars_are_those_of_the_directory_and_sqlite_needs_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WALTZ_SPARK_JDBC_DIR", str(tmp_path))
    assert jdbc_jars() == []
    (tmp_path / "mariadb-java-client.jar").write_bytes(b"")
    (tmp_path / "postgresql-42.jar").write_bytes(b"")  # not Debian's name: not taken
    assert jdbc_jars() == [tmp_path / "mariadb-java-client.jar"]
    require_jdbc_driver("mysql+pymysql://root@127.0.0.1/ledger", "--db")
    require_jdbc_driver(f"sqlite:///{tmp_path / 'ledger.db'}", "--db")
