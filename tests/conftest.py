"""Fixtures shared by every test suite: ZooKeeper, databases, storage directories, processes.

Real components only:

- ``zookeeper`` (session): one real ZooKeeper for the whole run, ``tickTime`` 500 ms. Do not stop
  or kill it; a test that crashes ZooKeeper uses ``private_zookeeper``.
- ``zk_root``: a cluster root path unique to the test, deleted (recursively) afterwards.
- ``zk_client``: a started :class:`kazoo.client.KazooClient` on the session ZooKeeper.
- ``private_zookeeper``: a ZooKeeper of the test's own, to stop, kill, pause and restart.
- ``postgres_url`` / ``mariadb_url``: an empty database created for the test and dropped
  afterwards, as an SQLAlchemy URL string.
- ``storage_dir``: an empty directory for a storage node.
- ``process_factory``: creates :class:`ManagedProcess` objects logging into the test's tmp dir and
  kills them all at teardown; their log tails appear in the report of a failed test.

A missing service (database server, java) skips the tests that need it, or fails them when the
``CI`` environment variable is set. Hypothesis uses the "ci" profile under CI and "dev" otherwise
(``--hypothesis-profile`` overrides it). The fuzz tests (marker ``fuzz``) apply the profiles
``fuzz`` and ``fuzz-deep`` registered here (``support/fuzz_settings.py``) with
``@fuzz_settings(share)``, so they never change the profile of other tests.

kazoo's connection threads (of the session clusters' ZooKeeper clients, alive while hypothesis
tests run) draw ping jitter and host order from the global ``random`` on every loop; hypothesis
takes a change of the global state during a draw for a strategy using ``random`` (a
``HypothesisDeprecationWarning`` now, an error in later versions). They get a generator of their
own here.

The run starts with gRPC's fork handlers off (``GRPC_ENABLE_FORK_SUPPORT=false`` unless the
environment sets it), as Waltz's own processes do.
"""

from __future__ import annotations

import os

from waltz.tuning import GRPC_FORK_SUPPORT

# As in Waltz's own processes, before anything imports grpc: the tests' Spark sessions start their
# JVM by a fork, whose child gRPC's fork handlers can kill (docs/decisions/0082-grpc-fork-handlers-off.md).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", GRPC_FORK_SUPPORT)

import random
from collections.abc import Generator, Iterator
from pathlib import Path

import kazoo.protocol.connection
import kazoo.retry
import pytest
import support
from hypothesis import settings
from kazoo.client import KazooClient
from support.fuzz_settings import register_profiles

from waltz.errors import ConfigurationError
from waltz.local.zookeeper import DockerZooKeeper, LocalZooKeeper, docker_engine_available

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=100)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if support.in_ci() else "dev")
register_profiles()

# kazoo uses only randint, shuffle and uniform of the module: a Random instance has them all.
kazoo.protocol.connection.random = random.Random()
kazoo.retry.random = random.Random()

#: ZooKeeper's tickTime in the tests: sessions expire within 1 to 10 s (2 to 20 ticks).
TEST_TICK_TIME_MS = 500


@pytest.hookimpl(optionalhook=True)  # a run without pytest-xdist (-p no:xdist) has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With ``--dist loadgroup`` (``scripts/test``), the tests of ``tests/spark`` go to one worker
    (``support/scheduling.py``); any other ``--dist`` is xdist's own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from support.scheduling import SparkGroupScheduling

    return SparkGroupScheduling(config, log)  # type: ignore[arg-type]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Add the logs registered with ``support.add_failure_logs`` to the report of a failed test."""
    report = yield
    if report.failed and report.when in ("setup", "call"):
        for title, logs in item.stash.get(support.FAILURE_LOGS_KEY, []):
            try:
                text = logs()
            except Exception as error:
                text = f"(could not read the logs: {error!r})"
            report.sections.append((title, text))
    return report


