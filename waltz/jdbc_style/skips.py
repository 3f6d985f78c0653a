"""The operator's records in an application database: high-water marks, and skip requests.

``waltz db marks``, ``waltz db skip`` and ``waltz db skips`` (:mod:`waltz.cli.db`) run these
functions. A skip request lets an application instance pass over the one transaction whose apply
keeps failing (docs/design/sql.md "Skipping a transaction"; ``docs/sql.md`` for the procedure).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from waltz.errors import SqlFrameworkError
from waltz.jdbc_style.binding import Bind, connection_for, transaction_for, utc
from waltz.jdbc_style.engine import refuse_async_bind
from waltz.jdbc_style.migrations_api import require_tables
from waltz.jdbc_style.schema import high_water_marks, skipped_transactions

__all__ = ["MarkRow", "SkipRefusedError", "SkipRow", "list_marks", "list_skips", "request_skip"]

logger = logging.getLogger(__name__)


class SkipRefusedError(SqlFrameworkError):
    """An operator's skip request was refused; nothing was recorded (the message says why)."""


@dataclass(frozen=True, slots=True)
class MarkRow:
    """One row of ``waltz_high_water_marks``.

    Attributes:
        cluster_name: the Waltz cluster (log) the mark belongs to.
        partition_id: the partition.
        high_water_mark: the highest transaction ID applied to this database (-1: none).
        updated_at: when it last moved (UTC), or None.
    """

    cluster_name: str
    partition_id: int
    high_water_mark: int
    updated_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class SkipRow:
    """One row of ``waltz_skipped_transactions``: an operator's skip request.

    Attributes:
        cluster_name: the Waltz cluster (log).
        partition_id: the partition.
        transaction_id: the transaction to pass over.
        reason: why the operator asked for it.
        operator: who asked.
        requested_at: when the request was recorded (UTC).
        skipped_at: when an application instance passed over the transaction (UTC); None while
            the request is pending.
    """

    cluster_name: str
    partition_id: int
    transaction_id: int
    reason: str
    operator: str
    requested_at: dt.datetime
    skipped_at: dt.datetime | None

    @property
    def pending(self) -> bool:
        """Whether no application instance has passed over the transaction yet."""
        return self.skipped_at is None


