"""A pytest plugin for applications' own test suites: a real local Waltz cluster per test session.

Enable it on the command line, ``pytest -p waltz.testing``, or in the root ``conftest.py``::

    pytest_plugins = ["waltz.testing"]

It needs Debian's ``zookeeper`` package and a Java runtime, or an external ZooKeeper given with
``--waltz-zookeeper``, or (with the ``containers`` extra and a Docker engine) it runs ZooKeeper in
a container. Nothing happens until a test asks for one of its fixtures:

``waltz_cluster`` (session)
    A started :class:`~waltz.local.cluster.LocalCluster`: ZooKeeper, storage nodes and
    servers as processes on loopback; every partition has a writable owner. Data and logs are in
    pytest's temporary directory (``<basetemp>/waltz-cluster0``), kept after the run as pytest
    keeps its temporary directories. When a test that uses it fails, the report ends with the
    tail of the log of every cluster process that is not running.

``waltz_cluster_options`` (session)
    The keyword arguments of :class:`LocalCluster`, as a dict built from the ini options below
    (the option groups ``processes``, ``security`` and ``network`` of :mod:`waltz.local.options`
    among them). Override it in a ``conftest.py`` to size the cluster in code::

        @pytest.fixture(scope="session")
        def waltz_cluster_options(waltz_cluster_options):
            processes = dataclasses.replace(waltz_cluster_options["processes"], metrics=True)
            return {**waltz_cluster_options, "partitions": 8, "servers": 3, "processes": processes}

``waltz_log_start`` (function)
    Isolation by log position: undoes what earlier tests did to the cluster (restarts killed
    processes, resumes paused ones, waits until every partition is writable) and returns
    ``{partition_id: first transaction ID this test will append}``, so that a test reads only
    its own records. (A cluster root per test is not cheap: a storage node serves exactly one
    cluster key, so a fresh root needs fresh storage nodes.)

``waltz_cluster_factory`` (session)
    Starts more clusters, each with a log of its own, for tests whose checks read a whole log
    that must hold only their application's transactions: ``waltz_cluster_factory(name="ledger")``
    returns a started :class:`~waltz.local.cluster.LocalCluster` with the options of
    ``waltz_cluster_options`` and the keyword arguments given (they override them); every
    cluster it started is closed when the session ends. Share one in a session fixture of your
    own::

        @pytest.fixture(scope="session")
        def ledger_cluster(waltz_cluster_factory):
            return waltz_cluster_factory(name="ledger")

``waltz_postgres_url``, ``waltz_mariadb_url`` (session)
    The SQLAlchemy URL of a PostgreSQL (MariaDB) server: the one given with
    ``--waltz-postgres-url`` (``--waltz-mariadb-url``) or the ini option of the same name; else,
    with the ``containers`` extra and a Docker engine, a ``postgres:16`` (``mariadb:11``)
    container started for the session. Otherwise the test errors, saying how to give a URL
    (:mod:`waltz.local.containers`).

``waltz_client_config``, ``waltz_client_env`` (session)
    What reaches ``waltz_cluster`` as an application: a
    :class:`~waltz.client.config.WaltzClientConfig` (``waltz_cluster.client_settings()``), and
    the same as the environment of a subprocess (``waltz_cluster.client_env()``: the connect
    string, the root, the client role's ZooKeeper credential and TLS files). Not
    ``zookeeper_env()``, which holds only the credential and TLS variables.

``waltz_postgres_database``, ``waltz_mariadb_database``, ``waltz_sqlite_database`` (function)
    The URL of an empty database created for the test on the session's server
    (``waltz_postgres_url``, ``waltz_mariadb_url``), named ``waltz_test_<8 hex digits>``, and
    dropped after the test, its connections closed first; or a SQLite file of that name in the
    test's ``tmp_path``, deleted after it.

``waltz_database``, ``waltz_migrated_database`` (function)
    A database of the kind the test parametrizes ``waltz_database`` with,
    ``@pytest.mark.parametrize("waltz_database", ["postgresql", "mariadb", "sqlite"],
    indirect=True)``, SQLite when unparametrized; the migrated one holds the SQL framework's
    tables at their newest revision (:func:`waltz.jdbc_style.migrations_api.upgrade`).

``waltz_module_database``, ``waltz_module_migrated_database`` (module)
    The same, shared by a module's tests and dropped after its last; parametrize
    ``waltz_module_database`` (in the module's ``pytestmark``).

The database fixtures use the ``sql`` extra, which the ``testing`` extra brings.

Ini options (``[tool.pytest.ini_options]``, ``pytest.ini``, or ``-o name=value``):
``waltz_storages`` (3), ``waltz_servers`` (2), ``waltz_partitions`` (2), ``waltz_replicas``
(3, or the number of storage nodes when fewer), ``waltz_zookeeper`` (connect string of a running
ZooKeeper; empty: start one), ``waltz_metrics`` (false), ``waltz_session_timeout`` (seconds, 4),
``waltz_secure`` (true: every port serves mutual TLS with role certificates made for the cluster),
``waltz_zookeeper_auth`` (true: the cluster's znodes are protected by a credential per role made
for it). Build clients with ``WaltzClientConfig(**waltz_cluster.client_settings())``, and give a
subprocess ``waltz_cluster.client_env()``: both hold what reaches the cluster as an application
(the connect string, the root, the client role's credential and certificate).
The command-line option ``--waltz-zookeeper HOST:PORT`` overrides ``waltz_zookeeper``; likewise
``--waltz-postgres-url`` and ``--waltz-mariadb-url`` the ini options ``waltz_postgres_url`` and
``waltz_mariadb_url``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from waltz.local.containers import DatabaseKind, NoTestServiceError, database_server, zookeeper_server
from waltz.local.databases import server_database, sqlite_database
from waltz.local.options import NetworkOptions, ProcessOptions, SecurityOptions

if TYPE_CHECKING:
    from waltz.client.config import WaltzClientConfig
    from waltz.local.cluster import LocalCluster

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_makereport",
    "waltz_client_config",
    "waltz_client_env",
    "waltz_cluster",
    "waltz_cluster_factory",
    "waltz_cluster_options",
    "waltz_database",
    "waltz_log_start",
    "waltz_mariadb_database",
    "waltz_mariadb_url",
    "waltz_migrated_database",
    "waltz_module_database",
    "waltz_module_migrated_database",
    "waltz_postgres_database",
    "waltz_postgres_url",
    "waltz_sqlite_database",
]


def _network(text: str) -> str:
    network = text.strip()
    if network not in ("loopback", "namespaces"):
        raise ValueError(f"waltz_network must be loopback or namespaces, not {network!r}")
    return network


#: The ini options that set a field of an option group: ini option -> (group keyword, field).
_GROUP_FIELDS: dict[str, tuple[str, str]] = {
    "waltz_metrics": ("processes", "metrics"),
    "waltz_session_timeout": ("processes", "session_timeout"),
    "waltz_secure": ("security", "secure"),
    "waltz_zookeeper_auth": ("security", "zookeeper_auth"),
    "waltz_network": ("network", "mode"),
}
#: The option group of each group keyword of LocalCluster.
_GROUPS: dict[str, Callable[..., object]] = {
    "processes": ProcessOptions,
    "security": SecurityOptions,
    "network": NetworkOptions,
}


#: ini option -> (help, default, converter to the LocalCluster keyword argument or group field).
_INI: dict[str, tuple[str, str, Callable[[str], object]]] = {
    "waltz_storages": ("number of storage nodes of the waltz_cluster fixture", "3", int),
    "waltz_servers": ("number of servers of the waltz_cluster fixture", "2", int),
    "waltz_partitions": ("number of partitions of the waltz_cluster fixture", "2", int),
    "waltz_replicas": (
        "replicas per partition (default: 3, or the number of storage nodes when fewer)",
        "",
        int,
    ),
    "waltz_zookeeper": ("connect string of a running ZooKeeper (default: start one)", "", str),
    "waltz_metrics": (
        "serve /metrics and /health on every node",
        "false",
        lambda text: text.strip().lower() in ("1", "true", "yes", "on"),
    ),
    "waltz_session_timeout": ("servers' ZooKeeper session timeout in seconds", "4", float),
    "waltz_secure": (
        "serve mutual TLS with role certificates made for the cluster on every port",
        "true",
        lambda text: text.strip().lower() in ("1", "true", "yes", "on"),
    ),
    "waltz_zookeeper_auth": (
        "protect the cluster's znodes with a ZooKeeper credential per role",
        "true",
        lambda text: text.strip().lower() in ("1", "true", "yes", "on"),
    ),
    "waltz_network": (
        "loopback (every node on 127.0.0.1) or namespaces (each node on a host of its own, a network "
        "namespace with its own address; needs root)",
        "loopback",
        _network,
    ),
}


#: Database fixtures: ini option (and fixture) -> (kind, command-line option).
_DATABASES: dict[str, tuple[DatabaseKind, str]] = {
    "waltz_postgres_url": ("postgresql", "--waltz-postgres-url"),
    "waltz_mariadb_url": ("mariadb", "--waltz-mariadb-url"),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``waltz_*`` ini options, ``--waltz-zookeeper`` and the database URL options."""
    group = parser.getgroup("waltz", "Waltz local cluster (waltz.testing)")
    group.addoption(
        "--waltz-zookeeper",
        metavar="HOST:PORT",
        default=None,
        help="use this running ZooKeeper for the waltz_cluster fixture instead of starting one",
    )
    for name, (help_text, default, _) in _INI.items():
        parser.addini(name, help_text, default=default)
    for name, (kind, option) in _DATABASES.items():
        help_text = f"SQLAlchemy URL of a {kind} server for {name} (default: a container, if Docker runs)"
        group.addoption(option, metavar="URL", default=None, dest=name, help=help_text)
        parser.addini(name, help_text, default="")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, give this worker a slice of the local ports of its own.

    Each worker (``PYTEST_XDIST_WORKER`` ``gwN`` of ``PYTEST_XDIST_WORKER_COUNT``) sets
    ``WALTZ_PORT_RANGE`` to the N-th of equal slices of :func:`waltz.local.processes.port_range`,
    so that two workers starting clusters at once never draw the same port (a port is checked free
    when drawn, but taken only when the process binds it, a second later). A ``WALTZ_PORT_RANGE``
    set by the user is split the same way.
    """
    from waltz.local.processes import PORT_RANGE_ENV, port_range

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or count < 2 or not worker[2:].isdigit():
        return
    index = int(worker[2:]) % count
    low, high = port_range()
    size = (high - low + 1) // count
    first = low + index * size
    os.environ[PORT_RANGE_ENV] = f"{first}-{first + size - 1}"


def _no_service(missing: NoTestServiceError, hint: str = "") -> BaseException:
    """The failure of a fixture that found no service: its message once, without the chained
    traceback of the error it replaces (raise it ``from None``)."""
    return pytest.fail.Exception(f"{missing}{hint}", pytrace=False)


def _database_url(pytestconfig: pytest.Config, name: str) -> Iterator[str]:
    kind, option = _DATABASES[name]
    given = pytestconfig.getoption(name) or str(pytestconfig.getini(name)).strip() or None
    with ExitStack() as stack:
        try:
            url = stack.enter_context(database_server(kind, given, option=option))
        except NoTestServiceError as missing:
            hint = f"; in a configuration file, the ini option {name} = URL gives it too"
            raise _no_service(missing, hint) from None
        yield url


@pytest.fixture(scope="session")
def waltz_postgres_url(pytestconfig: pytest.Config) -> Iterator[str]:
    """The SQLAlchemy URL of a PostgreSQL server for the session (given, or a container).

    Raises:
        pytest.fail.Exception: none given and no container possible; the message says how to give one.
    """
    yield from _database_url(pytestconfig, "waltz_postgres_url")


@pytest.fixture(scope="session")
def waltz_mariadb_url(pytestconfig: pytest.Config) -> Iterator[str]:
    """The SQLAlchemy URL of a MariaDB server for the session (given, or a container).

    Raises:
        pytest.fail.Exception: none given and no container possible; the message says how to give one.
    """
    yield from _database_url(pytestconfig, "waltz_mariadb_url")


@pytest.fixture
def waltz_postgres_database(waltz_postgres_url: str) -> Iterator[str]:
    """The URL of an empty PostgreSQL database made for this test on the session's server, e.g.
    ``postgresql+psycopg://postgres@127.0.0.1:5432/waltz_test_1a2b3c4d``; dropped afterwards.

    Raises:
        sqlalchemy.exc.DBAPIError: the server refused the connection or the ``CREATE DATABASE``.
    """
    with server_database(waltz_postgres_url) as url:
        yield url


@pytest.fixture
def waltz_mariadb_database(waltz_mariadb_url: str) -> Iterator[str]:
    """The URL of an empty MariaDB database made for this test on the session's server, e.g.
    ``mysql+pymysql://root@127.0.0.1:3306/waltz_test_1a2b3c4d``; dropped afterwards.

    Raises:
        sqlalchemy.exc.DBAPIError: the server refused the connection or the ``CREATE DATABASE``.
    """
    with server_database(waltz_mariadb_url) as url:
        yield url


#: The kinds of database ``waltz_database`` (``waltz_module_database``) is parametrized with, and
#: the fixture of the server each needs (none: a file of the test's own).
_DATABASE_KINDS: dict[str, str | None] = {
    "postgresql": "waltz_postgres_url",
    "mariadb": "waltz_mariadb_url",
    "sqlite": None,
}


@contextmanager
def _parametrized_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """The database of the kind ``request.param`` names (``sqlite`` when unparametrized)."""
    kind = getattr(request, "param", "sqlite")
    if kind not in _DATABASE_KINDS:
        raise pytest.UsageError(
            f"{request.fixturename} is parametrized with {kind!r}; "
            f"use one of {', '.join(_DATABASE_KINDS)} (with indirect=True)"
        )
    server_fixture = _DATABASE_KINDS[kind]
    if server_fixture is None:
        factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
        with sqlite_database(factory.mktemp("waltz-sqlite")) as url:
            yield url
    else:
        with server_database(request.getfixturevalue(server_fixture)) as url:
            yield url


def _migrate(request: pytest.FixtureRequest, database: str, parametrize: str) -> str:
    """Create the SQL framework's tables in ``database`` (docs/design/sql.md, "Migrations")."""
    if hasattr(request, "param"):
        raise pytest.UsageError(
            f"{request.fixturename} takes its database from {parametrize}: parametrize "
            f'{parametrize} instead (@pytest.mark.parametrize("{parametrize}", [...], indirect=True))'
        )
    from waltz.jdbc_style import migrations_api

    migrations_api.upgrade(database)
    return database


