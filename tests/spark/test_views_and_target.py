"""The rebuild's views and its writes to a database, on a synthetic log (no cluster needed).

The log is a DataFrame of the data source's schema holding change-sets of the counter example, two
of them carrying the same idempotency key; the target databases already hold another log's marks
and keys, which a rebuild must leave as they are. Logs of every change-set form, and one with the
records of a partition split among them, are rebuilt as the live apply applies them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import uuid
from typing import Any

import pytest
from sqlalchemy import BigInteger, Engine, Table, Uuid, insert, inspect, select, text, update
from sqlalchemy import types as sa_types
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.client.transaction import Transaction
from waltz.jdbc_style import EntityRegistry, WaltzEntity, create_framework_engine
from waltz.jdbc_style import migrations_api as framework_migrations
from waltz.jdbc_style.changeset import (
    CHANGE_SET_HEADER,
    ChangeSet,
    ChangeSetBatch,
    ChangeSetFormatError,
    Operation,
    RowChange,
)
from waltz.jdbc_style.changeset_callbacks import row_change_problem
from waltz.jdbc_style.schema import high_water_marks, idempotency_keys
from waltz.protocol.records import ReqId
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitBarrier, SplitGenesis
from waltz.spark.decoders import DecoderRegistry, decode_changes
from waltz.spark.errors import RebuildError
from waltz.spark.snapshot import keeps_decimal_text
from waltz.spark.source import LOG_SCHEMA
from waltz.spark.target import jdbc_target, write_views
from waltz.spark.views import (
    AppViews,
    apply_idempotency,
    caching_replays,
    carries_decimal_text,
    change_check,
    change_problems,
    checked_problems,
    entity_table,
    idempotency_key_rows,
    partial_row_problem,
    replay,
    spark_type,
)
from waltz_examples.counter.models import Counter
from waltz_examples.counter.transactions import CounterCallbacks
from waltz_examples.counter.views import VIEWS as COUNTER_VIEWS

OTHER = "another-log"


def _set(counter_id: int, value: int, key: str | None = None) -> bytes:
    change = RowChange(
        Operation.UPDATE if value else Operation.INSERT,
        "counter",
        {"counter_id": counter_id},
        {"counter_id": counter_id, "value": value, "updated_tx": -1},
    )
    return ChangeSet([change], idempotency_key=key).encode()


def _log(spark: Any) -> Any:
    """Partition 0: counter 1 set to 0, 5, then 9 under key req-1; partition 1: counter 2 set to 3
    under key req-1 (a duplicate in a later partition: not applied), then to 4 under req-2."""
    entries = [
        (0, 0, _set(1, 0)),
        (0, 1, _set(1, 5)),
        (0, 2, _set(1, 9, "req-1")),
        (1, 0, _set(2, 3, "req-1")),
        (1, 1, _set(2, 4, "req-2")),
    ]
    rows = [(p, t, CHANGE_SET_HEADER, 7, 1, p, t, data) for p, t, data in entries]
    return spark.createDataFrame(rows, LOG_SCHEMA)


def test_idempotency_keys_are_where_each_key_first_appears(spark: Any) -> None:
    log = _log(spark)
    changes = decode_changes(log, COUNTER_VIEWS.decoders)
    keys = {
        r.idempotency_key: (r.partition_id, r.transaction_id)
        for r in idempotency_key_rows(changes, "c").collect()
    }
    assert keys == {"req-1": (0, 2), "req-2": (1, 1)}
    counters = {
        r.counter_id: (r.value, r.updated_tx)
        for r in COUNTER_VIEWS.build(changes, log)[Counter.__tablename__].collect()
    }
    # Counter 2's first change carried req-1, already used in partition 0: not applied.
    assert counters == {1: (9, 2), 2: (4, 1)}


def test_views_built_while_caching_replays_share_one_persisted_replay(spark: Any) -> None:
    """Inside ``caching_replays`` the replay the views share is persisted once and handed back to be
    released; outside, nothing is persisted."""
    changes = decode_changes(_log(spark), COUNTER_VIEWS.decoders)
    assert not replay(changes).is_cached
    with caching_replays() as persisted:
        rows = replay(changes)
    assert persisted == [rows]
    assert rows.is_cached
    assert sorted(r.key for r in rows.collect()) == ['{"counter_id":"1"}', '{"counter_id":"2"}']
    rows.unpersist()
    assert not rows.is_cached


def _target_url(request: pytest.FixtureRequest, tmp_path: Any, backend: str) -> str:
    """An empty target database of the backend (a fresh one on the local server)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'target.db'}"
    return str(request.getfixturevalue("postgres_url" if backend == "postgresql" else "mariadb_url"))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"])
