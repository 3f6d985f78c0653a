"""The pytest plugin ``waltz.testing``, enabled with ``-p waltz.testing`` in a user's own test suite."""

from __future__ import annotations

from pathlib import Path

import pytest
import support
from sqlalchemy import make_url

from waltz.local.zookeeper import DockerZooKeeper, LocalZooKeeper

pytest_plugins = ["pytester"]

USER_CONFTEST = """
import pytest


@pytest.fixture(scope="session")
def waltz_cluster_options(waltz_cluster_options):
    return {**waltz_cluster_options, "partitions": 1}
"""

USER_TESTS = """
import asyncio

from waltz.protocol.records import ReqId
from waltz.protocol.server_client import ServerAdminClient


def test_append_and_read_one_record(waltz_cluster, waltz_log_start):
    assert (len(waltz_cluster.storages), len(waltz_cluster.servers)) == (1, 1)
    assert waltz_cluster.num_partitions == 1
    assert waltz_log_start == {0: 0}

    async def scenario():
        async with ServerAdminClient(waltz_cluster.owner(0), tls=waltz_cluster.admin_tls) as client:
            (transaction_id,) = await client.append(0, [(ReqId(1, 0, 0, 1), 0, b"from a user test")])
            return transaction_id, await client.read(0, transaction_id, 10)

    transaction_id, records = asyncio.run(scenario())
    assert transaction_id == waltz_log_start[0]
    assert [r.data for r in records] == [b"from a user test"]


def test_the_next_test_starts_after_the_records_of_the_previous_one(waltz_log_start):
    assert waltz_log_start == {0: 1}


def test_zz_a_failure_report_shows_the_log_of_a_stopped_node(waltz_cluster):
    waltz_cluster.kill_storage(0)
    assert False, "failing on purpose"
"""


def test_a_user_suite_gets_a_session_cluster_with_the_plugin(
    pytester: pytest.Pytester, zookeeper: LocalZooKeeper | DockerZooKeeper
) -> None:
    pytester.makeconftest(USER_CONFTEST)
    pytester.makepyfile(test_user=USER_TESTS)

    result = pytester.runpytest_subprocess(
        "-p",
        "waltz.testing",
        "-o",
        "waltz_storages=1",
        "-o",
        "waltz_servers=1",
        f"--waltz-zookeeper={zookeeper.connect_string}",
        timeout=120,
    )

    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*waltz local cluster*", "*storage-0 is not running; its log*"])


FACTORY_AND_DATABASE_TESTS = """
import pytest
from sqlalchemy import create_engine, inspect, make_url, text


@pytest.fixture(scope="session")
def own_cluster(waltz_cluster_factory):
    return waltz_cluster_factory(name="own", partitions=1)


def test_a_cluster_with_a_log_of_its_own(own_cluster, waltz_cluster):
    assert own_cluster.root != waltz_cluster.root
    assert (own_cluster.num_partitions, waltz_cluster.num_partitions) == (1, 2)
    assert own_cluster.owner(0) and own_cluster.storages[0].directory.parent.name == "waltz-own0"


def test_an_empty_database_of_each_kind_for_the_test(waltz_postgres_database, waltz_mariadb_database):
    names = []
    for url in (waltz_postgres_database, waltz_mariadb_database):
        names.append(make_url(url).database)
        engine = create_engine(url)
        with engine.begin() as conn:
            assert inspect(conn).get_table_names() == []
            conn.execute(text("CREATE TABLE left_behind (x INTEGER)"))
        engine.connect().close()
        engine.dispose()
    open("databases.txt", "w").write("\\n".join(names))


def test_zz_a_failure_report_shows_the_log_of_the_factory_cluster_s_stopped_node(own_cluster):
    own_cluster.kill_storage(0)
    assert False, "failing on purpose"
"""


def test_a_user_suite_gets_clusters_of_their_own_and_a_database_per_test(
    pytester: pytest.Pytester,
    zookeeper: LocalZooKeeper | DockerZooKeeper,
    postgres_server: support.DatabaseServer,
    mariadb_server: support.DatabaseServer,
) -> None:
    pytester.makepyfile(test_user=FACTORY_AND_DATABASE_TESTS)

    result = pytester.runpytest_subprocess(
        *("-p", "waltz.testing", "-o", "waltz_storages=1", "-o", "waltz_servers=1"),
        f"--waltz-zookeeper={zookeeper.connect_string}",
        f"--waltz-postgres-url={postgres_server.admin_url.render_as_string(hide_password=False)}",
        f"--waltz-mariadb-url={mariadb_server.admin_url.render_as_string(hide_password=False)}",
        timeout=180,
    )

    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*waltz local cluster*", "*storage-0 is not running; its log*"])
    postgres_name, mariadb_name = (pytester.path / "databases.txt").read_text().split("\n")
    assert postgres_name.startswith("waltz_test_") and mariadb_name.startswith("waltz_test_")
    assert not postgres_server.database_exists(postgres_name), "the test's database was not dropped"
    assert not mariadb_server.database_exists(mariadb_name), "the test's database was not dropped"


