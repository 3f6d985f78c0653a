"""A ZooKeeper session for a command-line tool: connect with a time limit, fail with a clear error.

kazoo retries a lost connection forever in the background; a tool must instead stop after a
bounded wait and say what to check. :func:`connect_zookeeper` starts a client or raises
:class:`ZooKeeperUnavailableError`; :func:`zookeeper_errors` turns a connection or session lost
during a command into the same error, and a refused access (``NoAuth``) into
:class:`ZooKeeperAuthError`.

Every kazoo session of a cluster is made by :func:`make_kazoo_client`, which applies the
:class:`~waltz.metadata.zk_security.ZooKeeperSecurity` (digest credential, creator-only ACL on
what it creates, TLS): docs/design/zookeeper.md, "Security".
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionLoss,
    NoAuthError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from waltz.errors import ConfigurationError, WaltzError
from waltz.metadata.zk_security import DIGEST_SETTINGS_HINT, ZooKeeperSecurity

__all__ = [
    "DEFAULT_ZOOKEEPER_TIMEOUT",
    "ZooKeeperAuthError",
    "ZooKeeperUnavailableError",
    "auth_error",
    "connect_zookeeper",
    "get_within",
    "make_kazoo_client",
    "zookeeper_access",
    "zookeeper_errors",
]

log = logging.getLogger(__name__)

#: Seconds to wait for a ZooKeeper connection, and the default session timeout.
DEFAULT_ZOOKEEPER_TIMEOUT = 10.0

T = TypeVar("T")
P = ParamSpec("P")


class ZooKeeperUnavailableError(WaltzError, ConnectionError):
    """ZooKeeper could not be reached, or the connection was lost during a command."""


class ZooKeeperAuthError(WaltzError, PermissionError):
    """ZooKeeper refused an access to the cluster's znodes: a missing or wrong credential."""


def auth_error(zk: KazooClient, what: str, cause: Exception | None = None) -> ZooKeeperAuthError:
    """The error for a refused access (``NoAuth``), naming the setting to check.

    Args:
        zk: the session that was refused (whether it holds a credential changes the advice).
        what: what was refused, e.g. ``"reading /waltz/c1/cluster"``.
        cause: the kazoo exception, named in the message.
    """
    reason = f" ({type(cause).__name__})" if cause is not None else ""
    if zk.auth_data:
        advice = (
            "the session's digest credential is not one the cluster's znodes were created with, or "
            "is another role's (with a credential per role, servers take the server's, the cluster "
            f"tools the operator's, applications the client's): check {DIGEST_SETTINGS_HINT}"
        )
    else:
        advice = (
            "the cluster's znodes are protected by a digest credential and this session has none: "
            f"set {DIGEST_SETTINGS_HINT}"
        )
    return ZooKeeperAuthError(f"ZooKeeper refused {what}{reason}: {advice}")


@contextlib.contextmanager
def zookeeper_access(zk: KazooClient, what: str) -> Iterator[None]:
    """Turn a refused access (kazoo's ``NoAuthError``) in the block into :class:`ZooKeeperAuthError`."""
    try:
        yield
    except (NoAuthError, AuthFailedError) as exc:
        raise auth_error(zk, what, exc) from exc


def get_within(zk: KazooClient, path: str, timeout: float | None) -> tuple[bytes, Any]:
    """``zk.get(path)`` that waits at most ``timeout`` seconds (None: as long as kazoo does).

    Returns:
        The znode's data and its ``ZnodeStat``.

    Raises:
        ZooKeeperUnavailableError: ZooKeeper did not answer in time.
        NoNodeError: as ``zk.get``.
    """
    if timeout is None:
        return zk.get(path)  # type: ignore[no-any-return]
    try:
        return zk.get_async(path).get(timeout=timeout)  # type: ignore[no-any-return]
    except zk.handler.timeout_exception:
        raise ZooKeeperUnavailableError(
            f"ZooKeeper did not answer a read of {path} within {timeout:g}s"
        ) from None


def make_kazoo_client(
    connect_string: str,
    *,
    security: ZooKeeperSecurity | None = None,
    session_timeout: float = DEFAULT_ZOOKEEPER_TIMEOUT,
    **options: Any,
) -> KazooClient:
    """Make (not start) a kazoo client with the cluster's security applied.

    Args:
        connect_string: ``host:port[,host:port...][/chroot]``.
        security: the digest credential and TLS files; None: no authentication, plaintext.
        session_timeout: the ZooKeeper session timeout in seconds.
        options: more :class:`~kazoo.client.KazooClient` arguments (e.g. ``connection_retry``).

    Raises:
        ConfigurationError: the connect string is malformed.
    """
    kazoo_options = (security or ZooKeeperSecurity()).kazoo_options()
    try:
        return KazooClient(hosts=connect_string, timeout=session_timeout, **kazoo_options, **options)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"bad ZooKeeper connect string {connect_string!r}: {exc}") from exc


