"""Databases and ZooKeeper for a user's test suite: a given URL, local binaries, or a container.

This machine has the docker client but no Docker engine: the tests here take the paths without
one (a clear message, or Debian's ZooKeeper). The container paths need an engine; they are only
imported here (and type-checked with the package).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import support
from sqlalchemy import text

from waltz.jdbc_style import create_framework_engine
from waltz.local.containers import (
    NoTestServiceError,
    containers_available,
    database_server,
    zookeeper_server,
)

pytest_plugins = ["pytester"]


@pytest.fixture
def no_docker_engine() -> str:
    """Why containers cannot run here (the test is skipped where a Docker engine answers)."""
    reason = containers_available()
    if reason is None:
        pytest.skip("a Docker engine answers here: the path without one cannot be taken")
    return reason


def test_without_a_url_or_docker_a_database_says_how_to_give_a_url(no_docker_engine: str) -> None:
    with (
        pytest.raises(NoTestServiceError) as raised,
        database_server("postgresql", None, option="--waltz-postgres-url"),
    ):
        pytest.fail("a database server was given without a URL or a Docker engine")
    message = str(raised.value)
    assert "give its URL with --waltz-postgres-url" in message
    assert "postgresql+psycopg://" in message
    assert no_docker_engine in message


def test_a_given_url_is_used_as_it_is() -> None:
    with database_server("mariadb", "mysql+pymysql://root@127.0.0.1:3306/test", option="-") as url:
        assert url == "mysql+pymysql://root@127.0.0.1:3306/test"


def test_zookeeper_falls_back_to_the_local_binaries_then_says_what_to_do(
    no_docker_engine: str, tmp_path: Path, zookeeper: object
) -> None:
    with zookeeper_server("127.0.0.1:2181") as given:
        assert given == "127.0.0.1:2181"
    # Debian's ZooKeeper is installed here (the session's `zookeeper` fixture runs it): the
    # local cluster starts it itself.
    with zookeeper_server(None) as local:
        assert local is None
    with pytest.raises(NoTestServiceError) as raised, zookeeper_server(None, java_dir=tmp_path):
        pytest.fail("a ZooKeeper was given without jars or a Docker engine")
    message = str(raised.value)
    assert "apt-get install" in message and "--waltz-zookeeper HOST:PORT" in message
    assert no_docker_engine in message


USER_TESTS = """
from sqlalchemy import create_engine, text


def test_postgres(waltz_postgres_url):
    engine = create_engine(waltz_postgres_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1
    engine.dispose()


def test_mariadb(waltz_mariadb_url):
    pass
"""


def test_the_plugin_gives_the_url_given_and_explains_the_missing_one(
    pytester: pytest.Pytester, no_docker_engine: str, postgres_server: support.DatabaseServer
) -> None:
    admin_url = postgres_server.admin_url.render_as_string(hide_password=False)
    engine = create_framework_engine(admin_url)
    with engine.connect() as conn:  # the server answers before the user suite is run against it
        assert conn.execute(text("SELECT 1")).scalar() == 1
    engine.dispose()
    pytester.makepyfile(test_user=USER_TESTS)

    # -rN: no short summary, whose line repeats the start of the message (cut to the terminal's width)
    result = pytester.runpytest_subprocess(
        "-p",
        "waltz.testing",
        f"--waltz-postgres-url={admin_url}",
        "-p",
        "no:cacheprovider",
        "-rN",
        timeout=120,
    )

    result.assert_outcomes(passed=1, errors=1)
    output = " ".join(result.stdout.str().split())
    told = output.count("no mariadb server for this test suite: give its URL with --waltz-mariadb-url")
    assert told == 1, "the message is printed once:\n" + result.stdout.str()
    assert "the ini option waltz_mariadb_url = URL gives it too" in output, result.stdout.str()
    assert "During handling of the above exception" not in result.stdout.str()


def test_the_container_modules_import() -> None:
    """The container path cannot run without an engine; its modules must at least import."""
    pytest.importorskip("testcontainers", reason="the containers extra is not installed")
    from testcontainers.community.mysql import MySqlContainer
    from testcontainers.community.postgres import PostgresContainer

    assert PostgresContainer.get_connection_url and MySqlContainer.get_connection_url
