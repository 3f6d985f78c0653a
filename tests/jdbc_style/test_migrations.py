"""The SQL framework's alembic migrations, its operator API and the ``waltz db`` command.

Every database test runs on SQLite (a file under ``tmp_path``), PostgreSQL and MariaDB (a fresh
database each, from ``tests/conftest.py``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.pool import NullPool
from typer.testing import CliRunner, Result

from waltz.cli.main import app
from waltz.errors import SqlFrameworkError
from waltz.jdbc_style import idempotency, skips
from waltz.jdbc_style import migrations_api as api
from waltz.jdbc_style.callbacks import AbstractClientCallbacksForSQL
from waltz.jdbc_style.schema import high_water_marks, metadata, skipped_transactions

FRAMEWORK_TABLES = {"waltz_high_water_marks", "waltz_idempotency_keys", "waltz_skipped_transactions"}
CLUSTER = "orders"


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend, as a SQLAlchemy URL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'app.db'}"
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    """An engine on ``db_url`` without a pool, disposed of before the database is dropped."""
    engine = sa.create_engine(db_url, poolclass=NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'single.db'}", poolclass=NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


def set_mark(engine: sa.Engine, partition_id: int, mark: int, cluster_name: str = CLUSTER) -> None:
    """Write a partition's high-water mark as the framework's apply path does."""
    with engine.begin() as connection:
        connection.execute(
            high_water_marks.insert().values(
                cluster_name=cluster_name,
                partition_id=partition_id,
                high_water_mark=mark,
                updated_at=dt.datetime.now(dt.UTC),
            )
        )


def version_rows(engine: sa.Engine, table: str) -> list[str]:
    with engine.connect() as connection:
        return sorted(connection.execute(sa.text(f"SELECT version_num FROM {table}")).scalars())


def skip(engine: sa.Engine, transaction_id: int, partition_id: int = 0, **overrides: Any) -> None:
    arguments: dict[str, Any] = {
        "cluster_name": CLUSTER,
        "partition_id": partition_id,
        "transaction_id": transaction_id,
        "reason": "row violates a constraint the application added later",
        "operator": "alice",
    }
    arguments.update(overrides)
    skips.request_skip(engine, **arguments)


# ---- migrations ----------------------------------------------------------------------------------


def test_upgrade_creates_the_framework_tables_as_schema_py_defines_them(
    db_url: str, engine: sa.Engine
) -> None:
    api.upgrade(db_url)

    inspector = sa.inspect(engine)
    assert set(inspector.get_table_names()) == FRAMEWORK_TABLES | {"waltz_alembic_version"}
    for table in metadata.tables.values():
        columns = inspector.get_columns(table.name)
        assert [c["name"] for c in columns] == [c.name for c in table.columns]
        assert {c["name"]: c["nullable"] for c in columns} == {c.name: c.nullable for c in table.columns}
        primary_key = inspector.get_pk_constraint(table.name)
        assert primary_key["constrained_columns"] == [c.name for c in table.primary_key.columns]
        if engine.dialect.name != "mysql":  # MariaDB names every primary key PRIMARY
            assert primary_key["name"] == table.primary_key.name
    # Types, lengths and nullability as alembic autogenerate sees them: nothing to migrate.
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={
                "compare_type": True,
                "include_name": lambda name, type_, parents: name != "waltz_alembic_version",
            },
        )
        assert compare_metadata(context, metadata) == []


def test_current_is_head_after_upgrade_and_a_second_upgrade_changes_nothing(
    db_url: str, engine: sa.Engine
) -> None:
    assert api.current(db_url) is None

    api.upgrade(db_url)
    assert api.current(db_url) == api.head() == "waltz_0002"
    assert version_rows(engine, api.VERSION_TABLE) == [api.head()]
    set_mark(engine, 0, 41)

    api.upgrade(db_url)
    assert api.current(engine) == api.head()
    assert version_rows(engine, api.VERSION_TABLE) == [api.head()]
    assert [(m.partition_id, m.high_water_mark) for m in skips.list_marks(db_url)] == [(0, 41)]


def test_upgrade_takes_an_engine_or_a_connection_in_the_caller_s_transaction(
    db_url: str, engine: sa.Engine
) -> None:
    with engine.begin() as connection:
        api.upgrade(connection)
        assert api.current(connection) == api.head()
    assert api.current(db_url) == api.head()
    api.downgrade(engine, "base")
    assert api.current(engine) is None
    api.upgrade(engine)
    assert api.current(engine) == api.head()
    api.downgrade(engine, "base")

    # Checking first does not leave the connection in a transaction that would swallow the DDL.
    with engine.connect() as connection:
        assert api.current(connection) is None
        api.upgrade(connection)
        assert not connection.in_transaction()
    assert api.current(engine) == api.head()


def test_an_upgrade_waits_for_the_migration_lock_another_connection_holds(db_url: str) -> None:
    """While one connection holds the migration lock, another ``migration_lock`` gives up after
    its timeout with ``MigrationLockTimeoutError``, and an ``upgrade`` of the URL waits: it creates
    nothing until the lock is released, then the tables."""
    waited: list[BaseException | None] = []
    with api.migration_lock(db_url) as held:
        assert "waltz_alembic_version" not in sa.inspect(held).get_table_names()
        with (
            pytest.raises(api.MigrationLockTimeoutError, match=r"migration lock of .* for over 0\.5 s"),
            api.migration_lock(db_url, timeout=0.5),
        ):
            pass

        def upgrade() -> None:
            try:
                api.upgrade(db_url)
                waited.append(None)
            except BaseException as error:  # reported to the test's thread
                waited.append(error)

        thread = threading.Thread(target=upgrade, daemon=True)
        thread.start()
        thread.join(2.0)
        assert thread.is_alive() and not waited, waited
    thread.join(60.0)
    assert waited == [None]
    assert api.current(db_url) == api.head()


def test_instances_that_prepare_a_new_database_at_once_take_turns(db_url: str) -> None:
    """Three processes prepare one new database at once as the wallet example does (the
    framework's upgrade and the application's ``create_all``): every one succeeds."""
    script = textwrap.dedent(
        """
        import sys, time
        from waltz_examples.wallet.app import prepare_database
        start = float(sys.argv[2])
        time.sleep(max(0.0, start - time.time()))
        prepare_database(sys.argv[1])
        print("prepared")
        """
    )
    start = time.time() + 3.0
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, db_url, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs
    assert api.current(db_url) == api.head()


def test_downgrade_to_base_drops_the_tables(db_url: str, engine: sa.Engine) -> None:
    api.upgrade(db_url)
    api.downgrade(db_url, "base")

    assert set(sa.inspect(engine).get_table_names()) & FRAMEWORK_TABLES == set()
    assert api.current(db_url) is None
    assert version_rows(engine, api.VERSION_TABLE) == []


KEYS = ("Req-1", "req-1", "req-1 ", "réq-1")
"""Idempotency keys that MariaDB's default collation (and its ``utf8mb4_bin``, for the trailing
space) took for one."""


def record_keys(engine: sa.Engine, keys: Sequence[str], first: int) -> list[bool]:
    """Record each key as applied by its own transaction of partition 0 (``first``, ``first + 1``,
    ...), in one database transaction."""
    with engine.begin() as connection:
        return [
            idempotency.record_idempotency_key(
                connection, cluster_name=CLUSTER, key=key, partition_id=0, transaction_id=first + i
            )
            for i, key in enumerate(keys)
        ]


def found_keys(engine: sa.Engine, keys: Sequence[str]) -> list[int | None]:
    with engine.connect() as connection:
        found = [idempotency.find_idempotency_key(connection, cluster_name=CLUSTER, key=key) for key in keys]
    return [None if f is None else f.transaction_id for f in found]


def column_collations(engine: sa.Engine) -> dict[str, str | None]:
    """``table.column`` -> collation of every cluster name and idempotency key (MariaDB only)."""
    with engine.connect() as connection:
        rows = connection.execute(
            sa.text(
                "SELECT table_name, column_name, collation_name FROM information_schema.columns "
                "WHERE table_schema = DATABASE() AND column_name IN ('cluster_name', 'idempotency_key')"
            )
        ).all()
    return {f"{table}.{column}": collation for table, column, collation in rows}


def test_keys_and_cluster_names_that_differ_in_case_or_a_trailing_space_are_distinct(
    db_url: str, engine: sa.Engine
) -> None:
    api.upgrade(db_url)

    assert record_keys(engine, KEYS, 10) == [True] * len(KEYS)
    assert found_keys(engine, KEYS) == [10, 11, 12, 13]
    assert found_keys(engine, ["REQ-1", "req-1  "]) == [None, None]
    assert record_keys(engine, KEYS, 20) == [False] * len(KEYS)  # each one's retry is known
    set_mark(engine, 0, 5)
    set_mark(engine, 0, 7, cluster_name=CLUSTER.upper())  # another log's mark, not this one's
    assert sorted(m.high_water_mark for m in skips.list_marks(db_url)) == [5, 7]
    if engine.dialect.name == "mysql":
        assert set(column_collations(engine).values()) == {"utf8mb4_nopad_bin"}


def test_upgrade_from_the_first_revision_keeps_the_rows_and_then_tells_keys_apart(
    db_url: str, engine: sa.Engine
) -> None:
    api.upgrade(db_url, "waltz_0001")
    set_mark(engine, 0, 41)
    assert record_keys(engine, ["Req-1"], 10) == [True]
    if engine.dialect.name == "mysql":  # the first revision's tables on MariaDB: one key
        assert found_keys(engine, ["req-1", "req-1 "]) == [10, 10]
        assert set(column_collations(engine).values()) == {"utf8mb4_general_ci"}

    api.upgrade(db_url)
    assert api.current(db_url) == "waltz_0002"
    assert [(m.partition_id, m.high_water_mark) for m in skips.list_marks(db_url)] == [(0, 41)]
    assert found_keys(engine, KEYS) == [10, None, None, None]
    assert record_keys(engine, KEYS, 20) == [False, True, True, True]

    if engine.dialect.name == "mysql":  # back to the first revision: keys so differing collide
        with pytest.raises(sa.exc.IntegrityError):
            api.downgrade(db_url, "waltz_0001")


def test_application_alembic_version_is_left_alone(db_url: str, engine: sa.Engine) -> None:
    with engine.begin() as connection:
        connection.execute(
            sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        )
        connection.execute(sa.text("INSERT INTO alembic_version (version_num) VALUES ('app_0042')"))

    api.upgrade(db_url)
    assert version_rows(engine, "alembic_version") == ["app_0042"]
    api.downgrade(db_url, "base")
    assert version_rows(engine, "alembic_version") == ["app_0042"]


def test_check_current_refuses_a_database_without_the_tables(db_url: str) -> None:
    with pytest.raises(api.FrameworkTablesMissingError, match="waltz db upgrade --url") as raised:
        api.check_current(db_url)
    assert raised.value.revision is None
    assert raised.value.head == api.head()
    assert isinstance(raised.value, SqlFrameworkError)

    api.upgrade(db_url)
    api.check_current(db_url)


class StartupCallbacks(AbstractClientCallbacksForSQL):
    """Callbacks only started (their start-up check) and released: nothing is applied."""

    def apply(self, transaction: Any, session: Any) -> None:
        raise AssertionError("nothing is applied here")

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        raise AssertionError("nothing is applied here")


def test_a_database_a_newer_waltz_py_migrated_is_refused_naming_its_revision(
    db_url: str, engine: sa.Engine
) -> None:
    api.upgrade(db_url)
    with engine.begin() as conn:  # as a release with a revision after ours would leave it
        conn.execute(sa.text("UPDATE waltz_alembic_version SET version_num = 'waltz_9999'"))
    newer = "is at waltz framework revision 'waltz_9999', which this waltz-py does not know"
    with pytest.raises(api.FrameworkRevisionNewerError, match=newer) as raised:
        api.check_current(db_url)
    assert isinstance(raised.value, api.FrameworkTablesMissingError)  # callers catching it still do
    assert (raised.value.revision, raised.value.head) == ("waltz_9999", api.head())
    assert "a newer waltz-py migrated it" in str(raised.value)
    assert "waltz db upgrade" not in str(raised.value)  # which cannot: alembic knows no such revision
    with pytest.raises(api.FrameworkRevisionNewerError, match=newer):
        StartupCallbacks(engine, cluster_name=CLUSTER)  # still refuses to start
    with pytest.raises(api.FrameworkRevisionNewerError, match=newer):
        api.upgrade(db_url)
    with pytest.raises(api.FrameworkRevisionNewerError, match=newer):
        api.downgrade(db_url, "base")
    assert version_rows(engine, "waltz_alembic_version") == ["waltz_9999"]  # left as it was

    for command_line, code in ((["current"], 1), (["upgrade"], 2)):
        output = waltz_db(*command_line, "--url", db_url, expect=code).output
        assert newer in output and "a newer waltz-py migrated it" in output, output
        assert "Can't locate revision" not in output, output


def test_check_current_hides_the_password() -> None:
    error = api.FrameworkTablesMissingError("postgresql://app:***@db/app", None, "waltz_0001")
    assert "waltz db upgrade --url 'postgresql://app:***@db/app'` with the password filled in" in str(error)


def test_operator_reads_on_a_database_without_the_tables_say_to_upgrade(db_url: str) -> None:
    with pytest.raises(api.FrameworkTablesMissingError, match=r"waltz_high_water_marks.*waltz db upgrade"):
        skips.list_marks(db_url)
    with pytest.raises(api.FrameworkTablesMissingError, match="waltz_skipped_transactions"):
        skips.list_skips(db_url)


def test_upgrade_sql_prints_the_ddl_without_a_database() -> None:
    ddl = api.upgrade_sql("postgresql://")
    assert "CREATE TABLE waltz_alembic_version" in ddl
    for name in FRAMEWORK_TABLES:
        assert f"CREATE TABLE {name}" in ddl
    assert "CONSTRAINT pk_waltz_skipped_transactions PRIMARY KEY" in ddl
    assert "TIMESTAMP WITH TIME ZONE" in ddl
    assert "INSERT INTO waltz_alembic_version (version_num) VALUES ('waltz_0001')" in ddl
    assert "DROP TABLE" not in ddl


# ---- an application's own alembic environment ----------------------------------------------------

APP_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("app_orders", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("app_orders")
"""

