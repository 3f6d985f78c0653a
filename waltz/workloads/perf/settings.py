"""The settings of a ``waltz perf smallbank`` or ``inventory`` run, and the bounds of their phases.

Part of :mod:`waltz.workloads.perf` (its module docstring describes the run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from waltz.workloads.application import DEFAULT_APPLICATION
from waltz.workloads.inventory import DEFAULT_INVENTORY_APPLICATION
from waltz.workloads.inventory_workload import InventoryConfig
from waltz.workloads.smallbank import SmallBankConfig

__all__ = [
    "APPLIED_TIMEOUT",
    "ERROR_SAMPLES",
    "PACED_IN_FLIGHT_SECONDS",
    "POPULATE_TIMEOUT",
    "QUIET_TIMEOUT",
    "START_TIMEOUT",
    "STOP_TIMEOUT",
    "SWEEP_INTERVAL",
    "UNPACED_IN_FLIGHT",
    "InventoryPerfSettings",
    "SmallBankPerfSettings",
    "default_in_flight",
    "routed_partitions",
    "routing_refusal",
]

#: Seconds an instance may take to start, mount every partition and warm up.
START_TIMEOUT = 120.0
#: Seconds the accounts' openings may take to commit and apply.
POPULATE_TIMEOUT = 120.0
#: Seconds an instance waits, after its mix, for its client to apply what it committed.
APPLIED_TIMEOUT = 60.0
#: Seconds the sweepers may take to finish every two-step transfer after the mix.
QUIET_TIMEOUT = 120.0
#: Seconds an instance may take to stop (flush its client, close), and the final applies.
STOP_TIMEOUT = 60.0
#: Seconds between the sweepers' outbox scans.
SWEEP_INTERVAL = 0.5
#: Error descriptions kept per instance and in the report.
ERROR_SAMPLES = 10
#: Transactions an unpaced run's instance keeps in flight by default (SmallBank, and inventory,
#: which is never paced): the peers' threads per process (benchmarks/peers, SmallBank and the hot
#: row), so that both are measured at one concurrency.
UNPACED_IN_FLIGHT = 21
#: Seconds of an instance's scheduled draws a paced run keeps in flight at most by default
#: (docs/decisions/0089-a-paced-run-keeps-a-tenth-of-a-second-of-draws-in-flight.md).
PACED_IN_FLIGHT_SECONDS = 0.1


def default_in_flight(rate: float | None, instances: int) -> int:
    """The SmallBank transactions each instance keeps in flight at most when the run does not say.

    Args:
        rate: the run's draws per second in all (None: unpaced, as fast as the cap allows).
        instances: the instance processes sharing ``rate`` (at least 1).

    Returns:
        :data:`UNPACED_IN_FLIGHT` for an unpaced run; for a paced one, a tenth of a second of each
        instance's draws (:data:`PACED_IN_FLIGHT_SECONDS`), rounded up, and never fewer than
        :data:`UNPACED_IN_FLIGHT`. The cap is the instance's admission control: below the
        schedule's need the driver holds draws back, which the run then counts as latency (and
        can fall behind its schedule for good); far above it, a stall's backlog is submitted at
        once into the stalled processes.
    """
    if rate is None:
        return UNPACED_IN_FLIGHT
    return max(UNPACED_IN_FLIGHT, math.ceil(rate / max(1, instances) * PACED_IN_FLIGHT_SECONDS))


@dataclass(frozen=True, slots=True)
class SmallBankPerfSettings:
    """A ``waltz perf smallbank`` run.

    Attributes:
        instances: instance processes, each with an instance of the application of its own.
        transactions: measured SmallBank draws in all (Balance reads included), split across the
            instances (the first ones take one more when it does not divide).
        accounts: SmallBank customers (at least 2), opened once before the measured phase.
        in_flight: SmallBank transactions each instance keeps submitted and unresolved at most
            (with ``batch`` several may share one log transaction; Balance reads not counted);
            0 (the default) is :func:`default_in_flight` of ``rate`` and ``instances``, which the
            settings then hold.
        submitters: threads per instance that submit (each runs a first attempt's reads).
        seed: the accounts' opening balances use it; instance ``i`` draws with ``seed + 1 + i``.
        timeout: seconds the measured phase may take.
        cluster_name: the log's name in the database's mark rows (None: the application's name).
        partition_routing: partition-routed instances: instance ``i`` of ``N`` mounts the
            partitions ``p`` with ``p mod N == i`` and submits the transactions of their
            customers (a request goes to the instance of its customer's partition), so each
            partition is applied by one instance. Off: every instance mounts every partition
            and submits for any customer (requests spread round-robin).
        entity_cache: the instances keep entity rows as their applies leave them (operations on
            cached entities read no database snapshot); off: every attempt reads a snapshot.
        batch: the instances submit through an ``EntityBatcher``: transactions ready for a
            partition while its last log transaction is in flight go as one batch
            (docs/design/sql.md "Batched entity transactions"); off: one log transaction each.
        rate: draws per second in all (Balance reads included), split evenly across the
            instances, each on a fixed schedule whose start times the latencies count from;
            None: as fast as ``in_flight`` allows.
        warm_up: draws each instance runs before the measured phase, as fast as ``in_flight``
            allows, counted nowhere, and applies before the phase starts: its first transactions
            open database connections and fill the entity cache, which a service that has been
            running has done (0: none).
        app: the SmallBank application's module (:func:`~waltz.workloads.application.load_application`).

    Raises:
        ValueError: a count below its minimum, or a timeout not above 0.
    """

    instances: int = 3
    transactions: int = 6000
    accounts: int = 200
    in_flight: int = 0
    submitters: int = SmallBankConfig.submitters
    seed: int = 7
    timeout: float = 600.0
    cluster_name: str | None = None
    partition_routing: bool = False
    entity_cache: bool = True
    batch: bool = False
    rate: float | None = None
    warm_up: int = 100
    app: str = DEFAULT_APPLICATION

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be above 0 draws per second, got {self.rate}")
        if self.in_flight == 0:  # the run's default; a frozen dataclass sets it this way
            object.__setattr__(self, "in_flight", default_in_flight(self.rate, self.instances))
        minimums = {
            "instances": 1,
            "transactions": 0,
            "accounts": 2,
            "in_flight": 1,
            "submitters": 1,
            "warm_up": 0,
        }
        for name, minimum in minimums.items():
            if getattr(self, name) < minimum:
                raise ValueError(f"{name} must be at least {minimum}, got {getattr(self, name)}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be above 0 seconds, got {self.timeout}")

    def shares(self) -> list[int]:
        """Each instance's draws (they add up to :attr:`transactions`)."""
        base, extra = divmod(self.transactions, self.instances)
        return [base + (1 if i < extra else 0) for i in range(self.instances)]

    def describe(self) -> str:
        """One line: instances, draws, accounts, concurrency, seed (and an application other than the
        default)."""
        share = self.shares()
        each = f"{share[0]:,}" if len(set(share)) == 1 else f"{min(share):,}-{max(share):,}"
        return (
            f"{self.instances} instance process(es) x {each} draws ({self.transactions:,} in all), "
            f"{self.accounts} accounts, {self.in_flight} in flight and {self.submitters} submitter(s) "
            f"per instance, seed {self.seed}"
            + (", partition-routed" if self.partition_routing else "")
            + ("" if self.entity_cache else ", no entity cache")
            + (", batched" if self.batch else "")
            + ("" if self.rate is None else f", {self.rate:,g} draws/s scheduled")
            + f", {self.warm_up:,} warm-up draws per instance"
            + ("" if self.app == DEFAULT_APPLICATION else f", application {self.app}")
        )

    def summary(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict."""
        return {
            "instances": self.instances,
            "transactions": self.transactions,
            "accounts": self.accounts,
            "in_flight": self.in_flight,
            "submitters": self.submitters,
            "seed": self.seed,
            "timeout": self.timeout,
            "partition_routing": self.partition_routing,
            "entity_cache": self.entity_cache,
            "batch": self.batch,
            "rate": self.rate,
            "app": self.app,
        }


def routed_partitions(index: int, instances: int, num_partitions: int) -> tuple[int, ...]:
    """The partitions partition-routed instance ``index`` of ``instances`` mounts: those ``p``
    with ``p mod instances == index`` (``waltz perf smallbank`` and ``inventory`` alike)."""
    return tuple(p for p in range(num_partitions) if p % instances == index)


def routing_refusal(instances: int, num_partitions: int) -> str | None:
    """Why partition routing cannot run ``instances`` instances on ``num_partitions`` partitions
    (more instances than partitions), or None."""
    if instances <= num_partitions:
        return None
    return (
        f"partition routing needs at most one instance per partition: {instances} instances, "
        f"{num_partitions} partitions"
    )


@dataclass(frozen=True, slots=True)
class InventoryPerfSettings:
    """A ``waltz perf inventory`` run.

    Attributes:
        instances: instance processes, each with an instance of the application of its own.
        transactions: reservation requests in all (retries not counted), split across the
            instances (the first ones take one more when it does not divide).
        skus: the hot SKUs every request draws from.
        stock: units of each SKU on hand at the start.
        max_quantity: each request reserves 1 to this many units.
        retry_fraction: share of requests sent again under the same idempotency key.
        in_flight: requests each instance keeps submitted and unresolved (retries besides).
        submitters: threads per instance that submit.
        seed: instance ``i`` draws with ``seed + 1 + i``.
        timeout: seconds the measured phase may take.
        entity_cache: the instances keep entity rows as their applies leave them.
        batch: the instances submit through an ``EntityBatcher``: requests ready for a partition
            while its last log transaction is in flight go as one batch (docs/design/sql.md
            "Batched entity transactions").
        warm_up: requests each instance sends before the measured phase, counted nowhere.
        cluster_name: the log's name in the mark rows (None: the application's name).
        app: the inventory application's module (:func:`load_inventory_application`).
        partition_routing: partition-routed instances: instance ``i`` of ``N`` mounts the
            partitions ``p`` with ``p mod N == i`` and takes the requests of their SKUs (a router
            in front of the service sends each request to the instance of its SKU's partition),
            so a hot SKU's requests queue in one client instead of failing the other instances'
            lock checks. The requests (:attr:`transactions`) and the requests in flight
            (``instances x in_flight``) are shared among the instances by the SKUs they own
            (:meth:`routed_shares`). Off: every instance mounts every partition and takes
            requests for any SKU.

    Raises:
        ValueError: a count below its minimum, a fraction outside 0..1, a timeout not above 0.
    """

    instances: int = 2
    transactions: int = 3000
    skus: int = 4
    stock: int = 1500
    max_quantity: int = 3
    retry_fraction: float = 0.1
    in_flight: int = UNPACED_IN_FLIGHT
    submitters: int = 4
    seed: int = 7
    timeout: float = 600.0
    entity_cache: bool = True
    batch: bool = False
    warm_up: int = 50
    cluster_name: str | None = None
    app: str = DEFAULT_INVENTORY_APPLICATION
    partition_routing: bool = False

    def __post_init__(self) -> None:
        minimums = {
            "instances": 1,
            "transactions": 0,
            "skus": 1,
            "stock": 0,
            "max_quantity": 1,
            "in_flight": 1,
            "submitters": 1,
            "warm_up": 0,
        }
        for name, minimum in minimums.items():
            if getattr(self, name) < minimum:
                raise ValueError(f"{name} must be at least {minimum}, got {getattr(self, name)}")
        if not 0.0 <= self.retry_fraction <= 1.0:
            raise ValueError(f"retry_fraction must be within 0..1, got {self.retry_fraction}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be above 0 seconds, got {self.timeout}")

    def shares(self) -> list[int]:
        """Each instance's requests (they add up to :attr:`transactions`)."""
        base, extra = divmod(self.transactions, self.instances)
        return [base + (1 if i < extra else 0) for i in range(self.instances)]

    def mounted(self, index: int, num_partitions: int) -> tuple[int, ...] | None:
        """The partitions instance ``index`` mounts: with :attr:`partition_routing` those ``p``
        with ``p mod instances == index``; None (every partition) without."""
        if not self.partition_routing:
            return None
        return routed_partitions(index, self.instances, num_partitions)

    def routed_shares(self, owned: list[tuple[int, ...]]) -> list[tuple[int, int]]:
        """Each instance's ``(requests, in_flight)`` when instance ``i`` owns the SKUs ``owned[i]``
        (:attr:`partition_routing`): both shared in proportion to the SKUs owned, since every
        request draws its SKU uniformly. Requests add up to :attr:`transactions` (largest
        remainders); requests in flight to ``instances x in_flight``, one to each instance that
        owns a SKU first and the rest in proportion (never fewer than the owners); an instance
        that owns none gets ``(0, 0)``.

        Raises:
            ValueError: ``owned`` has not one entry per instance, or no instance owns a SKU.
        """
        if len(owned) != self.instances:
            raise ValueError(f"owned: {len(owned)} entries for {self.instances} instances")
        counts = [len(skus) for skus in owned]
        total = sum(counts)
        if not total:
            raise ValueError("no instance owns a SKU")

        def share(amount: int) -> list[int]:
            exact = [amount * n / total for n in counts]
            parts = [int(x) for x in exact]
            order = sorted(range(len(exact)), key=lambda i: (parts[i] - exact[i], i))
            for i in order[: amount - sum(parts)]:
                parts[i] += 1
            return parts

        owners = [1 if n else 0 for n in counts]
        requests = share(self.transactions)
        rest = share(max(0, self.instances * self.in_flight - sum(owners)))
        in_flight = [o + r for o, r in zip(owners, rest, strict=True)]
        return list(zip(requests, in_flight, strict=True))

    def workload(
        self, index: int, run: str, sku_ids: tuple[int, ...] = (), in_flight: int | None = None
    ) -> InventoryConfig:
        """Instance ``index``'s workload parameters in run ``run`` (a token of the run): its keys
        are its own, ``<run>-i<index>-<n>``; a partition-routed instance draws among ``sku_ids``
        with ``in_flight`` requests in flight (its :meth:`routed_shares`)."""
        return InventoryConfig(
            skus=self.skus,
            max_quantity=self.max_quantity,
            retry_fraction=self.retry_fraction,
            in_flight=self.in_flight if in_flight is None else in_flight,
            submitters=self.submitters,
            seed=self.seed + 1 + index,
            key_prefix=f"{run}-i{index}",
            sku_ids=sku_ids,
        )

    def describe(self) -> str:
        """One line: instances, requests, SKUs and stock, retries, concurrency."""
        return (
            f"{self.instances} instance process(es), {self.transactions:,} requests in all, "
            f"{self.skus} SKU(s) of {self.stock:,} units, 1-{self.max_quantity} units each, "
            f"{self.retry_fraction:.0%} re-sent, {self.in_flight} in flight and {self.submitters} "
            f"submitter(s) per instance, seed {self.seed}, {self.warm_up:,} warm-up requests per instance"
            + ("" if self.entity_cache else ", no entity cache")
            + (", batched" if self.batch else "")
            + (", partition-routed" if self.partition_routing else "")
            + ("" if self.app == DEFAULT_INVENTORY_APPLICATION else f", application {self.app}")
        )

    def summary(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict."""
        return {
            name: getattr(self, name)
            for name in (
                "instances",
                "transactions",
                "skus",
                "stock",
                "max_quantity",
                "retry_fraction",
                "in_flight",
                "submitters",
                "seed",
                "timeout",
                "entity_cache",
                "batch",
                "warm_up",
                "app",
                "partition_routing",
            )
        }