def test_a_rebuild_replaces_its_log_rows_and_keeps_other_logs(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Any, backend: str
) -> None:
    url = _target_url(request, tmp_path, backend)
    engine = create_framework_engine(url)
    COUNTER_VIEWS.prepare(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(high_water_marks),
            [
                {"cluster_name": OTHER, "partition_id": 0, "high_water_mark": 41, "updated_at": None},
                {"cluster_name": "counter", "partition_id": 7, "high_water_mark": 99, "updated_at": None},
            ],
        )
        conn.execute(
            insert(idempotency_keys),
            [
                {"cluster_name": OTHER, "idempotency_key": "req-1", "partition_id": 0, "transaction_id": 3},
                {"cluster_name": "counter", "idempotency_key": "old", "partition_id": 0, "transaction_id": 0},
            ],
        )
        conn.execute(insert(Counter.__table__), [{"counter_id": 77, "value": 1, "updated_tx": 0}])
    log = _log(spark)
    changes = decode_changes(log, COUNTER_VIEWS.decoders)
    views = COUNTER_VIEWS.build(changes, log)
    for _ in range(2):  # a rerun gives the same database
        rows = write_views(
            views,
            COUNTER_VIEWS,
            url,
            {0: 2, 1: 1},
            idempotency_keys_df=idempotency_key_rows(changes, "counter"),
        )
        assert rows == {"counters": 2, "waltz_idempotency_keys": 2}
        with engine.connect() as conn:
            marks = {tuple(r) for r in conn.execute(select(*list(high_water_marks.c)[:3]))}
            keys = {tuple(r) for r in conn.execute(select(*list(idempotency_keys.c)[:4]))}
            counters = {tuple(r) for r in conn.execute(select(*Counter.__table__.columns))}
        assert marks == {(OTHER, 0, 41), ("counter", 0, 2), ("counter", 1, 1)}
        assert keys == {(OTHER, "req-1", 0, 3), ("counter", "req-1", 0, 2), ("counter", "req-2", 1, 1)}
        assert counters == {(1, 9, 2), (2, 4, 1)}
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"])
def test_a_rebuild_never_moves_a_live_mark_backwards(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Any, backend: str
) -> None:
    """Instances applied past the rebuild's marks while it ran: swapping would move the marks back
    (and the instances would skip what the rebuilt tables lack), so nothing is swapped, and no
    staging table (a full copy of each table) is left behind."""
    url = _target_url(request, tmp_path, backend)
    engine = create_framework_engine(url)
    COUNTER_VIEWS.prepare(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(high_water_marks),
            [
                {"cluster_name": "counter", "partition_id": 0, "high_water_mark": 5, "updated_at": None},
                {"cluster_name": "counter", "partition_id": 1, "high_water_mark": 1, "updated_at": None},
            ],
        )
        conn.execute(insert(Counter.__table__), [{"counter_id": 1, "value": 11, "updated_tx": 5}])
    log = _log(spark)
    changes = decode_changes(log, COUNTER_VIEWS.decoders)
    with pytest.raises(RebuildError, match=r"partition 0: 5 live, 2 rebuilt.*nothing was swapped"):
        write_views(
            COUNTER_VIEWS.build(changes, log),
            COUNTER_VIEWS,
            url,
            {0: 2, 1: 1},
            idempotency_keys_df=idempotency_key_rows(changes, "counter"),
        )
    with engine.connect() as conn:
        marks = {tuple(r) for r in conn.execute(select(*list(high_water_marks.c)[:3]))}
        counters = {tuple(r) for r in conn.execute(select(*Counter.__table__.columns))}
    assert marks == {("counter", 0, 5), ("counter", 1, 1)}
    assert counters == {(1, 11, 5)}  # the live table, not the rebuilt one
    assert not [t for t in inspect(engine).get_table_names() if t.endswith("__rebuild")]
    # Up to the live marks or beyond, the swap goes ahead.
    write_views(COUNTER_VIEWS.build(changes, log), COUNTER_VIEWS, url, {0: 5, 1: 1})
    engine.dispose()


def test_a_snapshot_row_the_log_leaves_alone_keeps_its_overridden_columns(spark: Any) -> None:
    """A rebuild from a snapshot that replays an entity file whole (docs/design/spark.md
    "Snapshots"): a row no later change names comes out of the replay with its snapshot insert
    (transaction -1) as its last change; the counter's ``updated_tx``, overridden from the
    change's ``transaction_id``, keeps the snapshot's value, as a full rebuild gives it, while a
    row the log changes after the snapshot takes the position of its last change."""
    from waltz.spark.snapshot import rows_as_changes

    (info,) = list(COUNTER_VIEWS.entities or ())
    snapshot_rows = spark.createDataFrame(
        [(1, 7, 41), (3, 2, 17)], "counter_id BIGINT, value BIGINT, updated_tx BIGINT"
    )
    log = _log(spark)
    changes = rows_as_changes(snapshot_rows, info).unionByName(decode_changes(log, COUNTER_VIEWS.decoders))
    counters = COUNTER_VIEWS.build(changes, log)[Counter.__tablename__]
    # Counter 1: set to 9 in transaction 2 after the snapshot; counter 2: new; counter 3: untouched.
    assert {tuple(r) for r in counters.collect()} == {(1, 9, 2), (2, 4, 1), (3, 2, 17)}


def _pg_shape(conn: Any, table: str) -> tuple[set[tuple[str, str]], set[tuple[str, str, str]]]:
    """A PostgreSQL table's indexes (name, definition) and constraints (name, kind, definition)."""
    indexes = conn.execute(
        text(
            "SELECT indexname, indexdef || coalesce(' -- ' || obj_description(to_regclass(indexname), "
            "'pg_class'), '') FROM pg_indexes WHERE tablename = :t AND schemaname = current_schema()"
        ),
        {"t": table},
    )
    constraints = conn.execute(
        text(
            "SELECT conname, contype::text, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = CAST(:t AS regclass)"
        ),
        {"t": table},
    )
    return {tuple(r) for r in indexes}, {tuple(r) for r in constraints}


