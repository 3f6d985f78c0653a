"""The Spark rebuild of the ledger and the counter: equal to the live database, resumable, drift found."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import support
from sqlalchemy import inspect, select, text, update
from typer.testing import CliRunner

from waltz.cli.main import app as waltz_app
from waltz.committed.plan import plan_offline
from waltz.committed.reads import read_committed
from waltz.errors import ClusterNotFoundError
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.marks import HighWaterMarks
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import connect_zookeeper
from waltz.services.storage import format as fmt
from waltz.spark.drift import verify
from waltz.spark.errors import CommittedReadError, StorageDirectoryNotVisibleError
from waltz.spark.rebuild import LogSource, rebuild
from waltz.spark.source import LogRange, WaltzLogReader
from waltz.workloads.smallbank import SmallBankConfig, SmallBankWorkload
from waltz_examples.counter.service import CounterService
from waltz_examples.counter.views import VIEWS as COUNTER_VIEWS
from waltz_examples.ledger.models import Checking, TransferOut
from waltz_examples.ledger.service import LedgerService, prepare_database
from waltz_examples.ledger.smallbank import LedgerInstance
from waltz_examples.ledger.transfers import pending_transfers
from waltz_examples.ledger.views import VIEWS as LEDGER_VIEWS

pytestmark = pytest.mark.timeout(600)

LEDGER_NAME = "spark-ledger"


def _live(cluster: LocalCluster) -> LogSource:
    return LogSource.live(cluster.admin_settings())


def _offline(cluster: LocalCluster) -> LogSource:
    directories = [str(s.directory) for s in cluster.storages]
    return LogSource(storage_dirs=directories, replicas=len(directories))


def _ledger(cluster: LocalCluster, db_url: str, sweep_interval: float | None = 0.5) -> LedgerService:
    zookeeper, root, settings = support.client_parts(cluster)
    return LedgerService(
        db_url,
        zookeeper=zookeeper,
        cluster_root=root,
        client_settings=settings,
        cluster_name=LEDGER_NAME,
        prepare=False,
        sweep_interval=sweep_interval,
    )


def _settle(services: list[LedgerService], partitions: int) -> dict[int, int]:
    """Wait until no transfer is pending and every instance applied up to the servers' marks."""
    wait_until(
        lambda: pending_transfers(services[0].engine) == 0, timeout=60, what="every transfer to complete"
    )
    marks = {p: services[0].client.get_high_water_mark(p) for p in range(partitions)}
    for service in services:
        for pid, mark in marks.items():
            assert mark < 0 or service.callbacks.wait_for(pid, mark, 60), (
                f"partition {pid} not applied to {mark}"
            )
    return marks


@pytest.fixture(scope="module")
def ledger_live(
    spark_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, list[LedgerService]]]:
    """A SQLite ledger database that followed the log live: SmallBank with transfers across partitions."""
    url = f"sqlite:///{tmp_path_factory.mktemp('ledger-live') / 'ledger.db'}"
    engine = create_framework_engine(url)
    prepare_database(engine)
    engine.dispose()
    services = [_ledger(spark_cluster, url) for _ in range(2)]
    try:
        mix = SmallBankConfig(accounts=30, seed=3, in_flight=16, submitters=2)
        workload = SmallBankWorkload([LedgerInstance(s) for s in services], mix)
        workload.populate()
        try:
            stats = workload.run(150)
        finally:
            workload.close()
        assert stats.committed > 50, stats
        _settle(services, spark_cluster.num_partitions)
        yield url, services
    finally:
        for service in services:
            service.close()


def _rows(url: str, table: Any) -> list[tuple[Any, ...]]:
    engine = create_framework_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(tuple(r) for r in conn.execute(select(*table.columns)))
    finally:
        engine.dispose()


def _marks(url: str, name: str) -> dict[int, int]:
    engine = create_framework_engine(url)
    try:
        with engine.connect() as conn:
            return HighWaterMarks(name).read_all(conn)
    finally:
        engine.dispose()