APP_ENV_CALLING_UPGRADE = """
import sqlalchemy as sa
from alembic import context

from waltz.jdbc_style import migrations_api

engine = sa.create_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    migrations_api.upgrade(connection)
    context.configure(
        connection=connection, include_object=migrations_api.exclude_framework_tables
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""

APP_ENV_PLAIN = """
import sqlalchemy as sa
from alembic import context

engine = sa.create_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    context.configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""


def application_config(tmp_path: Path, env_py: str, url: str) -> Config:
    """An application's alembic environment with one revision of its own."""
    directory = tmp_path / "app_migrations"
    (directory / "versions").mkdir(parents=True)
    (directory / "env.py").write_text(textwrap.dedent(env_py))
    (directory / "versions" / "app_0001.py").write_text(textwrap.dedent(APP_REVISION))
    config = Config()
    config.set_main_option("script_location", str(directory))
    config.set_main_option("sqlalchemy.url", url)
    return config


def test_application_env_py_runs_ours_beside_its_own(tmp_path: Path, sqlite_engine: sa.Engine) -> None:
    url = sqlite_engine.url.render_as_string(hide_password=False)
    config = application_config(tmp_path, APP_ENV_CALLING_UPGRADE, url)

    command.upgrade(config, "head")

    tables = set(sa.inspect(sqlite_engine).get_table_names())
    assert tables >= FRAMEWORK_TABLES | {"app_orders", "alembic_version", "waltz_alembic_version"}
    assert version_rows(sqlite_engine, "alembic_version") == ["app_0001"]
    api.check_current(sqlite_engine)
    command.upgrade(config, "head")  # again: both are at head
    assert version_rows(sqlite_engine, "alembic_version") == ["app_0001"]


