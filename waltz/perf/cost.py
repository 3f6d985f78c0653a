"""What a perf run costs in CPU, and how well the storage nodes batched, read from the nodes' metrics.

Servers and storage nodes export ``process_cpu_seconds_total`` (prometheus-client's process
collector) on ``/metrics``; a run reads it from every node before and after, so that
``waltz perf producer`` can say how many microseconds of CPU each process spent per committed
transaction, beside the client processes' own (``time.process_time`` around the measured phase).
From the same readings come the records each storage node wrote per flush (fsync), from
``waltz_storage_appended_records_total`` and ``waltz_storage_append_flushes_total``: a storage
node's CPU per transaction falls as its batches grow
(docs/decisions/0001-group-commit-on-storage-nodes.md). And from each
server's ``waltz_server_commit_seconds`` histogram (its ``_sum`` and ``_count``), the mean time
from receiving an append to its commit (quorum of replicas durable): the part of a client's
submit-to-commit latency spent in the server and the storage nodes. And from each server's
``waltz_server_partition_lock_failures`` gauge, the appends its lock check refused: beside the
lock failures the clients count, those that cost a round trip to the server.
"""

from __future__ import annotations

import logging
import os
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from waltz.protocol.channels import TlsConfig

__all__ = [
    "COMMIT_METRIC",
    "CPU_METRIC",
    "FLUSHES_METRIC",
    "LOCK_FAILURES_METRIC",
    "RECORDS_METRIC",
    "NodeReading",
    "NodeUsage",
    "measure_nodes",
    "node_cpu_seconds",
    "process_cpu_seconds",
    "read_nodes",
]

log = logging.getLogger(__name__)

#: The family of prometheus-client's process collector that counts user + system CPU seconds.
CPU_METRIC = "process_cpu_seconds"


