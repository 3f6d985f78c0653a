"""The ledger as a SmallBank application: ``SMALLBANK``, what the tools drive.

``waltz demo``, ``waltz perf smallbank`` and ``waltz chaos --workload ledger`` run the SmallBank mix
against the application module given with ``--app`` (this one by default): they import
``SMALLBANK`` from here and use only the interface of :mod:`waltz.workloads.application`
(docs/design/overview.md, "Workloads"). This module maps that interface onto the ledger: an
instance is a :class:`~waltz_examples.ledger.service.LedgerService`, SmallBank's transactions are
its operations (two-step transfers between customers of two partitions), the pending steps are
its outbox, and its invariants are those of :mod:`waltz_examples.ledger.checks`. Its releases
(``releases.py``) make it an :class:`~waltz.workloads.application.EvolvingApplication`: the demo
starts on release 1 and deploys the others mid-run.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from waltz import Outcome, WaltzClient, WaltzClientConfig
from waltz.jdbc_style import ChangeSetCallbacks
from waltz.workloads.application import Release, SmallBankApplication
from waltz_examples.ledger import migrations_api
from waltz_examples.ledger.checks import LedgerInvariants, applied_transaction_ids
from waltz_examples.ledger.models import Base, registry
from waltz_examples.ledger.operations import (
    Deactivate,
    DepositChecking,
    LedgerOperation,
    OpenAccount,
    TransactSavings,
    WriteCheck,
)
from waltz_examples.ledger.releases import RELEASES
from waltz_examples.ledger.releases import release as ledger_release
from waltz_examples.ledger.service import LedgerService, prepare_database
from waltz_examples.ledger.transfers import pending_transfers

if TYPE_CHECKING:
    from waltz.spark.views import AppViews

__all__ = ["SMALLBANK", "LedgerApplication", "LedgerInstance"]


class LedgerInstance:
    """One :class:`LedgerService` as a SmallBank instance."""

    def __init__(self, service: LedgerService) -> None:
        self.service = service

    @property
    def client(self) -> WaltzClient:
        """The service's Waltz client."""
        return self.service.client

    @property
    def callbacks(self) -> ChangeSetCallbacks:
        """The service's change-set callbacks."""
        return self.service.callbacks

    def owns_customer(self, custid: int) -> bool:
        """Whether the service mounts the customer's partition."""
        return self.service.owns_customer(custid)

    def open_account(self, custid: int, name: str, savings: int, checking: int) -> LedgerOperation:
        """:class:`OpenAccount`."""
        return OpenAccount(self.service.callbacks, custid, name, savings, checking)

    def deposit_checking(self, custid: int, amount: int) -> LedgerOperation:
        """:class:`DepositChecking`."""
        return DepositChecking(self.service.callbacks, custid, amount)

    def transact_savings(self, custid: int, amount: int) -> LedgerOperation:
        """:class:`TransactSavings`."""
        return TransactSavings(self.service.callbacks, custid, amount)

    def write_check(self, custid: int, amount: int) -> LedgerOperation:
        """:class:`WriteCheck`."""
        return WriteCheck(self.service.callbacks, custid, amount)

    def send_payment(self, from_custid: int, to_custid: int, amount: int) -> LedgerOperation:
        """SendPayment, or the debit of a transfer across partitions."""
        return self.service.payment(from_custid, to_custid, amount)

    def amalgamate(self, custid0: int, custid1: int) -> LedgerOperation:
        """Amalgamate, or the debit of a transfer across partitions."""
        return self.service.amalgamate_operation(custid0, custid1)

    def close_account(self, custid: int) -> LedgerOperation:
        """:class:`Deactivate`."""
        return Deactivate(self.service.callbacks, custid)

    def balance(self, custid: int) -> tuple[int, int]:
        """The service's Balance read (raises KeyError for a customer without an account)."""
        return self.service.balance(custid)

    def submit(self, operation: LedgerOperation) -> Future[Outcome]:
        """Submit an operation to the service."""
        return self.service.submit(operation)

    def batch_counts(self) -> tuple[int, int]:
        """``(batches, members)`` the service's batcher committed (``(0, 0)`` without one)."""
        return self.service.batch_counts()

    def close(self) -> None:
        """Close the service."""
        self.service.close()


class LedgerApplication:
    """The ledger as a SmallBank application (see the module docstring)."""

    name = "ledger"
    tables = frozenset(Base.metadata.tables) | {migrations_api.VERSION_TABLE}

    def prepare_database(self, engine: Engine) -> None:
        """Run the framework's and the ledger's migrations."""
        prepare_database(engine)

    def instance(
        self,
        db_url: str,
        config: WaltzClientConfig,
        *,
        cluster_name: str,
        sweep_interval: float | None,
        partitions: Collection[int] | None = None,
        entity_cache: bool = True,
        batch: bool = False,
    ) -> LedgerInstance:
        """A :class:`LedgerService` with the configuration's client settings; its sweeper scans
        every ``sweep_interval`` seconds (None: no sweeper); with ``batch``, it submits through
        an ``EntityBatcher`` (docs/sql.md, "Batching entity transactions")."""
        service = LedgerService.from_config(
            db_url,
            config,
            cluster_name=cluster_name,
            sweep_interval=sweep_interval,
            prepare=False,
            partitions=partitions,
            entity_cache=entity_cache,
            batch=batch,
        )
        return LedgerInstance(service)

    def releases(self) -> Sequence[Release]:
        """The ledger's releases (``releases.py``)."""
        return [Release(r.number, r.change, r.rolls) for r in RELEASES]

    def prepare_release(self, engine: Engine, release: int) -> None:
        """Run the framework's migrations and the ledger's up to what ``release`` runs on."""
        prepare_database(engine, ledger_release(release))

    def release_instance(
        self,
        release: int,
        db_url: str,
        config: WaltzClientConfig,
        *,
        cluster_name: str,
        sweep_interval: float | None,
    ) -> LedgerInstance:
        """A :class:`LedgerService` of a release, mounting every partition."""
        service = LedgerService.from_config(
            db_url,
            config,
            cluster_name=cluster_name,
            sweep_interval=sweep_interval,
            prepare=False,
            release=ledger_release(release),
        )
        return LedgerInstance(service)

    def schema_versions(self) -> dict[str, int]:
        """The schema version of each of the ledger's entities."""
        return {info.name: info.schema_version for info in registry()}

    def pending_steps(self, engine: Engine) -> int:
        """Transfers whose outbox row is still pending."""
        return pending_transfers(engine)

    def applied_transactions(self, engine: Engine) -> dict[int, list[tuple[int, int]]]:
        """The applied ``(transaction, member)`` pairs the ledger recorded, by partition."""
        return applied_transaction_ids(engine)

    def invariants(self) -> LedgerInvariants:
        """Fresh :class:`LedgerInvariants`."""
        return LedgerInvariants()

    def views(self) -> AppViews:
        """The ledger's views (:mod:`waltz_examples.ledger.views`)."""
        from waltz_examples.ledger.views import VIEWS

        return VIEWS


#: The ledger as the tools find it (``--app waltz_examples.ledger``).
SMALLBANK: SmallBankApplication = LedgerApplication()
