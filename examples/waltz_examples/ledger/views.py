"""The ledger's views of the log for ``waltz rebuild --app waltz_examples.ledger`` (``VIEWS``).

Source: docs/design/spark.md "Computing views"; ``docs/spark.md`` ("Views"). The five entity tables replay
generically (last write per key wins, deletes remove); ``ledger_applied_transactions`` gets one row
per change-set, with the ``op`` and ``delta`` of its ``meta`` and its ``member`` (its place in a
batched transaction, 0 outside one: docs/design/sql.md "Batched change-sets"), as
``LedgerCallbacks.apply_change_set`` writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from waltz.jdbc_style.changeset import CHANGE_SET_HEADER
from waltz.spark.views import AppViews, apply_idempotency, entity_table, replay
from waltz_examples.ledger.models import (
    Account,
    Base,
    Checking,
    Savings,
    TransferIn,
    TransferOut,
    applied_transactions,
    registry,
)

__all__ = ["VIEWS", "build"]

_ENTITIES = (Account, Savings, Checking, TransferOut, TransferIn)


def build(changes: Any, log: Any) -> Mapping[str, Any]:
    """The ledger's tables from the decoded row changes and the raw log (Spark DataFrames)."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    entities = registry()
    rows = replay(apply_idempotency(changes))
    tables = {model.__tablename__: entity_table(rows, entities, model) for model in _ENTITIES}
    # One row per change-set: its row changes share its (transaction, member) and its meta; a
    # change-set without any is one row of its own (op_index -1).
    change_sets = (
        changes.where(F.col("header") == CHANGE_SET_HEADER)
        .select("partition_id", "transaction_id", "member", "meta")
        .dropDuplicates(["partition_id", "transaction_id", "member"])
    )
    applied = change_sets.select(
        F.col("partition_id").cast("int").alias("partition_id"),
        F.col("transaction_id").cast("bigint").alias("transaction_id"),
        F.substring(F.coalesce(F.get_json_object("meta", "$.op"), F.lit("?")), 1, 24).alias("op"),
        F.coalesce(F.get_json_object("meta", "$.delta").cast("bigint"), F.lit(0))
        .cast("bigint")
        .alias("delta"),
        F.col("member").cast("int").alias("member"),
    )
    tables[applied_transactions.name] = applied
    return tables


def _prepare(engine: Engine) -> None:
    # Imported here: the service's modules (the client, alembic) are the driver's, not the Spark
    # tasks' that compute these views.
    from waltz_examples.ledger.service import prepare_database

    prepare_database(engine)


#: The ledger's views (``waltz rebuild --app waltz_examples.ledger``).
VIEWS = AppViews(
    cluster_name="ledger",
    tables=[Base.metadata.tables[model.__tablename__] for model in _ENTITIES] + [applied_transactions],
    prepare=_prepare,
    build=build,
    entities=registry(),
)
