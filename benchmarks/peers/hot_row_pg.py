"""One hot row straight on PostgreSQL: ``waltz perf inventory``'s reservations as a team would write
them without waltz-py, the peer of ``waltz perf inventory --local --instances 3 --skus 1``.

What it measures: reservations committed per second when every request is one PostgreSQL
transaction at READ COMMITTED on the same SKU row (``--skus 1``, the default; ``--skus N``: N hot
rows): ``BEGIN; SELECT units FROM stock WHERE sku_id = ? FOR UPDATE;`` with units enough
``INSERT`` the reservation under the request's idempotency key (unique) and ``UPDATE`` the units,
else refuse; ``COMMIT`` (:func:`~benchmarks.peers.hot_row_workers.reserve`). It is the work of a
reservation of the inventory example (``examples/waltz_examples/inventory``: no oversell, a retried
request applied once; docs/design/sql.md, "Idempotency keys"), with the row lock of PostgreSQL where
Waltz has its optimistic lock check (docs/design/sql.md, "Entity transactions").

Load (:mod:`~benchmarks.peers.hot_row_workers`, the worker processes; the figures and the row:
:mod:`~benchmarks.peers.hot_row_report`): ``--processes`` worker processes x
``--threads`` threads, a connection and one request in flight each, closed loop: 3 x 21 by
default, the 63 requests ``waltz perf inventory --instances 3`` keeps in flight (21 per instance).
``-n`` requests in all (retries not counted), ``--retry-fraction`` of them re-sent under the same
key once their answer came back, after ``--warm-up`` requests per process that are measured
nowhere (they take stock: the checks count them). The database is created for the run on the
server of ``--db`` and dropped afterwards; ``synchronous_commit`` is the server's (on by default).
The defaults' stock (1,500 units, about 2 taken per request) runs out after some 750 requests, in
this peer as in ``waltz perf inventory``: the rest are refused, so the window holds both; give both
the same larger ``--stock`` to compare committed reservations alone.

With ``--quorum`` it runs on a server of its own instead (``pg_quorum``): a primary and two
synchronous standbys, ``ANY 1 (s1, s2)``, so a commit returns once 2 of 3 copies are flushed, as a
Waltz partition's write at RF 3 (docs/design/server.md, "Quorum writes and batching"); as
``bench_smallbank_pg --quorum``.

How it counts, as ``waltz perf inventory`` does (:mod:`waltz.workloads.perf.inventory_report`):
``committed``, ``refused`` (for stock), ``already_applied`` and ``errors`` of the requests' first
submissions (``errors`` also counts failed retries), the retries' outcomes apart; the window is the
first process's start to the last one's end (wall clock), so ``committed_per_second`` is
reservations committed per second of that one window, ``requests_per_second`` every request
answered per second of it. Latency ``submit_to_commit`` (HdrHistogram, milliseconds) is per
request committed, from before ``BEGIN`` to ``COMMIT`` returning; ``submit_to_applied`` is the same
figure (a committed reservation is readable at once: PostgreSQL's commit is its apply). Not
counted: lock failures (there are none: a request waits for the row lock instead).

After the run it checks the database as ``waltz perf inventory`` checks its own: no SKU oversold
(units never below 0), each SKU's units taken = the sum of its reservations, each key applied at
most once, one reservation per request committed (warm-up included). Printed: the figures and the
checks, as ``waltz perf inventory`` prints them; ``--json FILE`` writes them as one JSON row with
``waltz perf inventory --json``'s keys where they mean the same, and ``system``: ``postgresql``.
Exit code 1 when a check failed. Usage::

    .venv/bin/python -m benchmarks.peers.hot_row_pg                       # 3,000 requests, 3 x 21
    .venv/bin/python -m benchmarks.peers.hot_row_pg -n 2000 --json hot_row.json
    .venv/bin/python -m benchmarks.peers.hot_row_pg --quorum              # primary + 2 standbys
    .venv/bin/python -m benchmarks.peers.run_all --only hot-row-pg,hot-row-pg-quorum
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from benchmarks.peers.hot_row_report import HotRowReport
from benchmarks.peers.hot_row_workers import SCHEMA, HotRowOptions, run_workers
from benchmarks.peers.pg_quorum import PgQuorum
from benchmarks.peers.pg_server import (
    DURABILITY_SETTINGS,
    LOCAL,
    Database,
    PgServer,
    scratch_database,
    server_settings,
    show,
)
from waltz.workloads.application import Check
from waltz.workloads.inventory import InventoryState, inventory_checks

#: The start of the run database's name.
DATABASE_PREFIX = "waltz_peer_hot_row"


def create_and_stock(conn: psycopg.Connection[Any], options: HotRowOptions) -> None:
    """Create the tables and give SKUs ``0 .. skus-1`` ``stock`` units each.

    Args:
        conn: a connection to the run's (empty) database.
        options: the run.

    Raises:
        psycopg.Error: the tables exist already, or the server failed.
    """
    with conn.transaction():
        for statement in SCHEMA:
            conn.execute(statement)
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO stock (sku_id, units) VALUES (%s, %s)",
                [(sku, options.stock) for sku in range(options.skus)],
            )


def state_checks(conn: psycopg.Connection[Any], options: HotRowOptions, first_commits: int) -> list[Check]:
    """``waltz perf inventory``'s checks (:func:`~waltz.workloads.inventory.inventory_checks`) of
    the run's database: a SKU's stock is its ``options.stock`` units, its reserved units are those
    taken from it (``stock - units``).

    Args:
        conn: a connection to the run's database.
        options: the run (every SKU started with ``options.stock`` units).
        first_commits: requests whose first submission committed, warm-up included.

    Returns:
        No SKU oversold (units never below 0); each SKU's units taken = the sum of its
        reservations; each idempotency key applied at most once; one reservation per request
        committed.

    Raises:
        psycopg.Error: the server failed.
    """
    units = dict(conn.execute("SELECT sku_id, units FROM stock").fetchall())
    reserved = dict(
        conn.execute("SELECT sku_id, sum(quantity)::bigint FROM reservations GROUP BY sku_id").fetchall()
    )
    repeated = dict(
        conn.execute(
            "SELECT idempotency_key, count(*) FROM reservations GROUP BY idempotency_key HAVING count(*) > 1"
        ).fetchall()
    )
    (count,) = conn.execute("SELECT count(*) FROM reservations").fetchone() or (0,)
    state = InventoryState(
        skus={int(sku): (options.stock, options.stock - int(left)) for sku, left in units.items()},
        reserved_by_sku={int(sku): int(total) for sku, total in reserved.items()},
        reservations=int(count),
        repeated_keys={str(key): int(n) for key, n in repeated.items()},
    )
    return inventory_checks(state, first_commits)


def run_in(
    database: Database,
    options: HotRowOptions,
    *,
    config: str = "",
    server_settings: str = "",
    **extra: Any,
) -> HotRowReport:
    """Run the reservations in ``database`` (empty: the tables are created here) and check it.

    Args:
        database: the run's database and its server.
        options: the run.
        config: the row's configuration (the server).
        server_settings: the row's server settings.
        extra: more keys of the row.

    Returns:
        The figures and the checks; the database keeps its rows.

    Raises:
        RuntimeError: a worker process failed.
        psycopg.Error: the server failed, or the database was not empty.
    """
    with psycopg.connect(database.dsn) as conn:
        create_and_stock(conn, options)
    harvest = run_workers(database, options, uuid.uuid4().hex[:8])
    first_commits = sum(f.stats.committed + f.warm_up.committed for f in harvest.processes)
    with psycopg.connect(database.dsn) as conn:
        checks = state_checks(conn, options, first_commits)
    server = database.server
    return HotRowReport(
        options,
        config,
        server_settings,
        f"{server.host}:{server.port}/{database.name}",
        harvest,
        checks,
        extra=extra,
    )


def run_on(
    server: PgServer,
    options: HotRowOptions,
    *,
    config: str = "1 {version} (no replication)",
    settings_names: tuple[str, ...] = DURABILITY_SETTINGS,
    **extra: Any,
) -> HotRowReport:
    """Run in a database created on ``server`` for the run, dropped afterwards.

    Args:
        server: the server.
        options: the run.
        config: the row's configuration; ``{version}`` stands for the server's, e.g. PostgreSQL 15.
        settings_names: the server settings reported in the row, in this order.
        extra: more keys of the row.

    Returns:
        The figures and the checks.

    Raises:
        RuntimeError: a worker process failed.
        psycopg.OperationalError: the server is not reachable.
    """
    version, settings = server_settings(server, settings_names)
    with scratch_database(DATABASE_PREFIX, server) as dbname:
        return run_in(
            Database(dbname, server),
            options,
            config=config.format(version=version),
            server_settings=settings,
            **extra,
        )


def run(options: HotRowOptions, server: PgServer = LOCAL, quorum: bool = False) -> HotRowReport:
    """Run on ``server``, or with ``quorum`` on a primary with two synchronous standbys of its own
    (``pg_quorum``, started and stopped here).

    Args:
        options: the run.
        server: the server (ignored with ``quorum``); the local one by default.
        quorum: run on the quorum server.

    Returns:
        The figures and the checks; with ``quorum`` the row's ``replication`` holds the server's
        ``synchronous_standby_names``, ``synchronous_commit`` and standbys at the start.

    Raises:
        RuntimeError: a worker process failed.
        psycopg.OperationalError: the server is not reachable.
        benchmarks.peers.pg_quorum.PgQuorumError: the quorum server could not be started.
    """
    if not quorum:
        return run_on(server, options)
    with PgQuorum() as servers:
        replication: dict[str, Any] = show(
            servers.primary, ("synchronous_standby_names", "synchronous_commit")
        ) | {
            "standbys": [
                {"application_name": name, "state": state, "sync_state": sync}
                for name, state, sync in servers.replication()
            ],
        }
        return run_on(
            servers.primary,
            options,
            config="3 {version}: a primary + 2 synchronous standbys, ANY 1 (2 of 3 copies per commit)",
            settings_names=("synchronous_standby_names", *DURABILITY_SETTINGS),
            replication=replication,
        )


def server_of(url: str) -> PgServer:
    """The server of a PostgreSQL URL, e.g. ``postgresql://postgres@127.0.0.1:5432``.

    Args:
        url: a ``postgresql`` URL (any driver); its database, if any, is ignored.

    Returns:
        Its host, port and user (defaults: 127.0.0.1, 5432, postgres).

    Raises:
        ValueError: not a PostgreSQL URL, or one with a password (give it in ``PGPASSWORD`` or
            ``~/.pgpass``, which libpq reads).
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"--db must be a PostgreSQL server's URL, got {url!r}")
    if parsed.password:
        raise ValueError("--db: give the password in PGPASSWORD or ~/.pgpass, not in the URL")
    return PgServer(parsed.host or LOCAL.host, parsed.port or LOCAL.port, parsed.username or LOCAL.user)


