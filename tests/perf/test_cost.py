"""Reading the cluster processes' CPU and the storage nodes' batching from their metrics
(waltz.perf.cost), against real HTTP endpoints served by prometheus-client."""

from __future__ import annotations

import http.server
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)

from waltz.local.processes import free_port
from waltz.perf.cost import measure_nodes, node_cpu_seconds, process_cpu_seconds, read_nodes


@contextmanager
def endpoint(registry: CollectorRegistry) -> Iterator[str]:
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        server.shutdown()
        thread.join(5)


def test_cpu_seconds_come_from_each_nodes_process_collector() -> None:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    with endpoint(registry) as url:
        with measure_nodes({"server-0": url}) as usage:
            sum(i * i for i in range(3_000_000))  # CPU of this process, which the endpoint reports
        assert usage.cpu_seconds["server-0"] > 0
        assert node_cpu_seconds({"server-0": url})["server-0"] > usage.cpu_seconds["server-0"]
        assert usage.storage_batches == {}  # no storage counters: not a storage node


def test_nodes_that_do_not_answer_or_export_no_cpu_are_left_out(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    Counter("waltz_something", "not a process metric", registry=registry).inc()
    down = f"http://127.0.0.1:{free_port()}/metrics"
    with (
        endpoint(registry) as bare,
        caplog.at_level(logging.WARNING, logger="waltz.perf.cost"),
        measure_nodes({"storage-0": bare, "storage-1": down}) as usage,
    ):
        pass
    assert usage.cpu_seconds == {}
    assert usage.storage_batches == {}
    assert "storage-0 exports no process_cpu_seconds_total" in caplog.text
    assert "cannot read the metrics of storage-1" in caplog.text


class _NotMetrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html><body>a proxy's page</body></html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_answer_that_is_not_prometheus_text_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotMetrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with caplog.at_level(logging.WARNING, logger="waltz.perf.cost"):
            assert node_cpu_seconds({"server-0": url}) == {}
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()
    assert "cannot parse the metrics of server-0" in caplog.text


def test_storage_batches_are_the_records_and_flushes_of_the_block_over_all_partitions() -> None:
    """The storage node's counters carry a partition label: the reading sums them; a node that did
    not flush during the block is left out of the batches (nothing to divide)."""
    registry = CollectorRegistry()
    records = Counter("waltz_storage_appended_records", "records", ["partition"], registry=registry)
    flushes = Counter("waltz_storage_append_flushes", "flushes", ["partition"], registry=registry)
    records.labels("0").inc(500)
    flushes.labels("0").inc(7)
    idle_registry = CollectorRegistry()
    idle_flushes = Counter("waltz_storage_append_flushes", "flushes", ["partition"], registry=idle_registry)
    idle_flushes.labels("0").inc(3)
    with endpoint(registry) as busy, endpoint(idle_registry) as idle:
        assert read_nodes({"storage-0": busy})["storage-0"].appended_records == 500
        with measure_nodes({"storage-0": busy, "storage-1": idle}) as usage:
            records.labels("0").inc(120)
            records.labels("3").inc(80)
            flushes.labels("0").inc(3)
            flushes.labels("3").inc(1)
        assert usage.storage_batches == {"storage-0": (200.0, 4.0)}


def test_server_commits_are_the_commit_seconds_and_count_of_the_block() -> None:
    """A server's commit histogram gives the mean receipt-to-commit time of the block's commits;
    a server without commits during the block (or without the histogram) is left out."""
    registry = CollectorRegistry()
    commits = Histogram("waltz_server_commit_seconds", "commits", registry=registry)
    commits.observe(1.0)  # before the block: not counted
    idle_registry = CollectorRegistry()
    Histogram("waltz_server_commit_seconds", "commits", registry=idle_registry).observe(0.5)
    with endpoint(registry) as busy, endpoint(idle_registry) as idle:
        reading = read_nodes({"server-0": busy})["server-0"]
        assert (reading.commit_seconds, reading.commits) == (1.0, 1.0)
        with measure_nodes({"server-0": busy, "server-1": idle}) as usage:
            for seconds in (0.002, 0.004, 0.009):
                commits.observe(seconds)
    assert usage.server_commits.keys() == {"server-0"}
    total, count = usage.server_commits["server-0"]
    assert count == 3
    assert total == pytest.approx(0.015)
    assert usage.storage_batches == {}


def test_server_batches_are_the_committed_records_and_store_batches_of_the_block() -> None:
    """Records committed and store batches sent, summed over partitions: the server's counter and
    its per-partition gauge; a server whose batch count went down (a partition left it) or that
    sent nothing during the block is left out."""
    registry = CollectorRegistry()
    committed = Counter("waltz_server_committed_records", "records", ["partition"], registry=registry)
    batches = Gauge("waltz_server_partition_store_batches", "batches", ["partition"], registry=registry)
    committed.labels("0").inc(1000)
    batches.labels("0").set(10)
    idle_registry = CollectorRegistry()
    Gauge("waltz_server_partition_store_batches", "batches", ["partition"], registry=idle_registry).labels(
        "0"
    ).set(4)
    moved_registry = CollectorRegistry()
    moved = Gauge("waltz_server_partition_store_batches", "batches", ["partition"], registry=moved_registry)
    moved.labels("1").set(50)
    with endpoint(registry) as busy, endpoint(idle_registry) as idle, endpoint(moved_registry) as gone:
        reading = read_nodes({"server-0": busy})["server-0"]
        assert (reading.committed_records, reading.store_batches) == (1000.0, 10.0)
        with measure_nodes({"server-0": busy, "server-1": idle, "server-2": gone}) as usage:
            committed.labels("0").inc(300)
            committed.labels("3").inc(100)
            batches.labels("0").set(12)
            batches.labels("3").set(3)
            moved.remove("1")
    assert usage.server_batches == {"server-0": (400.0, 5.0)}
    assert usage.storage_batches == {}


def test_server_lock_failures_are_the_refusals_of_the_block_summed_over_partitions() -> None:
    """A server's per-partition gauge of refused appends, summed; a node without the gauge (a
    storage node) and a server whose count went down (a partition left it) are left out."""
    registry = CollectorRegistry()
    refused = Gauge("waltz_server_partition_lock_failures", "refused", ["partition"], registry=registry)
    refused.labels("0").set(7)
    moved_registry = CollectorRegistry()
    moved = Gauge("waltz_server_partition_lock_failures", "refused", ["partition"], registry=moved_registry)
    moved.labels("1").set(40)
    storage_registry = CollectorRegistry()
    Counter("waltz_storage_appended_records", "records", registry=storage_registry).inc(10)
    with endpoint(registry) as busy, endpoint(moved_registry) as gone, endpoint(storage_registry) as storage:
        assert read_nodes({"server-0": busy})["server-0"].lock_failures == 7.0
        assert read_nodes({"storage-0": storage})["storage-0"].lock_failures is None
        with measure_nodes({"server-0": busy, "server-1": gone, "storage-0": storage}) as usage:
            refused.labels("0").set(10)
            refused.labels("2").set(5)
            moved.remove("1")
    assert usage.server_lock_failures == {"server-0": 8.0}


def test_process_cpu_seconds_follow_the_process_and_a_gone_process_raises() -> None:
    before, own_before = process_cpu_seconds(os.getpid()), time.process_time()
    deadline = time.monotonic() + 5
    while time.process_time() - own_before < 0.2 and time.monotonic() < deadline:
        sum(range(10_000))  # burn CPU in this process
    spent, own = process_cpu_seconds(os.getpid()) - before, time.process_time() - own_before
    assert own >= 0.2
    assert abs(spent - own) < 0.05  # /proc counts in clock ticks (10 ms)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(OSError):
        process_cpu_seconds(gone.pid)