def test_ledger_rebuilt_from_live_cluster_and_from_directories_equals_live_db(
    spark: Any, spark_cluster: LocalCluster, ledger_live: tuple[str, list[LedgerService]], postgres_url: str
) -> None:
    live_url, _ = ledger_live
    report = verify(
        spark, LEDGER_VIEWS, _live(spark_cluster), live_url, cluster_name=LEDGER_NAME, progress=print
    )
    assert not report.drift, "\n".join(report.lines())
    assert sum(report.marks.values()) > 0
    # Offline: the storage directories (a majority proves each record), written into PostgreSQL.
    offline = verify(
        spark, LEDGER_VIEWS, _offline(spark_cluster), live_url, db_url=postgres_url, cluster_name=LEDGER_NAME
    )
    assert not offline.drift, "\n".join(offline.lines())
    assert _marks(postgres_url, LEDGER_NAME) == _marks(live_url, LEDGER_NAME)
    for table in LEDGER_VIEWS.tables:
        assert _rows(postgres_url, table) == _rows(live_url, table), table.name
    assert _rows(postgres_url, TransferOut.__table__), "the workload made no cross-partition transfer"


def test_drift_is_reported_and_fails_the_command(
    spark: Any, spark_cluster: LocalCluster, ledger_live: tuple[str, list[LedgerService]], tmp_path: Path
) -> None:
    live_url, _ = ledger_live
    # A copy of the live database (SQLite's online backup: one consistent snapshot), changed by
    # hand: one balance more, one applied-transaction row deleted.
    copy_path = tmp_path / "copy.db"
    source = sqlite3.connect(live_url.removeprefix("sqlite:///"))
    target = sqlite3.connect(copy_path)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    copy_url = f"sqlite:///{copy_path}"
    engine = create_framework_engine(copy_url)
    with engine.begin() as conn:
        custid = conn.execute(select(Checking.custid).order_by(Checking.custid).limit(1)).scalar_one()
        conn.execute(update(Checking).where(Checking.custid == custid).values(balance=Checking.balance + 1))
        conn.execute(
            text("DELETE FROM ledger_applied_transactions WHERE transaction_id = 0 AND partition_id = 0")
        )
    engine.dispose()
    outcome = CliRunner().invoke(
        waltz_app,
        [
            "rebuild",
            "--app",
            "waltz_examples.ledger",
            "--zookeeper",
            spark_cluster.zookeeper_connect_string,
            "--cluster-root",
            spark_cluster.root,
            "--cluster-name",
            LEDGER_NAME,
            "--verify-against",
            copy_url,
        ],
        env=spark_cluster.admin_env(),
    )
    assert outcome.exit_code == 1, outcome.output
    output = outcome.output
    assert "DRIFT  ledger_checking: 0 missing, 0 extra, 1 different" in output, output
    assert f"different: {{'custid': {custid}}}" in output, output
    assert "DRIFT  ledger_applied_transactions: 1 missing, 0 extra, 0 different" in output, output
    assert "same  ledger_savings: 0 missing, 0 extra, 0 different" in output, output


def test_instance_resumes_from_rebuilt_database_and_converges(
    spark: Any, spark_cluster: LocalCluster, ledger_live: tuple[str, list[LedgerService]], postgres_url: str
) -> None:
    live_url, services = ledger_live
    result = rebuild(spark, LEDGER_VIEWS, _live(spark_cluster), postgres_url, cluster_name=LEDGER_NAME)
    assert _marks(postgres_url, LEDGER_NAME) == dict(result.marks)
    # No sweeper in the resumed instance: it only applies the log (the live instances sweep).
    resumed = _ledger(spark_cluster, postgres_url, sweep_interval=None)
    try:
        for custid in range(5):
            assert services[0].deposit(custid, 7 + custid).committed
        services[0].transfer(1, 2, 3)
        marks = _settle([*services, resumed], spark_cluster.num_partitions)
        assert any(m > result.marks[p] for p, m in marks.items()), "nothing was written after the rebuild"
        assert resumed.callbacks.uncaught_count == 0

        def converged() -> bool:
            # The live instances' sweepers may still commit a step: compare at equal marks.
            if _marks(postgres_url, LEDGER_NAME) != _marks(live_url, LEDGER_NAME):
                return False
            return all(_rows(postgres_url, t) == _rows(live_url, t) for t in LEDGER_VIEWS.tables)

        wait_until(
            converged,
            timeout=90,
            interval=0.5,
            what="the resumed database to equal the live one at the same marks",
        )
        assert all(m >= marks[p] for p, m in _marks(postgres_url, LEDGER_NAME).items())
    finally:
        resumed.close()


