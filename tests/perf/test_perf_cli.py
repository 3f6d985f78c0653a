"""``waltz perf producer`` / ``consumer`` and the load generator: counts and the output's shape.

Never timings: the figures depend on the machine. A shared local cluster (3 storage nodes, one
server, 2 partitions) on the session's ZooKeeper serves every test of the module.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import support
from typer.testing import CliRunner

from waltz.cli.main import app
from waltz.client import WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz.perf.consumer import ConsumerSettings, run_consumer
from waltz.perf.loadgen import LoadSpec, Outcome, Request, payload_submit_time, run_load
from waltz.perf.producer import WARMUP_TRANSACTIONS, ProducerSettings, current_high_water_marks, run_producer
from waltz.perf.stats import LatencyHistogram

PERCENTILE_KEYS = ["p50", "p90", "p99", "p99.9"]


@pytest.fixture(scope="module")
def perf_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    with support.session_cluster(
        tmp_path_factory, zookeeper, name="perf", partitions=2, servers=1, metrics=True
    ) as local:
        yield local


def client_overrides(cluster: LocalCluster) -> dict[str, Any]:
    return cluster.client_settings()


def invoke(cluster: LocalCluster, *args: str) -> Any:
    target = ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    result = CliRunner().invoke(app, ["perf", *args, *target], env=cluster.client_env())
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def assert_latency_shape(latency: dict[str, Any], count: int) -> None:
    assert latency["count"] == count
    values = [latency[key] for key in [*PERCENTILE_KEYS, "max"]]
    assert all(isinstance(v, float) and v > 0 for v in values), latency
    assert values == sorted(values), f"percentiles must not decrease: {latency}"


def test_producer_json_counts_every_transaction_of_every_client(perf_cluster: LocalCluster) -> None:
    result = invoke(perf_cluster, "producer", "--clients", "2", "-n", "300", "--in-flight", "50", "--json")
    report = json.loads(result.output)
    assert report["transactions"] == 600
    assert report["failed"] == 0
    assert report["errors"] == []
    assert report["transactions_per_second"] > 0
    assert report["mb_per_second"] > 0
    assert report["retries_per_transaction"] == pytest.approx(report["retries"] / 600, abs=1e-4)
    assert_latency_shape(report["latency_ms"], 600)
    # both client processes' stage totals arrive and merge
    assert list(report["client_stage_ms"]) == [
        "first attempt",
        "append queue",
        "log round trip",
        "submit->commit",
        "commit->completion",
        "apply wait",
        "apply",
    ]
    assert all(ms > 0 for ms in report["client_stage_ms"].values()), report["client_stage_ms"]
    assert report["settings"]["lock_pool_size"] == 1000


def test_producer_reports_the_cpu_of_the_client_and_of_every_node(perf_cluster: LocalCluster) -> None:
    settings = ProducerSettings(1, LoadSpec(1000, max_in_flight=50))
    config = WaltzClientConfig(**client_overrides(perf_cluster))
    stats = run_producer(config, settings, perf_cluster.metrics_urls(), perf_cluster.admin_tls)
    assert stats.committed == 1000
    assert stats.client_cpu_seconds > 0
    assert set(stats.node_cpu_seconds) == {"server-0", "storage-0", "storage-1", "storage-2"}
    assert stats.node_cpu_seconds["server-0"] > 0  # it served 1,000 appends: well over a 10 ms tick
    assert all(seconds >= 0 for seconds in stats.node_cpu_seconds.values())
    cpu = stats.summary()["cpu_us_per_transaction"]
    assert list(cpu) == ["client", "server-0", "storage-0", "storage-1", "storage-2"]
    assert cpu["client"] == pytest.approx(stats.client_cpu_seconds * 1e6 / 1000, abs=0.1)
    line = next(line for line in stats.text().splitlines() if line.startswith("CPU per transaction"))
    assert "server-0" in line and ", all " in line
    # Every storage node flushed; a flush holds at least one record and at most all 1,000 (plus the
    # warm-up's). (The replicas' record counts may differ by a last batch: a quorum is two.)
    batches = stats.records_per_storage_flush()
    assert set(batches) == {"storage-0", "storage-1", "storage-2"}
    assert all(1 <= records <= 1200 for records in batches.values())
    assert stats.summary()["records_per_storage_flush"].keys() == batches.keys()
    assert any(line.startswith("records per storage flush: storage-0") for line in stats.text().splitlines())
    # The server sent store batches of at least one record; together they hold every commit.
    per_batch = stats.records_per_store_batch()
    assert set(per_batch) == {"server-0"}
    records, sent = stats.server_batches["server-0"]
    assert records >= 1000 and 1 <= sent <= records
    assert stats.summary()["records_per_store_batch"] == {"server-0": round(records / sent, 1)}
    assert any(line.startswith("records per store batch: server-0") for line in stats.text().splitlines())
    # The server committed every transaction after a storage round trip (well over 10 µs) and
    # within what the client saw as its slowest submit-to-commit latency (give or take warm-up).
    commit_ms = stats.server_commit_ms()
    assert set(commit_ms) == {"server-0"}
    assert 0.01 < commit_ms["server-0"] <= stats.latency.max_ms()
    assert stats.summary()["server_commit_ms"].keys() == {"server-0"}
    lines = stats.text().splitlines()
    assert any(line.startswith("server receipt->commit, mean (ms): server-0") for line in lines)
    # The client's stages of the measured phase: 1,000 commits (and an append sent per attempt);
    # the attempts of a transaction wait in turn within its submit-to-commit time, so the mean
    # wait per attempt stays below the mean submit-to-commit time.
    assert stats.client_stages["submit->commit"][1] == 1000
    assert stats.client_stages["commit->completion"][1] == 1000
    assert stats.client_stages["append queue"][1] == 1000 + stats.retries
    # Every transaction's first attempt sent an append, and each commit ended one log round trip,
    # which lies within that transaction's submit-to-commit time.
    assert stats.client_stages["first attempt"][1] == 1000
    assert stats.client_stages["log round trip"][1] == 1000
    # The applies of the phase were timed (read once the commits were seen: the last applies
    # may still run then, and the warm-up's may run in the phase).
    assert 0 < stats.client_stages["apply wait"][1] <= 1200
    assert 0 < stats.client_stages["apply"][1] <= 1200
    stages = stats.client_stage_ms()
    assert 0 < stages["append queue"] <= stages["submit->commit"]
    assert 0 < stages["log round trip"] <= stages["submit->commit"]
    assert stages["first attempt"] > 0
    assert stages["commit->completion"] > 0
    assert any(line.startswith("client stages, mean (ms): first attempt") for line in lines)
    # without the nodes' URLs (a cluster the run did not start): the client's alone, and said so
    alone = run_producer(config, settings)
    assert list(alone.summary()["cpu_us_per_transaction"]) == ["client"]
    assert alone.server_commit_ms() == {}
    assert "(cluster processes unknown)" in alone.text()
    # a catch-up read measures the reading client and the nodes while it reads
    report = run_consumer(
        config, ConsumerSettings(200, max_in_flight=50), perf_cluster.metrics_urls(), perf_cluster.admin_tls
    )
    assert report.consumer.client_cpu_seconds > 0
    assert set(report.consumer.node_cpu_seconds) == set(stats.node_cpu_seconds)
    assert set(report.producers.node_cpu_seconds) == set(stats.node_cpu_seconds)


def test_producer_without_locks_never_retries(perf_cluster: LocalCluster) -> None:
    result = invoke(perf_cluster, "producer", "-n", "200", "--lock-pool-size", "0", "--json")
    report = json.loads(result.output)
    assert (report["transactions"], report["failed"], report["retries"]) == (200, 0, 0)


def test_producer_one_hot_lock_retries_and_still_commits_all(perf_cluster: LocalCluster) -> None:
    # one lock (on the one active partition) and 20 in flight: the high-water mark lags, so lock
    # failures must happen and be retried
    result = invoke(
        perf_cluster,
        "producer",
        "-n",
        "100",
        "--lock-pool-size",
        "1",
        "--active-partitions",
        "1",
        "--in-flight",
        "20",
        "--json",
    )
    report = json.loads(result.output)
    assert (report["transactions"], report["failed"]) == (100, 0)
    assert report["retries"] > 0


def test_producer_refuses_a_lock_pool_smaller_than_the_active_partitions(perf_cluster: LocalCluster) -> None:
    # lock i is on partition i mod 2: one lock would leave partition 1 unwritten
    target = ["--zookeeper", perf_cluster.zookeeper_connect_string, "--root", perf_cluster.root]
    runner = CliRunner()
    for given in ([], ["--active-partitions", "2"]):
        result = runner.invoke(
            app,
            ["perf", "producer", "-n", "20", "--lock-pool-size", "1", *given, *target],
            env=perf_cluster.client_env(),
        )
        assert result.exit_code == 2, result.output
        assert "a lock pool of 1 lock(s) cannot cover 2 active partitions" in result.output
    # as many locks as partitions: every partition is written
    config = WaltzClientConfig(**client_overrides(perf_cluster))
    before = current_high_water_marks(config)
    stats = run_producer(config, ProducerSettings(1, LoadSpec(40, lock_pool_size=2, seed=3)))
    assert stats.committed == 40
    after = current_high_water_marks(config)
    assert all(after[p] > before[p] + WARMUP_TRANSACTIONS // 2 for p in (0, 1)), (before, after)


def test_producer_text_output_and_poisson_arrivals(perf_cluster: LocalCluster) -> None:
    result = invoke(perf_cluster, "producer", "-n", "100", "--rate", "500", "--active-partitions", "1")
    lines = result.output.splitlines()
    assert lines[0].startswith("producer: 1 client(s) x 100 transactions; 200 B payload")
    assert "Poisson 500/s" in lines[0]
    assert lines[1].startswith("appended 100 transactions (0 failed)")
    for label in ("transactions/s: ", "MB/s: ", "retries/transaction: "):
        assert any(line.startswith(label) for line in lines), label
    latency = next(line for line in lines if line.startswith("latency submit->commit (ms):"))
    for key in PERCENTILE_KEYS:
        assert f" {key} " in latency
    assert "100 values" in latency


def test_producer_with_a_timeout_reports_what_it_submitted_before_it(perf_cluster: LocalCluster) -> None:
    # 20/s for 1 s: about 20 of the 300 arrive before the timeout; the rest are never submitted
    result = invoke(
        perf_cluster,
        "producer",
        "-n",
        "300",
        "--rate",
        "20",
        "--timeout",
        "1",
        "--lock-pool-size",
        "0",
        "--json",
    )
    report = json.loads(result.output)
    assert report["failed"] <= 10, report  # at most those still in flight at the timeout
    assert 1 <= report["submitted"] <= 60, report
    assert report["submitted"] + report["not_submitted"] == 300
    assert report["transactions"] + report["failed"] == report["submitted"]
    assert report["latency_ms"]["count"] == report["transactions"]


def test_consumer_catch_up_reads_everything_written(perf_cluster: LocalCluster) -> None:
    result = invoke(perf_cluster, "consumer", "-n", "300", "--json")
    report = json.loads(result.output)
    assert report["mode"] == "catch-up"
    assert report["producers"]["transactions"] == 300
    consumer = report["consumer"]
    assert consumer["transactions"] == 300  # the producers' warm-up transactions are not read
    assert consumer["failed"] == 0
    # upstream's timer runs from the first apply; the other from the start of the reader's mount
    assert consumer["seconds_from_mount"] >= consumer["seconds"] > 0
    # the seconds are given to the millisecond, the rate from the unrounded seconds
    assert 300 / consumer["transactions_per_second_from_mount"] == pytest.approx(
        consumer["seconds_from_mount"], abs=0.0006
    )
    assert consumer["mb_per_second"] > 0
    assert consumer["latency_ms"]["count"] == 0
    assert list(consumer["cpu_us_per_transaction"]) == ["client"]  # the reader's; nodes unknown here


def test_producer_raises_what_on_warmed_up_raised_and_stops_its_clients(perf_cluster: LocalCluster) -> None:
    def fail() -> None:
        raise OSError("the reader could not start")

    config = WaltzClientConfig(**client_overrides(perf_cluster))
    with pytest.raises(OSError, match="the reader could not start"):
        run_producer(config, ProducerSettings(2, LoadSpec(50, max_in_flight=10)), on_warmed_up=fail)
    assert [p.name for p in multiprocessing.active_children() if p.name.startswith("waltz-perf-client")] == []


def test_consumer_text_labels_both_timers(perf_cluster: LocalCluster) -> None:
    lines = invoke(perf_cluster, "consumer", "-n", "100").output.splitlines()
    assert lines[1].startswith("read 100 transactions (0 failed)"), lines
    assert lines[1].endswith(" s (first apply -> last apply)"), lines
    assert any(line.startswith("transactions/s (first apply -> last apply): ") for line in lines), lines
    assert any(line.startswith("from the reader's mount to its last apply: ") for line in lines), lines


def test_consumer_live_measures_submit_to_read(perf_cluster: LocalCluster) -> None:
    # two producer processes: the reader mounts once both have warmed up, before either measures
    result = invoke(perf_cluster, "consumer", "-n", "200", "--producers", "2", "--live", "--json")
    report = json.loads(result.output)
    consumer = report["consumer"]
    assert (report["producers"]["transactions"], consumer["transactions"]) == (200, 200)
    assert_latency_shape(consumer["latency_ms"], 200)
    assert consumer["seconds_from_mount"] >= consumer["seconds"] > 0
    assert consumer["cpu_us_per_transaction"] == {}  # reader and producer share the process


def test_bad_target_options_exit_2(perf_cluster: LocalCluster) -> None:
    runner = CliRunner()
    both = runner.invoke(app, ["perf", "producer", "--local", "--zookeeper", "127.0.0.1:1", "--root", "/x"])
    assert both.exit_code == 2
    assert "--local" in both.output
    missing = runner.invoke(
        app,
        [
            "perf",
            "producer",
            "-n",
            "1",
            "--zookeeper",
            perf_cluster.zookeeper_connect_string,
            "--root",
            "/no/such",
        ],
    )
    assert missing.exit_code == 2, missing.output
    too_many = runner.invoke(
        app,
        [
            "perf", "producer", "-n", "1", "--active-partitions", "5",
            "--zookeeper", perf_cluster.zookeeper_connect_string, "--root", perf_cluster.root,
        ],
        env=perf_cluster.client_env(),
    )  # fmt: skip
    assert too_many.exit_code == 2, too_many.output
    assert "exceeds the cluster's 2 partitions" in too_many.output


@pytest.mark.parametrize("command", ["producer", "consumer", "smallbank", "inventory"])
def test_local_cluster_options_are_refused_without_local(command: str) -> None:
    # refused before anything is reached: no ZooKeeper listens on port 1
    target = ["--zookeeper", "127.0.0.1:1", "--root", "/x"]
    runner = CliRunner()
    for given in (["--partitions", "4"], ["--storages", "5", "--servers", "2"]):
        result = runner.invoke(app, ["perf", command, "-n", "1", *given, *target])
        assert result.exit_code == 2, result.output
        flags = "/".join(flag for flag in given if flag.startswith("--"))
        verb = "are" if "/" in flags else "is"
        assert f"{flags} {verb} for the cluster --local starts: drop " in result.output, result.output


# --- the load generator on its own -----------------------------------------------------------------


def threaded_submitter(
    outcome: Callable[[Request], Outcome],
) -> Callable[[Request, Callable[[Outcome], None]], None]:
    def submit(request: Request, done: Callable[[Outcome], None]) -> None:
        threading.Thread(target=lambda: done(outcome(request))).start()

    return submit


def test_load_generator_counts_retries_failures_and_payloads() -> None:
    seen: list[Request] = []
    lock = threading.Lock()

    def outcome(request: Request) -> Outcome:
        with lock:
            seen.append(request)
        if request.index % 10 == 0:
            return Outcome(1, RuntimeError("refused"))
        return Outcome(2)

    stats = run_load(threaded_submitter(outcome), LoadSpec(100, payload_size=50, lock_pool_size=7, seed=1))
    assert (stats.committed, stats.failed, stats.retries) == (90, 10, 10 * 1 + 90 * 2)
    assert stats.payload_bytes == 90 * 50
    assert stats.latency.count == 90
    assert stats.errors == ["RuntimeError: refused"]
    assert sorted(r.index for r in seen) == list(range(100))
    assert {r.lock_id for r in seen} <= set(range(7))
    assert all(len(r.payload) == 50 and payload_submit_time(r.payload) is not None for r in seen)


def test_load_generator_keeps_at_most_max_in_flight_and_reports_stuck_transactions() -> None:
    in_flight = 0
    peak = 0
    lock = threading.Lock()

    def submit(request: Request, done: Callable[[Outcome], None]) -> None:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        if request.index == 5:
            return  # never ends

        def finish() -> None:
            nonlocal in_flight
            with lock:
                in_flight -= 1
            done(Outcome())

        threading.Timer(0.001, finish).start()

    stats = run_load(submit, LoadSpec(50, max_in_flight=4, lock_pool_size=0, timeout=5.0))
    assert peak <= 4
    assert (stats.committed, stats.failed) == (49, 1)
    assert any("not ended" in e for e in stats.errors)


def test_load_generator_submits_nothing_scheduled_after_the_timeout() -> None:
    """Poisson arrivals at 10/s for a 1 s timeout: seed 4 schedules 15 arrivals before the
    deadline (the 15th at 0.908 s, the 16th at 1.171 s). Only they are submitted, each commits
    20 ms after its submit, and the other 985 are reported as not submitted, not as failed."""
    seen: list[float] = []
    lock = threading.Lock()

    def submit(request: Request, done: Callable[[Outcome], None]) -> None:
        with lock:
            seen.append(time.perf_counter())
        threading.Timer(0.02, done, args=(Outcome(),)).start()

    stats = run_load(
        submit, LoadSpec(1000, lock_pool_size=0, max_in_flight=500, rate=10.0, timeout=1.0, seed=4)
    )
    assert len(seen) == 15
    assert (stats.submitted, stats.committed, stats.failed, stats.not_submitted) == (15, 15, 0, 985)
    assert stats.errors == []
    assert stats.latency.count == 15
    assert stats.latency.percentile_ms(0) >= 20.0  # from the scheduled arrival: never before it
    assert "appended 15 transactions (0 failed) of 15 submitted" in stats.text("appended")
    assert "not submitted before the timeout: 985 transactions" in stats.text("appended")


def test_load_generator_closed_loop_stops_submitting_at_the_timeout() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def submit(request: Request, done: Callable[[Outcome], None]) -> None:
        with lock:
            seen.append(request.index)
        threading.Timer(0.05, done, args=(Outcome(),)).start()

    stats = run_load(submit, LoadSpec(1000, lock_pool_size=0, max_in_flight=2, timeout=0.5))
    assert 2 <= len(seen) <= 30, seen  # two at a time, 50 ms each, for 0.5 s
    assert stats.submitted == len(seen)
    assert stats.committed + stats.failed == stats.submitted
    assert stats.failed <= 2  # at most the two in flight at the deadline
    assert stats.not_submitted == 1000 - len(seen)


def test_load_generator_counts_a_raising_submitter_as_failed() -> None:
    def submit(request: Request, done: Callable[[Outcome], None]) -> None:
        raise ValueError("no")

    stats = run_load(submit, LoadSpec(5, rate=1000.0, lock_pool_size=0))
    assert (stats.committed, stats.failed) == (0, 5)


def test_load_generator_latencies_reach_the_histogram_when_the_run_ends() -> None:
    def submit(request: Request, done: Callable[[Outcome], None]) -> None:
        threading.Timer(0.02, lambda: done(Outcome())).start()

    stats = run_load(submit, LoadSpec(20, max_in_flight=5, lock_pool_size=0))
    assert stats.latency.count == 20
    assert stats.latency.percentile_ms(0) >= 20.0  # each waited for its timer, at least
    one_by_one = LatencyHistogram()
    for seconds in (0.0000001, 0.004, 0.0125, 7200.0):  # below 1 µs and above 1 h are clamped
        one_by_one.record(seconds)
    folded = LatencyHistogram()
    folded.record_all([0.0000001, 0.004, 0.0125, 7200.0])
    assert folded.encode() == one_by_one.encode()


@pytest.mark.parametrize("security", ["--secure", "--insecure"])
def test_a_local_run_reads_every_nodes_cpu_secure_by_default_and_plaintext_when_asked(security: str) -> None:
    """``--local`` starts a secure cluster unless ``--insecure`` (the nodes' ``/metrics`` are then
    read over TLS with the operator's certificate): the CPU of every node is reported either way."""
    args = ["perf", "producer", "--local", "--partitions", "2", "-n", "200", "--json"]
    result = CliRunner().invoke(app, [*args, security] if security == "--insecure" else args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(result.output)
    assert report["transactions"] == 200 and report["failed"] == 0, report
    assert set(report["cpu_us_per_transaction"]) == {
        "client",
        "server-0",
        "storage-0",
        "storage-1",
        "storage-2",
    }


def test_insecure_is_refused_without_local(perf_cluster: LocalCluster) -> None:
    result = CliRunner().invoke(
        app,
        ["perf", "producer", "-n", "1", "--insecure", "--zookeeper", perf_cluster.zookeeper_connect_string],
        env=perf_cluster.client_env(),
    )
    assert result.exit_code == 2, result.output
    assert "--insecure is for the cluster --local starts" in result.output
