"""``AbstractClientCallbacksForSQL``: exactly-once apply of the log into a SQLAlchemy database.

Source: docs/design/sql.md "What the framework guarantees" (the database is a materialized view of
the log, applied in log order), "The high-water-mark table" (the database stores its high-water
mark), "The apply contract", "Exactly-once across instances"; docs/design/client.md "Transaction
contexts and callbacks". It is the SQLAlchemy successor of upstream Waltz's
``AbstractClientCallbacksForJDBC``.

Several application instances may share one database; each receives every transaction of the
partitions it mounts. One database transaction applies a log transaction (or a run of them) and
moves the partition's high-water mark, after locking the mark row:

- mark = id − 1: ``apply(transaction, session)``, then mark = id, commit;
- mark ≥ id: another instance applied it already: skip;
- mark < id − 1: a gap (:class:`HighWaterMarkGapError`), never skipped.

Deadlocks, serialization failures, lock wait timeouts and lost connections are retried with
exponential backoff (tenacity); any other error rolls the transaction back and is raised to the
client, which reports it to :meth:`uncaught_exception` and retries the same transaction later
without moving the mark. A transaction whose apply keeps failing can be skipped only by an
operator (``waltz db skip``), audited in ``waltz_skipped_transactions``, by an instance whose
last attempt failed on that very transaction (docs/design/sql.md "Skipping a transaction"), but
never a partition split's genesis (docs/design/splits.md "The SQL framework across a split") nor a
transaction that waits for the instance's upgrade (an :class:`~waltz.errors.ApplyPausedError`;
docs/design/sql.md "Schema versions and upcasting"): the instance that would act on the request
holds the transaction, refuses the skip and tries the apply as usual; the request stays pending.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import tenacity
from sqlalchemy import Engine, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from waltz.client.callbacks import WaltzClientCallbacks
from waltz.client.outcome import waited_transaction_id
from waltz.client.transaction import Transaction
from waltz.errors import (
    ApplyContractError,
    ApplyPausedError,
    GenesisHeldError,
    HighWaterMarkGapError,
    SplitRecordFormatError,
    StagedRowCountError,
    TransactionApplyError,
)
from waltz.jdbc_style.apply_session import ApplySession
from waltz.jdbc_style.direct import direct_statements
from waltz.jdbc_style.engine import SQLITE_BEGIN, apply_guard, is_transient, prepare_engine
from waltz.jdbc_style.entities import EntityInfo
from waltz.jdbc_style.idempotency import AppliedRequest, find_idempotency_key, record_idempotency_key
from waltz.jdbc_style.kept_connections import IdleBudget, KeptConnections
from waltz.jdbc_style.mark_snapshot import MarkReader, MarkSnapshot
from waltz.jdbc_style.marks import HighWaterMarks
from waltz.jdbc_style.schema import skipped_transactions
from waltz.protocol.split_records import (
    SPLIT_RECORD_HEADER,
    SplitGenesis,
    decode_split_record,
    opening_genesis,
)

__all__ = ["AbstractClientCallbacksForSQL", "ApplySession", "MarkSnapshot"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Failure(NamedTuple):
    """A partition's last failed apply attempt here: ``transaction_id`` is the transaction whose
    own apply failed, or None when the attempt was a group whose failure names none of them (the
    one-by-one retry that follows finds it); only that transaction can be skipped on an
    operator's request. ``paused``: the error, when it was an :class:`ApplyPausedError` (the
    transaction waits for this instance's upgrade and is never skipped), else None."""

    transaction_id: int | None
    paused: str | None = None


class _UnsettledError(Exception):
    """An apply whose mark was to move with its first statement did not get there: the move
    missed (another instance moved the mark), or the apply failed before it; rolled back."""


