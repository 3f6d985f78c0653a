"""Snapshots of the ledger (docs/design/spark.md "Snapshots"): a rebuild from a snapshot equals the
full rebuild and the live database; a snapshot loaded into a new database lets an instance resume
from its marks; a damaged or mismatched snapshot is refused, naming the file, before anything is
written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import decimal
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import support
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Float,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    inspect,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from typer.testing import CliRunner

from waltz.cli.main import app as waltz_app
from waltz.jdbc_style import EntityRegistry, WaltzEntity, create_framework_engine
from waltz.jdbc_style.marks import HighWaterMarks
from waltz.jdbc_style.schema import idempotency_keys
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.spark import snapshot as snapshot_module
from waltz.spark.decoders import CHANGES_SCHEMA, decode_changes
from waltz.spark.errors import RebuildError
from waltz.spark.rebuild import LogSource, compute_views, rebuild
from waltz.spark.snapshot import (
    MANIFEST_NAME,
    SnapshotError,
    SnapshotFile,
    SnapshotSeed,
    SnapshotUnreadableError,
    load_snapshot,
    read_manifest,
    replays_every_row,
    rows_as_changes,
    snapshot_entity_rows,
    snapshot_keys,
    snapshot_table,
    verify_snapshot,
    write_snapshot,
)
from waltz.spark.target import marks_text
from waltz.workloads.smallbank import SmallBankConfig, SmallBankWorkload
from waltz_examples.ledger.models import Account, Checking, TransferIn, TransferOut, by_customer
from waltz_examples.ledger.service import LedgerService, prepare_database
from waltz_examples.ledger.smallbank import LedgerInstance
from waltz_examples.ledger.transfers import pending_transfers
from waltz_examples.ledger.views import VIEWS as LEDGER_VIEWS

pytestmark = pytest.mark.timeout(600)

NAME = "snapshot-ledger"


def _ledger(cluster: LocalCluster, url: str) -> LedgerService:
    return LedgerService(
        url,
        zookeeper=cluster.zookeeper_connect_string,
        cluster_root=cluster.root,
        client_settings=support.client_parts(cluster)[2],
        cluster_name=NAME,
        prepare=False,
        sweep_interval=0.5,
    )


def _settle(services: list[LedgerService], partitions: int) -> dict[int, int]:
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


def _run(services: list[LedgerService], seed: int, transactions: int, populate: bool) -> None:
    workload = SmallBankWorkload(
        [LedgerInstance(s) for s in services],
        SmallBankConfig(accounts=30, seed=seed, in_flight=16, submitters=2),
    )
    try:
        if populate:
            workload.populate()
        stats = workload.run(transactions)
    finally:
        workload.close()
    assert stats.committed > transactions // 3, stats


@dataclass(frozen=True)
class History:
    cluster: LocalCluster
    live: str
    snapshot: Path
    snapshot_marks: dict[int, int]
    marks: dict[int, int]


@pytest.fixture(scope="module")
def history(spark_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    """A live SQLite ledger: SmallBank, a snapshot, then more SmallBank on top."""
    work = tmp_path_factory.mktemp("snapshot-ledger")
    live = f"sqlite:///{work / 'live.db'}"
    engine = create_framework_engine(live)
    prepare_database(engine)
    engine.dispose()
    services = [_ledger(spark_cluster, live) for _ in range(2)]
    try:
        _run(services, seed=5, transactions=120, populate=True)
        snapshot_marks = _settle(services, spark_cluster.num_partitions)
        snapshot = work / "snapshot"
        manifest = write_snapshot(LEDGER_VIEWS, live, str(snapshot), cluster_name=NAME)
        assert dict(manifest.marks) == {p: m for p, m in snapshot_marks.items() if m >= 0}
        _run(services, seed=6, transactions=120, populate=False)
        marks = _settle(services, spark_cluster.num_partitions)
        yield History(spark_cluster, live, snapshot, snapshot_marks, marks)
    finally:
        for service in services:
            service.close()


def _source(cluster: LocalCluster) -> LogSource:
    return LogSource.live(cluster.admin_settings())


def _rows(url: str, table: Any, where: Any = None) -> list[tuple[Any, ...]]:
    engine = create_framework_engine(url)
    try:
        with engine.connect() as conn:
            statement = select(*table.columns) if where is None else select(*table.columns).where(where)
            return sorted(tuple(r) for r in conn.execute(statement))
    finally:
        engine.dispose()


def _marks(url: str) -> dict[int, int]:
    engine = create_framework_engine(url)
    try:
        with engine.connect() as conn:
            return HighWaterMarks(NAME).read_all(conn)
    finally:
        engine.dispose()


def _tables(path: Path) -> list[str]:
    """The tables of a SQLite database file ([] when there is no file: nothing was made)."""
    if not path.exists():
        return []
    engine = create_framework_engine(f"sqlite:///{path}")
    try:
        return sorted(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _same_database(url: str, other: str) -> None:
    assert _marks(url) == _marks(other)
    for table in LEDGER_VIEWS.tables:
        assert _rows(url, table) == _rows(other, table), table.name
    keys = idempotency_keys.c.cluster_name == NAME
    assert [r[:4] for r in _rows(url, idempotency_keys, keys)] == [
        r[:4] for r in _rows(other, idempotency_keys, keys)
    ]


#: The two ways a rebuild from a snapshot takes an entity file's rows (``replays_every_row``):
#: every row replayed, or the file joined with the log's keys and its untouched rows passed
#: through (the threshold's two ends, so that neither depends on the fixture's sizes).
MODES = {"every-row-replayed": float("inf"), "joined-with-the-log": 0.0}


@pytest.fixture(params=sorted(MODES))
def snapshot_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(snapshot_module, "REPLAY_EVERY_ROW_PER_TRANSACTION", MODES[request.param])
    return str(request.param)


def test_a_rebuild_from_a_snapshot_equals_the_full_rebuild_and_the_live_database(
    spark: Any, history: History, postgres_url: str, tmp_path: Path, snapshot_mode: str
) -> None:
    assert history.marks != history.snapshot_marks, "nothing was committed after the snapshot"
    full = f"sqlite:///{tmp_path / 'full.db'}"
    rebuild(spark, LEDGER_VIEWS, _source(history.cluster), full, cluster_name=NAME)
    lines: list[str] = []
    result = rebuild(
        spark,
        LEDGER_VIEWS,
        _source(history.cluster),
        postgres_url,
        cluster_name=NAME,
        snapshot=str(history.snapshot),
        progress=lines.append,
    )
    assert any(line.startswith("starting from the snapshot") for line in lines), lines
    assert not any("older models" in line for line in lines), lines
    assert dict(result.marks) == history.marks
    _same_database(postgres_url, full)
    _same_database(postgres_url, history.live)


def test_a_snapshot_of_the_current_models_is_read_by_their_own_columns(history: History) -> None:
    """Nothing to upcast or map: every entity file takes the paths it took before snapshots
    recorded their attributes (native rendering, joined or replayed whole)."""
    manifest = read_manifest(str(history.snapshot))
    assert LEDGER_VIEWS.entities is not None
    for info in LEDGER_VIEWS.entities:
        recorded = manifest.entities[info.name]
        assert recorded["attributes"] == {
            a: c.name for a, c in zip(info.attributes, info.columns, strict=True)
        }
        assert recorded["key"] == list(info.key)
        assert snapshot_module.stored_rows(manifest, info) is None, info.name


def test_only_the_snapshot_rows_the_log_after_it_names_are_replayed(spark: Any, history: History) -> None:
    """The untouched rows pass through as read; the touched ones become changes whose key is the
    log's own key text (or the replay would keep both rows)."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    manifest = read_manifest(str(history.snapshot))
    log = (
        spark.read.format("waltz")
        .options(**_source(history.cluster).options())
        .option("after", marks_text(manifest.marks))
        .load()
    )
    after = decode_changes(log, LEDGER_VIEWS.decoders, LEDGER_VIEWS.entities.schema_chains())
    split = snapshot_entity_rows(spark, str(history.snapshot), manifest, LEDGER_VIEWS, after)
    named = {(r.entity, r.key) for r in after.where(F.col("entity").isNotNull()).collect()}
    replayed = split.changes.collect()
    account = next(i for i in LEDGER_VIEWS.entities or () if i.model is Account)
    assert account.name in {r.entity for r in replayed}, "no account row was touched"
    assert all((r.entity, r.key) in named for r in replayed), [
        (r.entity, r.key) for r in replayed if (r.entity, r.key) not in named
    ][:5]
    assert all(r.operation == "insert" and r.transaction_id == -1 for r in replayed)
    untouched = 0
    for info in LEDGER_VIEWS.entities or ():
        table = info.model.__table__.name
        entry = manifest.table(table)
        assert entry is not None
        passed = split.untouched[table].count() if table in split.untouched else 0
        untouched += passed
        assert passed + sum(1 for r in replayed if r.entity == info.name) == entry.rows, table
    assert untouched > 0, "every snapshot row was touched: the pass-through is not exercised"


