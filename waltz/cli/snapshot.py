"""``waltz snapshot``: write, show, verify and load an application's snapshot.

The logic lives in :mod:`waltz.spark.snapshot` (docs/design/spark.md "Snapshots"); this module
parses options and prints. Exit codes: 0 done; 1 a snapshot that does not verify (``verify``: a
damaged manifest or file); 2 bad options, a missing driver or pyarrow, an unreachable database, a
location that holds no snapshot (none there, no manifest, or one that cannot be opened), or a
snapshot that cannot be read or loaded (``show``, ``load``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Annotated

import typer

from waltz.cli.groups import HELP, MARKUP
from waltz.cli.options import (
    DatabaseUrlFileOption,
    JsonOption,
    LogLevelOption,
    OptionalDatabaseUrlOption,
    secret_value,
)
from waltz.errors import WaltzError
from waltz.logs import configure_logging

__all__ = ["app"]

app = typer.Typer(help=HELP["snapshot"], no_args_is_help=True, rich_markup_mode=MARKUP)

AppOption = Annotated[
    str,
    typer.Option(
        "--app",
        help="The application module, e.g. waltz_examples.ledger (its views module defines VIEWS; "
        "a package in the working directory is found too).",
        show_default=False,
    ),
]
LocationArgument = Annotated[
    str,
    typer.Argument(
        help="The snapshot: a directory, or a URL pyarrow opens (s3://bucket/path, gs://..., hdfs://...).",
        show_default=False,
    ),
]


def _say(started: float) -> Callable[[str], None]:
    def say(line: str) -> None:
        typer.echo(f"[{time.monotonic() - started:6.1f}s] {line}")

    return say


def _fail(exc: BaseException) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


@app.command("create")
def create(
    location: LocationArgument,
    app_module: AppOption,
    url: OptionalDatabaseUrlOption = None,
    url_file: DatabaseUrlFileOption = None,
    cluster_name: Annotated[
        str | None, typer.Option(help="The log's name in the mark rows (default: the application's).")
    ] = None,
    log_level: LogLevelOption = "WARNING",
) -> None:
    """Write the application's tables, this log's marks and idempotency keys as one snapshot.

    Everything is read in one database transaction, so every table is the state at exactly the
    marks written beside it. The location must not hold a snapshot yet. `waltz rebuild
    --from-snapshot` replays only the log after the marks on top of it; `waltz snapshot load`
    writes it into a new database that an instance resumes from.

    Refused when the database holds no marks of the log's name while the application's tables
    hold rows (the error names the logs whose marks it holds: give one with --cluster-name). A
    create that fails leaves nothing at the location.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from waltz.cli.rebuild import load_app
    from waltz.spark.snapshot import write_snapshot

    database = secret_value(url, url_file, "--url")
    assert database is not None  # required
    configure_logging(log_level)
    say = _say(time.monotonic())
    try:
        manifest = write_snapshot(
            load_app(app_module), database, location, cluster_name=cluster_name, progress=say
        )
    except (WaltzError, SQLAlchemyError, OSError) as exc:
        raise _fail(exc) from exc
    rows = sum(t.rows for t in manifest.tables)
    say(f"wrote {rows} rows of {len(manifest.tables)} tables at marks {dict(sorted(manifest.marks.items()))}")


@app.command("show")
def show(location: LocationArgument, json_output: JsonOption = False) -> None:
    """Print a snapshot's manifest: its marks, tables, row counts and schema versions."""
    from waltz.spark.snapshot import read_manifest

    try:
        manifest = read_manifest(location)
    except WaltzError as exc:
        raise _fail(exc) from exc
    if json_output:
        typer.echo(json.dumps(manifest.to_json(), indent=2, sort_keys=True))
        return
    typer.echo(f"snapshot of {manifest.cluster_name!r}, form {manifest.form}, written {manifest.written_at}")
    typer.echo(f"  marks: {', '.join(f'{p}:{m}' for p, m in sorted(manifest.marks.items())) or '(none)'}")
    for entry in manifest.tables:
        typer.echo(f"  {entry.table}: {entry.rows} rows ({entry.file})")
    typer.echo(f"  idempotency keys: {manifest.idempotency_keys.rows}")
    for name, entity in sorted(manifest.entities.items()):
        typer.echo(f"  entity {name}: schema version {entity.get('schema_version', 1)}")


@app.command("verify")
def verify(
    location: LocationArgument,
    app_module: Annotated[
        str | None,
        typer.Option(
            "--app",
            help="Also check that this application's current models read the snapshot as `waltz "
            "snapshot load` does: every table present, every row an older model wrote upcast by the "
            "models' upcasters, the other tables on the application's columns.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Check every file of a snapshot against its manifest (SHA-256 and row count); exit 1 if one differs.

    Exit 2 when the location holds no snapshot (none there, no manifest, or one that cannot be
    opened); a damaged manifest exits 1, as a damaged file does.

    With --app, also check that the application's current release loads it, as `waltz snapshot
    load` checks it (without a database: values are not held to its types or constraints),
    before a restore needs it: exit 1 naming the table, file or row the load would refuse.
    """
    from waltz.spark.snapshot import SnapshotError, SnapshotUnreadableError, check_snapshot, verify_snapshot

    views = None
    try:
        if app_module is not None:
            from waltz.cli.rebuild import load_app

            # Importing the models checks their declarations (a schema_version without upcasters).
            views = load_app(app_module)
        manifest = verify_snapshot(location)
        lines = check_snapshot(location, views, manifest) if views is not None else []
    except SnapshotUnreadableError as exc:  # no snapshot there to verify: a wrong path, most likely
        raise _fail(exc) from exc
    except SnapshotError as exc:
        typer.echo(f"FAILED: {exc}", err=True)
        raise typer.Exit(1) from exc
    except WaltzError as exc:
        raise _fail(exc) from exc
    typer.echo(f"OK: {len(manifest.tables) + 1} files match the manifest")
    if views is not None:
        typer.echo(f"OK: the models of {app_module} read it:")
        for line in lines:
            typer.echo(f"  {line}")


@app.command("load")
def load(
    location: LocationArgument,
    app_module: AppOption,
    url: OptionalDatabaseUrlOption = None,
    url_file: DatabaseUrlFileOption = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Replace the application's rows and this log's marks and keys (default: the tables must "
            "be empty and the log must have no marks there).",
        ),
    ] = False,
    log_level: LogLevelOption = "WARNING",
) -> None:
    """Write a verified snapshot into a database, with its marks: an instance resumes after them.

    The application's tables are created (its views' `prepare`) if missing; without --replace a
    database with rows in them or marks of the log is refused first, before anything is created
    or migrated. The rows of an entity
    that the snapshot holds at an older schema version are upcast by the model's upcasters; the
    other tables must have the snapshot's columns (load such a snapshot with the application
    version that wrote it, then migrate).
    """
    from sqlalchemy.exc import SQLAlchemyError

    from waltz.cli.rebuild import load_app
    from waltz.spark.snapshot import load_snapshot

    database = secret_value(url, url_file, "--url")
    assert database is not None  # required
    configure_logging(log_level)
    say = _say(time.monotonic())
    try:
        manifest = load_snapshot(location, load_app(app_module), database, replace=replace, progress=say)
    except (WaltzError, SQLAlchemyError, OSError) as exc:
        raise _fail(exc) from exc
    say(f"an instance started on the database resumes the log after {dict(sorted(manifest.marks.items()))}")
