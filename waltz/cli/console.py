"""``waltz console``: serve the operators' web console of a cluster (:mod:`waltz.console`).

The console needs the ``console`` extra (Starlette, uvicorn, Jinja2, httpx); without it the
command says how to install it. It is imported only when the command runs, so that ``waltz
--help`` stays fast. Exit codes: 0 stopped on request; 1 the console could not start; 2 bad
options or configuration, ZooKeeper unreachable, or the extra missing.
"""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from waltz.cli.options import RootOption, ZookeeperOption
from waltz.config import load_settings
from waltz.errors import WaltzError
from waltz.logs import configure_logging

#: The modules of the ``console`` extra, and the package that brings each.
EXTRA_MODULES = {"starlette": "starlette", "uvicorn": "uvicorn", "jinja2": "Jinja2", "httpx": "httpx"}


def missing_extra() -> list[str]:
    """The packages of the ``console`` extra that cannot be imported here."""
    import importlib

    missing = []
    for module, package in EXTRA_MODULES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    return missing


def console(
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="YAML file with `zookeeper.*`, `cluster.*` and `console.*` keys (docs/console.md).",
            exists=True,
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(help="Address to bind (console.host; default 127.0.0.1).", show_default=False),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            min=0, max=65535, help="Port to bind (console.port; default 55380; 0: any).", show_default=False
        ),
    ] = None,
    metrics: Annotated[
        list[str] | None,
        typer.Option(
            "--metrics",
            "-m",
            metavar="<[name=]url>",
            help="A `/metrics` URL of a server, storage node or client to chart, `URL` or `NAME=URL`. "
            "Repeat it (console.metrics).",
            show_default=False,
        ),
    ] = None,
    refresh: Annotated[
        float | None,
        typer.Option(
            min=0.2,
            max=60,
            help="Seconds between two looks (console.refresh; default 2).",
            show_default=False,
        ),
    ] = None,
    operator: Annotated[
        bool,
        typer.Option(
            "--operator",
            help="Serve the operator actions (replica add and remove, partition recovery), each "
            "confirmed in the page (also console.operator in --config, WALTZ_CONSOLE_OPERATOR). "
            "Without it the console changes nothing. With --tls-ca an action needs a browser "
            "certificate of the role admin (every action); without it, "
            "the token of the URL printed at start, and the console must bind loopback.",
        ),
    ] = False,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="Serve HTTPS with this PEM certificate chain (console.ssl.certFile, "
            "WALTZ_CONSOLE_SSL_CERT_FILE).",
            show_default=False,
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="The PEM key of --tls-cert (console.ssl.keyFile, WALTZ_CONSOLE_SSL_KEY_FILE).",
            show_default=False,
        ),
    ] = None,
    tls_ca: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="With --tls-cert: require browser certificates signed by this PEM CA; the pages "
            'then need the role operator or admin (urn:waltz:role:*, docs/operations.md "Roles"; '
            "console.ssl.caFile, WALTZ_CONSOLE_SSL_CA_FILE).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            min=0.1,
            help="Seconds to wait for ZooKeeper and for each storage node (default 10).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve a web console of a cluster: its map, its metrics and, with --operator, its actions.

    The map shows the servers, every partition's owner, generation, store session and
    high-water mark, every replica's max transaction ID and lag, the storage nodes, the health of
    ZooKeeper, and the problems `waltz cluster verify` would report. It refreshes every few
    seconds. With --metrics it charts commits, lock failures, latency and backlogs from the
    processes' own Prometheus endpoints.

    The console binds 127.0.0.1 unless told otherwise, and is read-only: only --operator adds the
    actions, and each one runs after a confirmation in the page. With --operator and no --tls-ca it
    prints, on standard output, the URL to open with a random token made at start (?token=...)
    that every action needs. Every action is logged with who asked (certificate subject and roles, or the
    token holder's address).

    Example: waltz console -z 127.0.0.1:2181 -r /waltz/c1 --metrics http://127.0.0.1:55181/metrics
    """
    configure_logging(os.environ.get("WALTZ_LOG_LEVEL", "WARNING"))
    # The page shows every storage node that does not answer; a warning a look would flood the log.
    logging.getLogger("waltz.admin.storage_nodes").setLevel(logging.ERROR)
    # Who asked for each action is logged whatever the level.
    logging.getLogger("waltz.console.audit").setLevel(logging.INFO)
    missing = missing_extra()
    if missing:
        typer.secho(
            f"error: waltz console needs the console extra ({', '.join(missing)} missing here): "
            "pip install 'waltz-py[console]'",
            err=True,
            fg=typer.colors.RED,
        )
        raise typer.Exit(2)
    from waltz.console.app import connect_admin
    from waltz.console.config import ConsoleConfig
    from waltz.console.server import serve

    try:
        settings = load_settings(
            ConsoleConfig,
            config,
            zookeeper_connect_string=zookeeper,
            cluster_root=root,
            zookeeper_connect_timeout=timeout,
            cluster_storage_timeout=timeout,
            console_host=host,
            console_port=port,
            console_metrics=metrics or None,
            console_refresh=refresh,
            console_operator=operator or None,
            console_ssl_cert_file=tls_cert,
            console_ssl_key_file=tls_key,
            console_ssl_ca_file=tls_ca,
        )
        settings.metrics_targets()
        settings.check_tls_files()  # before ZooKeeper is contacted or the port bound
        admin = connect_admin(settings)
    except WaltzError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from exc
    if not settings.console_operator:
        mode = "read-only"
    elif settings.console_ssl_ca_file is not None:
        mode = "operator: actions by browser certificates of the role admin"
    else:
        mode = "operator: actions need this URL's token"

    def bound(url: str) -> None:
        # The only place the start token is shown (standard output, not the log).
        typer.echo(f"waltz console of {admin.root} at {url} ({mode}); Ctrl-C stops it")

    try:
        with admin:
            served = serve(settings, admin, bound)
    except (WaltzError, OSError) as exc:
        typer.secho(f"error: the console could not start: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(1) from exc
    if not served:
        typer.secho("error: the console could not start (see the log above)", err=True, fg=typer.colors.RED)
        raise typer.Exit(1)


# typer keeps the single line breaks of a docstring paragraph: join them so that the help wraps.
console.__doc__ = "\n\n".join(
    " ".join(p.split()) for p in inspect.cleandoc(console.__doc__ or "").split("\n\n")
)
