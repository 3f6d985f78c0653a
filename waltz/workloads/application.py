"""The interface a SmallBank application offers the workloads, and how the tools find one.

``waltz demo``, ``waltz perf smallbank`` and ``waltz chaos --workload ledger`` drive any
application that implements :class:`SmallBankApplication` (docs/design/overview.md,
"Workloads"). An application module defines ``SMALLBANK``, an object of that interface, in
``<module>.smallbank`` or in ``<module>`` itself; the tools take the module's name (``--app``),
the ledger example's by default, and :func:`load_application` imports it. The library never
imports an application: it finds one by name.

Two objects make the interface:

- :class:`SmallBankApplication`, one per application: it prepares a database, builds instances,
  and says what its database holds (pending steps, applied transactions, its own invariants);
- :class:`SmallBankInstance`, one running instance (a Waltz client and its SQL callbacks): it
  builds SmallBank's transactions (:class:`SmallBankOperation`), submits them and reads balances.

An instance is what a deployment runs several of, each in a process of its own, on one shared
database; the workload spreads its draws over them.

An application whose models changed may also be an :class:`EvolvingApplication`: it keeps its
earlier :class:`Release` s, so that ``waltz demo`` starts on the first and rolls the instances
forward mid-run (docs/sql.md, "Changing a model").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from waltz.app_modules import find_app_object

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from waltz.client import WaltzClient, WaltzClientConfig
    from waltz.client.outcome import Outcome
    from waltz.jdbc_style import ChangeSet, ChangeSetCallbacks
    from waltz.spark.views import AppViews

__all__ = [
    "DEFAULT_APPLICATION",
    "ChangeSetInvariants",
    "Check",
    "EvolvingApplication",
    "Invariants",
    "Release",
    "SmallBankApplication",
    "SmallBankInstance",
    "SmallBankOperation",
    "instance_batch_counts",
    "load_application",
]

#: The application the tools run when no ``--app`` is given: the ledger example.
DEFAULT_APPLICATION = "waltz_examples.ledger"


class SmallBankOperation(Protocol):
    """A transaction an instance built, as the workload sees it (the transaction context itself
    is the instance's own type: only that instance submits it).

    Attributes:
        op: the operation's name, e.g. ``deposit_checking``.
        reason: why its last attempt was dropped by the application's rules (None: not dropped).
        lock_failures: its attempts refused by a lock check (each retried by the client).
        chosen_partition: the partition it was submitted to.
    """

    @property
    def op(self) -> str: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def lock_failures(self) -> int: ...

    @property
    def chosen_partition(self) -> int: ...


class SmallBankInstance(Protocol):
    """One running instance of a SmallBank application (docs/design/overview.md, "Workloads").

    Customers are numbered ``0 .. accounts-1``; amounts are integer cents. The transactions
    SmallBank defines between two customers (SendPayment, Amalgamate) may join customers of two
    partitions: the instance then builds the first step of a transfer that its application
    finishes later (:meth:`SmallBankApplication.pending_steps`).

    Attributes:
        client: its Waltz client (mounting, marks, ``when_applied``, ``flush``).
        callbacks: its SQL framework callbacks (``wait_for``, ``uncaught_count``,
            ``cluster_name``, ``entity_cache``).
    """

    @property
    def client(self) -> WaltzClient: ...

    @property
    def callbacks(self) -> ChangeSetCallbacks: ...

    def owns_customer(self, custid: int) -> bool:
        """Whether this instance mounts the customer's partition (it can submit for them)."""
        ...

    def open_account(self, custid: int, name: str, savings: int, checking: int) -> SmallBankOperation:
        """Open a customer's account with opening balances."""
        ...

    def deposit_checking(self, custid: int, amount: int) -> SmallBankOperation:
        """SmallBank DepositChecking: checking += amount."""
        ...

    def transact_savings(self, custid: int, amount: int) -> SmallBankOperation:
        """SmallBank TransactSavings: savings += amount (negative: a withdrawal), never below zero."""
        ...

    def write_check(self, custid: int, amount: int) -> SmallBankOperation:
        """SmallBank WriteCheck: checking -= amount, with SmallBank's overdraft penalty."""
        ...

    def send_payment(self, from_custid: int, to_custid: int, amount: int) -> SmallBankOperation:
        """SmallBank SendPayment from one customer's checking to another's."""
        ...

    def amalgamate(self, custid0: int, custid1: int) -> SmallBankOperation:
        """SmallBank Amalgamate: all of ``custid0``'s money into ``custid1``'s checking."""
        ...

    def close_account(self, custid: int) -> SmallBankOperation:
        """Close a customer's account: later payments to it are refused or refunded."""
        ...

    def balance(self, custid: int) -> tuple[int, int]:
        """SmallBank Balance: ``(savings, checking)`` of one moment.

        Raises:
            KeyError: the customer has no account.
        """
        ...

    def submit(self, operation: Any) -> Future[Outcome]:
        """Submit an operation this instance built.

        Returns:
            A future of its :class:`~waltz.client.outcome.Outcome`: committed with its transaction
            ID, or dropped by the application's rules (with their reason).
        """
        ...

    def close(self) -> None:
        """Stop the instance: its client and everything it started. Idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class Check:
    """One check's verdict: its name, whether it passed, and what it found (the figures)."""

    name: str
    passed: bool
    detail: str


class Invariants(Protocol):
    """An application's own invariants, checked once a run is quiet (docs/design/overview.md,
    "Workloads"): the workload reads the log from the start and hands each change-set's ``meta``
    to :meth:`observe`, then asks for :meth:`checks` against the database."""

    def observe(self, meta: Mapping[str, Any]) -> None:
        """Take in the ``meta`` of one change-set of the log (one call at a time)."""
        ...

    def checks(self, engine: Engine) -> list[Check]:
        """The invariants' verdicts, once the log was observed up to the servers' high-water marks
        and the database applied it."""
        ...


@runtime_checkable
class ChangeSetInvariants(Invariants, Protocol):
    """Invariants that also take in the row changes of the log's read (docs/design/overview.md,
    "Workloads"): each change-set the live apply applies, so that they can replay the log into
    the rows it leaves and compare them with the database's."""

    def observe_change_set(self, partition_id: int, transaction_id: int, change_set: ChangeSet) -> None:
        """Take in one change-set of the log, as decoded (its row changes at the schema version
        they were written with), one call at a time, in log order within a partition; the members
        of a batch the live apply skips (an idempotency key repeated within the transaction) are
        not passed.

        Args:
            partition_id: the partition of its log transaction.
            transaction_id: that transaction's ID.
            change_set: the change-set (a member of a batch, or the transaction's only one).
        """
        ...


@runtime_checkable
class SmallBankApplication(Protocol):
    """A SmallBank application, as the tools find it: ``SMALLBANK`` of its module.

    Attributes:
        name: a short name: the default name of its log in the database's mark rows, of its
            SQLite file, and its word in the tools' messages (``ledger``).
        tables: the tables its own migrations make, their version table included (the SQL
            framework's tables are not in it).
    """

    @property
    def name(self) -> str: ...

    @property
    def tables(self) -> frozenset[str]: ...

    def prepare_database(self, engine: Engine) -> None:
        """Create or upgrade the framework's tables and its own (idempotent)."""
        ...

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
    ) -> SmallBankInstance:
        """Start an instance on a prepared database.

        Args:
            db_url: the shared database (SQLAlchemy URL).
            config: its Waltz client's configuration (the cluster, and client settings).
            cluster_name: the log's name in the database's mark rows.
            sweep_interval: seconds between its scans for pending cross-partition steps, which it
                then moves on; None: it moves none.
            partitions: mount only these partitions (a partition-routed instance); None: all.
            entity_cache: keep entity rows as the applies leave them (docs/sql.md).
            batch: submit through an ``EntityBatcher`` (docs/sql.md, "Batching entity
                transactions"); passed only when true, so an application that does not batch
                may leave it out.
        """
        ...

    def pending_steps(self, engine: Engine) -> int:
        """Cross-partition steps not finished yet (0: every transfer completed)."""
        ...

    def applied_transactions(self, engine: Engine) -> Mapping[int, Collection[int | tuple[int, int]]]:
        """The log transactions the database applied, by partition, from the application's own
        record of each apply (for the check that each was applied exactly once): a transaction
        ID per applied transaction, or a ``(transaction ID, member)`` pair per applied
        change-set when the application records the members of a batch (docs/design/sql.md
        "Batched change-sets"; the check then compares them with the log's members)."""
        ...

    def invariants(self) -> Invariants:
        """Fresh invariants for one check."""
        ...

    def views(self) -> AppViews:
        """Its views of the log, for a rebuild with Spark (``waltz rebuild --app``)."""
        ...


