"""The live tables of a drift check, read by Spark over JDBC at the point of the live marks."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Column, MetaData, Table, Text, insert, update

from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style import migrations_api as framework_migrations
from waltz.jdbc_style.marks import HighWaterMarks

ROWS = Table(
    "live_rows_test",
    MetaData(),
    Column("id", BigInteger, primary_key=True),
    Column("note", Text),
)


def test_postgresql_tables_are_read_in_the_snapshot_of_the_marks(spark: Any, postgres_url: str) -> None:
    from waltz.spark.live_tables import live_snapshot

    engine = create_framework_engine(postgres_url)
    framework_migrations.upgrade(engine)
    ROWS.create(engine)
    marks = HighWaterMarks("snap")
    with engine.begin() as conn:
        conn.execute(insert(ROWS), [{"id": i, "note": f"n{i}"} for i in range(3)])
        marks.ensure(conn, 0)
        assert marks.try_advance(conn, 0, -1, 2)
    try:
        with live_snapshot(spark, postgres_url, [ROWS], "snap") as live:
            assert live.marks == {0: 2} and live.backend == "postgresql"
            # An apply commits after the marks were read, before Spark reads the table.
            with engine.begin() as conn:
                conn.execute(insert(ROWS), {"id": 3, "note": "n3"})
                conn.execute(update(ROWS).where(ROWS.c.id == 0).values(note="changed"))
                assert marks.try_advance(conn, 0, 2, 3)
            schema = spark.createDataFrame([], "id BIGINT, note STRING").schema
            frame = live.frame(spark, ROWS, schema)
            assert sorted(tuple(r) for r in frame.collect()) == [(0, "n0"), (1, "n1"), (2, "n2")]
            assert frame.count() == 3  # read again: the same snapshot
        with live_snapshot(spark, postgres_url, [ROWS], "snap") as later:
            assert later.marks == {0: 3}
            rows = sorted(tuple(r) for r in later.frame(spark, ROWS, schema).collect())
            assert rows == [(0, "changed"), (1, "n1"), (2, "n2"), (3, "n3")]
    finally:
        engine.dispose()
