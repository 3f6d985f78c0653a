"""SmallBank straight on PostgreSQL: the ledger example's workload as a team would write it
without waltz-py (PostgreSQL at 127.0.0.1:5432, user postgres; docs/design/overview.md, "Why the
log is the source of truth").

What it measures: committed SmallBank transactions per second and their latency (from the start
of the operation to its commit) when every operation is one PostgreSQL transaction at READ
COMMITTED (``synchronous_commit`` at the server's setting, on by default), in a database created
for the run and dropped afterwards: the plain baseline of the SmallBank target
(``benchmarks/RESULTS.md``, "The application path: targets and where they stand").

What is SmallBank's is shared with the other SmallBank peers: the workload and its options
(``smallbank_workload``), the rules (``smallbank_rules``), the schema, population and
statements (``smallbank_sql``: what an operation locks, reads and writes), the worker processes
(``smallbank_workers``) and the report (``smallbank_report``). This module adds the connections:
one per worker thread, to the run's database on the local server (``pg_server``).

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
    .venv/bin/python -m benchmarks.peers.run_all --only smallbank-pg,smallbank-es
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from benchmarks.peers.pg_server import dsn, scratch_database, server_settings
from benchmarks.peers.smallbank_bank import Backend, Bank
from benchmarks.peers.smallbank_report import money_check, report
from benchmarks.peers.smallbank_sql import SqlBank, create_and_open, totals
from benchmarks.peers.smallbank_workers import run_workers
from benchmarks.peers.smallbank_workload import Options, opening_balances, options_of, parser


class PostgresBackend:
    """A worker process's backend: a connection per thread to the run's database.

    Implements :class:`~benchmarks.peers.smallbank_bank.Backend`.

    Args:
        dbname: the run's database on the local server.
    """

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname

    def bank(self) -> Bank:
        """A bank on a new connection of its own.

        Returns:
            A :class:`~benchmarks.peers.smallbank_sql.SqlBank`.

        Raises:
            psycopg.OperationalError: the server refused the connection.
        """
        return SqlBank(psycopg.connect(dsn(self.dbname)))

    def close(self) -> None:
        """Nothing to close: each bank closes its own connection."""


def postgres_backend(dbname: str, options: Options) -> Backend:
    """Make a worker process's backend (a :data:`~benchmarks.peers.smallbank_bank.BackendFactory`).

    Args:
        dbname: the run's database.
        options: the run's options (unused: a connection per thread needs none).

    Returns:
        A :class:`PostgresBackend`.
    """
    return PostgresBackend(dbname)


def run(options: Options) -> dict[str, Any]:
    """Create a database, open the accounts, run the mix, check the money, drop the database.

    Args:
        options: the run.

    Returns:
        The result row (``smallbank_report.report``'s keys, and ``negative_savings``).

    Raises:
        RuntimeError: a worker process failed.
        psycopg.OperationalError: PostgreSQL is not reachable on 127.0.0.1:5432.
    """
    server, durability = server_settings()
    opening = opening_balances(options)
    with scratch_database("waltz_peer_sb_pg") as dbname:
        with psycopg.connect(dsn(dbname)) as conn:
            create_and_open(conn, opening)
        harvest = run_workers(postgres_backend, dbname, options)
        with psycopg.connect(dsn(dbname)) as conn:
            final, negative = totals(conn)
    money = money_check(sum(s + c for s, c in opening), final, harvest)
    settings = (
        f"{durability}; one transaction per operation at READ COMMITTED, rows locked with "
        f"SELECT ... FOR SHARE/FOR UPDATE customer by customer in customer order; "
        f"psycopg {psycopg.__version__}, a connection per thread"
    )
    return report(
        "PostgreSQL (SmallBank)",
        f"1 {server} (no replication)",
        settings,
        options,
        harvest,
        money,
        negative_savings=negative,
    )


def main() -> None:
    """Run from the command line (the SmallBank peers' options); print the row as one JSON line."""
    args = parser(__doc__).parse_args()
    print(json.dumps(run(options_of(args))), flush=True)


if __name__ == "__main__":
    # Run as the module ``benchmarks.peers.bench_smallbank_pg`` (not ``__main__``), the name the
    # worker processes import it by.
    from benchmarks.peers import bench_smallbank_pg  # noqa: PLW0406

    bench_smallbank_pg.main()
