"""``waltz cluster``: create, list, verify and delete a cluster; manage its storage nodes.

The logic lives in :mod:`waltz.admin.cluster_admin` and
:mod:`waltz.admin.storage_admin`; this module parses options and prints results.
``docs/zookeeper.md`` documents the znodes and the replica-change safety rules.

Exit codes: 0 success; 1 a check failed (``verify`` found a FAILED check, a safety rule refused a
replica change, a storage node refused or failed part of the operation); 2 the command could not
run (bad usage or configuration, ZooKeeper or a storage node unreachable, no cluster under the
root, unknown storage node).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from kazoo.exceptions import KazooException

from waltz.admin.cluster_admin import ClusterAdmin, CreateResult, StorageSpec
from waltz.admin.config import ClusterAdminConfig
from waltz.admin.description import ClusterDescription
from waltz.admin.verify import CheckStatus, VerifyReport
from waltz.cli.groups import HELP, MARKUP
from waltz.cli.options import RootOption, ZookeeperOption
from waltz.config import load_settings
from waltz.errors import StorageRpcError, WaltzError
from waltz.logs import configure_logging
from waltz.metadata.replicas import ReplicaChangeRefusedError
from waltz.protocol.records import MAX_PARTITIONS

app = typer.Typer(
    help=HELP["cluster"],
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)
storage_app = typer.Typer(
    help=(
        "Add and remove storage nodes, assign partitions to them, switch their partitions' "
        "availability, and set a poisoned fence back. Replica changes follow safety rules (one new "
        "replica at a time per partition; never fewer caught-up replicas than a quorum): see "
        "docs/zookeeper.md."
    ),
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)
app.add_typer(storage_app, name="storage")


# ---- shared options ------------------------------------------------------------------------------

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="YAML file with `zookeeper.*` and `cluster.*` keys (see docs/zookeeper.md).",
        exists=True,
        dir_okay=False,
        show_default=False,
    ),
]
TimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        min=0.1,
        help="Seconds to wait for ZooKeeper and for each storage node "
        "(zookeeper.connectTimeout, cluster.storageTimeout; default 10).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of text.")]
StorageArgument = Annotated[
    str,
    typer.Argument(
        help="The storage node's connect string `host:port` (its storage port).", show_default=False
    ),
]
PartitionsOption = Annotated[
    list[str],
    typer.Option(
        "--partition",
        "-p",
        help="Partition IDs: repeat the option, or give a list with ranges such as `0,2,5-7`.",
        show_default=False,
    ),
]
ForceOption = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Override the replica-change safety rules. DANGEROUS: may lose committed transactions.",
    ),
]


@app.callback()
def _logging() -> None:
    """Log warnings and errors only (WALTZ_LOG_LEVEL overrides): the commands print their results."""
    configure_logging(os.environ.get("WALTZ_LOG_LEVEL", "ERROR"))


def _fail(message: str, code: int) -> typer.Exit:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


@contextmanager
def _connected(
    config: Path | None, zookeeper: str | None, root: str | None, timeout: float | None
) -> Iterator[ClusterAdmin]:
    """Load the settings, connect to ZooKeeper, and turn errors into messages and exit codes."""
    try:
        settings = load_settings(
            ClusterAdminConfig,
            config,
            zookeeper_connect_string=zookeeper,
            cluster_root=root,
            zookeeper_connect_timeout=timeout,
            cluster_storage_timeout=timeout,
        )
        connect_string, cluster_root = settings.require()
        admin = ClusterAdmin.connect(
            connect_string,
            cluster_root,
            connect_timeout=settings.zookeeper_connect_timeout,
            session_timeout=settings.zookeeper_session_timeout,
            storage_timeout=settings.cluster_storage_timeout,
            tls=settings.tls(),
            security=settings.zookeeper_security(),
        )
    except WaltzError as exc:
        raise _fail(str(exc), 2) from exc
    try:
        with admin:
            yield admin
    except (ReplicaChangeRefusedError, StorageRpcError) as exc:
        raise _fail(str(exc), 1) from exc
    except WaltzError as exc:
        raise _fail(str(exc), 2) from exc
    except KazooException as exc:
        raise _fail(f"ZooKeeper failed the request: {exc!r}", 2) from exc


def parse_partitions(values: Iterable[str]) -> list[int]:
    """Parse ``--partition`` values: integers, comma lists and ``a-b`` ranges, sorted and unique.

    Raises:
        typer.BadParameter: a value is not of that form.
    """
    ids: set[int] = set()
    for value in values:
        for item in value.split(","):
            match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
            if match is None:
                raise typer.BadParameter(f"{item!r} is not a partition ID or range (e.g. 3 or 0-7)")
            first = int(match[1])
            last = int(match[2]) if match[2] is not None else first
            if last < first:
                raise typer.BadParameter(f"range {item!r} is empty")
            ids.update(range(first, last + 1))
    return sorted(ids)


def format_partitions(ids: Iterable[int]) -> str:
    """Format partition IDs compactly: ``0-3,7``; ``(none)`` when empty."""
    ordered = sorted(set(ids))
    runs: list[str] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            runs.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(runs) or "(none)"


def _locator(admin: ClusterAdmin, zookeeper: str | None) -> str:
    """The --zookeeper/--root options to repeat in a suggested command."""
    return f"--zookeeper {zookeeper} --root {admin.root}" if zookeeper else f"--root {admin.root}"


def _echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


def _warn(lines: Iterable[str]) -> None:
    for line in lines:
        typer.secho(f"WARNING: {line}", err=True, fg=typer.colors.YELLOW, bold=True)


# ---- cluster commands ----------------------------------------------------------------------------


@app.command("create")
def create(
    name: Annotated[str, typer.Option("--name", "-n", help="The cluster's name.", show_default=False)],
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions", min=1, max=MAX_PARTITIONS, help="Number of partitions.", show_default=False
        ),
    ],
    storage: Annotated[
        list[str],
        typer.Option(
            "--storage",
            "-s",
            help="A storage node as `host:port=admin_port[,group]` (group 0 by default). Repeat it.",
            show_default=False,
        ),
    ],
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas",
            min=1,
            help="Replicas per partition, spread round-robin over the storage nodes. "
            "Default: every partition on every node.",
            show_default=False,
        ),
    ] = None,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Create a cluster: its znodes under the root, then set up every storage node.

    A new cluster key (UUID) is made; the cluster parameters, replica assignments, group
    descriptor, admin ports and empty partition metadata are written in one ZooKeeper
    transaction. Then every storage node is opened through its admin port, which initialises it
    with the cluster key and number of partitions, and its partitions are created.

    Nothing is written when a storage node's admin port does not accept connections (exit 2).

    When a storage node fails after the znodes were written (for instance it already belongs to
    another cluster), the znodes are NOT rolled back, because the other nodes already carry the
    new cluster key and would refuse a second `create`. The failed nodes are listed (exit 1): fix
    each one (for instance give it an empty storage directory) and rerun the printed
    `waltz cluster storage assign` command, which is idempotent. To start over instead, run
    `waltz cluster delete` and give every node a fresh directory.
    """
    specs = []
    for text in storage:
        try:
            specs.append(StorageSpec.parse(text))
        except WaltzError as exc:
            raise typer.BadParameter(str(exc), param_hint="--storage") from exc
    with _connected(config, zookeeper, root, timeout) as admin:
        result = admin.create(name, partitions, specs, replicas)
        _print_create(admin, result, zookeeper)
        if not result.ok:
            raise typer.Exit(1)