def test_application_adopts_our_revisions_as_a_branch(tmp_path: Path, sqlite_engine: sa.Engine) -> None:
    url = sqlite_engine.url.render_as_string(hide_password=False)
    config = application_config(tmp_path, APP_ENV_PLAIN, url)
    config.set_main_option("path_separator", "os")
    locations = [tmp_path / "app_migrations" / "versions", api.script_location() / "versions"]
    config.set_main_option("version_locations", os.pathsep.join(str(path) for path in locations))

    command.upgrade(config, "heads")

    assert version_rows(sqlite_engine, "alembic_version") == ["app_0001", api.head()]
    assert api.current(sqlite_engine) is None  # not in waltz_alembic_version ...
    assert api.current(sqlite_engine, version_table="alembic_version") == api.head()  # ... but here
    api.check_current(sqlite_engine, version_table="alembic_version")

    with pytest.raises(api.FrameworkTablesMissingError):  # the framework's own table is empty
        StartupCallbacks(sqlite_engine, cluster_name=CLUSTER)
    adopted = StartupCallbacks(sqlite_engine, cluster_name=CLUSTER, version_table="alembic_version")
    adopted.release_connections()
    command.downgrade(config, f"{api.BRANCH_LABEL}@base")
    assert version_rows(sqlite_engine, "alembic_version") == ["app_0001"]
    assert set(sa.inspect(sqlite_engine).get_table_names()) & FRAMEWORK_TABLES == set()