@dataclass(frozen=True, slots=True)
class Release:
    """One release of an application's code, as a deploy meets it (docs/sql.md, "Changing a model").

    Attributes:
        number: 1 for the first, then 2, 3, ...
        change: what it changes, one line ("" for the first).
        rolls: True when its instances replace the previous release's one at a time while the
            others keep running (its migration, if any, runs first and leaves the previous release
            working); False when every instance stops for its migration (e.g. a column renamed for
            good, which the previous release still uses).
    """

    number: int
    change: str = ""
    rolls: bool = True


@runtime_checkable
class EvolvingApplication(Protocol):
    """A SmallBank application that keeps its earlier releases, for a rolling deploy mid-run.

    ``waltz demo`` prepares the database for the first release, starts its instances on it, and
    moves to each next release while the mix runs (:mod:`waltz.workloads.rollout`).
    """

    def releases(self) -> Sequence[Release]:
        """Every release, oldest first; the last is the application's current code."""
        ...

    def prepare_release(self, engine: Engine, release: int) -> None:
        """Create or upgrade the framework's tables and its own to what ``release`` runs on."""
        ...

    def release_instance(
        self,
        release: int,
        db_url: str,
        config: WaltzClientConfig,
        *,
        cluster_name: str,
        sweep_interval: float | None,
    ) -> SmallBankInstance:
        """Start an instance of a release (as :meth:`SmallBankApplication.instance`, every
        partition mounted) on a database at that release's revision."""
        ...

    def schema_versions(self) -> Mapping[str, int]:
        """The current schema version of each of its entities (entity name -> version)."""
        ...


