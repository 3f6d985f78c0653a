"""The drift check's comparison of one live PostgreSQL table with its rebuilt view: live rows read
on the driver and handed to Spark, versus read by the executors over JDBC in the driver's exported
snapshot (``waltz.spark.live_tables``). Prints times and the driver's peak memory; asserts nothing.
The drift check of docs/design/spark.md, "Drift check"; the choice it measured:
docs/decisions/0032-drift-check-through-spark.md.

Creates a fresh database on the server of ``--db`` (dropped at the end) with a table of ``--rows``
rows ``(id, value, note)`` and the framework's tables, changes ``--changed`` rows, and compares it
with the same rows computed in Spark, both ways: JDBC first (the driver's peak RSS is a
high-water mark of the process, so the way that holds the rows on the driver goes second), then
JDBC again, warm.

    .venv/bin/python -m benchmarks.drift_check --rows 300000
"""

from __future__ import annotations

import argparse
import logging
import resource
import time

from sqlalchemy import BigInteger, Column, MetaData, Table, Text, select, text

from benchmarks.databases import fresh_database
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style import migrations_api as framework_migrations
from waltz.spark.drift import compare_table
from waltz.spark.live_tables import live_snapshot
from waltz.spark.session import spark_session

TABLE = Table(
    "drift_bench",
    MetaData(),
    Column("id", BigInteger, primary_key=True),
    Column("value", BigInteger),
    Column("note", Text),
)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--changed", type=int, default=3)
    parser.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    spark = spark_session(args.master, app_name="waltz-bench-drift", shuffle_partitions=4)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with fresh_database(args.db) as url:
            engine = create_framework_engine(url)
            framework_migrations.upgrade(engine)
            TABLE.create(engine)
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "INSERT INTO drift_bench SELECT i, i * 2, 'n' || i FROM generate_series(0, :n - 1) i"
                    ),
                    {"n": args.rows},
                )
                conn.execute(
                    text("UPDATE drift_bench SET value = value + 1 WHERE id < :c"), {"c": args.changed}
                )
            from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

            rebuilt = spark.range(args.rows).select(
                F.col("id"), (F.col("id") * 2).alias("value"), F.concat(F.lit("n"), F.col("id")).alias("note")
            )
            base = _peak_mib()
            started = time.monotonic()
            with live_snapshot(spark, url, [TABLE], "bench") as live:
                drift = compare_table(spark, TABLE, rebuilt, live.frame(spark, TABLE, rebuilt.schema))
            jdbc_seconds = time.monotonic() - started
            jdbc_peak = _peak_mib()
            print(
                f"JDBC in the exported snapshot: {jdbc_seconds:.1f}s, {drift.different} different; "
                f"driver peak RSS {base:.0f} -> {jdbc_peak:.0f} MiB",
                flush=True,
            )
            started = time.monotonic()
            with engine.connect() as conn:
                rows = [tuple(r) for r in conn.execute(select(*TABLE.columns))]
            drift = compare_table(spark, TABLE, rebuilt, rows)
            driver_seconds = time.monotonic() - started
            print(
                f"rows through the driver: {driver_seconds:.1f}s, {drift.different} different; "
                f"driver peak RSS {jdbc_peak:.0f} -> {_peak_mib():.0f} MiB",
                flush=True,
            )
            del rows
            started = time.monotonic()  # JDBC again, warm as the second way was
            with live_snapshot(spark, url, [TABLE], "bench") as live:
                drift = compare_table(spark, TABLE, rebuilt, live.frame(spark, TABLE, rebuilt.schema))
            print(
                f"JDBC again (warm): {time.monotonic() - started:.1f}s, {drift.different} different",
                flush=True,
            )
            engine.dispose()
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