def test_exclude_framework_tables_keeps_them_out_of_autogenerate(sqlite_engine: sa.Engine) -> None:
    application = sa.MetaData()
    sa.Table("app_orders", application, sa.Column("id", sa.Integer, primary_key=True))
    application.create_all(sqlite_engine)
    api.upgrade(sqlite_engine)

    with sqlite_engine.connect() as connection:
        unfiltered = compare_metadata(MigrationContext.configure(connection), application)
        filtered = compare_metadata(
            MigrationContext.configure(connection, opts={"include_object": api.exclude_framework_tables}),
            application,
        )
    assert {diff[1].name for diff in unfiltered if diff[0] == "remove_table"} >= FRAMEWORK_TABLES
    assert filtered == []


# ---- the operator's skip -------------------------------------------------------------------------


def test_request_skip_refuses_what_is_not_the_stuck_transaction(db_url: str, engine: sa.Engine) -> None:
    api.upgrade(db_url)
    set_mark(engine, 0, 4)

    refusals = [
        ({"transaction_id": 5, "reason": "   "}, "give a reason"),
        ({"transaction_id": 5, "operator": ""}, "operator"),
        ({"transaction_id": 4}, "transaction 4 is already applied \\(high-water mark 4\\)"),
        ({"transaction_id": 0}, "already applied"),
        ({"transaction_id": 6}, "only the next transaction to apply, 5 .* not 6"),
        ({"transaction_id": 1, "partition_id": 1}, "no high-water mark row.*only transaction 0"),
        ({"transaction_id": 5, "cluster_name": "other"}, "no high-water mark row"),
    ]
    for overrides, message in refusals:
        with pytest.raises(skips.SkipRefusedError, match=message):
            skip(engine, **overrides)
    assert skips.list_skips(engine) == []

    skip(engine, 5)
    with pytest.raises(skips.SkipRefusedError, match=r"already requested by alice .* pending"):
        skip(engine, 5, operator="bob", reason="again")
    assert [(s.transaction_id, s.operator) for s in skips.list_skips(engine)] == [(5, "alice")]
    assert issubclass(skips.SkipRefusedError, SqlFrameworkError)


