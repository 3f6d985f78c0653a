"""A service written from the SQL guide alone: its ``Account`` and ``Withdraw`` from one thread.

What the SQL guide's user sees of the application path (docs/design/sql.md, "Entity
transactions", "The entity cache"): the models and contexts are those of ``docs/sql.md``
("Entities: declarative locks and partitions"), with the framework's defaults
(``ChangeSetCallbacks``, the entity cache on), against a new local cluster (3 storage nodes, RF
3, 1 server) and a new database per run. The accounts are opened first (each with a balance of
twice ``-n``: no withdrawal is refused); then ``-n`` withdrawals of 1 from the accounts in turn,
from one thread:

- ``pipelined``: every ``submit`` first, then every future's result (what a request handler
  that does not wait for the commit sees);
- ``one at a time``: ``submit(...).result()`` in a loop, a quarter as many (a handler that
  answers only once its transaction committed).

Prints committed withdrawals per second of each, the time the ``submit`` loop took, and the entity
cache's hits and misses, as JSON; asserts nothing. Each run's database is created on the server
and dropped (or a new SQLite file made).

    .venv/bin/python -m benchmarks.guide_withdrawals --db postgresql+psycopg://postgres@127.0.0.1 \\
        --accounts 10,1000 [-n 2000] [--partitions 4]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from benchmarks.databases import fresh_database
from waltz import WaltzClient, WaltzClientConfig
from waltz.jdbc_style import (
    ChangeSetCallbacks,
    EntityRegistry,
    EntityTransactionContext,
    WaltzEntity,
    create_framework_engine,
    migrations_api,
)
from waltz.local.cluster import LocalCluster
from waltz.local.options import SecurityOptions

#: The protocol's figures, comparable with the earlier runs: plaintext, on purpose (what TLS
#: costs: benchmarks/tls_cost.py; decision 0065).
PLAINTEXT = SecurityOptions.plaintext()


class Base(DeclarativeBase):
    """The guide's declarative base."""


class Account(Base):
    """An account of the guide: its ID and balance; its lock is ``account``."""

    __tablename__ = "accounts"
    __waltz__ = WaltzEntity("account")
    account_id: Mapped[int] = mapped_column(primary_key=True)
    balance: Mapped[int] = mapped_column(default=0)


class Open(EntityTransactionContext):
    """Open an account with a balance, unless it exists.

    Args:
        callbacks: the service's callbacks.
        account_id: the account.
        balance: its opening balance.
    """

    def __init__(self, callbacks: ChangeSetCallbacks, account_id: int, balance: int) -> None:
        super().__init__(callbacks, (Account, account_id))
        self.account_id, self.balance = account_id, balance

    def run(self, tx: Any) -> bool:
        """Insert the account (nothing if it exists).

        Args:
            tx: the entity transaction.

        Returns:
            Whether to append: False if the account exists.
        """
        if tx.get(Account, self.account_id) is not None:
            return False
        tx.insert(Account, account_id=self.account_id, balance=self.balance)
        return True


class Withdraw(EntityTransactionContext):
    """Withdraw an amount from an account that holds it.

    Args:
        callbacks: the service's callbacks.
        account_id: the account.
        amount: what to withdraw.
    """

    def __init__(self, callbacks: ChangeSetCallbacks, account_id: int, amount: int) -> None:
        super().__init__(callbacks, (Account, account_id))
        self.account_id, self.amount = account_id, amount

    def run(self, tx: Any) -> bool:
        """Lower the balance by the amount (nothing if the account is missing or short).

        Args:
            tx: the entity transaction.

        Returns:
            Whether to append: False if the account is missing or holds less than the amount.
        """
        account = tx.get(Account, self.account_id)
        if account is None or account.balance < self.amount:
            return False
        tx.update(account, balance=account.balance - self.amount)
        return True


def run(db: str, accounts: int, n: int, cluster: LocalCluster) -> dict[str, Any]:
    """One run: the accounts opened, then the withdrawals pipelined and one at a time.

    Args:
        db: the run's database, empty.
        accounts: accounts the withdrawals go to in turn.
        n: pipelined withdrawals (a quarter as many one at a time).
        cluster: the run's local cluster.

    Returns:
        The run's figures, JSON-ready.
    """
    engine = create_framework_engine(db)
    migrations_api.upgrade(engine)
    Base.metadata.create_all(engine)
    callbacks = ChangeSetCallbacks(engine, cluster_name="guide", registry=EntityRegistry.from_base(Base))
    config = WaltzClientConfig(
        zookeeper_connect_string=cluster.zookeeper_connect_string, cluster_root=cluster.root
    )
    result: dict[str, Any] = {"accounts": accounts}
    try:
        with WaltzClient(callbacks, config) as client:
            client.wait_mounted(30)
            for future in [client.submit(Open(callbacks, a, 2 * n)) for a in range(accounts)]:
                future.result(120)
            started = time.perf_counter()
            futures = [client.submit(Withdraw(callbacks, i % accounts, 1)) for i in range(n)]
            submitted = time.perf_counter() - started
            for future in futures:
                future.result(300)
            seconds = time.perf_counter() - started
            result["pipelined"] = {
                "withdrawals": n,
                "committed_per_second": round(n / seconds, 1),
                "submit_loop_seconds": round(submitted, 3),
            }
            serial = max(1, n // 4)
            started = time.perf_counter()
            for i in range(serial):
                client.submit(Withdraw(callbacks, i % accounts, 1)).result(60)
            seconds = time.perf_counter() - started
            result["one at a time"] = {
                "withdrawals": serial,
                "committed_per_second": round(serial / seconds, 1),
            }
        cache = callbacks.entity_cache
        result["entity_cache"] = {"hits": cache.hits, "misses": cache.misses} if cache else None
    finally:
        callbacks.release_connections()
        engine.dispose()
    return result


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--db", default="sqlite://", help="database server URL (sqlite:// for a new SQLite file)"
    )
    parser.add_argument("--accounts", default="10,1000", help="comma-separated account counts, a run each")
    parser.add_argument("-n", type=int, default=2000, help="pipelined withdrawals per run")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the local cluster")
    args = parser.parse_args()
    results = []
    for accounts in (int(a) for a in args.accounts.split(",")):
        # A cluster and a database per run: the next run's client does not replay this one's log.
        with (
            LocalCluster(security=PLAINTEXT, storages=3, servers=1, partitions=args.partitions) as cluster,
            fresh_database(args.db) as db,
        ):
            results.append(run(db, accounts, args.n, cluster))
        print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"db": make_url(args.db).get_backend_name(), "runs": results}, indent=1))


if __name__ == "__main__":
    main()