class _QuietWhileStarting(logging.LoggerAdapter):  # type: ignore[type-arg]
    """kazoo's own logger, its warnings held back (at DEBUG) until the first connection.

    While :func:`connect_zookeeper` waits, kazoo logs a warning at every refused or dropped
    attempt (eight or more lines in 20 s for a wrong port); the error raised at the end says
    what failed, with the cause of the last of them. Once connected, kazoo's warnings (a connection dropped,
    a session expired) go out as before, on the ``kazoo.client`` logger.
    """

    def __init__(self) -> None:
        super().__init__(logging.getLogger("kazoo.client"), {})
        self.starting = True
        self.last_warning = ""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if self.starting and level == logging.WARNING:
            if args:  # "Connection dropped: %s", "Cannot resolve %s: %s": the ones with a cause
                with contextlib.suppress(TypeError, ValueError):
                    self.last_warning = str(msg) % args
            level = logging.DEBUG
        super().log(level, msg, *args, **kwargs)


def connect_zookeeper(
    connect_string: str,
    *,
    connect_timeout: float = DEFAULT_ZOOKEEPER_TIMEOUT,
    session_timeout: float = DEFAULT_ZOOKEEPER_TIMEOUT,
    security: ZooKeeperSecurity | None = None,
    **options: Any,
) -> KazooClient:
    """Start a kazoo client; the caller stops and closes it.

    Args:
        connect_string: ``host:port[,host:port...][/chroot]``.
        connect_timeout: seconds to wait for a connection.
        session_timeout: the ZooKeeper session timeout in seconds.
        security: the digest credential and TLS files (:func:`make_kazoo_client`).
        options: more :class:`~kazoo.client.KazooClient` arguments (e.g. ``connection_retry``).

    Raises:
        ConfigurationError: the connect string is malformed.
        ZooKeeperUnavailableError: no ZooKeeper server answered within ``connect_timeout``.
        ZooKeeperAuthError: ZooKeeper refused the credential.
    """
    kazoo_log = options.pop("logger", None) or _QuietWhileStarting()
    client = make_kazoo_client(
        connect_string, security=security, session_timeout=session_timeout, logger=kazoo_log, **options
    )
    try:
        client.start(timeout=connect_timeout)
    except KazooTimeoutError:
        client.close()
        tls = " and zookeeper.ssl.* (TLS needs ZooKeeper's secure client port)" if client.use_ssl else ""
        last = getattr(kazoo_log, "last_warning", "")
        raise ZooKeeperUnavailableError(
            f"no ZooKeeper server at {connect_string} answered within {connect_timeout:g}s"
            + (f" (the last attempt: {last})" if last else "")
            + ": check the ZooKeeper connect string (--zookeeper, zookeeper.connectString, "
            + f"WALTZ_ZOOKEEPER_CONNECT_STRING){tls} "
            "and that ZooKeeper runs"
        ) from None
    except AuthFailedError as exc:
        client.stop()
        client.close()
        raise auth_error(client, f"the session's credential at {connect_string}", exc) from exc
    except ValueError as exc:  # kazoo parses the host list lazily, in start()
        client.close()
        raise ConfigurationError(f"bad ZooKeeper connect string {connect_string!r}: {exc}") from exc
    finally:
        if isinstance(kazoo_log, _QuietWhileStarting):
            kazoo_log.starting = False
    log.debug("connected to ZooKeeper at %s", connect_string)
    return client


def zookeeper_errors(method: Callable[P, T]) -> Callable[P, T]:
    """Decorate a method so that a lost ZooKeeper connection raises :class:`ZooKeeperUnavailableError`.

    A refused access (``NoAuth``) raises :class:`ZooKeeperAuthError`.
    """

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except (NoAuthError, AuthFailedError) as exc:
            zk = _session_of(args[0]) if args else None
            if zk is None:
                raise ZooKeeperAuthError(
                    f"ZooKeeper refused the command ({type(exc).__name__}): check {DIGEST_SETTINGS_HINT}"
                ) from exc
            raise auth_error(zk, "the command", exc) from exc
        except (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError) as exc:
            raise ZooKeeperUnavailableError(
                f"lost the connection to ZooKeeper during the command ({type(exc).__name__}); it may "
                "have stopped half-way: check ZooKeeper, then rerun the command (it is idempotent)"
            ) from exc

    return wrapper


def _session_of(owner: object) -> KazooClient | None:
    """The kazoo client of a decorated callable's first argument: that client itself, or its
    ``.zk`` or ``.cluster.zk``, if any."""
    if isinstance(owner, KazooClient):
        return owner
    for candidate in (owner, getattr(owner, "cluster", None)):
        zk = getattr(candidate, "zk", None)
        if isinstance(zk, KazooClient):
            return zk
    return None
