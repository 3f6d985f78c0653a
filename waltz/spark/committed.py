"""The committed-read plan, importable from here as well: :mod:`waltz.committed.plan` holds it.

Source: docs/design/spark.md "Live reads through admin ports", "Offline reads from replica
directories".
"""

from __future__ import annotations

from waltz.committed.plan import (
    CommittedPartition,
    LiveReplica,
    LiveSource,
    OfflineReplica,
    OfflineSource,
    last_transaction_id,
    plan_live,
    plan_offline,
)

__all__ = [
    "CommittedPartition",
    "LiveReplica",
    "LiveSource",
    "OfflineReplica",
    "OfflineSource",
    "last_transaction_id",
    "plan_live",
    "plan_offline",
]
