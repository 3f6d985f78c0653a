"""``waltz storage``: run a storage node; list a node's partitions; sync them with ZooKeeper.

``list`` and ``sync-partitions`` live in :mod:`waltz.admin.storage_partitions` (imported when they
run). Their exit codes: 0 success; 1 a storage node did not answer or refused (``list`` of every
node still lists the others); 2 bad usage or configuration, ZooKeeper unreachable, no cluster
under the root, unknown storage node.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from waltz.cli.groups import MARKUP
from waltz.cli.options import (
    AdminConfigOption,
    JsonOption,
    NodesLogLevelOption,
    RootOption,
    StorageArgument,
    TimeoutOption,
    YesOption,
    ZookeeperOption,
    quiet_logging,
)
from waltz.cli.partition_ids import format_partitions
from waltz.logs import configure_logging
from waltz.services.storage.command import start

app = typer.Typer(
    help="Run a Waltz storage node; list a node's partitions; bring them in line with ZooKeeper.",
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)


app.command("start")(start)


@app.command("smoke")
def smoke(
    transactions: Annotated[int, typer.Option(help="Records to append in all.", min=1)] = 20_000,
    partitions: Annotated[int, typer.Option(help="Partitions to spread them over.", min=1)] = 4,
    size: Annotated[int, typer.Option(help="Transaction data bytes per record.", min=0)] = 200,
    work_dir: Annotated[
        Path | None, typer.Option(help="Keep the storage directory and logs here (default: a temp dir).")
    ] = None,
    log_level: NodesLogLevelOption = "WARNING",
) -> None:
    """Smoke-test a storage node: append, kill -9, restart, read back, compare.

    Starts a real storage node process, appends records over replica session streams, kills the
    node with SIGKILL, restarts it, reads every record back through the admin port and checks it
    byte for byte, and checks that the fence of the newest store session survived the crash.
    Exits non-zero if anything was lost or changed.
    """
    from waltz.local.storage_smoke import run_storage_smoke

    configure_logging(log_level)

    def run(directory: Path) -> bool:
        with typer.progressbar(length=transactions, label="appending") as bar:
            result = run_storage_smoke(
                directory,
                partitions=partitions,
                transactions=transactions,
                size=size,
                progress=bar.update,
                say=lambda line: typer.echo(f"\n{line}" if line.startswith("killing") else line),
            )
        rate = result.appended / result.append_seconds if result.append_seconds else 0.0
        typer.echo(
            f"appended {result.appended} records in {result.append_seconds:.2f}s ({rate:,.0f} records/s)"
        )
        typer.echo(f"verified {result.verified} records byte for byte after kill -9 and restart")
        for problem in result.problems:
            typer.echo(f"PROBLEM: {problem}", err=True)
        typer.echo("PASSED" if result.passed else "FAILED")
        return result.passed

    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        passed = run(work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="waltz-demo-") as tmp:
            passed = run(Path(tmp))
    raise typer.Exit(0 if passed else 1)


@app.command("list")
def list_partitions(
    storage: Annotated[
        str | None,
        typer.Argument(
            help="The storage node's connect string `host:port` (its storage port); default: every node.",
            show_default=False,
        ),
    ] = None,
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """List a storage node's partitions and their state, as the node reports them on its admin port.

    For each partition the node holds: readable/writable (R/W), its store session ID, its max
    transaction ID and low-water mark, its local start (the first transaction on the node's disk)
    and archived-through (what the archiver last told it is archived, -1: nothing), and whether
    ZooKeeper assigns it to the node; then the partitions ZooKeeper assigns but the node lacks
    (`waltz storage sync-partitions` creates them).
    """
    from waltz.admin.description import describe_cluster
    from waltz.admin.storage_nodes import StorageUnreachableError, describe_failure
    from waltz.admin.storage_partitions import node_partitions
    from waltz.cli.admin_session import connected_admin
    from waltz.errors import StorageRpcError

    quiet_logging()
    listings: list[dict[str, Any]] = []
    failed = False
    with connected_admin(config, zookeeper, root, timeout) as admin:
        names = (
            [storage]
            if storage is not None
            else [n.connect_string for n in describe_cluster(admin.cluster).storage_nodes]
        )
        for name in names:
            try:
                listing = node_partitions(admin, name)
            except (StorageUnreachableError, StorageRpcError) as exc:
                failed = True
                listings.append({"storage": name, "error": describe_failure(exc)})
                continue
            listings.append(listing.to_json())
    if json_output:
        typer.echo(json.dumps({"storage_nodes": listings}, indent=2))
    else:
        for item in listings:
            if "error" in item:
                typer.secho(f"{item['storage']}: ERROR: {item['error']}", fg=typer.colors.RED)
                continue
            typer.echo(f"{item['storage']} (admin {item['admin_address']})")
            for p in item["partitions"]:
                flags = ("R" if p["readable"] else "-") + ("W" if p["writable"] else "-")
                note = "" if p["assigned_in_zookeeper"] else "  NOT assigned in ZooKeeper"
                typer.echo(
                    f"  partition {p['partition_id']}: {flags} session {p['session_id']}, "
                    f"max transaction {p['max_transaction_id']}, low-water mark {p['low_water_mark']}, "
                    f"local start {p['local_start']}, archived through {p['archived_through']}{note}"
                )
            if not item["partitions"]:
                typer.echo("  no partitions")
            if item["missing"]:
                typer.echo(
                    "  assigned in ZooKeeper but missing on the node: " + format_partitions(item["missing"])
                )
    if failed:
        raise typer.Exit(1)


@app.command("sync-partitions")
def sync_partitions(
    storage: StorageArgument,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Make the changes, after a confirmation that --yes skips "
            "(default: show them only, a dry run).",
        ),
    ] = False,
    yes: YesOption = False,
    delete_storage_files: Annotated[
        bool,
        typer.Option(
            "--delete-storage-files",
            help="Also delete the files of the partitions removed from the node (default: keep them).",
        ),
    ] = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Bring a storage node's partitions in line with ZooKeeper's replica assignment.

    Creates on the node the partitions `store/assignment` gives it but it lacks, and removes from it
    the partitions it holds but ZooKeeper does not give it (their files stay unless
    --delete-storage-files). ZooKeeper is not changed. A dry run by default: it prints the plan;
    --apply makes the changes after a confirmation (--yes skips it).
    """
    from waltz.admin.storage_partitions import apply_sync, node_partitions, plan_sync
    from waltz.cli.admin_session import connected_admin

    quiet_logging()
    with connected_admin(config, zookeeper, root, timeout) as admin:
        plan = plan_sync(node_partitions(admin, storage))
        create = format_partitions(plan.create)
        remove = format_partitions(plan.remove)
        if plan.empty:
            typer.echo(f"{storage}: in line with ZooKeeper, nothing to change")
            return
        typer.echo(f"{storage}: create partitions {create}; remove partitions {remove}")
        if not apply:
            typer.echo("dry run: nothing changed (rerun with --apply to make these changes)")
            return
        if not yes:
            typer.confirm("make these changes?", abort=True)
        # What was confirmed must still be the plan: an assignment may have moved meanwhile.
        listing = node_partitions(admin, storage)
        if plan_sync(listing) != plan:
            typer.secho(
                f"{storage}: the node or ZooKeeper changed since the plan was shown; nothing changed "
                "(run the command again)",
                err=True,
                fg=typer.colors.RED,
            )
            raise typer.Exit(1)
        apply_sync(admin, plan, listing.admin_address, delete_storage_files=delete_storage_files)
    typer.echo(f"{storage}: created {create}; removed {remove}")
