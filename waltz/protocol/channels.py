"""gRPC transport set-up shared by every waltz-py client and server: options, TLS, channels, ports."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from waltz.errors import ConfigurationError

__all__ = [
    "CLIENT_TLS_SETTINGS",
    "CLUSTER_TLS_SETTINGS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "BindError",
    "TlsConfig",
    "TlsFilesError",
    "bind_port",
    "channel_options",
    "missing_tls_file",
    "open_channel",
    "probe_tcp",
    "server_credentials",
    "server_options",
    "tls_settings_hint",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 32 << 20


#: The settings (and their environment variables' prefix) an operator's tool reads its TLS files
#: from, and an application's client.
CLUSTER_TLS_SETTINGS = ("cluster.ssl", "WALTZ_CLUSTER_SSL")
CLIENT_TLS_SETTINGS = ("client.ssl", "WALTZ_CLIENT_TLS")


def tls_settings_hint(tls: TlsConfig | None, settings: tuple[str, str] = CLUSTER_TLS_SETTINGS) -> str:
    """What a node that did not accept a connection may mean of the caller's TLS settings, as a
    clause to add to the failure: no TLS at all, or no certificate of its own, where a secure
    cluster's nodes take mutual TLS only ("" when the caller has both; docs/operations.md,
    "Certificates").

    Args:
        tls: the caller's TLS files, or None for plaintext.
        settings: the settings' name and their environment variables' prefix.
    """
    name, env = settings
    if tls is None:
        return (
            "if the node requires TLS (a secure cluster, as `waltz up` starts by default), this "
            f"connection had none: set {name}.caFile, certFile and keyFile ({env}_CA_FILE, "
            f"{env}_CERT_FILE, {env}_KEY_FILE)"
        )
    if tls.cert_file is None:
        return (
            "a secure cluster's nodes accept mutual TLS only, and this connection presented no "
            f"certificate: set {name}.certFile and keyFile ({env}_CERT_FILE, {env}_KEY_FILE)"
        )
    return ""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Client TLS files (PEM). ``ca_file`` verifies the server; cert/key authenticate the client."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """Return gRPC channel credentials."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_file.read_bytes() if self.ca_file else None,
            private_key=self.key_file.read_bytes() if self.key_file else None,
            certificate_chain=self.cert_file.read_bytes() if self.cert_file else None,
        )

    def check_files(self, settings: tuple[str, str] = CLUSTER_TLS_SETTINGS) -> None:
        """Check that the files can be used, before any peer is tried: each one there, the key
        the certificate's, the CA file a PEM bundle (docs/operations.md, "Certificates"). gRPC
        would otherwise report every node unreachable, or retry a failing handshake until a
        timeout. The checks of :func:`check_server_tls_files`, each message naming the setting's
        environment variable too.

        Args:
            settings: the settings' name and their environment variables' prefix, for the message
                (:data:`CLUSTER_TLS_SETTINGS`, :data:`CLIENT_TLS_SETTINGS`).

        Raises:
            TlsFilesError: which setting (and variable), which file, and what is wrong with it.
        """
        name, env = settings
        _check_tls_files(
            name,
            self.cert_file,
            self.key_file,
            self.ca_file,
            variables={
                "caFile": f"{env}_CA_FILE",
                "certFile": f"{env}_CERT_FILE",
                "keyFile": f"{env}_KEY_FILE",
            },
            purpose=ssl.PROTOCOL_TLS_CLIENT,
        )

    def https_context(self) -> ssl.SSLContext:
        """A TLS context for HTTPS requests to the nodes' ``/metrics`` and ``/health``: verifying
        them with ``ca_file`` (the system's CAs without one), presenting the certificate if set.

        Raises:
            OSError, ssl.SSLError: a file is missing or not PEM.
        """
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file) if self.key_file else None)
        return context


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """gRPC channel and server options shared by waltz-py (message size limits)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # A channel of its own per connection: gRPC's shared subchannel pool remembers a refused
        # connection, so a new channel to a node that has just restarted would fail at once.
        ("grpc.use_local_subchannel_pool", 1),
    ]


def server_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """gRPC server options shared by waltz-py services: size limits, and no port sharing (a
    second process on the same port must fail to bind, not silently split the traffic)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]


def open_channel(
    address: str,
    tls: TlsConfig | None = None,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    extra_options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """Open an asyncio channel to ``host:port``, with TLS when ``tls`` is given."""
    options = [*channel_options(max_message_bytes), *extra_options]
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.credentials(), options=options)


class TlsFilesError(ConfigurationError):
    """A TLS file of a node cannot be used: missing, unreadable, not PEM, or a key that is not the
    certificate's."""


def missing_tls_file(settings: str, files: dict[str, Path | None]) -> str | None:
    """The first of ``files`` (setting name -> path, None: not set) that is not a file, as
    ``<settings>.<name> <path>: no such file``; None when every one given is there."""
    for name, path in files.items():
        if path is not None and not path.is_file():
            return f"{settings}.{name} {path}: no such file"
    return None


