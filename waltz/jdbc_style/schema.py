"""The SQL framework's own tables (created by its alembic migrations, ``waltz db upgrade``).

Source: docs/design/sql.md "The high-water-mark table" (the application database must store the
high-water mark, the highest transaction ID the service has consumed), "Idempotency keys", "Skipping
a transaction". One database can follow several Waltz clusters, so every row is keyed by the cluster
name (the log) as well as the partition.

- ``waltz_high_water_marks``: one row per (cluster, partition): the highest transaction ID applied
  to this database (-1: none). Locked (``SELECT ... FOR UPDATE``) by every apply.
- ``waltz_idempotency_keys``: request keys recorded in the same database transaction as the apply
  that carried them, so a request submitted twice is applied once.
- ``waltz_skipped_transactions``: the operator's audited skips (``waltz db skip``): a transaction
  whose apply keeps failing is passed over (the mark moves, ``apply`` is not called) and the row
  records who asked, why, and when it took effect.

Applications that keep their own alembic environment include :data:`metadata` in their
``target_metadata`` (or exclude these tables from autogenerate) and run ours with
:func:`waltz.jdbc_style.migrations_api.upgrade`.

Cluster names and idempotency keys are compared byte for byte on every backend
(:class:`ExactText`): two keys that differ in case or in a trailing space are two requests, and two
cluster names so differing are two logs, in every database that follows the log and in the
rebuild alike.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Dialect,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)
from sqlalchemy.ext.compiler import compiles

__all__ = [
    "CLUSTER_NAME_LENGTH",
    "IDEMPOTENCY_KEY_LENGTH",
    "ExactText",
    "exact_collation",
    "high_water_marks",
    "idempotency_keys",
    "metadata",
    "skipped_transactions",
]

#: Longest cluster (log) name, in characters.
CLUSTER_NAME_LENGTH = 190
#: Longest idempotency key, in characters (fits a MariaDB utf8mb4 primary key with the cluster name).
IDEMPOTENCY_KEY_LENGTH = 190


def exact_collation(dialect: Dialect) -> str | None:
    """The collation that compares text byte for byte without padding on ``dialect``'s backend,
    or None where the default already does (PostgreSQL's deterministic collations, SQLite's
    ``BINARY``).

    MariaDB's and MySQL's default collations (``utf8mb4_general_ci``, ``utf8mb4_0900_ai_ci``)
    ignore case and accents, and their ``utf8mb4_bin`` ignores trailing spaces; MariaDB's
    ``utf8mb4_nopad_bin`` and MySQL 8's ``utf8mb4_0900_bin`` ignore neither.
    """
    if dialect.name not in ("mysql", "mariadb"):
        return None
    return "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"


class ExactText(String):
    """``VARCHAR(length)`` whose values are equal only when their bytes are: with
    :func:`exact_collation` on MariaDB and MySQL (rendered there as ``VARCHAR(length) COLLATE
    ...``), plain ``VARCHAR`` elsewhere. A :class:`~sqlalchemy.types.String` to everything that
    reads a column's type.

    Source: docs/design/sql.md "Idempotency keys".
    """

    def __init__(self, length: int) -> None:
        super().__init__(length)


@compiles(ExactText, "mysql")
@compiles(ExactText, "mariadb")
def _exact_text_on_mysql(type_: ExactText, compiler: Any, **kw: Any) -> str:
    return f"VARCHAR({type_.length}) COLLATE {exact_collation(compiler.dialect)}"


metadata = MetaData()
"""The framework's tables (include it in an application's alembic ``target_metadata``)."""

high_water_marks = Table(
    "waltz_high_water_marks",
    metadata,
    Column("cluster_name", ExactText(CLUSTER_NAME_LENGTH), nullable=False),
    Column("partition_id", Integer, nullable=False),
    Column("high_water_mark", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("cluster_name", "partition_id", name="pk_waltz_high_water_marks"),
)

idempotency_keys = Table(
    "waltz_idempotency_keys",
    metadata,
    Column("cluster_name", ExactText(CLUSTER_NAME_LENGTH), nullable=False),
    Column("idempotency_key", ExactText(IDEMPOTENCY_KEY_LENGTH), nullable=False),
    Column("partition_id", Integer, nullable=False),
    Column("transaction_id", BigInteger, nullable=False),
    Column("applied_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("cluster_name", "idempotency_key", name="pk_waltz_idempotency_keys"),
)

skipped_transactions = Table(
    "waltz_skipped_transactions",
    metadata,
    Column("cluster_name", ExactText(CLUSTER_NAME_LENGTH), nullable=False),
    Column("partition_id", Integer, nullable=False),
    Column("transaction_id", BigInteger, nullable=False),
    Column("reason", Text, nullable=False),
    Column("operator", String(190), nullable=False),
    Column("requested_at", DateTime(timezone=True), nullable=False),
    Column("skipped_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint(
        "cluster_name", "partition_id", "transaction_id", name="pk_waltz_skipped_transactions"
    ),
)
