"""The CPU an apply's own writes cost the application process, by the way they are run.

Creates three tables of 10,000 rows in a fresh database ``waltz_bench_<8 hex>`` on the server of
``--db`` (dropped at the end) and runs ``--groups`` groups of writes on one connection, one
database transaction per group. A group is one ``UPDATE ... SET v = :v_v WHERE id = :k_id`` per
table (the shape of a change-set's staged update, as ``ChangeSetCallbacks`` builds it), each with
``--rows`` parameter sets of distinct rows. Each way runs the same groups:

- ``sqlalchemy``: ``Connection.execute`` per statement (an ``executemany`` when several rows);
- ``direct``: ``DirectStatements.execute`` per statement (the driver's cursor, compiled once);
- ``pipeline``: ``DirectStatements.execute_all`` for the group's statements together (one
  pipeline, an execution per parameter set), as ``ApplySession.flush_staged`` runs a group's
  staged writes that are not change-sets' (or with ``ChangeSetCallbacks.rows_at_once`` off);
- ``arrays``: the same with the statements described as ``ChangeSetCallbacks`` describes its
  own, so that each runs once over arrays of its parameter sets (``rows_at_once.py``).

the ways alternate ``--repeat`` times. Printed per row count and way: the process's CPU time, the
database backend's (read from ``/proc``, so only when the server runs on this machine; "-"
otherwise) and the wall time per group (the wall time includes the commit, which waits for the
database's flush). PostgreSQL with psycopg only: the pipeline is psycopg's (docs/design/sql.md
"Group apply", docs/decisions/0043-framework-writes-on-the-cursor.md,
docs/decisions/0079-rows-of-one-shape-in-one-statement.md).

    .venv/bin/python -m benchmarks.framework_writes [--db URL] [--rows 1,2,5,20] [--groups 600]

Prints a table; asserts nothing but that every group changed the rows it should.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from benchmarks.databases import fresh_database
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.changeset import Operation
from waltz.jdbc_style.direct import direct_statements
from waltz.jdbc_style.rows_at_once import RowsShape, describe_rows

WAYS = ("sqlalchemy", "direct", "pipeline", "arrays")
TABLE_ROWS = 10_000  # enough that the database plans an index lookup per row, as for real tables


class _Base(DeclarativeBase):
    pass


def _model(index: int) -> type[Any]:
    """A model (``id``, ``v``) mapped to ``bench_rows_<index>``."""
    return type(
        f"BenchRows{index}",
        (_Base,),
        {
            "__tablename__": f"bench_rows_{index}",
            "__annotations__": {"id": Mapped[int], "v": Mapped[int]},
            "id": mapped_column(sa.Integer, primary_key=True, autoincrement=False),
            "v": mapped_column(sa.BigInteger),
        },
    )


def _backend_cpu(conn: Connection) -> float | None:
    """The database backend's CPU seconds so far (PostgreSQL on this machine), or None."""
    pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1/postgres", help="server URL")
    parser.add_argument("--rows", default="1,2,5,20", help="parameter sets per statement (comma-separated)")
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
    models = [_model(i) for i in range(3)]
    _Base.metadata.create_all(engine)
    with engine.begin() as conn:
        for model in models:
            conn.execute(sa.insert(model), [{"id": k, "v": 0} for k in range(TABLE_ROWS)])
        conn.execute(sa.text("ANALYZE"))

    def shaped(model: type[Any]) -> Any:
        return sa.update(model).where(model.id == sa.bindparam("k_id")).values(v=sa.bindparam("v_v"))

    statements = [shaped(model) for model in models]
    described = [shaped(model) for model in models]  # the same, run over arrays
    for statement, model in zip(described, models, strict=True):
        describe_rows(statement, RowsShape(model, Operation.UPDATE, ("id",), ("v",)))
    direct = direct_statements(engine)
    print(f"{'rows':>4} {'way':<11} {'CPU µs/group':>13} {'database CPU µs/group':>22} {'wall µs/group':>14}")
    with engine.connect() as conn:
        for rows in row_counts:
            ways: dict[str, Callable[[Connection, list[dict[str, int]]], list[int]]] = {
                "sqlalchemy": lambda c, p: [c.execute(s, p).rowcount for s in statements],
                "direct": lambda c, p: [direct.execute(c, s, p) or 0 for s in statements],
                "pipeline": lambda c, p: direct.execute_all(c, [(s, p) for s in statements]) or [],
                "arrays": lambda c, p: direct.execute_all(c, [(s, p) for s in described]) or [],
            }
            cpu: dict[str, list[float]] = {way: [] for way in WAYS}
            backend: dict[str, list[float]] = {way: [] for way in WAYS}
            wall: dict[str, list[float]] = {way: [] for way in WAYS}
            for _ in range(repeat):
                for way in WAYS:
                    write = ways[way]
                    started, cpu_started = time.perf_counter(), time.process_time()
                    backend_started = _backend_cpu(conn)
                    for g in range(groups):
                        parameters = [{"k_id": (g * rows + j) % TABLE_ROWS, "v_v": g} for j in range(rows)]
                        with conn.begin():
                            changed = write(conn, parameters)
                        if changed != [rows] * len(statements):
                            raise SystemExit(f"{way}: changed {changed}, expected {rows} rows per statement")
                    cpu[way].append((time.process_time() - cpu_started) / groups * 1e6)
                    wall[way].append((time.perf_counter() - started) / groups * 1e6)
                    backend_ended = _backend_cpu(conn)
                    if backend_started is not None and backend_ended is not None:
                        backend[way].append((backend_ended - backend_started) / groups * 1e6)
            for way in WAYS:
                cpu_us, wall_us = statistics.median(cpu[way]), statistics.median(wall[way])
                database = f"{statistics.median(backend[way]):,.0f}" if backend[way] else "-"
                print(f"{rows:>4} {way:<11} {cpu_us:>13,.0f} {database:>22} {wall_us:>14,.0f}")
    engine.dispose()


if __name__ == "__main__":
    main()