def test_a_plan_made_before_is_read_to_and_a_drift_check_past_it_plans_again(
    spark: Any, spark_cluster: LocalCluster, ledger_live: tuple[str, list[LedgerService]], tmp_path: Path
) -> None:
    """``waltz rebuild`` plans the log before Spark starts (``LogSource.planned``): a rebuild reads
    up to that plan although the log moved on, and a drift check whose live database moved past it
    plans again rather than refuse the database's marks as unproven."""
    live_url, services = ledger_live
    said: list[str] = []
    planned = _live(spark_cluster).planned(progress=said.append)
    assert planned.plans is not None and len(said) == spark_cluster.num_partitions, said
    before = {p.partition_id: p.high_water_mark for p in planned.plans}
    for custid in range(4):
        assert services[0].deposit(custid, 5).committed
    marks = _settle(services, spark_cluster.num_partitions)
    assert any(m > before[p] for p, m in marks.items()), (marks, before)
    result = rebuild(
        spark, LEDGER_VIEWS, planned, f"sqlite:///{tmp_path / 'at-plan.db'}", cluster_name=LEDGER_NAME
    )
    assert dict(result.marks) == before
    said.clear()
    report = verify(spark, LEDGER_VIEWS, planned, live_url, cluster_name=LEDGER_NAME, progress=said.append)
    assert not report.drift, "\n".join(report.lines())
    assert any(report.marks[p] > before[p] for p in before), (report.marks, before)
    assert any("planning it again" in line for line in said), said


def test_counter_rebuilt_into_mariadb_equals_live_db(
    spark: Any,
    spark_cluster: LocalCluster,
    ledger_live: tuple[str, list[LedgerService]],
    tmp_path: Path,
    mariadb_url: str,
) -> None:
    # ledger_live first: the ledger's instances apply every transaction of the log, the counter's not.
    live_url = f"sqlite:///{tmp_path / 'counter.db'}"
    zookeeper, root, settings = support.client_parts(spark_cluster)
    with CounterService(
        live_url, zookeeper, root, ignore_foreign_transactions=True, client_config=settings
    ) as service:
        for i in range(12):
            service.increment(i % 4, 5 + i)
        service.decrement(1, 3)
    report = verify(spark, COUNTER_VIEWS, _live(spark_cluster), live_url, db_url=mariadb_url)
    assert not report.drift, "\n".join(report.lines())
    offline = verify(spark, COUNTER_VIEWS, _offline(spark_cluster), live_url)
    assert not offline.drift, "\n".join(offline.lines())
    rows = _rows(mariadb_url, COUNTER_VIEWS.tables[0])
    assert rows == _rows(live_url, COUNTER_VIEWS.tables[0])
    assert len(rows) == 4 and all(updated_tx >= 0 for _, _, updated_tx in rows)
    # A rerun gives the same tables (idempotent).
    rebuild(spark, COUNTER_VIEWS, _live(spark_cluster), mariadb_url, up_to=report.marks)
    assert _rows(mariadb_url, COUNTER_VIEWS.tables[0]) == rows