def test_a_rebuilt_postgresql_table_has_the_indexes_and_constraints_it_had(
    spark: Any, postgres_url: str
) -> None:
    """The staging table's indexes are built after its rows are in: the swapped-in table ends with
    the same indexes and constraints, under the same names, as the table it replaced; the rows of a
    unique index are checked (a duplicate is refused, below)."""
    engine = create_framework_engine(postgres_url)
    COUNTER_VIEWS.prepare(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE INDEX counters_by_value ON counters (value DESC) WHERE value > 0"))
        conn.execute(text("ALTER TABLE counters ADD CONSTRAINT counters_one_row_per_tx UNIQUE (updated_tx)"))
        conn.execute(text("ALTER TABLE counters ADD CONSTRAINT counters_value_sane CHECK (value >= 0)"))
        conn.exec_driver_sql("COMMENT ON INDEX counters_by_value IS 'the busiest first: see :busy, 100%%'")
        before = _pg_shape(conn, "counters")
    assert len(before[0]) == 3  # the primary key's, the unique constraint's, the partial index
    assert any(d.endswith("see :busy, 100%") for _, d in before[0])
    assert {"counters_pkey", "counters_one_row_per_tx", "counters_value_sane"} <= {c[0] for c in before[1]}
    log = _log(spark)
    changes = decode_changes(log, COUNTER_VIEWS.decoders)
    lines: list[str] = []
    views = COUNTER_VIEWS.build(changes, log)
    keys = idempotency_key_rows(changes, "counter")
    write_views(
        views, COUNTER_VIEWS, postgres_url, {0: 2, 1: 1}, idempotency_keys_df=keys, progress=lines.append
    )
    assert "  counters: built the indexes of counters__rebuild (4)" in lines, lines  # and the comment
    assert any(line.startswith("  waltz_idempotency_keys: built the indexes of") for line in lines), lines
    with engine.connect() as conn:
        assert _pg_shape(conn, "counters") == before
        counters = {tuple(r) for r in conn.execute(select(*Counter.__table__.columns))}
    assert counters == {(1, 9, 2), (2, 4, 1)}
    # The rebuilt constraints hold: the unique one refuses a second row of transaction 2.
    with pytest.raises(Exception, match="counters_one_row_per_tx"), engine.begin() as conn:
        conn.execute(insert(Counter.__table__), [{"counter_id": 3, "value": 1, "updated_tx": 2}])
    engine.dispose()


def test_a_sqlite_table_whose_sql_holds_colons_is_rebuilt(spark: Any, tmp_path: Any) -> None:
    """SQLite's own SQL of the table (a default) and of an index (its predicate) is run as it is
    for the staging table and after the swap: a ``:name`` in it is text, not a bind parameter."""
    url = f"sqlite:///{tmp_path / 'colons.db'}"
    engine = create_framework_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE counters (counter_id BIGINT NOT NULL PRIMARY KEY, value BIGINT NOT NULL, "
            "updated_tx BIGINT NOT NULL, note TEXT DEFAULT ':x', "
            "CONSTRAINT counters_value_not_negative CHECK (value >= 0))"
        )
        conn.exec_driver_sql("CREATE INDEX counters_noted ON counters (value) WHERE note <> ':y'")
    COUNTER_VIEWS.prepare(engine)
    log = _log(spark)
    changes = decode_changes(log, COUNTER_VIEWS.decoders)
    write_views(COUNTER_VIEWS.build(changes, log), COUNTER_VIEWS, url, {0: 2, 1: 1})
    with engine.connect() as conn:
        rows = {
            tuple(r) for r in conn.exec_driver_sql("SELECT counter_id, value, updated_tx, note FROM counters")
        }
        indexes = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert rows == {(1, 9, 2, ":x"), (2, 4, 1, ":x")}
    assert "counters_noted" in indexes
    engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_a_refused_write_among_concurrent_ones_leaves_no_staging_table(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Any, backend: str
) -> None:
    """The tables' writes run at once: when the database refuses one (a duplicate key here), the
    others are waited for, every staging table is dropped and the live tables stay."""
    url = _target_url(request, tmp_path, backend)
    engine = create_framework_engine(url)
    COUNTER_VIEWS.prepare(engine)
    with engine.begin() as conn:
        conn.execute(insert(Counter.__table__), [{"counter_id": 1, "value": 11, "updated_tx": 5}])
    log = _log(spark)
    changes = decode_changes(log, COUNTER_VIEWS.decoders)
    counters = COUNTER_VIEWS.build(changes, log)[Counter.__tablename__]
    with pytest.raises(Exception, match=r"(?i)duplicate"):
        write_views(
            {Counter.__tablename__: counters.unionByName(counters)},
            COUNTER_VIEWS,
            url,
            {0: 2, 1: 1},
            idempotency_keys_df=idempotency_key_rows(changes, "counter"),
        )
    with engine.connect() as conn:
        rows = {tuple(r) for r in conn.execute(select(*Counter.__table__.columns))}
    assert rows == {(1, 11, 5)}
    assert not [t for t in inspect(engine).get_table_names() if t.endswith("__rebuild")]
    engine.dispose()


def test_the_jdbc_target_carries_tls_parameters_and_refuses_what_it_cannot_carry() -> None:
    jdbc, props = jdbc_target(
        "postgresql+psycopg://app:secret@db.example:6432/ledger?sslmode=verify-full&sslrootcert=/etc/db-ca.pem"
    )
    assert (
        jdbc == "jdbc:postgresql://db.example:6432/ledger?reWriteBatchedInserts=true&stringtype=unspecified"
    )
    assert props["sslmode"] == "verify-full" and props["sslrootcert"] == "/etc/db-ca.pem"
    assert (props["user"], props["password"]) == ("app", "secret")
    with pytest.raises(RebuildError, match=r"\['host'\] cannot be carried over"):
        jdbc_target("postgresql+psycopg://app@/ledger?host=/var/run/postgresql")
    with pytest.raises(RebuildError, match=r"\['ssl_ca'\] cannot be carried over"):
        jdbc_target("mysql+pymysql://root@127.0.0.1/test?ssl_ca=/etc/ca.pem")


def test_the_jdbc_writer_stores_a_key_of_zero_as_zero_on_mariadb(spark: Any, mariadb_url: str) -> None:
    """As the live applies (tests/jdbc_style/test_sql_apply.py): without NO_AUTO_VALUE_ON_ZERO in
    the writer's sql_mode, MariaDB would store the 0 as the AUTO_INCREMENT key's next value."""
    engine = create_framework_engine(mariadb_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE zero_keys (id INT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL)"))
    jdbc, props = jdbc_target(mariadb_url)
    frame = spark.createDataFrame([(1, 10), (0, 20)], "id INT, v INT")  # 1 first: 0 would become 2
    frame.write.jdbc(jdbc, "zero_keys", mode="append", properties=props)
    with engine.connect() as conn:
        assert [tuple(row) for row in conn.execute(text("SELECT id, v FROM zero_keys ORDER BY id"))] == [
            (0, 20),
            (1, 10),
        ]
    engine.dispose()


def test_changes_that_do_not_fit_their_model_are_found_as_the_live_apply_finds_them(spark: Any) -> None:
    def change_set(*changes: RowChange) -> bytes:
        return ChangeSet(list(changes)).encode()

    fits = RowChange(
        Operation.INSERT, "counter", {"counter_id": 1}, {"counter_id": 1, "value": 1, "updated_tx": -1}
    )
    wrong_key = RowChange(
        Operation.UPDATE, "counter", {"value": 1}, {"counter_id": 2, "value": 2, "updated_tx": -1}
    )
    unknown_column = RowChange(
        Operation.UPDATE, "counter", {"counter_id": 3}, {"counter_id": 3, "value": 3, "password": "x"}
    )
    moved_key = RowChange(
        Operation.UPDATE, "counter", {"counter_id": 4}, {"counter_id": 5, "value": 4, "updated_tx": -1}
    )
    keyless_insert = RowChange(Operation.INSERT, "counter", {"counter_id": 6}, {"value": 6, "updated_tx": -1})
    foreign = RowChange(Operation.INSERT, "someone-else", {"id": 1}, {"id": 1, "anything": 2})
    entries = [
        (0, 0, change_set(fits, foreign)),
        (0, 1, change_set(wrong_key)),
        (1, 0, change_set(fits, unknown_column)),
        (1, 1, change_set(moved_key)),
        (1, 2, change_set(keyless_insert)),
    ]
    log = spark.createDataFrame([(p, t, CHANGE_SET_HEADER, 7, 1, p, t, d) for p, t, d in entries], LOG_SCHEMA)
    registry = COUNTER_VIEWS.entities
    assert registry is not None
    problems = change_problems(decode_changes(log, COUNTER_VIEWS.decoders), registry)

    info = registry.by_name("counter")
    shape = {
        "key": info.key,
        "primary_key": info.primary_key,
        "attributes": info.attributes,
        "model_name": "Counter",
    }
    assert problems == [
        f"partition 0 transaction 1: {row_change_problem(wrong_key, **shape)}",
        f"partition 1 transaction 0: {row_change_problem(unknown_column, **shape)}",
        # Spark's values are the rendered text of the logged ones: the same sentence, quoted.
        "partition 1 transaction 1: update of counter {'counter_id': '4'} changes its key attributes "
        "['counter_id']",
        "partition 1 transaction 2: insert of counter {'counter_id': '6'} does not carry its key "
        "attributes ['counter_id'] in its values (the database would choose the new row's key)",
    ]
    assert row_change_problem(moved_key, **shape) == problems[2].split(": ", 1)[1].replace("'4'", "4")
    assert "sets ['password'], which are not column attributes of Counter" in problems[1]
    assert "without an upcaster" in problems[1] and "RenameAttribute" in problems[1], problems[1]
    # The rebuild's check runs in the decoding pass and finds the same.
    assert _checked_while_decoding(log, registry) == problems
    assert (
        change_problems(decode_changes(log.where("transaction_id = 0 AND partition_id = 0"), None), registry)
        == []
    )


def test_changes_that_leave_out_what_the_live_apply_fills_are_found(spark: Any) -> None:
    # The live apply keeps an update's left-out attributes and defaults an insert's: a replay
    # of the last whole row per key cannot give the same row, so the rebuild must refuse them.
    whole = RowChange(
        Operation.INSERT, "counter", {"counter_id": 1}, {"counter_id": 1, "value": 1, "updated_tx": -1}
    )
    some_of_an_update = RowChange(Operation.UPDATE, "counter", {"counter_id": 1}, {"value": 2})
    defaults_of_an_insert = RowChange(Operation.INSERT, "counter", {"counter_id": 2}, {"counter_id": 2})
    delete = RowChange(Operation.DELETE, "counter", {"counter_id": 1})
    entries = [
        (0, 0, ChangeSet([whole, delete]).encode()),
        (0, 1, ChangeSet([some_of_an_update]).encode()),
        (1, 0, ChangeSet([defaults_of_an_insert]).encode()),
    ]
    log = spark.createDataFrame([(p, t, CHANGE_SET_HEADER, 7, 1, p, t, d) for p, t, d in entries], LOG_SCHEMA)
    registry = COUNTER_VIEWS.entities
    assert registry is not None
    problems = change_problems(decode_changes(log, COUNTER_VIEWS.decoders), registry)
    assert problems == [
        "partition 0 transaction 1: update of counter {'counter_id': '1'} leaves out "
        "['counter_id', 'updated_tx'], which the live apply gives their old values and a rebuild "
        "cannot (carry the whole row, as the entity transactions' updates do; if the model gained "
        "them after this change was written, raise its schema_version and give the older version an "
        'AddAttribute upcaster: docs/sql.md, "Changing a model")',
        "partition 1 transaction 0: insert of counter {'counter_id': '2'} leaves out "
        "['updated_tx', 'value'], which the live apply gives their default values and a rebuild "
        "cannot (give them values in the insert; if the model gained them after this change was "
        "written, raise its schema_version and give the older version an AddAttribute upcaster: "
        'docs/sql.md, "Changing a model")',
    ]
    assert _checked_while_decoding(log, registry) == problems


def _checked_while_decoding(log: Any, registry: Any) -> list[str]:
    checked = decode_changes(log, COUNTER_VIEWS.decoders, check=change_check(registry))
    # The check's column comes after the changes' own.
    assert checked.columns == [*decode_changes(log, COUNTER_VIEWS.decoders).columns, "problem"]
    return checked_problems(checked)


def test_an_insert_may_leave_out_attributes_without_defaults() -> None:
    # Both the live apply and the replay give such an attribute NULL.
    insert_ = RowChange(Operation.INSERT, "note", {"id": 1}, {"id": 1})
    assert partial_row_problem(insert_, attributes=("id", "text"), defaulted=()) is None
    assert partial_row_problem(insert_, attributes=("id", "text"), defaulted=("text",)) is not None
    update = RowChange(Operation.UPDATE, "note", {"id": 1}, {"id": 1})
    assert partial_row_problem(update, attributes=("id", "text"), defaulted=()) is not None


def _counter_set(counter_id: int, value: int, key: str | None = None) -> ChangeSet:
    return ChangeSet.decode(_set(counter_id, value, key))


def test_a_log_of_batches_is_rebuilt_as_the_live_apply_applies_it(spark: Any, tmp_path: Any) -> None:
    """Forms 1 and 3 (docs/design/sql.md "Batched change-sets"): each member on its own, in order,
    a member whose request an earlier transaction or an earlier member carried skipped; the
    rebuild and the live apply give the same rows and keys."""
    entries = [
        (0, 0, _set(1, 0)),
        (0, 1, _set(1, 5, "req-1")),
        (
            0,
            2,
            ChangeSetBatch(
                [
                    _counter_set(1, 50, "req-1"),  # applied in transaction 1: skipped
                    _counter_set(2, 0),
                    _counter_set(1, 6, "req-2"),
                    _counter_set(1, 60, "req-2"),  # the member before's request: skipped
                ]
            ).encode(),
        ),
        (0, 3, ChangeSetBatch([_counter_set(2, 7, "req-3"), _counter_set(3, 0)]).encode()),
    ]
    url = f"sqlite:///{tmp_path / 'live.db'}"
    engine = create_framework_engine(url)
    COUNTER_VIEWS.prepare(engine)
    live = CounterCallbacks(engine, cluster_name="counter")
    for p, t, data in entries:
        live.apply_transaction(Transaction(p, t, ReqId(7, 1, p, t), CHANGE_SET_HEADER, None, data))
    with engine.connect() as conn:
        applied = {tuple(r) for r in conn.execute(select(*Counter.__table__.columns))}
        applied_keys = {tuple(r) for r in conn.execute(select(*list(idempotency_keys.c)[1:4]))}
    engine.dispose()
    assert applied == {(1, 6, 2), (2, 7, 3), (3, 0, 3)}

    log = spark.createDataFrame([(p, t, CHANGE_SET_HEADER, 7, 1, p, t, d) for p, t, d in entries], LOG_SCHEMA)
    changes = decode_changes(log, COUNTER_VIEWS.decoders)
    rebuilt = {
        (r.counter_id, r.value, r.updated_tx)
        for r in COUNTER_VIEWS.build(changes, log)[Counter.__tablename__].collect()
    }
    keys = {
        (r.idempotency_key, r.partition_id, r.transaction_id)
        for r in idempotency_key_rows(changes, "counter").collect()
    }
    assert rebuilt == applied
    assert keys == applied_keys == {("req-1", 0, 1), ("req-2", 0, 2), ("req-3", 0, 3)}
    # The row changes of a batch are numbered on across its members, in order.
    indices = [(r.transaction_id, r.op_index) for r in changes.where("transaction_id = 2").collect()]
    assert sorted(indices) == [(2, 0), (2, 1), (2, 2)]


def _ledger_set(custid: int, balance: int, delta: int, insert: bool = False) -> ChangeSet:
    """A ledger change-set: custid's checking set to ``balance``, ``delta`` in its meta."""
    change = RowChange(
        Operation.INSERT if insert else Operation.UPDATE,
        "ledger.checking",
        {"custid": custid},
        {"custid": custid, "balance": balance},
    )
    return ChangeSet([change], meta={"op": "deposit", "delta": delta})


def test_a_ledger_log_of_batches_is_rebuilt_as_the_live_apply_records_it(spark: Any, tmp_path: Any) -> None:
    """Forms 1 and 3 (docs/design/sql.md "Batched change-sets"): ``ledger_applied_transactions``
    rebuilt from the change rows holds one row per (transaction, member), as
    ``LedgerCallbacks`` records it live; a member without row changes keeps its row."""
    from waltz_examples.ledger.models import Checking, applied_transactions
    from waltz_examples.ledger.service import LedgerCallbacks
    from waltz_examples.ledger.views import VIEWS as LEDGER_VIEWS

    entries = [
        (0, 0, _ledger_set(1, 100, 100, insert=True).encode()),
        (0, 1, ChangeSetBatch([_ledger_set(1, 110, 10), _ledger_set(1, 130, 20)]).encode()),
        (
            0,
            2,
            ChangeSetBatch(
                [
                    _ledger_set(1, 131, 1),
                    ChangeSet([], meta={"op": "noop", "delta": 0}),
                    _ledger_set(1, 134, 3),
                ]
            ).encode(),
        ),
        (1, 0, _ledger_set(2, 5, 5, insert=True).encode()),
    ]
    url = f"sqlite:///{tmp_path / 'live.db'}"
    engine = create_framework_engine(url)
    LEDGER_VIEWS.prepare(engine)
    live = LedgerCallbacks(engine, cluster_name="ledger", registry=LEDGER_VIEWS.entities)
    for p, t, data in entries:
        live.apply_transaction(Transaction(p, t, ReqId(7, 1, p, t), CHANGE_SET_HEADER, None, data))
    with engine.connect() as conn:
        applied = {tuple(r) for r in conn.execute(select(*applied_transactions.columns))}
        balances = {tuple(r) for r in conn.execute(select(Checking.custid, Checking.balance))}
    engine.dispose()
    assert applied == {
        (0, 0, "deposit", 100, 0),
        (0, 1, "deposit", 10, 0),
        (0, 1, "deposit", 20, 1),
        (0, 2, "deposit", 1, 0),
        (0, 2, "noop", 0, 1),
        (0, 2, "deposit", 3, 2),
        (1, 0, "deposit", 5, 0),
    }
    assert balances == {(1, 134), (2, 5)}

    log = spark.createDataFrame([(p, t, CHANGE_SET_HEADER, 7, 1, p, t, d) for p, t, d in entries], LOG_SCHEMA)
    changes = decode_changes(log, LEDGER_VIEWS.decoders)
    tables = LEDGER_VIEWS.build(changes, log)
    rebuilt = {tuple(r) for r in tables[applied_transactions.name].collect()}
    assert [c.name for c in applied_transactions.columns] == tables[applied_transactions.name].columns
    assert rebuilt == applied
    assert {(r.custid, r.balance) for r in tables[Checking.__tablename__].collect()} == balances
    # Each change row carries its member's place; forms 1 and 2 give member 0.
    members = {(r.partition_id, r.transaction_id, r.op_index, r.member) for r in changes.collect()}
    assert members == {
        (0, 0, 0, 0),
        (0, 1, 0, 0),
        (0, 1, 1, 1),
        (0, 2, 0, 0),
        (0, 2, -1, 1),
        (0, 2, 1, 2),
        (1, 0, 0, 0),
    }


BARRIER = SplitBarrier(epoch=1, count=2, previous_count=1, parent=0).encode()
GENESIS = SplitGenesis(epoch=1, count=2, previous_count=1, parent=0, barrier=2).encode()


@pytest.mark.parametrize("on_unknown", ["fail", "skip"])
def test_split_records_decode_to_no_row_changes_whatever_on_unknown_says(on_unknown: str) -> None:
    """docs/design/splits.md "Spark across a split": barrier and genesis records carry no row
    changes; their form is read, and a form this release does not read fails the job naming it."""
    decoders = DecoderRegistry(on_unknown=on_unknown)
    assert decoders.decode_members(SPLIT_RECORD_HEADER, BARRIER) == ()
    assert decoders.decode_members(SPLIT_RECORD_HEADER, GENESIS) == ()
    assert decoders.decode(SPLIT_RECORD_HEADER, GENESIS) == ChangeSet(())
    newer = json.dumps({**json.loads(GENESIS), "v": 2}).encode()
    for decode in (decoders.decode, decoders.decode_members):
        with pytest.raises(ChangeSetFormatError, match="split record of form 2 is newer"):
            decode(SPLIT_RECORD_HEADER, newer)
        with pytest.raises(ChangeSetFormatError, match="kind 'merge' is unknown"):
            decode(SPLIT_RECORD_HEADER, json.dumps({**json.loads(BARRIER), "kind": "merge"}).encode())
    with pytest.raises(ValueError, match="decoded by the framework"):
        decoders.register(SPLIT_RECORD_HEADER, lambda data: ())


def test_a_split_record_of_a_newer_form_is_named_as_a_newer_waltz_py_s(spark: Any) -> None:
    """docs/design/splits.md "Record forms": a split record of a form this release does not read
    is a newer waltz-py's, as a change-set of a newer form is (its form kept): the failed Spark job
    says to run the rebuild with the release the instances run, not to check ``--root``; a split
    record that is malformed in its own form stays a record that does not decode."""
    from waltz.cli.rebuild import spark_job_failure
    from waltz.jdbc_style.changeset import ChangeSetVersionError

    newer = json.dumps({**json.loads(GENESIS), "v": 2}).encode()
    with pytest.raises(ChangeSetVersionError, match="split record of form 2 is newer") as raised:
        DecoderRegistry().decode_members(SPLIT_RECORD_HEADER, newer)
    assert raised.value.version == 2
    merge = json.dumps({**json.loads(BARRIER), "kind": "merge"}).encode()
    with pytest.raises(ChangeSetFormatError) as malformed:
        DecoderRegistry().decode_members(SPLIT_RECORD_HEADER, merge)
    assert not isinstance(malformed.value, ChangeSetVersionError)
    log = spark.createDataFrame(
        [(0, 0, CHANGE_SET_HEADER, 7, 1, 0, 0, _set(1, 0)), (0, 1, SPLIT_RECORD_HEADER, 7, 1, 0, 1, newer)],
        LOG_SCHEMA,
    )
    with pytest.raises(Exception, match="ChangeSetVersionError") as failed:
        decode_changes(log, COUNTER_VIEWS.decoders).collect()
    lines = spark_job_failure(str(failed.value), "waltz_examples.counter")
    assert lines[0].startswith(
        "error: the log holds a record a newer waltz-py wrote: partition 0 transaction 1: a split record "
        "of form 2 is newer than this waltz-py reads"
    ), lines
    assert "run the rebuild with the waltz-py the application's instances run" in lines[1], lines
    assert not [line for line in lines if "--root" in line], lines


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_ledger_log_with_split_records_is_applied_cached_and_rebuilt_as_without_them(
    spark: Any, tmp_path: Any, request: pytest.FixtureRequest, backend: str
) -> None:
    """docs/design/splits.md "Record forms": a barrier and a genesis among change-sets of forms 1
    and 3 change no row in the live apply, leave the entity cache following the log (the barrier
    changes nothing; the genesis starts its partition's rows again), and give no row change to the
    rebuild, whose tables equal those of the same log without them. The records stand among the
    change-sets: this release reads them wherever they are."""
    from waltz_examples.ledger.models import Checking, applied_transactions
    from waltz_examples.ledger.service import LedgerCallbacks
    from waltz_examples.ledger.views import VIEWS as LEDGER_VIEWS

    entries = [
        (0, 0, CHANGE_SET_HEADER, _ledger_set(1, 100, 100, insert=True).encode()),
        (
            0,
            1,
            CHANGE_SET_HEADER,
            ChangeSetBatch([_ledger_set(1, 110, 10), _ledger_set(1, 130, 20)]).encode(),
        ),
        (0, 2, SPLIT_RECORD_HEADER, BARRIER),
        (
            0,
            3,
            CHANGE_SET_HEADER,
            ChangeSetBatch(
                [
                    _ledger_set(1, 131, 1),
                    ChangeSet([], meta={"op": "noop", "delta": 0}),
                    _ledger_set(1, 134, 3),
                ]
            ).encode(),
        ),
        (1, 0, CHANGE_SET_HEADER, _ledger_set(2, 5, 5, insert=True).encode()),
        (1, 1, SPLIT_RECORD_HEADER, GENESIS),
        (
            1,
            2,
            CHANGE_SET_HEADER,
            dataclasses.replace(_ledger_set(2, 7, 2), idempotency_key="req-1").encode(),
        ),
        (
            1,
            3,
            CHANGE_SET_HEADER,
            dataclasses.replace(_ledger_set(2, 9, 2), idempotency_key="req-2").encode(),
        ),
    ]
    url = (
        f"sqlite:///{tmp_path / 'live.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    engine = create_framework_engine(url)
    try:
        LEDGER_VIEWS.prepare(engine)
        live = LedgerCallbacks(engine, cluster_name="ledger", registry=LEDGER_VIEWS.entities)
        for p in (0, 1):
            live.absorb_floor(p, -1)  # as the client does at a mount
        for p, t, header, data in entries:
            transaction = Transaction(p, t, ReqId(7, 1, p, t), header, None, data)
            live.absorb_transactions([transaction])  # as the client does before it applies
            live.apply_transaction(transaction)
        with engine.connect() as conn:
            applied = {tuple(r) for r in conn.execute(select(*applied_transactions.columns))}
            balances = {tuple(r) for r in conn.execute(select(Checking.custid, Checking.balance))}
            applied_keys = {tuple(r) for r in conn.execute(select(*list(idempotency_keys.c)[1:4]))}
        assert live.high_water_marks() == {0: 3, 1: 3} and live.uncaught_count == 0
        cache = live.entity_cache
        assert cache is not None
        info = live.registry.info(Checking)
        assert cache.read(0, [(info, (1,))]) == (3, {(info, (1,)): (1, 134)})
        assert cache.read(1, [(info, (2,))]) == (3, {(info, (2,)): (2, 9)})
        assert cache.resets == 1  # the genesis: partition 1's row of customer 2
    finally:
        engine.dispose()
    assert balances == {(1, 134), (2, 9)}
    assert {(p, t) for p, t, *_ in applied} == {(0, 0), (0, 1), (0, 3), (1, 0), (1, 2), (1, 3)}

    def rebuilt(rows: list[tuple[int, int, int, bytes]]) -> tuple[dict[str, set[tuple[Any, ...]]], Any]:
        log = spark.createDataFrame([(p, t, h, 7, 1, p, t, d) for p, t, h, d in rows], LOG_SCHEMA)
        changes = decode_changes(log, LEDGER_VIEWS.decoders)
        tables = {
            name: {tuple(r) for r in df.collect()} for name, df in LEDGER_VIEWS.build(changes, log).items()
        }
        keys = {
            (r.idempotency_key, r.partition_id, r.transaction_id)
            for r in idempotency_key_rows(changes, "ledger").collect()
        }
        return tables, (keys, changes.where(f"header = {SPLIT_RECORD_HEADER}").count())

    with_records, (keys, split_rows) = rebuilt(entries)
    without_records, (keys_without, _) = rebuilt([e for e in entries if e[2] != SPLIT_RECORD_HEADER])
    assert split_rows == 0
    assert with_records == without_records
    assert keys == keys_without == applied_keys == {("req-1", 1, 2), ("req-2", 1, 3)}
    assert with_records[applied_transactions.name] == applied
    assert {(c, b) for c, b in with_records[Checking.__tablename__]} == balances


# ---- column types: what the live apply stores, the rebuild stores; the drift check compares it ----


class _TypesBase(DeclarativeBase):
    pass


class _Token(_TypesBase):
    __tablename__ = "spark_tokens"
    __waltz__ = WaltzEntity("test.token")

    tok_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    token: Mapped[uuid.UUID | None] = mapped_column(Uuid)


class _Amount(_TypesBase):
    __tablename__ = "spark_amounts"
    __waltz__ = WaltzEntity("test.amount")

    amount_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    amount: Mapped[decimal.Decimal | None]  # Numeric(): neither precision nor scale


def _entity_views(model: type[Any]) -> AppViews:
    """The views of one entity table, ``model``'s."""
    registry = EntityRegistry([model])
    table: Table = model.__table__  # type: ignore[attr-defined]

    def build(changes: Any, log: Any) -> dict[str, Any]:
        return {table.name: entity_table(replay(apply_idempotency(changes)), registry, model)}

    def prepare(engine: Engine) -> None:
        framework_migrations.upgrade(engine)
        table.create(engine, checkfirst=True)

    return AppViews("column-types", tables=[table], prepare=prepare, build=build, entities=registry)


def _insert_log(spark: Any, entity: str, key: str, rows: list[dict[str, Any]]) -> Any:
    """A log of one insert per row, in transactions 0, 1, ... of partition 0."""
    entries = [
        (
            0,
            i,
            CHANGE_SET_HEADER,
            7,
            1,
            0,
            i,
            ChangeSet([RowChange(Operation.INSERT, entity, {key: row[key]}, row)]).encode(),
        )
        for i, row in enumerate(rows)
    ]
    return spark.createDataFrame(entries, LOG_SCHEMA)


def _stored(engine: Engine, table: Table) -> list[tuple[Any, ...]]:
    """The table's rows as the database driver gives them (no SQLAlchemy type processing)."""
    names = ", ".join(c.name for c in table.columns)
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(f"SELECT {names} FROM {table.name} ORDER BY 1"))]


def _live_then_rebuilt(
    spark: Any, url: str, model: type[Any], key: str, rows: list[dict[str, Any]]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The rows stored by the live apply's insert of ``rows`` (``insert(model).values(...)``),
    then those stored by a rebuild of a log of the same inserts."""
    views = _entity_views(model)
    table: Table = model.__table__
    engine = create_framework_engine(url)
    try:
        views.prepare(engine)
        with engine.begin() as conn:
            for row in rows:
                conn.execute(insert(model).values(**row))
        live = _stored(engine, table)
        assert len(live) == len(rows)
        log = _insert_log(spark, model.__waltz__.lock_name, key, rows)
        changes = decode_changes(log, views.decoders)
        write_views(views.build(changes, log), views, url, {0: len(rows) - 1})
        return live, _stored(engine, table)
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_uuid_column_is_rebuilt_as_the_live_apply_stores_it(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Any, backend: str
) -> None:
    """PostgreSQL refused the JDBC writer's text for a ``uuid`` column; SQLite, which keeps a UUID
    as 32 hex digits, got the text with its dashes."""
    token = uuid.UUID("12345678-1234-5678-1234-567812345678")
    rows = [{"tok_id": 1, "token": token}, {"tok_id": 2, "token": None}]
    live, rebuilt = _live_then_rebuilt(spark, _target_url(request, tmp_path, backend), _Token, "tok_id", rows)
    assert rebuilt == live
    assert live[0][1] in (token, token.hex)


#: Values of a ``Numeric()`` column: 15 decimals, 30 integer digits, an exponent, none.
_AMOUNTS = [
    decimal.Decimal("0.123456789012345"),
    decimal.Decimal("123456789012345678901234567890.5"),
    decimal.Decimal("1E-7"),
    None,
]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_numeric_column_without_a_scale_is_rebuilt_exactly(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Any, backend: str
) -> None:
    """The rebuild cast such a column to decimal(38,10): 0.123456789012345 was stored as
    0.1234567890, and a value of more than 28 integer digits failed the job."""
    rows = [{"amount_id": i, "amount": amount} for i, amount in enumerate(_AMOUNTS)]
    live, rebuilt = _live_then_rebuilt(
        spark, _target_url(request, tmp_path, backend), _Amount, "amount_id", rows
    )
    assert rebuilt == live
    if backend == "postgresql":
        assert [amount for _, amount in rebuilt] == _AMOUNTS
        assert str(rebuilt[0][1]) == "0.123456789012345"


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_a_numeric_column_without_a_scale_is_compared_at_the_live_column_s_precision(
    spark: Any, request: pytest.FixtureRequest, backend: str
) -> None:
    """A difference at the 11th decimal is drift (the check cast the live values to the rebuilt
    decimal(38,10)); on MariaDB, whose NUMERIC keeps no decimals, what the live apply rounded
    is not."""
    from waltz.spark.drift import compare_table
    from waltz.spark.live_tables import live_snapshot

    url = str(request.getfixturevalue("postgres_url" if backend == "postgresql" else "mariadb_url"))
    amounts = (
        _AMOUNTS
        if backend == "postgresql"
        else [decimal.Decimal("0.123456789012345"), decimal.Decimal("2.5")]
    )
    rows = [{"amount_id": i, "amount": amount} for i, amount in enumerate(amounts)]
    views = _entity_views(_Amount)
    table: Table = _Amount.__table__  # type: ignore[attr-defined]
    edited = decimal.Decimal("0.123456789049999") if backend == "postgresql" else decimal.Decimal(7)
    engine = create_framework_engine(url)
    try:
        views.prepare(engine)
        with engine.begin() as conn:
            for row in rows:
                conn.execute(insert(_Amount).values(**row))
            conn.execute(update(table).where(table.c.amount_id == 0).values(amount=edited))
    finally:
        engine.dispose()
    log = _insert_log(spark, "test.amount", "amount_id", rows)
    rebuilt = views.build(decode_changes(log, views.decoders), log)[table.name]
    with live_snapshot(spark, url, [table], views.cluster_name) as live:
        drift = compare_table(
            spark, table, rebuilt, live.frame(spark, table, rebuilt.schema), live.decimal_precision(table)
        )
    assert (drift.missing, drift.extra, drift.different) == (0, 0, 1), drift
    (example,) = drift.examples
    assert "{'amount_id': 0}" in example and str(edited) in example, example


#: Rebuilds and drift-checks a table of naive and aware timestamps in a process whose zone (and
#: its Spark JVM's) is the one ``TZ`` names: prints each database's drift counts as JSON.
_ZONE_SCRIPT = """
import datetime as dt, json, sys
from sqlalchemy import BigInteger, DateTime, insert
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from waltz.jdbc_style import EntityRegistry, WaltzEntity, create_framework_engine, migrations_api
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER, ChangeSet, Operation, RowChange
from waltz.spark.decoders import decode_changes
from waltz.spark.drift import compare_table
from waltz.spark.live_tables import live_snapshot
from waltz.spark.session import spark_session
from waltz.spark.source import LOG_SCHEMA
from waltz.spark.target import write_views
from waltz.spark.views import AppViews, apply_idempotency, entity_table, replay

class Base(DeclarativeBase):
    pass

class Stamp(Base):
    __tablename__ = "spark_stamps"
    __waltz__ = WaltzEntity("test.stamp")
    stamp_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    local: Mapped[dt.datetime | None] = mapped_column(DateTime)
    stamped: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))

