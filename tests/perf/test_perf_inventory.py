"""``waltz perf inventory``: a short run passes its checks and reports its figures; the checks fail
on an oversold inventory, in a database altered after a run and in a run of an application that
oversells (exit 1).

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
from waltz_examples.inventory.models import Sku
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
