"""``ApplySession``: the ORM session ``apply`` runs in, and the writes it stages.

Source: docs/design/sql.md "The apply contract" (the session is joined to the framework's
transaction, which ``apply`` may not end; the move of the mark leads its first statement),
"Group apply" (writes staged per statement: one ``executemany`` for a whole group).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from sqlalchemy.engine import Connection, Result
from sqlalchemy.orm import Session
from sqlalchemy.sql.base import Executable

from waltz.errors import ApplyContractError, StagedRowCountError
from waltz.jdbc_style.direct import LeadMissedError, direct_statements

__all__ = ["ApplySession"]


class _Staged:
    """The parameter sets staged for one statement, and the rows they should change in all."""

    __slots__ = ("checked", "parameters", "rows")

    def __init__(self) -> None:
        self.parameters: list[Mapping[str, Any]] = []
        self.rows = 0
        self.checked = True


class ApplySession(Session):
    """The ORM session ``apply`` receives: joined to the framework's transaction, which it may
    not end. ``commit``, ``rollback``, ``begin`` and an isolation level change raise
    :class:`ApplyContractError`;
    ``begin_nested`` (a savepoint), ``flush``, queries and ``add``/``delete`` work as usual.

    :meth:`stage` batches the writes of a group of log transactions: one ``executemany`` per
    statement for the whole group instead of a round trip per row (docs/design/sql.md "Group
    apply").

    Args:
        args: as for :class:`~sqlalchemy.orm.Session` (the framework binds it to its connection).
        lead: a statement and its one parameter set that must change exactly one row before any
            other statement of this session reaches the database: the framework's move of the
            partition's mark, which then costs no round trip of its own (docs/design/sql.md "The
            apply contract"); it runs when the staged writes first run. None: no lead.
        kwargs: as for :class:`~sqlalchemy.orm.Session`.
    """

    def __init__(
        self, *args: Any, lead: tuple[Executable, Mapping[str, Any]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._staged: dict[Executable, _Staged] = {}
        # The staged statement that last wrote each row named by ``stage(row=...)``.
        self._row_writers: dict[Hashable, Executable] = {}
        self._lead = lead  # until it runs
        self._lead_moved = False
        self.grouped = False
        """True while the session applies a group of more than one log transaction."""
        self.alone = False
        """True while the session applies one log transaction again on its own, after a first
        try (with staged writes, or in a group) failed: write each change at once rather than
        staging it, so that a failure names the change (``ChangeSetCallbacks`` does)."""

    @property
    def lead_moved(self) -> bool:
        """True once the ``lead`` given to the constructor ran and changed its one row (False
        without a lead, or before it ran)."""
        return self._lead_moved

    def stage(
        self,
        statement: Executable,
        parameters: Mapping[str, Any],
        *,
        rows: int | None = None,
        row: Hashable | None = None,
    ) -> None:
        """Run ``statement`` with ``parameters`` later, with every other parameter set staged for it.

        The staged writes of an apply (of a whole group, in group apply) run when ``apply``
        returns, or before the next statement, query or flush of this session, so reads see
        them: one ``executemany`` per statement, the statements in the order each was first
        staged (on PostgreSQL with psycopg and MariaDB with PyMySQL on the driver's cursor, all
        of them in one pipeline on psycopg; elsewhere through SQLAlchemy, its insertmanyvalues
        for an ``INSERT``).
        So the writes of different statements are reordered within a group: stage only writes
        whose effects do not depend on that order (increments, inserts of distinct keys, updates
        of distinct rows), or name the row each writes (``row``); run the others with
        :meth:`execute`. Build each statement once (a module constant with
        :func:`~sqlalchemy.sql.expression.bindparam` placeholders), so that it is compiled once
        and the parameter sets of a group share it.

        Args:
            statement: an ``INSERT``, ``UPDATE`` or ``DELETE`` (Core), the same object each time.
            parameters: one parameter set (bind parameter or column name -> value).
            rows: the rows this parameter set must change (e.g. 1 for an update by primary key);
                when every parameter set of the statement gives it, their sum is checked against
                the rows the statement changed.
            row: the one row this parameter set writes (any hashable naming it, e.g. the table
                and the primary key values), or None. When a statement staged before the one that
                last wrote that row writes it again, the staged writes run first, so that the
                writes of one row keep the order they were staged in.

        Raises:
            ApplyContractError: called inside a savepoint (``begin_nested``), whose rollback could
                not take back writes that have not run yet; execute them instead.
            StagedRowCountError: (when the staged writes run) the statement changed another
                number of rows than its parameter sets said.
        """
        if self.in_nested_transaction():
            raise ApplyContractError(
                "apply() must not stage writes inside a savepoint (begin_nested): they run later, "
                "outside it, where its rollback cannot take them back; execute them instead"
            )
        if row is not None:
            writer = self._row_writers.get(row)
            if writer is not None and writer is not statement and statement in self._staged:
                # The statements run in the order each was first staged: this one would run
                # before the write of the same row that was staged before it.
                staged_order = list(self._staged)
                if staged_order.index(statement) < staged_order.index(writer):
                    self.flush_staged()
            self._row_writers[row] = statement
        staged = self._staged.get(statement)
        if staged is None:
            staged = self._staged[statement] = _Staged()
        staged.parameters.append(parameters)
        if rows is None:
            staged.checked = False
        else:
            staged.rows += rows

    def flush_staged(self) -> None:
        """Run the staged writes now (see :meth:`stage`).

        Raises:
            StagedRowCountError: a statement changed another number of rows than staged.
            LeadMissedError: the framework's move of the mark, which goes first, changed no row (the
                framework rolls the transaction back and reads the mark).
        """
        if not self._staged and self._lead is None:
            return
        staged, self._staged = self._staged, {}
        lead, self._lead = self._lead, None
        self._row_writers = {}
        connection = super().connection()
        direct = direct_statements(connection.engine)
        batches = [(statement, batch.parameters) for statement, batch in staged.items()]
        rowcounts: list[int] | None = None
        if lead is not None:
            # One pipeline for the transaction's BEGIN, the lead and the writes where the driver
            # has them; else the lead alone first, so that nothing else runs when it misses. (A
            # pipeline of BEGIN and the lead alone measured slower than the two round trips.)
            rowcounts = direct.execute_led(connection, lead, batches, begin=True) if batches else None
            if rowcounts is None:
                moved = direct.run(connection, lead[0], (lead[1],))
                if moved != 1:
                    raise LeadMissedError(moved)
            self._lead_moved = True
        if batches and rowcounts is None:
            rowcounts = direct.execute_all(connection, batches)
        for index, (statement, batch) in enumerate(staged.items()):
            if rowcounts is None:  # not all of them qualify: one at a time, each its own way
                rowcount = direct.run(connection, statement, batch.parameters)
            else:
                rowcount = rowcounts[index]
            if batch.checked and rowcount >= 0 and rowcount != batch.rows:
                raise StagedRowCountError(statement, len(batch.parameters), batch.rows, rowcount)

    def execute(self, *args: Any, **kwargs: Any) -> Result[Any]:
        self.flush_staged()  # the staged writes come before this statement
        return super().execute(*args, **kwargs)

    def scalar(self, *args: Any, **kwargs: Any) -> Any:
        self.flush_staged()  # the staged writes come before this statement
        return super().scalar(*args, **kwargs)

    def scalars(self, *args: Any, **kwargs: Any) -> Any:
        self.flush_staged()  # the staged writes come before this statement
        return super().scalars(*args, **kwargs)

    def flush(self, objects: Any = None) -> None:
        self.flush_staged()  # the staged writes come before this statement
        super().flush(objects)

    def commit(self) -> None:
        raise ApplyContractError(
            "apply() must not commit: the framework commits the apply and the high-water mark "
            "together when apply() returns"
        )

    def rollback(self) -> None:
        raise ApplyContractError(
            "apply() must not roll back: raise an exception instead, and the framework rolls back "
            "the apply and leaves the high-water mark where it was"
        )

    def connection(self, *args: Any, **kwargs: Any) -> Connection:
        options = kwargs.get("execution_options") or {}
        if "isolation_level" in options:
            raise ApplyContractError(
                f"apply() must not change the isolation level (to {options['isolation_level']!r}): "
                "the framework's transaction is already running"
            )
        self.flush_staged()  # a statement on the connection comes after the staged writes
        return super().connection(*args, **kwargs)

    def begin(self, nested: bool = False) -> Any:
        self.flush_staged()  # the writes staged before a savepoint are not the savepoint's
        if not nested:
            raise ApplyContractError(
                "apply() must not begin a transaction: it already runs in the framework's; use "
                "session.begin_nested() for a savepoint"
            )
        return super().begin(nested=True)
