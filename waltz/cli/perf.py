"""``waltz perf``: producer and consumer performance runs (upstream Waltz's ProducerPerf/ConsumerPerf),
the SmallBank mix from application instances (``waltz perf smallbank``, the ledger example's
by default), reservations of hot SKUs under idempotency keys (``waltz perf inventory``,
:mod:`waltz.cli.perf_inventory`), and throughput across a live split (``waltz perf split``).

The logic lives in :mod:`waltz.perf` and, for ``smallbank``, in :mod:`waltz.workloads.perf`
(imported inside the command); this module parses options and prints the figures. Exit codes: 0
the run finished (failed transactions are reported, not fatal); 1 the run could not complete (a
client or instance process failed, the consumer timed out) or, for ``smallbank``, a check of the
application failed; 2 bad options or configuration (``--app`` naming no SmallBank application), an
unusable database, or the cluster could not be reached or started.
"""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer

from waltz.cli.groups import MARKUP
from waltz.cli.options import (
    ActivePartitionsOption,
    ClientConfigOption,
    InFlightOption,
    JsonOption,
    LocalOption,
    LocalPartitionsOption,
    LocalSecureOption,
    LocalServersOption,
    LocalStoragesOption,
    PartitionRoutingOption,
    RootOption,
    RunTimeoutOption,
    SizeOption,
    ZookeeperOption,
)
from waltz.cli.output import fail
from waltz.cli.perf_inventory import inventory
from waltz.cli.perf_target import describe_target, local_options_given, perf_target, run_application_perf
from waltz.errors import ConfigurationError
from waltz.logs import configure_logging
from waltz.workloads.application import DEFAULT_APPLICATION

app = typer.Typer(
    help=(
        "Measure a Waltz cluster: producers (transactions/s, MB/s, retries per transaction, "
        "submit-to-commit latency percentiles from an HdrHistogram), consumers (read throughput), and "
        "the ledger example's SmallBank mix from application instances sharing one database "
        "(committed/s, submit-to-commit and submit-to-applied latencies), and the inventory "
        "example's reservations of hot SKUs under idempotency keys, and a local cluster's throughput "
        "before and after a live split (with the longest write pause of a key). "
        "Target an existing cluster with --zookeeper/--root (or --config, or `WALTZ_*` variables), or "
        "start a local one with --local and --storages/--servers/--partitions."
    ),
    short_help="Measure throughput and latency: producers, SmallBank, inventory.",
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)

#: ``waltz perf smallbank --local``: the cluster's partitions when instances are not partition-routed.
DEFAULT_SMALLBANK_PARTITIONS = 4


@app.callback()
def _logging() -> None:
    """Log warnings and errors only (WALTZ_LOG_LEVEL overrides): the commands print their figures."""
    configure_logging(os.environ.get("WALTZ_LOG_LEVEL", "WARNING"))


