"""``CounterService``: counters that never go negative, with Waltz as the source of truth.

Source: docs/design/overview.md "Why the log is the source of truth" (the counter service of the
Waltz announcement); docs/design/locks.md "Optimistic locking in Waltz"; docs/sql.md ("Applying the
log exactly once", "Entities: declarative locks and partitions").

A service instance owns three things: a database engine (the materialized view of the log),
:class:`~waltz_examples.counter.transactions.CounterCallbacks` (which apply the log to it exactly once)
and a :class:`~waltz.WaltzClient`. Any number of instances may share one database; each change is
a :class:`~waltz_examples.counter.transactions.ChangeCounter` transaction::

    with CounterService("sqlite:///counters.db", "127.0.0.1:2181", "/waltz/local") as service:
        service.increment(7, 10)      # -> 10
        service.decrement(7, 4)       # -> 6
        service.decrement(7, 50)      # raises InsufficientCountError (current value 6)
        service.get(7)                # -> 6

A call returns once the log committed the change **and** this database applied it, so a later
read through the same database (by any instance) sees it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url

from waltz import WaltzClient, WaltzClientConfig
from waltz.errors import TransactionExpiredError, WaltzTimeoutError
from waltz.jdbc_style import create_framework_engine, migrations_api
from waltz_examples.counter.errors import (
    CounterOverflowError,
    CounterRequestTimeoutError,
    InsufficientCountError,
)
from waltz_examples.counter.models import MAX_VALUE, Counter, create_tables
from waltz_examples.counter.transactions import ChangeCounter, CounterCallbacks

__all__ = ["CounterService", "CounterState", "CounterStats", "CounterUpdate"]

log = logging.getLogger(__name__)

#: Connection pool of non-SQLite databases unless ``engine_options`` say otherwise: requests,
#: read-your-writes polls and the apply threads each hold a connection for a moment.
_POOL_DEFAULTS: Mapping[str, Any] = {"pool_size": 10, "max_overflow": 20}


@dataclass(frozen=True, slots=True)
class CounterUpdate:
    """The outcome of a committed change.

    Attributes:
        counter_id: the counter.
        value: its value right after this change (later changes may have moved it since).
        transaction_id: the Waltz transaction that carries the change (``updated_tx`` of the row).
        partition_id: the partition of the counter.
        lock_failures: attempts the server refused because they were built on a stale value.
    """

    counter_id: int
    value: int
    transaction_id: int
    partition_id: int
    lock_failures: int


@dataclass(frozen=True, slots=True)
class CounterState:
    """A counter's row as this database holds it.

    Attributes:
        counter_id: the counter.
        value: its value.
        updated_tx: the ID of the Waltz transaction that last wrote it.
    """

    counter_id: int
    value: int
    updated_tx: int


@dataclass(frozen=True, slots=True)
class CounterStats:
    """What an instance has done since it started.

    Attributes:
        increments: committed increments.
        decrements: committed decrements.
        refused: decrements refused because the counter would have gone negative (and increments
            refused because it would have overflowed).
        lock_failures: attempts refused by the server's lock check (and retried).
        timeouts: changes that did not complete within the request timeout.
        uncaught_apply_errors: failed applies of log transactions (see ``ChangeSetCallbacks``).
    """

    increments: int
    decrements: int
    refused: int
    lock_failures: int
    timeouts: int
    uncaught_apply_errors: int


class CounterService:
    """Counters backed by a Waltz log and a SQL database; a context manager.

    Construction creates or upgrades the framework's tables (``waltz db upgrade``) and the
    ``counters`` table, starts the Waltz client and waits until it has mounted every partition.
    When several instances start on a new database for the first time, start one first (or run
    ``waltz db upgrade``): concurrent schema creation may fail.

    Args:
        db_url: the database's SQLAlchemy URL, e.g. ``sqlite:////var/lib/counter.db`` or
            ``postgresql+psycopg://app@db/counter``.
        zookeeper: the Waltz cluster's ZooKeeper connect string, ``host:port[,host:port...]``.
        cluster_root: the Waltz cluster root znode, e.g. ``/waltz/local``.
        cluster_name: the name under which this database records its high-water marks (one
            database may follow several logs).
        client_config: overrides of :class:`~waltz.WaltzClientConfig` fields, e.g.
            ``{"zookeeper_session_timeout": 10.0}``.
        request_timeout: seconds a change may take, from submit until this database applied it.
        mount_timeout: seconds construction waits for the client to mount every partition.
        ignore_foreign_transactions: pass over other applications' transactions in a shared log
            (see :class:`~waltz_examples.counter.transactions.CounterCallbacks`).
        engine_options: more ``create_engine`` arguments.

    Raises:
        sqlalchemy.exc.DBAPIError: the database could not be reached or refused the DDL.
        waltz.errors.WaltzError: the Waltz cluster could not be reached (ZooKeeper unavailable,
            no cluster under ``cluster_root``), or the partitions were not mounted in time.
    """

    def __init__(
        self,
        db_url: str,
        zookeeper: str,
        cluster_root: str,
        cluster_name: str = "counter",
        *,
        client_config: Mapping[str, Any] | None = None,
        request_timeout: float = 30.0,
        mount_timeout: float = 60.0,
        ignore_foreign_transactions: bool = False,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        if request_timeout <= 0:
            raise ValueError(f"request_timeout must be positive seconds, got {request_timeout}")
        self.request_timeout = request_timeout
        options = dict(engine_options or {})
        if make_url(db_url).get_backend_name() != "sqlite":
            options = {**_POOL_DEFAULTS, **options}
        config = WaltzClientConfig(
            zookeeper_connect_string=zookeeper, cluster_root=cluster_root, **dict(client_config or {})
        )
        self._stats_lock = threading.Lock()
        self._tallies: collections.Counter[str] = collections.Counter()
        self._closed = False
        self.engine: Engine = create_framework_engine(db_url, **options)
        client: WaltzClient | None = None
        try:
            migrations_api.upgrade(self.engine)
            create_tables(self.engine)
            self.callbacks = CounterCallbacks(
                self.engine,
                cluster_name=cluster_name,
                ignore_foreign_transactions=ignore_foreign_transactions,
            )
            client = WaltzClient(self.callbacks, config)
            client.wait_mounted(mount_timeout)
        except BaseException:
            if client is not None:
                client.close()
            self.engine.dispose()
            raise
        self.client = client
        self._info = self.callbacks.registry.info(Counter)
        log.info(
            "counter service ready: database %s, Waltz cluster %s on %s (%d partitions)",
            self.engine.url.render_as_string(hide_password=True),
            cluster_root,
            zookeeper,
            client.num_partitions,
        )

    # --- changes ----------------------------------------------------------------------------------

    def increment(self, counter_id: int, amount: int) -> int:
        """Add ``amount`` to a counter (created at 0 if missing).

        Args:
            counter_id: the counter, 0 .. 2**63 - 1.
            amount: a positive integer.

        Returns:
            The counter's value right after the increment; this database has applied it.

        Raises:
            ValueError: a bad ``counter_id`` or ``amount``.
            CounterOverflowError: the counter would exceed 2**63 - 1 (nothing appended).
            CounterRequestTimeoutError: not done within ``request_timeout`` seconds.
            waltz.errors.ClientClosedError: the service was closed meanwhile.
        """
        return self.change(counter_id, _positive(amount)).value

    def decrement(self, counter_id: int, amount: int) -> int:
        """Subtract ``amount`` from a counter, unless it would go negative.

        Args:
            counter_id: the counter, 0 .. 2**63 - 1.
            amount: a positive integer.

        Returns:
            The counter's value right after the decrement; this database has applied it.

        Raises:
            ValueError: a bad ``counter_id`` or ``amount``.
            InsufficientCountError: the counter holds less than ``amount`` (nothing appended);
                its ``current`` is the value the refusal was based on.
            CounterRequestTimeoutError: not done within ``request_timeout`` seconds.
            waltz.errors.ClientClosedError: the service was closed meanwhile.
        """
        return self.change(counter_id, -_positive(amount)).value

    def change(self, counter_id: int, delta: int) -> CounterUpdate:
        """Add ``delta`` (positive or negative) to a counter; :meth:`increment` and :meth:`decrement`
        in one, with the transaction's details.

        Submits a :class:`~waltz_examples.counter.transactions.ChangeCounter`, waits until the log
        committed it, then until this database applied it (read-your-writes).

        Returns:
            The counter, its new value, the committing transaction and its partition.

        Raises:
            ValueError: a bad ``counter_id``, or ``delta`` is 0 or out of range.
            InsufficientCountError: the counter would go negative (nothing appended).
            CounterOverflowError: the counter would exceed 2**63 - 1 (nothing appended).
            CounterRequestTimeoutError: not done within ``request_timeout`` seconds.
            waltz.errors.ClientClosedError: the service was closed meanwhile.
        """
        _check_counter_id(counter_id)
        if isinstance(delta, bool) or not isinstance(delta, int) or delta == 0 or abs(delta) > MAX_VALUE:
            raise ValueError(f"delta must be a non-zero integer within ±{MAX_VALUE}, got {delta!r}")
        deadline = time.monotonic() + self.request_timeout
        context = ChangeCounter(
            self.callbacks,
            counter_id,
            delta,
            timeout=self.request_timeout,
            lock_failure_listener=self._count_lock_failure,
        )
        future = self.client.submit(context)
        try:
            outcome = future.result(max(0.0, deadline - time.monotonic()))
            transaction_id = outcome.transaction_id
        except CounterOverflowError:
            self._count("refused")
            raise
        except TransactionExpiredError as exc:
            self._count("timeouts")
            raise CounterRequestTimeoutError(
                f"changing counter {counter_id} by {delta} did not commit within {self.request_timeout:g}s "
                f"({context.lock_failures} lock failures); it never will, so retrying is safe",
                committed=False,
            ) from exc
        except concurrent.futures.TimeoutError as exc:
            self._count("timeouts")
            raise CounterRequestTimeoutError(
                f"changing counter {counter_id} by {delta} had no outcome within {self.request_timeout:g}s "
                "(is the Waltz cluster reachable?); it may still commit, and a retry would then apply "
                "it twice (the counter has no request IDs: see its README)",
                committed=None,
            ) from exc
        if transaction_id is None:
            self._count("refused")
            current = context.refused_at if context.refused_at is not None else 0
            raise InsufficientCountError(counter_id, current, -delta)
        partition_id = outcome.partition_id  # where it committed (during a split, maybe the parent)
        if not self.callbacks.wait_for(partition_id, transaction_id, max(0.0, deadline - time.monotonic())):
            self._count("timeouts")
            raise CounterRequestTimeoutError(
                f"changing counter {counter_id} by {delta} committed as partition {partition_id} "
                f"transaction {transaction_id}, but this database had not applied it after "
                f"{self.request_timeout:g}s; it will be applied: do not retry (check the service's apply "
                "errors and `waltz db marks` if it stays behind)",
                committed=True,
                transaction_id=transaction_id,
            )
        if context.new_value is None:  # run() set it in the attempt that committed
            raise AssertionError(f"transaction {transaction_id} committed without a new value")
        self._count("increments" if delta > 0 else "decrements")
        return CounterUpdate(
            counter_id, context.new_value, transaction_id, partition_id, context.lock_failures
        )

    # --- reads ------------------------------------------------------------------------------------

    def get(self, counter_id: int, *, consistent: bool = False) -> int:
        """A counter's value in this database (0 for a counter never written).

        Args:
            counter_id: the counter.
            consistent: first wait until this database has applied everything the log holds
                for the counter's partition now (asks the partition's server for its
                high-water mark): the value then reflects every change committed before the
                call, also those made through other databases following the same log.

        Raises:
            ValueError: a bad ``counter_id``.
            CounterRequestTimeoutError: ``consistent``, and the partition's server did not answer
                for its high-water mark, or the database did not catch up, within
                ``request_timeout`` seconds each (docs/design/client.md "WaltzClient and
                AsyncWaltzClient": ``get_high_water_mark``).
        """
        state = self.read(counter_id, consistent=consistent)
        return 0 if state is None else state.value

    def read(self, counter_id: int, *, consistent: bool = False) -> CounterState | None:
        """A counter's row in this database, or None when it was never written (see :meth:`get`)."""
        _check_counter_id(counter_id)
        if consistent:
            partition_id = self.partition_of(counter_id)
            try:
                high_water_mark = self.client.get_high_water_mark(partition_id, timeout=self.request_timeout)
            except WaltzTimeoutError as exc:
                raise CounterRequestTimeoutError(
                    f"partition {partition_id}'s server did not tell its high-water mark within "
                    f"{self.request_timeout:g}s ({exc}); read without consistent=True (this "
                    "database's value), or retry once the cluster answers",
                    committed=None,
                ) from exc
            if not self.callbacks.wait_for(partition_id, high_water_mark, self.request_timeout):
                raise CounterRequestTimeoutError(
                    f"this database did not apply partition {partition_id} up to transaction "
                    f"{high_water_mark} within {self.request_timeout:g}s; read without consistent=True, or "
                    "check the service's apply errors",
                    committed=None,
                )
        with self.engine.connect() as conn:
            row = conn.execute(
                select(Counter.value, Counter.updated_tx).where(Counter.counter_id == counter_id)
            ).one_or_none()
        return None if row is None else CounterState(counter_id, int(row.value), int(row.updated_tx))

    def partition_of(self, counter_id: int) -> int:
        """The partition of a counter now (a stable hash of its ID, routed as its transactions
        are: during a split of the log, its partition at the count before until that one seals)."""
        return self.client.partition_for(lambda count: self._info.partition_of((counter_id,), count))

    # --- statistics and health ----------------------------------------------------------------------

    def stats(self) -> CounterStats:
        """What this instance has done since it started."""
        with self._stats_lock:
            tallies = dict(self._tallies)
        return CounterStats(
            increments=tallies.get("increments", 0),
            decrements=tallies.get("decrements", 0),
            refused=tallies.get("refused", 0),
            lock_failures=tallies.get("lock_failures", 0),
            timeouts=tallies.get("timeouts", 0),
            uncaught_apply_errors=self.callbacks.uncaught_count,
        )

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the instance can serve: every partition mounted and none stuck applying.

        Returns:
            ``(healthy, details)``: details name the mounted and the unhealthy partitions.
        """
        mounted = self.client.mounted_partitions()
        unhealthy = self.client.unhealthy_partitions()
        healthy = not self._closed and not unhealthy and len(mounted) == self.client.num_partitions
        return healthy, {
            "partitions": self.client.num_partitions,
            "mounted_partitions": mounted,
            "unhealthy_partitions": {str(p): repr(e) for p, e in sorted(unhealthy.items())},
        }

    # --- life cycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the Waltz client and the engine. Idempotent.

        Changes still in flight fail with ``ClientClosedError`` (they may or may not commit).
        """
        if self._closed:
            return
        self._closed = True
        try:
            self.client.close()
        finally:
            self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._stats_lock:
            self._tallies[name] += 1

    def _count_lock_failure(self) -> None:
        self._count("lock_failures")


def _check_counter_id(counter_id: int) -> None:
    if isinstance(counter_id, bool) or not isinstance(counter_id, int) or not 0 <= counter_id <= MAX_VALUE:
        raise ValueError(f"a counter ID is an integer in 0..{MAX_VALUE}, got {counter_id!r}")


def _positive(amount: int) -> int:
    if isinstance(amount, bool) or not isinstance(amount, int) or not 1 <= amount <= MAX_VALUE:
        raise ValueError(f"an amount is an integer in 1..{MAX_VALUE}, got {amount!r}")
    return amount
