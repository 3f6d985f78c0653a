"""``waltz perf inventory``: a short run passes its checks and reports its figures; the checks fail
on an oversold inventory, in a database altered after a run and in a run of an application that
oversells (exit 1); partition-routed instances take the requests of their partitions' SKUs.

Never timings: the figures depend on the machine. The runs use ``--local`` (a cluster of their own).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from waltz.jdbc_style import create_framework_engine
from waltz.workloads.inventory import inventory_checks
from waltz.workloads.inventory_workload import InventoryConfig
from waltz.workloads.perf.settings import InventoryPerfSettings
from waltz_examples.inventory.models import Sku, by_sku
from waltz_examples.inventory.service import INVENTORY

#: An inventory whose reservations take units whatever is left: the oversell the checks catch.
OVERSELLING = """
from waltz_examples.inventory.models import Reservation, Reserve, Sku
from waltz_examples.inventory.service import InventoryApp, InventoryService


class ReserveRegardless(Reserve):
    def run(self, tx):
        tx.idempotency_key = self.idempotency_key
        sku = tx.get(Sku, self.sku_id)
        tx.update(sku, reserved=sku.reserved + self.quantity)
        tx.insert(Reservation, sku_id=self.sku_id, reservation_id=self.reservation_id,
                  quantity=self.quantity, idempotency_key=self.idempotency_key)
        return True


class OversellingService(InventoryService):
    def reservation(self, sku_id, quantity, idempotency_key):
        return ReserveRegardless(self.callbacks, sku_id, quantity, idempotency_key)


class OversellingApp(InventoryApp):
    def instance(self, db_url, config, *, cluster_name, entity_cache=True):
        return OversellingService(db_url, config, cluster_name=cluster_name, entity_cache=entity_cache)


