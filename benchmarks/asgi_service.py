"""The wallet service over HTTP: its mixed request rate at 4, 16 and 64 concurrent clients, beside
the same service written with SQLAlchemy's asyncio ORM straight on PostgreSQL.

What docs/asyncio-service.md's service gives under load ("Throughput"). Two apps, each served by
one uvicorn process (``--loop asyncio``, no access log) on 127.0.0.1, one after the other at each
concurrency, in one sitting:

- ``waltz``: ``waltz_examples.wallet.app`` (``AsyncWaltzClient``, the framework's entity contexts
  and cache) on a new local cluster (3 storage nodes, 1 server, 4 partitions, secure as every
  local cluster) and a new PostgreSQL database;
- ``direct``: :func:`create_direct_app`, the same API with SQLAlchemy's asyncio ORM on psycopg's
  async driver (``postgresql+psycopg_async``), a new database of its own: a withdrawal locks its
  row (``SELECT ... FOR UPDATE``), checks and updates it, and records its request ID in the same
  transaction; a request ID recorded before answers 200 with the earlier answer's ID.

The load: ``--wallets`` wallets opened first (a deposit each, which also warms both apps up), then
at each concurrency C, C clients (an ``httpx.AsyncClient`` of one connection each) send
requests back to back for ``--seconds``: 40 % deposits, 20 % withdrawals, 40 % balance reads,
each of a random wallet. Prints, per app and C, the answered requests per second, the p50 and
p99 latency (milliseconds) and the answers by status, as JSON (``--out`` writes them to a file);
asserts nothing. The load generator runs in this process, beside the two servers: on a small
machine the figures are the three processes' share of it.

    .venv/bin/python -m benchmarks.asgi_service \\
        [--db postgresql+psycopg://postgres@127.0.0.1:5432/postgres] [--seconds 10] [--wallets 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Response
from sqlalchemy import BigInteger, Identity, String, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from benchmarks.databases import fresh_database
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz_examples.wallet.app import Balance, Movement, Receipt, WalletId

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (4, 16, 64)
#: The request mix: (kind, weight).
MIX = (("deposit", 40), ("withdraw", 20), ("balance", 40))


# --- the direct service ------------------------------------------------------------------------


class DirectBase(DeclarativeBase):
    """The direct service's tables."""


class DirectWallet(DirectBase):
    """A wallet and its balance, in cents."""

    __tablename__ = "wallets"
    wallet_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    balance: Mapped[int] = mapped_column(BigInteger, nullable=False)


class DirectRequest(DirectBase):
    """A request ID applied, and the ID of the answer it got (a sequence, standing for the log's
    transaction ID)."""

    __tablename__ = "wallet_requests"
    answer_id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(200), unique=True)


def create_direct_app() -> FastAPI:
    """The wallet's API with SQLAlchemy's asyncio ORM on ``DIRECT_DATABASE_URL`` (a
    ``postgresql+psycopg_async://`` URL), for uvicorn's ``--factory``."""
    engine = create_async_engine(os.environ["DIRECT_DATABASE_URL"])
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:
            await conn.run_sync(DirectBase.metadata.create_all)
        yield
        await engine.dispose()

    app = FastAPI(title="wallet (direct)", lifespan=lifespan)

    async def applied(session: AsyncSession, request_id: str) -> int | None:
        found = await session.scalar(
            select(DirectRequest.answer_id).where(DirectRequest.request_id == request_id)
        )
        return None if found is None else int(found)

    async def move(wallet_id: int, movement: Movement, sign: int, response: Response) -> Receipt:
        try:
            async with sessions() as session, session.begin():
                earlier = await applied(session, movement.request_id)
                if earlier is not None:
                    response.status_code = 200
                    return Receipt(partition_id=0, transaction_id=earlier, already_applied=True)
                wallet = await session.get(DirectWallet, wallet_id, with_for_update=True)
                if wallet is None and sign < 0:
                    raise HTTPException(409, detail=f"no wallet {wallet_id}")
                if wallet is None:
                    session.add(DirectWallet(wallet_id=wallet_id, balance=movement.amount))
                elif sign < 0 and wallet.balance < movement.amount:
                    raise HTTPException(
                        409, detail=f"insufficient funds: wallet {wallet_id} holds {wallet.balance}"
                    )
                else:
                    wallet.balance += sign * movement.amount
                request = DirectRequest(request_id=movement.request_id)
                session.add(request)
                await session.flush()
                answer_id = request.answer_id
        except IntegrityError:  # the same request ID, or a new wallet, committed meanwhile
            async with sessions() as session:
                earlier = await applied(session, movement.request_id)
            if earlier is None:
                raise HTTPException(409, detail="a concurrent request won; retry") from None
            response.status_code = 200
            return Receipt(partition_id=0, transaction_id=earlier, already_applied=True)
        return Receipt(partition_id=0, transaction_id=answer_id)

    @app.post("/wallets/{wallet_id}/deposits", status_code=201)
    async def deposit(wallet_id: WalletId, movement: Movement, response: Response) -> Receipt:
        return await move(wallet_id, movement, 1, response)

    @app.post("/wallets/{wallet_id}/withdrawals", status_code=201)
    async def withdraw(wallet_id: WalletId, movement: Movement, response: Response) -> Receipt:
        return await move(wallet_id, movement, -1, response)

    @app.get("/wallets/{wallet_id}")
    async def balance(wallet_id: WalletId) -> Balance:
        async with sessions() as session:
            wallet = await session.get(DirectWallet, wallet_id)
        if wallet is None:
            raise HTTPException(404, detail=f"no wallet {wallet_id}")
        return Balance(wallet_id=wallet_id, balance=wallet.balance, high_water_mark=-1)

    return app