def test_request_skip_records_an_audited_pending_request(db_url: str, engine: sa.Engine) -> None:
    api.upgrade(db_url)
    set_mark(engine, 3, 9)
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)

    skip(engine, 10, partition_id=3, reason="  poison message  ", operator="alice")
    skip(engine, 0, partition_id=7, operator="bob")  # no mark row yet: transaction 0 is the stuck one
    skip(engine, 0, partition_id=0, cluster_name="billing")

    after = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    rows = skips.list_skips(db_url, CLUSTER)
    assert [(r.partition_id, r.transaction_id, r.operator, r.reason) for r in rows] == [
        (3, 10, "alice", "poison message"),
        (7, 0, "bob", "row violates a constraint the application added later"),
    ]
    for row in rows:
        assert row.pending and row.skipped_at is None
        assert row.requested_at.tzinfo is not None
        assert before <= row.requested_at <= after
    assert [r.cluster_name for r in skips.list_skips(db_url)] == ["billing", CLUSTER, CLUSTER]

    # The apply path marks it done; a new request for it is then refused, naming when.
    with engine.begin() as connection:
        connection.execute(skipped_transactions.update().values(skipped_at=dt.datetime.now(dt.UTC)))
    assert not skips.list_skips(db_url, CLUSTER)[0].pending
    with pytest.raises(skips.SkipRefusedError, match=r"already requested .* skipped at"):
        skip(engine, 10, partition_id=3)