INVENTORY = OversellingApp()
"""


def run_cli(*args: str) -> Any:
    from waltz.cli.main import app

    return CliRunner().invoke(app, ["perf", "inventory", "--local", *args])


def test_a_short_run_with_retries_passes_its_checks_and_reports_the_figures(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'inventory.db'}"
    args = ["--instances", "2", "-n", "300", "--stock", "120", "--retry-fraction", "0.3", "--warm-up", "10"]
    result = run_cli(*args, "--db", db_url, "--json")
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(result.stdout)
    assert report["requests"] == 300 and report["errors"] == 0, report["error_samples"]
    assert report["committed"] + report["refused"] + report["already_applied"] == 300
    # 300 requests of 1-3 units ask for ~600 units of 4 x 120: the stock runs out and the rest is refused
    assert report["committed"] > 0 and report["refused"] > 0, report
    retries = report["retries"]
    assert retries > 0
    assert (
        retries == report["retries_already_applied"] + report["retries_committed"] + report["retries_refused"]
    )
    assert report["retries_already_applied"] > 0
    assert report["committed_per_second"] > 0
    for name in ("submit_to_commit", "submit_to_applied"):
        assert report["latency_ms"][name]["count"] == report["committed"], name
    cache = report["entity_cache"]
    assert cache["hits"] + cache["misses"] > 0 and 0.0 <= cache["hit_rate"] <= 1.0, cache
    names = [c["name"] for c in report["checks"]]
    assert "no SKU oversold (reserved <= stock)" in names
    assert "each idempotency key applied at most once" in names
    assert "a replay of the log into an empty database holds the same SKUs and reservations" in names
    assert all(c["passed"] for c in report["checks"]) and report["passed"] is True, report["checks"]
    assert [f["instance"] for f in report["per_instance"]] == [0, 1]
    # Both instances' client stages arrive and merge: where a reservation's time goes.
    stages = report["client_stage_ms"]
    assert {"first attempt", "log round trip", "submit->commit", "apply"} <= set(stages), stages
    assert all(ms > 0 for ms in stages.values()), stages

    # The same checks on the run's database, altered afterwards to hold an oversold SKU.
    engine = create_framework_engine(db_url)
    try:
        assert all(c.passed for c in inventory_checks(INVENTORY.state(engine)))
        with engine.begin() as conn:
            conn.execute(update(Sku).where(Sku.sku_id == 0).values(reserved=Sku.stock + 1))
        failed = [c.name for c in inventory_checks(INVENTORY.state(engine)) if not c.passed]
    finally:
        engine.dispose()
    assert failed == [
        "no SKU oversold (reserved <= stock)",
        "each SKU's reserved = the sum of its reservations",
    ]


def test_a_run_of_an_application_that_oversells_fails_its_check_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "overselling_inventory.py").write_text(OVERSELLING)
    monkeypatch.chdir(tmp_path)  # --app finds the module in the working directory, as `python -m` would
    result = run_cli(
        "--app", "overselling_inventory", "--instances", "1", "-n", "60", "--stock", "10", "--warm-up", "0"
    )
    assert result.exit_code == 1, result.output + repr(result.exception)
    assert "FAIL  no SKU oversold (reserved <= stock): oversold:" in result.stdout
    assert "PASS  each idempotency key applied at most once" in result.stdout
    assert "client stages, mean (ms): first attempt " in result.stdout  # the text report has them too


def test_routed_shares_follow_the_skus_each_instance_owns() -> None:
    settings = InventoryPerfSettings(
        instances=3, transactions=1000, skus=4, in_flight=21, partition_routing=True
    )
    # Instance 0 owns three SKUs, instance 1 one, instance 2 none.
    shares = settings.routed_shares([(0, 1, 3), (2,), ()])
    assert shares == [(750, 47), (250, 16), (0, 0)]
    assert sum(r for r, _ in shares) == 1000 and sum(f for _, f in shares) == 63
    # Remainders go to the largest fractions; an owner always keeps one request in flight.
    uneven = InventoryPerfSettings(instances=3, transactions=10, skus=3, in_flight=1, partition_routing=True)
    assert uneven.routed_shares([(0,), (1,), (2,)]) == [(4, 1), (3, 1), (3, 1)]
    # One in flight for each owner first: the clients' requests in flight stay the same in all.
    few = InventoryPerfSettings(instances=3, skus=6, in_flight=1, partition_routing=True)
    assert few.routed_shares([(0, 1, 2, 3, 4), (5,), ()]) == [(2500, 2), (500, 1), (0, 0)]
    assert settings.mounted(0, 4) == (0, 3) and settings.mounted(2, 4) == (2,)
    assert InventoryPerfSettings(instances=3).mounted(0, 4) is None
    with pytest.raises(ValueError, match="no instance owns a SKU"):
        settings.routed_shares([(), (), ()])
    with pytest.raises(ValueError, match="entries for 3 instances"):
        settings.routed_shares([(0,)])
    with pytest.raises(ValueError, match=r"sku_ids must be distinct SKUs within 0\.\.3"):
        InventoryConfig(skus=4, sku_ids=(1, 4))
    with pytest.raises(ValueError, match="sku_ids must be distinct"):
        InventoryConfig(skus=4, sku_ids=(1, 1))


def test_a_partition_routed_run_sends_each_sku_to_the_instance_of_its_partition(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'inventory.db'}"
    # 4 SKUs over 4 partitions: the inventory puts SKUs 0 and 2 on partition 1, 1 and 3 on partition
    # 3; with 3 routed instances, instance 0 mounts 0 and 3, instance 1 mounts 1, instance 2 mounts 2.
    assert [by_sku((sku,), 4) for sku in range(4)] == [1, 3, 1, 3]
    args = ["--instances", "3", "--partitions", "4", "--partition-routing", "--batch", "-n", "300"]
    result = run_cli(*args, "--stock", "60", "--warm-up", "5", "--db", db_url, "--json")
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(result.stdout)
    assert report["settings"]["partition_routing"] is True
    assert report["requests"] == 300 and report["errors"] == 0, report["error_samples"]
    # 300 requests of 1-3 units against 4 x 60 units: the stock runs out and none is oversold.
    assert report["refused"] > 0 and report["committed"] > 0, report
    assert all(c["passed"] for c in report["checks"]), report["checks"]
    routed = {f["instance"]: f for f in report["per_instance"]}
    assert [routed[i]["partitions"] for i in range(3)] == [[0, 3], [1], [2]]
    assert [routed[i]["sku_ids"] for i in range(3)] == [[1, 3], [0, 2], []]
    assert [routed[i]["requests"] for i in range(3)] == [150, 150, 0]
    assert [routed[i]["in_flight"] for i in range(3)] == [32, 31, 0]
    assert routed[2]["committed"] == 0
    assert report["warnings"] == [
        "instance 2 mounts partitions [2], which hold no SKU: it applies them and serves no request"
    ]
    assert routed[0]["committed"] + routed[1]["committed"] == report["committed"]
    # The batch counts, the log transactions that waited for the linger among them.
    assert set(report["batches"]) == {"batches", "members", "lingered"}, report["batches"]
    # --batch took effect: 32 requests in flight on an instance's two SKUs went in batches.
    assert 0 < report["batches"]["batches"] < report["batches"]["members"], report["batches"]
    for count in ("batches", "members", "lingered"):
        assert sum(routed[i]["batches"][count] for i in range(3)) == report["batches"][count]
    assert routed[2]["batches"] == {"batches": 0, "members": 0, "lingered": 0}


def test_partition_routing_refuses_more_instances_than_partitions(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'inventory.db'}"
    result = run_cli(
        "--instances", "3", "--partitions", "2", "--partition-routing", "-n", "10", "--db", db_url
    )
    assert result.exit_code == 1, result.output + repr(result.exception)
    assert "partition routing needs at most one instance per partition: 3 instances, 2 partitions" in (
        result.output
    )
    assert "raise --partitions or lower --instances" in result.output  # refused before the cluster