def test_the_log_after_the_marks_is_counted_from_each_partitions_start() -> None:
    """From the snapshot's mark; a partition the snapshot lacks from its first ID (a split's new
    partition from its genesis, not from 0); a partition read no further than the snapshot: 0."""
    from waltz.spark.rebuild import tail_transactions

    marks = {0: 999, 1: 499, 2: 1_000_120, 3: -1}
    assert tail_transactions(marks, {0: 899, 1: 499}, {2: 1_000_001}) == 100 + 0 + 120 + 0
    assert tail_transactions({0: 9}, {}, {}) == 10


def test_small_entity_files_are_replayed_whole_and_large_ones_joined() -> None:
    """At most one row per transaction after the marks: the file is replayed whole."""
    assert replays_every_row(0, 0)
    assert replays_every_row(120, 120)
    assert not replays_every_row(121, 120)
    assert not replays_every_row(1, 0)


def test_a_file_replayed_whole_becomes_changes_row_for_row(spark: Any, history: History) -> None:
    """Every row of a small file enters the row changes, the touched and the untouched alike;
    nothing passes through and nothing is joined or persisted."""
    manifest = read_manifest(str(history.snapshot))
    tail = sum(m - history.snapshot_marks.get(p, -1) for p, m in history.marks.items())
    files = {
        info.name: entry.rows
        for info in LEDGER_VIEWS.entities or ()
        if (entry := manifest.table(info.model.__table__.name)) is not None and entry.rows > 0
    }
    assert files and all(replays_every_row(rows, tail) for rows in files.values()), (files, tail)
    split = snapshot_entity_rows(
        spark,
        str(history.snapshot),
        manifest,
        LEDGER_VIEWS,
        spark.createDataFrame([], CHANGES_SCHEMA),
        tail_transactions=tail,
    )
    replayed = split.changes.collect()
    assert {e: sum(1 for r in replayed if r.entity == e) for e in files} == files
    assert all(r.operation == "insert" and r.transaction_id == -1 for r in replayed)
    assert not split.untouched and not split.cached


def test_the_snapshot_rows_and_the_replay_are_read_once_and_released(
    spark: Any, history: History, snapshot_mode: str
) -> None:
    """Each joined entity file's rows with their touched flag, the changes after the marks the
    joins read, and the replay the entity tables share are persisted while the views are written
    (each is read by several Spark jobs), and released; files replayed whole persist nothing."""
    computed = compute_views(
        spark, LEDGER_VIEWS, _source(history.cluster), cluster_name=NAME, snapshot=str(history.snapshot)
    )
    manifest = read_manifest(str(history.snapshot))
    files = [
        entry
        for info in LEDGER_VIEWS.entities or ()
        if (entry := manifest.table(info.model.__table__.name)) is not None and entry.rows > 0
    ]
    frames = (computed.changes, *computed.cached)
    try:
        if snapshot_mode == "joined-with-the-log":
            # The log's changes, those after the marks, one frame per entity file, the replay.
            assert len(frames) == 2 + len(files) + 1, len(frames)
            # Each file's persisted rows read the changes after the marks from memory (cached
            # before the first join), not the log again.
            for rows in computed.cached[1 : 1 + len(files)]:
                plan = rows._jdf.queryExecution().withCachedData().toString()
                assert plan.count("InMemoryTableScan") >= 1, plan
        else:
            assert len(frames) == 2, len(frames)  # the log's changes, the replay
        assert all(frame.is_cached for frame in frames)
    finally:
        computed.release()
    assert not any(frame.is_cached for frame in frames)