def test_list_marks_filters_by_cluster_and_gives_utc_times(db_url: str, engine: sa.Engine) -> None:
    api.upgrade(db_url)
    set_mark(engine, 1, 7)
    set_mark(engine, 0, -1)
    set_mark(engine, 0, 3, cluster_name="billing")

    marks = skips.list_marks(db_url)
    assert [(m.cluster_name, m.partition_id, m.high_water_mark) for m in marks] == [
        ("billing", 0, 3),
        (CLUSTER, 0, -1),
        (CLUSTER, 1, 7),
    ]
    assert [m.partition_id for m in skips.list_marks(db_url, CLUSTER)] == [0, 1]
    assert skips.list_marks(db_url, "nobody") == []
    for mark in marks:
        assert mark.updated_at is not None and mark.updated_at.utcoffset() == dt.timedelta(0)
        assert abs(mark.updated_at - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=1)


# ---- waltz db ------------------------------------------------------------------------------------


def waltz_db(*args: str, expect: int, env: dict[str, str] | None = None) -> Result:
    result = CliRunner().invoke(app, ["db", *args], env=env)
    assert result.exit_code == expect, f"exit code {result.exit_code}:\n{result.output}"
    return result


def test_cli_upgrade_current_marks_and_skip(db_url: str, engine: sa.Engine) -> None:
    assert "none: the framework tables are missing" in waltz_db("current", "--url", db_url, expect=1).output
    assert "waltz db upgrade" in waltz_db("marks", "--url", db_url, expect=2).output

    assert "waltz_0002 (head)" in waltz_db("upgrade", "--url", db_url, expect=0).output
    assert waltz_db("current", expect=0, env={"WALTZ_DB_URL": db_url}).output.strip() == "waltz_0002 (head)"
    # --db, as waltz rebuild, demo and perf name it, is the same option.
    assert waltz_db("current", "--db", db_url, expect=0).output.strip() == "waltz_0002 (head)"

    set_mark(engine, 0, 12)
    set_mark(engine, 1, 3)
    marks = waltz_db("marks", "--url", db_url, "--cluster", CLUSTER, expect=0).output
    assert [line.split()[:3] for line in marks.splitlines()[1:]] == [
        [CLUSTER, "0", "12"],
        [CLUSTER, "1", "3"],
    ]
    assert (
        json.loads(waltz_db("marks", "--url", db_url, "--json", expect=0).output)[0]["high_water_mark"] == 12
    )

    common = ["--url", db_url, "--cluster", CLUSTER, "--partition", "0", "--reason", "bad payload"]
    refused = waltz_db("skip", *common, "--transaction", "12", "--operator", "alice", expect=1)
    assert "refused" in refused.output and "already applied" in refused.output
    refused = waltz_db("skip", *common, "--transaction", "14", "--operator", "alice", expect=1)
    assert "only the next transaction to apply, 13" in refused.output

    accepted = waltz_db("skip", *common, "--transaction", "13", expect=0, env={"USER": "carol"})
    assert "carol asks to skip transaction 13" in accepted.output
    assert "already requested by carol" in waltz_db("skip", *common, "--transaction", "13", expect=1).output
    [row] = skips.list_skips(engine)
    assert (row.transaction_id, row.operator, row.reason, row.pending) == (13, "carol", "bad payload", True)

    listed = waltz_db("skips", "--url", db_url, expect=0).output
    assert f"cluster {CLUSTER!r} partition 0 transaction 13: pending; requested by carol" in listed
    assert json.loads(waltz_db("skips", "--url", db_url, "--json", expect=0).output)[0]["skipped_at"] is None

    assert "none: the framework tables are missing" in (
        waltz_db("downgrade", "--url", db_url, "--revision", "base", expect=0).output
    )


