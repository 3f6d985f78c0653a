"""The partition's mark and an attempt's expected entities, read in one statement.

Source: docs/design/sql.md "Entity transactions" (each attempt reads the partition's mark first,
then the entities, in one snapshot; "Cheap reads").

An entity attempt reads the mark and then, usually, the entities its context was declared with.
:class:`MarkPrefetch` reads them all in one ``SELECT``: the mark row, with each entity's row
joined to it by key (``LEFT OUTER JOIN``, so a missing entity reads as a row of NULLs)::

    SELECT m.high_water_mark, e0.*, e1.*, ...
    FROM waltz_high_water_marks AS m
    LEFT OUTER JOIN ledger_accounts AS e0 ON e0.custid = :e0_k0
    LEFT OUTER JOIN ledger_savings AS e1 ON e1.custid = :e1_k0 ...
    WHERE m.cluster_name = :mark_cluster AND m.partition_id = :mark_partition
    LIMIT 2

One statement sees one snapshot on every backend, so the rows are exactly the state at the mark
it returns, as when the mark is read first and the entities after it in a REPEATABLE READ
transaction. The rows only fill a cache of the attempt: an entity is locked when
``tx.get`` asks for it, as before, and an entity the context did not expect is read by key, as
are the entities beyond the first :data:`MAX_JOINED` (databases cap the tables of a join). More
than one row (``LIMIT 2``) means a key matched several rows: then every entity is read by key.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, and_, bindparam, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SAWarning

from waltz.jdbc_style.direct import direct_statements
from waltz.jdbc_style.entities import EntityInfo
from waltz.jdbc_style.schema import high_water_marks as _marks

__all__ = ["MAX_JOINED", "MAX_SHAPES", "MarkPrefetch", "Prefetched"]

#: The entities' table aliases: ``waltz_prefetch_0``, ``waltz_prefetch_1``, ...
_ALIAS = "waltz_prefetch_"

# The joins are by key, not by a column of the mark row, and SQLAlchemy's MySQL compiler cannot
# follow a chain of such joins: it would warn (once) of a cartesian product. Only that warning, of
# these statements only, is silenced.
_CARTESIAN = r"SELECT statement has a cartesian product between FROM element\(s\) "
warnings.filterwarnings("ignore", message=rf'{_CARTESIAN}"({_ALIAS}\d+|{_marks.name})"', category=SAWarning)

#: The most entities joined to the mark row in one statement; further ones are read by key.
#: MariaDB/MySQL join at most 61 tables in a statement and SQLite 64: the mark's table and 30
#: entities stay well below both.
MAX_JOINED = 30

#: The mark statements kept built, by shape (the models of the entities joined, in order).
MAX_SHAPES = 256

#: ``{(entity info, key values): the entity's row, or None when it has no row}``.
Prefetched = dict[tuple[EntityInfo, tuple[Any, ...]], Any]


class MarkPrefetch:
    """Reads one partition's mark with entity rows by key; statements are built once per shape.

    Args:
        cluster_name: the log's name (the first half of the mark row's key).
    """

    def __init__(self, cluster_name: str) -> None:
        self.cluster_name = cluster_name

    def read(
        self,
        conn: Connection,
        partition_id: int,
        entities: Sequence[tuple[EntityInfo, tuple[Any, ...]]],
        *,
        begin: bool = False,
    ) -> tuple[int | None, Prefetched]:
        """The partition's mark and the rows of ``entities``, in one statement on ``conn``.

        Args:
            conn: a connection in the snapshot's transaction.
            partition_id: the partition.
            entities: (entity info, key values) pairs; those whose model needs the ORM to load
                (see ``EntityInfo.row_statement``) and repeated pairs are left out, and of the
                rest only the first :data:`MAX_JOINED` are read (the others are read by key).
            begin: the statement is the transaction's first: on PostgreSQL (psycopg) the
                transaction's ``BEGIN`` goes in one pipeline with it
                (``DirectStatements.read_begun``: the caller then calls ``end_pipelined_begin``
                once the transaction ended).

        Returns:
            ``(mark, rows)``: the mark (None when the partition has no mark row, and then no
            rows) and ``{(info, key): row or None}`` for the entities read. When a key matched
            more than one row the rows are left out (a read by key then raises as it should).
        """
        wanted: dict[tuple[EntityInfo, tuple[Any, ...]], None] = {}
        for info, key in entities:
            if info.row_statement is not None:
                wanted[(info, key)] = None
                if len(wanted) == MAX_JOINED:
                    break
        statement, widths = _build(tuple(info for info, _ in wanted))
        parameters: dict[str, Any] = {"mark_cluster": self.cluster_name, "mark_partition": partition_id}
        for i, (_, key) in enumerate(wanted):
            for j, value in enumerate(key):
                parameters[f"e{i}_k{j}"] = value
        rows: Sequence[Sequence[Any]] | None = None
        if begin:
            rows = direct_statements(conn.engine).read_begun(conn, statement, parameters)
        if rows is None:
            rows = conn.execute(statement, parameters).all()
        if not rows:
            return None, {}
        first = rows[0]
        mark = first[0]
        if len(rows) > 1:  # a key that does not identify one row: leave it to the reads by key
            return mark, {}
        prefetched: Prefetched = {}
        start = 1
        for pair, width in zip(wanted, widths, strict=True):
            info = pair[0]
            row = first[start : start + width]
            prefetched[pair] = None if row[info.key_position] is None else row
            start += width
        return mark, prefetched


@functools.lru_cache(maxsize=MAX_SHAPES)
def _build(shape: tuple[EntityInfo, ...]) -> tuple[Select[Any], list[int]]:
    """The statement for entities of these models, in order, and each one's number of columns
    (built once per shape while it is among the :data:`MAX_SHAPES` last used: a statement object
    reused with new parameters skips SQLAlchemy's cache-key walk, and contexts of many shapes,
    such as batches of varying size, do not grow memory without end)."""
    where = (_marks.c.cluster_name == bindparam("mark_cluster")) & (
        _marks.c.partition_id == bindparam("mark_partition")
    )
    joined: Any = _marks
    columns: list[Any] = [_marks.c.high_water_mark]
    widths: list[int] = []
    for i, info in enumerate(shape):
        table = info.mapper.local_table.alias(f"{_ALIAS}{i}")
        own: list[Any] = [table.corresponding_column(column) for column in info.columns]
        by_name = dict(zip(info.attributes, own, strict=True))
        on = and_(*(by_name[name] == bindparam(f"e{i}_k{j}") for j, name in enumerate(info.key)))
        joined = joined.outerjoin(table, on)
        columns.extend(own)
        widths.append(len(own))
    # Two rows tell that a key did not identify one row: more (the product of several such
    # keys' matches) would only be fetched to be dropped.
    return select(*columns).select_from(joined).where(where).limit(2), widths