@pytest.mark.parametrize("backend", ["sqlite", "mariadb"])
def test_the_snapshot_rows_are_copied_as_they_are_into_sqlite_and_mariadb(
    spark: Any, history: History, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The tables that are not entity tables start with the snapshot's rows, inserted in batches
    where there is no COPY; the result is the live database's."""
    url = (
        f"sqlite:///{tmp_path / 'from-snapshot.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("mariadb_url")
    )
    lines: list[str] = []
    rebuild(
        spark,
        LEDGER_VIEWS,
        _source(history.cluster),
        url,
        cluster_name=NAME,
        snapshot=str(history.snapshot),
        progress=lines.append,
    )
    assert any(line.startswith("copied ") and "ledger_applied_transactions" in line for line in lines), lines
    _same_database(url, history.live)


def _change_rows(frame: Any) -> list[tuple[Any, ...]]:
    fields = ["partition_id", "transaction_id", "header", "op_index", "entity", "operation", "key"]
    fields += ["key_values", "values", "meta", "idempotency_key"]
    rows = [
        tuple(sorted(r[f].items()) if isinstance(r[f], dict) else r[f] for f in fields)
        for r in frame.collect()
    ]
    return sorted(rows, key=repr)


def test_spark_renders_snapshot_rows_as_the_decoders_do(spark: Any, history: History) -> None:
    """Spark's casts and the Python rendering give every snapshot row the same change."""
    manifest = read_manifest(str(history.snapshot))
    for info in LEDGER_VIEWS.entities or ():
        entry = manifest.table(info.model.__table__.name)
        assert entry is not None and entry.rows > 0, info.name
        rows = spark.read.parquet(str(history.snapshot / entry.file))
        native = _change_rows(rows_as_changes(rows, info))
        assert native == _change_rows(rows_as_changes(rows, info, python=True)), info.name
        assert len(native) == entry.rows


def test_the_snapshot_files_are_read_without_a_spark_job_for_their_schema(
    spark: Any, history: History
) -> None:
    """The files' footers give Spark their schemas, the ones its own inference gives, without
    the inference's Spark job per file (a fixed cost of every rebuild from a snapshot)."""
    location = str(history.snapshot)
    manifest = read_manifest(location)
    context = spark.sparkContext
    group = "snapshot-file-schemas"
    context.setJobGroup(group, "reading a snapshot's files")
    try:
        frames = {
            table.name: snapshot_table(spark, location, manifest, table) for table in LEDGER_VIEWS.tables
        }
        frames["waltz_idempotency_keys"] = snapshot_keys(spark, location, manifest)
        split = snapshot_entity_rows(
            spark, location, manifest, LEDGER_VIEWS, spark.createDataFrame([], CHANGES_SCHEMA)
        )
        jobs = context.statusTracker().getJobIdsForGroup(group)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert jobs == [], f"{len(jobs)} Spark jobs ran before any row was asked for"
    assert split.untouched, "no entity file was read"
    for name, frame in frames.items():
        entry = manifest.table(name) or manifest.idempotency_keys
        assert frame is not None, name
        assert frame.schema == spark.read.parquet(str(history.snapshot / entry.file)).schema, name
    for frame in split.cached:
        frame.unpersist()


def test_a_loaded_snapshot_lets_a_new_instance_resume_from_its_marks(
    history: History, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'restored.db'}"
    runner = CliRunner()
    result = runner.invoke(
        waltz_app, ["snapshot", "load", str(history.snapshot), "--app", "waltz_examples.ledger", "--url", url]
    )
    assert result.exit_code == 0, result.output
    assert _marks(url) == {p: m for p, m in history.snapshot_marks.items() if m >= 0}
    # Loading again needs --replace: the database is not new any more.
    again = runner.invoke(
        waltz_app, ["snapshot", "load", str(history.snapshot), "--app", "waltz_examples.ledger", "--url", url]
    )
    assert again.exit_code == 2 and "waltz snapshot load --replace" in again.output
    service = _ledger(history.cluster, url)
    try:
        for pid, mark in history.marks.items():
            assert mark < 0 or service.callbacks.wait_for(pid, mark, 60), (
                f"partition {pid} not caught up to {mark}"
            )
    finally:
        service.close()
    _same_database(url, history.live)


def test_show_and_verify_describe_the_snapshot(history: History) -> None:
    runner = CliRunner()
    shown = runner.invoke(waltz_app, ["snapshot", "show", str(history.snapshot), "--json"])
    assert shown.exit_code == 0, shown.output
    manifest = json.loads(shown.output)
    assert manifest["form"] == 1 and manifest["kind"] == "waltz-snapshot" and manifest["cluster_name"] == NAME
    assert {t["table"] for t in manifest["tables"]} == {t.name for t in LEDGER_VIEWS.tables}
    assert all(len(t["sha256"]) == 64 for t in manifest["tables"])
    assert runner.invoke(waltz_app, ["snapshot", "verify", str(history.snapshot)]).exit_code == 0
    checked = runner.invoke(
        waltz_app, ["snapshot", "verify", str(history.snapshot), "--app", "waltz_examples.ledger"]
    )
    assert checked.exit_code == 0, checked.output
    assert "OK: the models of waltz_examples.ledger read it:" in checked.output, checked.output
    for table in LEDGER_VIEWS.tables:
        assert f"  {table.name}: " in checked.output, checked.output


def test_verify_with_the_app_refuses_what_the_load_would_refuse(damaged: Path) -> None:
    """A table on other columns than the application's: the files match their manifest, but the
    current release could not load the snapshot, and verify --app says so before a restore."""
    manifest_path = damaged / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    table = next(t for t in manifest["tables"] if t["table"] == "ledger_applied_transactions")
    table["columns"] = [c for c in table["columns"] if c[0] != "member"]
    manifest_path.write_text(json.dumps(manifest))
    runner = CliRunner()
    assert runner.invoke(waltz_app, ["snapshot", "verify", str(damaged)]).exit_code == 0
    refused = runner.invoke(waltz_app, ["snapshot", "verify", str(damaged), "--app", "waltz_examples.ledger"])
    assert refused.exit_code == 1, refused.output
    assert "table ledger_applied_transactions has columns" in refused.output, refused.output


@pytest.fixture
def damaged(history: History, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(history.snapshot, copy)
    return copy


def test_a_changed_file_is_refused_naming_it(damaged: Path) -> None:
    entry = read_manifest(str(damaged)).tables[0]
    path = damaged / entry.file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(
        SnapshotError, match=rf"{entry.file} \({entry.table}\): its SHA-256 is .*changed or damaged"
    ):
        verify_snapshot(str(damaged))
    result = CliRunner().invoke(waltz_app, ["snapshot", "verify", str(damaged)])
    assert result.exit_code == 1 and entry.file in result.output


def test_a_missing_file_is_refused_naming_it(damaged: Path, tmp_path: Path) -> None:
    entry = read_manifest(str(damaged)).tables[-1]
    (damaged / entry.file).unlink()
    with pytest.raises(SnapshotError, match=rf"{entry.file} \({entry.table}\): missing"):
        verify_snapshot(str(damaged))
    # Nothing is written into a database from a snapshot that does not verify.
    url = f"sqlite:///{tmp_path / 'never.db'}"
    with pytest.raises(SnapshotError, match="missing"):
        load_snapshot(str(damaged), LEDGER_VIEWS, url)
    assert not (tmp_path / "never.db").exists() or _marks(url) == {}


def test_a_snapshot_of_another_application_s_database_is_refused_before_anything_is_written(
    history: History, tmp_path: Path
) -> None:
    """``waltz snapshot create --app waltz_examples.counter`` on the ledger's database: its table is
    not there; the error names it, and no snapshot directory is left."""
    from waltz_examples.counter.views import VIEWS as COUNTER_VIEWS

    location = tmp_path / "counter-snapshot"
    with pytest.raises(SnapshotError, match=r"has no table counters .*is it this application's database"):
        write_snapshot(COUNTER_VIEWS, history.live, str(location))
    assert not location.exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: {**m, "form": 99}, "snapshot form 99 is newer than this waltz-py reads"),
        (lambda m: {**m, "kind": "something"}, "is not a waltz snapshot manifest"),
        (lambda m: {k: v for k, v in m.items() if k != "marks"}, r"field 'marks' is None"),
        # Damaged or edited by hand: each field of its own type, or the load would go wrong.
        (lambda m: {**m, "cluster_name": None}, r"field 'cluster_name' is None, expected a string"),
        (lambda m: {**m, "cluster_name": ""}, r"field 'cluster_name' is empty"),
        (lambda m: {**m, "marks": {"0": 10.9}}, r"field 'marks' is \{'0': 10\.9\}"),
        (lambda m: {**m, "marks": {"0": True}}, r"field 'marks' is \{'0': True\}"),
        (lambda m: {**m, "marks": {"x": 3}}, r"field 'marks' is \{'x': 3\}"),
        (lambda m: {**m, "tables": {}}, r"field 'tables' is \{\}, expected a list"),
        (lambda m: {**m, "written_at": 5}, r"field 'written_at' is 5, expected a string"),
        (
            lambda m: {**m, "tables": [{**m["tables"][0], "rows": "2"}]},
            r"field 'rows' is '2', expected an integer",
        ),
        (lambda m: {**m, "tables": [{**m["tables"][0], "rows": -1}]}, r"rows -1 or sha256 .* malformed"),
        (
            lambda m: {**m, "tables": [{**m["tables"][0], "sha256": "abc"}]},
            r"rows .* or sha256 'abc' malformed",
        ),
        (
            lambda m: {**m, "tables": [{**m["tables"][0], "file": "../other/x.parquet"}]},
            r"file '\.\./other/x\.parquet' is not a file name of the snapshot",
        ),
        (
            lambda m: {**m, "tables": [{**m["tables"][0], "columns": [["a"]]}]},
            r"expected \[name, type\] pairs",
        ),
        (lambda m: {**m, "idempotency_keys": None}, r"a table entry is None, expected an object"),
        (lambda m: {**m, "cluster_key_fingerprint": 7}, r"'cluster_key_fingerprint' is 7, expected a string"),
    ],
)
def test_a_wrong_manifest_is_refused(damaged: Path, change: Any, message: str) -> None:
    manifest_path = damaged / MANIFEST_NAME
    manifest_path.write_text(json.dumps(change(json.loads(manifest_path.read_text()))))
    with pytest.raises(SnapshotError, match=message):
        read_manifest(str(damaged))


