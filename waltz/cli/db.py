"""``waltz db``: create and upgrade the SQL framework's tables; inspect marks; skip a stuck transaction.

The logic lives in :mod:`waltz.jdbc_style.migrations_api`; this module parses options and prints
results. ``docs/sql.md`` ("Migrations and operator commands") documents the tables and the skip
procedure.

Every command needs the application database's SQLAlchemy URL: ``--url`` or ``WALTZ_DB_URL``.

Exit codes: 0 success; 1 refused or not as expected (``skip`` refused the request, ``current``
found the tables missing or not at head); 2 the command could not run (bad usage, unparsable URL,
missing driver, database unreachable or refusing the statement, framework tables missing).
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated

import typer
from alembic.util.exc import CommandError
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from waltz.cli.database_urls import first_line, url_hint
from waltz.cli.groups import HELP, MARKUP
from waltz.cli.options import ClusterFilterOption, DatabaseUrlOption, JsonOption
from waltz.cli.output import echo_json, fail
from waltz.errors import SqlFrameworkError
from waltz.jdbc_style import migrations_api as api
from waltz.jdbc_style import skips as skip_records
from waltz.jdbc_style.binding import url_text
from waltz.jdbc_style.engine import DatabaseUrlError, parse_database_url
from waltz.logs import configure_logging

app = typer.Typer(
    help=HELP["db"],
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)


@app.callback()
def _logging() -> None:
    """Log warnings and errors only (WALTZ_LOG_LEVEL overrides): the commands print their results."""
    configure_logging(os.environ.get("WALTZ_LOG_LEVEL", "ERROR"))


#: What a database URL looks like, for the messages about one that cannot be used.
_URL_FORM = " (expected dialect+driver://user:password@host:port/database)"


@contextmanager
def _database_errors(url: str) -> Iterator[None]:
    """Turn refusals and database errors into one-line messages and exit codes (no traceback).

    The URL is parsed first (``parse_database_url``): one whose port is not a number exits 2
    without running the command, and without the port's text (the password when the host is
    left out).
    """
    safe = url_text(url, hide_password=True)
    try:
        parse_database_url(url)
    except DatabaseUrlError as exc:  # bad syntax is left to the ArgumentError handler below
        if exc.bad_port:
            raise fail(
                f"cannot use the database URL {safe}: {exc.problem}" + (url_hint(url) or _URL_FORM), 2
            ) from None
    try:
        yield
    except skip_records.SkipRefusedError as exc:
        raise fail(f"refused: {exc}", 1) from exc
    except SqlFrameworkError as exc:
        raise fail(str(exc), 2) from exc
    except ArgumentError as exc:
        raise fail(
            f"cannot use the database URL {safe}: {first_line(exc)}" + (url_hint(url) or _URL_FORM),
            2,
        ) from exc
    except DBAPIError as exc:
        cause = exc.orig if exc.orig is not None else exc
        raise fail(f"cannot use the database at {safe}: {first_line(cause)}", 2) from exc
    except SQLAlchemyError as exc:
        raise fail(f"database {safe}: {first_line(exc)}", 2) from exc
    except CommandError as exc:
        raise fail(f"alembic: {exc}", 2) from exc
    except ModuleNotFoundError as exc:
        raise fail(
            f"the database driver for {safe} is not installed ({exc.name}): install it, or "
            "waltz-py[sql] for psycopg and PyMySQL",
            2,
        ) from exc


def _iso(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def _default_operator() -> str:
    """``$USER``, else the login name; empty when neither is known."""
    user = os.environ.get("USER")
    if user:
        return user
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment nor in the password database
        return ""


def _revision_text(revision: str | None, head: str) -> str:
    if revision is None:
        return f"none: the framework tables are missing (this waltz-py's head is {head})"
    if revision == head:
        return f"{revision} (head)"
    return f"{revision} (not head: this waltz-py's head is {head})"


# ---- migrations ----------------------------------------------------------------------------------


@app.command("upgrade")
def upgrade(
    url: DatabaseUrlOption,
    revision: Annotated[
        str, typer.Option("--revision", help="Target revision: `heads`, `waltz@head` or a revision ID.")
    ] = "heads",
    sql: Annotated[
        bool,
        typer.Option(
            "--sql",
            help="Print the DDL instead of running it (offline: nothing connects to the database, "
            "the URL only names the dialect, e.g. `postgresql://` or `mariadb://`; `mysql://` "
            "needs --mysql-8).",
        ),
    ] = False,
    mysql_8: Annotated[
        bool,
        typer.Option(
            "--mysql-8",
            help="With --sql and a `mysql://` URL: the database is MySQL 8.0.17 or newer, whose "
            "collation utf8mb4_0900_bin MariaDB refuses (for MariaDB give `mariadb://`).",
        ),
    ] = False,
) -> None:
    """Create or upgrade the framework's tables in the database (idempotent).

    The revision is recorded in the table `waltz_alembic_version`; an application's own
    `alembic_version` is left alone. Run it before starting the application after installing or
    upgrading waltz-py: an application refuses to start when the tables are not at head.
    """
    if mysql_8 and not sql:
        raise fail(
            "--mysql-8 goes with --sql: without it the upgrade connects and asks the server which "
            "it is; leave --mysql-8 out",
            2,
        )
    with _database_errors(url):
        if sql:
            typer.echo(api.upgrade_sql(url, revision, mysql_8=mysql_8), nl=False)
            return
        api.upgrade(url, revision)
        reached = api.current(url)
    shown = url_text(url, hide_password=True)
    typer.echo(f"waltz framework tables on {shown}: {_revision_text(reached, api.head())}")


@app.command("downgrade")
def downgrade(
    url: DatabaseUrlOption,
    revision: Annotated[
        str,
        typer.Option(
            "--revision",
            help="Target revision: a revision ID, `-1`, or `base` (drops the tables).",
            show_default=False,
        ),
    ],
) -> None:
    """Downgrade the framework's tables to a revision.

    `--revision base` DROPS the tables: the high-water marks are lost, and an application started
    on this database would apply the whole log again on top of its data. Only for a database that
    is being discarded, or to undo an upgrade together with the waltz-py version that needed it.
    """
    with _database_errors(url):
        api.downgrade(url, revision)
        reached = api.current(url)
    shown = url_text(url, hide_password=True)
    typer.echo(f"waltz framework tables on {shown}: {_revision_text(reached, api.head())}")


@app.command("current")
def current(
    url: DatabaseUrlOption,
    version_table: Annotated[
        str,
        typer.Option(
            "--version-table",
            help="Where the revision is recorded: `alembic_version` when the application adopted the "
            "framework's revisions as a branch of its own history.",
        ),
    ] = api.VERSION_TABLE,
) -> None:
    """Print the database's framework revision and whether it is this waltz-py's head.

    Exit code 1 when it is not at head: tables missing or older (run `waltz db upgrade`), or
    migrated by a newer waltz-py (use that one).
    """
    with _database_errors(url):
        revision = api.current(url, version_table=version_table)
        known = api.revisions()
    head = api.head()
    if revision is not None and revision not in known:
        shown = url_text(url, hide_password=True)
        raise fail(str(api.FrameworkRevisionNewerError(shown, revision, head)), 1)
    typer.echo(_revision_text(revision, head))
    if revision != head:
        raise typer.Exit(1)


# ---- operator commands ---------------------------------------------------------------------------


@app.command("marks")
def marks(
    url: DatabaseUrlOption, cluster: ClusterFilterOption = None, json_output: JsonOption = False
) -> None:
    """Show the high-water marks: per cluster and partition, the highest transaction ID applied to
    this database (-1: none yet) and when it last moved (UTC)."""
    with _database_errors(url):
        rows = skip_records.list_marks(url, cluster)
    if json_output:
        echo_json(
            [
                {
                    "cluster": row.cluster_name,
                    "partition": row.partition_id,
                    "high_water_mark": row.high_water_mark,
                    "updated_at": None if row.updated_at is None else row.updated_at.isoformat(),
                }
                for row in rows
            ]
        )
        return
    if not rows:
        if cluster is None:
            typer.echo("(no high-water marks: no application has used this database yet)")
        else:
            typer.echo(
                f"(no high-water marks of cluster {cluster!r}: no application has used this database "
                "for that cluster yet)"
            )
        return
    width = max(len("CLUSTER"), *(len(row.cluster_name) for row in rows))
    typer.echo(f"{'CLUSTER':<{width}}  {'PARTITION':>9}  {'HIGH-WATER MARK':>15}  UPDATED AT (UTC)")
    for row in rows:
        typer.echo(
            f"{row.cluster_name:<{width}}  {row.partition_id:>9}  {row.high_water_mark:>15}  "
            f"{_iso(row.updated_at)}"
        )


@app.command("skip")
def skip(
    url: DatabaseUrlOption,
    cluster: Annotated[
        str,
        typer.Option(
            "--cluster",
            help="The cluster_name the application gave its callbacks (its name for the log it follows).",
            show_default=False,
        ),
    ],
    partition: Annotated[int, typer.Option("--partition", min=0, help="The partition.", show_default=False)],
    transaction: Annotated[
        int,
        typer.Option(
            "--transaction",
            min=0,
            help="The stuck transaction: the partition's high-water mark + 1 (see `waltz db marks`).",
            show_default=False,
        ),
    ],
    reason: Annotated[
        str, typer.Option("--reason", help="Why, for the audit trail (required).", show_default=False)
    ],
    operator: Annotated[
        str | None,
        typer.Option(
            "--operator", help="Who asks, for the audit trail (default: $USER).", show_default=False
        ),
    ] = None,
) -> None:
    """Ask every application instance using this database to pass over a transaction whose apply
    keeps failing.

    Only the next transaction to apply (high-water mark + 1) can be skipped. The request is
    recorded with the operator, reason and time; an instance whose apply of that transaction
    failed moves the high-water mark past it at its next attempt, without applying it, and records
    when (`waltz db skips`). The transaction stays in the log: other databases following the log are
    not affected. Refused (exit 1, nothing recorded) when the transaction is already applied, is
    not the next one, or was already requested. A partition split's genesis is never skipped: this
    command sees only the database, so the instance that would act on the request refuses it, logs
    why and applies the genesis as usual (docs/design/splits.md "The SQL framework across a split").
    Nor is a transaction whose apply waits for the instance's upgrade (a newer schema version or
    form, an undeclared entity): a newer release's change in a rolling deploy, which instances on
    the new code apply; the instance refuses the request and it stays pending
    (docs/design/sql.md "Skipping a transaction").
    """
    who = operator if operator is not None else _default_operator()
    with _database_errors(url):
        skip_records.request_skip(
            url,
            cluster_name=cluster,
            partition_id=partition,
            transaction_id=transaction,
            reason=reason,
            operator=who,
        )
    typer.echo(
        f"recorded: {who} asks to skip transaction {transaction} of cluster {cluster!r} partition "
        f"{partition}. An instance whose apply of it failed passes over it at its next attempt; "
        "`waltz db skips` shows when it did. It stays pending if the transaction applies meanwhile, "
        "and when it is a split genesis or waits for the instance's upgrade (a newer schema version "
        "or form, an undeclared entity: a newer release's change, which instances on the new code "
        "apply): the instance logs that it refuses it."
    )


@app.command("skips")
def skips(
    url: DatabaseUrlOption, cluster: ClusterFilterOption = None, json_output: JsonOption = False
) -> None:
    """Show the operators' skip requests: pending (not yet acted on) or done, with who asked, why,
    and when (UTC).

    A request stays pending while no instance fails on its transaction (it applied, or no attempt
    came yet), and for good when an instance refuses it, which its log says: a split genesis, or
    a transaction that waits for the instance's upgrade
    (docs/design/sql.md "Skipping a transaction")."""
    with _database_errors(url):
        rows = skip_records.list_skips(url, cluster)
    if json_output:
        echo_json(
            [
                {
                    "cluster": row.cluster_name,
                    "partition": row.partition_id,
                    "transaction": row.transaction_id,
                    "reason": row.reason,
                    "operator": row.operator,
                    "requested_at": row.requested_at.isoformat(),
                    "skipped_at": None if row.skipped_at is None else row.skipped_at.isoformat(),
                }
                for row in rows
            ]
        )
        return
    if not rows:
        typer.echo("(no skip requests)")
        return
    for row in rows:
        status = "pending" if row.skipped_at is None else f"skipped at {_iso(row.skipped_at)}"
        typer.echo(
            f"cluster {row.cluster_name!r} partition {row.partition_id} transaction {row.transaction_id}: "
            f"{status}; requested by {row.operator} at {_iso(row.requested_at)}: {row.reason}"
        )
