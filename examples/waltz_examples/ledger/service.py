"""``LedgerService``: one application instance of the ledger (a Waltz client, its database, a sweeper).

Several instances share one database; each mounts every partition and applies every transaction
through :class:`LedgerCallbacks` (the SQL framework's change-set callbacks plus one row per applied
change-set in ``ledger_applied_transactions``, for the exactly-once check: one per transaction,
one per member of a batched one). Operations are submitted as transaction contexts, one log
transaction each, or through an :class:`~waltz.jdbc_style.EntityBatcher` (``batch=True``: those
ready for a partition while its last log transaction is in flight go as one, docs/sql.md
"Batching entity transactions"); those between customers of different partitions become two-step
transfers (``transfers.py``) that every instance's sweeper moves forward.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, column, insert, table
from sqlalchemy.orm import Session

from waltz import Outcome as SubmitOutcome
from waltz import WaltzClient, WaltzClientConfig
from waltz.client.transaction import Transaction
from waltz.jdbc_style import (
    ApplySession,
    ChangeSet,
    ChangeSetCallbacks,
    EntityBatcher,
    create_framework_engine,
)
from waltz.jdbc_style import migrations_api as framework_migrations
from waltz_examples.ledger import migrations_api
from waltz_examples.ledger.models import Checking, Savings, applied_transactions, by_customer, registry
from waltz_examples.ledger.operations import (
    Amalgamate,
    Deactivate,
    DepositChecking,
    LedgerOperation,
    OpenAccount,
    SendPayment,
    TransactSavings,
    Withdraw,
    WriteCheck,
)
from waltz_examples.ledger.releases import CURRENT, LedgerRelease
from waltz_examples.ledger.transfers import DebitForTransfer, Sweeper, TransferKind

__all__ = ["LedgerCallbacks", "LedgerService", "Outcome", "prepare_database"]

log = logging.getLogger(__name__)

#: The record of an applied change-set, built once: staged, a group's records are sent with its
#: other writes, one execution per record (only the framework's own change-set statements go as
#: one statement over arrays: docs/design/sql.md "Rows of one shape in one statement").
RECORD_APPLIED = insert(applied_transactions)
#: The record of an earlier release, whose table has no ``member`` (``releases.py``): the columns
#: it has, and nothing the server fills read back.
RECORD_APPLIED_BY_TRANSACTION = insert(
    table(applied_transactions.name, *(column(c) for c in ("partition_id", "transaction_id", "op", "delta")))
)


class LedgerCallbacks(ChangeSetCallbacks):
    """Change-set callbacks that also record each applied change-set (op and delta from its meta):
    one row per transaction, one per member of a batched transaction (docs/design/sql.md
    "Batched change-sets"), keyed by ``(partition_id, transaction_id, member)``.

    The override writes only ``applied_transactions``, no entity's table: the entity cache stays
    on (``entity_cache=True`` unless the caller says otherwise).

    Args:
        engine: the application database.
        records_members: write the column ``member`` (release 4 on; an earlier release's table
            has no such column, ``releases.py``).
        kwargs: the other arguments of :class:`~waltz.jdbc_style.ChangeSetCallbacks`.
    """

    def __init__(self, engine: Engine, *, records_members: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("entity_cache", True)
        super().__init__(engine, **kwargs)
        self.records_members = records_members
        self._record = RECORD_APPLIED if records_members else RECORD_APPLIED_BY_TRANSACTION

    def apply_change_set(self, change_set: ChangeSet, transaction: Transaction, session: Session) -> None:
        super().apply_change_set(change_set, transaction, session)
        record = {
            "partition_id": transaction.partition_id,
            "transaction_id": transaction.transaction_id,
            "op": str(change_set.meta.get("op", "?"))[:24],
            "delta": int(change_set.meta.get("delta", 0)),
        }
        if self.records_members:
            record["member"] = self.member_index(transaction)
        if isinstance(session, ApplySession):  # with the group's other writes (docs/sql.md)
            session.stage(self._record, record)
        else:
            session.execute(self._record, record)


def prepare_database(url_or_engine: str | Engine, release: LedgerRelease = CURRENT) -> Engine:
    """Create or upgrade the framework's and the ledger's tables (both alembic), the ledger's to
    the revision ``release`` runs on (``releases.py``; default: this code's); returns the engine."""
    engine = create_framework_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    framework_migrations.upgrade(engine)
    migrations_api.upgrade(engine, release.revision)
    return engine


@dataclass(frozen=True, slots=True)
class Outcome:
    """The end of an operation.

    Attributes:
        committed: True when its transaction is in the log.
        transaction_id: its ID (None unless committed).
        partition_id: its partition.
        reason: why it was dropped (None when committed).
        lock_failures: attempts refused by the lock check (each retried).
        transfer_id: for a transfer across partitions, the transfer's ID (its debit committed;
            the credit follows asynchronously).
    """

    committed: bool
    transaction_id: int | None
    partition_id: int
    reason: str | None
    lock_failures: int
    transfer_id: str | None = None


class LedgerService:
    """One instance of the ledger service.

    Args:
        db_url: the shared application database (SQLAlchemy URL).
        zookeeper: ZooKeeper connect string of the Waltz cluster.
        cluster_root: the cluster's root znode.
        cluster_name: the log's name in the database's mark rows.
        client_settings: more ``WaltzClientConfig`` fields (e.g. ``client_max_apply_batch_size``).
        sweep_interval: seconds between outbox scans (None: no sweeper in this instance).
        prepare: run the migrations at start (several instances may; they are idempotent).
        partitions: mount only these partitions (partition-routed instances: requests for a
            customer go to an instance mounting its partition, each partition is applied by
            the instances mounting it, and the sweeper moves only the steps of these
            partitions). None: every partition.
        entity_cache: keep entity rows as the applies leave them, so that operations read them
            without a database snapshot (``ChangeSetCallbacks``' ``entity_cache``).
        release: the ledger release it runs (``releases.py``; default: this code's): its
            ``Account`` model. Its database must be at that release's revision.
        batch: submit through an :class:`~waltz.jdbc_style.EntityBatcher` (docs/sql.md,
            "Batching entity transactions"): operations ready for a partition while its last log
            transaction is in flight go together as one. Only a release that records members.

    Raises:
        ValueError: ``batch`` with a release that does not record a batch's members, or
            ``partitions`` that do not exist.
    """

    def __init__(
        self,
        db_url: str,
        *,
        zookeeper: str,
        cluster_root: str,
        cluster_name: str = "ledger",
        client_settings: Mapping[str, Any] | None = None,
        sweep_interval: float | None = 0.5,
        prepare: bool = True,
        partitions: Collection[int] | None = None,
        entity_cache: bool = True,
        release: LedgerRelease = CURRENT,
        batch: bool = False,
    ) -> None:
        if batch and not release.records_members:
            raise ValueError(f"ledger release {release.number} cannot batch: it records no batch members")
        self.engine = create_framework_engine(db_url)
        self.release = release
        if prepare:
            prepare_database(self.engine, release)
        self.callbacks = LedgerCallbacks(
            self.engine,
            cluster_name=cluster_name,
            registry=registry(release.account),
            entity_cache=entity_cache,
            records_members=release.records_members,
        )
        settings: dict[str, Any] = {"client_max_apply_batch_size": 50, **(client_settings or {})}
        self.partitions: frozenset[int] | None = None if partitions is None else frozenset(partitions)
        if self.partitions is not None:
            settings["client_auto_mount"] = False
        config = WaltzClientConfig(zookeeper_connect_string=zookeeper, cluster_root=cluster_root, **settings)
        self.client = WaltzClient(self.callbacks, config)
        if self.partitions is not None:
            outside = sorted(p for p in self.partitions if not 0 <= p < self.client.num_partitions)
            if outside:
                self.client.close()
                raise ValueError(f"partitions {outside} do not exist (0..{self.client.num_partitions - 1})")
            self.client.set_partitions(self.partitions)
        self.batcher = EntityBatcher(self.client) if batch else None
        self.sweeper: Sweeper | None = None
        if sweep_interval is not None:
            owns = None if self.partitions is None else self.owns_customer
            self.sweeper = Sweeper(
                self.callbacks,
                self.submit,
                interval=sweep_interval,
                owns=owns,
                partition_of=self.partition_of,
            )
            self.sweeper.start()

    @classmethod
    def from_config(cls, db_url: str, config: WaltzClientConfig, **options: Any) -> LedgerService:
        """An instance whose client has ``config``: the cluster, its credentials, client settings.

        Args:
            db_url: the shared application database (SQLAlchemy URL).
            config: the client's configuration (its explicitly set fields; the ledger's default
                ``client_max_apply_batch_size`` of 50 stands unless it sets one).
            options: the other keyword arguments of :class:`LedgerService` (``cluster_name``,
                ``sweep_interval``, ``prepare``, ``partitions``, ``entity_cache``, ``release``,
                ``batch``).
        """
        settings = config.model_dump(exclude_unset=True)
        settings.pop("zookeeper_connect_string", None)
        settings.pop("cluster_root", None)
        return cls(
            db_url,
            zookeeper=config.zookeeper_connect_string,
            cluster_root=config.cluster_root,
            client_settings=settings,
            **options,
        )

    def __enter__(self) -> LedgerService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the sweeper, close the batcher and the client, dispose of the engine. Idempotent."""
        if self.sweeper is not None:
            self.sweeper.close()
        if self.batcher is not None:
            self.batcher.close()
        self.client.close()
        self.engine.dispose()

    @property
    def num_partitions(self) -> int:
        """The log's partitions."""
        return self.client.num_partitions

    def partition_of(self, custid: int) -> int:
        """The partition of a customer's entities."""
        return by_customer((custid,), self.num_partitions)

    def owns_customer(self, custid: int) -> bool:
        """Whether this instance mounts the customer's partition (can submit its transactions)."""
        return self.partitions is None or self.partition_of(custid) in self.partitions

    # --- submitting --------------------------------------------------------------------------------

    def submit(self, operation: LedgerOperation) -> Future[SubmitOutcome]:
        """Submit an operation, through the batcher when the service batches; the future gives
        its outcome (committed with its transaction ID, a batch's for a member of one, or
        dropped with the rule's reason)."""
        if self.batcher is not None:
            return self.batcher.submit(operation)
        return self.client.submit(operation)

    def batch_counts(self) -> tuple[int, int]:
        """``(batches, members)``: log transactions of more than one operation its batcher
        committed, and the operations they carried (``(0, 0)`` without a batcher)."""
        batcher = self.batcher
        return (0, 0) if batcher is None else (batcher.batches, batcher.batched)

    def run(
        self, operation: LedgerOperation, timeout: float = 60.0, transfer_id: str | None = None
    ) -> Outcome:
        """Submit an operation and wait for its end."""
        submitted = self.submit(operation).result(timeout)
        return Outcome(
            committed=submitted.committed,
            transaction_id=submitted.transaction_id if submitted.committed else None,
            partition_id=operation.chosen_partition,
            reason=operation.reason,
            lock_failures=operation.lock_failures,
            transfer_id=transfer_id,
        )

    def payment(self, from_custid: int, to_custid: int, amount: int) -> LedgerOperation:
        """SendPayment: one transaction within a partition, a two-step transfer across."""
        if self.partition_of(from_custid) == self.partition_of(to_custid):
            return SendPayment(self.callbacks, from_custid, to_custid, amount)
        return DebitForTransfer(self.callbacks, from_custid, to_custid, amount, TransferKind.PAYMENT)

    def amalgamate_operation(self, custid0: int, custid1: int) -> LedgerOperation:
        """Amalgamate: one transaction within a partition, a two-step transfer across."""
        if self.partition_of(custid0) == self.partition_of(custid1):
            return Amalgamate(self.callbacks, custid0, custid1)
        return DebitForTransfer(self.callbacks, custid0, custid1, 0, TransferKind.AMALGAMATE)

    # --- the bank demo's operations ----------------------------------------------------------------

    def open_account(self, custid: int, name: str, savings: int = 0, checking: int = 0) -> Outcome:
        """Open an account with initial balances (cents)."""
        return self.run(OpenAccount(self.callbacks, custid, name, savings, checking))

    def deposit(self, custid: int, amount: int) -> Outcome:
        """Deposit into checking."""
        return self.run(DepositChecking(self.callbacks, custid, amount))

    def withdraw(self, custid: int, amount: int) -> Outcome:
        """Withdraw from checking (refused when the balance is lower)."""
        return self.run(Withdraw(self.callbacks, custid, amount))

    def transact_savings(self, custid: int, amount: int) -> Outcome:
        """Add to (or, negative, take from) savings; never below zero."""
        return self.run(TransactSavings(self.callbacks, custid, amount))

    def write_check(self, custid: int, amount: int) -> Outcome:
        """Write a check against checking (overdraft penalty of 1 when savings + checking < amount)."""
        return self.run(WriteCheck(self.callbacks, custid, amount))

    def transfer(self, from_custid: int, to_custid: int, amount: int) -> Outcome:
        """Pay from one customer's checking to another's (two-step across partitions).

        Every call is a new payment (across partitions, under a new transfer ID): a call retried
        after a timeout whose first attempt committed pays twice (the ledger has no request IDs;
        see its README, and the wallet example's ``request_id`` for applying a request once).
        """
        operation = self.payment(from_custid, to_custid, amount)
        transfer_id = operation.transfer_id if isinstance(operation, DebitForTransfer) else None
        return self.run(operation, transfer_id=transfer_id)

    def amalgamate(self, custid0: int, custid1: int) -> Outcome:
        """Move all of ``custid0``'s money to ``custid1``'s checking."""
        operation = self.amalgamate_operation(custid0, custid1)
        transfer_id = operation.transfer_id if isinstance(operation, DebitForTransfer) else None
        return self.run(operation, transfer_id=transfer_id)

    def deactivate(self, custid: int) -> Outcome:
        """Close an account."""
        return self.run(Deactivate(self.callbacks, custid))

    def balance(self, custid: int, wait_for: Outcome | None = None, timeout: float = 30.0) -> tuple[int, int]:
        """SmallBank Balance: ``(savings, checking)`` in cents, both as of one position of the
        customer's partition: from the entity cache when it holds them (commits absorbed, maybe
        not yet applied to this database), else from this database.

        Args:
            custid: the customer.
            wait_for: an outcome of this service to read after (read-your-writes).
            timeout: seconds to wait for it.

        Raises:
            KeyError: no such customer.
            TimeoutError: ``wait_for`` was not applied in time.
        """
        partition_id = self.partition_of(custid)
        after = wait_for.transaction_id if wait_for is not None else None
        if wait_for is not None and after is not None and wait_for.partition_id != partition_id:
            # Another partition's transaction (a transfer's debit): applied there first.
            if not self.callbacks.wait_for(wait_for.partition_id, after, timeout):
                raise TimeoutError(f"transaction {after} not applied within {timeout}s")
            after = None
        # One read: both balances of one moment (two would straddle a transaction that moves money
        # between them, e.g. an Amalgamate, and could count it twice or not at all).
        savings, checking = self.callbacks.read_entities(
            [(Savings, custid), (Checking, custid)],
            num_partitions=self.num_partitions,
            after=after,
            timeout=timeout,
        ).entities
        if savings is None or checking is None:
            raise KeyError(f"customer {custid} has no account")
        return int(savings.balance), int(checking.balance)