#: Storage node counters (summed over partitions) of the records appended and of the flushes.
RECORDS_METRIC = "waltz_storage_appended_records"
FLUSHES_METRIC = "waltz_storage_append_flushes"
#: A server's histogram of the seconds from receiving an append to its commit.
COMMIT_METRIC = "waltz_server_commit_seconds"
#: A server's counter of the records it committed, and its gauge of the store batches (append
#: requests to the replicas) each partition sent, both by partition.
COMMITTED_METRIC = "waltz_server_committed_records"
STORE_BATCHES_METRIC = "waltz_server_partition_store_batches"
#: A server's gauge, by partition, of the appends its lock check refused.
LOCK_FAILURES_METRIC = "waltz_server_partition_lock_failures"


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds that local process ``pid`` (all its threads) has spent so far,
    from ``/proc/<pid>/stat`` (Linux): for processes that export no metrics.

    Raises:
        OSError: no such process, or no ``/proc`` (not Linux).
    """
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class NodeReading:
    """What one node's ``/metrics`` said.

    Attributes:
        cpu_seconds: user + system CPU seconds of its process so far; None when not exported.
        appended_records: records a storage node appended so far, all partitions (0 elsewhere).
        append_flushes: its flushes (one fsync each) so far (0 elsewhere).
        commit_seconds: seconds a server's commits took so far, summed (receipt to commit; 0
            elsewhere).
        commits: the commits they add up (0 elsewhere).
        committed_records: records a server committed so far, all partitions (0 elsewhere).
        store_batches: store batches a server sent to the replicas so far, summed over the
            partitions it owns now (0 elsewhere).
        lock_failures: appends a server's lock check refused so far, summed over the partitions
            it owns now (None: the node exports no such gauge, as a storage node).
    """

    cpu_seconds: float | None
    appended_records: float = 0.0
    append_flushes: float = 0.0
    commit_seconds: float = 0.0
    commits: float = 0.0
    committed_records: float = 0.0
    store_batches: float = 0.0
    lock_failures: float | None = None


def read_nodes(
    urls: Mapping[str, str], timeout: float = 5.0, *, tls: TlsConfig | None = None
) -> dict[str, NodeReading]:
    """Read each node's ``/metrics`` endpoint.

    Args:
        urls: ``/metrics`` URL of each node, by name (``LocalCluster.metrics_urls()``).
        timeout: seconds to wait for each node.
        tls: the client TLS files of ``https`` URLs (a secure cluster's nodes answer only the
            operator, admin and server roles; docs/operations.md, "Who may read /metrics and
            /health"), or None.

    Returns:
        The reading of each node that answered with Prometheus text; a node that does not answer,
        or answers what does not parse, is left out with a warning in the log.
    """
    readings: dict[str, NodeReading] = {}
    for name, url in urls.items():
        try:
            context = (tls or TlsConfig()).https_context() if url.startswith("https:") else None
            with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
                text = response.read().decode("utf-8")
        except OSError as exc:
            log.warning("cannot read the metrics of %s at %s: %s", name, url, exc)
            continue
        cpu: float | None = None
        totals = {RECORDS_METRIC: 0.0, FLUSHES_METRIC: 0.0, COMMITTED_METRIC: 0.0}
        commit_seconds = commits = store_batches = 0.0
        lock_failures: float | None = None
        try:
            for family in text_string_to_metric_families(text):
                if family.name == CPU_METRIC:
                    cpu = float(family.samples[0].value)
                elif family.name in totals:
                    totals[family.name] = sum(
                        sample.value for sample in family.samples if sample.name.endswith("_total")
                    )
                elif family.name == STORE_BATCHES_METRIC:
                    store_batches = sum(sample.value for sample in family.samples)
                elif family.name == LOCK_FAILURES_METRIC:
                    lock_failures = sum(sample.value for sample in family.samples)
                elif family.name == COMMIT_METRIC:
                    for sample in family.samples:
                        if sample.name == f"{COMMIT_METRIC}_sum":
                            commit_seconds += sample.value
                        elif sample.name == f"{COMMIT_METRIC}_count":
                            commits += sample.value
        except (ValueError, IndexError) as exc:  # not the Prometheus text format
            log.warning("cannot parse the metrics of %s at %s: %s", name, url, exc)
            continue
        readings[name] = NodeReading(
            cpu,
            totals[RECORDS_METRIC],
            totals[FLUSHES_METRIC],
            commit_seconds,
            commits,
            totals[COMMITTED_METRIC],
            store_batches,
            lock_failures,
        )
    return readings


def node_cpu_seconds(urls: Mapping[str, str], timeout: float = 5.0) -> dict[str, float]:
    """The CPU seconds each node's process has used so far, from its ``/metrics`` endpoint.

    Args:
        urls: ``/metrics`` URL of each node, by name (``LocalCluster.metrics_urls()``).
        timeout: seconds to wait for each node.

    Returns:
        CPU seconds by node name; a node that does not answer (or answers what does not parse as
        Prometheus text), or exports no ``process_cpu_seconds_total`` (not on Linux), is left out
        with a warning in the log.
    """
    seconds: dict[str, float] = {}
    for name, reading in read_nodes(urls, timeout).items():
        if reading.cpu_seconds is None:
            log.warning("%s exports no %s_total at %s", name, CPU_METRIC, urls[name])
        else:
            seconds[name] = reading.cpu_seconds
    return seconds


@dataclass(slots=True)
class NodeUsage:
    """What the nodes spent during a :func:`measure_nodes` block (filled in when it ends).

    Attributes:
        cpu_seconds: CPU seconds each node's process spent, by name.
        storage_batches: for each storage node that flushed: ``(records, flushes)`` appended and
            made durable during the block.
        server_commits: for each server that committed: ``(seconds, commits)``, the receipt-to-commit
            seconds of its commits during the block, summed, and their number.
        server_batches: for each server that sent store batches: ``(records, batches)``, the
            records it committed and the store batches it sent during the block.
        server_lock_failures: for each server, the appends its lock check refused during the
            block (a server whose count went down, as a partition left it, is left out).
    """

    cpu_seconds: dict[str, float] = field(default_factory=dict)
    storage_batches: dict[str, tuple[float, float]] = field(default_factory=dict)
    server_commits: dict[str, tuple[float, float]] = field(default_factory=dict)
    server_batches: dict[str, tuple[float, float]] = field(default_factory=dict)
    server_lock_failures: dict[str, float] = field(default_factory=dict)


@contextmanager
def measure_nodes(urls: Mapping[str, str], tls: TlsConfig | None = None) -> Iterator[NodeUsage]:
    """Yield a :class:`NodeUsage` that holds, once the block ends, what each node spent during it
    (``tls``: as :func:`read_nodes` takes it).

    Nodes missing from either reading (unreachable, restarted in between: a counter went down)
    are left out.
    """
    usage = NodeUsage()
    before = read_nodes(urls, tls=tls)
    yield usage
    after = read_nodes(urls, tls=tls)
    for name, reading in after.items():
        earlier = before.get(name)
        if earlier is None:
            continue
        if reading.cpu_seconds is None or earlier.cpu_seconds is None:
            log.warning("%s exports no %s_total at %s", name, CPU_METRIC, urls[name])
        elif reading.cpu_seconds >= earlier.cpu_seconds:
            usage.cpu_seconds[name] = reading.cpu_seconds - earlier.cpu_seconds
        flushes = reading.append_flushes - earlier.append_flushes
        records = reading.appended_records - earlier.appended_records
        if flushes > 0 and records >= 0:
            usage.storage_batches[name] = (records, flushes)
        commits = reading.commits - earlier.commits
        commit_seconds = reading.commit_seconds - earlier.commit_seconds
        if commits > 0 and commit_seconds >= 0:
            usage.server_commits[name] = (commit_seconds, commits)
        # A partition that left the server took its batch count with it: a count that went down is left out.
        sent = reading.store_batches - earlier.store_batches
        committed = reading.committed_records - earlier.committed_records
        if sent > 0 and committed >= 0:
            usage.server_batches[name] = (committed, sent)
        if reading.lock_failures is not None and earlier.lock_failures is not None:
            refused = reading.lock_failures - earlier.lock_failures
            if refused >= 0:
                usage.server_lock_failures[name] = refused
