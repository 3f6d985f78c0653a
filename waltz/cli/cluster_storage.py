"""``waltz cluster storage``: add and remove storage nodes, assign partitions to them, switch their
partitions' availability, copy partitions offline, set a poisoned fence back, and truncate
committed transactions on purpose.

The logic lives in :mod:`waltz.admin.storage_admin`, :mod:`waltz.admin.recover`,
:mod:`waltz.admin.fences` and :mod:`waltz.admin.committed_truncation`; this module parses options
and prints results. ``docs/zookeeper.md`` documents the replica-change safety rules. Exit codes as
``waltz cluster``'s (:mod:`waltz.cli.cluster`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from waltz.cli.admin_session import connected_admin
from waltz.cli.groups import MARKUP
from waltz.cli.options import (
    AdminConfigOption,
    ForceOption,
    JsonOption,
    PartitionsOption,
    RootOption,
    StorageArgument,
    TimeoutOption,
    YesOption,
    ZookeeperOption,
)
from waltz.cli.output import echo_json, fail, warn
from waltz.cli.partition_ids import format_partitions, parse_partitions
from waltz.protocol.event_loop import run_on_shared_loop

if TYPE_CHECKING:
    from waltz.admin.committed_truncation import ReplicaLog

app = typer.Typer(
    help=(
        "Add and remove storage nodes, assign partitions to them, switch their partitions' "
        "availability, and set a poisoned fence back. Replica changes follow safety rules (one new "
        "replica at a time per partition; never fewer caught-up replicas than a quorum): see "
        "docs/zookeeper.md."
    ),
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)


@app.command("add")
def storage_add(
    storage: StorageArgument,
    admin_port: Annotated[
        int, typer.Option("--admin-port", min=1, max=65535, help="The node's admin port.", show_default=False)
    ],
    group: Annotated[int, typer.Option("--group", "-g", help="The node's replica group.")] = 0,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Add a storage node to the cluster, with no partition.

    Opens the node through its admin port first (a new node is initialised with the cluster key;
    a node of another cluster is refused), then records its admin port and group in ZooKeeper by
    compare-and-set. Assign partitions with `assign` or `auto-assign`.
    """
    with connected_admin(config, zookeeper, root, timeout) as admin:
        admin.storage.add(storage, admin_port, group)
    typer.echo(f"added storage {storage} (admin port {admin_port}, group {group}) to {admin.root}")


