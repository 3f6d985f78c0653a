"""``waltz archive``: run the archiver, show what the archive holds, verify it, restore from it.

The logic lives in :mod:`waltz.archive` (docs/design/archive.md); this module parses options and
prints. Every command needs the cluster's ZooKeeper connect string and root (``--zookeeper``/
``--root``, ``WALTZ_ZOOKEEPER_CONNECT_STRING``/``WALTZ_CLUSTER_ROOT``, or a ``--config`` file);
``status`` and ``verify`` find the archive in ZooKeeper (``<root>/archive``) unless ``--archive``
names one; ``restore`` makes a new cluster under the root from ``--from``.

Exit codes: 0 done (``run`` also when stopped by SIGTERM or Ctrl-C after the chunk in progress);
1 a partition stopped (``run``: replicas that disagree, fewer than a quorum of replicas, a chunk
that fails its check, ZooKeeper ahead of the archive) or, with ``--once``, a replica was not told
what is archived (a node down, or a certificate without the admin role), a problem found
(``verify``), or a restore refused (an archive that fails verification, a root that holds a
cluster, storage nodes not empty or not answering; nothing written) or a storage node that failed
after ZooKeeper was written; 2 the command could not run (options, settings, ZooKeeper, no
cluster, a location that cannot be opened, read or written, an archive of a newer form, another
location on record without ``--relocate``).
"""

from __future__ import annotations

import getpass
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from waltz.cli.admin_session import connected_admin
from waltz.cli.groups import HELP, MARKUP
from waltz.cli.options import (
    AdminConfigOption,
    ArchiveOption,
    ClusterKeyFileOption,
    DigestDirOption,
    JsonOption,
    LogLevelOption,
    PartitionsOption,
    ReplicasOption,
    RootOption,
    TimeoutOption,
    ZookeeperOption,
    quiet_logging,
)
from waltz.cli.output import echo_json, fail
from waltz.cli.partition_ids import parse_partitions
from waltz.logs import configure_logging

if TYPE_CHECKING:
    import uuid

    from waltz.admin.cluster_admin import ClusterAdmin
    from waltz.archive.archiver import ArchiveEvent, PartitionRound
    from waltz.archive.layout import ArchiveFiles
    from waltz.archive.metrics import ArchiverMetrics
    from waltz.protocol.channels import TlsConfig

__all__ = ["app"]

app = typer.Typer(help=HELP["archive"], no_args_is_help=True, rich_markup_mode=MARKUP)


def _keep_cluster_key(cluster_key: uuid.UUID) -> Path:
    """Write a cluster key to a new ``0600`` file in the temporary directory and return its path
    (the key is never printed: docs/design/overview.md, "The cluster key")."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix="waltz-cluster-key-", suffix=".txt")  # created 0600
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(f"{cluster_key}\n")
    return Path(name)


def _operator() -> str:
    """Who runs the command, as told to the storage nodes: ``$USER``, else the login name."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (OSError, KeyError):
        return ""


def _clock(started: float) -> Callable[[str], None]:
    def say(line: str) -> None:
        typer.echo(f"[{time.monotonic() - started:7.1f}s] {line}")

    return say


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT while the block runs (the archiver stops after its chunk)."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