def test_a_file_whose_sha256_matches_but_is_not_parquet_is_refused_naming_it(damaged: Path) -> None:
    """The manifest edited to match a file that is no Parquet file: verify names it, no traceback."""
    manifest_path = damaged / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    entry = manifest["tables"][0]
    garbage = b"not parquet at all"
    (damaged / entry["file"]).write_bytes(garbage)
    entry["sha256"] = hashlib.sha256(garbage).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(
        SnapshotError, match=rf"{re.escape(entry['file'])} \({entry['table']}\): not a Parquet file"
    ):
        verify_snapshot(str(damaged))


def test_no_manifest_is_no_snapshot(damaged: Path, tmp_path: Path) -> None:
    (damaged / MANIFEST_NAME).unlink()
    with pytest.raises(SnapshotError, match=r"no manifest\.json: not a complete snapshot"):
        read_manifest(str(damaged))
    # What the location is instead, as far as a look tells.
    with pytest.raises(SnapshotError, match="no such location"):
        read_manifest(str(tmp_path / "nowhere"))
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "archive.json").write_text("{}")
    with pytest.raises(SnapshotError, match=r"an archive \(archive\.json\), not a snapshot"):
        read_manifest(str(archive))
    parent = tmp_path / "snapshots"
    (parent / "monday").mkdir(parents=True)
    (parent / "monday" / MANIFEST_NAME).write_text("{}")
    with pytest.raises(SnapshotError, match=r"snapshots below it: .*monday; give one of them"):
        read_manifest(str(parent))
    for content in ("{not json", "[" * 60_000, '{"form": ' + "9" * 5_000 + "}"):  # deep, long
        (damaged / MANIFEST_NAME).write_text(content)
        with pytest.raises(SnapshotError, match="is not JSON"):
            read_manifest(str(damaged))


