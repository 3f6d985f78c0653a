"""The counter service's view of the log for ``waltz rebuild --app waltz_examples.counter`` (``VIEWS``).

Source: docs/design/spark.md "Computing views"; ``docs/spark.md`` ("Views"). ``counters`` replays
generically (last write per key wins), with ``updated_tx`` set to the transaction that last wrote
the row, as ``CounterCallbacks.apply_change`` does (the value logged in the change-set is not used).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from waltz.jdbc_style import EntityRegistry
from waltz.jdbc_style import migrations_api as framework_migrations
from waltz.spark.decoders import DecoderRegistry
from waltz.spark.views import AppViews, apply_idempotency, entity_table, replay
from waltz_examples.counter.models import Counter, create_tables

__all__ = ["VIEWS", "build"]


def build(changes: Any, log: Any) -> Mapping[str, Any]:
    """The ``counters`` table from the decoded row changes (a Spark DataFrame)."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    rows = replay(apply_idempotency(changes))
    table = entity_table(rows, EntityRegistry([Counter]), Counter, {"updated_tx": F.col("transaction_id")})
    return {Counter.__tablename__: table}


def _prepare(engine: Engine) -> None:
    framework_migrations.upgrade(engine)
    create_tables(engine)


#: The counter service's views; transactions of other applications on the same log are skipped,
#: as ``CounterService(ignore_foreign_transactions=True)`` does.
VIEWS = AppViews(
    cluster_name="counter",
    tables=[Counter.metadata.tables[Counter.__tablename__]],
    prepare=_prepare,
    build=build,
    decoders=DecoderRegistry(on_unknown="skip"),
    entities=EntityRegistry([Counter]),
)
