"""The CPU an apply's own writes cost the application process, by the way they are run.

Creates three tables of 100 rows in a fresh database ``waltz_bench_<8 hex>`` on the server of
``--db`` (dropped at the end) and runs ``--groups`` groups of writes on one connection, one
database transaction per group. A group is one ``UPDATE ... SET v = v + :d WHERE id = :k`` per
table (the shape of a group apply's staged writes), each with ``--rows`` parameter sets. Each way
runs the same groups:

- ``sqlalchemy``: ``Connection.execute`` per statement (an ``executemany`` when several rows);
- ``direct``: ``DirectStatements.execute`` per statement (the driver's cursor, compiled once);
- ``pipeline``: ``DirectStatements.execute_all`` for the group's statements together (one
  pipeline), as ``ApplySession.flush_staged`` runs a group's staged writes;

the ways alternate ``--repeat`` times. Printed per row count and way: the process's CPU time and
the wall time per group (the wall time includes the commit, which waits for the database's
flush). PostgreSQL with psycopg only: the pipeline is psycopg's (docs/design/sql.md "Group
apply", docs/decisions/0043-framework-writes-on-the-cursor.md).

    .venv/bin/python -m benchmarks.framework_writes [--db URL] [--rows 1,2,5] [--groups 600]

Prints a table; asserts nothing but that every group changed the rows it should.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection, make_url

from benchmarks.databases import fresh_database
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.direct import direct_statements

WAYS = ("sqlalchemy", "direct", "pipeline")


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1/postgres", help="server URL")
    parser.add_argument("--rows", default="1,2,5", help="parameter sets per statement (comma-separated)")
    parser.add_argument("--groups", type=int, default=600, help="groups per way and row count")
    parser.add_argument(
        "--repeat", type=int, default=3, help="alternations of the ways (the median is printed)"
    )
    args = parser.parse_args()
    url = make_url(args.db)
    if url.get_backend_name() != "postgresql" or url.get_driver_name() != "psycopg":
        parser.error("--db must be a postgresql+psycopg URL: the pipeline it compares is psycopg's")
    with fresh_database(args.db) as bench_url:
        run(bench_url, [int(r) for r in args.rows.split(",")], args.groups, args.repeat)


def run(url: str, row_counts: list[int], groups: int, repeat: int) -> None:
    """Run the groups every way, alternated, on a database made for it; print the table.

    Args:
        url: the database (PostgreSQL with psycopg), empty.
        row_counts: parameter sets per statement, a series each.
        groups: groups per way and row count.
        repeat: alternations of the ways; the median is printed.

    Raises:
        AssertionError: a group did not change the rows it should.
    """
    engine = create_framework_engine(url)
    metadata = sa.MetaData()
    tables = [
        sa.Table(
            f"bench_rows_{i}",
            metadata,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("v", sa.BigInteger),
        )
        for i in range(3)
    ]
    metadata.create_all(engine)
    with engine.begin() as conn:
        for table in tables:
            conn.execute(sa.insert(table), [{"id": k, "v": 0} for k in range(100)])
    statements = [
        sa.update(t).where(t.c.id == sa.bindparam("k")).values(v=t.c.v + sa.bindparam("d")) for t in tables
    ]
    direct = direct_statements(engine)
    print(f"{'rows':>4} {'way':<11} {'CPU µs/group':>13} {'wall µs/group':>14}")
    with engine.connect() as conn:
        for rows in row_counts:
            ways: dict[str, Callable[[Connection, list[dict[str, int]]], list[int]]] = {
                "sqlalchemy": lambda c, p: [c.execute(s, p).rowcount for s in statements],
                "direct": lambda c, p: [direct.execute(c, s, p) or 0 for s in statements],
                "pipeline": lambda c, p: direct.execute_all(c, [(s, p) for s in statements]) or [],
            }
            cpu: dict[str, list[float]] = {way: [] for way in WAYS}
            wall: dict[str, list[float]] = {way: [] for way in WAYS}
            for _ in range(repeat):
                for way in WAYS:
                    write = ways[way]
                    started, cpu_started = time.perf_counter(), time.process_time()
                    for g in range(groups):
                        parameters = [{"k": (g + j) % 100, "d": 1} for j in range(rows)]
                        with conn.begin():
                            changed = write(conn, parameters)
                        if changed != [rows] * len(statements):
                            raise SystemExit(f"{way}: changed {changed}, expected {rows} rows per statement")
                    cpu[way].append((time.process_time() - cpu_started) / groups * 1e6)
                    wall[way].append((time.perf_counter() - started) / groups * 1e6)
            for way in WAYS:
                cpu_us, wall_us = statistics.median(cpu[way]), statistics.median(wall[way])
                print(f"{rows:>4} {way:<11} {cpu_us:>13,.0f} {wall_us:>14,.0f}")
    engine.dispose()


if __name__ == "__main__":
    main()