def test_verify_tells_no_snapshot_there_from_a_damaged_one(damaged: Path, tmp_path: Path) -> None:
    """Exit 2 for a location that holds no snapshot (a wrong path), 1 for a damaged manifest."""
    runner = CliRunner()
    for nowhere in (tmp_path / "nowhere", tmp_path):
        result = runner.invoke(waltz_app, ["snapshot", "verify", str(nowhere)])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: ") and "Traceback" not in result.output
    with pytest.raises(SnapshotUnreadableError, match="no such location"):
        read_manifest(str(tmp_path / "nowhere"))
    (damaged / MANIFEST_NAME).write_text("{not json")
    result = runner.invoke(waltz_app, ["snapshot", "verify", str(damaged)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("FAILED: ") and "is not JSON" in result.output


def test_a_snapshot_ahead_of_the_marks_asked_is_refused(spark: Any, history: History, tmp_path: Path) -> None:
    behind = {p: -1 for p in history.marks}
    url = f"sqlite:///{tmp_path / 'behind.db'}"
    with pytest.raises(RebuildError, match="beyond the log's marks"):
        rebuild(
            spark,
            LEDGER_VIEWS,
            _source(history.cluster),
            url,
            cluster_name=NAME,
            up_to=behind,
            snapshot=str(history.snapshot),
        )
    assert _tables(tmp_path / "behind.db") == []  # a refused rebuild makes no table


def test_a_snapshot_of_a_newer_model_is_refused_before_spark_reads_it(
    spark: Any, history: History, damaged: Path, tmp_path: Path
) -> None:
    """A snapshot taken when an entity was at a newer schema version than the application's model
    (a release rolled back): no upcaster leads back, so the rebuild refuses it and says why,
    instead of failing in Spark on a column the model lacks. (A snapshot of an older model is
    upcast: tests/spark/test_schema_evolution.py.)"""
    manifest_path = damaged / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    (entity,) = [
        name for name, recorded in manifest["entities"].items() if int(recorded["schema_version"]) > 1
    ]
    current = int(manifest["entities"][entity]["schema_version"])
    manifest["entities"][entity]["schema_version"] = current + 1
    manifest_path.write_text(json.dumps(manifest))
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    with pytest.raises(
        RebuildError,
        match=rf"{entity} is at schema version {current + 1} in the snapshot, newer than the application's "
        rf"model \({current}\)",
    ):
        rebuild(spark, LEDGER_VIEWS, _source(history.cluster), url, cluster_name=NAME, snapshot=str(damaged))
    assert _tables(tmp_path / "newer.db") == []  # a refused rebuild makes no table


def test_another_application_s_log_is_refused_before_anything_is_written(
    spark: Any, history: History, tmp_path: Path
) -> None:
    """The counter's views given the ledger's log (a wrong --app): none of the log's entities is
    the counter's, so nothing is written and the error says to check --app and --root."""
    from waltz_examples.counter.views import VIEWS as COUNTER_VIEWS

    url = f"sqlite:///{tmp_path / 'wrong-app.db'}"
    with pytest.raises(RebuildError, match=r"none of which the application 'counter' declares.*--app"):
        rebuild(spark, COUNTER_VIEWS, _source(history.cluster), url, cluster_name="counter")
    assert _tables(tmp_path / "wrong-app.db") == []  # a refused rebuild makes no table


def test_a_second_snapshot_never_overwrites_the_first(history: History) -> None:
    with pytest.raises(SnapshotError, match="holds a snapshot already"):
        write_snapshot(LEDGER_VIEWS, history.live, str(history.snapshot), cluster_name=NAME)


def test_every_file_of_a_snapshot_is_private_in_a_directory_open_to_others(
    history: History, tmp_path: Path
) -> None:
    """A directory made by hand, readable by everyone, under the usual umask: the snapshot's files
    (the application's rows) are readable by their owner only, its manifest as its tables."""
    target = tmp_path / "made-by-hand"
    target.mkdir()
    target.chmod(0o755)
    umask = os.umask(0o022)
    try:
        write_snapshot(LEDGER_VIEWS, history.live, str(target), cluster_name=NAME)
    finally:
        os.umask(umask)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in target.iterdir() if path.is_file()}
    assert MANIFEST_NAME in modes and len(modes) > len(LEDGER_VIEWS.tables), modes
    assert set(modes.values()) == {0o600}, modes


class _NarrowBase(DeclarativeBase):
    pass


class _NarrowSavings(_NarrowBase):
    """The ledger's savings entity without its balance: the log's deposits set an attribute this
    model does not have."""

    __tablename__ = "ledger_savings"
    __waltz__ = WaltzEntity("ledger.savings", partition_by=by_customer)

    custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)


def test_a_change_after_the_snapshot_that_the_models_cannot_take_is_refused(
    spark: Any, history: History
) -> None:
    """The model check runs in the decoding pass on the log after the snapshot's marks too."""
    entities = EntityRegistry([Account, _NarrowSavings, Checking, TransferOut, TransferIn])
    narrow = dataclasses.replace(LEDGER_VIEWS, entities=entities)
    with pytest.raises(RebuildError, match="do not fit the application's current models") as refused:
        compute_views(
            spark, narrow, _source(history.cluster), cluster_name=NAME, snapshot=str(history.snapshot)
        )
    message = str(refused.value)
    assert "which are not column attributes of _NarrowSavings" in message, message
    named = re.findall(r"partition (\d+) transaction (\d+): ", message)
    assert named, message
    assert all(int(t) > history.snapshot_marks[int(p)] for p, t in named), (named, history.snapshot_marks)