def test_without_the_plugin_a_user_suite_has_no_waltz_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user="def test_it(waltz_cluster):\n    pass\n")

    result = pytester.runpytest_subprocess(timeout=60)

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'waltz_cluster' not found*"])


NAMESPACE_TESTS = """
import asyncio

from waltz.protocol.records import ReqId
from waltz.protocol.server_client import ServerAdminClient


def test_every_node_on_a_host_of_its_own(waltz_cluster, waltz_log_start):
    assert waltz_cluster.network == "namespaces"
    owner = waltz_cluster.owner(0)
    assert owner.startswith(waltz_cluster.host("server-0").address.rsplit(".", 1)[0] + ".")
    assert not owner.startswith("127.")

    async def scenario():
        async with ServerAdminClient(owner, tls=waltz_cluster.admin_tls) as client:
            return await client.append(0, [(ReqId(1, 0, 0, 1), 0, b"across the bridge")])

    assert asyncio.run(scenario()) == [waltz_log_start[0]]
"""


def test_a_user_suite_can_run_its_cluster_in_network_namespaces(pytester: pytest.Pytester) -> None:
    from waltz.local.netns import network_lab_unavailable

    reason = network_lab_unavailable()
    if reason is not None:
        pytest.skip(reason)
    pytester.makepyfile(test_user=NAMESPACE_TESTS)

    result = pytester.runpytest_subprocess(
        "-p", "waltz.testing", "-o", "waltz_network=namespaces", "-o", "waltz_partitions=1", timeout=120
    )

    result.assert_outcomes(passed=1)
    bad = pytester.runpytest_subprocess("-p", "waltz.testing", "-o", "waltz_network=docker", timeout=60)
    bad.assert_outcomes(errors=1)
    bad.stdout.fnmatch_lines(["*waltz_network = 'docker' is not a valid value*"])


DATABASE_FIXTURE_TESTS = """
import pytest
from sqlalchemy import create_engine, inspect, make_url, text

KINDS = ["postgresql", "mariadb", "sqlite"]
BACKENDS = {"postgresql": "postgresql", "mariadb": "mysql", "sqlite": "sqlite"}


def tables(url):
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def record(*urls):
    with open("databases.txt", "a") as out:
        out.writelines(url + "\\n" for url in urls)


@pytest.mark.parametrize("waltz_database", KINDS, indirect=True)
def test_an_empty_database_of_each_kind(waltz_database, request):
    record(waltz_database)
    kind = request.node.callspec.params["waltz_database"]
    assert make_url(waltz_database).get_backend_name() == BACKENDS[kind]
    assert tables(waltz_database) == []


@pytest.mark.parametrize("waltz_database", KINDS, indirect=True)
def test_a_migrated_database_of_each_kind(waltz_migrated_database, waltz_database):
    record(waltz_migrated_database)
    assert waltz_migrated_database == waltz_database
    assert {"waltz_alembic_version", "waltz_high_water_marks"} <= set(tables(waltz_migrated_database))


def test_unparametrized_it_is_sqlite(waltz_database, waltz_sqlite_database):
    record(waltz_database, waltz_sqlite_database)
    assert make_url(waltz_database).get_backend_name() == "sqlite"
    assert waltz_database != waltz_sqlite_database and tables(waltz_sqlite_database) == []


@pytest.mark.parametrize("waltz_migrated_database", ["sqlite"], indirect=True)
def test_parametrizing_the_migrated_fixture_is_refused(waltz_migrated_database):
    pass
"""

MODULE_DATABASE_TESTS = """
import pytest
from sqlalchemy import create_engine, inspect, text

KINDS = ["postgresql", "mariadb", "sqlite"]
pytestmark = pytest.mark.parametrize("waltz_module_database", KINDS, indirect=True)


def test_1_the_first_test_of_the_module_leaves_a_table(waltz_module_migrated_database):
    with open("module_databases.txt", "a") as out:
        out.write(waltz_module_migrated_database + "\\n")
    engine = create_engine(waltz_module_migrated_database)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE left_for_the_next_test (x INTEGER)"))
    engine.dispose()


def test_2_the_next_test_of_the_module_finds_it(waltz_module_migrated_database):
    assert waltz_module_migrated_database in open("module_databases.txt").read().split()
    engine = create_engine(waltz_module_migrated_database)
    with engine.connect() as conn:
        names = set(inspect(conn).get_table_names())
    engine.dispose()
    assert {"left_for_the_next_test", "waltz_high_water_marks"} <= names
"""