ENTITIES = EntityRegistry([Stamp])

def build(changes, log):
    return {"spark_stamps": entity_table(replay(apply_idempotency(changes)), ENTITIES, Stamp)}

def prepare(engine):
    migrations_api.upgrade(engine)
    Base.metadata.create_all(engine)

VIEWS = AppViews("zones", tables=[Stamp.__table__], prepare=prepare, build=build, entities=ENTITIES)
rows = [
    {"stamp_id": i, "local": dt.datetime.fromisoformat(local), "stamped": dt.datetime.fromisoformat(stamped)}
    for i, (local, stamped) in enumerate(json.loads(sys.argv[1]))
]
spark = spark_session("local[1]", app_name="zones", shuffle_partitions=1)
spark.sparkContext.setLogLevel("ERROR")
def change(row):
    return ChangeSet([RowChange(Operation.INSERT, "test.stamp", {"stamp_id": row["stamp_id"]}, row)]).encode()

entries = [(0, i, CHANGE_SET_HEADER, 7, 1, 0, i, change(r)) for i, r in enumerate(rows)]
log = spark.createDataFrame(entries, LOG_SCHEMA)
found = {}
for url in sys.argv[2:]:
    engine = create_framework_engine(url)
    prepare(engine)
    with engine.begin() as conn:
        for row in rows:
            conn.execute(insert(Stamp).values(**row))  # what the live apply does
    engine.dispose()
    views = build(decode_changes(log, VIEWS.decoders), log)
    table = Stamp.__table__
    with live_snapshot(spark, url, [table], "zones") as live:
        rebuilt = views["spark_stamps"]
        drift = compare_table(spark, table, rebuilt, live.frame(spark, table, rebuilt.schema))
    write_views(views, VIEWS, url, {0: len(rows) - 1})
    found[url] = [drift.missing, drift.extra, drift.different, list(drift.examples)]