def test_text_null_quotes_and_newlines_survive_the_copy_into_postgresql(
    postgres_url: str, tmp_path: Path
) -> None:
    """A seed of integer, boolean and text columns goes to PostgreSQL as CSV that pyarrow writes:
    NULL stays NULL, an empty text stays empty, quotes, commas and newlines stay in the text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [None, "", "plain", 'a "quoted", text\nover two lines', "\\N", "NULL"]
    flags = [None, True, False, True, False, None]
    pq.write_table(
        pa.table(
            {
                "id": pa.array(range(len(texts)), pa.int64()),
                "label": pa.array(texts, pa.string()),
                "flag": pa.array(flags, pa.bool_()),
            }
        ),
        tmp_path / "seeded.parquet",
    )
    metadata = MetaData()
    table = Table(
        "seeded",
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=False),
        Column("label", String(64)),
        Column("flag", Boolean),
    )
    entry = SnapshotFile(table="seeded", file="seeded.parquet", rows=len(texts), sha256="")
    engine = create_framework_engine(postgres_url)
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            assert SnapshotSeed(str(tmp_path), entry).copy_into(conn, table, "seeded") == len(texts)
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(select(table).order_by(table.c.id))]
    finally:
        engine.dispose()
    assert rows == list(zip(range(len(texts)), texts, flags, strict=True))


class _Typed(_NarrowBase):
    """An entity of every column type a snapshot keeps that the rebuild casts (spark_type)."""

    __tablename__ = "typed_rows"
    __waltz__ = WaltzEntity("test.typed", partition_by=by_customer)

    custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    amount: Mapped[decimal.Decimal | None] = mapped_column(Numeric(12, 2))
    exact: Mapped[decimal.Decimal | None] = mapped_column(Numeric)  # kept as its text
    ratio: Mapped[float | None] = mapped_column(Float)
    stamped: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    local: Mapped[dt.datetime | None] = mapped_column(DateTime)
    day: Mapped[dt.date | None] = mapped_column(Date)
    flag: Mapped[bool | None] = mapped_column(Boolean)
    label: Mapped[str | None] = mapped_column(String(32))
    blob: Mapped[bytes | None] = mapped_column(LargeBinary)


@contextlib.contextmanager
def _python_workers_in_zone(spark: Any, zone: str | None) -> Iterator[None]:
    """Spark's Python workers for the functions made inside it run with ``TZ=zone`` (None: as
    they were): a worker gives a Python function a ``timestamp`` as a naive datetime in its own
    local time, so a zone other than UTC shows what a machine's zone would change. Spark starts
    workers of their own for another environment (``SparkContext.environment``)."""
    environment = spark.sparkContext.environment
    saved = environment.get("TZ")
    if zone is not None:
        environment["TZ"] = zone
    try:
        yield
    finally:
        if saved is None:
            environment.pop("TZ", None)
        else:
            environment["TZ"] = saved


@pytest.mark.parametrize("zone", [None, "America/New_York"])
def test_a_snapshot_row_replayed_is_the_row_that_passes_through(
    spark: Any, tmp_path: Path, zone: str | None
) -> None:
    """Whether a file is replayed whole or joined, a row the log after the marks leaves alone must
    come out the same: replayed (rendered as the decoders render, then cast by ``entity_table``)
    it equals the row passed through (the Parquet value cast to the column's type), for every
    column type, NULLs, fractions and time zones included, whatever the zone of the machine
    that runs Spark's Python workers (here also New York, whose clocks an instant of
    ``stamped`` turns back through)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from waltz.spark.snapshot import arrow_type, read_snapshot_file
    from waltz.spark.views import entity_table, replay, spark_type

    utc = dt.UTC
    values = {
        "custid": [1, 2, 3, 4],
        "amount": [decimal.Decimal("12.50"), decimal.Decimal("-0.01"), None, decimal.Decimal("1")],
        "exact": ["0.123456789012345678", "-1E+3", None, "12345678901234567890.5"],
        "ratio": [0.1, 1e-300, None, 2.5],
        "stamped": [
            dt.datetime(2026, 3, 29, 1, 30, 0, 123456, tzinfo=utc),
            None,
            dt.datetime(1999, 12, 31, tzinfo=utc),
            # 01:30 in New York for the second time that night (EST, after EDT's 01:30).
            dt.datetime(2026, 11, 1, 6, 30, tzinfo=utc),
        ],
        "local": [dt.datetime(2026, 10, 25, 2, 30), dt.datetime(2000, 1, 1, 0, 0, 0, 1), None, None],
        "day": [dt.date(2026, 2, 28), None, dt.date(1970, 1, 1), None],
        "flag": [True, False, None, None],
        "label": ["", 'a "quoted", text\nover two lines', None, "d"],
        "blob": [b"\x00\xff", None, b"", None],
    }
    table = _Typed.__table__
    schema = pa.schema([pa.field(c.name, arrow_type(c.type)) for c in table.columns])
    pq.write_table(pa.table(values, schema=schema), tmp_path / "typed.parquet")
    rows = read_snapshot_file(spark, str(tmp_path), "typed.parquet")
    registry = EntityRegistry([_Typed])
    info = next(iter(registry))
    with _python_workers_in_zone(spark, zone):
        replayed = entity_table(replay(rows_as_changes(rows, info)), registry, _Typed).collect()
    passed = rows.select(*[F.col(c.name).cast(spark_type(c.type)).alias(c.name) for c in table.columns])
    assert sorted(replayed) == sorted(passed.collect())
    assert len(replayed) == 4


def test_a_uuid_column_of_text_attributes_stays_text() -> None:
    """Only a UUID column whose attribute holds ``uuid.UUID`` values is recorded as ``UUID`` (its
    text upcast to ``uuid.UUID``, as the log carries it); one of ``as_uuid=False`` keeps its text,
    and a ``uuid.UUID`` an upcaster gives it is written back as text."""
    import uuid

    from sqlalchemy import Uuid

    assert snapshot_module.sql_type_name(Uuid()) == "UUID"
    assert snapshot_module.sql_type_name(Uuid(as_uuid=False)) == str(Uuid(as_uuid=False))
    value = uuid.uuid4()
    assert snapshot_module._python_value(Uuid(as_uuid=False), value) == str(value)
    assert snapshot_module._python_value(Uuid(as_uuid=False), str(value)) == str(value)
    assert snapshot_module._python_value(Uuid(), str(value)) == value


def _counter_database(path: Path, cluster_name: str) -> str:
    """A counter database (SQLite) that follows the log ``cluster_name``: counter 7 inserted by
    transaction 0 and set to 9 by transaction 1 of partition 0, with their idempotency keys; its URL."""
    from waltz.client.transaction import Transaction
    from waltz.jdbc_style import CHANGE_SET_HEADER, ChangeSet, Operation, RowChange
    from waltz.protocol.records import ReqId
    from waltz_examples.counter.transactions import CounterCallbacks
    from waltz_examples.counter.views import VIEWS as COUNTER_VIEWS

    url = f"sqlite:///{path}"
    engine = create_framework_engine(url)
    try:
        COUNTER_VIEWS.prepare(engine)
        callbacks = CounterCallbacks(engine, cluster_name=cluster_name)
        callbacks.get_client_high_water_mark(0)
        for tid, (operation, value) in enumerate([(Operation.INSERT, 5), (Operation.UPDATE, 9)]):
            change = RowChange(operation, "counter", {"counter_id": 7}, {"counter_id": 7, "value": value})
            data = ChangeSet((change,), f"req-{tid}").encode()
            committed = Transaction(0, tid, ReqId(1, 1, 0, tid), CHANGE_SET_HEADER, None, data)
            callbacks.apply_transaction(committed)
        callbacks.release_connections()
    finally:
        engine.dispose()
    return url


