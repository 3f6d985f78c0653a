"""``waltz rebuild``: rebuild an application's database from the log with Spark, or check it for drift.

The logic lives in :mod:`waltz.spark.rebuild`; this module parses options and prints progress.
Exit codes: 0 done (no drift, every record fits); 1 drift found by ``--verify-against``, or a record
that does not upcast to the current models (``--check``); 2 the rebuild could not run
(bad options, PySpark missing, the log unreadable as committed, the database unreachable).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from waltz.spark.rebuild import LogSource
    from waltz.spark.views import AppViews

from waltz.cli.options import AdminConfigOption, LogLevelOption, ZookeeperOption, secret_value
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


def log_source(
    *,
    config: Path | None = None,
    zookeeper: str | None = None,
    root: str | None = None,
    storage_dirs: list[Path] | None = None,
    replicas: int | None = None,
    high_water_marks: dict[int, int] | None = None,
    tls: TlsConfig | None = None,
    archive: str | None = None,
) -> LogSource:
    """Where ``waltz rebuild`` reads the log: the replica directories when given, else the live
    cluster that the options, the ``WALTZ_*`` variables and ``--config`` name, as for every
    command that reaches a cluster (docs/spark.md, the `waltz rebuild` section).

    Args:
        config: a YAML file with ``zookeeper.*`` and ``cluster.*`` keys (live only).
        zookeeper: the ZooKeeper connect string, over the file's and the environment's.
        root: the cluster root znode, over the file's and the environment's.
        storage_dirs: replica directories to read offline instead.
        replicas: offline, the replicas per partition.
        high_water_marks: offline, partition -> a mark known committed.
        tls: the storage nodes' admin ports' TLS files given as options, over the settings'.
        archive: the archive to read the ranges it holds from (offline: what retention deleted
            from the directories; live: in place of the one ZooKeeper names; ``off``: none).

    Raises:
        ConfigurationError: neither source is named, both are, a setting is invalid, or the
            ZooKeeper credential is given inline (``zookeeper.auth.digest``): Spark's Python
            workers are handed files, so it must be a file (``zookeeper.auth.digestFile``).
    """
    from waltz.admin.config import ClusterAdminConfig
    from waltz.config import load_settings
    from waltz.spark.rebuild import LogSource

    if storage_dirs:
        if zookeeper or root or config is not None:
            raise ConfigurationError(
                "read the log either from a live cluster (--zookeeper, --root, --config) or from "
                "--storage-dir, not both"
            )
        return LogSource(
            storage_dirs=[str(d) for d in storage_dirs],
            replicas=replicas,
            high_water_marks=high_water_marks,
            archive=archive,
        )
    settings = load_settings(
        ClusterAdminConfig, config, zookeeper_connect_string=zookeeper, cluster_root=root
    )
    try:
        settings.require()
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc}; or read replica directories with --storage-dir") from exc
    if settings.zookeeper_auth_digest is not None:
        raise ConfigurationError(
            "waltz rebuild hands the ZooKeeper credential to Spark's workers as a file: set "
            "zookeeper.auth.digestFile (WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE), not zookeeper.auth.digest"
        )
    source = LogSource.live(settings.model_dump())
    return dataclasses.replace(
        source, replicas=replicas, high_water_marks=high_water_marks, tls=tls or source.tls, archive=archive
    )


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
    zookeeper: ZookeeperOption = None,
    root: Annotated[
        str | None,
        typer.Option(
            "--root",
            "-r",
            "--cluster-root",
            help="Cluster root znode of a live cluster, e.g. /waltz/cluster1 (cluster.root, "
            "WALTZ_CLUSTER_ROOT).",
            show_default=False,
        ),
    ] = None,
    config: AdminConfigOption = None,
    storage_dir: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="<dir>", help="Read storage directories on disk instead (repeat for each replica)."
        ),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option(
            help="Offline: replicas per partition in the cluster (required unless --high-water-mark)."
        ),
    ] = None,
    high_water_mark: Annotated[
        list[str] | None,
        typer.Option(
            metavar="<partition:mark>",
            help="Offline: PARTITION:MARK known committed (you vouch for it); repeatable.",
        ),
    ] = None,
    archive: Annotated[
        str | None,
        typer.Option(
            metavar="<dir or url>",
            help="The archive (a directory or a URL pyarrow opens: s3://, gs://, hdfs://): the ranges it "
            "holds are read there. Offline, the only place of what retention deleted from the storage "
            "directories; live, in place of the archive ZooKeeper names; 'off': the storage nodes only.",
            show_default=False,
        ),
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

    Reads the log from a live cluster (admin ports, never a store session; named as for every
    command: --zookeeper and --root, the WALTZ_* variables, or --config) or from replica
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
    if from_snapshot is not None and verify_against is not None:
        raise typer.BadParameter(
            "--from-snapshot and --verify-against do not go together: the drift check reads the "
            "whole log up to the live database's own marks, which no snapshot starts from. Rebuild "
            "from the snapshot with --db, then check for drift with --verify-against alone",
            param_hint="--from-snapshot",
        )
    try:  # here, not at the top: every `waltz` command would import SQLAlchemy
        from sqlalchemy.exc import SQLAlchemyError

        from waltz.jdbc_style.changeset import ChangeSetFormatError, ChangeSetVersionError
        from waltz.jdbc_style.upcasting import SchemaVersionAheadError, UpcastError
        from waltz.spark.schema_check import newer_than_the_models
    except ImportError as exc:
        typer.echo(f"error: {exc}: install waltz-py[sql,spark] for waltz rebuild", err=True)
        raise typer.Exit(2) from exc

    try:
        from waltz.cli.database_urls import require_live_database, require_reachable
        from waltz.spark.drift import verify
        from waltz.spark.rebuild import rebuild
        from waltz.spark.session import require_jdbc_driver, spark_session
        from waltz.spark.snapshot import read_manifest
        from waltz.spark.views import require_writable_columns

        views = load_app(app)
        if db is not None or verify_against is not None:
            # Before the log is read: a column the rebuild cannot write failed it once read.
            require_writable_columns(views)
        if from_snapshot is not None:
            # Before Spark starts: a snapshot that is not there is named in a second.
            read_manifest(from_snapshot)
        # Named before Spark starts. Spark's Python workers were started with the JVM's
        # environment: the source names the ZooKeeper credential's and TLS files itself.
        source = log_source(
            config=config,
            zookeeper=zookeeper,
            root=root,
            storage_dirs=storage_dir,
            replicas=replicas,
            high_water_marks=_marks(high_water_mark) if high_water_mark else None,
            tls=TlsConfig(ssl_ca_file, ssl_cert_file, ssl_key_file) if ssl_ca_file or ssl_cert_file else None,
            archive=archive,
        )
        # Before Spark starts, which takes seconds: a database that cannot work fails at once, and
        # so does one whose JDBC driver is missing (Spark would fail on it after reading the log).
        for option, url in (("--db", db), ("--verify-against", verify_against)):
            if url is not None:
                require_jdbc_driver(url, option)
                require_reachable(url, option) if url is db else require_live_database(url, option)
        # Before Spark too: a wrong root, an unreachable cluster or directories that hold no log
        # fail in a second, not after Spark's start (docs/design/spark.md, "Planning before Spark
        # starts"). The drift check plans again if the live database is past this plan.
        say("planning the log: each partition's committed high-water mark")
        source = source.planned(progress=say)
        say(f"starting Spark ({master})")
        # Spark's stage bars redraw one line with carriage returns: in a terminal only, not in a
        # log file or a pipe, where each redraw would be a line of its own.
        spark = spark_session(
            master, app_name=f"waltz-rebuild-{app}", quiet_start=True, console_progress=sys.stderr.isatty()
        )
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
    except SchemaVersionAheadError as exc:  # before its base class, ChangeSetFormatError
        typer.echo(f"error: the log holds {newer_than_the_models(exc)}", err=True)
        raise typer.Exit(2) from exc
    except ChangeSetFormatError as exc:
        typer.echo(f"error: {exc}", err=True)
        if not isinstance(exc, (UpcastError, ChangeSetVersionError)):  # not another cluster's log
            typer.echo(_undecodable_hint(app), err=True)
        raise typer.Exit(2) from exc
    except (WaltzError, ImportError, OSError, SQLAlchemyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except Exception as exc:
        # A failed Spark job (e.g. a read that could not be proven committed, raised in a task).
        if type(exc).__module__.startswith(("pyspark", "py4j")):
            for line in spark_job_failure(str(exc), app):
                typer.echo(line, err=True)
            raise typer.Exit(2) from exc
        raise


def spark_job_failure(text: str, app: str) -> list[str]:
    """What ``waltz rebuild`` says of a failed Spark job, from the failure's text (a task's error
    reaches the driver as its traceback among the JVM's lines): a record of a newer schema version
    is a newer release's (run the rebuild with its code), one of a newer change-set form a newer
    waltz-py's, a failed upcaster is the application's to fix, and only a record that does not
    decode at all may be another cluster's (docs/design/sql.md
    "Schema versions and upcasting").

    Args:
        text: the failure's text (``str`` of the PySpark exception).
        app: the application module given to ``--app``.

    Returns:
        The lines to print, each a sentence.
    """
    newer = task_error_line(text, "SchemaVersionAheadError")
    if newer is not None:
        return [f"error: {_newer_release(newer)}"]
    upcast = task_error_line(text, "UpcastError")
    if upcast is not None:
        return [
            f"error: an upcaster of {app}'s models failed on a record of the log: {upcast}",
            'hint: nothing was rebuilt; fix the upcaster (docs/sql.md, "Changing a model") and rebuild '
            f"again: `waltz rebuild --app {app} --check` lists the records it fails on",
        ]
    form = task_error_line(text, "ChangeSetVersionError")
    if form is not None:
        return [
            f"error: the log holds a record a newer waltz-py wrote: {form}",
            "hint: nothing was rebuilt; run the rebuild with the waltz-py the application's instances "
            "run (every reader of a log needs a release that reads its forms)",
        ]
    # A task that raised another of waltz's errors (a damaged chunk, a read that could not be
    # proven) said what to do in its message: that line, not the worker's traceback.
    lines = [f"error: the Spark job failed: {task_waltz_error(text) or text}"]
    if "ChangeSetFormatError" in text:
        lines.append(_undecodable_hint(app))
    return lines


def task_error_line(text: str, error: str) -> str | None:
    """The message of an error named ``error`` that a Spark task raised, from the job failure's
    text (a Python traceback among the JVM's lines), or None when it holds none."""
    marker = f"{error}: "
    for line in text.splitlines():
        found = line.find(marker)
        if found >= 0:
            return line[found + len(marker) :].strip()
    return None


#: A line of a Spark task's failure text that names an error of waltz and its message.
_TASK_WALTZ_ERROR = re.compile(r"^waltz(?:\.\w+)+\.(\w+Error): (.+)$")


def task_waltz_error(text: str) -> str | None:
    """The message of the last error of waltz's own (``waltz.<module>.<Error>: <message>``) that a
    Spark task raised, from the job failure's text (a Python traceback among the JVM's lines), or
    None when it holds none."""
    found = None
    for line in text.splitlines():
        match = _TASK_WALTZ_ERROR.match(line.strip())
        if match is not None:
            found = match.group(2).strip()
    return found


def _newer_release(message: str) -> str:
    """A rebuild's words for a :class:`~waltz.jdbc_style.upcasting.SchemaVersionAheadError` a
    Spark task raised, from its message (written for a live instance, which waits for its upgrade):
    :func:`~waltz.spark.schema_check.newer_than_the_models`."""
    import re

    from waltz.jdbc_style.upcasting import SchemaVersionAheadError
    from waltz.spark.schema_check import newer_than_the_models

    found = re.match(
        r"(?:(partition \d+ transaction \d+): )?"
        r"(\S+) row change of schema version (\d+), but this instance's model of \S+ is version (\d+)",
        message,
    )
    if found is None:
        return f"the log holds a record newer than the models here: {message}"
    where, entity, version, known = found.groups()
    error = SchemaVersionAheadError(entity, int(version), int(known), where)
    return f"the log holds {newer_than_the_models(error)}"


def _undecodable_hint(app: str) -> str:
    """The hint after a transaction the application's views cannot decode."""
    return (
        f"hint: the log holds a transaction that {app}'s views cannot decode: check that --root "
        f"names the cluster {app} writes to"
    )
