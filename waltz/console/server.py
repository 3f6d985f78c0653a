"""Serve the console with uvicorn: plain HTTP on loopback by default, HTTPS with a certificate.

Design: docs/design/console.md "Serving". As the services' HTTP ports do
(``docs/configuration.md``): with a certificate and key the console serves HTTPS only (TLS 1.2 or
newer), and with a CA it also requires a browser certificate signed by it.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Callable

import uvicorn

from waltz.admin.cluster_admin import ClusterAdmin
from waltz.console.app import create_app
from waltz.console.config import ConsoleConfig

__all__ = ["bind", "serve", "uvicorn_config"]

log = logging.getLogger(__name__)


def uvicorn_config(config: ConsoleConfig, admin: ClusterAdmin | None = None) -> uvicorn.Config:
    """The uvicorn configuration of the console (loaded: its TLS context is built).

    Args:
        config: the console's settings.
        admin: the connected cluster admin to use (owned by the caller), or None.

    Raises:
        ConfigurationError: see :func:`~waltz.console.app.create_app`.
        OSError, ssl.SSLError: a TLS file is missing or not PEM.
    """
    https = config.https
    server = uvicorn.Config(
        create_app(config, admin),
        host=config.console_host,
        port=config.console_port,
        loop="asyncio",  # grpc.aio runs on asyncio's own loop
        http="h11",
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
        on_bound: called with the console's URL (``http(s)://host:port/``) once the port is bound,
            before the application starts.

    Returns:
        True when it served and stopped on request; False when the application could not start
        (ZooKeeper unreachable, say: uvicorn logs why).

    Raises:
        ConfigurationError: see :func:`~waltz.console.app.create_app`.
        OSError, ssl.SSLError: the port cannot be bound, or a TLS file is unusable.
    """
    server = uvicorn.Server(uvicorn_config(config, admin))
    with bind(config.console_host, config.console_port) as sock:
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        if on_bound is not None:
            on_bound(f"{'https' if config.https else 'http'}://{shown}:{port}/")
        server.run(sockets=[sock])
    return server.started
