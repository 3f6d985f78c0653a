"""SmallBank straight on PostgreSQL: the ledger example's workload as a team would write it
without waltz-py (PostgreSQL at 127.0.0.1:5432, user postgres).

What it measures: committed SmallBank transactions per second and their latency (from the start
of the operation to its commit) when every operation is one PostgreSQL transaction at READ
COMMITTED. The schema is SmallBank's: ``account(custid, name, status)``, ``savings(custid,
balance)``, ``checking(custid, balance)``, in a database created for the run and dropped
afterwards. An operation locks the rows it reads and changes, customer by customer in ascending
customer order, with ``SELECT ... FOR SHARE OF account [and the balances it only reads] FOR
UPDATE OF [the balances it changes]`` (the ledger example's READ and WRITE locks; every operation
takes its locks in one order, so there are no deadlocks), applies SmallBank's rules in Python,
writes the new balances and commits (``synchronous_commit`` at the server's setting, on by
default). A rule violation (insufficient funds) rolls back: a user abort, counted as dropped. A
deadlock or serialization failure would roll back and retry (counted as retries).

The workload is the one of ``examples/waltz_examples/ledger/smallbank.py`` (the demo's): customers
``0 .. accounts-1`` opened before the measured phase with savings and checking drawn from
10,000..50,000 cents; BenchBase's mix (Amalgamate 15 %, Balance 15 %, DepositChecking 15 %,
SendPayment 25 %, TransactSavings 15 %, WriteCheck 15 %) with its amounts; 90 % of the picks from
a hotspot of the first 10 % of the customers (at least 2); the rules of ``operations.py`` (which
operations are dropped, and why). Balance is a read-only transaction, counted as a balance read,
not as committed. Amalgamate and SendPayment between two customers are one transaction (no
partitions here).

Load: ``--processes`` worker processes x ``--threads`` threads, each thread with its own
connection and its own seeded draws, closed loop; ``--transactions`` draws of the mix (Balance
included) split over the threads, after ``--warmup`` draws that are not measured; the measured
phase stops early at ``--time-limit`` seconds. Printed: one JSON line (``common.result``'s keys:
``transactions`` is the committed count, ``transactions_per_second``, ``latency_ms`` of the
committed transactions; and ``dropped``, ``balances_read`` and ``balances_read_per_second``
(Balance's read-only transactions are not in the committed figures), the draws and outcomes by
operation,
``money``: whether the balances add up to the opening balances plus the deposits minus the
withdrawals of the committed operations). Usage::

    .venv/bin/python -m benchmarks.peers.bench_smallbank_pg                  # 6,000 draws, 3 x 21
    .venv/bin/python -m benchmarks.peers.bench_smallbank_pg --transactions 20000 --threads 10
    .venv/bin/python -m benchmarks.peers.run_all --only smallbank-pg,smallbank-es

The workload (``smallbank_workload.py``), the rules (``smallbank_rules.py``), the statements
(``smallbank_sql.py``), the worker processes (``smallbank_workers.py``) and the report
(``smallbank_report.py``) are modules of their own, which the eventsourcing variant
(``bench_smallbank_es.py``) shares.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from benchmarks.peers.pg_server import dsn, scratch_database, server_settings
from benchmarks.peers.smallbank_bank import Backend, Bank
from benchmarks.peers.smallbank_report import money_check, report
from benchmarks.peers.smallbank_rules import OPEN
from benchmarks.peers.smallbank_sql import SCHEMA, PostgresBank
from benchmarks.peers.smallbank_workers import run_workers
from benchmarks.peers.smallbank_workload import Options, opening_balances, options_of, parser


class PostgresBackend:
    """A worker process's backend: a connection per thread."""

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname

    def bank(self) -> Bank:
        return PostgresBank(self.dbname)

    def close(self) -> None:
        pass


def postgres_backend(dbname: str, options: Options) -> Backend:
    return PostgresBackend(dbname)


def run(options: Options) -> dict[str, Any]:
    """Create a database, open the accounts, run the mix, check the money, drop the database;
    the result row."""
    server, durability = server_settings()
    opening = opening_balances(options)
    with scratch_database("waltz_peer_sb_pg") as dbname:
        with psycopg.connect(dsn(dbname)) as conn:
            for statement in SCHEMA:
                conn.execute(statement)
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO account VALUES (%s, %s, %s)",
                    [(custid, f"customer-{custid}", OPEN) for custid in range(options.accounts)],
                )
                cur.executemany("INSERT INTO savings VALUES (%s, %s)", list(enumerate(s for s, _ in opening)))
                cur.executemany(
                    "INSERT INTO checking VALUES (%s, %s)", list(enumerate(c for _, c in opening))
                )
            conn.execute("ANALYZE")
        harvest = run_workers(postgres_backend, dbname, options)
        with psycopg.connect(dsn(dbname)) as conn:
            final, negative = conn.execute(
                "SELECT (SELECT sum(balance) FROM savings) + (SELECT sum(balance) FROM checking), "
                "(SELECT count(*) FROM savings WHERE balance < 0)"
            ).fetchone() or (0, 0)
    money = money_check(sum(s + c for s, c in opening), int(final), harvest)
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
        negative_savings=int(negative),
    )


def main() -> None:
    args = parser(__doc__).parse_args()
    print(json.dumps(run(options_of(args))), flush=True)


if __name__ == "__main__":
    # Run as the module ``benchmarks.peers.bench_smallbank_pg`` (not ``__main__``), the name the
    # worker processes import it by.
    from benchmarks.peers import bench_smallbank_pg  # noqa: PLW0406

    bench_smallbank_pg.main()
