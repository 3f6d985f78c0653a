"""The ledger's two model changes: their upcasters, their migrations, and a log of release 1 read by
the current release (docs/sql.md, "Changing a model"; ``releases.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from sqlalchemy import Engine, bindparam, create_engine, make_url, text
from sqlalchemy.pool import NullPool

from waltz import WaltzClientConfig
from waltz.jdbc_style import ChangeSet, Operation, RowChange, create_framework_engine
from waltz.local.cluster import LocalCluster
from waltz.local.options import SecurityOptions
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz_examples.ledger import migrations_api
from waltz_examples.ledger.models import ACCOUNT, Account, registry
from waltz_examples.ledger.releases import CURRENT, RELEASES, release
from waltz_examples.ledger.service import LedgerService, prepare_database

#: The first customer of these tests, by database kind (the ledger's tests share one log).
FIRST_CUSTOMER = {"sqlite": 7_300_000, "postgresql": 7_400_000}


def test_changes_of_release_1_and_2_upcast_to_the_current_account() -> None:
    chains = registry().schema_chains()
    written_by_1 = RowChange(
        Operation.INSERT, ACCOUNT, {"custid": 7}, {"custid": 7, "name": "Ada", "status": "open"}
    )
    written_by_2 = RowChange(
        Operation.UPDATE,
        ACCOUNT,
        {"custid": 7},
        {"custid": 7, "name": "Ada", "status": "closed", "currency": "EUR"},
        schema_version=2,
    )
    first, second = chains.upcast(ChangeSet([written_by_1, written_by_2])).changes
    assert first.values == {"custid": 7, "holder": "Ada", "status": "open", "currency": "USD"}
    assert second.values == {"custid": 7, "holder": "Ada", "status": "closed", "currency": "EUR"}
    assert first.schema_version == second.schema_version == 3


def test_every_release_declares_the_schema_versions_before_it() -> None:
    versions = [registry(r.account).schema_chains().version_of(ACCOUNT) for r in RELEASES]
    assert versions == [1, 2, 3, 3]
    assert CURRENT.account is Account
    # Release 3 and the current model read the log alike: the same upcasters.
    release_3 = registry(release(3).account).schema_chains().chain(ACCOUNT)
    current = registry().schema_chains().chain(ACCOUNT)
    assert release_3 is not None and current is not None
    assert release_3.describe() == current.describe()
    with pytest.raises(ValueError, match="no release 9"):
        release(9)


def _accounts(engine: Engine, holder_column: str, customers: tuple[int, ...]) -> list[tuple[Any, ...]]:
    columns = f"custid, {holder_column}, status" + (", currency" if holder_column == "holder" else "")
    query = text(f"SELECT {columns} FROM ledger_accounts WHERE custid IN :ids ORDER BY custid")
    query = query.bindparams(bindparam("ids", expanding=True))
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(query, {"ids": list(customers)})]


@contextmanager
def _postgres_database(server_url: str) -> Iterator[str]:
    """One more empty PostgreSQL database on the test server (``waltz_postgres_database`` makes one)."""
    server = make_url(server_url)
    name = f"ledger_releases_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class Databases(NamedTuple):
    kind: str
    first: str
    second: str


@pytest.fixture(params=["sqlite", "postgresql"])
def two_databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Databases]:
    """Two empty databases of one kind: ``sqlite`` files, or ``postgresql`` databases."""
    if request.param == "sqlite":
        yield Databases("sqlite", f"sqlite:///{tmp_path / 'first.db'}", f"sqlite:///{tmp_path / 'second.db'}")
        return
    first = str(request.getfixturevalue("waltz_postgres_database"))
    with _postgres_database(str(request.getfixturevalue("waltz_postgres_url"))) as second:
        yield Databases("postgresql", first, second)


def test_the_migrations_keep_the_accounts(two_databases: Databases) -> None:
    engine = create_framework_engine(two_databases.first)
    try:
        prepare_database(engine, release(1))
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO ledger_accounts (custid, name, status) VALUES (1, 'Ada', 'open')"))
        migrations_api.upgrade(engine, "ledger_0002")  # release 1 still inserts without currency
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO ledger_accounts (custid, name, status) VALUES (2, 'Grace', 'open')")
            )
        migrations_api.upgrade(engine, "ledger_0003")
        assert _accounts(engine, "holder", (1, 2)) == [(1, "Ada", "open", "USD"), (2, "Grace", "open", "USD")]
        migrations_api.downgrade(engine, "ledger_0001")
        assert _accounts(engine, "name", (1, 2)) == [(1, "Ada", "open"), (2, "Grace", "open")]
    finally:
        engine.dispose()


@pytest.fixture
def releases_cluster(
    waltz_cluster_factory: Callable[..., LocalCluster],
    ledger_cluster: LocalCluster,
    ledger_config: WaltzClientConfig,
) -> Iterator[tuple[LocalCluster, WaltzClientConfig]]:
    """A cluster of this test's own, and its client configuration: release 1's instance must meet
    only records of release 1 first (the other ledger tests' log holds records of the current
    release, at which an instance of release 1 rightly pauses its partition).

    It has the ledger cluster's ZooKeeper credential, which ``ledger_config`` puts in the
    environment: a Spark session started earlier in the session with that environment reads it.
    """
    digest_file = ledger_cluster.zookeeper_env().get("WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE")
    digest = ZooKeeperSecurity.read_digest_file(Path(digest_file)) if digest_file else None
    security = SecurityOptions(
        zookeeper_auth=digest is not None,
        zookeeper_security=ZooKeeperSecurity(digest=digest) if digest is not None else None,
    )
    cluster = waltz_cluster_factory(
        name=f"ledger-releases-{uuid.uuid4().hex[:6]}", partitions=4, security=security
    )
    try:
        yield (
            cluster,
            WaltzClientConfig(**cluster.client_settings()),
        )
    finally:
        cluster.close()


@pytest.mark.timeout(900)  # a Spark session and job: a minute alone, many more on a busy machine
# On PostgreSQL, with its Spark rebuild, with -m slow (tests/spark/test_schema_evolution.py rebuilds
# older records by default).
@pytest.mark.parametrize(
    "two_databases", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)], indirect=True
)
def test_a_log_written_by_release_1_is_read_by_the_current_release(
    releases_cluster: tuple[LocalCluster, WaltzClientConfig], two_databases: Databases
) -> None:
    """Release 1 writes accounts into one database, release 2 one more; the database migrates to
    the current release; a fresh database applies the whole log with the current release. Both
    hold the same accounts, ``read_entities`` reads them in the current model, and (on
    PostgreSQL) a rebuild of the log equals the migrated database."""
    ledger_cluster, ledger_config = releases_cluster
    _, migrated_url, fresh_url = two_databases
    first_customer = FIRST_CUSTOMER[two_databases.kind]
    release_1_customers = tuple(range(first_customer, first_customer + 4))
    release_2_customer = first_customer + 4
    customers = (*release_1_customers, release_2_customer)
    name = f"releases-{uuid.uuid4().hex[:6]}"

    def start(url: str, number: int) -> LedgerService:
        return LedgerService.from_config(
            url, ledger_config, cluster_name=name, sweep_interval=None, prepare=False, release=release(number)
        )

    prepare_database(migrated_url, release(1))
    with start(migrated_url, 1) as first:
        for custid in release_1_customers:
            assert first.open_account(custid, f"holder {custid}", 100, 200).committed
        assert first.deactivate(release_1_customers[0]).committed
        marks = {p: first.client.get_high_water_mark(p) for p in range(first.num_partitions)}
        for pid, mark in marks.items():
            assert first.callbacks.wait_for(pid, mark, 30)
    prepare_database(migrated_url, release(2))
    with start(migrated_url, 2) as second:
        assert second.open_account(release_2_customer, f"holder {release_2_customer}", 100, 200).committed
        marks = {p: second.client.get_high_water_mark(p) for p in range(second.num_partitions)}
        for pid, mark in marks.items():
            assert second.callbacks.wait_for(pid, mark, 30)
    prepare_database(migrated_url)  # ledger_0003: the current release's table

    closed = release_1_customers[0]
    expected = [(c, f"holder {c}", "closed" if c == closed else "open", "USD") for c in customers]
    migrated = create_framework_engine(migrated_url)
    try:
        assert _accounts(migrated, "holder", customers) == expected
    finally:
        migrated.dispose()

    prepare_database(fresh_url)
    with LedgerService.from_config(
        fresh_url, ledger_config, cluster_name=name, sweep_interval=None, prepare=False
    ) as current:
        for pid, mark in marks.items():
            assert current.callbacks.wait_for(pid, mark, 60), f"partition {pid} not applied up to {mark}"
        read = [
            current.callbacks.read_entities([(Account, c)], num_partitions=current.num_partitions).entities[0]
            for c in customers
        ]
        assert [(a.custid, a.holder, a.status, a.currency) for a in read] == expected
        assert _accounts(current.engine, "holder", customers) == expected

    # Spark reads the log alike whatever the live database, and a Spark job costs a minute here:
    # the rebuild runs once, against PostgreSQL (tests/spark/test_rebuild.py verifies against
    # SQLite).
    if two_databases.kind == "postgresql":
        _rebuild_equals(ledger_cluster, migrated_url, name)


def _rebuild_equals(cluster: LocalCluster, live_url: str, cluster_name: str) -> None:
    """A Spark rebuild of the ledger from the log, at the live database's marks, equals it.

    Run as an operator runs it, ``waltz rebuild --verify-against`` in a process of its own: its
    Spark session (and the Python workers that read the log) get this cluster's operator
    credential and certificate from the environment, whatever Spark session this test process
    holds already.
    """
    pytest.importorskip("pyspark", reason="the rebuild needs the spark extra (pip install -e '.[spark]')")
    command = [
        sys.executable, "-m", "waltz", "rebuild", "--app", "waltz_examples.ledger",
        "--zookeeper", cluster.zookeeper_connect_string, "--cluster-root", cluster.root,
        "--cluster-name", cluster_name, "--master", "local[2]",
    ]  # fmt: skip
    env = {**os.environ, **cluster.admin_env(), "WALTZ_REBUILD_VERIFY_AGAINST": live_url}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=840, check=False)
    assert result.returncode == 0, (
        f"waltz rebuild --verify-against exited {result.returncode}:\n"
        + (result.stdout + result.stderr)[-4000:]
    )