@app.command("remove")
def storage_remove(
    storage: StorageArgument,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Remove a storage node from the cluster's znodes.

    Refused while the node still holds replicas: unassign them first. The node itself is not
    contacted.
    """
    with connected_admin(config, zookeeper, root, timeout) as admin:
        admin.storage.remove(storage)
    typer.echo(f"removed storage {storage} from {admin.root}")


@app.command("assign")
def storage_assign(
    storage: StorageArgument,
    partition: PartitionsOption,
    force: ForceOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Assign replicas of partitions to a storage node: created on the node, then recorded in
    ZooKeeper (compare-and-set).

    Refused (exit 1) while another replica of a partition is assigned but not yet caught up: one
    new replica at a time. Idempotent: partitions already assigned are created on the node again,
    which finishes a `create` that failed on this node.
    """
    ids = parse_partitions(partition)
    with connected_admin(config, zookeeper, root, timeout) as admin:
        result = admin.storage.assign(storage, ids, force=force)
    warn(result.warnings)
    typer.echo(
        f"storage {storage}: assigned partitions {format_partitions(result.changed)}"
        + (f" (already assigned: {format_partitions(result.unchanged)})" if result.unchanged else "")
    )


@app.command("unassign")
def storage_unassign(
    storage: StorageArgument,
    partition: PartitionsOption,
    force: ForceOption = False,
    delete_storage_files: Annotated[
        bool, typer.Option("--delete-storage-files", help="Also delete the partitions' files on the node.")
    ] = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Unassign replicas of partitions from a storage node: removed from ZooKeeper
    (compare-and-set), then from the node.

    Refused (exit 1) when fewer caught-up replicas than a quorum of the remaining replicas would
    be left, or none at all. If the node cannot be reached after ZooKeeper changed, it keeps the
    partitions' files: rerun the command when it is back (exit 1 until then); if it refuses, fix
    what it says and rerun it. A certificate without the admin role is refused before ZooKeeper
    changes (exit 1), as by add, remove, assign and auto-assign; so is a node not in the cluster
    (exit 2).
    """
    ids = parse_partitions(partition)
    with connected_admin(config, zookeeper, root, timeout) as admin:
        result = admin.storage.unassign(storage, ids, force=force, delete_storage_files=delete_storage_files)
    warn(result.warnings)
    typer.echo(
        f"storage {storage}: unassigned partitions {format_partitions(result.changed)}"
        + (f" (already unassigned: {format_partitions(result.unchanged)})" if result.unchanged else "")
    )
    if result.storage_error is not None:
        then = (
            "fix what the node says (cluster.ssl.* needs a certificate with the admin role), then rerun"
            if result.storage_refused
            else "rerun this command when the node is back"
        )
        typer.secho(
            f"ZooKeeper is updated, but the node still holds the partitions: {result.storage_error}; {then}",
            err=True,
            fg=typer.colors.RED,
        )
        raise typer.Exit(1)


@app.command("auto-assign")
def storage_auto_assign(
    group: Annotated[int, typer.Option("--group", "-g", help="The replica group.", show_default=False)],
    force: ForceOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Assign every partition to every storage node of a group, one new replica per partition at
    a time.

    Replicas that must wait for another new replica to catch up are listed as pending: rerun the
    command later (exit 0). Exit 1 when a storage node failed.
    """
    with connected_admin(config, zookeeper, root, timeout) as admin:
        result = admin.storage.auto_assign(group, force=force)
    warn(result.warnings)
    for storage, partition_ids in sorted(result.assigned.items()):
        typer.echo(f"storage {storage}: assigned partitions {format_partitions(partition_ids)}")
    if not result.assigned and not result.pending and not result.failures:
        typer.echo(f"every storage node of group {group} already holds every partition")
    for reason in result.pending:
        typer.echo(f"pending: {reason}")
    if result.pending:
        typer.echo("rerun auto-assign once the new replicas have caught up (see waltz cluster list)")
    for storage, why in sorted(result.failures.items()):
        typer.secho(f"storage {storage}: FAILED: {why}", err=True, fg=typer.colors.RED)
    if result.failures:
        raise typer.Exit(1)


@app.command("availability")
def storage_availability(
    storage: StorageArgument,
    partition: PartitionsOption,
    readable: Annotated[
        bool | None,
        typer.Option("--readable/--no-readable", help="Switch reads on or off.", show_default=False),
    ] = None,
    writable: Annotated[
        bool | None,
        typer.Option("--writable/--no-writable", help="Switch writes on or off.", show_default=False),
    ] = None,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Switch reads and/or writes of partitions on a storage node (admin port). A switch not given
    is left as it is."""
    ids = parse_partitions(partition)
    if readable is None and writable is None:
        raise typer.BadParameter("give --readable/--no-readable and/or --writable/--no-writable")
    with connected_admin(config, zookeeper, root, timeout) as admin:
        admin.storage.set_availability(storage, ids, readable=readable, writable=writable)
    switches = [
        f"{what} {'on' if value else 'off'}"
        for what, value in (("reads", readable), ("writes", writable))
        if value is not None
    ]
    typer.echo(f"storage {storage}: partitions {format_partitions(ids)}: {', '.join(switches)}")


@app.command("max-transaction-id")
def storage_max_transaction_id(
    storage: StorageArgument,
    partition: PartitionsOption,
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Print the max transaction ID of partitions on a storage node (-1: empty), read through its
    admin port. The transaction may not be committed yet."""
    ids = parse_partitions(partition)
    with connected_admin(config, zookeeper, root, timeout) as admin:
        result = admin.storage.max_transaction_ids(storage, ids)
    if json_output:
        echo_json({str(p): t for p, t in result.items()})
        return
    for partition_id, transaction_id in sorted(result.items()):
        typer.echo(f"partition {partition_id}: {transaction_id}")


@app.command("recover-partition")
def storage_recover_partition(
    source: Annotated[str, typer.Option("--source", help="Storage node to copy from (`host:port`).")],
    destination: Annotated[str, typer.Option("--destination", help="Storage node to copy to (`host:port`).")],
    partition: PartitionsOption,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Copy partitions from one storage node to another, offline, up to what is known committed
    (the source's low-water mark). The destination must be assigned the partitions and must not be
    a caught-up replica of the current store session; it is truncated to its own low-water mark
    first. The next store session then catches it up only from there. --timeout bounds the
    opening of each node's stream and each request: a node that does not answer in time fails
    the command (exit 2), named."""

    from waltz.admin.recover import recover_partition

    ids = parse_partitions(partition)
    with connected_admin(config, zookeeper, root, timeout) as admin:
        for partition_id in ids:
            try:
                result = run_on_shared_loop(
                    recover_partition(
                        admin.cluster,
                        source,
                        destination,
                        partition_id,
                        timeout=admin.storage_timeout,
                        tls=admin.tls,
                    )
                )
            except (ConnectionError, TimeoutError) as exc:
                raise fail(f"partition {partition_id}: a storage node did not answer: {exc}", 2) from exc
            typer.echo(
                f"partition {partition_id}: {destination} kept 0..{result.kept}, copied {result.copied} "
                f"record(s) from {source} up to the committed transaction {result.committed}"
            )


@app.command("set-fence")
def storage_set_fence(
    storage: StorageArgument,
    partition: PartitionsOption,
    to: Annotated[
        int | None,
        typer.Option(
            "--to",
            min=-1,
            help="The new fence (a store session ID). Default: the partition's store session ID in "
            "ZooKeeper, the one value that is always safe.",
            show_default=False,
        ),
    ] = None,
    reason: Annotated[
        str, typer.Option("--reason", help="Why, for the storage node's audit line.", show_default=False)
    ] = "",
    yes: YesOption = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Set a value below or above ZooKeeper's store session ID. DANGEROUS: below it, an "
            "older store session could write again; above it, the current one is fenced.",
        ),
    ] = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Set partitions' fences on a storage node back to a store session ID (admin port).

    A storage node refuses every store session below a partition's fence. A forged or corrupt
    session ID can raise the fence above the partition's store session ID in ZooKeeper; the
    server's new sessions are then refused on that node. This command sets it back (to ZooKeeper's
    session ID unless --to says otherwise) after a confirmation; the node logs who, from where,
    the old and new value and the reason at WARNING. A value other than ZooKeeper's session ID is
    refused (exit 1) unless --force. See docs/operations.md.
    """
    from waltz.admin.fences import fence_refusals, read_fence, set_fence

    ids = parse_partitions(partition)
    with connected_admin(config, zookeeper, root, timeout) as admin:
        changes = []
        for partition_id in ids:
            state = read_fence(
                admin.cluster, storage, partition_id, timeout=admin.storage_timeout, tls=admin.tls
            )
            value = state.zookeeper_session_id if to is None else to
            refusals = fence_refusals(state, value)
            if refusals and not force:
                raise fail("; ".join(refusals) + " (--force to do it anyway)", 1)
            warn(refusals)
            if value == state.fence and value >= state.last_session_id:
                typer.echo(f"partition {partition_id} on {storage}: the fence is already {value}")
                continue
            changes.append((state, value))
        for state, value in changes:
            typer.echo(
                f"partition {state.partition_id} on {storage}: fence {state.fence} -> {value} "
                f"(ZooKeeper's store session ID {state.zookeeper_session_id}, last session info's "
                f"session {state.last_session_id})"
            )
        if changes and not yes:
            typer.confirm("set these fences?", abort=True)
        for state, value in changes:
            result = set_fence(
                admin.cluster,
                storage,
                state.partition_id,
                value,
                reason=reason,
                timeout=admin.storage_timeout,
                tls=admin.tls,
                expected_fence=state.fence,  # the value checked above, or the node refuses
            )
            typer.echo(
                f"partition {result.partition_id} on {storage}: fence set {result.previous_fence} -> "
                f"{result.fence}"
                + (
                    f" (last session info's session {result.previous_last_session_id} -> "
                    f"{result.last_session_id})"
                    if result.previous_last_session_id != result.last_session_id
                    else ""
                )
            )


@app.command("truncate-committed")
def storage_truncate_committed(
    storage: StorageArgument,
    partition: PartitionsOption,
    to: Annotated[
        int,
        typer.Option("--to", min=-1, help="The last transaction to keep (-1: none).", show_default=False),
    ],
    reason: Annotated[
        str, typer.Option("--reason", help="Why, for the storage node's audit line.", show_default=False)
    ] = "",
    yes: YesOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Remove partitions' transactions after --to on a storage node, committed ones included
    (admin port). DANGEROUS: committed transactions are gone from that replica.

    A storage node refuses every store session's truncation below a partition's low-water mark
    (everything up to it is committed). This command truncates anyway and lowers the low-water
    mark to --to, after a confirmation. The node allows it only to a certificate with the admin
    role over mutual TLS, and logs the certificate's subject, the partition, the transactions
    and the reason at WARNING. Stop the partition's writes and truncate every replica to the same
    transaction: see docs/operations.md, "Truncating committed transactions".
    """
    from waltz.admin.committed_truncation import read_replica_log, truncate_committed

    ids = parse_partitions(partition)
    with connected_admin(config, zookeeper, root, timeout) as admin:
        changes = []
        for partition_id in ids:
            replica = read_replica_log(
                admin.cluster, storage, partition_id, timeout=admin.storage_timeout, tls=admin.tls
            )
            if to >= replica.max_transaction_id and to >= replica.low_water_mark:
                typer.echo(
                    f"partition {partition_id} on {storage}: nothing to remove (max transaction "
                    f"{replica.max_transaction_id}, low-water mark {replica.low_water_mark})"
                )
                continue
            changes.append(replica)
        summary = admin.cluster.archive_summary() if changes else None
        for replica in changes:
            if summary is None:
                break
            archived = summary.value.of(replica.partition_id).archived_through
            if to < archived:
                # Before any node is touched: the archive keeps what it holds (docs/design/archive.md,
                # "Reads below the local start"), so the removed transactions would come back.
                typer.echo(
                    f"error: partition {replica.partition_id}: refusing to truncate to transaction {to}: the "
                    f"archive ({summary.value.location}) holds the partition through "
                    f"transaction {archived} and keeps transactions {to + 1}..{archived} whatever the "
                    "replicas hold: once retention deleted their segments, readers below the local start "
                    "(servers, waltz rebuild) would read them from the archive in place of the transactions "
                    "committed next under their IDs. Pass over a poison transaction in the applications "
                    f"instead (waltz db skip), or truncate to {archived} or above; nothing was changed",
                    err=True,
                )
                raise typer.Exit(1)
        for replica in changes:
            typer.echo(f"partition {replica.partition_id} on {storage}: {_truncation_plan(replica, to)}")
        if changes and not yes:
            typer.confirm("remove these transactions, committed ones included?", abort=True)
        for replica in changes:
            result = truncate_committed(
                admin.cluster,
                storage,
                replica.partition_id,
                to,
                reason=reason,
                timeout=admin.storage_timeout,
                tls=admin.tls,
            )
            typer.echo(
                f"partition {result.partition_id} on {storage}: truncated from transaction "
                f"{result.previous_max_transaction_id} to {result.max_transaction_id}, low-water mark "
                f"{result.previous_low_water_mark} -> {result.low_water_mark}"
            )


def _truncation_plan(replica: ReplicaLog, to: int) -> str:
    """What truncating ``replica`` to ``to`` removes, for the confirmation: the transactions at or
    below its low-water mark are committed; those above it may be too, since a node's mark follows
    the committed high-water mark a few seconds behind (docs/design/storage.md, "The committed
    floor")."""
    removed = max(0, replica.max_transaction_id - to)
    committed = max(0, replica.committed_floor - to)
    above = removed - committed
    said = f"truncate from transaction {replica.max_transaction_id} to {to}, {removed} removed: "
    said += f"{committed} at or below the low-water mark, committed"
    if above:
        said += (
            f"; the {above} above it may be committed too (a node's low-water mark follows the "
            "committed high-water mark a few seconds behind)"
        )
    return f"{said} (low-water mark {replica.low_water_mark} -> {min(to, replica.low_water_mark)})"
