"""``waltz perf smallbank`` and the SmallBank workload's latencies: counts and the output's shape.

Never timings: the figures depend on the machine. The CLI runs use ``--local`` (a cluster of their
own, with its own ZooKeeper); the workload's own test uses a cluster on the session's ZooKeeper.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import support
from typer.testing import CliRunner

from tests.client.client_helpers import MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.workloads.perf import SmallBankPerfSettings
from waltz.workloads.smallbank import SmallBankConfig, SmallBankWorkload
from waltz_examples.ledger.service import LedgerService, prepare_database
from waltz_examples.ledger.smallbank import LedgerInstance

PERCENTILE_KEYS = ["p50", "p90", "p99", "p99.9"]


@pytest.fixture(scope="module")
def smallbank_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    with support.session_cluster(tmp_path_factory, zookeeper, name="smallbank", partitions=2) as cluster:
        cluster.wait_ready(60)
        yield cluster


def run_cli(*args: str) -> Any:
    from waltz.cli.main import app

    return CliRunner().invoke(app, ["perf", "smallbank", *args])


def assert_report(report: dict[str, Any], instances: int, draws: int) -> None:
    committed = report["committed"]
    assert committed > 0, report
    assert report["draws"] == draws
    assert report["submitted"] == committed + report["dropped"] + report["errors"]
    # the warm-up's draws count nowhere: beyond the measured draws, only each instance's closings
    # of accounts and its two payments to each are submitted, and the report counts them apart
    extra = instances * 3 * SmallBankConfig.deactivate
    assert 0 < report["added"] <= extra, report
    assert report["submitted"] + report["balances_read"] == draws + report["added"], report
    assert report["errors"] == 0, report["error_samples"]
    assert sum(report["drop_reasons"].values()) == report["dropped"]
    assert report["committed_per_second"] > 0
    for name in ("submit_to_commit", "submit_to_applied"):
        latency = report["latency_ms"][name]
        assert latency["count"] == committed, (name, latency)
        values = [latency[key] for key in [*PERCENTILE_KEYS, "max"]]
        assert values == sorted(values), f"percentiles must not decrease: {latency}"
    # per transaction, applied comes after committed: so does every order statistic
    for key in [*PERCENTILE_KEYS, "max"]:
        assert report["latency_ms"]["submit_to_applied"][key] >= report["latency_ms"]["submit_to_commit"][key]
    per_instance = report["per_instance"]
    assert [f["instance"] for f in per_instance] == list(range(instances))
    assert sum(f["draws"] for f in per_instance) == draws
    assert sum(f["committed"] for f in per_instance) == committed
    assert all(f["committed_per_second"] > 0 for f in per_instance), per_instance
    assert len({f["seed"] for f in per_instance}) == instances
    assert report["checks"] and all(c["passed"] for c in report["checks"]), report["checks"]
    assert "money conserved" in [c["name"] for c in report["checks"]]
    assert report["passed"] is True
    assert report["settings"]["instances"] == instances
    # --local: the cluster's processes are known, so their CPU is reported beside the instances'
    assert {"instances", "server-0", "storage-0"} <= set(report["cpu_us_per_transaction"])
    # and so are the appends the servers' lock checks refused (read from their metrics)
    assert isinstance(report["server_lock_failures"], int) and report["server_lock_failures"] >= 0


def test_smallbank_json_on_sqlite_counts_every_instance() -> None:
    result = run_cli("--local", "--instances", "2", "--transactions", "200", "--json")
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(result.stdout)
    assert_report(report, instances=2, draws=200)
    assert report["database"].startswith("sqlite:///")


def test_smallbank_json_on_postgresql(postgres_url: str) -> None:
    args = ["--local", "--instances", "2", "--transactions", "200", "--accounts", "40", "--json"]
    result = run_cli(*args, "--db", postgres_url)
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(result.stdout)
    assert_report(report, instances=2, draws=200)
    assert report["database"].startswith("postgresql+psycopg://")
    # Every attempt either read a snapshot or found its entities in the entity cache.
    cache = report["entity_cache"]
    assert cache["hits"] > 0 and cache["hits"] + cache["misses"] >= report["submitted"], cache


def test_smallbank_on_a_schedule_takes_the_schedule_s_length() -> None:
    """``--rate``: the draws start on a fixed schedule (200 draws at 100/s over 2 instances take
    at least 2 s), and the report says so."""
    result = run_cli("--local", "--instances", "2", "--transactions", "200", "--rate", "100", "--json")
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(result.stdout)
    assert_report(report, instances=2, draws=200)
    assert report["settings"]["rate"] == 100
    assert all(f["seconds"] >= 1.98 for f in report["per_instance"]), report["per_instance"]


@pytest.mark.parametrize(
    ("rate", "instances", "given", "expected"),
    [
        (None, 3, 0, 21),  # unpaced: the peers' threads per process
        (1620.0, 3, 0, 54),  # paced: a tenth of a second of each instance's draws
        (1621.0, 3, 0, 55),  # rounded up
        (325.0, 3, 0, 21),  # never fewer than an unpaced run's
        (1620.0, 3, 21, 21),  # what the run says wins
        (None, 3, 64, 64),
    ],
)
def test_a_paced_run_keeps_a_tenth_of_a_second_of_draws_in_flight(
    rate: float | None, instances: int, given: int, expected: int
) -> None:
    """A cap below what a schedule needs holds draws back, and their wait counts as the system's
    latency: a paced run's default grows with its rate."""
    settings = SmallBankPerfSettings(instances=instances, rate=rate, in_flight=given)
    assert settings.in_flight == expected
    assert settings.summary()["in_flight"] == expected
    assert f"{expected} in flight" in settings.describe()