def parser() -> argparse.ArgumentParser:
    """The command line's options (defaults: ``waltz perf inventory --instances 3 --skus 1``'s)."""
    defaults = HotRowOptions()
    arguments = argparse.ArgumentParser(
        prog="python -m benchmarks.peers.hot_row_pg",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    arguments.add_argument(
        "--db",
        default=f"postgresql://{LOCAL.user}@{LOCAL.host}:{LOCAL.port}",
        help="the PostgreSQL server's URL; a database is created on it for the run (default %(default)s)",
    )
    arguments.add_argument(
        "-n",
        "--transactions",
        type=int,
        default=defaults.transactions,
        help="requests in all (retries not counted)",
    )
    arguments.add_argument("--processes", type=int, default=defaults.processes, help="worker processes")
    arguments.add_argument(
        "--threads",
        type=int,
        default=defaults.threads,
        help="threads (connections, requests in flight) per process",
    )
    arguments.add_argument("--skus", type=int, default=defaults.skus, help="hot rows the requests draw from")
    arguments.add_argument("--stock", type=int, default=defaults.stock, help="units of each SKU at the start")
    arguments.add_argument(
        "--max-quantity",
        type=int,
        default=defaults.max_quantity,
        help="each request reserves 1 to this many units",
    )
    arguments.add_argument(
        "--retry-fraction",
        type=float,
        default=defaults.retry_fraction,
        help="share of requests re-sent under the same idempotency key once answered",
    )
    arguments.add_argument(
        "--warm-up", type=int, default=defaults.warm_up, help="requests per process before the measured phase"
    )
    arguments.add_argument("--seed", type=int, default=defaults.seed, help="seed of the draws")
    arguments.add_argument(
        "--timeout", type=float, default=defaults.timeout, help="seconds the measured phase may take"
    )
    arguments.add_argument(
        "--quorum",
        action="store_true",
        help="run on a primary with 2 synchronous standbys (ANY 1) started for the run, not on --db",
    )
    arguments.add_argument("--json", type=Path, metavar="FILE", help="write the run as one JSON row to FILE")
    return arguments


def main() -> None:
    """Run from the command line; print the figures and the checks (exit code 1: a check failed)."""
    arguments = parser()
    args = arguments.parse_args()
    try:
        options = HotRowOptions(
            transactions=args.transactions,
            processes=args.processes,
            threads=args.threads,
            skus=args.skus,
            stock=args.stock,
            max_quantity=args.max_quantity,
            retry_fraction=args.retry_fraction,
            warm_up=args.warm_up,
            seed=args.seed,
            timeout=args.timeout,
        )
        server = server_of(args.db)
    except ValueError as exc:
        arguments.error(str(exc))
    report = run(options, server, quorum=args.quorum)
    print(report.text(), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report.summary()) + "\n")
    sys.exit(0 if report.passed else 1)


if __name__ == "__main__":
    main()