def check_server_tls_files(
    cert_file: Path | None, key_file: Path | None, ca_file: Path | None, settings: str
) -> None:
    """Check that a node's TLS files can be used, before gRPC is given them (gRPC says only that
    the port cannot be bound, or raises on a missing file).

    Args:
        cert_file: the certificate chain (PEM), or None.
        key_file: its private key (PEM), or None.
        ca_file: the CA bundle of the peers' certificates (PEM), or None.
        settings: the settings' prefix, for the message (``storage.ssl``, ``server.ssl``).

    With a certificate and its key, all three are checked; without both (a node that serves
    plaintext, which its own configuration refuses or accepts), only that a CA file given is there.

    Raises:
        TlsFilesError: which file, which setting, and what is wrong with it.
    """
    if cert_file is None or key_file is None:
        missing = missing_tls_file(settings, {"caFile": ca_file})
        if missing is not None:
            raise TlsFilesError(missing)
        return
    _check_tls_files(settings, cert_file, key_file, ca_file, variables=None, purpose=ssl.PROTOCOL_TLS_SERVER)


def _check_tls_files(
    settings: str,
    cert_file: Path | None,
    key_file: Path | None,
    ca_file: Path | None,
    *,
    variables: dict[str, str] | None,
    purpose: int,
) -> None:
    """The checks of :func:`check_server_tls_files` and :meth:`TlsConfig.check_files`: each file
    there, the certificate (when set) with its key, the CA file (when set) a PEM bundle.

    Args:
        settings: the settings' prefix (``storage.ssl``, ``cluster.ssl``).
        variables: each setting's environment variable (``certFile`` -> ``WALTZ_..._CERT_FILE``),
            named in the messages; None: the settings alone.
        purpose: the side the files serve (a server's or a client's context).

    Raises:
        TlsFilesError: which setting, which file, and what is wrong with it.
    """

    def setting(key: str) -> str:
        return f"{settings}.{key}" + ("" if variables is None else f" ({variables[key]})")

    for key, path in {"certFile": cert_file, "keyFile": key_file, "caFile": ca_file}.items():
        if path is not None and not path.is_file():
            raise TlsFilesError(f"{setting(key)} {path}: no such file")
    context = ssl.SSLContext(purpose)
    if cert_file is not None:
        try:
            context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
        except ssl.SSLError as exc:
            named = "" if variables is None else f" ({variables['certFile']}, {variables['keyFile']})"
            raise TlsFilesError(
                f"{settings}.certFile {cert_file} and {settings}.keyFile {key_file} cannot be used together "
                f"({exc.reason or exc}): the key must be the certificate's, both PEM{named}"
            ) from exc
        except OSError as exc:
            raise TlsFilesError(f"{settings}.certFile or keyFile cannot be read: {exc}") from exc
    if ca_file is not None:
        try:
            context.load_verify_locations(str(ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise TlsFilesError(f"{setting('caFile')} {ca_file} is not a PEM CA bundle ({exc})") from exc


def server_credentials(
    cert_file: Path | None, key_file: Path | None, ca_file: Path | None, settings: str = "ssl"
) -> grpc.ServerCredentials | None:
    """Server TLS credentials from PEM files, or None without a certificate (plaintext).

    With a CA bundle, clients must present a certificate signed by it (mutual TLS).

    Raises:
        TlsFilesError: a file cannot be used (:func:`check_server_tls_files`; ``settings`` names
            the settings in the message).
    """
    if cert_file is None or key_file is None:
        return None
    check_server_tls_files(cert_file, key_file, ca_file, settings)
    ca = ca_file.read_bytes() if ca_file else None
    return grpc.ssl_server_credentials(
        [(key_file.read_bytes(), cert_file.read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


class BindError(OSError):
    """A node cannot listen on its address: the port is taken, or the host is not this machine's."""


def bind_port(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Bind ``host:port`` (port 0: any free port) on a server and return the bound port.

    Raises:
        BindError: the address cannot be bound (the message says what to check).
    """
    try:
        bound = (
            server.add_secure_port(address, credentials)
            if credentials is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError:  # grpcio: "Failed to bind to address ..."
        bound = 0
    if bound == 0:
        host = address.rsplit(":", 1)[0]
        raise BindError(
            f"cannot listen on {address}: another process may use the port, or {host} is not an "
            "address of this host (check the host and port settings)"
        )
    return bound


async def probe_tcp(address: str, timeout: float = 10.0) -> str | None:
    """Check that something accepts TCP connections on ``host:port``, without sending anything.

    Used before a cluster is created, and by a server before it joins one: it has no side effect
    on the node (an admin open would initialise it).

    Returns:
        None when a connection was accepted, otherwise why not (e.g. ``"connection refused"``).
    """
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout)
    except TimeoutError:
        return f"no answer within {timeout:g}s"
    except OSError as exc:
        return exc.strerror or str(exc)
    writer.close()
    try:
        await writer.wait_closed()
    except OSError as exc:
        log.debug("closing the probe connection to %s: %s", address, exc)
    return None