def test_a_negative_in_flight_is_refused() -> None:
    with pytest.raises(ValueError, match="in_flight must be at least 1"):
        SmallBankPerfSettings(in_flight=-1)


def test_a_rate_not_above_zero_is_refused() -> None:
    result = run_cli("--local", "--rate", "0")
    assert result.exit_code == 2, result.output


def test_smallbank_without_the_entity_cache(postgres_url: str) -> None:
    args = ["--local", "--instances", "1", "--transactions", "100", "--accounts", "40", "--json"]
    result = run_cli(*args, "--no-entity-cache", "--db", postgres_url)
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(result.stdout)
    assert_report(report, instances=1, draws=100)
    assert report["entity_cache"] == {"hits": 0, "misses": 0}
    assert report["settings"]["entity_cache"] is False


def test_a_bad_db_url_is_refused_before_anything_starts() -> None:
    result = run_cli("--local", "--db", "nosuchdialect://nowhere/db")
    assert result.exit_code == 2, result.output
    assert "not a usable database URL" in result.stderr


@pytest.mark.parametrize(
    "url",
    ["postgresql+psycopg://app:s3cret-word@127.0.0.1:notaport/bench", "postgres:s3cret-word@127.0.0.1/bench"],
)
def test_a_url_that_does_not_parse_is_refused_without_showing_its_password(url: str) -> None:
    result = run_cli("--local", "--db", url)
    assert result.exit_code == 2, result.output
    assert "not a usable database URL" in result.stderr
    assert "s3cret-word" not in result.output + result.stderr


def test_an_unreachable_database_is_refused() -> None:
    result = run_cli("--local", "--db", "postgresql+psycopg://postgres@127.0.0.1:1/nothing")
    assert result.exit_code == 2, result.output
    assert "cannot use the database postgresql+psycopg://postgres@127.0.0.1:1/nothing" in result.stderr


def test_a_database_with_other_tables_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    result = run_cli("--local", "--db", f"sqlite:///{path}")
    assert result.exit_code == 2, result.output
    assert "holds tables that are not the ledger's (invoices)" in result.stderr
    assert "empty database" in result.stderr


def test_a_module_that_is_no_smallbank_application_is_refused() -> None:
    result = run_cli("--local", "--app", "waltz_examples.counter")
    assert result.exit_code == 2, result.output
    assert "waltz_examples.counter defines SMALLBANK" in result.stderr