@app.command("run")
def run(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="The archive: a directory, or a URL pyarrow opens (s3://bucket/path, gs://..., "
            "hdfs://...). The first run records it in ZooKeeper.",
            show_default=False,
        ),
    ],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow/--once",
            help="--once: archive what is ready, then exit; --follow: keep up with the log, a round every "
            "--interval seconds, until SIGTERM or Ctrl-C.",
        ),
    ] = False,
    partition: PartitionsOption = [],  # noqa: B006 (typer reads the default)
    chunk_transactions: Annotated[int, typer.Option(min=1, help="Records in a full chunk.")] = 100_000,
    chunk_bytes: Annotated[
        int, typer.Option(min=1, help="Data bytes in a full chunk (it ends at the record that reaches them).")
    ] = 64 << 20,
    seal_after: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds a partition's committed high-water mark must stay unchanged before a chunk "
            "shorter than full is written (0: at once). --once waits for it once.",
        ),
    ] = 60.0,
    interval: Annotated[float, typer.Option(min=0.1, help="--follow: seconds between rounds.")] = 10.0,
    relocate: Annotated[
        bool,
        typer.Option(
            "--relocate",
            help="The archive was moved (copied) to --to: record the new location in ZooKeeper. Without "
            "it, a location other than the one on record is refused.",
        ),
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Serve Prometheus /metrics and /health on this port while running (chunks, bytes, each "
            "partition's archive lag); HTTPS with the tool's TLS files. Default: none.",
            show_default=False,
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            "--metrics-host",
            help="The address --metrics-port binds: loopback by default, as the nodes' own; give "
            "the host's address (or 0.0.0.0) for a Prometheus on another host.",
        ),
    ] = "127.0.0.1",
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
    log_level: LogLevelOption = "WARNING",
) -> None:
    """Archive the log's committed records: per partition, in chunks, verified against a quorum.

    Each chunk is read from a quorum of the replicas that prove it committed and compared record
    by record, written, read back and checked, then added to the partition's manifest; then
    ZooKeeper's archived-through is raised and the replicas are told. A chunk is written when it
    is full or the partition has been quiet for --seal-after seconds. Stopped at any point, the
    next run goes on where this one stopped: nothing is archived twice, nothing skipped. Each
    round also tells every replica whose archived-through differs from ZooKeeper's; a replica left
    untold (a node down, a certificate without the admin role) is named, and --once exits 1
    (--follow tells it in a later round; /metrics counts it). With
    --metrics-port, /metrics shows the chunks and bytes written and each partition's lag (the
    committed high-water mark minus the archived-through); /health answers 503 while a
    partition is stopped.
    """
    from waltz.archive.archiver import Archiver, ChunkPolicy
    from waltz.archive.errors import ArchiveError
    from waltz.archive.metrics import ArchiverMetrics

    configure_logging(log_level)
    policy = ChunkPolicy(
        chunk_transactions=chunk_transactions, chunk_bytes=chunk_bytes, seal_after=seal_after
    )
    partitions = parse_partitions(partition) or None
    say = _clock(time.monotonic())
    metrics = ArchiverMetrics()
    with (
        connected_admin(config, zookeeper, root, timeout) as admin,
        _stop_on_signals() as stop,
        _metrics_endpoint(metrics, metrics_host, metrics_port, admin.tls, say),
    ):
        try:
            archiver = Archiver(
                admin.cluster,
                to,
                policy=policy,
                partitions=partitions,
                relocate=relocate,
                storage_timeout=admin.storage_timeout,
                tls=admin.tls,
                operator=_operator(),
                progress=lambda event: _event_line(say, event),
                metrics=metrics,
            )
            say(f"archiving to {archiver.location} ({'following the log' if follow else 'once'})")
            results = archiver.run(follow=follow, stop=stop, interval=interval)
        except ArchiveError as exc:
            raise fail(str(exc), 2) from exc
        for result in results:
            say(_round_line(result, seal_after))
        if stop.is_set():
            say("stopped by a signal after the chunk in progress")
        untold = sorted({s for r in results for s in r.untold})
        if untold:
            typer.echo(_untold_message(untold, results), err=True)
        if any(r.error is not None for r in results) or (untold and not follow):
            raise typer.Exit(1)


def _untold_message(untold: list[str], results: list[PartitionRound]) -> str:
    """Why the run exits 1 when the archive is written but replicas were not told it."""
    why = {storage: reason for r in results for storage, reason in r.untold.items()}
    lines = [
        f"{len(untold)} storage node(s) were not told what is archived: they keep their archived "
        "segments (retention deletes nothing there) until a run tells them; the archive itself is "
        "written and recorded. The next waltz archive run tells every replica whose archived-through "
        "differs from ZooKeeper's.",
        *(f"  {storage}: {why[storage]}" for storage in untold),
    ]
    if any("PERMISSION_DENIED" in why for r in results for why in r.untold.values()):
        lines.append(
            "A node refused with PERMISSION_DENIED: telling a node what is archived needs a certificate "
            'with the admin role (docs/operations.md, "Roles"). On a cluster of waltz up, set '
            "WALTZ_CLUSTER_SSL_CERT_FILE and WALTZ_CLUSTER_SSL_KEY_FILE to tls/admin.pem and "
            "tls/admin-key.pem of its work directory."
        )
    return "\n".join(lines)