@pytest.mark.parametrize("backend", ["postgres", "mariadb"])
def test_drift_check_reads_a_live_server_database_over_jdbc(
    spark: Any,
    spark_cluster: LocalCluster,
    ledger_live: tuple[str, list[LedgerService]],
    request: pytest.FixtureRequest,
    backend: str,
) -> None:
    # ledger_live first: the ledger's instances apply every transaction of the log, the counter's not.
    live_url = request.getfixturevalue(f"{backend}_url")
    zookeeper, root, settings = support.client_parts(spark_cluster)
    with CounterService(
        live_url, zookeeper, root, ignore_foreign_transactions=True, client_config=settings
    ) as service:
        for i in range(6):
            service.increment(i % 3, 1 + i)
    report = verify(spark, COUNTER_VIEWS, _live(spark_cluster), live_url)
    assert not report.drift, "\n".join(report.lines())
    engine = create_framework_engine(live_url)
    with engine.begin() as conn:  # one counter changed by hand, one row more
        conn.execute(text("UPDATE counters SET value = value + 100 WHERE counter_id = 1"))
        conn.execute(text("INSERT INTO counters (counter_id, value, updated_tx) VALUES (999, 1, 0)"))
    engine.dispose()
    drifted = verify(spark, COUNTER_VIEWS, _live(spark_cluster), live_url)
    counters = next(t for t in drifted.tables if t.table == "counters")
    assert (counters.missing, counters.extra, counters.different) == (0, 1, 1), "\n".join(drifted.lines())
    assert any(e.startswith("different: {'counter_id': 1}") for e in counters.examples), counters.examples
    assert any("'counter_id': 999" in e for e in counters.examples), counters.examples
    assert drifted.marks == report.marks


def test_an_offline_read_names_a_storage_directory_its_task_cannot_see(
    spark_cluster: LocalCluster, ledger_live: tuple[str, list[LedgerService]], tmp_path: Path
) -> None:
    copies = []
    for index, storage in enumerate(spark_cluster.storages):
        copies.append(tmp_path / f"storage-{index}")
        shutil.copytree(storage.directory, copies[-1])
    reader = WaltzLogReader({"storage_dirs": ",".join(map(str, copies)), "replicas": str(len(copies))})
    ranges = [r for r in reader.partitions() if isinstance(r, LogRange) and r.last >= r.first]
    assert ranges
    # Planned where the directories are (the driver); read where one is missing (an executor).
    shutil.rmtree(copies[1])
    with pytest.raises(
        StorageDirectoryNotVisibleError, match=f"storage directory {copies[1]} is not visible on host"
    ):
        list(reader.read(ranges[0]))


def test_a_rebuild_that_cannot_read_its_log_leaves_the_database_as_it_was(
    spark: Any, spark_cluster: LocalCluster, tmp_path: Path
) -> None:
    """A wrong cluster root, or storage directories that hold no replica: the rebuild fails before
    it makes a table in the target database."""
    url = f"sqlite:///{tmp_path / 'untouched.db'}"
    wrong_root = LogSource.live({**spark_cluster.admin_settings(), "cluster_root": "/waltz-no-such-root"})
    with pytest.raises(ClusterNotFoundError, match="no cluster under /waltz-no-such-root"):
        rebuild(spark, LEDGER_VIEWS, wrong_root, url)
    (tmp_path / "no-replica").mkdir()
    nowhere = LogSource(storage_dirs=[str(tmp_path / "no-replica")], replicas=1)
    with pytest.raises(Exception, match=r"waltz-storage\.ctl"):
        rebuild(spark, LEDGER_VIEWS, nowhere, url)
    engine = create_framework_engine(url)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_the_check_before_the_log_is_read_still_upgrades_a_database_of_an_earlier_release(
    tmp_path: Path,
) -> None:
    """A ledger database at its first release (a demo stopped mid-rollout): the rebuild's first
    check, before the log is read, upgrades it to the models as the rebuild always did."""
    from waltz.spark.target import check_target
    from waltz_examples.ledger.smallbank import SMALLBANK

    url = f"sqlite:///{tmp_path / 'release-1.db'}"
    engine = create_framework_engine(url)
    try:
        SMALLBANK.prepare_release(engine, 1)  # type: ignore[attr-defined]
        before = {c["name"] for c in inspect(engine).get_columns("ledger_accounts")}
    finally:
        engine.dispose()
    check_target(LEDGER_VIEWS, url, create=False)
    engine = create_framework_engine(url)
    try:
        after = {c["name"] for c in inspect(engine).get_columns("ledger_accounts")}
    finally:
        engine.dispose()
    assert "currency" not in before and "currency" in after, (before, after)