def instance_batch_counts(instance: object) -> tuple[int, int, int]:
    """What an instance's ``EntityBatcher`` committed (docs/design/sql.md "Batched entity transactions").

    Args:
        instance: a running instance (a :class:`SmallBankInstance`, or an inventory one) that
            may offer ``batch_counts()``, and a ``client`` (a ``WaltzClient``).

    Returns:
        ``(batches, members, lingered)``: its log transactions of more than one operation, the
        operations they carried, and the log transactions of its client's batchers that waited
        for the batch linger (the client's ``waltz_client_entity_batches_lingered_total``, read
        without registering it); ``(0, 0, 0)`` when it does not batch, or for an application
        written before batching, whose instances have no ``batch_counts`` (``lingered`` 0 for an
        instance without a ``client``).
    """
    counts = getattr(instance, "batch_counts", None)
    if counts is None:
        return (0, 0, 0)
    batches, members = counts()
    from waltz.jdbc_style.batch_metrics import counts_in  # an application that batches has it

    client = getattr(instance, "client", None)
    counted = None if client is None else counts_in(client.metrics)
    lingered = 0 if counted is None else counted.totals()[2]
    return (int(batches), int(members), lingered)


def load_application(module: str) -> SmallBankApplication:
    """Import a SmallBank application by its module's name.

    Looks for ``SMALLBANK`` in ``<module>.smallbank``, then in ``<module>``.

    Args:
        module: a module name, e.g. ``waltz_examples.ledger``.

    Returns:
        The application.

    Raises:
        ConfigurationError: no such module, or none of the two defines ``SMALLBANK`` as a
            :class:`SmallBankApplication`.
    """
    application: SmallBankApplication = find_app_object(
        module,
        "smallbank",
        "SMALLBANK",
        SmallBankApplication,
        "a SmallBank application, waltz.workloads.application.SmallBankApplication; e.g. "
        + DEFAULT_APPLICATION,
    )
    return application
