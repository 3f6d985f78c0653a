"""The optional HTTP endpoint of a service: Prometheus ``/metrics`` and ``/health``."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

__all__ = ["HealthHttpServer"]

log = logging.getLogger(__name__)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class HealthHttpServer:
    """Serves ``/metrics`` (Prometheus text format) and ``/health`` (JSON) on a background thread.

    Args:
        host: the address to bind.
        port: the port to bind (0: any free port; see :attr:`port`).
        registry: the metrics registry to expose.
        health: returns ``(healthy, details)``; ``/health`` answers 200 or 503 with the details.
    """

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: Callable[[], tuple[bool, dict[str, Any]]],
    ) -> None:
        metrics_app = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if environ.get("PATH_INFO") == "/health":
                healthy, details = health()
                body = json.dumps({"healthy": healthy, **details}).encode()
                status = "200 OK" if healthy else "503 Service Unavailable"
                start_response(status, [("Content-Type", "application/json")])
                return [body]
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]

        self._server: WSGIServer = make_server(host, port, app, handler_class=_QuietHandler)
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