def _print_create(admin: ClusterAdmin, result: CreateResult, zookeeper: str | None) -> None:
    params = result.params
    typer.echo(
        f"created cluster {params.name!r} under {admin.root}: {params.num_partitions} partitions, "
        f"cluster key {params.cluster_key}"
    )
    for setup in result.storage:
        spec = setup.spec
        where = f"storage {spec.connect_string} (admin {spec.admin_address}, group {spec.group})"
        if setup.error is None:
            typer.echo(f"  {where}: initialised, partitions {format_partitions(setup.partitions)}")
        else:
            typer.secho(f"  {where}: FAILED: {setup.error}", fg=typer.colors.RED)
    failed = [s for s in result.storage if s.error is not None]
    if failed:
        typer.secho(
            f"the cluster exists in ZooKeeper, but {len(failed)} storage node(s) are not set up "
            "(the znodes are kept: the other nodes already hold the cluster key). "
            "Fix each node, then run:",
            err=True,
            fg=typer.colors.RED,
        )
        for setup in failed:
            typer.echo(
                f"  waltz cluster storage assign {setup.spec.connect_string} "
                f"--partition {format_partitions(setup.partitions)} {_locator(admin, zookeeper)}",
                err=True,
            )


@app.command("list")
def list_cluster(
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Show the cluster's parameters, storage nodes (admin port, group, partitions) and, per
    partition, its generation, store session ID and replica states (session ID and closing
    high-water mark, or UNRESOLVED). Reads ZooKeeper only."""
    with _connected(config, zookeeper, root, timeout) as admin:
        description = admin.describe()
    if json_output:
        _echo_json(description.to_json())
    else:
        _print_description(description)


def _print_description(description: ClusterDescription) -> None:
    params = description.params
    typer.echo(f"cluster {params.name!r} under {description.root}")
    typer.echo(f"  partitions:  {params.num_partitions}")
    typer.echo(f"  cluster key: {params.cluster_key}")
    typer.echo("storage nodes:")
    if not description.storage_nodes:
        typer.echo("  (none)")
    width = max((len(n.connect_string) for n in description.storage_nodes), default=14)
    if description.storage_nodes:
        typer.echo(f"  {'CONNECT STRING':<{width}}  ADMIN PORT  GROUP  PARTITIONS")
    for node in description.storage_nodes:
        admin_port = "-" if node.admin_port is None else str(node.admin_port)
        group = "-" if node.group is None else str(node.group)
        partitions = format_partitions(node.partitions)
        typer.echo(f"  {node.connect_string:<{width}}  {admin_port:<10}  {group:<5}  {partitions}")
    typer.echo("partitions:")
    for partition in description.partitions:
        metadata = partition.metadata
        if metadata is None:
            typer.echo(f"  partition {partition.partition_id}: metadata unreadable: {partition.error}")
            continue
        typer.echo(
            f"  partition {partition.partition_id}: generation {metadata.generation}, "
            f"store session {metadata.session_id}"
        )
        for storage in sorted(set(partition.assigned) | set(metadata.replicas)):
            role = "assigned  " if storage in partition.assigned else "unassigned"
            state = metadata.replicas.get(storage)
            if state is None:
                text = "no replica state yet"
            else:
                mark = "UNRESOLVED" if state.unresolved else str(state.closing_high_water_mark)
                text = f"session {state.session_id}, closing high-water mark {mark}"
            typer.echo(f"    {storage:<{width}}  {role}  {text}")


@app.command("verify")
def verify(
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Check ZooKeeper against the storage nodes; one PASSED/WARNING/FAILED line per check.

    Checks: the znodes decode and every partition has a replica; every storage node answers on
    its admin port, has this cluster's key and number of partitions, and holds exactly the
    partitions assigned to it; every partition has a quorum (majority) of its replicas available,
    no replica reports a corrupt record, and each replica's last session on the node is at least
    the session ZooKeeper records for it (otherwise WARNING: the node was probably restored from a
    backup). Exit code 1 when a check FAILED; warnings do not fail.

    Note: the admin open that checks a node's identity initialises a node that has no control
    file yet (an empty directory) for this cluster.
    """
    with _connected(config, zookeeper, root, timeout) as admin:
        report = admin.verify()
    if json_output:
        _echo_json(report.to_json())
    else:
        _print_report(report)
    if not report.passed:
        raise typer.Exit(1)


_COLOURS = {
    CheckStatus.PASSED: typer.colors.GREEN,
    CheckStatus.WARNING: typer.colors.YELLOW,
    CheckStatus.FAILED: typer.colors.RED,
}


def _print_report(report: VerifyReport) -> None:
    for check in report.checks:
        status = typer.style(f"{check.status.value:<8}", fg=_COLOURS[check.status])
        typer.echo(f"{status}{check.name}" + (f": {check.detail}" if check.detail else ""))
    typer.echo(
        f"{report.count(CheckStatus.PASSED)} passed, {report.count(CheckStatus.WARNING)} warning(s), "
        f"{report.count(CheckStatus.FAILED)} failed"
    )


@app.command("delete")
def delete(
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    unassign_storage: Annotated[
        bool,
        typer.Option(
            "--unassign-storage",
            help="First remove the cluster's partitions from every storage node (admin port). If a "
            "node fails, nothing is deleted: fix it and rerun, or rerun without this option.",
        ),
    ] = False,
    delete_storage_files: Annotated[
        bool,
        typer.Option(
            "--delete-storage-files",
            help="With --unassign-storage: also delete the partitions' files on the nodes.",
        ),
    ] = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Delete the cluster: every znode under the root, and the root.

    Asks for confirmation unless --yes. Stop the cluster's servers first: they would lose their
    metadata. Storage nodes keep their control file (the cluster key) even with
    --unassign-storage; to use a node in another cluster, give it an empty directory.
    """
    if delete_storage_files and not unassign_storage:
        raise typer.BadParameter("--delete-storage-files needs --unassign-storage")
    with _connected(config, zookeeper, root, timeout) as admin:
        description = admin.describe()
        if not yes:
            extra = ""
            if unassign_storage:
                holders = [n for n in description.storage_nodes if n.partitions]
                extra = f" and unassign its partitions on {len(holders)} storage node(s)" + (
                    " (deleting their files)" if delete_storage_files else ""
                )
            typer.confirm(
                f"Delete cluster {description.params.name!r} ({description.params.num_partitions} "
                f"partitions) under {admin.root}{extra}?",
                abort=True,
            )
        result = admin.delete(unassign_storage=unassign_storage, delete_storage_files=delete_storage_files)
    for storage, partition_ids in sorted(result.unassigned.items()):
        typer.echo(f"storage {storage}: unassigned partitions {format_partitions(partition_ids)}")
    for storage, why in sorted(result.failures.items()):
        typer.secho(f"storage {storage}: FAILED: {why}", err=True, fg=typer.colors.RED)
    if not result.deleted:
        typer.secho(
            "nothing was deleted in ZooKeeper: fix the failed storage node(s) and rerun, or rerun "
            "without --unassign-storage",
            err=True,
            fg=typer.colors.RED,
        )
        raise typer.Exit(1)
    typer.echo(f"deleted the cluster under {description.root}")


@app.command("secure")
def secure(
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Protect an existing cluster's znodes with the configured ZooKeeper credential.

    Sets, on the root and every znode below it, an ACL granting all rights to the digest
    credential of zookeeper.auth.digestFile (WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE) alone; sessions
    without it can then neither read nor write them. Give every server, client and tool the
    credential first (see docs/operations.md). Idempotent.
    """
    with _connected(config, zookeeper, root, timeout) as admin:
        count = admin.secure()
    typer.echo(f"protected {count} znodes under {admin.root} with the configured credential")


# ---- storage commands ----------------------------------------------------------------------------


@storage_app.command("add")
def storage_add(
    storage: StorageArgument,
    admin_port: Annotated[
        int, typer.Option("--admin-port", min=1, max=65535, help="The node's admin port.", show_default=False)
    ],
    group: Annotated[int, typer.Option("--group", "-g", help="The node's replica group.")] = 0,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Add a storage node to the cluster, with no partition.

    Opens the node through its admin port first (a new node is initialised with the cluster key;
    a node of another cluster is refused), then records its admin port and group in ZooKeeper by
    compare-and-set. Assign partitions with `assign` or `auto-assign`.
    """
    with _connected(config, zookeeper, root, timeout) as admin:
        admin.storage.add(storage, admin_port, group)
    typer.echo(f"added storage {storage} (admin port {admin_port}, group {group}) to {admin.root}")


@storage_app.command("remove")
def storage_remove(
    storage: StorageArgument,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Remove a storage node from the cluster's znodes.

    Refused while the node still holds replicas: unassign them first. The node itself is not
    contacted.
    """
    with _connected(config, zookeeper, root, timeout) as admin:
        admin.storage.remove(storage)
    typer.echo(f"removed storage {storage} from {admin.root}")


@storage_app.command("assign")
def storage_assign(
    storage: StorageArgument,
    partition: PartitionsOption,
    force: ForceOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Assign replicas of partitions to a storage node: created on the node, then recorded in
    ZooKeeper (compare-and-set).

    Refused (exit 1) while another replica of a partition is assigned but not yet caught up: one
    new replica at a time. Idempotent: partitions already assigned are created on the node again,
    which finishes a `create` that failed on this node.
    """
    ids = parse_partitions(partition)
    with _connected(config, zookeeper, root, timeout) as admin:
        result = admin.storage.assign(storage, ids, force=force)
    _warn(result.warnings)
    typer.echo(
        f"storage {storage}: assigned partitions {format_partitions(result.changed)}"
        + (f" (already assigned: {format_partitions(result.unchanged)})" if result.unchanged else "")
    )


@storage_app.command("unassign")
def storage_unassign(
    storage: StorageArgument,
    partition: PartitionsOption,
    force: ForceOption = False,
    delete_storage_files: Annotated[
        bool, typer.Option("--delete-storage-files", help="Also delete the partitions' files on the node.")
    ] = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Unassign replicas of partitions from a storage node: removed from ZooKeeper
    (compare-and-set), then from the node.

    Refused (exit 1) when fewer caught-up replicas than a quorum of the remaining replicas would
    be left, or none at all. If the node cannot be reached after ZooKeeper changed, it keeps the
    partitions' files: rerun the command when it is back (exit 1 until then).
    """
    ids = parse_partitions(partition)
    with _connected(config, zookeeper, root, timeout) as admin:
        result = admin.storage.unassign(storage, ids, force=force, delete_storage_files=delete_storage_files)
    _warn(result.warnings)
    typer.echo(
        f"storage {storage}: unassigned partitions {format_partitions(result.changed)}"
        + (f" (already unassigned: {format_partitions(result.unchanged)})" if result.unchanged else "")
    )
    if result.storage_error is not None:
        typer.secho(
            f"ZooKeeper is updated, but the node still holds the partitions: {result.storage_error}; "
            "rerun this command when the node is back",
            err=True,
            fg=typer.colors.RED,
        )
        raise typer.Exit(1)


@storage_app.command("auto-assign")
def storage_auto_assign(
    group: Annotated[int, typer.Option("--group", "-g", help="The replica group.", show_default=False)],
    force: ForceOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Assign every partition to every storage node of a group, one new replica per partition at
    a time.

    Replicas that must wait for another new replica to catch up are listed as pending: rerun the
    command later (exit 0). Exit 1 when a storage node failed.
    """
    with _connected(config, zookeeper, root, timeout) as admin:
        result = admin.storage.auto_assign(group, force=force)
    _warn(result.warnings)
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


@storage_app.command("availability")
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
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Switch reads and/or writes of partitions on a storage node (admin port). A switch not given
    is left as it is."""
    ids = parse_partitions(partition)
    if readable is None and writable is None:
        raise typer.BadParameter("give --readable/--no-readable and/or --writable/--no-writable")
    with _connected(config, zookeeper, root, timeout) as admin:
        admin.storage.set_availability(storage, ids, readable=readable, writable=writable)
    switches = [
        f"{what} {'on' if value else 'off'}"
        for what, value in (("reads", readable), ("writes", writable))
        if value is not None
    ]
    typer.echo(f"storage {storage}: partitions {format_partitions(ids)}: {', '.join(switches)}")


@storage_app.command("max-transaction-id")
def storage_max_transaction_id(
    storage: StorageArgument,
    partition: PartitionsOption,
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Print the max transaction ID of partitions on a storage node (-1: empty), read through its
    admin port. The transaction may not be committed yet."""
    ids = parse_partitions(partition)
    with _connected(config, zookeeper, root, timeout) as admin:
        result = admin.storage.max_transaction_ids(storage, ids)
    if json_output:
        _echo_json({str(p): t for p, t in result.items()})
        return
    for partition_id, transaction_id in sorted(result.items()):
        typer.echo(f"partition {partition_id}: {transaction_id}")


@storage_app.command("recover-partition")
def storage_recover_partition(
    source: Annotated[str, typer.Option("--source", help="Storage node to copy from (`host:port`).")],
    destination: Annotated[str, typer.Option("--destination", help="Storage node to copy to (`host:port`).")],
    partition: PartitionsOption,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: ConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Copy partitions from one storage node to another, offline, up to what is known committed
    (the source's low-water mark). The destination must be assigned the partitions and must not be
    a caught-up replica of the current store session; it is truncated to its own low-water mark
    first. The next store session then catches it up only from there."""
    import asyncio

    from waltz.admin.recover import recover_partition

    ids = parse_partitions(partition)
    with _connected(config, zookeeper, root, timeout) as admin:
        for partition_id in ids:
            try:
                result = asyncio.run(
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
                raise _fail(f"partition {partition_id}: a storage node did not answer: {exc}", 2) from exc
            typer.echo(
                f"partition {partition_id}: {destination} kept 0..{result.kept}, copied {result.copied} "
                f"record(s) from {source} up to the committed transaction {result.committed}"
            )


@storage_app.command("set-fence")
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
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
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
    config: ConfigOption = None,
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
    with _connected(config, zookeeper, root, timeout) as admin:
        changes = []
        for partition_id in ids:
            state = read_fence(
                admin.cluster, storage, partition_id, timeout=admin.storage_timeout, tls=admin.tls
            )
            value = state.zookeeper_session_id if to is None else to
            refusals = fence_refusals(state, value)
            if refusals and not force:
                raise _fail("; ".join(refusals) + " (--force to do it anyway)", 1)
            _warn(refusals)
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
