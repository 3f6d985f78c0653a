"""waltz-py: a LocalCluster (3 storage nodes, RF 3) and ``waltz perf producer``'s clients.

Each transaction has the 200-byte payload as raw data and one WRITE lock from the pool; the
client high-water mark (the client's last applied transaction of the partition) is the
concurrency check (docs/design/locks.md, "Optimistic locking in Waltz"), and a lock failure
makes the client re-execute (a retry). Storage nodes fsync every batch before the server counts
it toward the quorum (group commit; docs/design/server.md, "Quorum writes and batching").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from benchmarks.peers.common import result
from waltz.perf.loadgen import LoadSpec
from waltz.perf.producer import ProducerSettings, run_producer
from waltz.perf.target import LocalClusterSpec, perf_cluster
from waltz.services.server.config import ServerConfig

_BATCH_KEYS = {
    "store_max_batch_size": "WALTZ_STORE_MAX_BATCH_SIZE",
    "store_max_in_flight_batches": "WALTZ_STORE_MAX_IN_FLIGHT_BATCHES",
    "store_linger": "WALTZ_STORE_LINGER",
}


def batch_settings(server_env: Mapping[str, str]) -> str:
    """The servers' batch and linger settings in effect, for the result row.

    Args:
        server_env: the servers' environment given for the run (``WALTZ_STORE_*``).

    Returns:
        ``store_max_batch_size=..., store_max_in_flight_batches=..., store_linger=...``: each as
        given, else from this process's environment, else the default.
    """
    parts = []
    for field, variable in _BATCH_KEYS.items():
        value = server_env.get(variable, os.environ.get(variable))
        if value is None:
            value = str(ServerConfig.model_fields[field].default)
        parts.append(f"{variable.removeprefix('WALTZ_').lower()}={value}")
    return ", ".join(parts)


def run(
    partitions: int,
    servers: int,
    spec: LoadSpec,
    clients: int = 1,
    server_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Start a local cluster, run ``clients`` producer clients, stop it.

    Args:
        partitions: the cluster's partitions.
        servers: its servers.
        spec: the load.
        clients: producer client processes.
        server_env: the servers' environment (e.g. ``WALTZ_STORE_LINGER``).

    Returns:
        The result row (``common.result``'s keys, with the CPU per transaction of every process).
    """
    env = dict(server_env or {})
    with perf_cluster(LocalClusterSpec(3, servers, partitions, env)) as target:
        stats = run_producer(target.config, ProducerSettings(clients, spec), target.metrics_urls)
        retry_linger = target.config.client_retry_linger
    settings = (
        f"{batch_settings(env)}; fsync per storage batch; {clients} client process(es), "
        f"client.maxConcurrentTransactions={max(spec.max_in_flight, 4000)}, "
        f"client.retryLinger={retry_linger:g}"
    )
    topology = f"{partitions} partition(s), {servers} server(s), 3 storage nodes RF 3"
    return result("waltz-py", topology, settings, spec, stats)