def producer(
    ctx: typer.Context,
    clients: Annotated[int, typer.Option("--clients", "-t", min=1, help="Client processes.")] = 1,
    transactions: Annotated[
        int, typer.Option("--transactions", "-n", min=0, help="Transactions per client.")
    ] = 10_000,
    size: SizeOption = 200,
    lock_pool_size: Annotated[
        int,
        typer.Option(
            "--lock-pool-size",
            "-l",
            min=0,
            help="Each transaction takes one write lock drawn from this many, lock i on partition i "
            "mod the active partitions (so at least as many as those); 0: no lock (no retries).",
        ),
    ] = 1000,
    in_flight: InFlightOption = 500,
    rate: Annotated[
        float,
        typer.Option(
            "--rate",
            min=0.0,
            help="Poisson arrivals at this mean rate per client (transactions/s); 0: closed loop "
            "(--in-flight outstanding at all times).",
        ),
    ] = 0.0,
    active_partitions: ActivePartitionsOption = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of lock and arrival draws.", show_default=False)
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds the measured phase may take: nothing is submitted after it (the rest is "
            "reported as not submitted); a transaction still in flight then counts as failed.",
        ),
    ] = 600.0,
    local: LocalOption = False,
    storages: LocalStoragesOption = 3,
    servers: LocalServersOption = 1,
    partitions: LocalPartitionsOption = 1,
    secure: LocalSecureOption = True,
    config: ClientConfigOption = None,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    as_json: JsonOption = False,
) -> None:
    """Submit transactions from N clients and print transactions/s, MB/s, retries per transaction and
    submit-to-commit latency percentiles (p50, p90, p99, p99.9; HdrHistogram).

    Each transaction carries --size bytes and one write lock drawn from --lock-pool-size locks; the
    concurrency check is the client's last applied transaction (its high-water mark), so a lock
    failure makes the client re-execute the transaction, counted as a retry.

    Example: waltz perf producer --local --partitions 4 --clients 2 -n 20000
    """
    from waltz.perf.loadgen import LoadSpec
    from waltz.perf.producer import ProducerSettings, run_producer

    try:
        settings = ProducerSettings(
            clients,
            LoadSpec(transactions, size, lock_pool_size, in_flight, rate, timeout, seed),
            active_partitions,
        )
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    with perf_target(
        local, storages, servers, partitions, config, zookeeper, root, secure, local_options_given(ctx)
    ) as target:
        client_config = target.config
        try:
            stats = run_producer(client_config, settings, target.metrics_urls, target.metrics_tls)
        except ValueError as exc:
            raise fail(str(exc), 2) from exc
    if as_json:
        summary = stats.summary()
        summary["settings"] = {
            "clients": clients,
            "transactions_per_client": transactions,
            "payload_size": size,
            "lock_pool_size": lock_pool_size,
            "max_in_flight": in_flight,
            "rate": rate,
            "active_partitions": active_partitions,
        }
        typer.echo(json.dumps(summary))
        return
    typer.echo(
        f"producer: {clients} client(s) x {transactions:,} transactions; {settings.load.describe()}; "
        f"{describe_target(local, storages, servers, partitions, client_config.cluster_root)}"
    )
    typer.echo(stats.text("appended"))


