"""One asyncio loop, no cluster: entity attempts' snapshot reads on the loop, on a bounded executor,
or through psycopg's asyncio driver; the loop's lag and the attempts' throughput.

What docs/decisions/0064-entity-attempts-off-the-event-loop.md chose from (docs/design/sql.md,
"The SQL framework on asyncio"). On a database server, the ledger's tables (the SmallBank schema
of ``examples/waltz_examples/ledger``) with 16 customers; ``-n`` WriteCheck attempts, at most
``--concurrency`` in flight, in each mode:

- ``on-loop``: ``context.execute(builder)`` in the coroutine (the snapshot blocks the loop);
- ``executor-K``: ``execute`` on a ``ThreadPoolExecutor`` of K threads, awaited (K = 2, the
  client's default ``client.numTransactionRetryThreads``, and 8);
- ``executor-reads-K``: the attempt's reads alone on that executor (the framework's snapshot of
  the mark and the three rows, no ``run``, no change-set): what ``psycopg-async-K`` does;
- ``sqlalchemy-async-K``: the same reads through SQLAlchemy's asyncio engine on psycopg's async
  driver (``create_async_engine``, a pool of K; needs ``greenlet``, skipped without it): the
  other way to keep snapshots off the loop;
- ``psycopg-async-K``: the same reads (the mark and the customer's three rows in one statement,
  in a REPEATABLE READ transaction; BEGIN, the statement and ROLLBACK in one pipeline: one round
  trip) with psycopg's ``AsyncConnection`` on K connections: what SQLAlchemy's asyncio engine
  drives underneath, at its best (without its greenlet and ORM layers, which only add to its
  cost; SQLAlchemy's asyncio extension also needs ``greenlet``, not installed).

A ticker coroutine sleeps 1 ms at a time meanwhile: its lateness is the loop's lag (p50, p99 and
max, milliseconds). Prints one JSON object per mode; asserts nothing. The entity cache is off:
every attempt reads its snapshot. The database's ledger tables and ``bench`` mark rows are
emptied first.

    .venv/bin/python -m benchmarks.async_entity_attempts \\
        --db postgresql+psycopg://postgres@127.0.0.1/bench [-n 2000] [--concurrency 100] [--db-delay 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import statistics
import time
from collections.abc import Awaitable, Callable

import psycopg
from sqlalchemy import delete, insert
from sqlalchemy.engine import make_url

from benchmarks.databases import delayed
from waltz.client.context import TransactionBuilder
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.schema import high_water_marks
from waltz_examples.ledger.models import (
    Account,
    Checking,
    Savings,
    TransferIn,
    TransferOut,
    applied_transactions,
    registry,
)
from waltz_examples.ledger.operations import WriteCheck
from waltz_examples.ledger.service import LedgerCallbacks, prepare_database

CUSTOMERS = 16
PARTITIONS = 4

#: The mark and the customer's three rows in one statement, as the framework's snapshot reads them
#: (docs/decisions/0039-entities-read-with-the-mark.md).
_SNAPSHOT = (
    "SELECT m.high_water_mark, a.holder, a.status, c.balance, s.balance"
    " FROM waltz_high_water_marks m"
    " LEFT JOIN ledger_accounts a ON a.custid = %(custid)s"
    " LEFT JOIN ledger_checking c ON c.custid = %(custid)s"
    " LEFT JOIN ledger_savings s ON s.custid = %(custid)s"
    " WHERE m.cluster_name = 'bench' AND m.partition_id = %(partition)s"
)


async def _measure(n: int, concurrency: int, attempt: Callable[[int], Awaitable[None]]) -> dict[str, float]:
    """Run ``attempt(i)`` for i in 0..n-1, ``concurrency`` at once, with the lag ticker running."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            start = loop.time()
            await asyncio.sleep(0.001)
            lags.append((loop.time() - start - 0.001) * 1000)

    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await attempt(i)

    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - start
    done.set()
    await tick
    lags.sort()
    return {
        "attempts_per_s": round(n / wall),
        "lag_p50_ms": round(statistics.median(lags), 2),
        "lag_p99_ms": round(lags[int(len(lags) * 0.99) - 1], 2),
        "lag_max_ms": round(lags[-1], 2),
        "ticks": len(lags),
    }


def _sync_snapshot(callbacks: LedgerCallbacks, i: int) -> None:
    """The attempt's reads alone: the framework's snapshot of the mark and the three rows."""
    custid = i % CUSTOMERS
    registry = callbacks.registry
    entities = [(registry.info(model), (custid,)) for model in (Account, Checking, Savings)]
    with callbacks.snapshot(custid % PARTITIONS, entities=entities) as snapshot:
        assert len(snapshot.prefetched) == 3