@contextmanager
def _metrics_endpoint(
    metrics: ArchiverMetrics, host: str, port: int | None, tls: TlsConfig | None, say: Callable[[str], None]
) -> Iterator[None]:
    """Serve the archiver's /metrics and /health while the block runs (nothing without a port)."""
    if port is None:
        yield
        return
    from waltz.protocol.channels import BindError
    from waltz.services.http import HealthHttpServer, server_ssl_context

    def health() -> tuple[bool, dict[str, Any]]:
        stopped = metrics.stopped_partitions()
        return not stopped, {"stopped_partitions": stopped}

    try:
        context = (
            server_ssl_context(tls.cert_file, tls.key_file, tls.ca_file)
            if tls is not None and tls.cert_file is not None and tls.key_file is not None
            else None
        )
        server = HealthHttpServer(host, port, metrics.registry, health, context)
    except (BindError, OSError) as exc:
        raise fail(str(exc), 2) from exc
    server.start()
    say(f"metrics on {'https' if server.tls else 'http'}://{host}:{server.port}/metrics")
    try:
        yield
    finally:
        server.close()


def _event_line(say: Callable[[str], None], event: ArchiveEvent) -> None:
    from waltz.archive.archiver import Step

    if event.step in (Step.CHUNK_WRITTEN, Step.CHUNK_ADOPTED, Step.CHUNK_REPLACED):
        say(
            f"partition {event.partition_id}: {event.step.value} {event.first}..{event.last} ({event.detail})"
        )
    elif event.step is Step.WAITING_FOR_QUIET:
        say(
            f"partition {event.partition_id}: waiting {event.detail}s for transactions {event.first}.."
            f"{event.last} to stay quiet before writing their chunk (--seal-after 0 writes it now)"
        )


def _round_line(result: PartitionRound, seal_after: float) -> str:
    head = f"partition {result.partition_id}: "
    if result.error is not None:
        return head + f"STOPPED: {result.error}"
    line = head + f"archived through {result.archived_through}, committed through {result.high_water_mark}"
    if result.chunks_added:
        added = f"{result.records} records, {result.size_bytes / 1e6:.1f} MB"
        line += f"; {result.chunks_added} chunks ({added}) added"
    if result.waiting:
        line += f"; {result.waiting} wait for a full chunk or {seal_after:g}s of quiet"
    if result.untold:
        line += f"; replicas NOT TOLD: {', '.join(result.untold)}"
    return line


def _looks_like_an_archive(files: ArchiveFiles, num_partitions: int) -> bool:
    """Whether a location given with --archive holds anything of an archive: its archive.json or a
    partition's directory. One that holds neither is a wrong location, not a damaged archive."""
    from waltz.archive.layout import ARCHIVE_MANIFEST, partition_directory

    try:
        return files.exists(ARCHIVE_MANIFEST) or any(
            files.exists(partition_directory(p)) for p in range(num_partitions)
        )
    except OSError:
        return True  # the location cannot be looked at: verify says why, file by file


def _require_an_archive(files: ArchiveFiles, archive: str | None, num_partitions: int) -> None:
    """Refuse (exit 2) a location given with --archive that holds nothing of an archive.

    Raises:
        typer.Exit: 2, after saying so (``fail``).
    """
    if archive is not None and not _looks_like_an_archive(files, num_partitions):
        raise fail(
            f"{archive} is not an archive: it holds no archive.json and no partition directory "
            "(an empty or wrong location); give the archive's location (waltz archive status shows "
            "the one the cluster names)",
            2,
        )


def _archive_files(admin: ClusterAdmin, archive: str | None) -> ArchiveFiles | None:
    """The archive given, else the one ZooKeeper names (None: neither)."""
    from waltz.archive.layout import ArchiveFiles
    from waltz.archive.location import normal_location

    if archive is not None:
        return ArchiveFiles.open(normal_location(archive))
    summary = admin.cluster.archive_summary()
    return None if summary is None else ArchiveFiles.open(summary.value.location)


def _partitions(admin: ClusterAdmin, values: list[str]) -> list[int] | None:
    """The ``--partition`` values (None: every partition).

    Raises:
        typer.Exit: 2 for a partition the cluster does not have.
    """
    ids = parse_partitions(values)
    count = admin.cluster.params().num_partitions
    unknown = [p for p in ids if p >= count]
    if unknown:
        raise fail(f"partitions {unknown} do not exist: the log has partitions 0..{count - 1}", 2)
    return ids or None