print(json.dumps(found))
spark.stop()
"""


def test_timestamps_are_rebuilt_and_compared_whatever_the_machine_s_zone(
    tmp_path: Any, postgres_url: str
) -> None:
    """In Berlin, naive timestamps were rebuilt an hour or two late (the Spark JVM's zone drove the
    JDBC writes, Python's the SQLite writes), and the drift check then found the live database,
    which held the right values, different: rebuilt in a process, and its JVM, in that zone, the
    values are the live apply's and the check finds no drift."""
    import json
    import os
    import subprocess
    import sys

    values = [
        ("2026-01-02T03:04:05", "2026-01-02T03:04:05+00:00"),
        ("2026-07-02T03:04:05.250000", "2026-07-02T23:30:00+00:00"),
        ("2026-03-29T02:30:00", "2026-03-29T01:30:00+00:00"),  # 02:30 never happens in Berlin that day
    ]
    sqlite_url = f"sqlite:///{tmp_path / 'zones.db'}"
    env = {**os.environ, "TZ": "Europe/Berlin"}
    done = subprocess.run(
        [sys.executable, "-c", _ZONE_SCRIPT, json.dumps(values), sqlite_url, postgres_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {sqlite_url: [0, 0, 0, []], postgres_url: [0, 0, 0, []]}, found
    naive = [dt.datetime.fromisoformat(local) for local, _ in values]
    aware = [dt.datetime.fromisoformat(stamped) for _, stamped in values]
    columns = "stamp_id, local, stamped"
    for url in (sqlite_url, postgres_url):
        engine = create_framework_engine(url)
        try:
            with engine.connect() as conn:
                stored = [
                    tuple(r) for r in conn.execute(text(f"SELECT {columns} FROM spark_stamps ORDER BY 1"))
                ]
        finally:
            engine.dispose()
        if url == sqlite_url:  # text: the naive values, and the aware ones as UTC wall-clock times
            stored = [(i, dt.datetime.fromisoformat(n), dt.datetime.fromisoformat(a)) for i, n, a in stored]
            assert stored == [
                (i, n, a.replace(tzinfo=None)) for i, (n, a) in enumerate(zip(naive, aware, strict=True))
            ]
        else:
            assert stored == [(i, n, a) for i, (n, a) in enumerate(zip(naive, aware, strict=True))]


@pytest.mark.parametrize(
    ("column_type", "spark", "text"),
    [
        (sa_types.Numeric(), "string", True),
        (sa_types.Numeric(10), "string", True),
        (sa_types.Numeric(60, 30), "string", True),
        (sa_types.Numeric(12, 2), "decimal(12,2)", False),
        (sa_types.Numeric(38, 38), "decimal(38,38)", False),
        (sa_types.Float(), "double", False),
    ],
)
def test_the_rebuild_and_snapshots_carry_the_same_decimals_as_text(
    column_type: sa_types.Numeric[Any], spark: str, text: bool
) -> None:
    """One rule for both: a snapshot that kept a column as text and a rebuild that cast it to a
    Spark decimal disagreed (``Numeric(60, 30)`` was ``decimal(60,30)``, which Spark refuses)."""
    assert spark_type(column_type) == spark
    assert carries_decimal_text(column_type) is text
    assert keeps_decimal_text(column_type) is text
