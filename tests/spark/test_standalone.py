"""``waltz rebuild`` on a Spark standalone cluster: a master and two workers.

The driver is a ``waltz rebuild --master spark://...`` process; the log is read through the
storage nodes' admin ports, the live PostgreSQL database over JDBC, and the rebuilt tables written
over JDBC, all by executors that the workers started: on other loopback addresses, or, with the
Waltz cluster in namespace mode, on hosts of their own (network namespaces).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import support
from sqlalchemy import select, text
from support.spark import local_spark_cluster, python_path

from waltz.chaos.proxy import forward_database
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.marks import HighWaterMarks
from waltz.local.cluster import LocalCluster
from waltz.local.netns import network_lab_unavailable
from waltz.local.options import NetworkOptions
from waltz.local.processes import wait_until
from waltz.local.spark import LocalSparkCluster, SparkHost
from waltz_examples.ledger.models import Checking, TransferIn, TransferOut
from waltz_examples.ledger.service import LedgerService, prepare_database
from waltz_examples.ledger.transfers import pending_transfers
from waltz_examples.ledger.views import VIEWS as LEDGER_VIEWS

pytestmark = pytest.mark.timeout(900)

LEDGER_NAME = "standalone-ledger"


def _rows(url: str, table: Any) -> list[tuple[Any, ...]]:
    engine = create_framework_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(tuple(r) for r in conn.execute(select(*table.columns)))
    finally:
        engine.dispose()


def _marks(url: str) -> dict[int, int]:
    engine = create_framework_engine(url)
    try:
        with engine.connect() as conn:
            return HighWaterMarks(LEDGER_NAME).read_all(conn)
    finally:
        engine.dispose()


def _live_ledger(cluster: LocalCluster, url: str) -> None:
    """Accounts, deposits and transfers across partitions, applied by two instances, then stopped."""
    engine = create_framework_engine(url)
    prepare_database(engine)
    engine.dispose()
    services = [
        LedgerService(
            url,
            zookeeper=cluster.zookeeper_connect_string,
            cluster_root=cluster.root,
            client_settings=support.client_parts(cluster)[2],
            cluster_name=LEDGER_NAME,
            prepare=False,
            sweep_interval=0.5,
        )
        for _ in range(2)
    ]
    try:
        for custid in range(8):
            assert services[custid % 2].open_account(custid, f"c{custid}", 100, 100).committed
        for custid in range(8):
            assert services[0].deposit(custid, 5 + custid).committed
        for custid in range(4):
            services[1].transfer(custid, custid + 3, 7)
        wait_until(
            lambda: pending_transfers(services[0].engine) == 0, timeout=60, what="every transfer to complete"
        )
        marks = {p: services[0].client.get_high_water_mark(p) for p in range(cluster.num_partitions)}
        for service in services:
            for pid, mark in marks.items():
                assert mark < 0 or service.callbacks.wait_for(pid, mark, 60)
    finally:
        for service in services:
            service.close()


@pytest.mark.slow
def test_rebuild_and_drift_check_on_a_standalone_cluster(
    spark_cluster: LocalCluster,
    postgres_url: str,
    postgres_server: support.DatabaseServer,
    tmp_path: Path,
) -> None:
    live_url = postgres_url
    _live_ledger(spark_cluster, live_url)
    expected = {t.name: _rows(live_url, t) for t in LEDGER_VIEWS.tables}
    assert expected[TransferOut.__tablename__] and expected[TransferIn.__tablename__]
    live_marks = _marks(live_url)
    engine = create_framework_engine(live_url)
    with engine.begin() as conn:  # drift: one balance changed by hand in the live database
        conn.execute(text("UPDATE ledger_checking SET balance = balance + 1 WHERE custid = 2"))
    engine.dispose()

    with (
        postgres_server.fresh_database() as rebuilt_url,
        local_spark_cluster(tmp_path / "spark") as standalone,
    ):
        env = {
            **os.environ,
            **spark_cluster.admin_env(),  # the operator's ZooKeeper credential and certificate
            "PYTHONPATH": python_path(),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        command = [
            sys.executable,
            "-c",
            "from waltz.cli.main import main; main()",
            "rebuild",
            "--app",
            "waltz_examples.ledger",
            "--zookeeper",
            spark_cluster.zookeeper_connect_string,
            "--cluster-root",
            spark_cluster.root,
            "--cluster-name",
            LEDGER_NAME,
            "--db",
            rebuilt_url,
            "--verify-against",
            live_url,
            "--master",
            standalone.master_url,
        ]
        log_path = tmp_path / "rebuild.log"
        with log_path.open("w") as log_file:
            process = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True)
            try:
                returncode = process.wait(timeout=840)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        output = log_path.read_text()
        assert returncode == 1, output
        assert "[Stage " not in output, "Spark drew its progress bars into a log file"
        assert "live database read over JDBC in one exported snapshot" in output, output
        assert "DRIFT  ledger_checking: 0 missing, 0 extra, 1 different" in output, output
        assert "different: {'custid': 2}" in output, output
        assert "same  ledger_transfers_out: 0 missing, 0 extra, 0 different" in output, output
        # The rebuilt database is the live one as the log made it, at the live marks.
        assert _marks(rebuilt_url) == live_marks
        for table in LEDGER_VIEWS.tables:
            assert _rows(rebuilt_url, table) == expected[table.name], table.name
        assert _rows(rebuilt_url, Checking.__table__) != _rows(live_url, Checking.__table__)
        # The tasks ran in executors that both workers started (their directories hold their logs).
        apps = standalone.state()["completedapps"] + standalone.state()["activeapps"]
        assert any(app["name"] == "waltz-rebuild-waltz_examples.ledger" for app in apps), apps
        for index in range(2):
            executor_logs = list((tmp_path / "spark" / f"worker-{index}").glob("app-*/*/stderr"))
            assert executor_logs, f"worker {index} started no executor"


@pytest.mark.slow
def test_rebuild_with_executors_on_hosts_of_their_own(
    postgres_url: str, postgres_server: support.DatabaseServer, tmp_path: Path
) -> None:
    """The Waltz cluster and both Spark workers on hosts of their own (network namespaces).

    ZooKeeper, the storage nodes and the servers run in namespace mode; the two Spark workers,
    and so their executors, run on the cluster's two client hosts; the master and the driver
    (``waltz rebuild``) on this machine's bridge address. The machine's PostgreSQL listens on
    loopback only, so a forwarder on the bridge address stands in for a database host. The
    executors read the log from the storage nodes' hosts and the live tables and write the rebuilt
    ones through the forwarder: the rebuilt database equals the live one.
    """
    reason = network_lab_unavailable()
    if reason is not None:
        pytest.skip(reason)
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        support.unavailable("pyspark/pyarrow are not installed (pip install -e '.[spark]')")
    live_url = postgres_url
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(
            LocalCluster(
                partitions=2,
                work_dir=tmp_path / "cluster",
                network=NetworkOptions(mode="namespaces", client_hosts=2),
            )
        )
        lab = cluster.network_lab
        assert lab is not None
        live_gateway, live_via = forward_database(live_url, lab.bridge_address)
        stack.enter_context(live_gateway)
        _live_ledger(cluster, live_url)
        expected = {t.name: _rows(live_url, t) for t in LEDGER_VIEWS.tables}
        live_marks = _marks(live_url)
        rebuilt_gateway, rebuilt_url = forward_database(
            stack.enter_context(postgres_server.fresh_database()), lab.bridge_address
        )
        stack.enter_context(rebuilt_gateway)
        workers = [
            SparkHost(cluster.host(f"client-{k}").address, tuple(lab.command_prefix(f"client-{k}")))
            for k in range(2)
        ]
        standalone = stack.enter_context(
            LocalSparkCluster(
                tmp_path / "spark",
                env={"PYTHONPATH": python_path()},
                master_host=lab.bridge_address,
                worker_hosts=workers,
            )
        )
        env = {
            **os.environ,
            **cluster.admin_env(),  # the operator's ZooKeeper credential and certificate
            "PYTHONPATH": python_path(),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": lab.bridge_address,  # the driver, where the executors reach it
        }
        command = [
            sys.executable,
            "-m",
            "waltz",
            "rebuild",
            "--app",
            "waltz_examples.ledger",
            "--zookeeper",
            cluster.zookeeper_connect_string,
            "--cluster-root",
            cluster.root,
            "--cluster-name",
            LEDGER_NAME,
            "--db",
            rebuilt_url,
            "--verify-against",
            live_via,
            "--master",
            standalone.master_url,
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=840, check=False)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-6000:]
        assert "same  ledger_checking: 0 missing, 0 extra, 0 different" in output, output[-6000:]
        assert _marks(rebuilt_url) == live_marks
        for table in LEDGER_VIEWS.tables:
            assert _rows(rebuilt_url, table) == expected[table.name], table.name
        hosts = {w["host"] for w in standalone.state()["workers"]}
        assert hosts == {w.address for w in workers}, hosts
        for index in range(2):
            executor_logs = list((tmp_path / "spark" / f"worker-{index}").glob("app-*/*/stderr"))
            assert executor_logs, f"the worker on client-{index} started no executor"