@app.command("status")
def status(
    archive: ArchiveOption = None,
    partition: PartitionsOption = [],  # noqa: B006 (typer reads the default)
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Show per partition what the archive holds, each replica's local range, and the archive's lag.

    The archived range and its chunks come from the partition's manifest and from ZooKeeper; each
    replica's local start and last transaction from its admin port (a node that does not report its
    local start shows 0); the lag is the committed high-water mark minus the archived-through. A
    replica told another archived-through than ZooKeeper's is flagged (the next run tells it).
    A storage node that does not answer is named once, with why.

    Exit codes: 0 every replica answered; 1 a storage node did not answer (what it holds is
    unknown); 2 the command could not run.
    """
    from waltz.archive.status import archive_status

    quiet_logging()
    with connected_admin(config, zookeeper, root, timeout) as admin:
        files = _archive_files(admin, archive)
        if files is not None:
            _require_an_archive(files, archive, admin.cluster.params().num_partitions)
        partitions = _partitions(admin, partition)
        report = archive_status(
            admin.cluster, files, partitions, timeout=admin.storage_timeout, tls=admin.tls
        )
    silent = report.unanswered
    if json_output:
        echo_json(report.to_json())
        if silent:
            raise typer.Exit(1)
        return
    typer.echo(f"archive: {report.location or '(none yet: waltz archive run --to LOCATION starts one)'}")
    for storage, error in silent.items():
        typer.echo(f"storage node {storage} did not answer: {error}")
    for line in report.partitions:
        if line.manifest_error is not None:
            held = f"manifest unreadable: {line.manifest_error}"
        elif line.first is None:
            held = "nothing archived"
        else:
            held = f"archived {line.first}..{line.archived_through} in {line.chunks} chunks"
            held += f" ({line.size_bytes:,} bytes)"
        mark = "unknown" if line.high_water_mark is None else str(line.high_water_mark)
        lag = "" if line.lag is None else f", lag {line.lag}"
        typer.echo(
            f"partition {line.partition_id}: {held}; ZooKeeper through {line.zookeeper.archived_through}; "
            f"committed through {mark}{lag}"
        )
        not_told = line.replicas_not_told
        for replica in line.replicas:
            if replica.storage in silent:
                typer.echo(f"  {replica.storage}: did not answer (above)")
                continue
            if replica.error is not None:
                typer.echo(f"  {replica.storage}: {replica.error}")
                continue
            told = (
                f"  {replica.storage}: local {replica.local_start}..{replica.max_transaction_id}, "
                f"archived through {replica.archived_through} as it was told"
            )
            if replica.storage in not_told:
                told += (
                    f" (NOT ZooKeeper's {line.zookeeper.archived_through}: the next waltz archive run "
                    "tells it)"
                )
            typer.echo(told)
    if report.not_archived:
        typer.echo(
            f"not archived: partition(s) {', '.join(map(str, report.not_archived))}, opened by a split: "
            "the archive does not follow a split yet (their records stay on the storage nodes, which "
            "delete archived segments only; a restore from the archive would not hold them)"
        )
    if silent:
        raise typer.Exit(1)


@app.command("verify")
def verify(
    archive: ArchiveOption = None,
    hold: Annotated[
        bool,
        typer.Option(
            "--hold",
            help="For each partition with a problem, lower its archived-through in ZooKeeper and on its "
            "replicas to its last good chunk (never above ZooKeeper's archived-through), so that no storage "
            "node deletes what the archive cannot give back; refused (exit 2) when --archive names another "
            "location than ZooKeeper's, such as a copy. With mutual TLS, telling the replicas needs a "
            "certificate of the admin role (cluster.ssl.certFile, cluster.ssl.keyFile).",
        ),
    ] = False,
    partition: PartitionsOption = [],  # noqa: B006 (typer reads the default)
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Check every chunk against its manifest and the manifests against ZooKeeper; exit 1 on a problem.

    A chunk is checked for its file's SHA-256 and size, its rows, contiguous transaction IDs, each
    record's data against its checksum, and its data_crc; a manifest for contiguous chunks and
    against the partition's entry in ZooKeeper. Each problem is named by its file and range.
    """
    from waltz.archive.errors import ArchiveError
    from waltz.archive.verify import check_holdable, hold_archived_through, verify_archive

    quiet_logging()
    with connected_admin(config, zookeeper, root, timeout) as admin:
        files = _archive_files(admin, archive)
        if files is None:
            raise fail(
                f"the cluster has no archive yet ({admin.cluster.paths.archive} is missing): give --archive "
                "LOCATION, or start one with waltz archive run --to LOCATION",
                2,
            )
        summary = admin.cluster.archive_summary()
        params = admin.cluster.params()
        _require_an_archive(files, archive, params.num_partitions)
        try:
            if hold:
                check_holdable(None if summary is None else summary.value, files)
            report = verify_archive(
                files,
                None if summary is None else summary.value,
                params.num_partitions,
                _partitions(admin, partition),
                progress=None if json_output else typer.echo,
            )
            if hold and not report.passed:
                hold_archived_through(
                    admin.cluster,
                    params,
                    files,
                    report,
                    operator=_operator(),
                    timeout=admin.storage_timeout,
                    tls=admin.tls,
                )
        except ArchiveError as exc:
            raise fail(str(exc), 2) from exc
    if json_output:
        echo_json(report.to_json())
    else:
        for note in report.notes:
            typer.echo(f"note: {note}")
        for problem in report.problems:
            typer.echo(f"FAILED: {problem.message}")
        for check in report.partitions:
            for note in check.notes:
                typer.echo(f"note: partition {check.partition_id}: {note}")
            for problem in check.problems:
                typer.echo(f"FAILED: {problem.message}")
            if check.held_to is not None and not check.hold_untold:
                typer.echo(
                    f"held: partition {check.partition_id} is archived through {check.held_to} in ZooKeeper "
                    "and on its replicas"
                )
            elif check.held_to is not None:
                typer.echo(
                    f"NOT HELD on every replica: partition {check.partition_id} is archived through "
                    f"{check.held_to} in ZooKeeper, but these replicas were not told, and may still delete "
                    "segments up to what they were told before (run verify --hold again, with a certificate "
                    "of the admin role, once they answer):"
                )
                for storage, why in check.hold_untold.items():
                    typer.echo(f"  {storage}: {why}")
            if check.lost_from_replicas:
                starts = ", ".join(f"{s} {start}" for s, start in sorted(check.local_starts.items()))
                # What no replica holds: up to the lowest local start (the rest, they still hold).
                gone = min(check.manifest_through, min(check.local_starts.values()) - 1)
                held = f"{check.good_through + 1}..{gone}"
                # The damaged chunks' own ranges: the held range also covers the good chunks after
                # the first damaged one, which the archive still holds intact.
                damaged = ", ".join(
                    f"{p.first}..{p.last}"
                    for p in check.problems
                    if p.first is not None and p.last is not None and p.first <= gone
                )
                typer.echo(
                    f"NOT IN THE REPLICAS: partition {check.partition_id} transactions {damaged or held} are "
                    f"damaged in the archive, and retention deleted {held} from every replica that answered "
                    f"(local starts: {starts}): `waltz archive run` cannot write them again; copy the "
                    "damaged chunks back from a copy of the archive (`waltz archive verify --archive COPY` "
                    "checks one)"
                )
        chunks = sum(c.chunks_checked for c in report.partitions)
        records = sum(c.records_checked for c in report.partitions)
        verdict = "OK" if report.passed else "FAILED"
        typer.echo(f"{verdict}: {chunks} chunks checked, {records} records verified in {report.location}")
    if not report.passed:
        raise typer.Exit(1)


