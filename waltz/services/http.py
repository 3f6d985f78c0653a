"""The optional HTTP endpoint of a service: Prometheus ``/metrics`` and ``/health``.

With the service's TLS files it serves HTTPS only, and with a CA it requires a client certificate
signed by it, as the service's gRPC ports do (``docs/configuration.md``): a port of a TLS cluster
never answers plain text. With a CA it also checks the certificate's role, as the gRPC ports do
(docs/design/overview.md, "Roles"): only :data:`~waltz.protocol.roles.METRICS_ROLES` (operator,
admin, and the nodes' own ``server``) read it; anyone else (an application's ``client``
certificate, a certificate without a role) gets ``403 Forbidden``.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from waltz.protocol.channels import BindError
from waltz.protocol.roles import METRICS_ROLES, Role, denial, roles_of_certificate

__all__ = ["HealthHttpServer", "server_ssl_context"]

log = logging.getLogger(__name__)


#: Seconds a peer may take for each read of a request, the TLS handshake included.
REQUEST_TIMEOUT = 10.0

#: The WSGI environ key of the peer's certificate (PEM bytes), when it presented one.
PEER_CERTIFICATE = "waltz.peer_certificate"


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT  # set on the connection before the first read (the TLS handshake)

    def get_environ(self) -> dict[str, Any]:
        environ: dict[str, Any] = super().get_environ()
        if isinstance(self.connection, ssl.SSLSocket):
            der = self.connection.getpeercert(binary_form=True)
            if der:
                environ[PEER_CERTIFICATE] = ssl.DER_cert_to_PEM_cert(der).encode("ascii")
        return environ

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class _ThreadingWsgiServer(ThreadingMixIn, WSGIServer):
    """One thread per request: a slow or stuck peer (a TLS handshake that never ends) blocks no one.

    With TLS the listening socket accepts without a handshake; the request's own thread makes it
    at its first read, within :data:`REQUEST_TIMEOUT`, so an idle connection never holds up
    ``accept`` and the requests behind it.
    """

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("http: request from %s failed", client_address, exc_info=True)


def server_ssl_context(cert_file: Path, key_file: Path, ca_file: Path | None) -> ssl.SSLContext:
    """The TLS context of an HTTPS endpoint: TLS 1.2 or newer; client certificates required with a CA.

    Raises:
        OSError, ssl.SSLError: a file is missing or not a PEM certificate/key.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if ca_file is not None:
        context.load_verify_locations(ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _refusal(environ: Mapping[str, Any], allowed: frozenset[Role]) -> str | None:
    """Why the request's peer may not read the endpoint (None: it may, or it has no certificate)."""
    pem = environ.get(PEER_CERTIFICATE)
    if pem is None:
        return None  # no mutual TLS: nothing to check, as on the gRPC ports
    try:
        roles = roles_of_certificate(pem)
    except ValueError:
        roles = frozenset()
    return denial(roles, allowed, "reading /metrics and /health")


class HealthHttpServer:
    """Serves ``/metrics`` (Prometheus text format) and ``/health`` (JSON) on a background thread.

    Args:
        host: the address to bind.
        port: the port to bind (0: any free port; see :attr:`port`).
        registry: the metrics registry to expose.
        health: returns ``(healthy, details)``; ``/health`` answers 200 or 503 with the details.
        tls: an SSL context (:func:`server_ssl_context`): HTTPS only; None: plain HTTP.
        allowed_roles: the roles that may read either path when the peer presents a certificate
            (mutual TLS); a peer without one of them gets ``403 Forbidden`` with the reason.

    Raises:
        BindError: the address cannot be bound.
    """

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: Callable[[], tuple[bool, dict[str, Any]]],
        tls: ssl.SSLContext | None = None,
        allowed_roles: Iterable[Role] = METRICS_ROLES,
    ) -> None:
        metrics_app = make_wsgi_app(registry)
        allowed = frozenset(allowed_roles)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            refused = _refusal(environ, allowed)
            if refused is not None:
                log.warning(
                    "http: refused %s from %s: %s",
                    environ.get("PATH_INFO"),
                    environ.get("REMOTE_ADDR"),
                    refused,
                )
                start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8")])
                return [refused.encode("utf-8") + b"\n"]
            if environ.get("PATH_INFO") == "/health":
                healthy, details = health()
                body = json.dumps({"healthy": healthy, **details}).encode()
                status = "200 OK" if healthy else "503 Service Unavailable"
                start_response(status, [("Content-Type", "application/json")])
                return [body]
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]

        try:
            self._server: WSGIServer = make_server(
                host, port, app, server_class=_ThreadingWsgiServer, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise BindError(
                f"cannot listen on {host}:{port} for /metrics: {exc.strerror or exc}; another process may "
                f"use the port, or {host} is not an address of this host (check the metrics port setting)"
            ) from exc
        if tls is not None:
            self._server.socket = tls.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.tls = tls is not None
        self.port: int = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        """Start serving."""
        self._thread.start()

    def close(self) -> None:
        """Stop serving. Idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
