"""``waltz cluster``: create, list, verify, split and delete a cluster; ``waltz cluster storage``
manages its storage nodes (:mod:`waltz.cli.cluster_storage`).

The logic lives in :mod:`waltz.admin.cluster_admin`, :mod:`waltz.admin.storage_admin` and
:mod:`waltz.admin.split_run` (``split``); this module parses options and prints results.
``docs/zookeeper.md`` documents the znodes and the replica-change safety rules.

Exit codes: 0 success; 1 a check failed (``verify`` found a FAILED check, a safety rule refused a
replica change, a storage node refused or failed part of the operation); 2 the command could not
run (bad usage or configuration, ZooKeeper or a storage node unreachable, no cluster under the
root, unknown storage node); ``split`` also 3: the split stands unfinished, and the same command
resumes it.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from waltz.admin.cluster_admin import ClusterAdmin, CreateResult, StorageSpec
from waltz.admin.description import ClusterDescription
from waltz.admin.split_report import SplitPhase, SplitReport
from waltz.admin.split_run import SplitNotAuthorisedError, SplitRun
from waltz.admin.verify import CheckStatus, VerifyReport
from waltz.cli import cluster_storage
from waltz.cli.admin_session import connected_admin
from waltz.cli.groups import HELP, MARKUP
from waltz.cli.options import (
    AdminConfigOption,
    DigestDirOption,
    JsonOption,
    ReplicasOption,
    RootOption,
    ShowKeyOption,
    TimeoutOption,
    YesOption,
    ZookeeperOption,
)
from waltz.cli.output import echo_json, fail
from waltz.cli.partition_ids import format_partitions
from waltz.errors import SplitStateError, SplitStorageError, WaltzError
from waltz.logs import configure_logging
from waltz.metadata.zk_roles import ROLE_DIGEST_FILES, RoleCredentials
from waltz.metadata.zk_session import ZooKeeperUnavailableError
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.records import MAX_PARTITIONS

app = typer.Typer(
    help=HELP["cluster"],
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)
app.add_typer(cluster_storage.app, name="storage")


@app.callback()
def _logging() -> None:
    """Log warnings and errors only (WALTZ_LOG_LEVEL overrides): the commands print their results."""
    configure_logging(os.environ.get("WALTZ_LOG_LEVEL", "ERROR"))


def _locator(admin: ClusterAdmin, zookeeper: str | None) -> str:
    """The --zookeeper/--root options to repeat in a suggested command."""
    return f"--zookeeper {zookeeper} --root {admin.root}" if zookeeper else f"--root {admin.root}"


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
            metavar="<host:port=admin_port[,group]>",
            help="A storage node as `host:port=admin_port[,group]` (group 0 by default). Repeat it.",
            show_default=False,
        ),
    ],
    replicas: ReplicasOption = None,
    show_key: ShowKeyOption = False,
    digest_dir: DigestDirOption = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Create the znodes open to anyone, on purpose, when no ZooKeeper credential is "
            "given (refused otherwise: anyone reaching ZooKeeper could read the cluster key and "
            "erase the cluster).",
        ),
    ] = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Create a cluster: its znodes under the root, then set up every storage node.

    The znodes are protected by ZooKeeper credentials: per role with --digest-dir (made when
    absent), or the one credential of the settings (zookeeper.auth.digestFile). With neither,
    the command refuses, unless --insecure says to create them open on purpose.

    A new cluster key (UUID) is made (printed by its fingerprint only: the key is a secret, see
    --show-key); the cluster parameters, replica assignments, group
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
    with connected_admin(config, zookeeper, root, timeout) as admin:
        open_znodes = digest_dir is None and not admin.cluster.zk.auth_data
        if open_znodes and not insecure:
            typer.secho(
                "error: no ZooKeeper credential: the cluster's znodes would be open to anyone who "
                "reaches ZooKeeper, who could read its cluster key and erase the cluster. Give "
                "--digest-dir DIR (a credential per role, made when absent; "
                'docs/deploy.md, "ZooKeeper credentials"), or --insecure to create them open on '
                "purpose. Nothing was written.",
                err=True,
                fg=typer.colors.RED,
            )
            raise typer.Exit(2)
        credentials = RoleCredentials.load_or_generate(digest_dir) if digest_dir is not None else None
        result = admin.create(name, partitions, specs, replicas, credentials=credentials)
        if digest_dir is not None:
            files = ", ".join(ROLE_DIGEST_FILES.values())
            typer.echo(f"ZooKeeper credentials per role in {digest_dir}: {files}")
        elif open_znodes:
            typer.secho(
                "warning: --insecure: the cluster's znodes are open to anyone, who can read its "
                "cluster key and rewrite its metadata; protect them later with `waltz cluster "
                """secure --digest-dir DIR` (docs/operations.md, "Protecting a cluster's znodes")""",
                err=True,
                fg=typer.colors.YELLOW,
            )
        _print_create(admin, result, zookeeper, show_key)
        if not result.ok:
            raise typer.Exit(1)


def _key_text(cluster_key: object, show_key: bool) -> str:
    """The cluster key as the commands print it: its fingerprint, and the key only when asked."""
    fingerprint = cluster_key_fingerprint(str(cluster_key))
    return f"{cluster_key} (fingerprint {fingerprint})" if show_key else fingerprint


def _print_create(admin: ClusterAdmin, result: CreateResult, zookeeper: str | None, show_key: bool) -> None:
    params = result.params
    typer.echo(
        f"created cluster {params.name!r} under {admin.root}: {params.num_partitions} partitions, "
        f"cluster key {_key_text(params.cluster_key, show_key)}"
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
    show_key: ShowKeyOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Show the cluster's parameters, storage nodes (admin port, group, partitions) and, per
    partition, its generation, store session ID and replica states (session ID and closing
    high-water mark; a replica of the current store session says so, one of an earlier session
    whose closing mark no recovery has set yet shows UNRESOLVED). Reads ZooKeeper only.

    The cluster key is shown by its fingerprint; --show-key prints the key itself (for instance
    for `waltz archive restore --cluster-key`): keep it out of logs and shared terminals."""
    with connected_admin(config, zookeeper, root, timeout) as admin:
        description = admin.describe()
    if json_output:
        echo_json(description.to_json(show_key=show_key))
    else:
        _print_description(description, show_key)


def _print_description(description: ClusterDescription, show_key: bool) -> None:
    params = description.params
    typer.echo(f"cluster {params.name!r} under {description.root}")
    count = len(description.partitions)
    split = (
        f" ({params.num_partitions} at creation, the others opened by splits)"
        if count != params.num_partitions
        else ""
    )
    typer.echo(f"  partitions:  {count}{split}")
    typer.echo(f"  cluster key: {_key_text(params.cluster_key, show_key)}")
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
            elif state.unresolved and state.session_id == metadata.session_id:
                text = f"session {state.session_id}, the current store session"
            else:
                mark = "UNRESOLVED" if state.unresolved else str(state.closing_high_water_mark)
                text = f"session {state.session_id}, closing high-water mark {mark}"
            typer.echo(f"    {storage:<{width}}  {role}  {text}")


@app.command("verify")
def verify(
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
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
    file yet (an empty directory) for this cluster; with mutual TLS only a certificate of the
    admin role may, and with an operator's such a node's check FAILS (permission denied).
    """
    with connected_admin(config, zookeeper, root, timeout, check_acls=False) as admin:
        report = admin.verify()
    if json_output:
        echo_json(report.to_json())
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
    yes: YesOption = False,
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
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Delete the cluster: every znode under the root, and the root.

    Asks for confirmation unless --yes. Stop the cluster's servers first: they would lose their
    metadata. Storage nodes keep their control file (the cluster key) even with
    --unassign-storage; to use a node in another cluster, give it an empty directory.
    """
    if delete_storage_files and not unassign_storage:
        raise typer.BadParameter("--delete-storage-files needs --unassign-storage")
    with connected_admin(config, zookeeper, root, timeout, check_acls=False) as admin:
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
    digest_dir: DigestDirOption = None,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Protect an existing cluster's znodes with its ZooKeeper credentials.

    In a cluster made with credentials per role, run with the operator's credential: every znode
    from the root down gets its role's ACL again (servers, operators, clients: docs/zookeeper.md,
    "Access control"), and znodes the role table needs are made where missing.

    In a cluster made with one credential, or none: every znode gets an ACL granting all rights to
    the digest credential of zookeeper.auth.digestFile (WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE) alone;
    sessions without it can then neither read nor write them. Give every server, client and tool
    the credential first (see docs/operations.md).

    With --digest-dir, every znode gets instead the ACL of its role (the credentials made in the
    directory when absent): the way a cluster created with one credential, or none, moves to
    credentials per role. Restart the servers, tools and clients with their role's file
    afterwards (docs/deploy.md, "ZooKeeper credentials"). Idempotent.
    """
    with connected_admin(config, zookeeper, root, timeout, check_acls=False) as admin:
        credentials = RoleCredentials.load_or_generate(digest_dir) if digest_dir is not None else None
        count = admin.secure(credentials)
        if digest_dir is not None:
            how = f"the role credentials of {digest_dir}"
        elif admin.cluster.access.roles() is not None:
            how = "the ACL of each znode's row of the cluster's role table"
        else:
            how = "the configured credential"
    typer.echo(f"protected {count} znodes under {admin.root} with {how}")


@app.command("split")
def split(
    to: Annotated[
        int,
        typer.Option(
            "--to",
            min=2,
            max=MAX_PARTITIONS,
            help="The partition count to split to: a whole multiple of at least 2 of the current count.",
            show_default=False,
        ),
    ],
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Check, and print the plan (parents, H(p), children); write nothing."),
    ] = False,
    abort: Annotated[
        bool,
        typer.Option(
            "--abort",
            help="Roll back the split to --to while no parent is sealing: delete its epoch and write "
            "discovery back. After the first parent is sealing, a split only goes forward.",
        ),
    ] = False,
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            min=0.0,
            help="Seconds to wait, in all, for the parents' owners to write their barriers and the new "
            "partitions' owners their geneses; the split then stays where it stands (exit 3), and the "
            "same command resumes it.",
        ),
    ] = 60.0,
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Split the cluster's partitions, each into several, to --to partitions in all.

    An operator action (docs/design/splits.md, "The handover"): in a cluster with ZooKeeper
    credentials per role it needs the operators' credential, and with mutual TLS a certificate of
    the admin role.

    Checks the count, that no other split is unfinished and that every parent has an owner; writes
    the new epoch with each parent's committed high-water mark H(p) and raises discovery's format
    (clients that predate splits refuse the cluster); then, parent by parent, marks it sealing and
    waits for its owner to append the barrier and write B(p); then opens each new child on its
    parent's storage nodes (grown to the new count, the child's log starting after the barrier),
    and waits for the child's owner to append its genesis. The split is complete when every child
    has its genesis. Every step already taken is skipped, so the same command resumes a split that
    stopped (a wait that ran out, a storage node away, ZooKeeper away).

    Exit codes: 0 the split is complete (or --dry-run, or --abort done); 1 refused (the count, another
    split unfinished, a partition without an owner, an abort after sealing, a caller without the
    role), nothing written; 2 the command could not run (ZooKeeper away, a parent's storage node
    away while opening a child: run it again to resume); 3 the split stands unfinished (barriers or
    geneses not written within --wait): run the same command again.
    """

    def progress(line: str) -> None:
        typer.echo(line, err=json_output)

    with connected_admin(config, zookeeper, root, timeout) as admin:
        if not abort and admin.cluster.archive_summary() is not None:
            typer.secho(
                "warning: this cluster is archived, and the archive does not follow a split: the "
                "partitions it opens stay on their storage nodes (retention keeps them), but a "
                "restore from the archive would not hold them "
                '(docs/design/archive.md, "Partitions a split opened")',
                err=True,
                fg=typer.colors.YELLOW,
            )
        run = SplitRun(
            admin.cluster, tls=admin.tls, storage_timeout=admin.storage_timeout, wait=wait, progress=progress
        )
        report: SplitReport
        try:
            if abort:
                report = run.abort(to, dry_run=dry_run)
            elif dry_run:
                report = run.plan(to)
            else:
                report = run.run(to)
        except SplitStorageError as exc:  # a node away: the split stands where it stopped
            raise fail(f"{exc}. The split stands where it stopped: run the same command again", 2) from exc
        except (SplitNotAuthorisedError, SplitStateError) as exc:
            raise fail(str(exc), 1) from exc
        except ZooKeeperUnavailableError as exc:
            where = "the abort" if abort else "the split"
            raise fail(
                f"{exc}. {where.capitalize()} stands where it stopped: run the same command again", 2
            ) from exc
    if json_output:
        echo_json(report.to_json())
    else:
        _print_split(report)
    if not (report.complete or report.dry_run or abort):
        raise typer.Exit(3)


def _print_split(report: SplitReport) -> None:
    """The human summary of ``waltz cluster split`` after its progress lines."""
    for note in report.notes:
        typer.echo(f"note: {note}")
    what = f"split {report.previous_count} -> {report.count} partitions (epoch {report.epoch})"
    if report.dry_run:
        typer.echo(f"plan: {what}, {report.state.value}; nothing was written")
    else:
        typer.echo(f"{what}: {report.state.value}")
    for parent in report.parents:
        barrier = "no barrier yet" if parent.barrier is None else f"barrier {parent.barrier}"
        # Marked sealing, the parent stays so; once its barrier is in, it is sealed.
        sealing = "" if not parent.sealing else ", sealing" if parent.barrier is None else ", sealed"
        owner = f", owner {parent.owner}" if parent.owner else ""
        children = ", ".join(str(c) for c in parent.children)
        typer.echo(
            f"  parent {parent.parent}: H({parent.parent}) = {parent.high_water_mark}{sealing}, {barrier}, "
            f"children {children}{owner}"
        )
    for child in report.children:
        genesis = f" (genesis {child.genesis})" if child.genesis is not None else ""
        typer.echo(f"  child {child.child} (parent {child.parent}): {child.state}{genesis}")
    if report.complete:
        typer.echo(f"the split is complete: {report.count} partitions")
    elif report.waiting is not None and not report.dry_run and report.state is not SplitPhase.ABORTED:
        typer.secho(f"not complete: {report.waiting}", fg=typer.colors.YELLOW)
        typer.echo("the same command resumes the split from where it stands")
