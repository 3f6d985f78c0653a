"""The storage node's start command: ``waltz storage start`` and ``python -m waltz.services.storage``.

Both run :func:`start`, which loads the settings (docs/configuration.md) and calls
:func:`~waltz.services.storage.app.run_storage`; ``python -m`` runs it alone
(:func:`~waltz.services.runtime.run_command`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from waltz.config import load_settings
from waltz.errors import ConfigurationError, CorruptDataError
from waltz.logs import configure_logging
from waltz.protocol.channels import BindError

__all__ = ["start"]


def start(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="YAML file with storage.* keys (see docs/configuration.md).", exists=True
        ),
    ] = None,
    directory: Annotated[Path | None, typer.Option(help="Storage directory (storage.directory).")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (storage.host).")] = None,
    port: Annotated[int | None, typer.Option(help="Storage protocol port (storage.port).")] = None,
    admin_port: Annotated[int | None, typer.Option(help="Admin protocol port (storage.admin.port).")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="HTTP port for /metrics and /health (storage.metrics.port).")
    ] = None,
    segment_size_threshold: Annotated[
        int | None,
        typer.Option(help="Bytes after which a new segment starts (storage.segment.size.threshold)."),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Serve without mutual TLS, on purpose: anyone who reaches the ports may make every "
            "request, delete partitions included (storage.insecure; refused otherwise, on loopback too).",
        ),
    ] = False,
    log_level: Annotated[
        str | None, typer.Option(help="Log level (default: WALTZ_LOG_LEVEL or INFO).")
    ] = None,
) -> None:
    """Start a storage node and serve until SIGTERM or SIGINT.

    Settings come from --config, then WALTZ_STORAGE_* environment variables, then these options.
    """
    from waltz.services.storage.app import run_storage
    from waltz.services.storage.config import StorageConfig

    configure_logging(log_level)
    try:
        settings = load_settings(
            StorageConfig,
            config,
            directory=directory,
            host=host,
            port=port,
            admin_port=admin_port,
            metrics_port=metrics_port,
            segment_size_threshold=segment_size_threshold,
            insecure=True if insecure else None,
        )
        settings.check_tls_files()  # before the directory is made
    except ConfigurationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    try:
        run_storage(settings)
    except (BindError, ConfigurationError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    except CorruptDataError as exc:  # the control file is damaged or of an unknown version
        typer.echo(
            f"error: storage.directory {settings.directory}: {exc}; the node does not start on files "
            f"it cannot read: if a newer waltz wrote it, run that one; otherwise restore that file from "
            "a backup of this node (waltz disk control and waltz disk verify show what it holds)",
            err=True,
        )
        raise typer.Exit(1) from exc
    except OSError as exc:  # the directory cannot be made or used (a file in its path, no rights)
        typer.echo(f"error: storage.directory {settings.directory}: {exc}", err=True)
        raise typer.Exit(1) from exc
