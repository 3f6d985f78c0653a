"""Serve the console with uvicorn: plain HTTP on loopback by default, HTTPS with a certificate.

Design: docs/design/console.md "Serving". As the services' HTTP ports do
(``docs/configuration.md``): with a certificate and key the console serves HTTPS only (TLS 1.2 or
newer), and with a CA it also requires a browser certificate signed by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from waltz.admin.cluster_admin import ClusterAdmin
from waltz.console.access import ConsoleAccess
from waltz.console.app import create_app
from waltz.console.config import ConsoleConfig

__all__ = ["PeerCertificateProtocol", "bind", "serve", "uvicorn_config"]

log = logging.getLogger(__name__)


class PeerCertificateProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, adding the ASGI TLS extension to every request of a TLS
    connection: ``scope["extensions"]["tls"]`` with ``client_cert_chain`` (the browser
    certificate, PEM; empty without one) and ``tls_version``, which uvicorn leaves out
    (docs/design/console.md "Access")."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if not isinstance(ssl_object, ssl.SSLObject):
            return
        der = ssl_object.getpeercert(binary_form=True)
        tls = {
            "server_cert": None,
            "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
            "client_cert_name": None,
            "client_cert_error": None,
            "tls_version": None,
            "cipher_suite": None,
        }
        app = self.app

        async def with_tls(scope: Any, receive: Any, send: Any) -> None:
            if scope.get("type") in ("http", "websocket"):
                scope["extensions"] = {**scope.get("extensions", {}), "tls": tls}
            await app(scope, receive, send)

        self.app = with_tls


def uvicorn_config(
    config: ConsoleConfig, admin: ClusterAdmin | None = None, access: ConsoleAccess | None = None
) -> uvicorn.Config:
    """The uvicorn configuration of the console (loaded: its TLS context is built).

    Args:
        config: the console's settings.
        admin: the connected cluster admin to use (owned by the caller), or None.
        access: the access rule (see :func:`~waltz.console.app.create_app`).

    Raises:
        ConfigurationError: see :func:`~waltz.console.app.create_app`.
        OSError, ssl.SSLError: a TLS file is missing or not PEM.
    """
    https = config.https
    server = uvicorn.Config(
        create_app(config, admin, access),
        host=config.console_host,
        port=config.console_port,
        loop="asyncio",  # grpc.aio runs on asyncio's own loop
        http=PeerCertificateProtocol,
        lifespan="on",
        log_level="warning",
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=5,
        ssl_certfile=str(config.console_ssl_cert_file) if https else None,
        ssl_keyfile=str(config.console_ssl_key_file) if https else None,
        ssl_ca_certs=str(config.console_ssl_ca_file) if config.console_ssl_ca_file else None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if config.console_ssl_ca_file else ssl.CERT_NONE,
    )
    server.load()
    if server.ssl is not None:
        server.ssl.minimum_version = ssl.TLSVersion.TLSv1_2
    return server


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port), not yet listening.

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


#: The signals that stop the console (uvicorn's own).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stopped(signum: int, frame: FrameType | None) -> None:
    """The handler of a stop signal once uvicorn has stopped: uvicorn delivers the signal that stopped
    it again when it returns, and the console has then stopped on request (docs/console.md "Exit
    codes": 0), not been interrupted."""


@contextlib.contextmanager
def _stop_signals_consumed() -> Iterator[None]:
    """While uvicorn serves (and once more when it returns), SIGINT and SIGTERM stop it and are then
    consumed; the handlers before are back afterwards."""
    if threading.current_thread() is not threading.main_thread():  # no signals outside it
        yield
        return
    previous = {sig: signal.signal(sig, _stopped) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def serve(
    config: ConsoleConfig,
    admin: ClusterAdmin | None = None,
    on_bound: Callable[[str], None] | None = None,
) -> bool:
    """Serve the console until SIGINT or SIGTERM (blocking).

    Args:
        config: the console's settings.
        admin: the connected cluster admin to use (owned by the caller), or None to connect at
            start.
        on_bound: called with the URL to open once the port is bound, before the application
            starts: ``http(s)://host:port/``, with ``?token=...`` when actions need the start
            token (docs/design/console.md "Access"). The token is in no other output.

    Returns:
        True when it served and stopped on request (SIGINT or SIGTERM, consumed); False when the
        application could not start (ZooKeeper unreachable, say: uvicorn logs why).

    Raises:
        ConfigurationError: see :func:`~waltz.console.app.create_app` (raised before the port is
            bound: the cluster's TLS files are checked then).
        OSError, ssl.SSLError: the port cannot be bound, or a TLS file of HTTPS is unusable
            (before the port is bound).
    """
    access = ConsoleAccess.for_browser_ca(config.console_ssl_ca_file is not None)
    server = uvicorn.Server(uvicorn_config(config, admin, access))
    with bind(config.console_host, config.console_port) as sock:
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        url = f"{'https' if config.https else 'http'}://{shown}:{port}/"
        if on_bound is not None:
            on_bound(access.start_url(url) if config.console_operator else url)
        with _stop_signals_consumed():
            try:
                server.run(sockets=[sock])
            except SystemExit:  # uvicorn's own exit when the application failed to start
                log.debug("console: uvicorn exited", exc_info=True)
                return False
    return server.started