def test_a_snapshot_under_a_log_name_without_marks_is_refused_naming_the_logs_the_database_follows(
    tmp_path: Path,
) -> None:
    """``waltz snapshot create`` without --cluster-name on a database that follows the log under
    another name: the application's default name has no marks there, yet the table has rows. The
    snapshot would hold them with no marks, and an instance on a database it is loaded into would
    apply the whole log on top of them: refused, naming the logs the database does follow, with
    nothing left at the location. Under the right name it is written with the marks."""
    from waltz_examples.counter.views import VIEWS as COUNTER_VIEWS

    url = _counter_database(tmp_path / "live.db", "prod-counter")
    location = tmp_path / "snapshot"
    refusal = r"no marks of the log 'counter', yet rows in counters.*the logs \['prod-counter'\]"
    with pytest.raises(SnapshotError, match=refusal):
        write_snapshot(COUNTER_VIEWS, url, str(location))
    assert not location.exists()
    refused = CliRunner().invoke(
        waltz_app, ["snapshot", "create", str(location), "--app", "waltz_examples.counter", "--url", url]
    )
    assert refused.exit_code == 2, refused.output
    assert "--cluster-name prod-counter" in refused.output and "Traceback" not in refused.output
    assert not location.exists()
    manifest = write_snapshot(COUNTER_VIEWS, url, str(location), cluster_name="prod-counter")
    assert dict(manifest.marks) == {0: 1} and manifest.idempotency_keys.rows == 2


def test_an_empty_database_without_marks_is_a_snapshot_of_nothing(tmp_path: Path) -> None:
    """No marks and no rows is consistent: the snapshot is the log's start."""
    from waltz_examples.counter.views import VIEWS as COUNTER_VIEWS

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    engine = create_framework_engine(url)
    try:
        COUNTER_VIEWS.prepare(engine)
    finally:
        engine.dispose()
    manifest = write_snapshot(COUNTER_VIEWS, url, str(tmp_path / "snapshot"))
    assert dict(manifest.marks) == {} and [t.rows for t in manifest.tables] == [0]
    load_snapshot(str(tmp_path / "snapshot"), COUNTER_VIEWS, f"sqlite:///{tmp_path / 'loaded.db'}")


def test_a_manifest_of_rows_without_marks_is_refused_by_verify_load_and_the_rebuild(tmp_path: Path) -> None:
    """A snapshot whose manifest gives rows but no marks (written under a log name without marks
    by a release that did not refuse it): every use refuses it before anything is written."""
    from waltz.spark.rebuild import _snapshot_base
    from waltz_examples.counter.views import VIEWS as COUNTER_VIEWS

    url = _counter_database(tmp_path / "live.db", "prod-counter")
    location = tmp_path / "snapshot"
    write_snapshot(COUNTER_VIEWS, url, str(location), cluster_name="prod-counter")
    manifest_path = location / MANIFEST_NAME
    raw = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**raw, "cluster_name": "counter", "marks": {}}))
    message = r"holds 1 rows of counters and 2 idempotency keys but no marks of the log 'counter'"
    with pytest.raises(SnapshotError, match=message):
        verify_snapshot(str(location))
    verified = CliRunner().invoke(waltz_app, ["snapshot", "verify", str(location)])
    assert verified.exit_code == 1 and "no marks of the log 'counter'" in verified.output, verified.output
    target = tmp_path / "loaded.db"
    with pytest.raises(SnapshotError, match=message):
        load_snapshot(str(location), COUNTER_VIEWS, f"sqlite:///{target}")
    assert _tables(target) == []
    with pytest.raises(SnapshotError, match=message):
        _snapshot_base(str(location), {0: 1}, None, COUNTER_VIEWS, lambda _: None)


def test_a_refused_load_leaves_the_database_at_its_revision(tmp_path: Path) -> None:
    """``waltz snapshot load`` into a database that is not new (rows, or marks of the log) is
    refused before the application's ``prepare`` migrates anything: a database of the previous
    framework revision stays at it, and no application table is made. A new database at that
    revision is migrated and loaded."""
    from waltz.jdbc_style import migrations_api
    from waltz.jdbc_style.schema import high_water_marks
    from waltz_examples.counter.views import VIEWS as COUNTER_VIEWS

    location = tmp_path / "snapshot"
    write_snapshot(COUNTER_VIEWS, _counter_database(tmp_path / "live.db", "counter"), str(location))

    def at_first_revision(url: str) -> str:
        engine = create_framework_engine(url)
        try:
            migrations_api.upgrade(engine)
            migrations_api.downgrade(engine, "waltz_0001")
        finally:
            engine.dispose()
        return url

    def revision(url: str) -> str | None:
        engine = create_framework_engine(url)
        try:
            return migrations_api.current(engine)
        finally:
            engine.dispose()

    used = at_first_revision(_counter_database(tmp_path / "used.db", "counter"))
    refused = CliRunner().invoke(
        waltz_app, ["snapshot", "load", str(location), "--app", "waltz_examples.counter", "--url", used]
    )
    assert refused.exit_code == 2 and "has marks of 'counter' already" in refused.output, refused.output
    assert revision(used) == "waltz_0001"

    marked = at_first_revision(f"sqlite:///{tmp_path / 'marked.db'}")
    engine = create_framework_engine(marked)
    try:
        with engine.begin() as conn:
            conn.execute(
                high_water_marks.insert().values(
                    cluster_name="counter",
                    partition_id=0,
                    high_water_mark=3,
                    updated_at=dt.datetime.now(dt.UTC),
                )
            )
    finally:
        engine.dispose()
    with pytest.raises(SnapshotError, match="has marks of 'counter' already"):
        load_snapshot(str(location), COUNTER_VIEWS, marked)
    assert revision(marked) == "waltz_0001" and "counters" not in _tables(tmp_path / "marked.db")

    rows = at_first_revision(_counter_database(tmp_path / "rows.db", "prod-counter"))
    with pytest.raises(SnapshotError, match="table counters is not empty"):
        load_snapshot(str(location), COUNTER_VIEWS, rows)
    assert revision(rows) == "waltz_0001"

    new = at_first_revision(f"sqlite:///{tmp_path / 'new.db'}")
    load_snapshot(str(location), COUNTER_VIEWS, new)
    assert revision(new) == migrations_api.head()


class _Exact(_NarrowBase):
    """Decimal columns of every declaration: unbounded (a PostgreSQL ``NUMERIC`` keeps any
    number of digits), without a scale (``NUMERIC(10)``, scale 0), wider than a Parquet decimal
    holds (``NUMERIC(60, 30)``), and bounded (``NUMERIC(12, 2)``)."""

    __tablename__ = "exact_rows"
    __waltz__ = WaltzEntity("test.exact", partition_by=by_customer)

    custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    exact: Mapped[decimal.Decimal | None] = mapped_column(Numeric)
    whole: Mapped[decimal.Decimal | None] = mapped_column(Numeric(10))
    wide: Mapped[decimal.Decimal | None] = mapped_column(Numeric(60, 30))
    amount: Mapped[decimal.Decimal | None] = mapped_column(Numeric(12, 2))


