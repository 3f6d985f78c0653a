"""A ZooKeeper session for a command-line tool: connect with a time limit, fail with a clear error.

kazoo retries a lost connection forever in the background; a tool must instead stop after a
bounded wait and say what to check. :func:`connect_zookeeper` starts a client or raises
:class:`ZooKeeperUnavailableError`; :func:`zookeeper_errors` turns a connection or session lost
during a command into the same error.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from waltz.errors import ConfigurationError, WaltzError

__all__ = ["DEFAULT_ZOOKEEPER_TIMEOUT", "ZooKeeperUnavailableError", "connect_zookeeper", "zookeeper_errors"]

log = logging.getLogger(__name__)

#: Seconds to wait for a ZooKeeper connection, and the default session timeout.
DEFAULT_ZOOKEEPER_TIMEOUT = 10.0

T = TypeVar("T")
P = ParamSpec("P")


class ZooKeeperUnavailableError(WaltzError, ConnectionError):
    """ZooKeeper could not be reached, or the connection was lost during a command."""


def connect_zookeeper(
    connect_string: str,
    *,
    connect_timeout: float = DEFAULT_ZOOKEEPER_TIMEOUT,
    session_timeout: float = DEFAULT_ZOOKEEPER_TIMEOUT,
) -> KazooClient:
    """Start a kazoo client; the caller stops and closes it.

    Args:
        connect_string: ``host:port[,host:port...][/chroot]``.
        connect_timeout: seconds to wait for a connection.
        session_timeout: the ZooKeeper session timeout in seconds.

    Raises:
        ConfigurationError: the connect string is malformed.
        ZooKeeperUnavailableError: no ZooKeeper server answered within ``connect_timeout``.
    """
    try:
        client = KazooClient(hosts=connect_string, timeout=session_timeout)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"bad ZooKeeper connect string {connect_string!r}: {exc}") from exc
    try:
        client.start(timeout=connect_timeout)
    except KazooTimeoutError:
        raise ZooKeeperUnavailableError(
            f"no ZooKeeper server at {connect_string} answered within {connect_timeout:g}s: check "
            "--zookeeper (zookeeper.connectString, WALTZ_ZOOKEEPER_CONNECT_STRING) and that ZooKeeper runs"
        ) from None
    except ValueError as exc:  # kazoo parses the host list lazily, in start()
        client.close()
        raise ConfigurationError(f"bad ZooKeeper connect string {connect_string!r}: {exc}") from exc
    log.debug("connected to ZooKeeper at %s", connect_string)
    return client


def zookeeper_errors(method: Callable[P, T]) -> Callable[P, T]:
    """Decorate a method so that a lost ZooKeeper connection raises :class:`ZooKeeperUnavailableError`."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError) as exc:
            raise ZooKeeperUnavailableError(
                f"lost the connection to ZooKeeper during the command ({type(exc).__name__}); it may "
                "have stopped half-way: check ZooKeeper, then rerun the command (it is idempotent)"
            ) from exc

    return wrapper
