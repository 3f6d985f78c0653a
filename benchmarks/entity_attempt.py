"""One thread, no cluster: CPU and wall time of an entity attempt and of a single-transaction apply.

An entity attempt's snapshot and a one-transaction apply (docs/design/sql.md, "Entity
transactions", "The apply contract"), the round trips decisions
docs/decisions/0039-entities-read-with-the-mark.md and
docs/decisions/0053-snapshot-begin-with-the-mark.md took away.

Drives the SQL framework directly on a database server: the ledger's tables (the SmallBank
schema of ``examples/waltz_examples/ledger``) with 16 customers, then

- ``attempt``: ``WriteCheck(...).execute(builder)`` in a loop (a snapshot, the mark and three
  entities read, the change-set built; nothing appended), the customers in turn;
- ``apply``: ``LedgerCallbacks.apply_transaction`` of DepositChecking change-sets on partition 0,
  one log transaction per database transaction (the mark moved, one row updated, the applied
  record inserted, committed).

The entity cache is off (``entity_cache=False``): every attempt reads its snapshot, which is what
this measures. Prints microseconds of process CPU and of wall time per operation, as JSON;
asserts nothing.
The database's ledger tables and its ``bench`` mark rows are emptied first.

    .venv/bin/python -m benchmarks.entity_attempt \\
        --db postgresql+psycopg://postgres@127.0.0.1/bench [-n 2000] [--rounds 2] [--db-delay 0.25]
"""

from __future__ import annotations

import argparse
import json
import time

from sqlalchemy import delete, insert

from benchmarks.databases import delayed
from waltz.client.context import TransactionBuilder
from waltz.client.transaction import Transaction
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.schema import high_water_marks
from waltz.protocol.records import ReqId
from waltz_examples.ledger.models import (
    Account,
    Checking,
    Savings,
    TransferIn,
    TransferOut,
    applied_transactions,
    registry,
)
from waltz_examples.ledger.operations import DepositChecking, WriteCheck
from waltz_examples.ledger.service import LedgerCallbacks, prepare_database

CUSTOMERS = 16
PARTITIONS = 4


def _per_op(start_cpu: float, start_wall: float, n: int) -> tuple[float, float]:
    return (
        round((time.process_time() - start_cpu) / n * 1e6, 1),
        round((time.perf_counter() - start_wall) / n * 1e6, 1),
    )


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="SQLAlchemy URL of a database server")
    parser.add_argument("-n", type=int, default=2000, help="attempts and applies per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; the last one is printed")
    parser.add_argument(
        "--db-delay",
        type=float,
        default=0.0,
        metavar="MS",
        help="reach the database through a proxy adding MS milliseconds each way (as on another host)",
    )
    args = parser.parse_args()
    with delayed(args.db, args.db_delay) as url:
        run(url, args.n, args.rounds)


def run(url: str, n: int, rounds: int) -> None:
    """The rounds on the database at ``url``; prints the last round's figures as JSON.

    Args:
        url: the database (its ledger tables are emptied and created first).
        n: attempts and applies per round.
        rounds: rounds; the earlier ones warm up.
    """
    engine = prepare_database(create_framework_engine(url))
    callbacks = LedgerCallbacks(engine, cluster_name="bench", registry=registry(), entity_cache=False)
    with engine.begin() as conn:
        for table in (applied_transactions, TransferIn, TransferOut):
            conn.execute(delete(table))
        for model in (Checking, Savings, Account):
            conn.execute(delete(model))
        conn.execute(delete(high_water_marks).where(high_water_marks.c.cluster_name == "bench"))
        for custid in range(CUSTOMERS):
            conn.execute(insert(Account).values(custid=custid, holder=f"c{custid}", status="open"))
            conn.execute(insert(Savings).values(custid=custid, balance=10**12))
            conn.execute(insert(Checking).values(custid=custid, balance=10**12))
    for partition in range(PARTITIONS):
        callbacks.get_client_high_water_mark(partition)

    result: dict[str, float] = {}
    for _ in range(rounds):
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(n):
            context = WriteCheck(callbacks, i % CUSTOMERS, 5)
            context.partition_id(PARTITIONS)
            context.execute(TransactionBuilder(-1))
        result["attempt_cpu_us"], result["attempt_wall_us"] = _per_op(cpu, wall, n)

        payloads = []
        for custid in range(0, CUSTOMERS, PARTITIONS):  # partition 0's customers
            deposit = DepositChecking(callbacks, custid, 1)
            deposit.partition_id(PARTITIONS)
            builder = TransactionBuilder(-1)
            deposit.execute(builder)
            payloads.append(builder.build())
        mark = callbacks.get_client_high_water_mark(0)
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(n):
            payload = payloads[i % len(payloads)]
            mark += 1
            transaction = Transaction(0, mark, ReqId(0, 0, 0, mark), payload.header, None, payload.data)
            callbacks.apply_transaction(transaction)
        result["apply_cpu_us"], result["apply_wall_us"] = _per_op(cpu, wall, n)
    callbacks.release_connections()
    engine.dispose()
    print(json.dumps({"n": n, **result}))


if __name__ == "__main__":
    main()
