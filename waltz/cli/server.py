"""``waltz server``: run a Waltz server, list the cluster's servers, change their preferred partitions.

``start`` lives in :mod:`waltz.services.server.command`; ``list`` and ``preferred`` in
:mod:`waltz.admin.servers` (imported when they run). Exit codes of ``list`` and ``preferred``:
0 success; 2 bad usage or configuration, ZooKeeper unreachable, no cluster under the root, no
such server.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from waltz.cli.groups import MARKUP
from waltz.cli.options import (
    AdminConfigOption,
    JsonOption,
    PartitionsOption,
    RootOption,
    ServerArgument,
    TimeoutOption,
    ZookeeperOption,
    quiet_logging,
)
from waltz.cli.partition_ids import format_partitions, parse_partitions
from waltz.services.server.command import start

app = typer.Typer(
    help="Run a Waltz server; list the cluster's servers; change their preferred partitions at run time.",
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)
app.command("start")(start)
preferred_app = typer.Typer(
    help=(
        "Change a server's preferred partitions at run time. They go to the `server/preferred` znode "
        "and replace the server's `server.preferredPartitions`. The cluster manager moves a preferred "
        "partition to its server once that server has been a live member for "
        "`server.preferredPartitionsReclaimDelay` seconds; see docs/operations.md."
    ),
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)
app.add_typer(preferred_app, name="preferred")


@app.command("list")
def list_servers(
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """List the live servers: partitions and generations, preferred partitions, role and health.

    Reads the member znodes, the partition assignment and the run-time preferences from
    ZooKeeper, asks each server for its status (high-water mark and writability of each partition
    it serves; who is the cluster manager), and reads its `/health` endpoint when it serves one
    (`server.metrics.port`). A server that does not answer is listed with the error.
    """
    from waltz.admin.servers import list_servers as list_all
    from waltz.cli.admin_session import connected_admin

    quiet_logging()
    with connected_admin(config, zookeeper, root, timeout) as admin:
        servers = list_all(admin.cluster.zk, admin.root, timeout=admin.storage_timeout, tls=admin.tls)
    if json_output:
        typer.echo(json.dumps({"servers": [s.to_json() for s in servers]}, indent=2))
        return
    if not servers:
        typer.echo("no live server")
        return
    for server in servers:
        role = ", cluster manager" if server.cluster_manager else ""
        health = f", health: {server.health}" if server.health is not None else ""
        typer.echo(f"{server.heading}, {server.member} (server ID {server.server_id}){role}{health}")
        if server.status_error is not None:
            typer.secho(f"  status: UNREACHABLE: {server.status_error}", fg=typer.colors.RED)
        for pid, generation in sorted(server.assigned.items()):
            served = server.served.get(pid)
            state = (
                "not served yet"
                if served is None
                else f"high-water mark {served[1]}, {'writable' if served[2] else 'NOT writable'}"
            )
            typer.echo(f"  partition {pid}: generation {generation}, {state}")
        if not server.assigned:
            typer.echo("  no partitions")
        preferred = format_partitions(server.preferred)
        configured = format_partitions(server.configured_preferred)
        typer.echo(f"  preferred partitions: {preferred} (configured: {configured})")
        if server.health in {"unhealthy", "unreachable"}:
            typer.echo(f"  health detail: {server.health_detail}")


def _change(
    server: str,
    partitions: list[str],
    zookeeper: str | None,
    root: str | None,
    config: Path | None,
    timeout: float | None,
    *,
    add: bool,
) -> None:
    from waltz.admin.servers import change_preferred, is_live
    from waltz.cli.admin_session import connected_admin

    ids = parse_partitions(partitions)
    if not ids:
        raise typer.BadParameter("give at least one partition with --partition", param_hint="--partition")
    quiet_logging()
    with connected_admin(config, zookeeper, root, timeout) as admin:
        endpoint, before, after = change_preferred(
            admin.cluster.zk, admin.root, server, add=ids if add else (), remove=() if add else ids
        )
        live = is_live(admin.cluster.zk, admin.root, endpoint)
    typer.echo(
        f"server {endpoint}: preferred partitions {format_partitions(before)} -> {format_partitions(after)}"
    )
    if not live:
        typer.echo(
            f"note: no live server has the endpoint {endpoint} now: its preferences apply when a server "
            "with that endpoint joins (waltz server list shows the live ones; a typo in the address "
            "leaves a preference no server takes)"
        )


@preferred_app.command("add")
def preferred_add(
    server: ServerArgument,
    partitions: PartitionsOption,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Add preferred partitions to a server; the cluster manager moves them to it.

    A partition moves once the server has been a live member for
    `server.preferredPartitionsReclaimDelay` seconds (at once if it has been longer), unless its
    current owner prefers it too.
    """
    _change(server, partitions, zookeeper, root, config, timeout, add=True)


@preferred_app.command("remove")
def preferred_remove(
    server: ServerArgument,
    partitions: PartitionsOption,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Remove preferred partitions from a server (they stay where they are until they must move)."""
    _change(server, partitions, zookeeper, root, config, timeout, add=False)