@app.command("restore")
def restore(
    source: Annotated[
        str,
        typer.Option(
            "--from",
            help="The archive to restore from: a directory or a URL pyarrow opens (s3://bucket/path, ...).",
            show_default=False,
        ),
    ],
    name: Annotated[str, typer.Option("--name", "-n", help="The new cluster's name.", show_default=False)],
    storage: Annotated[
        list[str],
        typer.Option(
            "--storage",
            "-s",
            metavar="<host:port=admin_port[,group]>",
            help="A storage node of the new cluster, running with an empty directory, as "
            "`host:port=admin_port[,group]`. Repeat it.",
            show_default=False,
        ),
    ],
    replicas: ReplicasOption = None,
    cluster_key: Annotated[
        str | None,
        typer.Option(
            "--cluster-key",
            help="The new cluster's key (UUID). Only to finish a restore that was refused after some "
            "storage nodes took its key; default: a new key. --cluster-key-file keeps it off the "
            "command line.",
            show_default=False,
        ),
    ] = None,
    cluster_key_file: ClusterKeyFileOption = None,
    digest_dir: DigestDirOption = None,
    json_output: JsonOption = False,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    config: AdminConfigOption = None,
    timeout: TimeoutOption = None,
) -> None:
    """Make a new cluster from an archive: each partition's log continues where the archive ends.

    The archive is verified first, every chunk against its manifest (as waltz archive verify
    does); then the new cluster gets a new key and the archive's partition count; each
    partition's replicas are created on the storage nodes to start at its archived-through + 1,
    and its recovery state in ZooKeeper says the log is committed through archived-through, so
    the first store session starts there and new appends get the IDs after it. The znode
    ROOT/archive names the archive, and the new key's fingerprint is added to archive.json, so that waltz
    archive run --to the same location goes on archiving the new cluster.

    Nothing is written, and the command exits 1, when the archive fails verification (each
    problem named by file and range), the root holds a cluster already, or a storage node does
    not answer, belongs to another cluster or holds partitions. When some storage nodes took the
    new key before the refusal, the key is written to a file only you may read, named in the
    message: restore again with --cluster-key-file FILE. Start the servers of the new cluster
    afterwards; applications resume from their own high-water marks. With --digest-dir, the new
    cluster's znodes get the ACL of each role, as with waltz cluster create. With mutual TLS, the
    restore initialises the storage nodes: its certificate needs the admin role (cluster.ssl.certFile,
    cluster.ssl.keyFile).
    """
    import uuid

    from waltz.admin.cluster_admin import StorageSpec
    from waltz.archive.errors import ArchiveError
    from waltz.archive.layout import ArchiveFiles
    from waltz.archive.location import normal_location
    from waltz.archive.restore import RestoreRefusedError, restore_cluster
    from waltz.errors import WaltzError
    from waltz.metadata.zk_roles import RoleCredentials
    from waltz.protocol.cluster_key import cluster_key_fingerprint

    quiet_logging()
    specs = []
    for text in storage:
        try:
            specs.append(StorageSpec.parse(text))
        except WaltzError as exc:
            raise typer.BadParameter(str(exc), param_hint="--storage") from exc
    if cluster_key is not None and cluster_key_file is not None:
        raise typer.BadParameter("give --cluster-key or --cluster-key-file, not both")
    hint = "--cluster-key" if cluster_key_file is None else "--cluster-key-file"
    key_text = cluster_key if cluster_key_file is None else cluster_key_file.read_text().strip()
    try:
        key = None if key_text is None else uuid.UUID(key_text)
    except ValueError as exc:
        raise typer.BadParameter("the cluster key is not a UUID", param_hint=hint) from exc
    with connected_admin(config, zookeeper, root, timeout) as admin:
        try:
            files = ArchiveFiles.open(normal_location(source))
            credentials = RoleCredentials.load_or_generate(digest_dir) if digest_dir is not None else None
            result = restore_cluster(
                admin.cluster,
                files,
                name,
                specs,
                replicas,
                storage_timeout=admin.storage_timeout,
                tls=admin.tls,
                operator=_operator(),
                cluster_key=key,
                progress=None if json_output else typer.echo,
                credentials=credentials,
            )
        except RestoreRefusedError as exc:
            if exc.cluster_key is None:
                raise fail(str(exc), 1) from exc
            kept = _keep_cluster_key(exc.cluster_key)
            raise fail(
                f"{exc}\nthe key is in {kept} (readable by you only): restore again with "
                f"--cluster-key-file {kept}, then delete the file",
                1,
            ) from exc
        except ArchiveError as exc:
            raise fail(str(exc), 2) from exc
    if json_output:
        echo_json({"root": admin.root, **result.to_json()})
    else:
        for storage_name, why in sorted(result.failures.items()):
            typer.echo(f"FAILED: storage node {storage_name}: {why}")
        verdict = "restored" if result.ok else "restored with failures (delete it and restore again)"
        typer.echo(
            f"{verdict}: cluster {result.params.name!r} under {admin.root}, {result.params.num_partitions} "
            f"partitions, cluster key {cluster_key_fingerprint(result.params.cluster_key)}; start its servers"
        )
    if not result.ok:
        raise typer.Exit(1)