@pytest.fixture
def waltz_sqlite_database(tmp_path: Path) -> Iterator[str]:
    """The URL of an empty SQLite database made for this test, a file in its ``tmp_path``, e.g.
    ``sqlite:////tmp/pytest-of-me/pytest-7/test_it0/waltz_test_1a2b3c4d.db``; deleted afterwards."""
    with sqlite_database(tmp_path) as url:
        yield url


@pytest.fixture
def waltz_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of an empty database made for this test and dropped after it.

    Its kind is the test's parameter, ``@pytest.mark.parametrize("waltz_database", ["postgresql",
    "mariadb", "sqlite"], indirect=True)``: a database on the session's ``waltz_postgres_url`` or
    ``waltz_mariadb_url`` server (as ``waltz_postgres_database``), or a SQLite file (as
    ``waltz_sqlite_database``). Unparametrized, it is SQLite.

    Raises:
        pytest.UsageError: the parameter is not one of the three kinds.
        pytest.fail.Exception: no server of that kind given, and no container possible.
        sqlalchemy.exc.DBAPIError: the server refused the connection or the ``CREATE DATABASE``.
    """
    with _parametrized_database(request) as url:
        yield url


@pytest.fixture
def waltz_migrated_database(request: pytest.FixtureRequest, waltz_database: str) -> str:
    """``waltz_database`` with the SQL framework's tables at their newest revision, as ``waltz db
    upgrade`` makes them (docs/design/sql.md, "Migrations"); parametrize ``waltz_database`` to
    choose its kind.

    Raises:
        pytest.UsageError: the test parametrized this fixture rather than ``waltz_database``.
        sqlalchemy.exc.DBAPIError: the database refused the DDL.
    """
    return _migrate(request, waltz_database, "waltz_database")


@pytest.fixture(scope="module")
def waltz_module_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """``waltz_database`` shared by the tests of a module: made before its first test that asks
    for it, dropped after its last; parametrize it the same way (in ``pytestmark``, or per test).

    Raises:
        pytest.UsageError: the parameter is not one of ``postgresql``, ``mariadb``, ``sqlite``.
        pytest.fail.Exception: no server of that kind given, and no container possible.
    """
    with _parametrized_database(request) as url:
        yield url


@pytest.fixture(scope="module")
def waltz_module_migrated_database(request: pytest.FixtureRequest, waltz_module_database: str) -> str:
    """``waltz_module_database`` with the SQL framework's tables (as ``waltz_migrated_database``).

    Raises:
        pytest.UsageError: the test parametrized this fixture rather than ``waltz_module_database``.
    """
    return _migrate(request, waltz_module_database, "waltz_module_database")


@pytest.fixture(scope="session")
def waltz_cluster_options(pytestconfig: pytest.Config) -> dict[str, Any]:
    """Keyword arguments of the session's :class:`LocalCluster`, from the ini options.

    Returns:
        A new dict (``storages``, ``servers``, ``partitions``, ``replicas``, ``zookeeper``, and
        the groups ``processes`` (``metrics``, ``session_timeout``), ``security``
        (``zookeeper_auth``) and ``network`` (``mode``)); override the fixture to change or add
        keys.

    Raises:
        pytest.UsageError: an ini option holds a value of the wrong type.
    """
    options: dict[str, Any] = {}
    fields: dict[str, dict[str, object]] = {group: {} for group in _GROUPS}
    for name, (_, _, convert) in _INI.items():
        text = str(pytestconfig.getini(name)).strip()
        if not text:
            continue
        try:
            value = convert(text)
        except ValueError:
            raise pytest.UsageError(f"ini option {name} = {text!r} is not a valid value") from None
        if name in _GROUP_FIELDS:
            group, field = _GROUP_FIELDS[name]
            fields[group][field] = value
        else:
            options[name.removeprefix("waltz_")] = value
    zookeeper = pytestconfig.getoption("waltz_zookeeper")
    if zookeeper:
        options["zookeeper"] = zookeeper
    return {**options, **{group: _GROUPS[group](**values) for group, values in fields.items()}}


_CLUSTER_KEY = pytest.StashKey["LocalCluster"]()
_FACTORY_KEY = pytest.StashKey[list["LocalCluster"]]()


def _start_cluster(stack: ExitStack, options: dict[str, Any], given: dict[str, Any]) -> LocalCluster:
    """Start a LocalCluster with ``options`` (and its ZooKeeper, as the ``zookeeper`` option says)
    on ``stack``, which closes both; ``given`` are the options the user gave, named in errors."""
    from waltz.local.cluster import LocalCluster

    options = dict(options)
    zookeeper = None
    network = options.get("network")
    namespaces = isinstance(network, NetworkOptions) and network.mode == "namespaces"
    try:
        if not namespaces:  # that mode starts ZooKeeper on a host of its own
            zookeeper = stack.enter_context(zookeeper_server(options.get("zookeeper")))
    except NoTestServiceError as missing:
        raise _no_service(missing) from None
    if zookeeper is not None:
        options["zookeeper"] = zookeeper
    try:
        cluster = LocalCluster(**options)
    except TypeError as exc:
        raise pytest.UsageError(
            f"waltz_cluster_options {sorted(given)}: {exc}; "
            "the keys must be keyword arguments of waltz.local.cluster.LocalCluster"
        ) from None
    return stack.enter_context(cluster)


@pytest.fixture(scope="session")
def waltz_cluster(
    waltz_cluster_options: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
) -> Iterator[LocalCluster]:
    """A started local Waltz cluster shared by the whole test session, closed at its end.

    Its ZooKeeper is the one given (``zookeeper`` option), else Debian's started by the cluster,
    else a container (:func:`waltz.local.containers.zookeeper_server`). With ``waltz_network =
    namespaces`` every process, ZooKeeper too, runs on a host of its own (a network namespace with
    its own address, reached from the tests through a bridge).

    Raises:
        pytest.UsageError: ``waltz_cluster_options`` holds a key LocalCluster does not take.
        pytest.fail.Exception: no ZooKeeper given, installed, or possible in a container.
    """
    options = {"name": "pytest", "delete_root": True, **waltz_cluster_options}
    options.setdefault("work_dir", tmp_path_factory.mktemp("waltz-cluster"))
    with ExitStack() as stack:
        cluster = _start_cluster(stack, options, waltz_cluster_options)
        pytestconfig.stash[_CLUSTER_KEY] = cluster
        try:
            yield cluster
        finally:
            del pytestconfig.stash[_CLUSTER_KEY]


@pytest.fixture(scope="session")
def waltz_cluster_factory(
    waltz_cluster_options: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
) -> Iterator[Callable[..., LocalCluster]]:
    """Start more local clusters for the session, each with a log of its own; all closed at its end.

    Returns:
        ``start(**options)``: a started cluster with the options of ``waltz_cluster_options``
        overridden by ``options`` (keyword arguments of :class:`~waltz.local.cluster.LocalCluster`;
        ``name`` defaults to ``pytest-<n>``, the work directory to ``<basetemp>/waltz-<name>0``).
        Each call starts another cluster: keep one in a session fixture of your own.

    Raises:
        pytest.UsageError: from ``start``, an option LocalCluster does not take.
        pytest.fail.Exception: from ``start``, no ZooKeeper given, installed, or possible in a
            container.
    """
    started: list[LocalCluster] = []
    with ExitStack() as stack:

        def start(**overrides: Any) -> LocalCluster:
            given = {**waltz_cluster_options, **overrides}
            options = {"name": f"pytest-{len(started) + 1}", "delete_root": True, **given}
            options.setdefault("work_dir", tmp_path_factory.mktemp(f"waltz-{options['name']}"))
            cluster = _start_cluster(stack, options, given)
            started.append(cluster)
            return cluster

        pytestconfig.stash[_FACTORY_KEY] = started
        try:
            yield start
        finally:
            del pytestconfig.stash[_FACTORY_KEY]


@pytest.fixture(scope="session")
def waltz_client_config(waltz_cluster: LocalCluster) -> WaltzClientConfig:
    """A :class:`~waltz.client.config.WaltzClientConfig` reaching the session's cluster as an
    application does: ``WaltzClientConfig(**waltz_cluster.client_settings())`` (the connect
    string, the root, the client role's ZooKeeper credential and the ``client`` certificate).
    Change a field with ``waltz_client_config.model_copy(update={...})``."""
    from waltz.client.config import WaltzClientConfig

    return WaltzClientConfig(**waltz_cluster.client_settings())


@pytest.fixture(scope="session")
def waltz_client_env(waltz_cluster: LocalCluster) -> dict[str, str]:
    """The environment a subprocess needs to reach the session's cluster as an application:
    ``waltz_cluster.client_env()``, every ``WALTZ_*`` variable of ``waltz_client_config``
    (``WALTZ_ZOOKEEPER_CONNECT_STRING``, ``WALTZ_CLUSTER_ROOT``, the client role's
    ``WALTZ_ZOOKEEPER_*`` credential and ``WALTZ_CLIENT_TLS_*``). Pass it on top of the test's
    own, ``subprocess.run(..., env={**os.environ, **waltz_client_env})``; it is shared by the
    session, so copy it rather than change it."""
    return waltz_cluster.client_env()


@pytest.fixture
def waltz_log_start(waltz_cluster: LocalCluster) -> dict[int, int]:
    """Heal the session's cluster and return where this test's records start in each partition.

    Returns:
        Partition ID -> the transaction ID the next append to that partition will get.

    Raises:
        ClusterNotReadyError: the cluster could not be made ready again.
    """
    owners = waltz_cluster.heal()
    return {pid: owner.high_water_mark + 1 for pid, owner in owners.items()}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Add the log tails of stopped cluster processes to the report of a failed test that used a
    cluster of the plugin (``waltz_cluster``, or one from ``waltz_cluster_factory``)."""
    report = yield
    if not report.failed or report.when not in ("setup", "call"):
        return report
    names = getattr(item, "fixturenames", ())
    clusters: list[LocalCluster] = []
    if "waltz_cluster" in names and _CLUSTER_KEY in item.config.stash:
        clusters.append(item.config.stash[_CLUSTER_KEY])
    if "waltz_cluster_factory" in names and _FACTORY_KEY in item.config.stash:
        started: list[LocalCluster] = item.config.stash[_FACTORY_KEY]
        clusters += started
    for cluster in clusters:
        lines = [
            f"work dir: {cluster.work_dir}",
            f"running: {', '.join(sorted(cluster.pids())) or 'nothing'}",
        ]
        processes = [n.process for n in cluster.storages] + [s.process for s in cluster.servers]
        for process in processes:
            if not process.is_running():
                lines += [f"--- {process.name} is not running; its log ({process.log_path}) ends with:"]
                lines.append(process.log_tail(30))
        title = "waltz local cluster" if len(clusters) == 1 else f"waltz local cluster {cluster.root}"
        report.sections.append((title, "\n".join(lines)))
    return report
