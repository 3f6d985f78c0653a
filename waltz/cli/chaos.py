"""``waltz chaos``: a local cluster under a seeded fault schedule, then every invariant checked.

The logic lives in :mod:`waltz.chaos`; this module parses options and prints. Exit codes: 0 every
check passed; 1 a check failed or the run could not finish; 2 bad options.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated

import typer

from waltz.cli.database_urls import require_reachable
from waltz.cli.options import NodesLogLevelOption
from waltz.cli.output import missing_extra
from waltz.errors import ConfigurationError
from waltz.logs import configure_logging
from waltz.workloads.application import DEFAULT_APPLICATION, load_application


def chaos(
    transactions: Annotated[
        int | None,
        typer.Option(
            help=(
                "Transactions to submit in all, split between the clients (default 3,000; with "
                "--duration, no bound but time)."
            ),
            min=1,
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            help=(
                "Seconds the clients submit for; the fault points become fractions of it, and the run "
                "goes on until every fault struck (default: until --transactions are submitted)."
            ),
            min=1,
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of payloads, partitions, locks and the random schedule.")
    ] = 1,
    faults: Annotated[
        str,
        typer.Option(
            help=(
                "Fault kinds, comma-separated, or all / none: kill-storage, kill-server, kill-zookeeper, "
                "pause-storage, pause-server, pause-zookeeper, pause-owner; on loopback (proxies) "
                "cut-clients, cut-storage, delay-clients, delay-storage; with --network namespaces "
                "(real cuts between hosts) isolate-server, isolate-storage, split-owner, "
                "partition-storage, one-way-storage, one-way-owner. all: every kind of the network."
            )
        ),
    ] = "all",
    schedule: Annotated[
        str,
        typer.Option(
            help=(
                "random (drawn from --seed) or fixed (kill a storage node, a server, cut storage; "
                "with --network namespaces one cut of each kind, split-owner first)."
            )
        ),
    ] = "random",
    fault_count: Annotated[
        int | None,
        typer.Option(
            help="Faults of a random schedule (default: one per 5,000 transactions, or with --duration "
            "one per 30 s; at least 3, at most 200).",
            min=0,
        ),
    ] = None,
    max_fault_duration: Annotated[
        float, typer.Option(help="Longest fault of a random schedule, in seconds.", min=1)
    ] = 6.0,
    workload: Annotated[
        str,
        typer.Option(
            help=(
                "raw: random payloads under random write locks; counter: read-modify-write increments of "
                "--lock-pool counters (no update may be lost); ledger: the SmallBank mix "
                "(waltz_examples.ledger)."
            )
        ),
    ] = "raw",
    db_url: Annotated[
        str | None,
        typer.Option(
            "--db-url",
            "--db",
            help="The ledger's database URL (an empty database; default: SQLite in the work dir).",
        ),
    ] = None,
    accounts: Annotated[int, typer.Option(help="SmallBank customers of the ledger workload.", min=2)] = 200,
    app: Annotated[
        str,
        typer.Option(
            help="The ledger workload's SmallBank application, by module name: SMALLBANK of "
            "MODULE.smallbank or MODULE."
        ),
    ] = DEFAULT_APPLICATION,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch/--no-batch",
            help="The ledger workload's instances submit through an EntityBatcher: operations ready "
            "for a partition while its last log transaction is in flight go as one log transaction "
            '(docs/sql.md "Batching entity transactions"); the checks count each member.',
        ),
    ] = False,
    storages: Annotated[int, typer.Option(help="Storage nodes: 3 or 5.")] = 3,
    servers: Annotated[int, typer.Option(help="Servers.", min=1)] = 3,
    partitions: Annotated[int, typer.Option(help="Partitions.", min=1)] = 4,
    clients: Annotated[int, typer.Option(help="Client processes.", min=1)] = 3,
    in_flight: Annotated[int, typer.Option(help="Transactions in flight per client.", min=1)] = 32,
    lock_pool: Annotated[int, typer.Option(help="Write locks are drawn from this many.", min=1)] = 1000,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            help="Data and logs go here, kept: a new or empty directory, as a run starts a new cluster "
            "(default: a temporary directory)."
        ),
    ] = None,
    keep: Annotated[
        bool, typer.Option(help="Keep the temporary work directory after a passing run.")
    ] = False,
    restart_check: Annotated[
        bool, typer.Option(help="Stop everything cleanly, start it again and check the same log.")
    ] = True,
    network: Annotated[
        str,
        typer.Option(
            help=(
                "loopback: every process on 127.0.0.1, network faults through proxies; namespaces: "
                "ZooKeeper, every node and every client on a host of its own (a network namespace "
                "with its own address on a bridge, needs root and nftables), network faults cut "
                "hosts apart."
            )
        ),
    ] = "loopback",
    archive: Annotated[
        bool,
        typer.Option(
            "--archive",
            help=(
                "Run the archiver through the run (waltz archive run --follow, chunks of 200, sealed "
                "after 1 s) on storage nodes that roll 16 KiB segments and delete archived ones, "
                "keeping 2; the schedule may then kill a server or storage nodes while an archive "
                "round is in progress, and the archiver (kill-server-archiving, "
                "kill-storage-archiving, kill-archiver); the checks add waltz archive verify, chunks "
                "archived once, nothing lost, replicas identical over their local ranges. Loopback only."
            ),
        ),
    ] = False,
    split_to: Annotated[
        int | None,
        typer.Option(
            "--split-to",
            min=2,
            help=(
                "Split the log to this many partitions (a multiple of --partitions) while the clients "
                "write, and kill -9 the server owning parent partition 0 as soon as it is marked "
                "sealing, in the middle of the handover (fault kill-server-splitting, at --split-at); "
                "the split resumes until complete and the checks cover every partition of both "
                "counts. Workloads raw and counter (counter checks that no update is lost across it)."
            ),
        ),
    ] = None,
    split_at: Annotated[
        float,
        typer.Option("--split-at", min=0.0, max=1.0, help="Fraction of the run at which --split-to starts."),
    ] = 0.5,
    log_level: NodesLogLevelOption = "WARNING",
) -> None:
    """Run a local cluster and client processes under faults, then check every invariant.

    Starts ZooKeeper, the storage nodes and 3 servers as processes on loopback (or each on a host of
    its own with --network namespaces), and client processes that submit transactions with random
    write locks and random payloads while a seeded fault schedule (printed first, with the command
    that replays it) kills, pauses, cuts and delays nodes and connections. Then checks that every
    acknowledged transaction is in the log exactly once, without gaps, that generations never go
    back, that every client applied the same sequence as a fresh reader, that all
    replicas are byte-identical, and that a clean restart of everything shows the same log; with
    the ledger workload, also that money is conserved and every transfer completed once; with
    --archive, that the archive verifies, holds every range once, and with the replicas' local
    ranges holds every committed record; with --split-to, that the split completed and every check
    holds on every partition of both counts.
    Exits 1 if any check fails; the work directory with every node's log is kept then.
    """
    from waltz.chaos import ChaosOptions, parse_fault_kinds, run_chaos

    configure_logging(log_level)
    if logging.getLogger().getEffectiveLevel() >= logging.WARNING:
        # ZooKeeper kills and pauses are the point here: kazoo's reconnection warnings are noise.
        logging.getLogger("kazoo").setLevel(logging.ERROR)
    try:
        kinds = parse_fault_kinds(faults, network, archive=archive)
    except ValueError as exc:
        typer.echo(f"--faults: {exc}", err=True)
        raise typer.Exit(2) from exc
    if archive:
        # The archiver needs pyarrow: say so now, not after a run with a dead archiver.
        hint = missing_extra(ModuleNotFoundError(name="pyarrow"))
        if hint is not None:
            typer.echo(f"--archive: the archiver cannot run: {hint}", err=True)
            raise typer.Exit(2)
    if workload == "ledger":
        try:
            load_application(app)  # the workers import it again: fail here, before anything starts
        except ConfigurationError as exc:
            typer.echo(f"--app: {exc}", err=True)
            raise typer.Exit(2) from exc
        if db_url is not None:  # with another workload, ChaosOptions.validate refuses it
            try:
                require_reachable(db_url, "--db-url")  # before the cluster starts
            except ConfigurationError as exc:
                typer.echo(str(exc), err=True)
                raise typer.Exit(2) from exc
    options = ChaosOptions(
        transactions=transactions,
        duration=duration,
        seed=seed,
        faults=kinds,
        schedule=schedule,
        fault_count=fault_count,
        max_fault_duration=max_fault_duration,
        workload=workload,
        db_url=db_url,
        accounts=accounts,
        app=app,
        batch=batch,
        storages=storages,
        servers=servers,
        partitions=partitions,
        clients=clients,
        in_flight=in_flight,
        lock_pool=lock_pool,
        work_dir=work_dir,
        keep=keep,
        restart_check=restart_check,
        network=network,
        archive=archive,
        split_to=split_to,
        split_at=split_at,
    )
    started = time.monotonic()
    try:
        result = run_chaos(options, typer.echo)
    except ValueError as exc:
        typer.echo(f"waltz chaos: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"total {time.monotonic() - started:.0f}s")
    raise typer.Exit(0 if result.passed else 1)