# --- ZooKeeper -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalZooKeeper | DockerZooKeeper]:
    """One ZooKeeper per test session (Debian's package; a container if only Docker is there)."""
    try:
        server = LocalZooKeeper(data_dir=tmp_path_factory.mktemp("zookeeper"), tick_time_ms=TEST_TICK_TIME_MS)
    except ConfigurationError as error:
        if not docker_engine_available():
            support.unavailable(str(error))
        with DockerZooKeeper(tick_time_ms=TEST_TICK_TIME_MS) as container:
            yield container
        return
    with server:
        yield server


@pytest.fixture
def zk_root(request: pytest.FixtureRequest, zookeeper: LocalZooKeeper | DockerZooKeeper) -> Iterator[str]:
    """A cluster root unique to the test, ``/waltz-test/<test name>-<8 hex>`` (not created).

    Whatever the test created under it is deleted afterwards.
    """
    root = f"/waltz-test/{support.safe_name(request.node.name)}-{support.unique_suffix()}"
    yield root
    cleaner = KazooClient(hosts=zookeeper.connect_string)
    cleaner.start(timeout=10)
    try:
        cleaner.delete(root, recursive=True)
    finally:
        cleaner.stop()
        cleaner.close()


@pytest.fixture
def zk_client(zookeeper: LocalZooKeeper | DockerZooKeeper, zk_root: str) -> Iterator[KazooClient]:
    """A started kazoo client on the session ZooKeeper; stopped and closed afterwards.

    It depends on ``zk_root`` so that it is closed (its ephemeral nodes gone) before the root is
    deleted.
    """
    client = KazooClient(hosts=zookeeper.connect_string)
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def private_zookeeper(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalZooKeeper]:
    """A started ZooKeeper only this test uses (it may kill and restart it), closed afterwards."""
    try:
        server = LocalZooKeeper(data_dir=tmp_path / "zookeeper", tick_time_ms=TEST_TICK_TIME_MS)
    except ConfigurationError as error:
        support.unavailable(str(error))
    support.add_failure_logs(request.node, f"ZooKeeper log {server.log_path}", server.log_tail)
    with server:
        yield server


# --- databases -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> support.DatabaseServer:
    """The PostgreSQL server (``WALTZ_TEST_POSTGRES_URL`` or 127.0.0.1:5432), checked reachable."""
    support.POSTGRES.check_reachable()
    return support.POSTGRES


@pytest.fixture(scope="session")
def mariadb_server() -> support.DatabaseServer:
    """The MariaDB server (``WALTZ_TEST_MARIADB_URL`` or 127.0.0.1:3306), checked reachable."""
    support.MARIADB.check_reachable()
    return support.MARIADB


@pytest.fixture
def postgres_url(postgres_server: support.DatabaseServer) -> Iterator[str]:
    """URL of an empty PostgreSQL database made for this test, e.g.
    ``postgresql+psycopg://postgres@127.0.0.1:5432/waltz_test_1a2b3c4d``; dropped afterwards."""
    with postgres_server.fresh_database() as url:
        yield url


@pytest.fixture
def mariadb_url(mariadb_server: support.DatabaseServer) -> Iterator[str]:
    """URL of an empty MariaDB database made for this test, e.g.
    ``mysql+pymysql://root@127.0.0.1:3306/waltz_test_1a2b3c4d``; dropped afterwards."""
    with mariadb_server.fresh_database() as url:
        yield url


# --- storage and processes -----------------------------------------------------------------------


@pytest.fixture
def storage_dir(tmp_path: Path) -> Path:
    """A fresh, empty directory for a storage node's data."""
    path = tmp_path / "storage"
    path.mkdir()
    return path


@pytest.fixture
def process_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[support.ProcessFactory]:
    """Create ManagedProcess objects (not started) logging to ``<tmp_path>/logs/<name>.log``.

    Every process is killed at teardown, whatever the outcome of the test; when the test fails,
    the report shows the tail of each process's log.
    """
    factory = support.ProcessFactory(tmp_path / "logs")
    support.add_failure_logs(request.node, "managed processes", factory.describe_logs)
    try:
        yield factory
    finally:
        factory.close_all()
