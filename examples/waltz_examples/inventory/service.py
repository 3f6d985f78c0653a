"""``InventoryService``: one instance of the inventory (a Waltz client, its database), and
``INVENTORY``, the inventory as ``waltz perf inventory`` drives it.

Several instances share one database; each mounts every partition and applies every transaction
through the SQL framework's change-set callbacks. A request reserves units of a SKU under the
caller's idempotency key (:class:`~waltz_examples.inventory.models.Reserve`): submit it to any
instance, and submit it again with the same key when its answer was lost. Partition-routed
instances (``partitions``) each mount a share of the partitions instead; a router then sends a
SKU's requests to the instance of its partition (:meth:`InventoryService.partition_of`), where
they queue behind each other instead of failing other instances' lock checks.

``INVENTORY`` maps the interface of :mod:`waltz.workloads.inventory` (docs/design/overview.md,
"Workloads") onto this service: its instances, and the state the checks read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from concurrent.futures import Future

from sqlalchemy import Engine, select

from waltz import Outcome, WaltzClient, WaltzClientConfig
from waltz.jdbc_style import ChangeSetCallbacks, EntityBatcher, EntityRegistry, create_framework_engine
from waltz.jdbc_style import migrations_api as framework_migrations
from waltz.workloads.inventory import InventoryApplication, InventoryState
from waltz_examples.inventory.models import (
    Base,
    InventoryContext,
    Reservation,
    Reserve,
    SetStock,
    Sku,
    by_sku,
)

__all__ = ["INVENTORY", "InventoryApp", "InventoryService", "inventory_state", "prepare_database"]


def prepare_database(url_or_engine: str | Engine) -> Engine:
    """Create or upgrade the framework's tables and create the inventory's (idempotent); returns
    the engine."""
    engine = create_framework_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    framework_migrations.upgrade(engine)
    Base.metadata.create_all(engine)
    return engine


class InventoryService:
    """One instance of the inventory service; a context manager (``close`` on exit).

    Args:
        db_url: the shared application database (SQLAlchemy URL), prepared (:func:`prepare_database`).
        config: its Waltz client's configuration.
        cluster_name: the log's name in the database's mark rows.
        entity_cache: keep entity rows as the applies leave them (docs/sql.md); a change-set with
            an idempotency key's rows are kept once its apply recorded the key first
            (docs/design/sql.md, "The entity cache").
        batch: submit through an :class:`~waltz.jdbc_style.EntityBatcher`: reservations ready for
            a SKU's partition while its last log transaction is in flight go together as one
            (docs/sql.md, "Batching entity transactions").
        partitions: mount only these partitions (``client.autoMount`` off): a partition-routed
            instance, sent only the requests of SKUs of these partitions by a router in front of
            the service (docs/sql.md, "Applying the log exactly once": several instances). None:
            every partition.

    Raises:
        ValueError: a partition of ``partitions`` does not exist.
    """

    def __init__(
        self,
        db_url: str,
        config: WaltzClientConfig,
        *,
        cluster_name: str = "inventory",
        entity_cache: bool = True,
        batch: bool = False,
        partitions: Collection[int] | None = None,
    ) -> None:
        self.engine = create_framework_engine(db_url)
        self.callbacks = ChangeSetCallbacks(
            self.engine,
            cluster_name=cluster_name,
            registry=EntityRegistry.from_base(Base),
            entity_cache=entity_cache,
        )
        self.batcher: EntityBatcher | None = None
        if partitions is not None:
            config = config.model_copy(update={"client_auto_mount": False})
        try:
            self.client = WaltzClient(self.callbacks, config)
        except BaseException:
            self.engine.dispose()
            raise
        if partitions is not None:
            try:
                count = self.client.num_partitions
                outside = sorted(p for p in partitions if not 0 <= p < count)
                if outside:
                    raise ValueError(f"partitions {outside} do not exist (0..{count - 1})")
                self.client.set_partitions(partitions)
            except BaseException:
                self.close()
                raise
        self.batcher = EntityBatcher(self.client) if batch else None

    def partition_of(self, sku_id: int) -> int:
        """The partition of a SKU's entities (its row and its reservations): the instance a
        router sends the SKU's requests to, when the instances are partition-routed."""
        return by_sku((sku_id,), self.client.num_partitions)

    def __enter__(self) -> InventoryService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the batcher and the client and dispose of the engine. Idempotent."""
        if self.batcher is not None:
            self.batcher.close()
        self.client.close()
        self.engine.dispose()

    def set_stock(self, sku_id: int, stock: int) -> SetStock:
        """A :class:`SetStock` for :meth:`submit`."""
        return SetStock(self.callbacks, sku_id, stock)

    def reservation(self, sku_id: int, quantity: int, idempotency_key: str) -> Reserve:
        """A :class:`Reserve` for :meth:`submit` (a new reservation ID each call)."""
        return Reserve(self.callbacks, sku_id, quantity, idempotency_key)

    def submit(self, operation: InventoryContext) -> Future[Outcome]:
        """Submit an operation; its future gives the outcome: committed, dropped with the rule's
        reason (``outcome.reason``), or already applied with the earlier transaction."""
        if self.batcher is not None:
            return self.batcher.submit(operation)
        return self.client.submit(operation)

    def batch_counts(self) -> tuple[int, int]:
        """``(batches, members)`` its batcher committed (``(0, 0)`` without one)."""
        batcher = self.batcher
        return (0, 0) if batcher is None else (batcher.batches, batcher.batched)

    def reserve(self, sku_id: int, quantity: int, idempotency_key: str, timeout: float = 60.0) -> Outcome:
        """Reserve units of a SKU and wait for the outcome (see :class:`Reserve`)."""
        return self.submit(self.reservation(sku_id, quantity, idempotency_key)).result(timeout)

    def available(self, sku_id: int, after: int | None = None, timeout: float = 30.0) -> int | None:
        """Units of a SKU left to reserve (None: no such SKU), once transaction ``after`` of its
        partition is applied here when given."""
        read = self.callbacks.read_entities(
            [(Sku, sku_id)], num_partitions=self.client.num_partitions, after=after, timeout=timeout
        )
        sku = read.entities[0]
        return None if sku is None else int(sku.stock - sku.reserved)


def inventory_state(engine: Engine) -> InventoryState:
    """The SKUs and reservations a database holds, as the checks of
    :mod:`waltz.workloads.inventory` read them."""
    digest = hashlib.sha256()
    with engine.connect() as conn:
        skus: dict[int, tuple[int, int]] = {}
        for sku_id, stock, reserved in conn.execute(
            select(Sku.sku_id, Sku.stock, Sku.reserved).order_by(Sku.sku_id)
        ):
            skus[int(sku_id)] = (int(stock), int(reserved))
            digest.update(f"sku {sku_id} {stock} {reserved}\n".encode())
        by_sku: dict[int, int] = {}
        keys: dict[str, int] = {}
        rows = conn.execute(
            select(
                Reservation.sku_id,
                Reservation.reservation_id,
                Reservation.quantity,
                Reservation.idempotency_key,
            ).order_by(Reservation.sku_id, Reservation.reservation_id)
        )
        count = 0
        for sku_id, reservation_id, quantity, key in rows:
            count += 1
            by_sku[int(sku_id)] = by_sku.get(int(sku_id), 0) + int(quantity)
            keys[key] = keys.get(key, 0) + 1
            digest.update(f"reservation {sku_id} {reservation_id} {quantity} {key}\n".encode())
    return InventoryState(
        skus=skus,
        reserved_by_sku=by_sku,
        reservations=count,
        repeated_keys={k: n for k, n in keys.items() if n > 1},
        digest=digest.hexdigest(),
    )


class InventoryApp:
    """The inventory as ``waltz perf inventory`` finds it (``--app waltz_examples.inventory``)."""

    name = "inventory"
    tables = frozenset(Base.metadata.tables)

    def prepare_database(self, engine: Engine) -> None:
        """The framework's migrations and the inventory's tables."""
        prepare_database(engine)

    def instance(
        self,
        db_url: str,
        config: WaltzClientConfig,
        *,
        cluster_name: str,
        entity_cache: bool = True,
        batch: bool = False,
        partitions: Collection[int] | None = None,
    ) -> InventoryService:
        """An :class:`InventoryService`."""
        return InventoryService(
            db_url,
            config,
            cluster_name=cluster_name,
            entity_cache=entity_cache,
            batch=batch,
            partitions=partitions,
        )

    def state(self, engine: Engine) -> InventoryState:
        """:func:`inventory_state`."""
        return inventory_state(engine)


#: The inventory as the tools find it.
INVENTORY: InventoryApplication = InventoryApp()
