"""The server's start command: ``waltz server start`` and ``python -m waltz.services.server``.

Both run :func:`start`, which loads the settings (docs/configuration.md) and calls
:func:`~waltz.services.server.app.run_server`; ``python -m`` runs it alone
(:func:`~waltz.services.runtime.run_command`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from waltz.config import load_settings
from waltz.errors import ConfigurationError, WaltzError
from waltz.logs import configure_logging
from waltz.protocol.channels import BindError

__all__ = ["start"]


def start(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="YAML file with `zookeeper.*`, `cluster.*`, `server.*` and `storage.*` keys.",
            exists=True,
        ),
    ] = None,
    zookeeper: Annotated[
        str | None, typer.Option(help="ZooKeeper connect string (zookeeper.connectString).")
    ] = None,
    root: Annotated[str | None, typer.Option(help="Cluster root znode (cluster.root).")] = None,
    name: Annotated[
        str | None,
        typer.Option(help="A name that stays across restarts, shown by waltz server list (server.name)."),
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind and advertise (server.host).")] = None,
    port: Annotated[int | None, typer.Option(help="Server port, 0 for any free port (server.port).")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="HTTP port for /metrics and /health (server.metrics.port).")
    ] = None,
    advertised_endpoint: Annotated[
        str | None,
        typer.Option(help="host:port clients are told to use, e.g. a proxy's (server.advertisedEndpoint)."),
    ] = None,
    session_timeout: Annotated[
        float | None, typer.Option(help="ZooKeeper session timeout in seconds (zookeeper.sessionTimeout).")
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Serve without mutual TLS, on purpose: anyone who reaches the ports may make every "
            "request, delete partitions included (server.insecure; refused otherwise, on loopback too).",
        ),
    ] = False,
    log_level: Annotated[
        str | None, typer.Option(help="Log level (default: WALTZ_LOG_LEVEL or INFO).")
    ] = None,
) -> None:
    """Start a server and serve until SIGTERM or SIGINT.

    Settings come from --config, then WALTZ_* environment variables (WALTZ_ZOOKEEPER_CONNECT_STRING,
    WALTZ_CLUSTER_ROOT, WALTZ_SERVER_PORT, ...), then these options (docs/configuration.md).
    """
    from waltz.services.server.app import run_server
    from waltz.services.server.config import ServerConfig

    configure_logging(log_level)
    try:
        settings = load_settings(
            ServerConfig,
            config,
            zookeeper_connect_string=zookeeper,
            cluster_root=root,
            server_name=name,
            server_host=host,
            server_port=port,
            server_metrics_port=metrics_port,
            server_advertised_endpoint=advertised_endpoint,
            zookeeper_session_timeout=session_timeout,
            server_insecure=True if insecure else None,
        )
        settings.check_tls_files()  # before ZooKeeper is contacted
    except ConfigurationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    try:
        run_server(settings)
    except (WaltzError, BindError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
