"""``waltz perf inventory``: reservations of a few hot SKUs, each under an idempotency key, from N
instance processes of an inventory application sharing one database.

The logic lives in :mod:`waltz.workloads.perf.inventory_run` (imported inside the command); this
module parses options and prints the figures. Exit codes: 0 the run finished and every check
passed; 1 the run could not complete (an instance process failed, a phase timed out, the database
failed) or a check failed (an oversold SKU, a key applied twice, a replay that differs); 2 bad
options, an unusable database, ``--app`` naming no inventory application, or a cluster that could
not be reached or started.
"""

from __future__ import annotations

from typing import Annotated

import typer

from waltz.cli.options import (
    ClientConfigOption,
    JsonOption,
    LocalOption,
    LocalSecureOption,
    LocalServersOption,
    LocalStoragesOption,
    PartitionRoutingOption,
    RootOption,
    RunTimeoutOption,
    ZookeeperOption,
)
from waltz.cli.output import fail
from waltz.cli.perf_target import local_options_given, run_application_perf
from waltz.errors import ConfigurationError
from waltz.workloads.inventory import DEFAULT_INVENTORY_APPLICATION

__all__ = ["inventory"]

#: ``waltz perf inventory --local``: the cluster's partitions.
DEFAULT_INVENTORY_PARTITIONS = 4


def inventory(
    ctx: typer.Context,
    instances: Annotated[
        int, typer.Option(min=1, help="Inventory instances, each in a process of its own.")
    ] = 2,
    transactions: Annotated[
        int,
        typer.Option(
            "--transactions",
            "-n",
            min=0,
            help="Reservation requests in all (retries not counted), split across the instances.",
        ),
    ] = 3000,
    skus: Annotated[int, typer.Option(min=1, help="Hot SKUs every request draws from (uniformly).")] = 4,
    stock: Annotated[int, typer.Option(min=0, help="Units of each SKU on hand at the start.")] = 1500,
    max_quantity: Annotated[
        int, typer.Option("--max-quantity", min=1, help="Each request reserves 1 to this many units.")
    ] = 3,
    retry_fraction: Annotated[
        float,
        typer.Option(
            "--retry-fraction",
            min=0.0,
            max=1.0,
            help=(
                "Share of requests sent again under the same idempotency key once the first answer "
                "came back, as a client whose answer was lost: they must come back already applied "
                "or apply nothing."
            ),
        ),
    ] = 0.1,
    in_flight: Annotated[
        int, typer.Option("--in-flight", min=1, help="Requests each instance keeps submitted and unresolved.")
    ] = 21,
    submitters: Annotated[int, typer.Option(min=1, help="Threads per instance that submit.")] = 4,
    seed: Annotated[int, typer.Option(help="Instance i draws with seed + 1 + i.")] = 7,
    entity_cache: Annotated[
        bool,
        typer.Option(
            "--entity-cache/--no-entity-cache",
            help=(
                "The instances keep entity rows as their applies leave them (docs/sql.md), a "
                "keyed change-set's once its apply recorded the key first. --no-entity-cache: "
                "every attempt reads a snapshot (to compare)."
            ),
        ),
    ] = True,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch/--no-batch",
            help=(
                "The instances submit through an EntityBatcher: requests ready for a partition while "
                "its last log transaction is in flight go together as one "
                '(docs/sql.md "Batching entity transactions"). --no-batch: one log transaction per request.'
            ),
        ),
    ] = False,
    partition_routing: PartitionRoutingOption = False,
    warm_up: Annotated[
        int,
        typer.Option("--warm-up", min=0, help="Requests each instance sends before the measured phase."),
    ] = 50,
    app_module: Annotated[
        str,
        typer.Option(
            "--app", help="The inventory application, by module name: INVENTORY of MODULE.service or MODULE."
        ),
    ] = DEFAULT_INVENTORY_APPLICATION,
    db: Annotated[
        str | None,
        typer.Option(
            help=(
                "Shared application database URL, e.g. postgresql+psycopg://postgres@127.0.0.1/bench "
                "or mysql+pymysql://root@127.0.0.1/bench: empty, or holding only the inventory's "
                "tables. Default: SQLite in a temporary directory, removed afterwards."
            ),
            show_default=False,
        ),
    ] = None,
    timeout: RunTimeoutOption = 600.0,
    local: LocalOption = False,
    storages: LocalStoragesOption = 3,
    servers: LocalServersOption = 2,
    partitions: Annotated[
        int, typer.Option(min=1, help="--local: the cluster's partitions.")
    ] = DEFAULT_INVENTORY_PARTITIONS,
    secure: LocalSecureOption = True,
    config: ClientConfigOption = None,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    as_json: JsonOption = False,
) -> None:
    """Reserve stock of a few hot SKUs from N inventory instances, each in a process of its own,
    sharing one database, each request under an idempotency key, a share of them re-sent; print
    what a user of the service sees and check it.

    Printed: reservations committed/s over the common window; requests committed, refused for
    stock, already applied, errors; the retries' outcomes; lock failures; the entity cache's hits,
    misses and hit rate; p50 .. p99.9 (HdrHistogram) of submit -> commit and submit -> applied
    over the requests committed first; the CPU per committed reservation of each process; the
    mean of each stage the instances' clients time (first attempt, log round trip, apply...; a
    batch counts once). Then the checks: database marks = the servers', no SKU
    oversold, reserved = the sum of the reservations, each idempotency key applied at most once,
    one reservation per request committed, a replay of the log into an empty database holds the
    same rows, no apply failed; a failed check exits 1.

    With --partition-routing the requests and the requests in flight (instances x --in-flight) are
    shared among the instances by the SKUs each owns (those whose stock went to its partitions);
    one that owns none serves nothing.

    Example: waltz perf inventory --local --instances 2 -n 3000
    """

    from waltz.workloads.inventory import load_inventory_application
    from waltz.workloads.perf.inventory_run import run_inventory
    from waltz.workloads.perf.settings import InventoryPerfSettings

    try:
        application = load_inventory_application(app_module)
    except ConfigurationError as exc:
        raise fail(str(exc), 2) from exc
    try:
        settings = InventoryPerfSettings(
            instances=instances,
            transactions=transactions,
            skus=skus,
            stock=stock,
            max_quantity=max_quantity,
            retry_fraction=retry_fraction,
            in_flight=in_flight,
            submitters=submitters,
            seed=seed,
            timeout=timeout,
            entity_cache=entity_cache,
            batch=batch,
            warm_up=warm_up,
            app=app_module,
            partition_routing=partition_routing,
        )
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    run_application_perf(
        "inventory",
        application,
        settings,
        run_inventory,
        db=db,
        local=local,
        storages=storages,
        servers=servers,
        partitions=partitions,
        config=config,
        zookeeper=zookeeper,
        root=root,
        secure=secure,
        as_json=as_json,
        local_options=local_options_given(ctx),
    )