def test_cli_marks_of_an_empty_database_say_which_clusters_were_asked_for(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    waltz_db("upgrade", "--url", url, expect=0)
    assert waltz_db("marks", "--url", url, expect=0).output.strip() == (
        "(no high-water marks: no application has used this database yet)"
    )
    assert waltz_db("marks", "--url", url, "--cluster", CLUSTER, expect=0).output.strip() == (
        f"(no high-water marks of cluster {CLUSTER!r}: no application has used this database for "
        "that cluster yet)"
    )


def test_cli_upgrade_sql_prints_the_ddl_offline() -> None:
    url = "mariadb+pymysql://nobody@127.0.0.1:1/app"
    output = waltz_db("upgrade", "--sql", "--url", url, expect=0).output
    assert "CREATE TABLE waltz_high_water_marks" in output
    assert "CREATE TABLE waltz_alembic_version" in output


def test_cli_upgrade_sql_refuses_the_mysql_dialect_unless_told_it_is_mysql_8() -> None:
    # Offline nothing tells MariaDB from MySQL: mysql:// would print MySQL 8's collation, which
    # MariaDB refuses after the first revision's tables are made (its DDL is not transactional).
    for url in ("mysql://", "mysql+pymysql://app:s3cret@db/app"):
        result = waltz_db("upgrade", "--sql", "--url", url, expect=2)
        assert "utf8mb4_0900_bin" in result.output and "MariaDB" in result.output, result.output
        assert "mariadb://" in result.output and "--mysql-8" in result.output, result.output
        assert "CREATE TABLE" not in result.output and "s3cret" not in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output

    mysql_8 = waltz_db("upgrade", "--sql", "--mysql-8", "--url", "mysql://", expect=0).output
    assert "COLLATE utf8mb4_0900_bin" in mysql_8 and "utf8mb4_nopad_bin" not in mysql_8
    assert "COLLATE utf8mb4_nopad_bin" in waltz_db("upgrade", "--sql", "--url", "mariadb://", expect=0).output
    # --mysql-8 says which server a mysql:// URL is; with anything else it is a mistake.
    for command_line in (
        ["upgrade", "--sql", "--mysql-8", "--url", "mariadb://"],
        ["upgrade", "--sql", "--mysql-8", "--url", "postgresql://"],
        ["upgrade", "--mysql-8", "--url", "mysql+pymysql://nobody@127.0.0.1:1/app"],
    ):
        result = waltz_db(*command_line, expect=2)
        assert "--mysql-8" in result.output and len(result.output.strip().splitlines()) == 1, result.output

    with pytest.raises(api.OfflineDialectError, match="mariadb://"):
        api.upgrade_sql("mysql://")
    assert "utf8mb4_0900_bin" in api.upgrade_sql("mysql://", mysql_8=True)


def run_sql_script(url: str, script: str) -> None:
    """Run a ``--sql`` script as a DBA would, statement by statement (no transaction: MySQL's DDL
    commits as it goes)."""
    engine = sa.create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            for chunk in script.split(";\n"):
                statement = "\n".join(
                    line for line in chunk.splitlines() if not line.lstrip().startswith("--")
                ).strip()
                if statement:
                    connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


def test_cli_upgrade_sql_for_mariadb_runs_on_mariadb_to_head(mariadb_url: str) -> None:
    script = waltz_db("upgrade", "--sql", "--url", "mariadb://", expect=0).output
    run_sql_script(mariadb_url, script)
    assert waltz_db("current", "--url", mariadb_url, expect=0).output.strip() == "waltz_0002 (head)"


def test_cli_unreachable_or_unusable_database_exits_2_without_the_password() -> None:
    result = waltz_db("current", "--url", "postgresql+psycopg://postgres:hunter2@127.0.0.1:1/x", expect=2)
    assert "cannot use the database at postgresql+psycopg://postgres:***@127.0.0.1:1/x" in result.output
    assert "hunter2" not in result.output
    assert len(result.output.strip().splitlines()) == 1

    result = waltz_db("upgrade", "--url", "not a url", expect=2)
    assert "cannot use the database URL" in result.output
    # A spelling other tools take: the one SQLAlchemy takes is named.
    result = waltz_db("upgrade", "--url", "postgres://postgres:hunter2@127.0.0.1/x", expect=2)
    assert "postgresql+psycopg://" in result.output and "hunter2" not in result.output

    assert "Missing option '--url'" in waltz_db("marks", expect=2, env={"WALTZ_DB_URL": ""}).output


@pytest.mark.parametrize(
    "command",
    [
        ["current"],
        ["upgrade"],
        ["marks"],
        ["skips"],
        ["skip", "--cluster", "c", "--partition", "0", "--transaction", "1", "--reason", "r"],
    ],
    ids=lambda command: command[0],
)
def test_cli_asyncio_url_is_refused_naming_the_synchronous_url(command: list[str]) -> None:
    url = "postgresql+psycopg_async://app:s3cret@127.0.0.1:1/app"
    result = waltz_db(*command, "--url", url, expect=2)
    assert "postgresql+psycopg://app:***@127.0.0.1:1/app" in result.output, result.output
    assert "s3cret" not in result.output and "greenlet" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app:s3cret@127.0.0.1:notaport/app",
        # The host left out: what follows the user's ':' is taken for the port, the password.
        "postgresql+psycopg://app:s3cret/app",
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        ["current"],
        ["upgrade"],
        ["upgrade", "--sql"],
        ["downgrade", "--revision", "base"],
        ["marks"],
        ["skips"],
        ["skip", "--cluster", "c", "--partition", "0", "--transaction", "1", "--reason", "r"],
    ],
    ids=lambda command: "-".join(command[:2]).replace("--", ""),
)
def test_cli_url_whose_port_is_not_a_number_exits_2_without_the_password(
    command: list[str], url: str
) -> None:
    result = waltz_db(*command, "--url", url, expect=2)
    assert "cannot use the database URL (unparsable URL): its port is not a number" in result.output
    assert "s3cret" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