#: Rows of ``_Exact``: more fractional digits than 10, more digits than 38, exponents, NULLs.
EXACT_ROWS = [
    {
        "custid": 1,
        "exact": decimal.Decimal("0.123456789012345678901234567890"),
        "whole": decimal.Decimal("5"),
        "wide": decimal.Decimal("123456789012345678901234567890.123456789012345678901234567890"),
        "amount": decimal.Decimal("12.50"),
    },
    {
        "custid": 2,
        "exact": decimal.Decimal("-98765432109876543210987654321098765432109876543210.5"),
        "whole": decimal.Decimal("-9999999999"),
        "wide": decimal.Decimal("-0.000000000000000000000000000001"),
        "amount": decimal.Decimal("-0.01"),
    },
    {"custid": 3, "exact": decimal.Decimal("1.10"), "whole": None, "wide": None, "amount": None},
    {"custid": 4, "exact": None, "whole": decimal.Decimal("0"), "wide": decimal.Decimal("0"), "amount": None},
]


def _exact_views() -> Any:
    from waltz.jdbc_style import migrations_api

    def prepare(engine: Any) -> None:
        migrations_api.upgrade(engine)
        _Exact.metadata.create_all(engine, tables=[_Exact.__table__])

    return dataclasses.replace(
        LEDGER_VIEWS,
        cluster_name="exact",
        tables=[_Exact.__table__],
        prepare=prepare,
        entities=EntityRegistry([_Exact]),
    )


def _exact_database(url: str, rows: list[dict[str, Any]]) -> None:
    from waltz.jdbc_style.schema import high_water_marks

    engine = create_framework_engine(url)
    try:
        _exact_views().prepare(engine)
        with engine.begin() as conn:
            conn.execute(_Exact.__table__.insert(), rows)
            conn.execute(
                high_water_marks.insert().values(
                    cluster_name="exact",
                    partition_id=0,
                    high_water_mark=3,
                    updated_at=dt.datetime.now(dt.UTC),
                )
            )
    finally:
        engine.dispose()


def _exact_rows(url: str) -> list[dict[str, Any]]:
    engine = create_framework_engine(url)
    try:
        with engine.connect() as conn:
            table = _Exact.__table__
            return [dict(r._mapping) for r in conn.execute(select(table).order_by(table.c.custid))]
    finally:
        engine.dispose()


def test_decimals_of_any_precision_are_kept_exactly_on_postgresql(
    postgres_server: Any, postgres_url: str, tmp_path: Path
) -> None:
    """A decimal column without a precision and scale a Parquet decimal holds (unbounded, no
    scale, more than 38 digits) is kept as its exact text, the snapshot's form 2 naming the
    columns; the load and the copy of a rebuild's seed give back every digit. A bounded column
    stays a Parquet decimal."""
    import pyarrow.parquet as pq

    views = _exact_views()
    _exact_database(postgres_url, EXACT_ROWS)
    location = tmp_path / "snapshot"
    manifest = write_snapshot(views, postgres_url, str(location))
    assert manifest.form == 2 and read_manifest(str(location)).form == 2
    (entry,) = manifest.tables
    assert entry.decimal_text == ("exact", "whole", "wide")
    schema = pq.read_schema(location / entry.file)
    assert [str(schema.field(c).type) for c in ("exact", "whole", "wide", "amount")] == [
        "string",
        "string",
        "string",
        "decimal128(12, 2)",
    ]
    assert _exact_rows(postgres_url) == EXACT_ROWS  # the database holds every digit
    with postgres_server.fresh_database() as loaded:
        load_snapshot(str(location), views, loaded)
        assert _exact_rows(loaded) == EXACT_ROWS
        engine = create_framework_engine(loaded)
        try:
            with engine.begin() as conn:
                conn.execute(_Exact.__table__.delete())
                assert SnapshotSeed(str(location), entry).copy_into(conn, _Exact.__table__, "exact_rows") == 4
        finally:
            engine.dispose()
        assert _exact_rows(loaded) == EXACT_ROWS


def test_a_snapshot_of_form_1_with_decimals_of_scale_10_is_still_read(tmp_path: Path) -> None:
    """A release before form 2 kept an unbounded decimal column as a Parquet decimal(38, 10):
    such a snapshot loads as it did."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    views = _exact_views()
    rows = [{**row, "exact": decimal.Decimal("1.5"), "wide": None, "whole": None} for row in EXACT_ROWS[:2]]
    _exact_database(f"sqlite:///{tmp_path / 'source.db'}", rows)
    location = tmp_path / "snapshot"
    write_snapshot(views, f"sqlite:///{tmp_path / 'source.db'}", str(location))
    raw = json.loads((location / MANIFEST_NAME).read_text())
    (entry,) = raw["tables"]
    old_types = {
        "exact": pa.decimal128(38, 10),
        "whole": pa.decimal128(10, 10),
        "wide": pa.decimal128(38, 10),
    }
    table = pq.read_table(location / entry["file"])
    table = table.cast(pa.schema([pa.field(f.name, old_types.get(f.name, f.type)) for f in table.schema]))
    pq.write_table(table, location / entry["file"])
    del entry["decimal_text"]
    entry["sha256"] = hashlib.sha256((location / entry["file"]).read_bytes()).hexdigest()
    (location / MANIFEST_NAME).write_text(json.dumps({**raw, "form": 1}))
    url = f"sqlite:///{tmp_path / 'loaded.db'}"
    load_snapshot(str(location), views, url)
    assert _exact_rows(url) == rows


def test_a_value_outside_its_column_s_parquet_type_is_refused_naming_it_and_nothing_is_left(
    tmp_path: Path,
) -> None:
    """SQLite keeps a value a ``NUMERIC(12, 2)`` column cannot hold: the snapshot is refused naming
    the table, the column and the value (no pyarrow traceback), and the location is left as it
    was."""
    from sqlalchemy import text

    views = _exact_views()
    url = f"sqlite:///{tmp_path / 'source.db'}"
    _exact_database(url, EXACT_ROWS[2:])
    engine = create_framework_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE exact_rows SET amount = 123456789012345.5 WHERE custid = 3"))
    finally:
        engine.dispose()
    location = tmp_path / "snapshot"
    message = r"table exact_rows, column amount: the value Decimal\('123456789012345\.50'\) does not fit"
    with pytest.raises(SnapshotError, match=message):
        write_snapshot(views, url, str(location))
    assert not location.exists()
    location.mkdir()
    with pytest.raises(SnapshotError, match=message):
        write_snapshot(views, url, str(location))
    assert location.exists() and list(location.iterdir()) == []