def _database_exists(
    url: str, postgres_server: support.DatabaseServer, mariadb_server: support.DatabaseServer
) -> bool:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return Path(str(parsed.database)).exists()
    server = postgres_server if parsed.get_backend_name() == "postgresql" else mariadb_server
    return server.database_exists(str(parsed.database))


def test_a_user_suite_gets_a_database_of_each_kind_per_test_and_per_module(
    pytester: pytest.Pytester,
    postgres_server: support.DatabaseServer,
    mariadb_server: support.DatabaseServer,
) -> None:
    pytester.makepyfile(test_user=DATABASE_FIXTURE_TESTS, test_user_module=MODULE_DATABASE_TESTS)

    result = pytester.runpytest_subprocess(
        *("-p", "waltz.testing", "-p", "no:cacheprovider"),
        f"--waltz-postgres-url={postgres_server.admin_url.render_as_string(hide_password=False)}",
        f"--waltz-mariadb-url={mariadb_server.admin_url.render_as_string(hide_password=False)}",
        timeout=180,
    )

    result.assert_outcomes(passed=13, errors=1)
    result.stdout.fnmatch_lines(["*waltz_migrated_database takes its database from waltz_database*"])
    urls = (pytester.path / "databases.txt").read_text().split()
    module_urls = (pytester.path / "module_databases.txt").read_text().split()
    assert len(urls) == 8 and len(set(urls)) == 8, "a database of its own for every test"
    assert len(module_urls) == 3 and len(set(module_urls)) == 3, "one database per module and kind"
    assert {make_url(url).get_backend_name() for url in module_urls} == {"postgresql", "mysql", "sqlite"}
    left = [url for url in urls + module_urls if _database_exists(url, postgres_server, mariadb_server)]
    assert left == [], "the databases were not dropped"


CLIENT_ENV_TESTS = """
import os
import subprocess
import sys

from waltz import WaltzClient

APPLICATION = '''
from waltz import BytesSerializer, TransactionContext, WaltzClient, WaltzClientCallbacks, WaltzClientConfig


class Note(TransactionContext):
    def partition_id(self, num_partitions):
        return 0

    def execute(self, builder):
        builder.set_transaction_data(b"from a subprocess", BytesSerializer())
        return True


class Nothing(WaltzClientCallbacks):
    def get_client_high_water_mark(self, partition_id):
        return -1

    def apply_transaction(self, transaction):
        pass

    def uncaught_exception(self, partition_id, transaction_id, exception):
        raise exception


with WaltzClient(Nothing(), WaltzClientConfig()) as client:  # every setting from the environment
    outcome = client.submit(Note()).result(timeout=60)
    print(outcome.committed, outcome.transaction_id)
'''


def test_a_subprocess_commits_with_the_client_environment(waltz_client_env, waltz_log_start):
    assert {"WALTZ_ZOOKEEPER_CONNECT_STRING", "WALTZ_CLUSTER_ROOT", "WALTZ_CLIENT_TLS_CERT_FILE"} <= set(
        waltz_client_env
    )
    run = subprocess.run(
        [sys.executable, "-c", APPLICATION],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("WALTZ_")}, **waltz_client_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", str(waltz_log_start[0])]


def test_the_client_config_reaches_the_cluster_as_an_application(waltz_client_config, waltz_cluster):
    assert waltz_client_config.cluster_root == waltz_cluster.root
    assert waltz_client_config.client_tls_cert_file is not None
    assert waltz_client_config.zookeeper_connect_string == waltz_cluster.zookeeper_connect_string
"""


def test_a_user_suite_gets_the_client_settings_and_environment_of_its_cluster(
    pytester: pytest.Pytester, zookeeper: LocalZooKeeper | DockerZooKeeper
) -> None:
    pytester.makepyfile(test_user=CLIENT_ENV_TESTS)

    result = pytester.runpytest_subprocess(
        *("-p", "waltz.testing", "-p", "no:cacheprovider"),
        *("-o", "waltz_storages=1", "-o", "waltz_servers=1", "-o", "waltz_partitions=1"),
        f"--waltz-zookeeper={zookeeper.connect_string}",
        timeout=180,
    )

    result.assert_outcomes(passed=2)
