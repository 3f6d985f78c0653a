"""The archiver's metrics (docs/operations.md, "Archiver metrics"): chunks, records and bytes
written, each partition's archived-through, committed high-water mark and lag, served by ``waltz
archive run --follow --metrics-port`` while it keeps up with a log that grows."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.archive.archive_helpers import write_with_client
from waltz.archive.archiver import PartitionRound
from waltz.archive.manifests import ChunkEntry
from waltz.archive.metrics import ArchiverMetrics
from waltz.local.cluster import LocalCluster
from waltz.local.processes import free_port, wait_until
from waltz.metadata.zk import ClusterZk


def _entry(first: int, last: int, size: int) -> ChunkEntry:
    return ChunkEntry(first, last, f"{first}-{last}", last - first + 1, size, "0" * 64, 0, ("a:1",), "now")


def test_chunks_and_rounds_set_the_counters_and_each_partitions_lag() -> None:
    metrics = ArchiverMetrics()
    metrics.chunk_added(0, _entry(0, 99, 5000))
    metrics.chunk_added(0, _entry(100, 149, 2500))
    metrics.round_done(
        [
            PartitionRound(0, high_water_mark=180, archived_through=149, untold={"a:1": "refused"}),
            PartitionRound(1, high_water_mark=-1, archived_through=-1),
        ]
    )
    value = metrics.registry.get_sample_value
    assert value("waltz_archive_chunks_total", {"partition": "0"}) == 2
    assert value("waltz_archive_records_total", {"partition": "0"}) == 150
    assert value("waltz_archive_bytes_total", {"partition": "0"}) == 7500
    assert value("waltz_archive_archived_through", {"partition": "0"}) == 149
    assert value("waltz_archive_lag_transactions", {"partition": "0"}) == 31
    assert value("waltz_archive_lag_transactions", {"partition": "1"}) == 0
    assert value("waltz_archive_rounds_total") == 1
    assert value("waltz_archive_replicas_not_told", {"partition": "0"}) == 1
    assert value("waltz_archive_replicas_not_told", {"partition": "1"}) == 0
    assert metrics.stopped_partitions() == []
    # A stopped partition keeps its last marks and is named until a round goes through.
    metrics.round_done([PartitionRound(0, error="replicas disagree")])
    assert metrics.stopped_partitions() == [0]
    assert value("waltz_archive_archived_through", {"partition": "0"}) == 149
    metrics.round_done([PartitionRound(0, high_water_mark=200, archived_through=200)])
    assert metrics.stopped_partitions() == []
    assert value("waltz_archive_replicas_not_told", {"partition": "0"}) == 0
    assert value("waltz_archive_lag_transactions", {"partition": "0"}) == 0


def _samples(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels.get("partition", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("waltz_archive_")
    }


def test_follow_serves_the_metrics_as_the_log_grows(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path
) -> None:
    write_with_client(cluster, 0, 20)
    port = free_port()
    command = [sys.executable, "-m", "waltz", "archive", "run", "--follow", "--to", str(location)]
    command += ["--interval", "0.5", "--chunk-transactions", "50", "--seal-after", "0"]
    command += ["--metrics-port", str(port)]  # on loopback by default
    command += ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:

        def caught_up() -> dict[tuple[str, str], float] | None:
            samples = _samples(port)
            marks = [samples.get(("waltz_archive_committed_high_water_mark", str(p))) for p in (0, 1)]
            through = [samples.get(("waltz_archive_archived_through", str(p))) for p in (0, 1)]
            lags = [samples.get(("waltz_archive_lag_transactions", str(p))) for p in (0, 1)]
            return samples if None not in marks and marks == through and lags == [0, 0] else None

        first = wait_until(caught_up, timeout=120, interval=0.5, what="the archiver to catch up (lag 0)")
        mark = first[("waltz_archive_archived_through", "0")]
        assert mark >= 19
        assert first[("waltz_archive_chunks_total", "0")] >= 1
        assert first[("waltz_archive_records_total", "0")] == mark + 1
        assert first[("waltz_archive_bytes_total", "0")] > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as health:
            assert health.status == 200

        write_with_client(cluster, 0, 30)
        later = wait_until(
            lambda: (
                (s := caught_up()) is not None
                and s[("waltz_archive_archived_through", "0")] >= mark + 30
                and s
            ),
            timeout=120,
            interval=0.5,
            what="the archiver to archive the new transactions",
        )
        assert (
            later[("waltz_archive_records_total", "0")] == later[("waltz_archive_archived_through", "0")] + 1
        )
        assert later[("waltz_archive_chunks_total", "0")] > first[("waltz_archive_chunks_total", "0")]
        assert later[("waltz_archive_rounds_total", "")] > first[("waltz_archive_rounds_total", "")]
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, output
    assert f"metrics on http://127.0.0.1:{port}/metrics" in output
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
        raise AssertionError("the endpoint outlived the archiver")
    except (urllib.error.URLError, ConnectionError):
        pass
