"""An application instance for the SQL framework tests, run as a process of its own.

It follows every partition of a Waltz cluster with a :class:`~waltz.WaltzClient` (auto-mount,
group apply) and applies each log transaction into a shared database through
:class:`AbstractClientCallbacksForSQL`: one row per transaction in ``applied_transactions``
(partition, transaction, the instance that applied it, the CRC-32 of the data). Several
instances share one database; the table's unique constraint on (partition_id, transaction_id)
turns an apply twice into an error, which ``uncaught_exception`` would record.

Usage (the test creates ``applied_transactions`` and the framework's tables first)::

    python tests/jdbc_style/sql_instance.py --db URL --zookeeper HOST:PORT --root /waltz-local/sql-1234 \\
        --cluster-name NAME --name inst1 --ready-file PATH --uncaught-file PATH \\
        [--kill-at PARTITION:TRANSACTION]

- ``--ready-file``: created once every partition is mounted.
- ``--uncaught-file``: one line appended per ``uncaught_exception`` call (absent: none).
- ``--kill-at P:T``: a failpoint: the first ``apply`` on partition ``P`` of a transaction whose ID
  is ``T`` or above inserts its row (the database transaction is open and has written) and then
  kills this process with SIGKILL. "Or above": instances race for each transaction and the one
  that locks the mark row first applies it, so this instance may never see ``T`` itself.
  Before dying it logs ``FAILPOINT partition=P transaction=X instance=NAME``.

The process logs to stderr and exits with 0 on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import zlib
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    insert,
)
from sqlalchemy.orm import Session

from waltz import Transaction, WaltzClient, WaltzClientConfig
from waltz.jdbc_style import AbstractClientCallbacksForSQL, create_framework_engine
from waltz.services.runtime import run_until_signalled

__all__ = ["FAILPOINT_PATTERN", "AppliedTransactionsCallbacks", "applied_transactions", "main", "metadata"]

log = logging.getLogger("sql_instance")

#: The test's own table (create it with ``metadata.create_all`` before starting instances).
metadata = MetaData()
applied_transactions = Table(
    "applied_transactions",
    metadata,
    Column("partition_id", Integer, nullable=False),
    Column("transaction_id", BigInteger, nullable=False),
    Column("instance", String(64), nullable=False),
    Column("data_crc", BigInteger, nullable=False),
    UniqueConstraint("partition_id", "transaction_id", name="uq_applied_transactions"),
)

#: What the failpoint logs before the kill (a regular expression: partition, transaction, instance).
FAILPOINT_PATTERN = (
    r"FAILPOINT partition=(?P<partition>\d+) transaction=(?P<transaction>\d+) instance=(?P<instance>\S+)"
)

#: Transactions per group apply, and the seconds the apply worker waits to fill one.
MAX_APPLY_BATCH = 50
APPLY_LINGER = 0.005


class AppliedTransactionsCallbacks(AbstractClientCallbacksForSQL):
    """Inserts one ``applied_transactions`` row per log transaction; records uncaught exceptions.

    Args:
        engine / cluster_name: see :class:`AbstractClientCallbacksForSQL`.
        instance: this instance's name (written in every row it applies).
        uncaught_file: where each ``uncaught_exception`` call appends a line.
        kill_at: ``(partition, transaction)`` of the failpoint (see the module docstring), or None.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        cluster_name: str,
        instance: str,
        uncaught_file: Path,
        kill_at: tuple[int, int] | None,
    ) -> None:
        super().__init__(engine, cluster_name=cluster_name)
        self.instance = instance
        self.uncaught_file = uncaught_file
        self.kill_at = kill_at
        self._uncaught_lock = threading.Lock()

    def apply(self, transaction: Transaction, session: Session) -> None:
        data = transaction.get_raw_data()
        session.execute(
            insert(applied_transactions).values(
                partition_id=transaction.partition_id,
                transaction_id=transaction.transaction_id,
                instance=self.instance,
                data_crc=zlib.crc32(data),
            )
        )
        if (
            self.kill_at is not None
            and transaction.partition_id == self.kill_at[0]
            and transaction.transaction_id >= self.kill_at[1]
        ):
            log.warning(
                "FAILPOINT partition=%d transaction=%d instance=%s: killing this process (SIGKILL) "
                "with the apply's database transaction open",
                transaction.partition_id,
                transaction.transaction_id,
                self.instance,
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        log.error(
            "uncaught exception applying partition %d transaction %d",
            partition_id,
            transaction_id,
            exc_info=exception,
        )
        with self._uncaught_lock, self.uncaught_file.open("a") as out:
            out.write(f"{partition_id} {transaction_id} {exception!r}\n")


class Instance:
    """The instance as a service for :func:`run_until_signalled` (start: mount; stop: close)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.engine = create_framework_engine(args.db)
        self.callbacks = AppliedTransactionsCallbacks(
            self.engine,
            cluster_name=args.cluster_name,
            instance=args.name,
            uncaught_file=Path(args.uncaught_file),
            kill_at=args.kill_at,
        )
        self.client: WaltzClient | None = None

    def _open(self) -> None:
        config = WaltzClientConfig(
            zookeeper_connect_string=self.args.zookeeper,
            cluster_root=self.args.root,
            zookeeper_session_timeout=10.0,
            client_max_apply_batch_size=MAX_APPLY_BATCH,
            client_apply_linger=APPLY_LINGER,
        )
        self.client = WaltzClient(self.callbacks, config)
        self.client.wait_mounted(timeout=60)
        log.info("instance %s: all %d partitions mounted", self.args.name, self.client.num_partitions)
        Path(self.args.ready_file).touch()

    def _close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.engine.dispose()
        log.info("instance %s: closed", self.args.name)

    async def start(self) -> None:
        await asyncio.to_thread(self._open)

    async def stop(self) -> None:
        await asyncio.to_thread(self._close)


def _kill_at(text: str) -> tuple[int, int]:
    try:
        partition, transaction = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--kill-at takes PARTITION:TRANSACTION, got {text!r}") from None
    return partition, transaction


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="SQLAlchemy URL of the shared database")
    parser.add_argument("--zookeeper", required=True, help="ZooKeeper connect string")
    parser.add_argument("--root", required=True, help="the Waltz cluster root znode")
    parser.add_argument("--cluster-name", required=True, help="the log's name in waltz_high_water_marks")
    parser.add_argument("--name", required=True, help="this instance's name")
    parser.add_argument("--ready-file", required=True, help="created once every partition is mounted")
    parser.add_argument("--uncaught-file", required=True, help="a line per uncaught_exception call")
    parser.add_argument("--kill-at", type=_kill_at, default=None, metavar="PARTITION:TRANSACTION")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("waltz", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run_until_signalled(Instance(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
