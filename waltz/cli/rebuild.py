"""``waltz rebuild``: rebuild an application's database from the log with Spark, or check it for drift.

The logic lives in :mod:`waltz.spark.rebuild`; this module parses options and prints progress.
Exit codes: 0 done (no drift, every record fits); 1 drift found by ``--verify-against``, or a record
that does not upcast to the current models (``--check``); 2 the rebuild could not run
(bad options, PySpark missing, the log unreadable as committed, the database unreachable).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from waltz.spark.views import AppViews

from waltz.cli.options import LogLevelOption, secret_value
from waltz.errors import ConfigurationError, WaltzError
from waltz.logs import configure_logging
from waltz.protocol.channels import TlsConfig

__all__ = ["load_app", "rebuild_command"]


def load_app(name: str) -> AppViews:
    """The ``VIEWS`` of an application module (``<name>.views`` first, then ``<name>``); a local
    package in the working directory is found too.

    Raises:
        typer.BadParameter: no such module or no ``VIEWS`` in it.
    """
    from waltz.app_modules import find_app_object
    from waltz.spark.views import AppViews

    try:
        views: AppViews = find_app_object(name, "views", "VIEWS", AppViews, "a waltz.spark.views.AppViews")
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc)) from exc
    return views


def _marks(items: list[str]) -> dict[int, int]:
    from waltz.spark.source import parse_marks

    return parse_marks(",".join(items), "--high-water-mark")


def rebuild_command(
    app: Annotated[
        str,
        typer.Option(
            help="The application module, e.g. waltz_examples.ledger (its views module defines VIEWS)."
        ),
    ],
    db: Annotated[
        str | None,
        typer.Option(
            envvar="WALTZ_REBUILD_DB",
            help="The database to rebuild (SQLAlchemy URL); optional with --verify-against. With a "
            "password, prefer the environment variable or --db-file (the command line shows in `ps`).",
            show_default=False,
        ),
    ] = None,
    db_file: Annotated[
        Path | None,
        typer.Option(
            envvar="WALTZ_REBUILD_DB_FILE",
            help="A file holding the --db URL (its first line).",
            show_default=False,
        ),
    ] = None,
    zookeeper: Annotated[str | None, typer.Option(help="ZooKeeper connect string of a live cluster.")] = None,
    cluster_root: Annotated[
        str | None, typer.Option(help="The cluster root znode of a live cluster.")
    ] = None,
    storage_dir: Annotated[
        list[Path] | None,
        typer.Option(help="Read storage directories on disk instead (repeat for each replica)."),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option(
            help="Offline: replicas per partition in the cluster (required unless --high-water-mark)."
        ),
    ] = None,
    high_water_mark: Annotated[
        list[str] | None,
        typer.Option(help="Offline: PARTITION:MARK known committed (you vouch for it); repeatable."),
    ] = None,
    verify_against: Annotated[
        str | None,
        typer.Option(
            envvar="WALTZ_REBUILD_VERIFY_AGAINST",
            help="Compare the log's views with this live database (SQLAlchemy URL) at its own marks; "
            "exit 1 on drift. With a password, prefer the environment variable or --verify-against-file.",
            show_default=False,
        ),
    ] = None,
    verify_against_file: Annotated[
        Path | None,
        typer.Option(
            envvar="WALTZ_REBUILD_VERIFY_AGAINST_FILE",
            help="A file holding the --verify-against URL (its first line).",
            show_default=False,
        ),
    ] = None,
    cluster_name: Annotated[
        str | None, typer.Option(help="The log's name in the mark rows (default: the application's).")
    ] = None,
    from_snapshot: Annotated[
        str | None,
        typer.Option(
            help="Start from this snapshot (waltz snapshot create): only the log after its marks is read "
            "and replayed on top of its tables.",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Read the whole log and prove that every record upcasts to the application's current "
            "models and fits them, naming the first that does not; write nothing. Exit 1 if one does not.",
        ),
    ] = False,
    ssl_ca_file: Annotated[
        Path | None,
        typer.Option(
            help="Live: CA file verifying the storage nodes' admin ports (TLS).",
            envvar="WALTZ_CLUSTER_SSL_CA_FILE",
        ),
    ] = None,
    ssl_cert_file: Annotated[
        Path | None,
        typer.Option(help="Live: client certificate (mutual TLS).", envvar="WALTZ_CLUSTER_SSL_CERT_FILE"),
    ] = None,
    ssl_key_file: Annotated[
        Path | None,
        typer.Option(help="Live: client private key (mutual TLS).", envvar="WALTZ_CLUSTER_SSL_KEY_FILE"),
    ] = None,
    master: Annotated[str, typer.Option(help="The Spark master URL.")] = "local[*]",
    log_level: LogLevelOption = "WARNING",
) -> None:
    """Rebuild an application's tables from the committed Waltz log with Spark (docs/spark.md).

    Reads the log from a live cluster (admin ports, never a store session) or from replica
    directories, computes the application's views, writes them into fresh tables that replace
    the old ones when complete, and sets the high-water-mark rows so that an instance started on
    the database resumes from the log. With --verify-against, compares the views at the live
    database's marks and reports missing, extra and different rows. With --check, reads the log
    and proves that every record upcasts to the current models (docs/sql.md "Changing a model")
    before anything is written.

    Exit codes: 0 done (no drift; every record fits); 1 drift, or a record that does not upcast
    (--check); 2 the rebuild could not run.
    """
    configure_logging(log_level)
    started = time.monotonic()

    def say(line: str) -> None:
        typer.echo(f"[{time.monotonic() - started:6.1f}s] {line}")

    db = secret_value(db, db_file, "--db", required=False)
    verify_against = secret_value(verify_against, verify_against_file, "--verify-against", required=False)
    if db is None and verify_against is None and not check:
        raise typer.BadParameter("give --db, --verify-against, --check, or a combination")
    try:  # here, not at the top: every `waltz` command would import SQLAlchemy
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError as exc:
        typer.echo(f"error: {exc}: install waltz-py[sql,spark] for waltz rebuild", err=True)
        raise typer.Exit(2) from exc

    try:
        from waltz.metadata.zk_security import security_files_from_environment
        from waltz.spark.drift import verify
        from waltz.spark.rebuild import LogSource, rebuild
        from waltz.spark.session import spark_session

        views = load_app(app)
        source = LogSource(
            zookeeper=zookeeper,
            cluster_root=cluster_root,
            storage_dirs=[str(d) for d in storage_dir or []],
            replicas=replicas,
            high_water_marks=_marks(high_water_mark) if high_water_mark else None,
            tls=TlsConfig(ssl_ca_file, ssl_cert_file, ssl_key_file) if ssl_ca_file or ssl_cert_file else None,
            # Spark's Python workers were started with the JVM's environment: name the files.
            zookeeper_files=security_files_from_environment() if zookeeper else {},
        )
        say(f"starting Spark ({master})")
        spark = spark_session(master, app_name=f"waltz-rebuild-{app}", quiet_start=True)
        if check:
            from waltz.spark.schema_check import check_log

            found = check_log(spark, views, source, progress=say)
            for line in found.lines:
                typer.echo(line)
            if not found.ok:
                say(
                    "CHECK FAILED: the log holds a record the current models cannot take; nothing was written"
                )
                raise typer.Exit(1)
            say("check passed: every record upcasts to the current models")
            if db is None and verify_against is None:
                return
        if verify_against is not None:
            report = verify(
                spark, views, source, verify_against, db_url=db, cluster_name=cluster_name, progress=say
            )
            for line in report.lines():
                typer.echo(line)
            if report.drift:
                say("DRIFT: the live database differs from the log")
                raise typer.Exit(1)
            say("no drift: the live database equals the log's views")
            return
        if db is None:  # checked above: --db or --verify-against
            raise typer.BadParameter("give --db")
        result = rebuild(
            spark, views, source, db, cluster_name=cluster_name, snapshot=from_snapshot, progress=say
        )
        say(f"rebuilt {sum(result.rows.values())} rows in {len(result.rows)} tables in {result.seconds:.1f}s")
    except (WaltzError, ImportError, OSError, SQLAlchemyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except Exception as exc:
        # A failed Spark job (e.g. a read that could not be proven committed, raised in a task).
        if type(exc).__module__.startswith(("pyspark", "py4j")):
            typer.echo(f"error: the Spark job failed: {exc}", err=True)
            raise typer.Exit(2) from exc
        raise
