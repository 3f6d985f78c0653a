"""The nodes' HTTP endpoint (/metrics, /health) over TLS: idle or silent peers hold up no one."""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.tls import make_certificates

from waltz.services.http import HealthHttpServer, server_ssl_context


@pytest.fixture
def https(tmp_path: Path) -> Iterator[tuple[HealthHttpServer, ssl.SSLContext]]:
    files = make_certificates(tmp_path)
    tls = server_ssl_context(files["server"], files["server-key"], files["ca"])

    def health() -> tuple[bool, dict[str, Any]]:
        return True, {"node": "test"}

    server = HealthHttpServer("127.0.0.1", 0, CollectorRegistry(), health, tls)
    server.start()
    client = ssl.create_default_context(cafile=str(files["ca"]))
    client.load_cert_chain(files["client"], files["client-key"])
    try:
        yield server, client
    finally:
        server.close()


@pytest.mark.security
def test_idle_connections_do_not_hold_up_https_requests(
    https: tuple[HealthHttpServer, ssl.SSLContext],
) -> None:
    """Peers that connect and never start the TLS handshake (or send half of one) do not block
    ``accept``: the handshake runs on the request's own thread, with a timeout."""
    server, client = https
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
    idle[1].sendall(b"\x16\x03\x01\x00")  # the start of a ClientHello, never finished
    try:
        started = time.monotonic()
        url = f"https://127.0.0.1:{server.port}/health"
        with urllib.request.urlopen(url, timeout=5, context=client) as response:
            body = json.loads(response.read())
        assert body == {"healthy": True, "node": "test"}
        assert time.monotonic() - started < 5
    finally:
        for connection in idle:
            connection.close()


@pytest.mark.security
def test_https_still_requires_a_client_certificate_of_the_ca(
    https: tuple[HealthHttpServer, ssl.SSLContext], tmp_path: Path
) -> None:
    server, _ = https
    anonymous = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        urllib.request.urlopen(f"https://127.0.0.1:{server.port}/health", timeout=5, context=anonymous)