def _sync_attempt(callbacks: LedgerCallbacks, i: int) -> None:
    context = WriteCheck(callbacks, i % CUSTOMERS, 5)
    context.partition_id(PARTITIONS)
    context.execute(TransactionBuilder(-1))


async def _run_modes(
    url: str, callbacks: LedgerCallbacks, n: int, concurrency: int
) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []

    async def on_loop(i: int) -> None:
        _sync_attempt(callbacks, i)

    results.append({"mode": "on-loop", **await _measure(n, concurrency, on_loop)})
    loop = asyncio.get_running_loop()
    for threads in (2, 8):
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:

            async def in_pool(i: int, pool: concurrent.futures.Executor = pool) -> None:
                await loop.run_in_executor(pool, _sync_attempt, callbacks, i)

            results.append({"mode": f"executor-{threads}", **await _measure(n, concurrency, in_pool)})

            async def reads_in_pool(i: int, pool: concurrent.futures.Executor = pool) -> None:
                await loop.run_in_executor(pool, _sync_snapshot, callbacks, i)

            results.append(
                {"mode": f"executor-reads-{threads}", **await _measure(n, concurrency, reads_in_pool)}
            )

    for connections in (2, 8):
        results.append(await _sqlalchemy_async(url, n, concurrency, connections))

    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    for connections in (2, 8):
        pool_queue: asyncio.Queue[psycopg.AsyncConnection[tuple[object, ...]]] = asyncio.Queue()
        for _ in range(connections):
            pool_queue.put_nowait(await psycopg.AsyncConnection.connect(conninfo, autocommit=True))

        async def native(
            i: int, pool_queue: asyncio.Queue[psycopg.AsyncConnection[tuple[object, ...]]] = pool_queue
        ) -> None:
            conn = await pool_queue.get()
            try:  # BEGIN, the statement and ROLLBACK in one round trip (a pipeline)
                custid = i % CUSTOMERS
                async with conn.pipeline():
                    await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    cursor = await conn.execute(
                        _SNAPSHOT, {"custid": custid, "partition": custid % PARTITIONS}
                    )
                    await conn.execute("ROLLBACK")
                await cursor.fetchone()
            finally:
                pool_queue.put_nowait(conn)

        try:
            results.append({"mode": f"psycopg-async-{connections}", **await _measure(n, concurrency, native)})
        finally:
            while not pool_queue.empty():
                await pool_queue.get_nowait().close()
    return results


async def _sqlalchemy_async(url: str, n: int, concurrency: int, connections: int) -> dict[str, object]:
    """The reads through SQLAlchemy's asyncio engine on psycopg's async driver (K pooled
    connections): a REPEATABLE READ transaction, the one statement, a rollback."""
    mode = f"sqlalchemy-async-{connections}"
    try:
        import greenlet  # noqa: F401  (SQLAlchemy's asyncio extension runs on it)
    except ImportError:
        return {"mode": mode, "skipped": "greenlet is not installed (pip install greenlet)"}
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    async_url = make_url(url).set(drivername="postgresql+psycopg_async")
    engine = create_async_engine(async_url, pool_size=connections, max_overflow=0)
    statement = text(_SNAPSHOT.replace("%(custid)s", ":custid").replace("%(partition)s", ":partition"))
    try:

        async def read(i: int) -> None:
            custid = i % CUSTOMERS
            async with engine.connect() as pooled:
                conn = await pooled.execution_options(isolation_level="REPEATABLE READ")
                async with conn.begin():
                    row = (
                        await conn.execute(statement, {"custid": custid, "partition": custid % PARTITIONS})
                    ).one()
                    assert row[0] is not None
                    await conn.rollback()

        return {"mode": mode, **await _measure(n, concurrency, read)}
    finally:
        await engine.dispose()


def run(url: str, n: int, concurrency: int, rounds: int) -> None:
    """The rounds on the database at ``url``; prints the last round's figures, a JSON line per mode."""
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
    results: list[dict[str, object]] = []
    for _ in range(rounds):
        results = asyncio.run(_run_modes(url, callbacks, n, concurrency))
    callbacks.release_connections()
    engine.dispose()
    for result in results:
        print(json.dumps({"n": n, "concurrency": concurrency, **result}))


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="SQLAlchemy URL of a PostgreSQL server (psycopg)")
    parser.add_argument("-n", type=int, default=2000, help="attempts per mode and round")
    parser.add_argument("--concurrency", type=int, default=100, help="attempts in flight at once")
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
        run(url, args.n, args.concurrency, args.rounds)


if __name__ == "__main__":
    main()