def test_a_target_database_without_a_table_of_the_application_is_named_before_the_log_is_read(
    tmp_path: Path,
) -> None:
    """A ledger database whose migrations ran but which lacks one of the ledger's tables (dropped
    since): the migrations, at their head, do not make it again, and the rebuild refuses the
    database naming the table and what to do, before it reads the log."""
    from waltz.spark.errors import RebuildError
    from waltz.spark.target import check_target

    url = f"sqlite:///{tmp_path / 'no-checking.db'}"
    engine = prepare_database(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE {Checking.__tablename__}"))
    finally:
        engine.dispose()
    for create in (False, True):
        with pytest.raises(RebuildError) as refused:
            check_target(LEDGER_VIEWS, url, create=create)
        assert str(refused.value) == (
            f"the target database {url} has no table ledger_checking of the application 'ledger': run "
            "the application's migrations on it (alembic upgrade, as its instances do), or rebuild into "
            "an empty database; nothing was read or written"
        )


def _sessions(cluster: LocalCluster) -> dict[int, int]:
    zk = connect_zookeeper(cluster.zookeeper_connect_string, security=cluster.zookeeper_security)
    try:
        metadata = ClusterZk(zk, cluster.root)
        return {p: metadata.partition_metadata(p).value.session_id for p in range(cluster.num_partitions)}
    finally:
        zk.stop()
        zk.close()


def test_live_reads_never_fence_the_owner_and_options_prune_the_plan(
    spark: Any, spark_cluster: LocalCluster, ledger_live: tuple[str, list[LedgerService]]
) -> None:
    _, services = ledger_live
    before = _sessions(spark_cluster)
    options = {**_live(spark_cluster).options(), "range_size": "10"}
    log = spark.read.format("waltz").options(**options).load()
    everything = log.count()
    assert everything > 40 and log.rdd.getNumPartitions() > 4
    picked = log.where("partition_id = 1 AND transaction_id >= 5 AND transaction_id < 15")
    assert sorted(r.transaction_id for r in picked.collect()) == list(range(5, 15))
    # A query with no filter after it reads the whole log again (docs/decisions/0097: a pushed
    # filter's plan was reused by the next query that pushed none).
    assert log.count() == everything
    # The options prune the plan: one range of 10 transactions instead of every range of both.
    ranged = {"partitions": "1", "from_transaction_id": "5", "to_transaction_id": "14"}
    pruned = spark.read.format("waltz").options(**options, **ranged).load()
    assert pruned.rdd.getNumPartitions() == 1
    assert sorted(r.transaction_id for r in pruned.collect()) == list(range(5, 15))
    # The reads went through the admin ports: the owners' store sessions are the same, and write.
    assert _sessions(spark_cluster) == before
    assert services[0].deposit(0, 1).committed
    assert _sessions(spark_cluster) == before
    # A DataFrame reads the marks planned at its first query (docs/spark.md); a new load, the commit.
    assert log.count() == everything
    assert spark.read.format("waltz").options(**options).load().count() > everything


def test_a_corrupt_record_is_never_returned(
    spark_cluster: LocalCluster, ledger_live: tuple[str, list[LedgerService]], tmp_path: Path
) -> None:
    copy = tmp_path / "storage"
    shutil.copytree(spark_cluster.storages[0].directory, copy)
    segment = sorted((copy / "0").glob("*.seg"))[0]
    with segment.open("r+b") as f:  # a byte of the first record's data flipped
        f.seek(fmt.HEADER_SIZE + fmt.RECORD_HEADER_SIZE + 1)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    (plan,) = plan_offline([str(copy)], [0], high_water_marks={0: 5})
    with pytest.raises(CommittedReadError, match="partition 0 transaction 0"):
        list(read_committed(0, 0, 5, plan.source))
