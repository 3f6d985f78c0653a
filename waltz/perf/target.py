"""The cluster a perf run targets: an existing one (ZooKeeper + root) or a LocalCluster it starts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from waltz.client import WaltzClientConfig
from waltz.config import load_settings
from waltz.protocol.channels import TlsConfig

__all__ = ["LocalClusterSpec", "PerfTarget", "perf_cluster"]


@dataclass(frozen=True, slots=True)
class LocalClusterSpec:
    """A local cluster to start for the run (see :class:`~waltz.local.cluster.LocalCluster`).

    Attributes:
        storages: storage nodes (replicas: ``min(3, storages)``).
        servers: servers.
        partitions: partitions.
        server_env: ``WALTZ_*`` settings of the servers (batch and linger settings, for instance).
        secure: mutual TLS with role certificates and ZooKeeper credentials (the default of a
            local cluster); False serves plaintext, to measure what TLS costs.
    """

    storages: int = 3
    servers: int = 1
    partitions: int = 1
    server_env: Mapping[str, str] = field(default_factory=dict)
    secure: bool = True


@dataclass(frozen=True, slots=True)
class PerfTarget:
    """The cluster of a perf run.

    Attributes:
        config: the client configuration that reaches it.
        metrics_urls: ``/metrics`` URL of each server and storage node by name, for their CPU per
            transaction; empty for an existing cluster (its nodes are not known to the run).
        metrics_tls: the client TLS files that read those URLs (the operator's certificate of a
            secure local cluster), or None.
    """

    config: WaltzClientConfig
    metrics_urls: Mapping[str, str] = field(default_factory=dict)
    metrics_tls: TlsConfig | None = None


@contextmanager
def perf_cluster(
    local: LocalClusterSpec | None,
    *,
    config_file: Path | None = None,
    zookeeper: str | None = None,
    root: str | None = None,
) -> Iterator[PerfTarget]:
    """Yield the target cluster (its client configuration), starting a local one if asked.

    Args:
        local: start this local cluster (stopped when the block ends); None targets an existing
            cluster named by ``config_file``/``zookeeper``/``root`` (or ``WALTZ_*`` variables).
        config_file: a client YAML file (``zookeeper.connectString``, ``cluster.root``, ``client.*``).
        zookeeper: ZooKeeper connect string, over the file's.
        root: cluster root znode, over the file's.

    Raises:
        ConfigurationError: no ZooKeeper or root for an existing cluster, or a bad file.
        ServiceStartError, ClusterNotReadyError: the local cluster did not start.
    """
    if local is None:
        config = load_settings(
            WaltzClientConfig, config_file, zookeeper_connect_string=zookeeper, cluster_root=root
        )
        yield PerfTarget(config)
        return
    from waltz.local.cluster import LocalCluster
    from waltz.local.options import ProcessOptions, SecurityOptions

    with LocalCluster(
        storages=local.storages,
        servers=local.servers,
        partitions=local.partitions,
        processes=ProcessOptions(
            server_env=local.server_env,
            metrics=True,  # for the nodes' CPU per transaction (process_cpu_seconds_total)
            start_timeout=120.0,
        ),
        security=SecurityOptions() if local.secure else SecurityOptions.plaintext(),
    ) as cluster:
        files = cluster.certificates
        yield PerfTarget(
            load_settings(WaltzClientConfig, config_file, **cluster.client_settings()),
            cluster.metrics_urls(),
            None if files is None else files.tls("operator"),
        )
