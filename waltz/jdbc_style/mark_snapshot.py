"""``MarkSnapshot``: a read transaction that read its partition's high-water mark first.

Source: docs/design/sql.md "Entity transactions" (the snapshot: the mark first, then the
entities, all the state at that mark), "Reading entities outside a transaction".
"""

from __future__ import annotations

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from waltz.jdbc_style.prefetch import Prefetched

__all__ = ["MarkSnapshot"]


class MarkSnapshot:
    """A read-only database transaction that read a partition's mark first (see
    :meth:`AbstractClientCallbacksForSQL.snapshot`).

    Attributes:
        partition_id: the partition.
        high_water_mark: the partition's mark in this snapshot (-1: nothing applied).
        connection: the snapshot's connection (read through it, or through :attr:`session`).
        prefetched: rows read with the mark, ``{(entity info, key values): row or None}`` (see
            :mod:`waltz.jdbc_style.prefetch`); empty when none were asked for.
    """

    def __init__(
        self,
        partition_id: int,
        high_water_mark: int,
        connection: Connection,
        prefetched: Prefetched | None = None,
    ) -> None:
        self.partition_id = partition_id
        self.high_water_mark = high_water_mark
        self.connection = connection
        self.prefetched: Prefetched = {} if prefetched is None else prefetched
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        """An ORM session on the snapshot's connection and transaction (made when first used)."""
        if self._session is None:
            self._session = Session(bind=self.connection)
        return self._session

    def close(self) -> None:
        """Close the session, if one was made (the snapshot's owner ends the transaction)."""
        if self._session is not None:
            self._session.close()
            self._session = None