# --- serving and load ----------------------------------------------------------------------------


@contextlib.contextmanager
def uvicorn(factory: str, port: int, env: dict[str, str]) -> Iterator[str]:
    """A uvicorn process serving ``factory`` on 127.0.0.1:``port``, once it answers; stopped on exit.

    Yields:
        The server's base URL.
    """
    command = [sys.executable, "-m", "uvicorn", "--factory", factory, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--loop", "asyncio", "--no-access-log", "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env})
    base = f"http://127.0.0.1:{port}"
    try:

        def answers() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"uvicorn {factory} exited with {process.returncode}")
            try:
                return httpx.get(f"{base}/openapi.json", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(answers, timeout=120, what=f"uvicorn serving {factory}")
        yield base
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def open_wallets(base: str, wallets: int) -> None:
    """A first deposit of 1,000,000 cents to each wallet, 64 at a time."""
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        gate = asyncio.Semaphore(64)

        async def one(wallet: int) -> None:
            async with gate:
                body = {"amount": 1_000_000, "request_id": f"open-{wallet}"}
                answer = await http.post(f"/wallets/{wallet}/deposits", json=body)
                answer.raise_for_status()

        await asyncio.gather(*(one(w) for w in range(1, wallets + 1)))


async def load(base: str, concurrency: int, seconds: float, wallets: int, tag: str) -> dict[str, Any]:
    """``concurrency`` clients, each an ``httpx.AsyncClient`` of one connection, sending the mix back
    to back for ``seconds``; the rate, latencies and answers. (One client's pool shared by all would
    measure httpx's pool: its cost grows with the connections it holds.)"""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    kinds = [kind for kind, weight in MIX for _ in range(weight)]
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=base, limits=limits, timeout=120))
            for _ in range(concurrency)
        ]
        deadline = time.perf_counter() + seconds

        async def worker(index: int) -> None:
            http = clients[index]
            rng = random.Random(f"{tag}-{concurrency}-{index}")
            n = 0
            while time.perf_counter() < deadline:
                n += 1
                wallet, kind = rng.randint(1, wallets), rng.choice(kinds)
                body = {"amount": rng.randint(1, 100), "request_id": f"{tag}-{concurrency}-{index}-{n}"}
                started = time.perf_counter()
                if kind == "balance":
                    answer = await http.get(f"/wallets/{wallet}")
                elif kind == "deposit":
                    answer = await http.post(f"/wallets/{wallet}/deposits", json=body)
                else:
                    answer = await http.post(f"/wallets/{wallet}/withdrawals", json=body)
                latencies.append(time.perf_counter() - started)
                statuses[answer.status_code] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()

    def percentile(p: float) -> float:
        return round(1000 * latencies[min(len(latencies) - 1, int(p * len(latencies)))], 2)

    return {
        "requests_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": percentile(0.50),
        "p99_ms": percentile(0.99),
        "requests": len(latencies),
        "statuses": dict(sorted(statuses.items())),
    }


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--db", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres", help="PostgreSQL server URL"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of load per app and concurrency")
    parser.add_argument("--wallets", type=int, default=1000, help="wallets the requests choose from")
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if make_url(args.db).get_backend_name() != "postgresql":
        sys.exit("--db must be a PostgreSQL server's URL (postgresql+psycopg://...)")
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalCluster(storages=3, servers=1, partitions=4))
        waltz_db = stack.enter_context(fresh_database(args.db))
        direct_db = make_url(stack.enter_context(fresh_database(args.db))).set(
            drivername="postgresql+psycopg_async"
        )
        waltz_env = {**cluster.client_env(), "WALLET_DATABASE_URL": waltz_db, "WALLET_CLUSTER_NAME": "bench"}
        direct_env = {"DIRECT_DATABASE_URL": direct_db.render_as_string(hide_password=False)}
        bases = {
            "waltz": stack.enter_context(
                uvicorn("waltz_examples.wallet.app:create_app", free_port(), waltz_env)
            ),
            "direct": stack.enter_context(
                uvicorn("benchmarks.asgi_service:create_direct_app", free_port(), direct_env)
            ),
        }
        for base in bases.values():
            asyncio.run(open_wallets(base, args.wallets))
        for concurrency in CONCURRENCY:
            for app, base in bases.items():
                result = asyncio.run(load(base, concurrency, args.seconds, args.wallets, app))
                runs.append({"app": app, "concurrency": concurrency, **result})
                print(json.dumps(runs[-1]), flush=True)
    figures = {"seconds": args.seconds, "wallets": args.wallets, "mix": dict(MIX), "runs": runs}
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
