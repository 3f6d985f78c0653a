"""SmallBank straight on PostgreSQL: the ledger example's workload as a team would write it
without waltz-py (PostgreSQL at 127.0.0.1:5432, user postgres; docs/design/overview.md, "Why the
log is the source of truth"), and the same on a PostgreSQL with a Waltz partition's durability.

What it measures: committed SmallBank transactions per second and their latency (from the start
of the operation to its commit) when every operation is one PostgreSQL transaction at READ
COMMITTED (``synchronous_commit`` at the server's setting, on by default), in a database created
for the run and dropped afterwards: the plain baseline of the SmallBank target
(``benchmarks/RESULTS.md``, "The application path: targets and where they stand").

With ``--quorum`` it runs on a server of its own instead (``pg_quorum``): a primary and two
synchronous standbys on loopback ports, ``synchronous_standby_names = 'ANY 1 (s1, s2)'``, so a
commit returns once the primary and one standby have flushed it: 2 of 3 copies durable, as a
Waltz partition's write at RF 3 (docs/design/server.md, "Quorum writes and batching"). The
benchmark starts the three servers (a few seconds), waits until both standbys are in the quorum,
runs the same workload with the same counting and money check, and stops and removes them; the
row's system is "PostgreSQL, 2 synchronous standbys (ANY 1) (SmallBank)" and ``replication`` holds
the server's ``synchronous_standby_names``, ``synchronous_commit`` and ``pg_stat_replication``
at the start. Its CPU figure is the primary's backends' only (not the WAL senders' or the
standbys').

What is SmallBank's is shared with the other SmallBank peers: the workload and its options
(``smallbank_workload``), the rules (``smallbank_rules``), the schema, population and
statements (``smallbank_sql``: what an operation locks, reads and writes), the worker processes
(``smallbank_workers``) and the report (``smallbank_report``). This module adds the connections:
one per worker thread, to the run's database on the server (``pg_server``).

Load: ``--processes`` worker processes x ``--threads`` threads, each thread with its own
connection and its own seeded draws, closed loop; ``--transactions`` draws of the mix (Balance
included) split over the threads, after ``--warmup`` draws that are not measured; the measured
phase stops early at ``--time-limit`` seconds. Printed: one JSON line (``common.result``'s keys:
``transactions`` is the committed count, ``transactions_per_second``, ``latency_ms`` of the
committed transactions; and ``dropped``, ``balances_read`` and ``balances_read_per_second``
(Balance's read-only transactions are not in the committed figures), the draws and outcomes by
operation, ``money``: whether the balances add up to the opening balances plus the deposits
minus the withdrawals of the committed operations). Usage::

    .venv/bin/python -m benchmarks.peers.bench_smallbank_pg                  # 6,000 draws, 3 x 21
    .venv/bin/python -m benchmarks.peers.bench_smallbank_pg --transactions 20000 --threads 10
    .venv/bin/python -m benchmarks.peers.bench_smallbank_pg --quorum         # primary + 2 standbys
    .venv/bin/python -m benchmarks.peers.run_all --only smallbank-pg,smallbank-pg-quorum,smallbank-es
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

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
from benchmarks.peers.smallbank_bank import Backend, Bank
from benchmarks.peers.smallbank_report import money_check, report
from benchmarks.peers.smallbank_sql import SqlBank, create_and_open, totals
from benchmarks.peers.smallbank_workers import run_workers
from benchmarks.peers.smallbank_workload import Options, opening_balances, options_of, parser


class PostgresBackend:
    """A worker process's backend: a connection per thread to the run's database.

    Implements :class:`~benchmarks.peers.smallbank_bank.Backend`.

    Args:
        database: the run's database and its server.
    """

    def __init__(self, database: Database) -> None:
        self.database = database

    def bank(self) -> Bank:
        """A bank on a new connection of its own.

        Returns:
            A :class:`~benchmarks.peers.smallbank_sql.SqlBank`.

        Raises:
            psycopg.OperationalError: the server refused the connection.
        """
        return SqlBank(psycopg.connect(self.database.dsn))

    def close(self) -> None:
        """Nothing to close: each bank closes its own connection."""


def postgres_backend(database: Database, options: Options) -> Backend:
    """Make a worker process's backend (a :data:`~benchmarks.peers.smallbank_bank.BackendFactory`).

    Args:
        database: the run's database.
        options: the run's options (unused: a connection per thread needs none).

    Returns:
        A :class:`PostgresBackend`.
    """
    return PostgresBackend(database)


def run(options: Options, quorum: bool = False) -> dict[str, Any]:
    """Create a database, open the accounts, run the mix, check the money, drop the database.

    Args:
        options: the run.
        quorum: run on a primary with two synchronous standbys of its own (``pg_quorum``, started
            and stopped here) instead of the local server.

    Returns:
        The result row (``smallbank_report.report``'s keys, ``negative_savings``, and with
        ``quorum`` the ``replication`` settings and standbys).

    Raises:
        RuntimeError: a worker process failed.
        psycopg.OperationalError: PostgreSQL is not reachable on 127.0.0.1:5432.
        benchmarks.peers.pg_quorum.PgQuorumError: the quorum server could not be started.
    """
    if not quorum:
        return run_on(LOCAL, options)
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
            system="PostgreSQL, 2 synchronous standbys (ANY 1) (SmallBank)",
            config="3 {version}: a primary + 2 synchronous standbys, ANY 1 (2 of 3 copies per commit)",
            settings_names=("synchronous_standby_names", *DURABILITY_SETTINGS),
            replication=replication,
        )


def run_on(
    server: PgServer,
    options: Options,
    *,
    system: str = "PostgreSQL (SmallBank)",
    config: str = "1 {version} (no replication)",
    settings_names: tuple[str, ...] = DURABILITY_SETTINGS,
    **extra: Any,
) -> dict[str, Any]:
    """Run SmallBank in a database created on ``server`` for the run (:func:`run`'s body).

    Args:
        server: the server.
        options: the run.
        system: the row's system name.
        config: the row's configuration; ``{version}`` stands for the server's, e.g. PostgreSQL 15.
        settings_names: the server settings reported in the row's settings, in this order.
        extra: more keys of the row.

    Returns:
        The result row.

    Raises:
        RuntimeError: a worker process failed.
        psycopg.OperationalError: the server is not reachable.
    """
    version, durability = server_settings(server, settings_names)
    opening = opening_balances(options)
    with scratch_database("waltz_peer_sb_pg", server) as dbname:
        database = Database(dbname, server)
        with psycopg.connect(database.dsn) as conn:
            create_and_open(conn, opening)
        harvest = run_workers(postgres_backend, database, options)
        with psycopg.connect(database.dsn) as conn:
            final, negative = totals(conn)
    money = money_check(sum(s + c for s, c in opening), final, harvest)
    settings = (
        f"{durability}; one transaction per operation at READ COMMITTED, rows locked with "
        f"SELECT ... FOR SHARE/FOR UPDATE customer by customer in customer order; "
        f"psycopg {psycopg.__version__}, a connection per thread"
    )
    return report(
        system,
        config.format(version=version),
        settings,
        options,
        harvest,
        money,
        negative_savings=negative,
        **extra,
    )


def main() -> None:
    """Run from the command line (the SmallBank peers' options and ``--quorum``); print the row as
    one JSON line."""
    arguments = parser(__doc__)
    arguments.add_argument(
        "--quorum",
        action="store_true",
        help="run on a primary with 2 synchronous standbys (ANY 1) started for the run",
    )
    args = arguments.parse_args()
    print(json.dumps(run(options_of(args), quorum=args.quorum)), flush=True)


if __name__ == "__main__":
    # Run as the module ``benchmarks.peers.bench_smallbank_pg`` (not ``__main__``), the name the
    # worker processes import it by.
    from benchmarks.peers import bench_smallbank_pg  # noqa: PLW0406

    bench_smallbank_pg.main()
