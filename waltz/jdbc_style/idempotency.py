"""Idempotency keys: a request applied once even when a service submits it twice.

Source: docs/design/sql.md "Idempotency keys". A service that crashes after ``submit`` cannot know
whether its transaction was committed; when it retries the request, the log may end up holding
it twice. The key is recorded in ``waltz_idempotency_keys`` in the same database transaction as
the apply that carried it, so the second copy finds it and changes nothing. When both copies are in
one partition (the usual case: the request's entities choose the partition), every database that
follows the log makes the same choice: the first copy in log order wins. Copies in two partitions
are ordered by apply timing, which can differ between databases: keep a request's partition stable.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Connection

from waltz.jdbc_style.marks import inserted_rows_if_absent
from waltz.jdbc_style.schema import IDEMPOTENCY_KEY_LENGTH, idempotency_keys

__all__ = [
    "AppliedRequest",
    "check_idempotency_key",
    "find_idempotency_key",
    "find_idempotency_keys",
    "record_idempotency_key",
    "record_idempotency_keys",
]


@dataclass(frozen=True, slots=True)
class AppliedRequest:
    """Where a request key was first applied.

    Attributes:
        partition_id: the partition of the transaction that carried it.
        transaction_id: that transaction's ID.
    """

    partition_id: int
    transaction_id: int


def check_idempotency_key(key: str) -> None:
    """Refuse a key the keys' table cannot hold, before anything is appended or read
    (docs/design/sql.md "Idempotency keys").

    Raises:
        ValueError: ``key`` is empty or longer than ``IDEMPOTENCY_KEY_LENGTH`` (190) characters.
    """
    if not key or len(key) > IDEMPOTENCY_KEY_LENGTH:
        raise ValueError(f"an idempotency key has 1..{IDEMPOTENCY_KEY_LENGTH} characters, got {len(key)}")


def record_idempotency_key(
    conn: Connection, *, cluster_name: str, key: str, partition_id: int, transaction_id: int
) -> bool:
    """Record ``key`` as applied by this transaction, inside the caller's (apply) transaction.

    Returns:
        True when this transaction is the first to carry the key (apply it); False when an
        earlier transaction did (skip the request's changes). Idempotent for the same transaction.

    Raises:
        ValueError: the key is empty or longer than the column allows.
    """
    recorded = record_idempotency_keys(
        conn, cluster_name=cluster_name, keys=[key], partition_id=partition_id, transaction_id=transaction_id
    )
    return recorded[key]


def record_idempotency_keys(
    conn: Connection, *, cluster_name: str, keys: Sequence[str], partition_id: int, transaction_id: int
) -> dict[str, bool]:
    """:func:`record_idempotency_key` for several keys of one transaction (the members of a
    batch, docs/design/sql.md "Batched change-sets"): one insert of every key not recorded yet
    and, for the keys it did not insert (all of them where the backend cannot tell which it
    inserted: MySQL and MariaDB), one read of where each is recorded.

    Returns:
        Key -> True when this transaction is the first to carry it, False when an earlier one did.

    Raises:
        ValueError: a key is empty or longer than the column allows.
    """
    distinct = list(dict.fromkeys(keys))
    for key in distinct:
        check_idempotency_key(key)
    if not distinct:
        return {}
    now = dt.datetime.now(dt.UTC)
    inserted = inserted_rows_if_absent(
        conn,
        idempotency_keys,
        [
            {
                "cluster_name": cluster_name,
                "idempotency_key": key,
                "partition_id": partition_id,
                "transaction_id": transaction_id,
                "applied_at": now,
            }
            for key in distinct
        ],
        idempotency_keys.c.idempotency_key,
    )
    rest = distinct if inserted is None else [key for key in distinct if key not in inserted]
    # A key this very transaction recorded already counts as recorded first.
    where = find_idempotency_keys(conn, cluster_name=cluster_name, keys=rest) if rest else {}
    this = AppliedRequest(partition_id, transaction_id)
    return {key: (inserted is not None and key in inserted) or where.get(key) == this for key in distinct}


def find_idempotency_keys(
    conn: Connection, *, cluster_name: str, keys: Sequence[str]
) -> dict[str, AppliedRequest]:
    """:func:`find_idempotency_key` for several keys in one statement: key -> where it was
    applied, for the keys applied (the others are absent)."""
    distinct = list(dict.fromkeys(keys))
    for key in distinct:
        check_idempotency_key(key)
    if not distinct:
        return {}
    c = idempotency_keys.c
    rows = conn.execute(
        select(c.idempotency_key, c.partition_id, c.transaction_id).where(
            (c.cluster_name == cluster_name) & c.idempotency_key.in_(distinct)
        )
    )
    return {str(key): AppliedRequest(int(pid), int(tid)) for key, pid, tid in rows}


def find_idempotency_key(conn: Connection, *, cluster_name: str, key: str) -> AppliedRequest | None:
    """Where ``key`` was applied in this database, or None (not applied, perhaps not yet)."""
    check_idempotency_key(key)
    row = conn.execute(
        select(idempotency_keys.c.partition_id, idempotency_keys.c.transaction_id).where(
            (idempotency_keys.c.cluster_name == cluster_name) & (idempotency_keys.c.idempotency_key == key)
        )
    ).first()
    return None if row is None else AppliedRequest(int(row[0]), int(row[1]))
