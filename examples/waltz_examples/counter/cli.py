"""``python -m waltz_examples.counter``: serve the counter API, try it on a local cluster, load it.

Commands:

- ``serve``: one counter service instance and its HTTP API, on a Waltz cluster and a database
  given by the operator; runs until SIGTERM or Ctrl-C.
- ``local``: a throw-away local Waltz cluster (ZooKeeper, storage nodes, servers as processes on
  loopback) plus one instance on a SQLite file, serving the API; for trying it out.
- ``load``: a load generator against a running API (requests/s, 409s, latency percentiles, and a
  consistency check of the final values).

Exit codes: 0 success; 1 the service could not start, or the load run found an inconsistency or
got no answer; 2 bad options (a ``--db`` the service cannot use among them: refused in one line
before anything starts).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from waltz.errors import ConfigurationError, WaltzError
from waltz.logs import configure_logging

__all__ = ["app", "main"]

app = typer.Typer(
    help="The counter example of the Waltz announcement: counters that never go negative, "
    "enforced with Waltz's optimistic locking.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


class _Serving:
    """Adapts synchronous start-up and shut-down to ``run_until_signalled``'s service protocol.

    ``open_parts`` enters everything it starts into the exit stack; :meth:`stop` closes them in
    reverse order, and a failing start closes what it had started.
    """

    def __init__(self, open_parts: Callable[[contextlib.ExitStack], None]) -> None:
        self._open_parts = open_parts
        self._stack = contextlib.ExitStack()

    async def start(self) -> None:
        await asyncio.to_thread(self._start)

    async def stop(self) -> None:
        await asyncio.to_thread(self._stack.close)

    def _start(self) -> None:
        try:
            self._open_parts(self._stack)
        except BaseException:
            self._stack.close()
            raise


def _run(open_parts: Callable[[contextlib.ExitStack], None]) -> None:
    """Start the parts, serve until SIGTERM or SIGINT, stop them; exit 1 when they cannot start."""
    from waltz.services.runtime import run_until_signalled

    try:
        run_until_signalled(_Serving(open_parts))
    except (WaltzError, OSError) as exc:
        typer.secho(f"error: the counter service could not start: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(1) from exc
    except Exception as exc:  # a database error, typically: say it in one line, not a traceback
        if type(exc).__module__.startswith("sqlalchemy"):
            typer.secho(
                f"error: the database refused or could not be reached: {exc}", err=True, fg=typer.colors.RED
            )
            raise typer.Exit(1) from exc
        raise
    typer.echo("stopped")


def _require_database(db: str) -> None:
    """Exit 2 with one line (the URL's password hidden) when the database of ``--db`` cannot be
    used: a URL or driver SQLAlchemy does not take, a server that does not answer, a database that
    does not exist. Checked before a cluster or the service starts."""
    from waltz.cli.database_urls import require_reachable

    try:
        require_reachable(db, "--db")
    except ConfigurationError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from exc


def _usage(url: str) -> str:
    return "\n".join(
        [
            f"counter API on {url}; try:",
            f"  curl -s -X POST {url}/counters/7/increment -d '{{\"amount\": 10}}'",
            f"  curl -s -X POST {url}/counters/7/decrement -d '{{\"amount\": 25}}'   # 409: never negative",
            f"  curl -s {url}/counters/7",
            f"  python -m waltz_examples.counter load --url {url} --requests 2000 --concurrency 16",
            "Press Ctrl-C (or send SIGTERM) to stop.",
        ]
    )


@app.command()
def serve(
    db: Annotated[
        str,
        typer.Option(
            envvar="COUNTER_DB_URL",
            help="The database's SQLAlchemy URL, e.g. sqlite:////var/lib/counter.db or "
            "postgresql+psycopg://app@db/counter.",
        ),
    ],
    zookeeper: Annotated[
        str,
        typer.Option(
            envvar="WALTZ_ZOOKEEPER_CONNECT_STRING", help="The Waltz cluster's ZooKeeper, host:port."
        ),
    ],
    root: Annotated[
        str,
        typer.Option(envvar="WALTZ_CLUSTER_ROOT", help="The Waltz cluster root znode, e.g. /waltz/local."),
    ],
    port: Annotated[int, typer.Option(min=0, max=65535, help="The HTTP port (0: any free port).")] = 8080,
    host: Annotated[str, typer.Option(help="The address to bind.")] = "127.0.0.1",
    cluster_name: Annotated[
        str, typer.Option(help="The name under which the database records its high-water marks.")
    ] = "counter",
    request_timeout: Annotated[float, typer.Option(min=0.1, help="Seconds one change may take.")] = 30.0,
    log_level: Annotated[str, typer.Option(help="Log level.")] = "INFO",
) -> None:
    """Serve the counter HTTP API until SIGTERM or Ctrl-C.

    Creates or upgrades the framework's tables and the counters table, connects to the Waltz
    cluster, waits until every partition is mounted, then listens. Several instances may share one
    database; start the first one alone on a new database.

    Example, in a shell where the export lines `waltz up` printed were run (the cluster's address,
    its root, the client's credential and certificate): python -m waltz_examples.counter serve --db
    sqlite:///counter.db --port 8080
    """
    from waltz_examples.counter.http_api import CounterHttpServer
    from waltz_examples.counter.service import CounterService

    configure_logging(log_level)
    _require_database(db)

    def open_parts(stack: contextlib.ExitStack) -> None:
        service = stack.enter_context(
            CounterService(db, zookeeper, root, cluster_name, request_timeout=request_timeout)
        )
        api = stack.enter_context(CounterHttpServer(service, host, port))
        typer.echo(_usage(api.url))

    _run(open_parts)


@app.command()
def local(
    port: Annotated[int, typer.Option(min=0, max=65535, help="The HTTP port (0: any free port).")] = 8080,
    db: Annotated[
        str | None,
        typer.Option(help="The database's SQLAlchemy URL (default: a SQLite file in the work directory)."),
    ] = None,
    storages: Annotated[int, typer.Option(min=1, help="Storage nodes.")] = 3,
    servers: Annotated[int, typer.Option(min=1, help="Servers.")] = 2,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions.")] = 4,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Keep the cluster's data, its logs and the SQLite database here (running again with it "
            "resumes them). Default: a temporary directory, removed at stop.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="Log level of this process.")] = "WARNING",
) -> None:
    """Start a local Waltz cluster and one counter service, and serve the API until Ctrl-C.

    The cluster's processes (ZooKeeper, storage nodes, servers) run on free loopback ports; they
    are stopped, and a temporary work directory removed, when this command stops.

    Example: python -m waltz_examples.counter local --port 8080
    """
    from waltz.local.cluster import LocalCluster
    from waltz_examples.counter.http_api import CounterHttpServer
    from waltz_examples.counter.service import CounterService

    configure_logging(log_level)
    if db is not None:
        _require_database(db)

    def open_parts(stack: contextlib.ExitStack) -> None:
        directory = work_dir
        if directory is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="waltz-counter-")))
        directory.mkdir(parents=True, exist_ok=True)
        typer.echo(f"starting a local Waltz cluster ({storages} storage nodes, {servers} servers)...")
        cluster = stack.enter_context(
            LocalCluster(
                storages=storages,
                servers=servers,
                partitions=partitions,
                name="counter",
                work_dir=None if work_dir is None else work_dir / "cluster",
            )
        )
        typer.echo(cluster.describe())
        url = db or f"sqlite:///{directory / 'counter.db'}"
        settings = cluster.client_settings()
        service = stack.enter_context(
            CounterService(
                url,
                settings.pop("zookeeper_connect_string"),
                settings.pop("cluster_root"),
                client_config=settings,
            )
        )
        api = stack.enter_context(CounterHttpServer(service, "127.0.0.1", port))
        typer.echo(f"database {service.engine.url.render_as_string(hide_password=True)}")
        typer.echo(_usage(api.url))

    _run(open_parts)


@app.command()
def load(
    url: Annotated[str, typer.Option(help="The counter API's base URL.")] = "http://127.0.0.1:8080",
    requests: Annotated[int, typer.Option(min=1, help="Changes to send in all.")] = 2000,
    concurrency: Annotated[int, typer.Option(min=1, help="Threads, one connection each.")] = 16,
    counters: Annotated[int, typer.Option(min=1, help="Counters receiving the changes (hot spots).")] = 4,
    decrement_ratio: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of decrements.")] = 0.4,
    max_amount: Annotated[int, typer.Option(min=1, help="Amounts are drawn from 1..MAX_AMOUNT.")] = 10,
    first_counter: Annotated[int, typer.Option(min=0, help="The first counter's ID.")] = 1,
    seed: Annotated[int | None, typer.Option(help="Seed of the random plan.", show_default=False)] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check/--no-check",
            help="Read the counters before and after, and check the final values against the changes "
            "answered 200 (valid only while nothing else changes those counters).",
        ),
    ] = True,
) -> None:
    """Send random increments and decrements and report requests/s, 409s and latency percentiles.

    Example: python -m waltz_examples.counter load --url http://127.0.0.1:8080 --requests 2000
    --concurrency 16 --counters 4 --decrement-ratio 0.4
    """
    from waltz_examples.counter.load import run_load

    try:
        report = run_load(
            url,
            requests=requests,
            concurrency=concurrency,
            counters=counters,
            decrement_ratio=decrement_ratio,
            max_amount=max_amount,
            first_counter=first_counter,
            seed=seed,
            check=check,
        )
    except ValueError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from exc
    except (OSError, RuntimeError) as exc:
        typer.secho(f"error: cannot read the counters at {url}: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(1) from exc
    typer.echo(report.describe())
    failed = (report.check is not None and not report.check.ok) or report.transport_errors > 0
    raise typer.Exit(1 if failed else 0)


# typer keeps the single line breaks of a docstring paragraph: join them so that the help wraps.
for _command in (serve, local, load):
    _command.__doc__ = "\n\n".join(
        " ".join(p.split()) for p in inspect.cleandoc(_command.__doc__ or "").split("\n\n")
    )


def main() -> None:
    """Run the command line."""
    app(prog_name="python -m waltz_examples.counter")
