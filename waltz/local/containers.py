"""Databases and ZooKeeper for a test suite: a given URL, local binaries, or a container.

Source: docs/design/overview.md "Packages and their imports" (``waltz.local`` is the harness that
starts real components for tests); ``docs/local-cluster.md`` (the pytest plugin).

The ``waltz.testing`` plugin asks here for what a user's test suite needs:

- :func:`database_server` gives the URL of a PostgreSQL or MariaDB server: the URL the user gave,
  else a container of the official image started through testcontainers when the ``containers``
  extra is installed and a Docker engine answers, else :class:`NoTestServiceError` saying how to
  give a URL.
- :func:`zookeeper_server` gives a ZooKeeper connect string, or None when the local cluster
  should start Debian's ZooKeeper itself (as it always did): the given connect string, else the
  local binaries, else a ``zookeeper`` container, else :class:`NoTestServiceError`.

A container is used only where nothing was given and (for ZooKeeper) nothing is installed: a URL
or local binaries always win, so a suite never pulls an image behind the user's back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from waltz.errors import ConfigurationError
from waltz.local.zookeeper import (
    DEBIAN_JAVA_DIR,
    DockerZooKeeper,
    docker_engine_available,
    find_java,
    find_zookeeper_classpath,
)

__all__ = [
    "DATABASE_IMAGES",
    "DatabaseKind",
    "NoTestServiceError",
    "containers_available",
    "database_server",
    "zookeeper_server",
]

_LOG = logging.getLogger(__name__)

DatabaseKind = Literal["postgresql", "mariadb"]

#: The image each kind of database runs when it runs in a container.
DATABASE_IMAGES: dict[DatabaseKind, str] = {"postgresql": "postgres:16", "mariadb": "mariadb:11"}

_URL_EXAMPLES: dict[DatabaseKind, str] = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
}


class NoTestServiceError(ConfigurationError):
    """A test suite asked for a database or a ZooKeeper that was not given, is not installed, and
    cannot run in a container (no ``containers`` extra, or no Docker engine). The message says
    how to give one."""


def containers_available() -> str | None:
    """Why containers cannot be used here, or None when they can.

    Returns:
        None when testcontainers is importable and a Docker engine answers
        (``docker.from_env(timeout=2).ping()``); otherwise the reason, in words.
    """
    try:
        import testcontainers.core.container  # noqa: F401
    except ImportError:
        return "testcontainers is not installed (pip install 'waltz-py[containers]')"
    if not docker_engine_available():
        return "no Docker engine answered (docker.from_env(timeout=2).ping() failed)"
    return None


@contextmanager
def database_server(
    kind: DatabaseKind, url: str | None, *, option: str, image: str | None = None
) -> Iterator[str]:
    """The SQLAlchemy URL of a ``kind`` server for the duration of the block.

    Args:
        kind: ``postgresql`` or ``mariadb``.
        url: the URL the user gave (returned as it is), or None.
        option: how the user gives a URL (``--waltz-postgres-url``), for the error message.
        image: the container image (default :data:`DATABASE_IMAGES`).

    Yields:
        The given URL, or the URL of a container started for the block (``postgresql+psycopg``
        or ``mysql+pymysql``, user ``test``, database ``test``), stopped when it ends.

    Raises:
        NoTestServiceError: no URL given and no container possible; the message says how to give
            a URL.
    """
    if url:
        yield url
        return
    reason = containers_available()
    if reason is not None:
        raise NoTestServiceError(
            f"no {kind} server for this test suite: give its URL with {option} "
            f"(e.g. {option} {_URL_EXAMPLES[kind]}), or install the containers extra and run a Docker "
            f"engine to start one in a container ({reason})"
        )
    with _database_container(kind, image or DATABASE_IMAGES[kind]) as container_url:
        yield container_url


@contextmanager
def _database_container(kind: DatabaseKind, image: str) -> Iterator[str]:
    if kind == "postgresql":
        from testcontainers.community.postgres import PostgresContainer

        with PostgresContainer(image, driver="psycopg") as postgres:
            url = postgres.get_connection_url()
            _LOG.info("PostgreSQL in a container (%s): %s", image, url)
            yield url
    else:
        from testcontainers.community.mysql import MySqlContainer

        with MySqlContainer(image, dialect="pymysql") as mariadb:
            url = mariadb.get_connection_url()
            _LOG.info("MariaDB in a container (%s): %s", image, url)
            yield url


@contextmanager
def zookeeper_server(
    connect_string: str | None, *, tick_time_ms: int = 500, java_dir: Path = DEBIAN_JAVA_DIR
) -> Iterator[str | None]:
    """A ZooKeeper for a local cluster, for the duration of the block.

    Args:
        connect_string: the connect string the user gave (returned as it is), or None.
        tick_time_ms: ``tickTime`` of a container's ZooKeeper.
        java_dir: where Debian's ZooKeeper jars are looked for.

    Yields:
        The given connect string; None when Debian's ZooKeeper and Java are installed (the local
        cluster starts it, as without this function); or the connect string of a ``zookeeper``
        container, stopped when the block ends.

    Raises:
        NoTestServiceError: none of the three is possible; the message says what to install or give.
    """
    if connect_string:
        yield connect_string
        return
    try:
        find_zookeeper_classpath(java_dir)
        find_java()
    except ConfigurationError as missing:
        reason = containers_available()
        if reason is not None:
            raise NoTestServiceError(
                f"no ZooKeeper for this test suite: {missing}; or give a running one with "
                f"--waltz-zookeeper HOST:PORT; or install the containers extra and run a Docker engine "
                f"({reason})"
            ) from missing
        _LOG.info("Debian's ZooKeeper is missing (%s); running ZooKeeper in a container", missing)
        with DockerZooKeeper(tick_time_ms=tick_time_ms) as container:
            yield container.connect_string
        return
    yield None
