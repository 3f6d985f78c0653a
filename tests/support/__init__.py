"""Helpers shared by the test suites and their fixtures (``tests/conftest.py``).

Import as ``import support`` (``tests`` is on ``pythonpath`` in pyproject.toml).

- :func:`in_ci` / :func:`unavailable`: a missing external service skips a test on a developer's
  machine and fails it under CI (the ``CI`` environment variable), never a silent skip in CI.
- :class:`DatabaseServer`: the local PostgreSQL / MariaDB servers, one fresh database per test.
- :class:`ProcessFactory`: :class:`ManagedProcess` objects with their logs in the test's tmp dir,
  all killed at teardown.
- :func:`add_failure_logs`: attach log tails to a failing test's report.
- :func:`pid_is_alive`: whether a PID is a live (not zombie) process.
- :func:`parse_python`: ``ast.parse``, past CPython 3.11's spurious "recursion depth mismatch".
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions, SecurityOptions
from waltz.local.processes import ManagedProcess

__all__ = [
    "FAILURE_LOGS_KEY",
    "MARIADB",
    "POSTGRES",
    "DatabaseServer",
    "ProcessFactory",
    "add_failure_logs",
    "healed_cluster",
    "in_ci",
    "parse_python",
    "pid_is_alive",
    "pid_state",
    "safe_name",
    "session_cluster",
    "unavailable",
    "unique_suffix",
]


def in_ci() -> bool:
    """Whether the tests run under continuous integration (``CI`` set, and not to 0/false/no)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(message: str) -> NoReturn:
    """Give up on a test because an external service is missing: fail under CI, skip otherwise."""
    if in_ci():
        pytest.fail(f"{message} (CI is set, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(message)


async def settle(condition: Callable[[], bool], what: str, timeout: float = 1.0) -> None:
    """Poll ``condition`` on the running event loop (every millisecond) until it holds; raise
    AssertionError naming ``what`` after ``timeout`` seconds (the asyncio twin of
    :func:`waltz.local.processes.wait_until`, for tests whose loop must keep running)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


def _ast_state_race(exc: BaseException) -> bool:
    return isinstance(exc, SystemError) and "recursion depth mismatch" in str(exc)


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``, tried up to three times when it raises CPython 3.11's
    spurious ``SystemError: AST constructor recursion depth mismatch`` (the interpreter's AST
    state is shared by its threads and a failed construction left it off, CPython gh-106905,
    fixed in 3.12): the source is not at fault, and a second parse succeeds.

    Raises:
        SyntaxError: the source does not parse.
    """
    for attempt in Retrying(
        retry=retry_if_exception(_ast_state_race), stop=stop_after_attempt(3), reraise=True
    ):
        with attempt:
            return ast.parse(source, filename=filename)
    raise AssertionError("unreachable: Retrying re-raises the last error")


def unique_suffix() -> str:
    """Eight random lowercase hex digits, for names that must not collide between tests."""
    return uuid.uuid4().hex[:8]


def safe_name(text: str, max_length: int = 80) -> str:
    """``text`` reduced to ``[A-Za-z0-9_.-]`` (other characters become ``_``), at most ``max_length``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:max_length]


def pid_is_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process; a zombie (exited, not yet reaped) counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    # The state follows the command name in parentheses, which may itself contain spaces.
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def descendants(root: int) -> dict[int, str]:
    """Process ID -> command line (arguments joined by spaces) of every process under ``root`` now:
    its children, theirs, and so on, whatever session they run in."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found.update(children)
        frontier += children
    return {pid: cmdline(pid) for pid in sorted(found)}


def cmdline(pid: int) -> str:
    """The command line of ``pid``, arguments joined by spaces; ``""`` once it is gone."""
    try:
        return (
            (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def pid_state(pid: int) -> str:
    """The one-letter state of ``pid`` in ``/proc`` (``R``, ``S``, ``T`` stopped, ``Z``...), or ``""``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


# --- failure logs --------------------------------------------------------------------------------

#: Per test item: (title, function returning text) pairs added to the report when the test fails.
FAILURE_LOGS_KEY = pytest.StashKey[list[tuple[str, Callable[[], str]]]]()


def add_failure_logs(item: pytest.Item, title: str, logs: Callable[[], str]) -> None:
    """Show ``logs()`` in the report of ``item`` (``request.node``) if its test fails.

    The hook in ``conftest.py`` calls ``logs`` after the test body and before fixture teardown, so
    the processes it describes still exist.
    """
    item.stash.setdefault(FAILURE_LOGS_KEY, []).append((title, logs))


# --- databases -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DatabaseServer:
    """A database server the tests may create and drop databases on.

    Args:
        product: the server's name for messages (``"PostgreSQL"``, ``"MariaDB"``).
        env_var: the environment variable that overrides ``default_admin_url``.
        default_admin_url: the SQLAlchemy URL of an administrative connection to the server.
        driver: the DBAPI driver used when the URL names none (``psycopg`` in ``postgresql+psycopg``).
    """

    product: str
    env_var: str
    default_admin_url: str
    driver: str

    @property
    def admin_url(self) -> URL:
        """The administrative URL: ``env_var`` if set, else the default, with our driver."""
        url = make_url(os.environ.get(self.env_var) or self.default_admin_url)
        if "+" not in url.drivername:
            url = url.set(drivername=f"{url.drivername}+{self.driver}")
        return url

    @property
    def is_postgres(self) -> bool:
        """Whether this is a PostgreSQL server (else MariaDB/MySQL)."""
        return self.admin_url.get_backend_name() == "postgresql"

    def admin_engine(self) -> sa.Engine:
        """An engine on the admin URL in autocommit mode (CREATE/DROP DATABASE), without a pool."""
        return sa.create_engine(
            self.admin_url,
            isolation_level="AUTOCOMMIT",
            poolclass=NullPool,
            connect_args={"connect_timeout": 5},  # seconds; psycopg and PyMySQL both take it
        )

    def check_reachable(self) -> None:
        """Connect once; if that fails, skip the test (or fail it under CI) with the reason."""
        engine = self.admin_engine()
        failure: BaseException | None = None
        try:
            with engine.connect() as connection:
                connection.execute(sa.text("SELECT 1"))
        except sa.exc.OperationalError as error:
            failure = error.orig  # reported below, outside the except block (no chained traceback)
        finally:
            engine.dispose()
        if failure is not None:
            unavailable(
                f"{self.product} at {self.admin_url.render_as_string(hide_password=True)} is not "
                f"reachable ({failure!r}); start it, or point {self.env_var} at a server's admin URL"
            )

    def database_url(self, name: str) -> str:
        """The SQLAlchemy URL (as text, password included) of database ``name`` on this server."""
        return self.admin_url.set(database=name).render_as_string(hide_password=False)

    def create_database(self, name: str) -> str:
        """Create database ``name`` (``[a-z0-9_]`` only) and return its URL."""
        _check_identifier(name)
        engine = self.admin_engine()
        try:
            with engine.connect() as connection:
                if self.is_postgres:
                    connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
                else:
                    connection.execute(sa.text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
        finally:
            engine.dispose()
        return self.database_url(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, closing connections still open to it."""
        _check_identifier(name)
        engine = self.admin_engine()
        try:
            with engine.connect() as connection:
                if self.is_postgres:
                    connection.execute(
                        sa.text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = :name AND pid <> pg_backend_pid()"
                        ),
                        {"name": name},
                    )
                    connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
                else:
                    ids = connection.execute(
                        sa.text("SELECT id FROM information_schema.processlist WHERE db = :name"),
                        {"name": name},
                    ).scalars()
                    for connection_id in list(ids):
                        try:
                            connection.execute(sa.text(f"KILL CONNECTION {int(connection_id)}"))
                        except sa.exc.OperationalError as error:  # it ended meanwhile
                            if "Unknown thread id" not in str(error):
                                raise
                    connection.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
        finally:
            engine.dispose()

    def database_exists(self, name: str) -> bool:
        """Whether database ``name`` exists on the server."""
        engine = self.admin_engine()
        try:
            with engine.connect() as connection:
                if self.is_postgres:
                    query = "SELECT 1 FROM pg_database WHERE datname = :name"
                else:
                    query = "SELECT 1 FROM information_schema.schemata WHERE schema_name = :name"
                return connection.execute(sa.text(query), {"name": name}).first() is not None
        finally:
            engine.dispose()

    @contextmanager
    def fresh_database(self) -> Iterator[str]:
        """Create an empty database ``waltz_test_<8 hex>``, yield its URL, drop it afterwards."""
        name = f"waltz_test_{unique_suffix()}"
        url = self.create_database(name)
        try:
            yield url
        finally:
            self.drop_database(name)


def _check_identifier(name: str) -> None:
    if not re.fullmatch(r"[a-z0-9_]{1,63}", name):
        raise ValueError(f"database name {name!r} must match [a-z0-9_]{{1,63}}")


POSTGRES = DatabaseServer(
    product="PostgreSQL",
    env_var="WALTZ_TEST_POSTGRES_URL",
    default_admin_url="postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    driver="psycopg",
)
MARIADB = DatabaseServer(
    product="MariaDB",
    env_var="WALTZ_TEST_MARIADB_URL",
    default_admin_url="mysql+pymysql://root@127.0.0.1:3306",
    driver="pymysql",
)


# --- processes -----------------------------------------------------------------------------------


class ProcessFactory:
    """Creates :class:`ManagedProcess` objects for one test and kills them all at teardown.

    Each process logs to ``<log_dir>/<name>.log`` (a numeric suffix keeps names unique).

    Args:
        log_dir: the directory for the log files (created if needed).
    """

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._processes: list[ManagedProcess] = []
        self._names: set[str] = set()

    @property
    def processes(self) -> list[ManagedProcess]:
        """Every process created so far, in creation order."""
        return list(self._processes)

    def __call__(
        self,
        args: Sequence[str],
        *,
        name: str,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> ManagedProcess:
        """Create (not start) a process; see :class:`ManagedProcess` for the arguments."""
        unique = safe_name(name)
        counter = 1
        while unique in self._names:
            counter += 1
            unique = f"{safe_name(name)}-{counter}"
        self._names.add(unique)
        process = ManagedProcess(
            args, name=unique, log_path=self._log_dir / f"{unique}.log", env=env, cwd=cwd
        )
        self._processes.append(process)
        return process

    def close_all(self) -> None:
        """Kill every process created by this factory (idempotent)."""
        errors: list[Exception] = []
        for process in reversed(self._processes):
            try:
                process.close()
            except Exception as error:
                errors.append(error)
        if errors:
            raise ExceptionGroup("could not close every managed process", errors)

    def describe_logs(self, n_lines: int = 40) -> str:
        """The state and the last ``n_lines`` log lines of every process, for a failure report."""
        parts = []
        for process in self._processes:
            parts.append(f"=== {process!r}, log {process.log_path}:\n{process.log_tail(n_lines)}")
        return "\n".join(parts) if parts else "(no processes)"


# --- local clusters shared by a test session ---------------------------------------------------

#: The explicit opt-out of a local cluster's security (its default: mutual TLS with role
#: certificates, ZooKeeper credentials per role) for the tests of the protocol itself, which talk
#: to the nodes through raw admin clients and to ZooKeeper through anonymous sessions. The secure
#: default runs under the application-facing tests (client, jdbc_style, spark, perf, docs, the
#: examples, the demo, chaos) and the security tests (tests/services/test_roles.py,
#: tests/local/test_attackers.py, tests/local/test_local_cluster_files.py).
PLAINTEXT = SecurityOptions.plaintext()


@contextmanager
def session_cluster(
    tmp_path_factory: pytest.TempPathFactory,
    zookeeper: object,
    *,
    name: str,
    partitions: int,
    servers: int = 2,
    metrics: bool = False,
    security: SecurityOptions | None = None,
) -> Iterator[LocalCluster]:
    """A LocalCluster on the session's ZooKeeper: 3 storage nodes, ``servers`` servers, its own root
    (deleted at the end), data and logs under pytest's temporary directory; ``metrics``: the nodes
    serve ``/metrics``; ``security``: None is a local cluster's default (mutual TLS, ZooKeeper
    credentials per role)."""
    with LocalCluster(
        security=security,
        storages=3,
        servers=servers,
        partitions=partitions,
        processes=ProcessOptions(metrics=metrics),
        name=name,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path_factory.mktemp(f"{name}-cluster"),
        delete_root=True,
    ) as local:
        yield local


def healed_cluster(request: pytest.FixtureRequest, cluster: LocalCluster) -> LocalCluster:
    """``cluster`` with every process running and every partition writable again (earlier tests may
    have killed some); a failed test's report shows the servers' log tails."""
    cluster.heal(timeout=60)

    def logs() -> str:
        return "\n".join(
            f"--- server {i} ({server.endpoint}) ---\n{server.process.log_tail(40)}"
            for i, server in enumerate(cluster.servers)
        )

    add_failure_logs(request.node, "server logs", logs)
    return cluster


def client_parts(cluster: LocalCluster) -> tuple[str, str, dict[str, Any]]:
    """``cluster.client_settings()`` apart, for services that take the connect string and the root
    as arguments of their own: ``(connect string, root, the other WaltzClientConfig fields)``."""
    settings = cluster.client_settings()
    return settings.pop("zookeeper_connect_string"), settings.pop("cluster_root"), settings
