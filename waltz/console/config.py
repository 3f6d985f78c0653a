"""Settings of the operator console (``waltz console``): the cluster tool's keys plus ``console.*``.

Design: docs/design/console.md "Serving". Keys (YAML, flat or nested), their environment
variables, and defaults, besides every key of :class:`~waltz.admin.config.ClusterAdminConfig`
(``zookeeper.*``, ``cluster.*``, whose TLS files are also used for HTTPS metrics endpoints):

- ``console.host`` (``WALTZ_CONSOLE_HOST``, ``127.0.0.1``): the address to bind.
- ``console.port`` (``WALTZ_CONSOLE_PORT``, 55380): the port to bind (0: any free port).
- ``console.metrics`` (``WALTZ_CONSOLE_METRICS``, a JSON list; none): ``/metrics`` URLs of the
  servers, storage nodes and clients to chart, each ``URL`` or ``NAME=URL``.
- ``console.refresh`` (``WALTZ_CONSOLE_REFRESH``, 2): seconds between two looks at the cluster.
- ``console.operator`` (``WALTZ_CONSOLE_OPERATOR``, false): serve the operator actions.
- ``console.ssl.certFile``, ``console.ssl.keyFile`` (unset): serve HTTPS with this certificate.
- ``console.ssl.caFile`` (unset): with the certificate, require browser certificates signed by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from waltz.admin.config import ClusterAdminConfig
from waltz.config import Port
from waltz.errors import ConfigurationError
from waltz.protocol.channels import check_server_tls_files

__all__ = ["DEFAULT_CONSOLE_PORT", "ConsoleConfig", "MetricsTarget"]

#: The console's default port (next to the ports of docs/operations.md's examples).
DEFAULT_CONSOLE_PORT = 55380


@dataclass(frozen=True, slots=True)
class MetricsTarget:
    """A process's Prometheus endpoint the console scrapes.

    Attributes:
        name: how the console names the process (``server-0``, or ``host:port`` of the URL).
        url: the ``http(s)://host:port/metrics`` URL.
    """

    name: str
    url: str

    @classmethod
    def parse(cls, text: str) -> MetricsTarget:
        """Parse ``URL`` or ``NAME=URL``.

        Raises:
            ConfigurationError: the URL is not ``http://`` or ``https://`` with a host.
        """
        name, sep, url = text.partition("=")
        if not sep or "://" in name:
            name, url = "", text
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"metrics target {text!r} must be http(s)://host:port/metrics, optionally NAME=URL"
            )
        return cls(name.strip() or parts.netloc, url.strip())


#: Names of loopback, which only this machine reaches: operator actions may be served there without
#: browser certificates, and a console bound there answers only requests addressed to them.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


class ConsoleConfig(ClusterAdminConfig):
    """Settings of ``waltz console``: where the cluster is, what to scrape, how to serve."""

    ENV_GROUPS: ClassVar[tuple[str, ...]] = ("WALTZ_CLUSTER_", "WALTZ_CONSOLE_")

    KEYS: ClassVar[dict[str, str]] = {
        **ClusterAdminConfig.KEYS,
        "console.host": "console_host",
        "console.port": "console_port",
        "console.metrics": "console_metrics",
        "console.refresh": "console_refresh",
        "console.operator": "console_operator",
        "console.ssl.certFile": "console_ssl_cert_file",
        "console.ssl.keyFile": "console_ssl_key_file",
        "console.ssl.caFile": "console_ssl_ca_file",
    }

    console_host: str = Field("127.0.0.1", description="The address the console binds.")
    console_port: Port = Field(DEFAULT_CONSOLE_PORT, ge=0, le=65535, description="The console's port.")
    console_metrics: list[str] = Field(
        default_factory=list, description="/metrics URLs to scrape, each URL or NAME=URL."
    )
    console_refresh: float = Field(2.0, ge=0.2, le=60, description="Seconds between two looks.")
    console_operator: bool = Field(False, description="Serve the operator actions.")
    console_ssl_cert_file: Path | None = Field(None, description="PEM certificate chain of HTTPS.")
    console_ssl_key_file: Path | None = Field(None, description="PEM private key of HTTPS.")
    console_ssl_ca_file: Path | None = Field(None, description="PEM CA of required browser certificates.")

    @model_validator(mode="after")
    def _check_console(self) -> ConsoleConfig:
        if (self.console_ssl_cert_file is None) != (self.console_ssl_key_file is None):
            raise ValueError("console.ssl.certFile and console.ssl.keyFile must be set together")
        if self.console_ssl_ca_file is not None and self.console_ssl_cert_file is None:
            raise ValueError("console.ssl.caFile needs console.ssl.certFile and console.ssl.keyFile")
        beyond_loopback = self.console_host not in LOOPBACK_HOSTS
        if self.console_operator and beyond_loopback and self.console_ssl_ca_file is None:
            raise ValueError(
                f"operator actions on {self.console_host}, not loopback, need browser certificates: set "
                "console.ssl.caFile (--tls-ca) with the certificate and key, or bind 127.0.0.1"
            )
        return self

    def metrics_targets(self) -> list[MetricsTarget]:
        """The parsed ``console.metrics`` targets, in order, names made unique.

        Raises:
            ConfigurationError: a target is malformed.
        """
        targets: list[MetricsTarget] = []
        seen: set[str] = set()
        for text in self.console_metrics:
            target = MetricsTarget.parse(text)
            name, n = target.name, 1
            while name in seen:
                n += 1
                name = f"{target.name}#{n}"
            seen.add(name)
            targets.append(MetricsTarget(name, target.url))
        return targets

    def check_tls_files(self) -> None:
        """Check the console's TLS files before it connects or binds (docs/console.md): its own
        HTTPS files (``console.ssl.*``) and the cluster's (``cluster.ssl.*``), each one there, the
        key the certificate's, the CA file a PEM bundle.

        Raises:
            TlsFilesError: which setting, which file, and what is wrong with it.
        """
        if self.console_ssl_cert_file is not None and self.console_ssl_key_file is not None:
            check_server_tls_files(
                self.console_ssl_cert_file, self.console_ssl_key_file, self.console_ssl_ca_file, "console.ssl"
            )
        self.tls()

    @property
    def https(self) -> bool:
        """True when the console serves HTTPS."""
        return self.console_ssl_cert_file is not None
