"""The options and arguments that more than one ``waltz`` command takes, each declared once.

A command names its parameter with one of these types (``json_output: JsonOption = False``), so
that a flag spelled the same way means the same thing, with the same help, everywhere. An option
only one command takes is declared at that command.

Only typer here, so that importing the groups stays cheap (``waltz --help`` imports them); the
commands import what they use inside their bodies.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from waltz.logs import configure_logging

__all__ = [
    "ActivePartitionsOption",
    "AdminConfigOption",
    "ArchiveOption",
    "CheckpointIntervalOption",
    "ClientConfigOption",
    "ClusterFilterOption",
    "ClusterKeyFileOption",
    "DatabaseUrlFileOption",
    "DatabaseUrlOption",
    "DiskPartitionOption",
    "ForceOption",
    "InFlightOption",
    "JsonOption",
    "LocalOption",
    "LocalPartitionsOption",
    "LocalSecureOption",
    "LocalServersOption",
    "LocalStoragesOption",
    "LogLevelOption",
    "NodesLogLevelOption",
    "OptionalDatabaseUrlOption",
    "PartitionsOption",
    "ReplicasOption",
    "RootOption",
    "RunTimeoutOption",
    "SegmentArgument",
    "ServerArgument",
    "ShowKeyOption",
    "SizeOption",
    "StorageArgument",
    "StorageDirArgument",
    "TimeoutOption",
    "TlsCaOption",
    "TlsCertOption",
    "TlsKeyOption",
    "YesOption",
    "ZookeeperOption",
    "quiet_logging",
    "secret_value",
]


def quiet_logging() -> None:
    """Log errors only (``WALTZ_LOG_LEVEL`` overrides): the operator commands print their results."""
    configure_logging(os.environ.get("WALTZ_LOG_LEVEL", "ERROR"))


# --- what every command prints ----------------------------------------------------------------------

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of text.")]
LogLevelOption = Annotated[str, typer.Option(help="Log level of this process.")]
NodesLogLevelOption = Annotated[
    str,
    typer.Option(help="Log level of this process (the nodes it starts log to files in the work directory)."),
]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ClusterKeyFileOption = Annotated[
    Path | None,
    typer.Option(
        "--cluster-key-file",
        help="A file holding the cluster key (a UUID), so that the key is never on a command line.",
        show_default=False,
        exists=True,
        dir_okay=False,
    ),
]
ShowKeyOption = Annotated[
    bool,
    typer.Option(
        "--show-key",
        help="Also print the cluster key itself (a secret: it initialises and opens storage nodes). "
        "Without it only its fingerprint (sha256: and 64 hex digits) is printed.",
    ),
]

# --- reaching a cluster -----------------------------------------------------------------------------

ZookeeperOption = Annotated[
    str | None,
    typer.Option(
        "--zookeeper",
        "-z",
        help="ZooKeeper connect string `host:port[,host:port...]` "
        "(zookeeper.connectString, WALTZ_ZOOKEEPER_CONNECT_STRING).",
        show_default=False,
    ),
]
RootOption = Annotated[
    str | None,
    typer.Option(
        "--root",
        "-r",
        help="Cluster root znode, e.g. /waltz/cluster1 (cluster.root, WALTZ_CLUSTER_ROOT).",
        show_default=False,
    ),
]
AdminConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="YAML file with `zookeeper.*` and `cluster.*` keys (docs/zookeeper.md); `cluster.ssl.*` "
        "are the TLS files for the nodes' ports.",
        exists=True,
        dir_okay=False,
        show_default=False,
    ),
]
ClientConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="Client YAML file (zookeeper.connectString, cluster.root, `client.*` keys such as "
        "client.ssl.caFile).",
        exists=True,
        dir_okay=False,
        show_default=False,
    ),
]
DigestDirOption = Annotated[
    Path | None,
    typer.Option(
        "--digest-dir",
        help="Directory of the ZooKeeper credentials per role: server.digest, operator.digest, "
        "client.digest (user:password, mode 0600), made when absent. Every znode then gets an ACL per "
        'role and clients cannot read the cluster key (docs/deploy.md, "ZooKeeper credentials").',
        file_okay=False,
        show_default=False,
    ),
]
TimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        min=0.1,
        help="Seconds to wait for ZooKeeper and for each node "
        "(zookeeper.connectTimeout, cluster.storageTimeout; default 10).",
        show_default=False,
    ),
]
TlsCaOption = Annotated[
    Path | None,
    typer.Option(
        "--ssl-ca-file",
        exists=True,
        dir_okay=False,
        help="PEM CA bundle verifying the nodes (over client.ssl.caFile).",
        show_default=False,
    ),
]
TlsCertOption = Annotated[
    Path | None,
    typer.Option(
        "--ssl-cert-file",
        exists=True,
        dir_okay=False,
        help="PEM client certificate chain (over client.ssl.certFile).",
        show_default=False,
    ),
]
TlsKeyOption = Annotated[
    Path | None,
    typer.Option(
        "--ssl-key-file",
        exists=True,
        dir_okay=False,
        help="PEM private key of the client certificate (over client.ssl.keyFile).",
        show_default=False,
    ),
]

# --- partitions, storage nodes and servers of a cluster ---------------------------------------------

PartitionsOption = Annotated[
    list[str],
    typer.Option(
        "--partition",
        "-p",
        metavar="<ids>",
        help="Partition IDs: repeat the option, or give a list with ranges such as `0,2,5-7`.",
        show_default=False,
    ),
]
StorageArgument = Annotated[
    str,
    typer.Argument(
        help="The storage node's connect string `host:port` (its storage port).", show_default=False
    ),
]
ServerArgument = Annotated[
    str,
    typer.Argument(
        help="The server: its name, endpoint `host:port`, member name or server ID (as `waltz server list` "
        "shows). An endpoint that is not live now is accepted: the preference applies when it registers.",
        show_default=False,
    ),
]
ReplicasOption = Annotated[
    int | None,
    typer.Option(
        "--replicas",
        min=1,
        help="Replicas per partition, spread round-robin over the storage nodes. "
        "Default: every partition on every node.",
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

# --- a local cluster for the run (--local) ----------------------------------------------------------

LocalOption = Annotated[
    bool,
    typer.Option("--local", help="Start a local cluster (processes on loopback) for the run, then stop it."),
]
LocalStoragesOption = Annotated[
    int, typer.Option(min=1, help="--local: storage nodes (replication min(3, N)).")
]
LocalServersOption = Annotated[int, typer.Option(min=1, help="--local: servers.")]
LocalPartitionsOption = Annotated[int, typer.Option(min=1, help="--local: the cluster's partitions.")]
LocalSecureOption = Annotated[
    bool,
    typer.Option(
        "--secure/--insecure",
        help="--local: mutual TLS with role certificates and ZooKeeper credentials (the default), "
        "or plaintext with --insecure (to measure what TLS costs).",
    ),
]

# --- performance runs -------------------------------------------------------------------------------

RunTimeoutOption = Annotated[float, typer.Option(min=1.0, help="Seconds the measured phase may take.")]
PartitionRoutingOption = Annotated[
    bool,
    typer.Option(
        "--partition-routing",
        help=(
            "Partition-routed instances: instance i of N mounts the partitions p with p mod N = i and "
            "takes only the requests of their entities (customers, SKUs), as behind a router that sends "
            "each request to the instance of its entity's partition (docs/sql.md, \"Applying the log "
            'exactly once"), so each partition is applied by one instance. At most one instance per '
            "partition. Default: every instance mounts every partition and takes any request."
        ),
    ),
]
SizeOption = Annotated[int, typer.Option("--size", "-s", min=0, help="Payload bytes per transaction.")]
InFlightOption = Annotated[
    int, typer.Option("--in-flight", min=1, help="Transactions each client keeps in flight at most.")
]
ActivePartitionsOption = Annotated[
    int | None,
    typer.Option(
        "--active-partitions",
        min=1,
        help="Write partitions 0..N-1 only (default: every partition).",
        show_default=False,
    ),
]

# --- a storage node's files, offline ----------------------------------------------------------------

StorageDirArgument = Annotated[
    Path,
    typer.Argument(help="The storage directory (the one holding waltz-storage.ctl).", show_default=False),
]
SegmentArgument = Annotated[
    Path,
    typer.Argument(
        help="A segment data file: `<storage dir>/<partition>/<first transaction ID, 19 digits>.seg`.",
        show_default=False,
    ),
]
DiskPartitionOption = Annotated[
    list[int] | None,
    typer.Option(
        "--partition",
        "-p",
        metavar="<partition>",
        help="Only this partition (repeatable; default: every partition of the directory).",
    ),
]
CheckpointIntervalOption = Annotated[
    int,
    typer.Option(
        min=1,
        help="The node's storage.index.checkpointInterval: index entries after the last checkpoint of "
        "the last segment are rebuilt at start-up, so problems there are warnings.",
    ),
]

# --- an application database ------------------------------------------------------------------------

DatabaseUrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        "--db",
        envvar="WALTZ_DB_URL",
        help="The application database's SQLAlchemy URL, e.g. "
        "`postgresql+psycopg://user:password@host:5432/app` or `mysql+pymysql://user@host/app`.",
        show_default=False,
    ),
]
#: ``--url`` (or ``--db``, as ``waltz rebuild``, ``demo`` and ``perf`` name it) where a file may
#: give it instead (``--url-file``; a URL holding a password on the command line is visible to
#: every user of the machine in ``ps``).
OptionalDatabaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        "--db",
        envvar="WALTZ_DB_URL",
        help="The application database's SQLAlchemy URL, e.g. "
        "`postgresql+psycopg://user:password@host:5432/app`; with a password, prefer WALTZ_DB_URL or "
        "--url-file (the command line shows in `ps`).",
        show_default=False,
    ),
]
DatabaseUrlFileOption = Annotated[
    Path | None,
    typer.Option(
        "--url-file",
        "--db-file",
        envvar="WALTZ_DB_URL_FILE",
        help="A file holding the database URL (its first line), instead of --url.",
        show_default=False,
    ),
]


def secret_value(value: str | None, file: Path | None, option: str, *, required: bool = True) -> str | None:
    """A secret given on the command line, in an environment variable, or in a file.

    Args:
        value: the option's value (typer has read its environment variable already).
        file: a file whose first line is the value, or None.
        option: the option's name (``--url``); its file option is ``<option>-file``.
        required: whether one of the two must be given.

    Returns:
        The value, or None when neither is given and it is not required.

    Raises:
        typer.BadParameter: both are given, neither is (when required), or the file cannot be read
            or is empty; the message names the option and the file.
    """
    if value is not None and file is not None:
        raise typer.BadParameter(f"give {option} or {option}-file, not both")
    if file is None:
        if value is None and required:
            raise typer.BadParameter(f"give {option} (or its environment variable) or {option}-file")
        return value
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise typer.BadParameter(f"{option}-file {file}: cannot read it: {exc.strerror or exc}") from exc
    first = lines[0].strip() if lines else ""
    if not first:
        raise typer.BadParameter(f"{option}-file {file} is empty: its first line must hold the value")
    return first


ClusterFilterOption = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        help="Only the rows of this cluster_name (the name the callbacks were given; default: all).",
        show_default=False,
    ),
]

# --- the archive ------------------------------------------------------------------------------------

ArchiveOption = Annotated[
    str | None,
    typer.Option(
        "--archive",
        help="The archive to read: a directory or a URL pyarrow opens (default: the one ZooKeeper names, "
        "<root>/archive).",
        show_default=False,
    ),
]