def request_skip(
    bind: Bind,
    *,
    cluster_name: str,
    partition_id: int,
    transaction_id: int,
    reason: str,
    operator: str,
) -> None:
    """Record an operator's request to pass over a transaction whose apply keeps failing.

    Only the transaction an application is stuck on can be skipped: the one right after the
    partition's high-water mark. The request is a row in ``waltz_skipped_transactions``
    (``skipped_at`` NULL); an application instance whose apply of that transaction failed moves
    the mark past it at its next attempt, without applying it, and sets ``skipped_at``. The
    transaction stays in the log: other databases that follow the log are not affected. The
    request names a transaction ID only (this function sees the database, not the log): an
    instance refuses to act on a request for a partition split's genesis and applies it as usual
    (docs/design/splits.md "The SQL framework across a split"), and on a request for a transaction
    whose apply waits for the instance's upgrade (an :class:`~waltz.errors.ApplyPausedError`,
    docs/design/sql.md "Skipping a transaction"); such a request stays pending.

    The partition's mark row is locked (``SELECT ... FOR UPDATE``) while the request is checked
    and recorded, so it cannot race with an apply.

    Args:
        bind: the application's database (see :func:`upgrade`; a connection inside a transaction
            is left for the caller to commit).
        cluster_name: the Waltz cluster (log) the application follows.
        partition_id: the partition.
        transaction_id: the stuck transaction: the partition's high-water mark + 1 (0 when the
            partition has no mark row yet).
        reason: why, for the audit trail (not blank).
        operator: who asks, for the audit trail (not blank).

    Raises:
        SkipRefusedError: a blank reason or operator; the transaction is already applied, or is
            not the next one to apply; a request for it already exists. Nothing is recorded.
        FrameworkTablesMissingError: the database has no framework tables (run :func:`upgrade`).
        AsyncEngineError: an asyncio engine, connection or URL (the message names the synchronous
            URL to give instead).
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    refuse_async_bind(bind)
    where = f"cluster {cluster_name!r} partition {partition_id}"
    if not reason.strip():
        raise SkipRefusedError(
            f"{where}: give a reason for skipping transaction {transaction_id} (it is kept for the audit)"
        )
    if not operator.strip():
        raise SkipRefusedError(f"{where}: give the operator's name (it is kept for the audit)")
    if not cluster_name:
        raise SkipRefusedError("give the cluster name (the log the application follows)")
    try:
        with transaction_for(bind) as connection:
            require_tables(connection, high_water_marks, skipped_transactions)
            mark = connection.execute(
                select(high_water_marks.c.high_water_mark)
                .where(
                    high_water_marks.c.cluster_name == cluster_name,
                    high_water_marks.c.partition_id == partition_id,
                )
                .with_for_update()
            ).scalar_one_or_none()
            _check_skippable(where, mark, transaction_id)
            existing = connection.execute(
                select(skipped_transactions).where(
                    skipped_transactions.c.cluster_name == cluster_name,
                    skipped_transactions.c.partition_id == partition_id,
                    skipped_transactions.c.transaction_id == transaction_id,
                )
            ).one_or_none()
            if existing is not None:
                raise SkipRefusedError(_already_requested(where, _skip_row(existing._mapping)))
            connection.execute(
                skipped_transactions.insert().values(
                    cluster_name=cluster_name,
                    partition_id=partition_id,
                    transaction_id=transaction_id,
                    reason=reason.strip(),
                    operator=operator.strip(),
                    requested_at=dt.datetime.now(dt.UTC),
                    skipped_at=None,
                )
            )
    except IntegrityError as exc:  # another operator recorded the same request concurrently
        raise SkipRefusedError(
            f"{where}: a skip of transaction {transaction_id} was recorded concurrently by someone "
            "else; see `waltz db skips`"
        ) from exc
    logger.warning(
        "%s: %s requested to skip transaction %d: %s", where, operator.strip(), transaction_id, reason.strip()
    )


def _check_skippable(where: str, mark: int | None, transaction_id: int) -> None:
    if mark is None:
        if transaction_id != 0:
            raise SkipRefusedError(
                f"{where} has no high-water mark row in this database: nothing was applied yet, so "
                f"only transaction 0 can be stuck, not {transaction_id}; check the cluster name and "
                "partition with `waltz db marks`"
            )
        return
    if transaction_id <= mark:
        raise SkipRefusedError(
            f"{where}: transaction {transaction_id} is already applied (high-water mark {mark}); "
            "there is nothing to skip"
        )
    if transaction_id > mark + 1:
        raise SkipRefusedError(
            f"{where}: only the next transaction to apply, {mark + 1} (the one an application is "
            f"stuck on), can be skipped, not {transaction_id}; transactions are applied in order, "
            f"so {transaction_id} has not been tried yet"
        )


def _already_requested(where: str, row: SkipRow) -> str:
    if row.skipped_at is None:
        state = "pending: it takes effect at an application's next attempt after a failed apply of it"
    else:
        state = f"skipped at {row.skipped_at.isoformat()}"
    return (
        f"{where}: a skip of transaction {row.transaction_id} was already requested by "
        f"{row.operator} at {row.requested_at.isoformat()} ({row.reason!r}); {state}"
    )


def list_marks(bind: Bind, cluster_name: str | None = None) -> list[MarkRow]:
    """The high-water marks recorded in the database.

    Args:
        bind: the database (see :func:`upgrade`).
        cluster_name: only this cluster's marks; None: every cluster's.

    Returns:
        The rows, ordered by cluster name and partition.

    Raises:
        FrameworkTablesMissingError: the database has no framework tables (run :func:`upgrade`).
        AsyncEngineError: an asyncio engine, connection or URL (the message names the synchronous
            URL to give instead).
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    refuse_async_bind(bind)
    table = high_water_marks
    query = select(table).order_by(table.c.cluster_name, table.c.partition_id)
    if cluster_name is not None:
        query = query.where(table.c.cluster_name == cluster_name)
    with connection_for(bind) as connection:
        require_tables(connection, table)
        rows = connection.execute(query).all()
    return [
        MarkRow(
            cluster_name=row.cluster_name,
            partition_id=row.partition_id,
            high_water_mark=row.high_water_mark,
            updated_at=utc(row.updated_at),
        )
        for row in rows
    ]


def list_skips(bind: Bind, cluster_name: str | None = None) -> list[SkipRow]:
    """The operators' skip requests recorded in the database (pending and done).

    Args:
        bind: the database (see :func:`upgrade`).
        cluster_name: only this cluster's requests; None: every cluster's.

    Returns:
        The rows, ordered by cluster name, partition and transaction.

    Raises:
        FrameworkTablesMissingError: the database has no framework tables (run :func:`upgrade`).
        AsyncEngineError: an asyncio engine, connection or URL (the message names the synchronous
            URL to give instead).
        sqlalchemy.exc.DBAPIError: the database could not be reached.
    """
    refuse_async_bind(bind)
    table = skipped_transactions
    query = select(table).order_by(table.c.cluster_name, table.c.partition_id, table.c.transaction_id)
    if cluster_name is not None:
        query = query.where(table.c.cluster_name == cluster_name)
    with connection_for(bind) as connection:
        require_tables(connection, table)
        rows = connection.execute(query).all()
    return [_skip_row(row._mapping) for row in rows]


def _skip_row(row: Any) -> SkipRow:
    requested_at = utc(row["requested_at"])
    assert requested_at is not None  # NOT NULL column
    return SkipRow(
        cluster_name=row["cluster_name"],
        partition_id=row["partition_id"],
        transaction_id=row["transaction_id"],
        reason=row["reason"],
        operator=row["operator"],
        requested_at=requested_at,
        skipped_at=utc(row["skipped_at"]),
    )
