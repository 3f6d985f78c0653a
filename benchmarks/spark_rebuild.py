"""Spark rebuild of a ledger database from the log versus replaying the log through the client and
the SQL callbacks (prints figures; asserts nothing about timings).

The rebuild of docs/design/spark.md ("What the rebuild is for", "Computing views"), against the
replay every instance can do (docs/design/sql.md, "Group apply").

Starts a LocalCluster (its own ZooKeeper, 3 storage nodes, 1 server, ``--partitions``
partitions) and writes ``--transactions`` ledger change-sets through the server's admin append
(store-level, no lock checks, batches of ``--append-batch``): first one ``open`` per customer
(account, savings and checking rows), then deposits that rewrite a customer's checking row, each
with the ``op``/``delta`` meta the ledger records. Then, each into a fresh PostgreSQL database on
the server of ``--db`` (dropped at the end):

1. **Spark rebuild** (``waltz.spark.rebuild.rebuild``, ``--master``, default ``local[*]``; a
   ``spark://HOST:PORT`` URL for a standalone cluster you run, or ``standalone`` for a master and
   ``--workers`` workers of one core each started on loopback for the run): read
   the committed log through the storage nodes' admin ports, replay it, write the six ledger
   tables through JDBC and swap them in. The Spark session start is timed apart.
2. **Replay through the client**: a ``LedgerService`` (``WaltzClient`` + ``LedgerCallbacks``,
   apply batches of ``--apply-batch``) on an empty database applies the log from the start until
   its marks reach the log's high-water marks.

Prints both times, the transactions per second and the ratio, and checks that both databases hold
the same rows (a mismatch is reported, not asserted).

``--replays`` runs the replay once per way listed, each into a fresh database, in order:
``arrays`` (the default: a group's row changes of one shape as one statement over arrays,
docs/design/sql.md "Rows of one shape in one statement") or ``one-by-one``
(``ChangeSetCallbacks.rows_at_once`` off); every replay's rows are compared with the first
database's. ``--no-spark`` skips the rebuild: the replays then wait for the log's own marks.

    .venv/bin/python -m benchmarks.spark_rebuild                       # 1,000,000 transactions
    .venv/bin/python -m benchmarks.spark_rebuild --transactions 50000 --partitions 4
    .venv/bin/python -m benchmarks.spark_rebuild --transactions 50000 --master standalone
    .venv/bin/python -m benchmarks.spark_rebuild --transactions 200000 --no-spark \
        --replays arrays,one-by-one,one-by-one,arrays
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from sqlalchemy import create_engine, select

from benchmarks.databases import fresh_database
from waltz.jdbc_style import ChangeSet, Operation, RowChange
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER
from waltz.local.cluster import LocalCluster
from waltz.local.options import SecurityOptions
from waltz.local.processes import wait_until
from waltz.local.spark import LocalSparkCluster
from waltz.protocol.records import ReqId
from waltz.protocol.server_client import ServerAdminClient
from waltz_examples.ledger.models import Account, Checking, Savings
from waltz_examples.ledger.service import LedgerCallbacks, LedgerService
from waltz_examples.ledger.views import VIEWS

CLUSTER_NAME = "ledger"

REPLAY_WAYS = ("arrays", "one-by-one")

#: The protocol's figures, comparable with the earlier runs: plaintext, on purpose (what TLS
#: costs: benchmarks/tls_cost.py; decision 0065).
PLAINTEXT = SecurityOptions.plaintext()


def _open(custid: int) -> bytes:
    return ChangeSet(
        [
            RowChange(
                Operation.INSERT,
                "ledger.account",
                {"custid": custid},
                {"custid": custid, "name": f"c{custid}", "status": "open"},
            ),
            RowChange(
                Operation.INSERT, "ledger.savings", {"custid": custid}, {"custid": custid, "balance": 0}
            ),
            RowChange(
                Operation.INSERT, "ledger.checking", {"custid": custid}, {"custid": custid, "balance": 0}
            ),
        ],
        meta={"op": "open_account", "delta": 0},
    ).encode()


def _deposit(custid: int, balance: int, amount: int) -> bytes:
    return ChangeSet(
        [
            RowChange(
                Operation.UPDATE,
                "ledger.checking",
                {"custid": custid},
                {"custid": custid, "balance": balance},
            )
        ],
        meta={"op": "deposit_checking", "delta": amount},
    ).encode()


def generate(partitions: int, transactions: int, customers: int) -> dict[int, list[bytes]]:
    """Per partition, the change-sets in log order (customer ``c`` lives in partition ``c mod p``)."""
    logs: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    balances = [0] * customers
    for custid in range(min(customers, transactions)):
        logs[custid % partitions].append(_open(custid))
    for i in range(transactions - min(customers, transactions)):
        custid = (i * 7919) % customers
        amount = 1 + i % 97
        balances[custid] += amount
        logs[custid % partitions].append(_deposit(custid, balances[custid], amount))
    return logs


async def append_all(endpoint: str, logs: dict[int, list[bytes]], batch: int) -> None:
    """Append every partition's change-sets through the server's admin port, in order."""
    async with ServerAdminClient(endpoint, timeout=120) as admin:

        async def one(pid: int, items: list[bytes]) -> None:
            for start in range(0, len(items), batch):
                chunk = items[start : start + batch]
                outcomes = await admin.append(
                    pid, [(ReqId(9, 1, pid, start + i), CHANGE_SET_HEADER, d) for i, d in enumerate(chunk)]
                )
                bad = [o for o in outcomes if isinstance(o, str)]
                if bad:
                    raise RuntimeError(f"partition {pid}: append failed: {bad[0]}")

        await asyncio.gather(*(one(pid, items) for pid, items in logs.items()))


def table_rows(db_url: str) -> dict[str, list[tuple[object, ...]]]:
    """The ledger's account, savings and checking rows of a database, sorted, to compare two databases.

    Args:
        db_url: the database.

    Returns:
        The rows by table name.
    """
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return {
                t.__tablename__: sorted(tuple(r) for r in conn.execute(select(*t.__table__.columns)))
                for t in (Account, Savings, Checking)
            }
    finally:
        engine.dispose()


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--transactions", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--master",
        default="local[*]",
        help="Spark master (local[*], spark://HOST:PORT), or 'standalone': a loopback cluster for the run",
    )
    parser.add_argument("--workers", type=int, default=2, help="workers of --master standalone")
    parser.add_argument("--append-batch", type=int, default=500)
    parser.add_argument("--apply-batch", type=int, default=500)
    parser.add_argument(
        "--replays",
        default="arrays",
        help=f"replays through the client, in order, comma-separated, each of {', '.join(REPLAY_WAYS)}",
    )
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark rebuild")
    args = parser.parse_args()
    replays = [way.strip() for way in args.replays.split(",") if way.strip()]
    unknown = sorted(set(replays) - set(REPLAY_WAYS))
    if unknown or not replays:
        parser.error(f"--replays takes {', '.join(REPLAY_WAYS)}; got {args.replays!r}")
    logging.basicConfig(level=logging.WARNING)

    with (
        tempfile.TemporaryDirectory(prefix="waltz-bench-spark-") as tmp,
        LocalCluster(
            security=PLAINTEXT, storages=3, servers=1, partitions=args.partitions, work_dir=Path(tmp)
        ) as cluster,
        ExitStack() as stack,
    ):
        if args.master == "standalone" and not args.no_spark:
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the driver, on loopback too
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            standalone = stack.enter_context(LocalSparkCluster(Path(tmp) / "spark", workers=args.workers))
            args.master = standalone.master_url
        cluster.wait_ready(120)
        logs = generate(args.partitions, args.transactions, args.customers)
        started = time.monotonic()
        asyncio.run(append_all(cluster.owner(0), logs, args.append_batch))
        print(
            f"log: {args.transactions:,} transactions in {args.partitions} partitions, "
            f"written in {time.monotonic() - started:.1f}s",
            flush=True,
        )
        marks = {pid: len(items) - 1 for pid, items in logs.items()}
        spark_seconds = session_seconds = None
        first_db: str | None = None
        if not args.no_spark:
            spark_db = stack.enter_context(fresh_database(args.db))
            spark_seconds, session_seconds, marks = run_spark(args.master, cluster, spark_db)
            first_db = spark_db
        for way in replays:
            replay_db = stack.enter_context(fresh_database(args.db))
            replay_seconds = replay(cluster, replay_db, marks, args.apply_batch, rows_at_once=way == "arrays")
            print(
                f"replay through client + SQL callbacks ({way}, apply batch {args.apply_batch}): "
                f"{replay_seconds:.1f}s ({args.transactions / replay_seconds:,.0f} transactions/s)",
                flush=True,
            )
            if spark_seconds is not None and session_seconds is not None:
                print(
                    f"ratio replay / spark rebuild: {replay_seconds / spark_seconds:.2f}x "
                    "(with the Spark session start: "
                    f"{replay_seconds / (spark_seconds + session_seconds):.2f}x)"
                )
            if first_db is None:
                first_db = replay_db
                continue
            same = table_rows(first_db) == table_rows(replay_db)
            print(f"the database holds the same account, savings and checking rows as the first: {same}")
            if not same:
                sys.exit(1)


def run_spark(master: str, cluster: LocalCluster, spark_db: str) -> tuple[float, float, dict[int, int]]:
    """Rebuild the ledger into ``spark_db`` with Spark; print and return its time, the Spark
    session's start (seconds) and the marks it rebuilt to (partition -> transaction ID)."""
    from waltz.spark.rebuild import LogSource, rebuild
    from waltz.spark.session import spark_session

    source = LogSource(zookeeper=cluster.zookeeper_connect_string, cluster_root=cluster.root)
    started = time.monotonic()
    spark = spark_session(master, app_name="waltz-bench-rebuild")
    spark.sparkContext.setLogLevel("ERROR")
    session_seconds = time.monotonic() - started
    result = rebuild(spark, VIEWS, source, spark_db, cluster_name=CLUSTER_NAME)
    spark.stop()
    print(
        f"spark rebuild ({master}, {os.cpu_count()} cores): {result.seconds:.1f}s "
        f"({sum(m + 1 for m in result.marks.values()):,} transactions, "
        f"{sum(m + 1 for m in result.marks.values()) / result.seconds:,.0f}/s), session start "
        f"{session_seconds:.1f}s apart; rows {dict(result.rows)}",
        flush=True,
    )
    return result.seconds, session_seconds, dict(result.marks)


def replay(
    cluster: LocalCluster, replay_db: str, marks: dict[int, int], apply_batch: int, *, rows_at_once: bool
) -> float:
    """Apply the log from the start into ``replay_db`` through a ``LedgerService`` until each
    partition's mark is reached; the seconds it took."""
    kept = LedgerCallbacks.rows_at_once
    LedgerCallbacks.rows_at_once = rows_at_once  # read when a statement shape is first built
    started = time.monotonic()
    service = LedgerService(
        replay_db,
        zookeeper=cluster.zookeeper_connect_string,
        cluster_root=cluster.root,
        cluster_name=CLUSTER_NAME,
        client_settings={"client_max_apply_batch_size": apply_batch},
        sweep_interval=None,
    )
    try:
        for pid, mark in marks.items():

            def applied(p: int = pid, m: int = mark) -> bool:
                return m < 0 or service.callbacks.wait_for(p, m, 5)

            wait_until(applied, timeout=24 * 3600, what=f"partition {pid} applied up to {mark}")
        return time.monotonic() - started
    finally:
        service.close()
        LedgerCallbacks.rows_at_once = kept


if __name__ == "__main__":
    main()