def test_bad_options_exit_2() -> None:
    result = run_cli("--local", "--zookeeper", "127.0.0.1:2181")
    assert result.exit_code == 2, result.output
    assert "--local starts its own cluster" in result.stderr


def test_the_workload_times_submit_to_commit_and_to_applied(
    smallbank_cluster: LocalCluster, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    prepare_database(url).dispose()
    with LedgerService(
        url,
        zookeeper=smallbank_cluster.zookeeper_connect_string,
        cluster_root=smallbank_cluster.root,
        client_settings=support.client_parts(smallbank_cluster)[2],
        prepare=False,
    ) as service:
        instance = LedgerInstance(service)
        workload = SmallBankWorkload(
            [instance], SmallBankConfig(accounts=20, in_flight=8, seed=3, submitters=2)
        )
        quiet = SmallBankWorkload(
            [instance], SmallBankConfig(accounts=20, in_flight=8, seed=4, submitters=2, record_latency=False)
        )
        try:
            workload.populate(timeout=60)
            assert workload.warm_up(30, timeout=30) == 0  # every warm-up transaction applied
            stats = workload.run(120)
            assert workload.wait_applied(30)
            assert workload.unapplied == 0
            untimed = quiet.run(20)
        finally:
            workload.close()
            quiet.close()
    assert stats.committed > 0, stats
    assert stats.commit_latency.count == stats.committed
    assert stats.applied_latency.count == stats.committed
    for percentile in (50.0, 99.0, 100.0):
        assert stats.applied_latency.percentile_ms(percentile) >= stats.commit_latency.percentile_ms(
            percentile
        )
    line = stats.latency_line()
    assert line.startswith("committed/s ") and "submit->commit p50 " in line and "submit->applied p50" in line
    assert untimed.committed > 0
    assert untimed.commit_latency.count == 0 and untimed.applied_latency.count == 0
    assert "submit->commit p50 n/a" in untimed.latency_line()


def test_partition_routed_instances_on_sqlite() -> None:
    args = ["--local", "--instances", "2", "--transactions", "200", "--partition-routing", "--json"]
    result = run_cli(*args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(result.stdout)
    assert_report(report, instances=2, draws=200)
    assert report["settings"]["partition_routing"] is True
    assert report["partitions"] == 2  # one per routed instance unless --partitions says otherwise
    assert report["warnings"] == []


def test_partition_routed_instances_of_unequal_shares_are_warned_about() -> None:
    args = ["--local", "--partitions", "3", "--instances", "2", "--transactions", "60", "--partition-routing"]
    result = run_cli(*args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert (
        "warning: 3 partitions over 2 partition-routed instances: 1 instance(s) mount 1 partition(s), "
        "the others 2;"
    ) in result.stdout
    assert "give --partitions a multiple of 2 for equal shares" in result.stdout
    assert "3 partitions over 2 partition-routed instances" in result.stderr  # said before the run


ROUTING_REFUSAL = "partition routing needs at most one instance per partition: 3 instances, 2 partitions"


def test_partition_routing_needs_a_partition_per_instance() -> None:
    """With ``--local`` the partitions are known from the options: refused before a cluster
    starts or the database is touched."""
    args = ["--local", "--partitions", "2", "--instances", "3", "--transactions", "30", "--partition-routing"]
    result = run_cli(*args)
    assert result.exit_code == 1, result.output
    assert ROUTING_REFUSAL in result.stderr
    assert "raise --partitions or lower --instances" in result.stderr
    assert "opening" not in result.stderr, "the run started before it was refused"


def test_partition_routing_on_a_reached_cluster_needs_a_partition_per_instance(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: object, tmp_path: Path
) -> None:
    """A reached cluster's partitions are known once its client has mounted: the run is refused
    then, before it writes an account (SmallBank) or a SKU's stock (inventory) to the log."""
    from waltz.cli.main import app

    made = support.session_cluster(tmp_path_factory, zookeeper, name="routing", partitions=2, servers=1)
    args = ["--instances", "3", "--transactions", "30", "--partition-routing"]
    with made as cluster:
        target = ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
        ledger_db, inventory_db = tmp_path / "ledger.db", tmp_path / "inventory.db"
        runs = {
            "smallbank": [*args, "--accounts", "4", "--db", f"sqlite:///{ledger_db}"],
            "inventory": [*args, "--skus", "2", "--db", f"sqlite:///{inventory_db}"],
        }
        results = {
            name: CliRunner().invoke(app, ["perf", name, *options, *target], env=cluster.client_env())
            for name, options in runs.items()
        }
        config = WaltzClientConfig(**cluster.client_settings())
        with WaltzClient(MemoryStore({0: -1, 1: -1}), config) as client:
            marks = [client.get_high_water_mark(p) for p in range(2)]
    for name, result in results.items():
        assert result.exit_code == 1, (name, result.output)
        assert ROUTING_REFUSAL in result.stderr, name
        assert "mounting the log's partitions" in result.stderr, name  # refused after it reached the cluster
    assert "opening 4 accounts" not in results["smallbank"].stderr
    assert "stocking" not in results["inventory"].stderr
    assert marks == [-1, -1], "a refused run wrote to the log"
    for db, table in ((ledger_db, "ledger_accounts"), (inventory_db, "inventory_skus")):
        with sqlite3.connect(db) as connection:
            assert connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,), table


def test_a_workload_over_partition_routed_instances_submits_each_transaction_to_its_partition(
    smallbank_cluster: LocalCluster, tmp_path: Path
) -> None:
    from waltz_examples.ledger.transfers import pending_transfers

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    prepare_database(url).dispose()
    zookeeper, root, settings = support.client_parts(smallbank_cluster)
    where = {"zookeeper": zookeeper, "cluster_root": root, "client_settings": settings}
    with (
        LedgerService(url, prepare=False, partitions=[0], sweep_interval=0.1, **where) as first,
        LedgerService(url, prepare=False, partitions=[1], sweep_interval=0.1, **where) as second,
    ):
        assert first.client.mounted_partitions() == [0] and second.client.mounted_partitions() == [1]
        assert [first.owns_customer(c) for c in range(4)] == [first.partition_of(c) == 0 for c in range(4)]
        instances = [LedgerInstance(first), LedgerInstance(second)]
        workload = SmallBankWorkload(instances, SmallBankConfig(accounts=20, in_flight=8, seed=5))
        try:
            workload.populate(timeout=60)
            stats = workload.run(150)
        finally:
            workload.close()
        # A transaction for a partition its instance does not mount would have failed to submit.
        assert stats.errors == [] and stats.committed > 0, stats
        assert stats.by_op["send_payment"] + stats.by_op["amalgamate"] > 0
        # Each sweeper moves the steps of its own partition: between them every transfer ends.
        wait_until(lambda: pending_transfers(first.engine) == 0, timeout=60, what="every transfer to end")
    with pytest.raises(ValueError, match=r"partitions \[5\] do not exist"):
        LedgerService(url, prepare=False, partitions=[5], **where)


def test_smallbank_batched_applies_each_member_once(postgres_url: str) -> None:
    """``--batch``: the instances' SmallBank transactions on a few hot accounts go as batched log
    transactions (docs/sql.md "Batching entity transactions"); the report counts the batches and
    what they carried, and every check passes, each (transaction, member) applied once among them."""
    args = ["--local", "--instances", "2", "--transactions", "300", "--accounts", "4", "--json"]
    result = run_cli(*args, "--batch", "--db", postgres_url)
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(result.stdout)
    assert_report(report, instances=2, draws=300)
    assert report["settings"]["batch"] is True
    batches = report["batches"]
    assert batches["batches"] > 0 and batches["members"] > batches["batches"], batches
    assert sum(f["batches"]["batches"] for f in report["per_instance"]) == batches["batches"]
    # The log transactions that waited for the linger, from the instances' client registries.
    assert isinstance(batches["lingered"], int) and batches["lingered"] >= 0, batches
    assert sum(f["batches"]["lingered"] for f in report["per_instance"]) == batches["lingered"]
    name = "every (transaction, member) applied exactly once"
    once = next(c for c in report["checks"] if c["name"] == name)
    assert "batches)" in once["detail"], once