class AbstractClientCallbacksForSQL(WaltzClientCallbacks):
    """Waltz client callbacks that apply transactions to a SQLAlchemy database exactly once.

    Subclasses implement :meth:`apply` (and :meth:`uncaught_exception`). Give one instance to a
    :class:`~waltz.client.client.WaltzClient`; the framework's tables must exist (``waltz db
    upgrade --url ...``).

    Args:
        engine: the application database (SQLite, PostgreSQL or MySQL/MariaDB); prepared with
            :func:`~waltz.jdbc_style.engine.prepare_engine`.
        cluster_name: the name of the log this database follows (the key of its mark rows); one
            database can follow several clusters under different names.
        retry_timeout: seconds a transient database error (deadlock, serialization failure, lost
            connection) is retried before it is raised to the client (which retries later).
        check_schema: check at construction that the framework's tables are at the latest
            migration (raises ``FrameworkTablesMissingError`` with the command to run).
        version_table: the table that records the framework's revision for that check: its own
            ``waltz_alembic_version``, or the application's ``alembic_version`` when the
            application adopted the framework's revisions as a branch of its own history
            (docs/design/sql.md "Migrations").

    Raises:
        ValueError: ``cluster_name`` is empty or too long.
    """

    #: Nearly every apply reads its transaction's data: fetch a batch's data at once.
    prefetch_transaction_data = True

    #: Whether :meth:`apply` is given the records of a partition split (header
    #: :data:`~waltz.protocol.split_records.SPLIT_RECORD_HEADER`). False: the framework passes
    #: them over, and the partition's mark moves past them in the same database transaction, as
    #: for any transaction (docs/design/splits.md "The SQL framework across a split"); an
    #: application's own data never carries that header, since servers refuse it from clients.
    #: The change-set callbacks take them (their entity cache follows a barrier and a genesis).
    applies_split_records: bool = False

    #: Threads the ``await`` twins (``find_idempotency_key_async``, ``read_entities_async``, the
    #: database reads of ``wait_for_async``) run their database work on, at most: the framework's
    #: own bounded executor (docs/design/sql.md "The SQL framework on asyncio").
    async_threads: int = 8

    def __init__(
        self,
        engine: Engine,
        *,
        cluster_name: str,
        retry_timeout: float = 60.0,
        check_schema: bool = True,
        version_table: str = "waltz_alembic_version",
    ) -> None:
        from waltz.jdbc_style.schema import CLUSTER_NAME_LENGTH

        if not cluster_name or len(cluster_name) > CLUSTER_NAME_LENGTH:
            raise ValueError(
                f"cluster_name must have 1..{CLUSTER_NAME_LENGTH} characters, got {cluster_name!r}"
            )
        self.engine = prepare_engine(engine)
        self.cluster_name = cluster_name
        self.marks = HighWaterMarks(cluster_name)
        self.retry_timeout = retry_timeout
        self._retrying = threading.local()  # each thread's idle tenacity.Retrying (see _retry)
        self._applied: dict[int, int] = {}
        self._applied_changed = threading.Condition()
        # Partitions whose last apply attempt here failed: which transaction failed (see _Failure).
        self._failing: dict[int, _Failure] = {}
        self._refusals_logged: dict[int, int] = {}  # partition: the paused skip refusal last logged
        self._rows: set[int] = set()  # partitions whose mark row is known to exist
        self._shared: set[int] = set()  # partitions another instance was seen applying
        budget = IdleBudget(self.engine)
        self._reads = MarkReader(self.engine, self.marks, budget)  # snapshots, marks
        self._appliers = KeptConnections(self.engine, None, budget)  # apply transactions
        self.skipped: list[tuple[int, int]] = []
        """(partition, transaction) pairs this instance skipped on an operator's request."""
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        # Coroutines of wait_for_async waiting for this instance's applies: partition -> their
        # (loop, event) pairs, set when the partition's mark moves here.
        self._async_waiters: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        if check_schema:
            from waltz.jdbc_style.migrations_api import check_current

            check_current(self.engine, version_table=version_table)

    # --- what subclasses implement ----------------------------------------------------------------

    @abc.abstractmethod
    def apply(self, transaction: Transaction, session: Session) -> None:
        """Apply one committed transaction to the database through ``session``.

        Runs inside the framework's database transaction, after the partition's mark row was
        locked and found at ``transaction.transaction_id - 1``; the framework flushes the session,
        moves the mark and commits when it returns. Must be deterministic (every database that
        follows the log applies the same transactions in the same order).

        Args:
            transaction: the committed transaction (its data via ``transaction.get_data(...)``).
            session: an :class:`ApplySession` on the framework's connection.

        Raises:
            Exception: rolls back the apply; the mark stays; the client reports the exception to
                :meth:`uncaught_exception` and retries the same transaction after a backoff.
            ApplyContractError: raised to ``apply`` itself if it commits, rolls back, begins or
                changes the isolation level.
        """

    # --- WaltzClientCallbacks ---------------------------------------------------------------------

    def get_client_high_water_mark(self, partition_id: int) -> int:
        """The partition's mark in this database (-1: none applied); creates a missing row.

        Row creation is race-free: another instance may create it at the same moment.
        """

        def read() -> int:
            with self.engine.connect() as conn:
                mark = self.marks.read(conn, partition_id)
                conn.rollback()
                if mark is None:
                    # Create it in a write transaction of its own (SQLite: BEGIN IMMEDIATE, which
                    # waits for another writer instead of failing the insert at once).
                    conn.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
                    with conn.begin():
                        self.marks.ensure(conn, partition_id)
                        mark = self.marks.read(conn, partition_id)
                return -1 if mark is None else int(mark)

        mark = self._retry(read)
        self._rows.add(partition_id)
        self._note_applied(partition_id, mark)
        return mark

    def apply_transaction(self, transaction: Transaction) -> None:
        """Apply one transaction exactly once (see the module docstring).

        When the first try fails with a database error that is not transient or a staged row
        count (the staged writes may have run in another order than ``apply`` gave them), the
        transaction is applied again with :attr:`ApplySession.alone` set.

        Raises:
            HighWaterMarkGapError: the database's mark is below ``transaction_id - 1``.
            Exception: what ``apply`` raised (after rollback), or a database error that retries
                did not cure within ``retry_timeout``.
        """
        try:
            self._retry(lambda: self._apply_batch([transaction]))
        except (StagedRowCountError, DBAPIError) as exc:
            if is_transient(exc):
                raise  # the retries ran out: alone would not help
            log.info(
                "partition %d: transaction %d failed (%r); applying it again alone",
                transaction.partition_id,
                transaction.transaction_id,
                exc,
            )
            self._retry(lambda: self._apply_batch([transaction], alone=True))

    def apply_transactions(self, transactions: Sequence[Transaction]) -> None:
        """Group apply: consecutive transactions of one partition in one database transaction.

        Those at or below the locked mark are skipped (another instance applied them; a batch it
        applied in part is finished here, never skipped), the rest applied in order, and the mark
        set to the last. When the group fails for a reason other than a transient database
        error, the transactions are applied one database transaction each, so those before the
        failing one are kept and the failure names its transaction.

        Raises:
            TransactionApplyError: applying ``transaction_id`` failed (the cause is chained).
            HighWaterMarkGapError: see :meth:`apply_transaction`.
        """
        if not transactions:
            return
        if len(transactions) == 1:
            self.apply_transaction(transactions[0])
            return
        try:
            self._retry(lambda: self._apply_batch(transactions))
            return
        except HighWaterMarkGapError:
            raise
        except Exception as exc:
            log.info(
                "partition %d: group apply of transactions %d..%d failed (%r); applying them one by one",
                transactions[0].partition_id,
                transactions[0].transaction_id,
                transactions[-1].transaction_id,
                exc,
            )
        for transaction in transactions:
            try:
                self.apply_transaction(transaction)
            except HighWaterMarkGapError:
                raise
            except Exception as exc:
                raise TransactionApplyError(
                    transaction.partition_id, transaction.transaction_id, exc
                ) from exc

    # --- read-your-writes -------------------------------------------------------------------------

    def wait_for(self, partition_id: int, transaction_id: int, timeout: float | None = None) -> bool:
        """Block until this database has applied ``transaction_id`` of the partition.

        Use it with the ID from ``submit``'s future for read-your-writes. Another instance may
        apply it: the database's mark is polled (every 10 ms at first, backing off to 0.5 s) as
        well as this instance's own applies.

        Args:
            partition_id: the partition.
            transaction_id: the transaction's ID.
            timeout: seconds to wait at most (None: no limit).

        Returns:
            True once applied, False when ``timeout`` passed first.

        Raises:
            TypeError: ``transaction_id`` is not an ``int`` (None: the outcome did not commit).
        """
        transaction_id = waited_transaction_id(transaction_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.01
        next_poll = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_poll:  # the database, for other instances' applies (on a schedule)
                mark = self._retry(lambda: self._reads.read_mark(partition_id))
                if mark >= transaction_id:
                    self._note_applied(partition_id, mark)
                    return True
                next_poll = time.monotonic() + pause
                pause = min(0.5, pause * 2)
            with self._applied_changed:  # this instance's own applies wake us at once
                while self._applied.get(partition_id, -1) < transaction_id:
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        return False
                    wake = next_poll if deadline is None else min(next_poll, deadline)
                    if now >= wake:
                        break
                    self._applied_changed.wait(wake - now)
                else:
                    return True

    async def wait_for_async(
        self, partition_id: int, transaction_id: int, timeout: float | None = None
    ) -> bool:
        """The ``await`` twin of :meth:`wait_for`: the database's mark is read on the framework's
        threads (on the same schedule), this instance's own applies wake the coroutine at once;
        the event loop never blocks.

        Returns:
            True once applied, False when ``timeout`` seconds passed first.

        Raises:
            TypeError: ``transaction_id`` is not an ``int`` (None: the outcome did not commit).
        """
        transaction_id = waited_transaction_id(transaction_id)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        pause = 0.01
        next_poll = loop.time()
        while True:
            if loop.time() >= next_poll:  # the database, for other instances' applies
                mark = await self.run_in_executor(self._retry, lambda: self._reads.read_mark(partition_id))
                if mark >= transaction_id:
                    self._note_applied(partition_id, mark)
                    return True
                next_poll = loop.time() + pause
                pause = min(0.5, pause * 2)
            event = asyncio.Event()
            waiter = (loop, event)
            with self._applied_changed:
                if self._applied.get(partition_id, -1) >= transaction_id:
                    return True
                self._async_waiters.setdefault(partition_id, set()).add(waiter)
            try:
                now = loop.time()
                if deadline is not None and now >= deadline:
                    return False
                wake = next_poll if deadline is None else min(next_poll, deadline)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), max(0.0, wake - now))
            finally:
                with self._applied_changed:
                    self._async_waiters.get(partition_id, set()).discard(waiter)

    async def run_in_executor(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the framework's bounded executor (:attr:`async_threads` threads),
        awaited: how the ``await`` twins keep database work off the event loop."""
        with self._executor_lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self.async_threads, thread_name_prefix="waltz-sql-async"
                )
            executor = self._executor
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    def high_water_marks(self) -> dict[int, int]:
        """Every partition's mark in this database: ``{partition_id: high_water_mark}``."""

        def read() -> dict[int, int]:
            with self.engine.connect() as conn:
                return self.marks.read_all(conn)

        return self._retry(read)

    # --- idempotency keys --------------------------------------------------------------------------

    def record_idempotency_key(self, session: Session, key: str, transaction: Transaction) -> bool:
        """Record a request key with the apply in progress (for command-style ``apply`` too).

        Returns:
            True when this transaction is the first to carry ``key`` (apply it), False when an
            earlier one did (skip its changes).
        """
        return record_idempotency_key(
            session.connection(),
            cluster_name=self.cluster_name,
            key=key,
            partition_id=transaction.partition_id,
            transaction_id=transaction.transaction_id,
        )

    def find_idempotency_key(self, key: str) -> AppliedRequest | None:
        """Where request ``key`` was applied in this database, or None (not applied yet)."""
        with self.engine.connect() as conn:
            return find_idempotency_key(conn, cluster_name=self.cluster_name, key=key)

    async def find_idempotency_key_async(self, key: str) -> AppliedRequest | None:
        """The ``await`` twin of :meth:`find_idempotency_key` (read on the framework's threads)."""
        return await self.run_in_executor(self.find_idempotency_key, key)

    # --- snapshots for entity reads ---------------------------------------------------------------

    @contextmanager
    def snapshot(
        self, partition_id: int, *, entities: Sequence[tuple[EntityInfo, tuple[Any, ...]]] = ()
    ) -> Iterator[MarkSnapshot]:
        """A read transaction that reads the partition's mark first, then whatever the caller reads.

        REPEATABLE READ on PostgreSQL and MySQL/MariaDB, a deferred transaction on SQLite (a
        snapshot from the first read in WAL mode): everything read in it is the state at the
        mark, even when other instances apply transactions meanwhile. The transaction is rolled
        back at the end (it only reads). On a database server the connection is one of the
        instance's reader connections (see :meth:`release_connections`); a transient error
        opening the snapshot (a connection the server closed) is retried on a new connection.

        Args:
            partition_id: the partition.
            entities: (entity info, key values) pairs read in the mark's statement (one
                statement, so at the mark too) into :attr:`MarkSnapshot.prefetched`.
        """
        snapshot = self._retry(lambda: self._reads.open(partition_id, entities))
        try:
            yield snapshot
        finally:
            self._reads.end(snapshot)

    def release_connections(self) -> None:
        """Close the idle connections this instance keeps (the client calls it when it closes;
        the callbacks stay usable and open new ones when needed). Idempotent.

        On a database server, snapshots, mark reads and applies reuse a few connections kept
        out of the engine's pool: no pre-ping, reset or isolation change per use. SQLite takes
        a connection from the pool each time. The threads of the ``await`` twins
        (:meth:`run_in_executor`) end too, once their work is done; the next twin starts new ones.
        """
        self._reads.close()
        self._appliers.close()
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is not None:  # its threads end once their work is done
            executor.shutdown(wait=False)

    def client_closed(self) -> None:
        """A client using these callbacks closed: release the idle connections they keep."""
        self.release_connections()

    # --- internals ---------------------------------------------------------------------------------

    def _retry(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried on transient database errors for up to :attr:`retry_timeout` seconds.

        A ``tenacity.Retrying`` that has run holds a reference cycle (its per-thread state keeps
        its own bound methods): one per call would leave a dozen objects per apply to the
        garbage collector, whose collections then pause the process. Each thread reuses one
        instead (tenacity keeps a call's state per thread); a nested call on the same thread
        takes a new one.
        """
        local = self._retrying
        timeout = self.retry_timeout
        retrying: tenacity.Retrying | None = getattr(local, "idle", None)
        if retrying is None or local.timeout != timeout:
            retrying = tenacity.Retrying(
                retry=tenacity.retry_if_exception(is_transient),
                wait=tenacity.wait_random_exponential(multiplier=0.02, max=2.0),
                stop=tenacity.stop_after_delay(timeout),
                reraise=True,
                before_sleep=_log_retry,
            )
        local.idle = None  # in use: a nested call on this thread takes a new one
        try:
            return retrying(fn)
        finally:
            local.idle, local.timeout = retrying, timeout

    def _note_applied(self, partition_id: int, mark: int) -> None:
        with self._applied_changed:
            if mark > self._applied.get(partition_id, -1):
                self._applied[partition_id] = mark
                self._applied_changed.notify_all()
                waiters = list(self._async_waiters.get(partition_id, ()))
            else:
                waiters = []
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits any more
                loop.call_soon_threadsafe(event.set)

    def _apply_batch(self, transactions: Sequence[Transaction], *, alone: bool = False) -> None:
        partition_id = transactions[0].partition_id
        if partition_id not in self._rows:
            # Create a missing mark row in a transaction of its own: locking a row that does not
            # exist takes gap locks on MySQL/MariaDB, which would serialise unrelated partitions.
            self.get_client_high_water_mark(partition_id)
        genesis = _genesis_opening(transactions[0])
        if genesis is not None:
            # A new child's log starts with its genesis: applied in a database transaction of its
            # own, with the parent's condition; the rest as usual.
            self._apply_genesis(transactions[0], genesis)
            if len(transactions) > 1:
                self._apply_batch(transactions[1:], alone=alone)
            return
        last = transactions[-1].transaction_id
        with self._applied_changed:
            known = self._applied.get(partition_id, -1)
        if known >= last:
            self._after_apply(partition_id, (), known)
            return  # applied already (marks never go down)
        if partition_id in self._shared and self._appliers.per_use:
            # SQLite: other instances apply this partition too, and a plain read tells whether
            # this batch is theirs already without taking the database's write lock. A server
            # locks only the mark row: the attempt to move it waits for the instance applying the
            # batch and then finds it moved, which costs no more than this read (measured: the
            # read found the batch applied in one case of five under the live SmallBank mix).
            mark = self._reads.read_mark(partition_id)
            if mark >= last:
                try:
                    self._after_apply(partition_id, (), mark)
                finally:
                    self._note_applied(partition_id, mark)
                return
        new_mark, applied = self._on_applier(
            partition_id, lambda conn: self._apply_locked(conn, partition_id, transactions, alone)
        )
        self._announce(partition_id, applied, new_mark)

    def _on_applier(
        self, partition_id: int, apply: Callable[[Connection], tuple[int, Sequence[Transaction]]]
    ) -> tuple[int, Sequence[Transaction]]:
        """``apply`` on an apply connection (SQLite: ``BEGIN IMMEDIATE``), given back when it
        returns, closed (and invalidated after an :class:`ApplyContractError`) when it raises."""
        conn = self._appliers.take()
        try:
            conn.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
            result = apply(conn)
        except ApplyContractError:
            # The guard may have interrupted a commit half-way: never reuse that DBAPI connection.
            conn.invalidate()
            conn.close()
            self._apply_failed(partition_id)
            raise
        except BaseException:
            conn.close()
            self._apply_failed(partition_id)
            raise
        self._appliers.give_back(conn)
        self._failing.pop(partition_id, None)
        return result

    def _announce(self, partition_id: int, applied: Sequence[Transaction], new_mark: int) -> None:
        """The entity cache follows first, so that whoever waits for the mark finds it settled; the
        mark is announced whatever happens there (the database holds it)."""
        try:
            self._after_apply(partition_id, applied, new_mark)
        finally:
            self._note_applied(partition_id, new_mark)

    def _apply_genesis(self, transaction: Transaction, genesis: SplitGenesis) -> None:
        """Apply a new child's genesis (docs/design/splits.md "The SQL framework across a split"):
        in one database transaction, lock the child's mark row (at -1, no row yet, or at the
        floor ``B(p)``), read the parent's mark, and only if it is at least ``B(p)`` apply the
        genesis and move the child's mark to ``B(p) + 1``. A mark at or past the genesis: another
        instance applied it.

        Raises:
            GenesisHeldError: the parent's mark is below ``B(p)``; nothing changed.
            HighWaterMarkGapError: the child's mark is neither -1, ``B(p)`` nor past the genesis.
        """
        partition_id, transaction_id = transaction.partition_id, transaction.transaction_id

        def apply(conn: Connection) -> tuple[int, Sequence[Transaction]]:
            with conn.begin():
                mark = self.marks.lock(conn, partition_id)
                if mark >= transaction_id:
                    return mark, ()
                if mark not in (-1, genesis.barrier):
                    raise HighWaterMarkGapError(self.cluster_name, partition_id, mark, transaction_id)
                parent_mark = self.marks.read(conn, genesis.parent)
                parent_mark = -1 if parent_mark is None else parent_mark
                if parent_mark < genesis.barrier:
                    raise GenesisHeldError(
                        self.cluster_name, partition_id, genesis.parent, genesis.barrier, parent_mark
                    )
                self._run_apply(conn, [transaction], set(), True)
                self.marks.advance(conn, partition_id, mark, transaction_id)
                return transaction_id, (transaction,)

        new_mark, applied = self._on_applier(partition_id, apply)
        if applied:
            log.info(
                "cluster %r partition %d: applied its genesis at %d (partition %d applied up to its "
                "barrier %d here)",
                self.cluster_name,
                partition_id,
                transaction_id,
                genesis.parent,
                genesis.barrier,
            )
        self._announce(partition_id, applied, new_mark)

    def _after_apply(self, partition_id: int, applied: Sequence[Transaction], mark: int) -> None:
        """Called on the apply thread after a group is known applied and the database's mark is
        ``mark``: ``applied`` are the transactions this instance's committed database transaction
        applied, in order, ending at ``mark`` (empty: none, or not all of them by :meth:`apply`,
        e.g. an operator's skip). The entity cache follows the applies here."""

    def _apply_failed(self, partition_id: int) -> None:
        """Called on the apply thread when a group's database transaction failed (it is retried)."""

    def wait_applied_here(self, partition_id: int, mark: int, timeout: float = 5.0) -> bool:
        """Wait until this instance knows the partition applied up to ``mark`` in this database
        (its own applies, or marks it read), at most ``timeout`` seconds; not while the partition's
        apply is failing. Returns whether it got there."""
        deadline = time.monotonic() + timeout
        with self._applied_changed:
            while self._applied.get(partition_id, -1) < mark:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or partition_id in self._failing:
                    return False
                self._applied_changed.wait(remaining)
        return True

    def _apply_locked(
        self, conn: Connection, partition_id: int, transactions: Sequence[Transaction], alone: bool
    ) -> tuple[int, Sequence[Transaction]]:
        """Apply the group in one database transaction: ``(the mark after it, the transactions
        applied by this call, all by :meth:`apply`, or empty)``; ``alone``: see
        :attr:`ApplySession.alone`."""
        first, last = transactions[0].transaction_id, transactions[-1].transaction_id
        missed = False
        if partition_id not in self._failing and partition_id not in self._shared:
            # The usual case of a partition no other instance was seen applying: the move of the
            # mark goes with the apply's first statement (with its staged writes, in one pipeline
            # on psycopg), and a move that misses rolls everything back.
            try:
                with conn.begin():
                    self._run_apply(conn, transactions, set(), alone, mark=(first - 1, last))
                return last, transactions
            except _UnsettledError:
                missed = True  # rolled back: decided below, with the mark read or locked
            finally:
                # The lead's pipeline may have begun the transaction itself (psycopg).
                direct_statements(conn.engine).end_pipelined_begin(conn)
        with conn.begin():
            if (
                not missed
                and partition_id not in self._failing
                and self.marks.try_advance(conn, partition_id, first - 1, last)
            ):
                # A partition that other instances apply too: the mark moved first, in one
                # statement (the row held the mark right before the group; it is locked and
                # moved, and rolls back with the apply if the apply fails), before the apply's
                # work, which the loser of a race would do for nothing.
                self._run_apply(conn, transactions, set(), alone)
                return last, transactions
            if partition_id not in self._failing:
                # Another instance moved the row (the usual loser of a race): a plain read says
                # whether it applied the whole group, and the transaction ends at once instead of
                # locking the row for reading (PostgreSQL takes no lock for the UPDATE that
                # matched nothing; InnoDB keeps one until this commit, which follows at once).
                # Marks never go down, so a stale read can only send this to the locking path.
                mark = self.marks.read(conn, partition_id)
                if mark is not None and mark >= last:
                    self._shared.add(partition_id)
                    return mark, ()
            mark = self.marks.lock(conn, partition_id)
            pending = [t for t in transactions if t.transaction_id > mark]
            if len(pending) < len(transactions):
                self._shared.add(partition_id)  # another instance applied some: read first next time
            if not pending:
                log.debug(
                    "partition %d: transactions up to %d applied by another instance; skipped",
                    partition_id,
                    transactions[-1].transaction_id,
                )
                new_mark = mark
                applied: Sequence[Transaction] = ()
            else:
                first = pending[0].transaction_id
                if first != mark + 1:
                    raise HighWaterMarkGapError(self.cluster_name, partition_id, mark, first)
                skips = self._operator_skips(conn, partition_id, first)
                self._run_apply(conn, pending, skips, alone)
                new_mark = pending[-1].transaction_id
                self.marks.advance(conn, partition_id, mark, new_mark)
                # Not all by this apply: some by another instance, or an operator's skips.
                applied = () if skips or len(pending) < len(transactions) else pending
        return new_mark, applied

    def _run_apply(
        self,
        conn: Connection,
        pending: Sequence[Transaction],
        skips: set[int],
        alone: bool,
        mark: tuple[int, int] | None = None,
    ) -> None:
        """Apply ``pending`` (but ``skips``) through one :class:`ApplySession` and flush it.

        ``mark``: ``(expected, new)`` to move the partition's mark from ``expected`` to ``new``
        before any statement of the apply reaches the database (the session's lead). None: the
        caller moved it.

        Raises:
            _UnsettledError: with ``mark``, the row did not hold ``expected``, or the apply failed
                before the move was known (it may be another instance's to apply): the caller
                rolls back and decides with the mark read first.
            Exception: what the apply raised otherwise.
        """
        lead = None if mark is None else self.marks.advance_statement(pending[0].partition_id, *mark)
        session = ApplySession(bind=conn, lead=lead)
        session.grouped = len(pending) > 1
        session.alone = alone
        current: Transaction | None = None  # whose apply runs (None: after them, the flush)
        try:
            with apply_guard(conn):
                for transaction in pending:
                    current = transaction
                    if transaction.transaction_id in skips:
                        refusal = _skip_refusal(transaction)
                        if refusal is None:
                            self._record_skip(conn, transaction)
                            continue
                        log.warning("cluster %r: %s", self.cluster_name, refusal)
                    if transaction.header == SPLIT_RECORD_HEADER and not self.applies_split_records:
                        continue  # changes no row of the application; the mark moves past it
                    self.apply(transaction, session)
                current = None
                session.flush()  # the staged writes too
                if mark is not None and not session.lead_moved:
                    # The move failed inside apply(), which caught the error: nothing may commit.
                    raise _UnsettledError("the mark's move failed inside apply()")
        except BaseException as exc:
            if (
                mark is not None
                and not session.lead_moved
                and isinstance(exc, Exception)
                and not isinstance(exc, (_UnsettledError, ApplyContractError))
                and not is_transient(exc)  # a lead that missed (LeadMissedError) is not transient
            ):
                raise _UnsettledError(str(exc)) from exc
            if not (is_transient(exc) or isinstance(exc, _UnsettledError)):
                # The failure is that transaction's own when it was the only one of the attempt,
                # or the first of a group and failed in its apply; a later one's apply (or the
                # group's flush) may have run writes staged by those before it: unknown.
                own = len(pending) == 1 or (current is not None and current is pending[0])
                self._failing[pending[0].partition_id] = _Failure(
                    pending[0].transaction_id if own else None,
                    f"{type(exc).__name__}: {exc}" if isinstance(exc, ApplyPausedError) else None,
                )
            raise
        finally:
            if not conn.invalidated:
                Session.close(session)

    def _operator_skips(self, conn: Connection, partition_id: int, first: int) -> set[int]:
        """The transactions of the attempt starting at ``first`` to pass over on an operator's
        request: ``{first}`` when its own last apply attempt here failed and a request for it is
        pending, else none (docs/design/sql.md "Skipping a transaction": a transaction that
        applies after the request is applied, and the request stays pending). A request for a
        transaction whose failure was an :class:`ApplyPausedError` is refused and logged: it
        stays pending (docs/design/sql.md "Schema versions and upcasting")."""
        failure = self._failing.get(partition_id)
        if failure is None or failure.transaction_id != first:
            return set()
        requested = conn.execute(
            select(skipped_transactions.c.transaction_id).where(
                (skipped_transactions.c.cluster_name == self.cluster_name)
                & (skipped_transactions.c.partition_id == partition_id)
                & (skipped_transactions.c.transaction_id == first)
                & skipped_transactions.c.skipped_at.is_(None)
            )
        ).first()
        if requested is None:
            return set()
        if failure.paused is not None:
            # Logged once per transaction, as the client reports the pause once; then at DEBUG.
            once = self._refusals_logged.get(partition_id) != first
            self._refusals_logged[partition_id] = first
            log.log(
                logging.WARNING if once else logging.DEBUG,
                "cluster %r partition %d: the operator's skip of transaction %d (waltz db skip) is "
                "refused: its apply waits for this instance's upgrade (%s), and such a transaction is "
                "never skipped: instances on the newer code apply it, where this one would lose its "
                "change for good; the request stays pending (finish the deploy: run this instance on "
                "the newer code)",
                self.cluster_name,
                partition_id,
                first,
                failure.paused,
            )
            return set()
        return {first}

    def _record_skip(self, conn: Connection, transaction: Transaction) -> None:
        table = skipped_transactions
        conn.execute(
            update(table)
            .where(
                (table.c.cluster_name == self.cluster_name)
                & (table.c.partition_id == transaction.partition_id)
                & (table.c.transaction_id == transaction.transaction_id)
            )
            .values(skipped_at=dt.datetime.now(dt.UTC))
        )
        self.skipped.append((transaction.partition_id, transaction.transaction_id))
        log.warning(
            "cluster %r partition %d: transaction %d SKIPPED on the operator's request (waltz db skip); "
            "it was not applied to this database",
            self.cluster_name,
            transaction.partition_id,
            transaction.transaction_id,
        )


def _genesis_opening(transaction: Transaction) -> SplitGenesis | None:
    """The genesis ``transaction`` is, when it opens its partition's log: a split record that
    decodes as a genesis at its barrier plus one (docs/design/splits.md "Record forms"); else None.
    A split record that does not decode is left to the usual apply, which reports it."""
    if transaction.header != SPLIT_RECORD_HEADER:
        return None
    return opening_genesis(transaction.transaction_id, transaction.get_raw_data())


def _skip_refusal(transaction: Transaction) -> str | None:
    """Why an operator's skip of ``transaction`` is refused, or None when it is not: a partition
    split's genesis is never skipped (docs/design/splits.md "The SQL framework across a split").

    A record under the split records' header whose data does not decode (damaged, or of a newer
    form) counts as a genesis when its ``kind`` says so.

    Raises:
        TransactionDataError: a split record's data could not be fetched (the skip waits).
    """
    if transaction.header != SPLIT_RECORD_HEADER:
        return None
    data = transaction.get_raw_data()
    try:
        genesis = isinstance(decode_split_record(data), SplitGenesis)
    except SplitRecordFormatError:
        try:
            document = json.loads(data)
        except (ValueError, RecursionError):  # not JSON: nothing says what it is
            document = None
        genesis = isinstance(document, dict) and document.get("kind") == "genesis"
    if not genesis:
        return None
    return (
        f"partition {transaction.partition_id}: the operator's skip of transaction "
        f"{transaction.transaction_id} (waltz db skip) is refused: it is a split genesis, which opens "
        "the partition's log after a split, and skipping it would move the partition's mark past it "
        "without the check that its parent is applied up to the barrier, so updates of a moved key "
        "could be lost; it is applied as usual and the request stays pending (fix what makes its "
        "apply fail)"
    )


def _log_retry(state: tenacity.RetryCallState) -> None:
    outcome = state.outcome
    exc = outcome.exception() if outcome is not None else None
    log.info(
        "transient database error (%r); retry %d in %.2fs",
        exc,
        state.attempt_number,
        state.next_action.sleep if state.next_action is not None else 0.0,
    )
