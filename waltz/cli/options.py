"""Options shared by the operator commands of ``waltz server``, ``waltz storage`` and ``waltz client``.

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
    "AdminConfigOption",
    "ClientConfigOption",
    "ClusterConfigOption",
    "ClusterTimeoutOption",
    "ForceOption",
    "JsonOption",
    "LocalOption",
    "PartitionsOption",
    "RootOption",
    "StorageArgument",
    "TimeoutOption",
    "TlsCaOption",
    "TlsCertOption",
    "TlsKeyOption",
    "ZookeeperOption",
    "quiet_logging",
]


def quiet_logging() -> None:
    """Log errors only (``WALTZ_LOG_LEVEL`` overrides): the operator commands print their results."""
    configure_logging(os.environ.get("WALTZ_LOG_LEVEL", "ERROR"))


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
        help="YAML file with `zookeeper.*` and `cluster.*` keys, as `waltz cluster` takes "
        "(cluster.ssl.* are the TLS files for the nodes' ports).",
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
        "client.ssl.caFile), as `waltz perf` takes.",
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
        help="Seconds to wait for ZooKeeper and for each node (default 10).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of text.")]
PartitionsOption = Annotated[
    list[str],
    typer.Option(
        "--partition",
        "-p",
        help="Partition IDs: repeat the option, or give a list with ranges such as `0,2,5-7`.",
        show_default=False,
    ),
]
LocalOption = Annotated[
    bool,
    typer.Option("--local", help="Start a local cluster (processes on loopback) for the run, then stop it."),
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
ClusterConfigOption = Annotated[
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
ClusterTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        min=0.1,
        help="Seconds to wait for ZooKeeper and for each storage node "
        "(zookeeper.connectTimeout, cluster.storageTimeout; default 10).",
        show_default=False,
    ),
]
StorageArgument = Annotated[
    str,
    typer.Argument(
        help="The storage node's connect string `host:port` (its storage port).", show_default=False
    ),
]
ForceOption = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Override the replica-change safety rules. DANGEROUS: may lose committed transactions.",
    ),
]
