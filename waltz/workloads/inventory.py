"""The interface an inventory application offers ``waltz perf inventory``, and the checks of its state.

An inventory service is the first shape a user builds on the SQL framework: its instances reserve
stock of a few hot SKUs, each request carrying an idempotency key (docs/design/sql.md,
"Idempotency keys"). ``waltz perf inventory`` drives any application that implements
:class:`InventoryApplication`, found by its module's name as the SmallBank tools find theirs
(docs/design/overview.md, "Workloads"): ``INVENTORY`` in ``<module>.service`` or ``<module>``; the
default is the inventory example, ``waltz_examples.inventory``. The library never imports it.

Two objects make the interface:

- :class:`InventoryApplication`: prepares a database, starts instances, and reads the state the
  checks need (:class:`InventoryState`);
- :class:`InventoryInstance`: builds the transactions (setting a SKU's stock, reserving units of
  a SKU under a request's idempotency key) as transaction contexts and submits them.

The checks of a quiet run (:func:`inventory_checks`, :func:`replay_check`): no SKU oversold,
each SKU's ``reserved`` equal to the sum of its reservations, each idempotency key applied at most
once, one reservation per request that committed first, and a replay of the log into an empty
database holding the same SKUs and reservations.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from waltz.app_modules import find_app_object
from waltz.workloads.application import Check

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from waltz.client import WaltzClient, WaltzClientConfig
    from waltz.client.outcome import Outcome
    from waltz.jdbc_style import ChangeSetCallbacks

__all__ = [
    "DEFAULT_INVENTORY_APPLICATION",
    "InventoryApplication",
    "InventoryInstance",
    "InventoryOperation",
    "InventoryState",
    "inventory_checks",
    "load_inventory_application",
    "replay_check",
]

#: The application ``waltz perf inventory`` runs when no ``--app`` is given: the inventory example.
DEFAULT_INVENTORY_APPLICATION = "waltz_examples.inventory"


class InventoryOperation(Protocol):
    """A transaction an inventory instance built, as the workload sees it.

    Attributes:
        lock_failures: its attempts refused by a lock check (each retried by the client).
        chosen_partition: the partition it was submitted to.
    """

    @property
    def lock_failures(self) -> int: ...

    @property
    def chosen_partition(self) -> int: ...


class InventoryInstance(Protocol):
    """One running instance of an inventory application (a Waltz client and its SQL callbacks).

    SKUs are numbered ``0 .. skus-1``; quantities are whole units.

    Attributes:
        client: its Waltz client (mounting, marks, ``when_applied``, ``flush``).
        callbacks: its SQL framework callbacks (``wait_for``, ``uncaught_count``, ``entity_cache``).
    """

    @property
    def client(self) -> WaltzClient: ...

    @property
    def callbacks(self) -> ChangeSetCallbacks: ...

    def set_stock(self, sku_id: int, stock: int) -> InventoryOperation:
        """Set a SKU's stock on hand (creating the SKU with nothing reserved)."""
        ...

    def reservation(self, sku_id: int, quantity: int, idempotency_key: str) -> InventoryOperation:
        """Reserve ``quantity`` units of a SKU for the request ``idempotency_key``: dropped (refused)
        when fewer units are left; answered as already applied when the key was applied before."""
        ...

    def submit(self, operation: Any) -> Future[Outcome]:
        """Submit an operation this instance built; the future gives its
        :class:`~waltz.client.outcome.Outcome`."""
        ...

    def batch_counts(self) -> tuple[int, int]:
        """``(batches, members)``: log transactions of more than one operation this instance
        committed, and the operations they carried (``(0, 0)`` when it does not batch)."""
        ...

    def close(self) -> None:
        """Stop the instance: its client and everything it started. Idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class InventoryState:
    """What an inventory database holds, as the checks read it.

    Attributes:
        skus: SKU -> ``(stock, reserved)``.
        reserved_by_sku: SKU -> the sum of its reservations' quantities (SKUs with none absent).
        reservations: reservation rows.
        repeated_keys: idempotency keys carried by more than one reservation -> their rows.
        digest: a digest of every SKU and reservation row, in key order (equal states, equal
            digests: a replay compares it).
    """

    skus: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    reserved_by_sku: Mapping[int, int] = field(default_factory=dict)
    reservations: int = 0
    repeated_keys: Mapping[str, int] = field(default_factory=dict)
    digest: str = ""


@runtime_checkable
class InventoryApplication(Protocol):
    """An inventory application, as ``waltz perf inventory`` finds it: ``INVENTORY`` of its module.

    Attributes:
        name: a short name: the default name of its log in the mark rows and of its SQLite file.
        tables: the tables it makes (the SQL framework's are not in it).
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
        entity_cache: bool = True,
        batch: bool = False,
        partitions: Collection[int] | None = None,
    ) -> InventoryInstance:
        """Start an instance on a prepared database.

        Args:
            db_url: the shared database (SQLAlchemy URL).
            config: its Waltz client's configuration (the cluster, and client settings).
            cluster_name: the log's name in the database's mark rows.
            entity_cache: keep entity rows as the applies leave them (docs/sql.md).
            batch: submit through an ``EntityBatcher`` (docs/sql.md, "Batching entity
                transactions"); passed only when true, so an application that does not batch
                may leave it out.
            partitions: mount only these partitions (a partition-routed instance: docs/sql.md
                "Applying the log exactly once", several instances); passed only for ``waltz perf inventory
                --partition-routing``, so an application that is never routed may leave it out.
        """
        ...

    def state(self, engine: Engine) -> InventoryState:
        """The SKUs and reservations the database holds."""
        ...