def consumer(
    ctx: typer.Context,
    transactions: Annotated[
        int, typer.Option("--transactions", "-n", min=1, help="Transactions to write, then read.")
    ] = 10_000,
    size: SizeOption = 200,
    producers: Annotated[int, typer.Option(min=1, help="Producer client processes writing them.")] = 1,
    in_flight: InFlightOption = 500,
    live: Annotated[
        bool,
        typer.Option(
            "--live/--catch-up",
            help="live: read while the producers write (latency submit -> read); catch-up: read after "
            "they finished (upstream ConsumerPerf).",
        ),
    ] = False,
    active_partitions: ActivePartitionsOption = None,
    timeout: RunTimeoutOption = 600.0,
    local: LocalOption = False,
    storages: LocalStoragesOption = 3,
    servers: LocalServersOption = 1,
    partitions: LocalPartitionsOption = 1,
    secure: LocalSecureOption = True,
    config: ClientConfigOption = None,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write transactions, read them with a fresh client, and print its transactions/s and MB/s (and,
    with --live, latency percentiles from submit to read).

    Example: waltz perf consumer --local --partitions 2 -n 20000 --live
    """
    from waltz.perf.consumer import ConsumerMode, ConsumerSettings, run_consumer

    mode = ConsumerMode.LIVE if live else ConsumerMode.CATCH_UP
    settings = ConsumerSettings(transactions, size, producers, in_flight, active_partitions, mode, timeout)
    with perf_target(
        local, storages, servers, partitions, config, zookeeper, root, secure, local_options_given(ctx)
    ) as target:
        client_config = target.config
        try:
            report = run_consumer(client_config, settings, target.metrics_urls, target.metrics_tls)
        except ValueError as exc:
            raise fail(str(exc), 2) from exc
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "mode": mode.value,
                    "consumer": report.summary(),
                    "producers": report.producers.summary(),
                }
            )
        )
        return
    typer.echo(
        f"consumer ({mode.value}): {transactions:,} transactions of {size} B written by {producers} "
        f"producer(s); {describe_target(local, storages, servers, partitions, client_config.cluster_root)}"
    )
    typer.echo(report.text())
    typer.echo(f"(producers: {report.producers.transactions_per_second:,.1f} transactions/s)")


def smallbank(
    ctx: typer.Context,
    instances: Annotated[
        int, typer.Option(min=1, help="Ledger instances, each in a process of its own.")
    ] = 3,
    transactions: Annotated[
        int,
        typer.Option(
            "--transactions",
            "-n",
            min=0,
            help="Measured SmallBank draws in all (Balance reads included), split across the instances.",
        ),
    ] = 6000,
    accounts: Annotated[int, typer.Option(min=2, help="SmallBank customers, opened before the run.")] = 200,
    in_flight: Annotated[
        int | None,
        typer.Option(
            "--in-flight",
            min=1,
            help="SmallBank transactions each instance keeps submitted and unresolved (with --batch "
            "several may share one log transaction; Balance reads are not counted). Default: 21, "
            "the SmallBank peers' threads per process (benchmarks/peers); with --rate, a tenth of a "
            "second of each instance's scheduled draws, at least 21 (docs/benchmarks.md).",
            show_default=False,
        ),
    ] = None,
    submitters: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Threads per instance that submit (default: the workload's, 4).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of the opening balances; instance i draws with seed + 1 + i.")
    ] = 7,
    partition_routing: PartitionRoutingOption = False,
    entity_cache: Annotated[
        bool,
        typer.Option(
            "--entity-cache/--no-entity-cache",
            help=(
                "The instances keep entity rows as their applies leave them, so an operation on "
                "cached entities reads no database snapshot (docs/sql.md). --no-entity-cache: every "
                "attempt reads a snapshot (to compare)."
            ),
        ),
    ] = True,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch/--no-batch",
            help=(
                "The instances submit through an EntityBatcher: SmallBank transactions ready for a "
                "partition while its last log transaction is in flight go together as one "
                '(docs/sql.md "Batching entity transactions"). --no-batch: one log transaction each.'
            ),
        ),
    ] = False,
    rate: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help=(
                "Draws per second in all (Balance reads included), split across the instances, on "
                "a fixed schedule: latencies count from each draw's scheduled start (e.g. half the "
                "committed/s of an unpaced run, for latency at half load). Default: as fast as "
                "--in-flight allows."
            ),
            show_default=False,
        ),
    ] = None,
    warm_up: Annotated[
        int,
        typer.Option(
            "--warm-up",
            min=0,
            help=(
                "Draws each instance runs before the measured phase, counted nowhere: its first "
                "transactions open database connections and fill the entity cache, as a service "
                "that has been running has done."
            ),
        ),
    ] = 100,
    app_module: Annotated[
        str,
        typer.Option(
            "--app",
            help=(
                "The SmallBank application, by module name: SMALLBANK of MODULE.smallbank or MODULE "
                "(docs/benchmarks.md)."
            ),
        ),
    ] = DEFAULT_APPLICATION,
    db: Annotated[
        str | None,
        typer.Option(
            help=(
                "Shared application database URL, e.g. postgresql+psycopg://postgres@127.0.0.1/bench "
                "or mysql+pymysql://root@127.0.0.1/bench: empty, or holding only this ledger's "
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
        int | None,
        typer.Option(
            min=1,
            help=(
                "--local: the cluster's partitions. Default: with --partition-routing one per "
                "instance (equal shares: every instance draws the same number of transactions from "
                "its own partitions' customers), else 4."
            ),
            show_default=False,
        ),
    ] = None,
    secure: LocalSecureOption = True,
    config: ClientConfigOption = None,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run the ledger example's SmallBank mix (the demo's workload) from N ledger instances, each in
    a process of its own, sharing one database, and print what a user of the application sees.

    The database is migrated and the accounts opened first; then every instance (a LedgerService:
    Waltz client, SQL callbacks, transfer sweeper) mounts, and all start the measured phase
    together, each drawing its share of the mix with its own seed.

    Printed: committed/s over the common window (all instances) and per instance; submitted,
    committed, dropped by the rules (by reason), balances read, lock failures per committed
    transaction, errors; p50, p90, p99 and p99.9 (HdrHistogram) of submit -> commit (the
    submit future gives the transaction ID) and of submit -> applied (the submitting instance has
    applied it: read-your-writes), over the committed transactions of the mix. Then the ledger's
    checks (applied exactly once, money conserved, transfers exactly once, balance rules); a
    failed check exits 1.

    Example: waltz perf smallbank --local --db postgresql+psycopg://postgres@127.0.0.1/bench
    """
    from waltz.workloads.application import load_application
    from waltz.workloads.perf import (
        SmallBankPerfSettings,
        run_smallbank,
    )
    from waltz.workloads.smallbank import SmallBankConfig

    try:
        application = load_application(app_module)
    except ConfigurationError as exc:
        raise fail(str(exc), 2) from exc
    try:
        settings = SmallBankPerfSettings(
            instances=instances,
            transactions=transactions,
            accounts=accounts,
            in_flight=in_flight or 0,  # 0: the run's default (default_in_flight)
            submitters=submitters if submitters is not None else SmallBankConfig.submitters,
            seed=seed,
            timeout=timeout,
            partition_routing=partition_routing,
            entity_cache=entity_cache,
            batch=batch,
            rate=rate,
            warm_up=warm_up,
            app=app_module,
        )
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    if partitions is None:
        partitions = instances if partition_routing else DEFAULT_SMALLBANK_PARTITIONS
    run_application_perf(
        "smallbank",
        application,
        settings,
        run_smallbank,
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


def split(
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="Partitions at creation.")] = 2,
    to: Annotated[
        int, typer.Option("--to", min=2, help="Partitions after the split (a multiple of --partitions).")
    ] = 4,
    producers: Annotated[
        int, typer.Option("--producers", min=1, help="Client threads, each with its own store.")
    ] = 4,
    keys: Annotated[int, typer.Option("--keys", min=1, help="Counters the producers bump.")] = 64,
    in_flight: Annotated[
        int, typer.Option("--in-flight", min=1, help="Bumps each producer keeps in flight.")
    ] = 8,
    before: Annotated[
        float, typer.Option("--before", min=0.1, help="Seconds of bumps before the split.")
    ] = 15.0,
    after: Annotated[float, typer.Option("--after", min=0.1, help="Seconds of bumps after it.")] = 15.0,
    storages: LocalStoragesOption = 3,
    servers: LocalServersOption = 2,
    secure: LocalSecureOption = True,
    as_json: JsonOption = False,
) -> None:
    """Split a local cluster's log under load: committed/s before and after, the split's seconds,
    and the longest write pause of a key that stays and of one that moves.

    Starts a local cluster of --partitions, then --producers clients bump --keys counters (a
    read-modify-write under the key's write lock, routed by key mod count) for --before seconds;
    the cluster's admin then splits it to --to partitions (as waltz cluster split), and the bumps
    go on for --after seconds. Upstream Waltz's validate closes the run: each key's values in the
    log are exactly 1..n for its n commits (exit 1 otherwise).

    Example: waltz perf split --partitions 2 --to 4 --before 10 --after 10
    """
    from waltz.perf.split import SplitPerfSettings, run_split

    try:
        settings = SplitPerfSettings(
            partitions=partitions,
            to=to,
            producers=producers,
            keys=keys,
            in_flight=in_flight,
            before=before,
            after=after,
            storages=storages,
            servers=servers,
            secure=secure,
        )
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    figures = run_split(settings, None if as_json else typer.echo)
    if as_json:
        typer.echo(json.dumps(figures.summary()))
    else:
        typer.echo(figures.text())
    if not figures.validate or not figures.split_complete:
        raise typer.Exit(1)


app.command("producer")(producer)
app.command("split")(split)
app.command("consumer")(consumer)
app.command("smallbank")(smallbank)
app.command("inventory")(inventory)
