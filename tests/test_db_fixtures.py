"""Tests of the database fixtures: a fresh, empty, working database per test, dropped afterwards."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
import support
from sqlalchemy.engine import make_url

from waltz.local.processes import free_port


def exercise(url: str) -> None:
    """Check that ``url`` is an empty database in which a table can be created, filled and read."""
    engine = sa.create_engine(url)
    try:
        assert sa.inspect(engine).get_table_names() == []
        metadata = sa.MetaData()
        marks = sa.Table(
            "high_water_marks",
            metadata,
            # autoincrement=False: MySQL/MariaDB would turn an inserted 0 into the next
            # AUTO_INCREMENT value, and partition 0 is a real partition.
            sa.Column("partition_id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("high_water_mark", sa.BigInteger, nullable=False),
        )
        metadata.create_all(engine)
        with engine.begin() as connection:
            connection.execute(
                marks.insert(),
                [{"partition_id": 0, "high_water_mark": -1}, {"partition_id": 1, "high_water_mark": 41}],
            )
        with engine.connect() as connection:
            rows = connection.execute(sa.select(marks).order_by(marks.c.partition_id)).all()
        assert [tuple(row) for row in rows] == [(0, -1), (1, 41)]
    finally:
        engine.dispose()


def test_postgres_url_is_a_fresh_working_database(postgres_url: str) -> None:
    url = make_url(postgres_url)
    assert url.drivername == "postgresql+psycopg"
    assert url.database is not None
    assert url.database.startswith("waltz_test_")
    exercise(postgres_url)


def test_mariadb_url_is_a_fresh_working_database(mariadb_url: str) -> None:
    url = make_url(mariadb_url)
    assert url.drivername == "mysql+pymysql"
    assert url.database is not None
    assert url.database.startswith("waltz_test_")
    exercise(mariadb_url)


@pytest.mark.parametrize("server_name", ["postgres_server", "mariadb_server"])
def test_fresh_database_is_dropped_even_with_open_connections(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    server: support.DatabaseServer = request.getfixturevalue(server_name)
    with server.fresh_database() as url:
        name = make_url(url).database
        assert name is not None
        assert server.database_exists(name)
        engine = sa.create_engine(url)
        leftover = engine.connect()  # a test that forgot to close its connection
        leftover.execute(sa.text("SELECT 1"))
    try:
        assert not server.database_exists(name)
    finally:
        leftover.invalidate()
        engine.dispose()


@pytest.mark.parametrize(
    ("server", "admin_url"),
    [
        (support.POSTGRES, "postgresql://postgres@127.0.0.1:{port}/postgres"),
        (support.MARIADB, "mysql://root@127.0.0.1:{port}"),
    ],
    ids=["postgres", "mariadb"],
)
@pytest.mark.parametrize("ci", [True, False], ids=["ci", "dev"])
def test_an_unreachable_server_fails_under_ci_and_skips_otherwise(
    server: support.DatabaseServer, admin_url: str, ci: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv(server.env_var, admin_url.format(port=port))  # nothing listens there
    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected) as raised:
        server.check_reachable()
    message = str(raised.value)
    assert f"{server.product} at {server.admin_url.drivername}://" in message
    assert f"127.0.0.1:{port}" in message
    assert "is not reachable" in message
    assert server.env_var in message