def load_inventory_application(module: str) -> InventoryApplication:
    """Import an inventory application by its module's name: ``INVENTORY`` of ``<module>.service``,
    else of ``<module>``.

    Raises:
        ConfigurationError: no such module, or neither defines ``INVENTORY`` as an
            :class:`InventoryApplication`.
    """
    application: InventoryApplication = find_app_object(
        module,
        "service",
        "INVENTORY",
        InventoryApplication,
        "an inventory application, waltz.workloads.inventory.InventoryApplication; e.g. "
        + DEFAULT_INVENTORY_APPLICATION,
    )
    return application


def inventory_checks(state: InventoryState, first_commits: int | None = None) -> list[Check]:
    """The checks of an inventory database once every transaction is applied.

    Args:
        state: what the database holds.
        first_commits: requests whose first submission committed (each must have left exactly one
            reservation; a retry must leave none); None: not checked.

    Returns:
        No SKU oversold (``reserved <= stock``); each SKU's ``reserved`` equal to the sum of its
        reservations; each idempotency key applied at most once; and, with ``first_commits``, as
        many reservations as requests that committed first.
    """
    oversold = {
        sku: f"{reserved} of {stock}" for sku, (stock, reserved) in state.skus.items() if reserved > stock
    }
    mismatched = {
        sku: f"reserved {reserved}, reservations {state.reserved_by_sku.get(sku, 0)}"
        for sku, (_, reserved) in state.skus.items()
        if reserved != state.reserved_by_sku.get(sku, 0)
    }
    orphans = sorted(set(state.reserved_by_sku) - set(state.skus))
    if orphans:
        mismatched.update({sku: "reservations of no SKU" for sku in orphans})
    levels = ", ".join(f"{sku}: {reserved}/{stock}" for sku, (stock, reserved) in sorted(state.skus.items()))
    checks = [
        Check(
            "no SKU oversold (reserved <= stock)",
            not oversold,
            f"reserved/stock {levels}" if not oversold else f"oversold: {oversold}",
        ),
        Check(
            "each SKU's reserved = the sum of its reservations",
            not mismatched,
            f"{state.reservations} reservations" if not mismatched else f"differing: {mismatched}",
        ),
        Check(
            "each idempotency key applied at most once",
            not state.repeated_keys,
            f"{state.reservations} reservations, every key once"
            if not state.repeated_keys
            else f"{len(state.repeated_keys)} key(s) applied more than once, e.g. "
            + ", ".join(f"{k!r} x{n}" for k, n in sorted(state.repeated_keys.items())[:3]),
        ),
    ]
    if first_commits is not None:
        checks.append(
            Check(
                "one reservation per request committed (retries left none)",
                state.reservations == first_commits,
                # The database's: any warm-up's requests are in both counts.
                f"reservations {state.reservations}, requests committed {first_commits} (warm-up included)",
            )
        )
    return checks


def replay_check(state: InventoryState, replayed: InventoryState) -> Check:
    """Whether a replay of the log into an empty database (``replayed``) holds the same SKUs and
    reservations as the shared database (``state``): every database that applies the log makes
    the same choices, idempotency keys included (docs/design/sql.md, "Idempotency keys")."""
    same = state.digest == replayed.digest and state.skus == replayed.skus
    return Check(
        "a replay of the log into an empty database holds the same SKUs and reservations",
        same,
        f"{replayed.reservations} reservations, digest {replayed.digest[:12]}"
        if same
        else f"shared {state.reservations} reservations {dict(state.skus)}, "
        f"replay {replayed.reservations} {dict(replayed.skus)}",
    )
