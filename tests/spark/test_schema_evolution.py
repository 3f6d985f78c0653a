"""A log written by version 1 of five models, the models changed and migrated with alembic, then read
back three ways that must agree (docs/design/sql.md "Schema versions and upcasting"):

- **live, migrated**: a database that followed the log on the version 1 models is migrated with
  alembic (columns added, renamed, dropped; values converted), and an instance on the new models
  applies the rest of the log;
- **live, from the start**: an instance on the new models applies the whole log into a new database,
  old records upcast; its entity cache and ``read_entities`` give the same entities;
- **rebuilt**: ``rebuild`` with Spark from the same log, upcast by the same chains.

One upcaster kind per model: an attribute added with a constant, renamed, dropped, scaled (a unit
change), and split in two by a function (a row-wise upcaster). The log is written once for the
module: changes of version 1, then (by writers on the new models, through an entity batcher)
changes of version 2, most of them members of batches (docs/design/sql.md "Batched change-sets");
the three databases are made on SQLite, PostgreSQL and MariaDB.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Column, DateTime, Engine, Integer, LargeBinary, String, Uuid, inspect, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz import WaltzClient, WaltzClientConfig
from waltz.jdbc_style import (
    AddAttribute,
    ChangeSetCallbacks,
    DropAttribute,
    EntityBatcher,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    RenameAttribute,
    RowChange,
    ScaleAttribute,
    SchemaVersionAheadError,
    WaltzEntity,
    create_framework_engine,
    upcaster,
)
from waltz.jdbc_style.migrations_api import upgrade
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.spark.decoders import DecoderRegistry
from waltz.spark.rebuild import LogSource, rebuild
from waltz.spark.views import AppViews, apply_idempotency, entity_table, replay

pytestmark = pytest.mark.timeout(600)

TIMEOUT = 60
NAME = "evolution"
KINDS = ("add", "rename", "drop", "scale", "split")


# --- version 1 of the models -------------------------------------------------------------------


class V1(DeclarativeBase):
    pass


class AddV1(V1):
    __tablename__ = "evo_add"
    __waltz__ = WaltzEntity("evo_add")
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    n: Mapped[int] = mapped_column(Integer)


class RenameV1(V1):
    __tablename__ = "evo_rename"
    __waltz__ = WaltzEntity("evo_rename")
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(Integer)


class DropV1(V1):
    __tablename__ = "evo_drop"
    __waltz__ = WaltzEntity("evo_drop")
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    keep: Mapped[int] = mapped_column(Integer)
    legacy: Mapped[str] = mapped_column(String(20))


class ScaleV1(V1):
    """``price`` in cents."""

    __tablename__ = "evo_scale"
    __waltz__ = WaltzEntity("evo_scale")
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    price: Mapped[int] = mapped_column(Integer)


class SplitV1(V1):
    __tablename__ = "evo_split"
    __waltz__ = WaltzEntity("evo_split")
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(40))


# --- version 2, with the upcasters from version 1 ---------------------------------------------------


@upcaster(from_version=1, description="split name into first_name and last_name")
def split_name(change: RowChange) -> RowChange:
    values = dict(change.values)
    if "name" in values:
        first, _, last = str(values.pop("name")).partition(" ")
        values["first_name"], values["last_name"] = first, last
    return dataclasses.replace(change, values=values)


class V2(DeclarativeBase):
    pass


class AddV2(V2):
    __tablename__ = "evo_add"
    __waltz__ = WaltzEntity("evo_add", schema_version=2, upcasters=[AddAttribute(1, "label", "none")])
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    n: Mapped[int] = mapped_column(Integer)
    label: Mapped[str] = mapped_column(String(20), server_default="none")


class RenameV2(V2):
    __tablename__ = "evo_rename"
    __waltz__ = WaltzEntity("evo_rename", schema_version=2, upcasters=[RenameAttribute(1, "value", "amount")])
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    amount: Mapped[int] = mapped_column(Integer)


class DropV2(V2):
    __tablename__ = "evo_drop"
    __waltz__ = WaltzEntity("evo_drop", schema_version=2, upcasters=[DropAttribute(1, "legacy")])
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    keep: Mapped[int] = mapped_column(Integer)


class ScaleV2(V2):
    """``price`` in tenths of a cent."""

    __tablename__ = "evo_scale"
    __waltz__ = WaltzEntity("evo_scale", schema_version=2, upcasters=[ScaleAttribute(1, "price", 10)])
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    price: Mapped[int] = mapped_column(Integer)


class SplitV2(V2):
    __tablename__ = "evo_split"
    __waltz__ = WaltzEntity("evo_split", schema_version=2, upcasters=[split_name])
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    first_name: Mapped[str] = mapped_column(String(20))
    last_name: Mapped[str] = mapped_column(String(20))


MODELS_V1: dict[str, type[Any]] = {
    "add": AddV1,
    "rename": RenameV1,
    "drop": DropV1,
    "scale": ScaleV1,
    "split": SplitV1,
}
MODELS_V2: dict[str, type[Any]] = {
    "add": AddV2,
    "rename": RenameV2,
    "drop": DropV2,
    "scale": ScaleV2,
    "split": SplitV2,
}


def migrate(engine: Engine) -> None:
    """The alembic migration from version 1 to 2 (what a revision's ``upgrade()`` would run).

    The rows already in the database are converted as the upcasters convert the log's: the same
    added value, the same unit, the same split.
    """
    with engine.begin() as conn:
        op = Operations(MigrationContext.configure(conn))
        with op.batch_alter_table("evo_add") as batch:
            batch.add_column(Column("label", String(20), nullable=True, server_default="none"))
        with op.batch_alter_table("evo_rename") as batch:
            batch.alter_column(
                "value", new_column_name="amount", existing_type=Integer, existing_nullable=False
            )
        with op.batch_alter_table("evo_drop") as batch:
            batch.drop_column("legacy")
        op.execute(text("UPDATE evo_scale SET price = price * 10"))
        with op.batch_alter_table("evo_split") as batch:
            batch.add_column(Column("first_name", String(20), nullable=True))
            batch.add_column(Column("last_name", String(20), nullable=True))
        for row_id, name in conn.execute(text("SELECT id, name FROM evo_split")).all():
            first, _, last = str(name).partition(" ")
            conn.execute(
                text("UPDATE evo_split SET first_name = :f, last_name = :l WHERE id = :i"),
                {"f": first, "l": last, "i": row_id},
            )
        with op.batch_alter_table("evo_split") as batch:
            batch.drop_column("name")


# --- the writes ------------------------------------------------------------------------------------


class Put(EntityTransactionContext):
    """Insert a row, or update it when it exists."""

    def __init__(self, callbacks: ChangeSetCallbacks, model: type[Any], row_id: int, values: dict[str, Any]):
        super().__init__(callbacks, (model, row_id))
        self.model, self.row_id, self.values = model, row_id, values

    def run(self, tx: EntityTransaction) -> bool:
        entity = tx.get(self.model, self.row_id)
        if entity is None:
            tx.insert(self.model, id=self.row_id, **self.values)
        else:
            tx.update(entity, **self.values)
        return True


class Remove(EntityTransactionContext):
    def __init__(self, callbacks: ChangeSetCallbacks, model: type[Any], row_id: int):
        super().__init__(callbacks, (model, row_id))
        self.model, self.row_id = model, row_id

    def run(self, tx: EntityTransaction) -> bool:
        entity = tx.get(self.model, self.row_id)
        if entity is not None:
            tx.delete(entity)
        return True


def _v1_values(kind: str, i: int) -> dict[str, Any]:
    return {
        "add": {"n": i},
        "rename": {"value": i},
        "drop": {"keep": i, "legacy": f"old{i}"},
        "scale": {"price": 100 * i + 5},
        "split": {"name": f"First{i} Last{i}"},
    }[kind]


def _v2_values(kind: str, i: int) -> dict[str, Any]:
    return {
        "add": {"n": i, "label": f"label{i}"},
        "rename": {"amount": i},
        "drop": {"keep": i},
        "scale": {"price": 1000 * i + 7},
        "split": {"first_name": f"New{i}", "last_name": f"Name{i}"},
    }[kind]


def _v1_as_v2(kind: str, i: int) -> dict[str, Any]:
    """What a version 1 write of :func:`_v1_values` is in version 2 terms (the truth the three
    readings are held to, written out by hand rather than by the upcasters under test)."""
    return {
        "add": {"n": i, "label": "none"},
        "rename": {"amount": i},
        "drop": {"keep": i},
        "scale": {"price": 1000 * i + 50},
        "split": {"first_name": f"First{i}", "last_name": f"Last{i}"},
    }[kind]


#: The writes of version 1: ``(op, id, value seed)``; then those of version 2.
WRITES_V1: Sequence[tuple[str, int, int]] = (
    ("put", 1, 1),
    ("put", 2, 2),
    ("put", 3, 3),
    ("put", 4, 4),
    ("put", 5, 5),
    ("put", 1, 11),
    ("put", 2, 12),
    ("remove", 3, 0),
)
WRITES_V2: Sequence[tuple[str, int, int]] = (("put", 4, 24), ("put", 6, 26), ("remove", 5, 0), ("put", 7, 27))


def expected_rows(kind: str) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for writes, as_v2 in ((WRITES_V1, _v1_as_v2), (WRITES_V2, _v2_values)):
        for op, row_id, seed in writes:
            if op == "remove":
                rows.pop(row_id, None)
            else:
                rows[row_id] = {"id": row_id, **as_v2(kind, seed)}
    return rows


@dataclass
class Instance:
    engine: Engine
    callbacks: ChangeSetCallbacks
    client: WaltzClient

    def close(self) -> None:
        self.client.close()
        self.engine.dispose()


def start(cluster: LocalCluster, url: str, models: dict[str, type[Any]]) -> Instance:
    engine = create_framework_engine(url)
    callbacks = ChangeSetCallbacks(engine, cluster_name=NAME, registry=EntityRegistry(models.values()))
    client = WaltzClient(
        callbacks,
        WaltzClientConfig(**cluster.client_settings()),
    )
    client.wait_mounted(TIMEOUT)
    return Instance(engine, callbacks, client)


def write(
    instance: Instance,
    models: dict[str, type[Any]],
    writes: Sequence[tuple[str, int, int]],
    v2: bool,
    batcher: EntityBatcher | None = None,
) -> None:
    """Each write for every kind, one log transaction each; with ``batcher``, a write's contexts
    (one per kind, all of the row's partition) submitted together, so that all but the first go
    as one batch."""
    for op, row_id, seed in writes:
        futures = []
        for kind, model in models.items():
            context: EntityTransactionContext
            if op == "remove":
                context = Remove(instance.callbacks, model, row_id)
            else:
                values = _v2_values(kind, seed) if v2 else _v1_values(kind, seed)
                context = Put(instance.callbacks, model, row_id, values)
            if batcher is None:
                assert instance.client.submit(context).result(TIMEOUT).committed
            else:
                futures.append(batcher.submit(context))
        assert all(future.result(TIMEOUT).committed for future in futures)


def prepared(url: str, base: type[DeclarativeBase]) -> str:
    engine = create_framework_engine(url)
    try:
        upgrade(engine)
        base.metadata.create_all(engine)
    finally:
        engine.dispose()
    return url


def wait_applied(instance: Instance, marks: dict[int, int]) -> None:
    for pid, mark in marks.items():
        assert mark < 0 or instance.callbacks.wait_for(pid, mark, TIMEOUT), (
            f"partition {pid} not applied to {mark}"
        )


@dataclass(frozen=True)
class Log:
    cluster: LocalCluster
    v1_marks: dict[int, int]
    marks: dict[int, int]


@pytest.fixture(scope="module")
def evolution_log(spark_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Log:
    """The module's log: the writes of version 1, then of version 2 (by writers on the new models)."""
    work = tmp_path_factory.mktemp("evolution-writers")
    writer = start(spark_cluster, prepared(f"sqlite:///{work / 'v1.db'}", V1), MODELS_V1)
    try:
        write(writer, MODELS_V1, WRITES_V1, v2=False)
        writer.client.flush(TIMEOUT)
        v1_marks = {p: writer.client.get_high_water_mark(p) for p in range(writer.client.num_partitions)}
        wait_applied(writer, v1_marks)
    finally:
        writer.close()
    migrate_url = f"sqlite:///{work / 'v1.db'}"  # the writer's database, migrated like any other
    migrate(create_framework_engine(migrate_url))
    writer = start(spark_cluster, migrate_url, MODELS_V2)
    try:
        # Nothing goes beside a log transaction in flight, nothing lingers: a write's contexts
        # after the first wait for it, and go as one batch.
        with EntityBatcher(writer.client, max_in_flight_alone=0, linger=0) as batcher:
            write(writer, MODELS_V2, WRITES_V2, v2=True, batcher=batcher)
        assert batcher.batches > 0 and batcher.batched > batcher.batches, "no batch of version 2 was written"
        writer.client.flush(TIMEOUT)
        marks = {p: writer.client.get_high_water_mark(p) for p in range(writer.client.num_partitions)}
        wait_applied(writer, marks)
    finally:
        writer.close()
    assert marks != v1_marks
    return Log(spark_cluster, v1_marks, marks)


def _database(
    request: pytest.FixtureRequest, backend: str, stack: contextlib.ExitStack, tmp: Path, name: str
) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp / f'{name}.db'}"
    server = request.getfixturevalue({"postgresql": "postgres_server", "mariadb": "mariadb_server"}[backend])
    return stack.enter_context(server.fresh_database())


def _build(changes: Any, log: Any) -> dict[str, Any]:
    registry = EntityRegistry(MODELS_V2.values())
    rows = replay(apply_idempotency(changes))
    return {model.__tablename__: entity_table(rows, registry, model) for model in MODELS_V2.values()}


def _prepare_v2(engine: Engine) -> None:
    upgrade(engine)
    V2.metadata.create_all(engine)


VIEWS_V2 = AppViews(
    cluster_name=NAME,
    tables=[model.__table__ for model in MODELS_V2.values()],  # type: ignore[attr-defined]
    prepare=_prepare_v2,
    build=_build,
    decoders=DecoderRegistry(),
    entities=EntityRegistry(MODELS_V2.values()),
)


@dataclass
class Readings:
    """The three databases of one backend, and what ``read_entities`` gave per kind."""

    migrated: str
    fresh: str
    rebuilt: str
    read: dict[str, dict[int, dict[str, Any]]]
    read_from_cache: int
    paused: str


def _table(url: str, model: type[Any]) -> dict[int, dict[str, Any]]:
    engine = create_framework_engine(url)
    try:
        with engine.connect() as conn:
            columns = [c.name for c in model.__table__.columns]
            return {
                int(row.id): {c: getattr(row, c) for c in columns}
                for row in conn.execute(select(*model.__table__.columns))
            }
    finally:
        engine.dispose()


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mariadb"])
def readings(
    request: pytest.FixtureRequest, evolution_log: Log, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Readings]:
    backend: str = request.param
    tmp = tmp_path_factory.mktemp(f"evolution-{backend}")
    cluster = evolution_log.cluster
    with contextlib.ExitStack() as stack:
        migrated = prepared(_database(request, backend, stack, tmp, "migrated"), V1)
        fresh = prepared(_database(request, backend, stack, tmp, "fresh"), V2)
        rebuilt = _database(request, backend, stack, tmp, "rebuilt")

        # Live on version 1 until the first record of version 2: the partition waits there.
        old = start(cluster, migrated, MODELS_V1)
        try:
            wait_applied(old, evolution_log.v1_marks)
            ahead = [p for p, m in evolution_log.marks.items() if m > evolution_log.v1_marks[p]]
            wait_until(
                lambda: set(ahead) <= set(old.client.unhealthy_partitions()),
                timeout=TIMEOUT,
                what=f"the version 1 instance to wait on partitions {ahead}",
            )
            reasons = old.client.unhealthy_partitions()
            paused = str(reasons[ahead[0]])
            assert all(isinstance(reasons[p], SchemaVersionAheadError) for p in ahead), reasons
            assert old.callbacks.high_water_marks() == evolution_log.v1_marks, (
                "a record was applied or skipped"
            )
        finally:
            old.close()

        # Migrated with alembic, then on version 2.
        migrate(create_framework_engine(migrated))
        read: dict[str, dict[int, dict[str, Any]]] = {kind: {} for kind in KINDS}
        from_cache = 0
        for url in (migrated, fresh):
            instance = start(cluster, url, MODELS_V2)
            try:
                wait_applied(instance, evolution_log.marks)
                assert instance.callbacks.uncaught_count == 0, list(instance.callbacks.uncaught)
                if url != fresh:
                    continue
                for kind, model in MODELS_V2.items():
                    columns = [c.name for c in model.__table__.columns]
                    for row_id in range(1, 8):
                        got = instance.callbacks.read_entities(
                            [(model, row_id)], num_partitions=instance.client.num_partitions
                        )
                        from_cache += got.from_cache
                        if got.entities[0] is not None:
                            read[kind][row_id] = {c: getattr(got.entities[0], c) for c in columns}
            finally:
                instance.close()

        rebuild(
            spark,
            VIEWS_V2,
            LogSource.live(cluster.admin_settings()),
            rebuilt,
        )
        yield Readings(migrated, fresh, rebuilt, read, from_cache, paused)


@pytest.mark.parametrize("kind", KINDS)
def test_old_records_upcast_alike_in_the_live_apply_the_entity_reads_and_the_rebuild(
    readings: Readings, kind: str
) -> None:
    model = MODELS_V2[kind]
    expected = expected_rows(kind)
    assert _table(readings.fresh, model) == expected, "the live apply from the start"
    assert readings.read[kind] == expected, "read_entities (the entity cache, else the database)"
    assert readings.read_from_cache > 0, "the entity cache answered no read"
    assert _table(readings.migrated, model) == expected, "the database migrated with alembic"
    assert _table(readings.rebuilt, model) == expected, "the Spark rebuild"


def test_an_instance_on_the_old_models_waits_and_says_why(readings: Readings) -> None:
    assert "schema version 2, but this instance's model" in readings.paused
    assert "waits until this instance runs the newer model" in readings.paused


def test_a_rebuild_into_a_database_not_migrated_is_refused_before_it_reads(
    evolution_log: Log, spark: Any, tmp_path: Path
) -> None:
    from sqlalchemy import inspect as inspect_database

    from waltz.spark.errors import RebuildError

    url = prepared(f"sqlite:///{tmp_path / 'old.db'}", V1)
    source = LogSource.live(evolution_log.cluster.admin_settings())
    with pytest.raises(RebuildError, match=r"table evo_add lacks the columns \['label'\].*migrate it first"):
        rebuild(spark, VIEWS_V2, source, url)
    engine = create_framework_engine(url)
    try:
        assert not [t for t in inspect_database(engine).get_table_names() if t.endswith("__rebuild")]
    finally:
        engine.dispose()


def test_a_rebuild_with_older_models_into_a_database_of_the_newer_release_names_both_ways_out(
    tmp_path: Path,
) -> None:
    """The release before the change, rebuilding into a database its successor migrated: the
    refusal names the columns on both sides and says to rebuild with the newer release's code, not
    only to migrate (there is nothing to migrate to)."""
    from waltz.spark.errors import RebuildError
    from waltz.spark.target import check_target

    url = prepared(f"sqlite:///{tmp_path / 'newer.db'}", V2)
    with pytest.raises(RebuildError) as refused:
        check_target(VIEWS_V1, url)
    said = str(refused.value)
    assert (
        "table evo_rename lacks the columns ['value'] and has ['amount'], which the model does not map"
        in said
    )
    assert "if it is at a newer release than these models, rebuild with that release's code" in said, said


class Failing(DeclarativeBase):
    pass


class ScaleFailing(Failing):
    """A unit change whose factor the old prices do not take exactly: its upcaster raises."""

    __tablename__ = "evo_scale"
    __waltz__ = WaltzEntity(
        "evo_scale", schema_version=2, upcasters=[ScaleAttribute(1, "price", Fraction(1, 10))]
    )
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    price: Mapped[int] = mapped_column(Integer)


def _build_failing(changes: Any, log: Any) -> dict[str, Any]:
    rows = replay(apply_idempotency(changes))
    return {"evo_scale": entity_table(rows, EntityRegistry([ScaleFailing]), ScaleFailing)}


def _prepare_failing(engine: Engine) -> None:
    upgrade(engine)
    Failing.metadata.create_all(engine)


def test_a_rebuild_with_the_models_before_the_change_names_the_newer_release_that_wrote_the_log(
    evolution_log: Log, spark: Any, tmp_path: Path
) -> None:
    """``waltz rebuild`` run with the code of the release before the models changed: the job's
    failure is read as the newer release's record (run the rebuild with that release's code),
    naming where it is, not as a transaction another cluster wrote (docs/design/sql.md "Schema
    versions and upcasting")."""
    from waltz.cli.rebuild import spark_job_failure

    url = prepared(f"sqlite:///{tmp_path / 'old-code.db'}", V1)
    with pytest.raises(Exception) as failed:
        rebuild(spark, VIEWS_V1, LogSource.live(evolution_log.cluster.admin_settings()), url)
    said = "\n".join(spark_job_failure(str(failed.value), "evolution_v1"))
    assert re.search(
        r"^error: the log holds a evo_\w+ row change of schema version 2 \(partition \d+ transaction \d+\), "
        r"newer than the models here \(version 1\): a newer release of the application wrote it; run the "
        r"rebuild with that release's code$",
        said,
    ), said
    assert _table(url, AddV1) == {}, "the rebuild wrote rows"


def test_a_rebuild_whose_upcaster_raises_names_the_upcaster_to_fix(
    evolution_log: Log, spark: Any, tmp_path: Path
) -> None:
    """An upcaster that fails on a record of the log fails the rebuild naming the record, the
    upcaster and what to do, with nothing written; not as a transaction another cluster wrote."""
    from waltz.cli.rebuild import spark_job_failure

    views = AppViews(
        cluster_name=NAME,
        tables=[ScaleFailing.__table__],
        prepare=_prepare_failing,
        build=_build_failing,
        decoders=DecoderRegistry(),
        entities=EntityRegistry([ScaleFailing]),
    )
    url = prepared(f"sqlite:///{tmp_path / 'failing.db'}", Failing)
    with pytest.raises(Exception) as failed:
        rebuild(spark, views, LogSource.live(evolution_log.cluster.admin_settings()), url)
    said = spark_job_failure(str(failed.value), "evolution")
    assert len(said) == 2, said
    assert re.search(
        r"^error: an upcaster of evolution's models failed on a record of the log: partition \d+ "
        r"transaction \d+: evo_scale \{'id': \d+\}: scale price by 1/10 of \d+ is \d+/\d+, which an integer "
        r"cannot hold",
        said[0],
    ), said
    assert "fix the upcaster" in said[1] and "--root" not in said[1], said
    assert _table(url, ScaleFailing) == {}, "the rebuild wrote rows"


# --- a snapshot of the version 1 models, read by version 2 ------------------------------------------


def _prepare_v1(engine: Engine) -> None:
    upgrade(engine)
    V1.metadata.create_all(engine)


VIEWS_V1 = dataclasses.replace(
    VIEWS_V2,
    tables=[model.__table__ for model in MODELS_V1.values()],  # type: ignore[attr-defined]
    prepare=_prepare_v1,
    entities=EntityRegistry(MODELS_V1.values()),
)


@dataclass(frozen=True)
class OlderSnapshots:
    """A snapshot of a database on the version 1 models at the log's version 1 marks: as written
    (its manifest naming each entity's attributes and key), and as a manifest written before it
    named them (the same files)."""

    written: Path
    unnamed: Path


@pytest.fixture(scope="module")
def older_snapshots(evolution_log: Log, tmp_path_factory: pytest.TempPathFactory) -> OlderSnapshots:
    from waltz.spark.snapshot import MANIFEST_NAME, write_snapshot

    work = tmp_path_factory.mktemp("evolution-snapshot")
    url = prepared(f"sqlite:///{work / 'v1.db'}", V1)
    old = start(evolution_log.cluster, url, MODELS_V1)
    try:
        wait_applied(old, evolution_log.v1_marks)
        written = work / "written"
        manifest = write_snapshot(VIEWS_V1, old.engine, str(written))
    finally:
        old.close()
    assert manifest.marks == evolution_log.v1_marks
    assert {name: dict(e)["schema_version"] for name, e in manifest.entities.items()} == dict.fromkeys(
        (m.__waltz__.lock_name for m in MODELS_V1.values()), 1
    )
    unnamed = work / "unnamed"
    shutil.copytree(written, unnamed)
    raw = json.loads((unnamed / MANIFEST_NAME).read_text())
    for entity in raw["entities"].values():
        del entity["attributes"], entity["key"]
    (unnamed / MANIFEST_NAME).write_text(json.dumps(raw))
    return OlderSnapshots(written, unnamed)


@pytest.mark.parametrize("form", ["written", "unnamed"])
def test_a_snapshot_of_the_older_models_is_upcast_by_the_rebuild(
    evolution_log: Log, older_snapshots: OlderSnapshots, spark: Any, tmp_path: Path, form: str
) -> None:
    url = f"sqlite:///{tmp_path / 'from-snapshot.db'}"
    lines: list[str] = []
    rebuild(
        spark,
        VIEWS_V2,
        LogSource.live(evolution_log.cluster.admin_settings()),
        url,
        snapshot=str(getattr(older_snapshots, form)),
        progress=lines.append,
    )
    assert any("evo_add, upcast from schema version 1" in line for line in lines), lines
    for kind, model in MODELS_V2.items():
        assert _table(url, model) == expected_rows(kind), kind


@pytest.mark.parametrize("form", ["written", "unnamed"])
def test_a_snapshot_of_the_older_models_loads_upcast_and_the_log_goes_on_from_it(
    evolution_log: Log, older_snapshots: OlderSnapshots, tmp_path: Path, form: str
) -> None:
    from waltz.spark.snapshot import check_snapshot, load_snapshot

    checked = check_snapshot(str(getattr(older_snapshots, form)), VIEWS_V2)
    assert "evo_scale: 4 rows, upcast from schema version 1" in checked, checked
    url = f"sqlite:///{tmp_path / 'loaded.db'}"
    lines: list[str] = []
    load_snapshot(str(getattr(older_snapshots, form)), VIEWS_V2, url, progress=lines.append)
    assert "evo_scale: 4 rows, upcast from schema version 1" in lines, lines
    # The rows as of the version 1 marks, in version 2 terms.
    as_of_v1: dict[str, dict[int, dict[str, Any]]] = {kind: {} for kind in KINDS}
    for kind in KINDS:
        for op, row_id, seed in WRITES_V1:
            if op == "remove":
                as_of_v1[kind].pop(row_id, None)
            else:
                as_of_v1[kind][row_id] = {"id": row_id, **_v1_as_v2(kind, seed)}
        assert _table(url, MODELS_V2[kind]) == as_of_v1[kind], kind
    instance = start(evolution_log.cluster, url, MODELS_V2)
    try:
        wait_applied(instance, evolution_log.marks)
        assert instance.callbacks.uncaught_count == 0, list(instance.callbacks.uncaught)
    finally:
        instance.close()
    for kind, model in MODELS_V2.items():
        assert _table(url, model) == expected_rows(kind), kind


def test_a_snapshot_whose_rows_the_upcasters_cannot_make_the_model_s_is_refused_naming_the_file(
    evolution_log: Log, older_snapshots: OlderSnapshots, spark: Any, tmp_path: Path
) -> None:
    """The manifest names an attribute the model never had in place of one it has: the upcast
    rows lack the model's attribute, and the load and the rebuild are refused before anything is
    written (the rebuild before a Spark job)."""
    from waltz.spark.errors import RebuildError
    from waltz.spark.snapshot import MANIFEST_NAME, SnapshotError, load_snapshot

    location = tmp_path / "renamed"
    shutil.copytree(older_snapshots.written, location)
    raw = json.loads((location / MANIFEST_NAME).read_text())
    raw["entities"]["evo_scale"]["attributes"] = {"id": "id", "cost": "price"}
    (location / MANIFEST_NAME).write_text(json.dumps(raw))
    from waltz.spark.snapshot import check_snapshot

    url = f"sqlite:///{tmp_path / 'refused.db'}"
    refusal = r"evo_scale\.parquet: .*lacks the model's attributes \['price'\]"
    with pytest.raises(SnapshotError, match=refusal):
        check_snapshot(str(location), VIEWS_V2)
    with pytest.raises(SnapshotError, match=refusal):
        load_snapshot(str(location), VIEWS_V2, url)
    assert all(not _table(url, model) for model in MODELS_V2.values())
    rebuilt = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    source = LogSource.live(evolution_log.cluster.admin_settings())
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(RebuildError, match=r"evo_scale\.parquet: .*lacks the model's attributes \['price'\]"):
        rebuild(spark, VIEWS_V2, source, rebuilt, snapshot=str(location))
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs, "a Spark job ran"
    engine = create_framework_engine(rebuilt)
    try:
        assert inspect(engine).get_table_names() == [], "the refused rebuild made tables"
    finally:
        engine.dispose()


def test_a_snapshot_of_a_newer_model_is_refused_by_the_load(
    older_snapshots: OlderSnapshots, tmp_path: Path
) -> None:
    from waltz.spark.snapshot import MANIFEST_NAME, SnapshotError, load_snapshot

    location = tmp_path / "newer"
    shutil.copytree(older_snapshots.written, location)
    raw = json.loads((location / MANIFEST_NAME).read_text())
    raw["entities"]["evo_add"]["schema_version"] = 3
    (location / MANIFEST_NAME).write_text(json.dumps(raw))
    refusal = r"evo_add is at schema version 3 in the snapshot, newer than the application's model \(2\)"
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    with pytest.raises(SnapshotError, match=refusal):
        load_snapshot(str(location), VIEWS_V2, url)


class Rolling(DeclarativeBase):
    pass


class RenameOnItsOldColumn(Rolling):
    """Version 2 of ``evo_rename`` as the release between the two migrations has it: ``amount``
    kept on the column ``value`` (docs/sql.md "Changing a model")."""

    __tablename__ = "evo_rename_rolling"
    __waltz__ = WaltzEntity("evo_rename", schema_version=2, upcasters=[RenameAttribute(1, "value", "amount")])
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    amount: Mapped[int] = mapped_column("value", Integer)


def _applied_through(conn: Any, mark: int) -> None:
    """The log's mark row of partition 0 at ``mark``: rows written by hand are, for a snapshot,
    the log's transactions up to it (a snapshot of rows without marks is refused)."""
    from sqlalchemy import insert

    from waltz.jdbc_style.schema import high_water_marks

    conn.execute(
        insert(high_water_marks).values(
            cluster_name=NAME, partition_id=0, high_water_mark=mark, updated_at=dt.datetime.now(dt.UTC)
        )
    )


def test_a_snapshot_of_an_attribute_on_its_old_column_loads_onto_the_new_column(tmp_path: Path) -> None:
    """Same schema version, another column: the manifest's attribute names carry the rows over."""
    from sqlalchemy import insert

    from waltz.spark.snapshot import load_snapshot, write_snapshot

    rolling_table = RenameOnItsOldColumn.__table__  # type: ignore[attr-defined]
    views = dataclasses.replace(
        VIEWS_V2, tables=[rolling_table], entities=EntityRegistry([RenameOnItsOldColumn])
    )
    source = create_framework_engine(f"sqlite:///{tmp_path / 'rolling.db'}")
    try:
        upgrade(source)
        rolling_table.create(source)
        with source.begin() as conn:
            conn.execute(insert(rolling_table), [{"id": i, "value": 10 * i} for i in (1, 2, 3)])
            _applied_through(conn, 0)
        write_snapshot(views, source, str(tmp_path / "snapshot"))
    finally:
        source.dispose()
    # The same file under the new table's name, as a snapshot of the release before the rename's
    # migration would be loaded by the release after it.
    raw = json.loads((tmp_path / "snapshot" / "manifest.json").read_text())
    raw["entities"]["evo_rename"]["table"] = "evo_rename"
    raw["tables"][0]["table"] = "evo_rename"
    (tmp_path / "snapshot" / "manifest.json").write_text(json.dumps(raw))
    assert raw["entities"]["evo_rename"]["attributes"] == {"id": "id", "amount": "value"}

    rename_only = dataclasses.replace(
        VIEWS_V2, tables=[RenameV2.__table__], entities=EntityRegistry([RenameV2])
    )  # type: ignore[attr-defined]
    url = f"sqlite:///{tmp_path / 'loaded.db'}"
    load_snapshot(str(tmp_path / "snapshot"), rename_only, url)
    assert _table(url, RenameV2) == {i: {"id": i, "amount": 10 * i} for i in (1, 2, 3)}


class Moved(DeclarativeBase):
    pass


class AddMoved(Moved):
    """``evo_add`` at version 2 on a table of another name."""

    __tablename__ = "evo_add_moved"
    __waltz__ = WaltzEntity("evo_add", schema_version=2, upcasters=[AddAttribute(1, "label", "none")])
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    n: Mapped[int] = mapped_column(Integer)
    label: Mapped[str] = mapped_column(String(20), server_default="none")


def test_a_snapshot_of_an_entity_since_moved_to_another_table_is_read_from_the_table_it_recorded(
    older_snapshots: OlderSnapshots, spark: Any, tmp_path: Path
) -> None:
    """The manifest says which table held the entity's rows: the load and the rebuild read that
    file, not one named after the model's table now (which the snapshot does not have)."""
    from waltz.spark.decoders import CHANGES_SCHEMA
    from waltz.spark.snapshot import load_snapshot, read_manifest, snapshot_entity_rows

    def _prepare_moved(engine: Engine) -> None:
        upgrade(engine)
        Moved.metadata.create_all(engine)

    views = dataclasses.replace(
        VIEWS_V2,
        tables=[AddMoved.__table__],  # type: ignore[attr-defined]
        prepare=_prepare_moved,
        entities=EntityRegistry([AddMoved]),
    )
    as_of_v1: dict[int, dict[str, Any]] = {}
    for op, row_id, seed in WRITES_V1:
        if op == "remove":
            as_of_v1.pop(row_id, None)
        else:
            as_of_v1[row_id] = {"id": row_id, **_v1_as_v2("add", seed)}
    url = f"sqlite:///{tmp_path / 'moved.db'}"
    load_snapshot(str(older_snapshots.written), views, url)
    assert _table(url, AddMoved) == as_of_v1

    location = str(older_snapshots.written)
    empty = spark.createDataFrame([], CHANGES_SCHEMA)
    replayed = snapshot_entity_rows(spark, location, read_manifest(location), views, empty).changes.collect()
    assert {int(r["key_values"]["id"]): dict(r["values"]) for r in replayed} == {
        i: {k: str(v) for k, v in row.items()} for i, row in as_of_v1.items()
    }


class TypedV1(Moved):
    __tablename__ = "evo_typed"
    __waltz__ = WaltzEntity("evo_typed")
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    token: Mapped[uuid.UUID] = mapped_column(Uuid)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    blob: Mapped[bytes] = mapped_column(LargeBinary)


@upcaster(from_version=1, description="day and token text from the typed values")
def typed_values(change: RowChange) -> RowChange:
    """Fails unless it gets the values as the log's changes carry them."""
    values = dict(change.values)
    token, at, blob = values.pop("token"), values.pop("at"), values.pop("blob")
    if not isinstance(token, uuid.UUID) or not isinstance(blob, bytes) or at.tzinfo is None:
        raise TypeError(f"not as the log gives them: {token!r}, {at!r}, {blob!r}")
    values["token_hex"] = token.hex
    values["day"] = at.astimezone(dt.UTC).date().isoformat()
    values["size"] = len(blob)
    return dataclasses.replace(change, values=values)


class Typed(DeclarativeBase):
    pass


class TypedV2(Typed):
    __tablename__ = "evo_typed"
    __waltz__ = WaltzEntity("evo_typed", schema_version=2, upcasters=[typed_values])
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    token_hex: Mapped[str] = mapped_column(String(32))
    day: Mapped[str] = mapped_column(String(10))
    size: Mapped[int] = mapped_column(Integer)


def _typed_v1_snapshot(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    """A snapshot of ``evo_typed`` rows at schema version 1 (:class:`TypedV1`), read from SQLite:
    its location."""
    from sqlalchemy import insert

    from waltz.spark.snapshot import write_snapshot

    old_views = dataclasses.replace(
        VIEWS_V2,
        tables=[TypedV1.__table__],  # type: ignore[attr-defined]
        entities=EntityRegistry([TypedV1]),
    )
    source = create_framework_engine(f"sqlite:///{tmp_path / 'typed.db'}")
    location = tmp_path / "snapshot"
    try:
        upgrade(source)
        TypedV1.__table__.create(source)  # type: ignore[attr-defined]
        with source.begin() as conn:
            conn.execute(insert(TypedV1.__table__), rows)  # type: ignore[attr-defined]
            _applied_through(conn, 0)
        write_snapshot(old_views, source, str(location))
    finally:
        source.dispose()
    return location


def _loaded_and_replayed(
    spark: Any, location: Path, model: Any, tmp_path: Path
) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """The ``evo_typed`` snapshot at ``location`` read by ``model`` (its upcasters) both ways: the
    rows the load writes, and the row changes the rebuild replays (id -> values)."""
    from waltz.spark.snapshot import (
        load_snapshot,
        read_manifest,
        read_snapshot_file,
        rows_as_changes,
        stored_rows,
    )

    def _prepare(engine: Engine) -> None:
        upgrade(engine)
        model.metadata.create_all(engine)

    views = dataclasses.replace(
        VIEWS_V2, tables=[model.__table__], prepare=_prepare, entities=EntityRegistry([model])
    )
    url = f"sqlite:///{tmp_path / 'loaded.db'}"
    load_snapshot(str(location), views, url)
    (info,) = list(views.entities or ())
    upcast = stored_rows(read_manifest(str(location)), info)
    assert upcast is not None
    rows = read_snapshot_file(spark, str(location), "evo_typed.parquet")
    replayed = rows_as_changes(rows, info, upcast=upcast, where="evo_typed.parquet").collect()
    return _table(url, model), {int(r["key_values"]["id"]): dict(r["values"]) for r in replayed}


def test_the_upcasters_get_a_snapshot_s_values_as_the_log_gives_them_in_the_load_and_the_rebuild(
    spark: Any, tmp_path: Path
) -> None:
    """A UUID, a timestamp with a time zone and bytes: the load (pyarrow) and the rebuild (Spark
    rows) hand them to the upcasters alike, as ``uuid.UUID``, an aware datetime and ``bytes``."""
    from waltz.spark.decoders import render_value

    tokens = {i: uuid.uuid4() for i in (1, 2)}
    stamps = {
        1: dt.datetime(2026, 3, 1, 23, 30, tzinfo=dt.UTC),
        2: dt.datetime(2026, 3, 2, 0, 30, tzinfo=dt.UTC),
    }
    location = _typed_v1_snapshot(
        tmp_path, [{"id": i, "token": tokens[i], "at": stamps[i], "blob": b"x" * i} for i in (1, 2)]
    )
    expected = {
        i: {"id": i, "token_hex": tokens[i].hex, "day": stamps[i].date().isoformat(), "size": i}
        for i in (1, 2)
    }
    loaded, replayed = _loaded_and_replayed(spark, location, TypedV2, tmp_path)
    assert loaded == expected
    assert replayed == {i: {k: render_value(v) for k, v in row.items()} for i, row in expected.items()}


@upcaster(from_version=1, description="the token's hex, and whether it came as a UUID or as text")
def token_as_given(change: RowChange) -> RowChange:
    values = dict(change.values)
    token = values.pop("token")
    del values["at"], values["blob"]
    values["given"] = "uuid" if isinstance(token, uuid.UUID) else type(token).__name__
    values["token_hex"] = token.hex if isinstance(token, uuid.UUID) else str(token).replace("-", "")
    return dataclasses.replace(change, values=values)


class TokenAsGiven(DeclarativeBase):
    pass


class TokenV2(TokenAsGiven):
    __tablename__ = "evo_typed"
    __waltz__ = WaltzEntity("evo_typed", schema_version=2, upcasters=[token_as_given])
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    token_hex: Mapped[str] = mapped_column(String(32))
    given: Mapped[str] = mapped_column(String(10))


@pytest.mark.parametrize(("recorded", "given"), [("UUID", "uuid"), ("CHAR(32)", "str")])
def test_a_snapshot_that_recorded_a_uuid_column_as_char_32_gives_the_upcasters_its_text(
    spark: Any, tmp_path: Path, recorded: str, given: str
) -> None:
    """The manifest's older form of a UUID column on a database without a UUID type: ``CHAR(32)``,
    as snapshots gave it before the manifest said ``UUID``. Such a snapshot stays readable: the
    load and the rebuild hand the upcasters the column's text, where the current form gives a
    ``uuid.UUID`` (docs/design/spark.md, "Snapshots")."""
    from waltz.spark.snapshot import MANIFEST_NAME

    tokens = {i: uuid.uuid4() for i in (1, 2)}
    at = dt.datetime(2026, 3, 1, 23, 30, tzinfo=dt.UTC)
    location = _typed_v1_snapshot(
        tmp_path, [{"id": i, "token": tokens[i], "at": at, "blob": b"x"} for i in (1, 2)]
    )
    document = json.loads((location / MANIFEST_NAME).read_text())
    (entry,) = [t for t in document["tables"] if t["table"] == "evo_typed"]
    assert ["token", "UUID"] in entry["columns"], entry["columns"]  # the current form
    entry["columns"] = [[name, recorded if name == "token" else kind] for name, kind in entry["columns"]]
    (location / MANIFEST_NAME).write_text(json.dumps(document))

    expected = {i: {"id": i, "token_hex": tokens[i].hex, "given": given} for i in (1, 2)}
    loaded, replayed = _loaded_and_replayed(spark, location, TokenV2, tmp_path)
    assert loaded == expected
    assert replayed == {i: {k: str(v) for k, v in row.items()} for i, row in expected.items()}


def test_a_spark_timestamp_is_taken_as_the_local_time_it_is_given_in() -> None:
    """A Python UDF gets a ``timestamp`` as a naive datetime in the process's local time: the
    upcasters get the instant it stands for, in UTC, whatever the machine's zone (here New York)."""
    import subprocess
    import sys

    code = (
        "import datetime as dt, time; time.tzset(); "
        "from waltz.spark.snapshot import spark_timestamp_as_utc as f; "
        "print(f(dt.datetime(2026, 3, 1, 18, 30)).isoformat(), f(None), f(7))"
    )
    env = {**os.environ, "TZ": "America/New_York"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2026-03-01T23:30:00+00:00", "None", "7"]


def _renamed_snapshot(tmp_path: Path, entities: list[type[Any]]) -> AppViews:
    """A snapshot in ``tmp_path / "snapshot"`` of ``RenameV2``'s table (rows 1 and 2) with
    ``entities`` declared; its views."""
    from sqlalchemy import insert

    from waltz.spark.snapshot import write_snapshot

    table = RenameV2.__table__  # type: ignore[attr-defined]
    views = dataclasses.replace(VIEWS_V2, tables=[table], entities=EntityRegistry(entities))
    source = create_framework_engine(f"sqlite:///{tmp_path / 'source.db'}")
    try:
        upgrade(source)
        table.create(source)
        with source.begin() as conn:
            conn.execute(insert(table), [{"id": i, "amount": i} for i in (1, 2)])
            _applied_through(conn, 0)
        write_snapshot(views, source, str(tmp_path / "snapshot"))
    finally:
        source.dispose()
    return views


def test_an_entity_recorded_on_a_table_without_a_file_has_no_rows_whatever_its_model_s_table(
    tmp_path: Path,
) -> None:
    """The manifest says which table held an entity's rows: when the snapshot has no file of that
    table, the entity has no rows in it, even where a file is named after the model's table now
    (rows of that table, not of the entity): ``waltz snapshot load`` and ``check`` give its table
    none, as a rebuild does; a ``table`` that is not a string is refused."""

    from waltz.spark.snapshot import (
        MANIFEST_NAME,
        SnapshotError,
        check_snapshot,
        entity_file,
        load_snapshot,
        read_manifest,
        stored_rows,
    )

    views = _renamed_snapshot(tmp_path, [RenameV2])
    location = tmp_path / "snapshot"
    raw = json.loads((location / MANIFEST_NAME).read_text())
    (info,) = list(views.entities or ())
    assert entity_file(read_manifest(str(location)), info) is not None  # as written
    raw["entities"]["evo_rename"]["table"] = "evo_rename_before"
    (location / MANIFEST_NAME).write_text(json.dumps(raw))
    manifest = read_manifest(str(location))
    assert manifest.table("evo_rename") is not None
    assert entity_file(manifest, info) is None
    assert stored_rows(manifest, info) is None
    no_rows = "evo_rename: 0 rows, the snapshot holds no rows of its entity"
    (checked,) = check_snapshot(str(location), views)
    assert checked.startswith(no_rows), checked
    url = f"sqlite:///{tmp_path / 'loaded.db'}"
    lines: list[str] = []
    load_snapshot(str(location), views, url, progress=lines.append)
    assert _table(url, RenameV2) == {}
    assert lines[0].startswith(no_rows), lines
    for malformed in (5, None, ["evo_rename"]):
        raw["entities"]["evo_rename"]["table"] = malformed
        (location / MANIFEST_NAME).write_text(json.dumps(raw))
        with pytest.raises(
            SnapshotError, match=rf"entity 'evo_rename': field 'table' is {re.escape(repr(malformed))}"
        ):
            read_manifest(str(location))


def test_an_entity_whose_table_the_snapshot_does_not_hold_has_no_rows_in_it(tmp_path: Path) -> None:
    """The application declares an entity whose table is not among its views' tables: the
    manifest records it, no file holds it, and the snapshot still loads and checks."""

    from waltz.spark.snapshot import check_snapshot, load_snapshot, read_manifest

    views = _renamed_snapshot(tmp_path, [RenameV2, AddV2])
    manifest = read_manifest(str(tmp_path / "snapshot"))
    assert manifest.entities["evo_add"]["table"] == "evo_add" and manifest.table("evo_add") is None
    assert check_snapshot(str(tmp_path / "snapshot"), views) == [
        "evo_rename: 2 rows, the application's columns"
    ]
    url = f"sqlite:///{tmp_path / 'loaded.db'}"
    load_snapshot(str(tmp_path / "snapshot"), views, url)
    assert _table(url, RenameV2) == {i: {"id": i, "amount": i} for i in (1, 2)}
