"""Batched entity transactions: the entity contexts an instance has ready for one partition, run
one after the other on one state and appended as one log transaction.

Source: docs/design/sql.md "Batched entity transactions" (the writer) and "Batched change-sets"
(the record form, form 3). An :class:`EntityBatcher` keeps, per partition, at most
``max_in_flight`` log transactions of its own in flight; a context submitted while none is in
flight goes at once, on its own, exactly as ``client.submit`` sends it (nothing waits for a batch at
low load). So does one that is the only context queued for its partition, when no transaction in
flight holds a lock it expects to take, up to ``max_in_flight_alone`` more in flight: it could not
be batched with what is in flight anyway, and at low load it would otherwise wait a round trip for
nothing. Contexts submitted while the partition's limit is reached queue, and when a log
transaction of the partition ends, the queue goes as the next batch, bounded by
``max_members`` contexts and ``max_bytes`` of data (its framing counted), and while room in flight is left,
what that batch left queued goes as the batches after it, sent one after the other in queue order
(one that can still grow waits for the linger as any batch). With a ``linger``, a batch that
would go less than ``linger`` after the partition's last log transaction was sent waits out the
rest, and what is submitted meanwhile joins it; once that has passed, one that would go less
than ``linger`` after that transaction ended still waits while fewer than a third of its
members' count are queued (their submitters are about to submit again); a batch that cannot
grow (full, or with a context that has a timeout queued behind it) goes at once, and a partition
whose contexts come less often than three per linger (on a running mean) sends each at once: at
low load nothing waits.

A batch is one :class:`~waltz.client.context.TransactionContext` to the client. Each attempt opens
one state (the entity cache's rows, or one database snapshot, with the mark) for every member's
entities, runs each member's :meth:`~waltz.jdbc_style.EntityTransactionContext.run` in order on what
the members before it left (their rows, read before the state's), and appends their change-sets as
one log transaction with the union of their locks and the state's mark. A member that finds its
idempotency key applied as of the state leaves the batch at once, with its own outcome; so does one
that drops its transaction or raises on the state alone. One that drops or raises on changes of
members before it, which the log may still refuse, leaves with its outcome when the batch commits,
and runs again when the batch does (a lock failure, or a member before it taken out); the others
commit or fail as one. A lock failure runs every member left again. Each member keeps its own
future, callbacks and idempotency key; a committed member's outcome carries the batch's transaction
ID.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from waltz.client.client import AsyncWaltzClient, WaltzClient
from waltz.client.config import WaltzClientConfig
from waltz.client.context import TransactionBuilder, TransactionContext
from waltz.client.locks import PartitionLocalLock
from waltz.client.outcome import Outcome, OutcomeKind
from waltz.client.submission import APPEND_OVERHEAD_BYTES, LOCK_HASH_BYTES
from waltz.errors import AsyncClientError, ClientClosedError, CrossPartitionError
from waltz.jdbc_style.batch_metrics import batcher_counts
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER, ChangeSet, Operation, batch_data, member_data
from waltz.jdbc_style.changeset_callbacks import EXACT_STRING_DIALECTS, ChangeSetCallbacks
from waltz.jdbc_style.entities import EntityInfo
from waltz.jdbc_style.entity_cache import Kinds, column_kinds, exact_row
from waltz.jdbc_style.entity_context import (
    CHANGED_IN_BATCH,
    CachedSnapshot,
    EntityTransaction,
    EntityTransactionContext,
    NotBatchableError,
)
from waltz.jdbc_style.idempotency import AppliedRequest, check_idempotency_key, find_idempotency_keys
from waltz.protocol.event_loop import shared_event_loop

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_BATCH_MEMBERS",
    "DEFAULT_MAX_IN_FLIGHT_ALONE",
    "BatchPartedError",
    "EntityBatcher",
]

log = logging.getLogger(__name__)

#: Contexts in one batch at most.
DEFAULT_MAX_BATCH_MEMBERS = 64
#: Bytes of change-set data in one batch at most (a member alone may be larger: it goes alone).
DEFAULT_MAX_BATCH_BYTES = 256 * 1024
#: The weight of the newest gap in a partition's mean time between submits, which decides whether
#: its batches linger (contexts submitted more often than LINGER_MIN_JOINING per linger).
LINGER_INTERVAL_WEIGHT = 0.0625
#: Contexts per linger, on that mean, from which a partition's batches linger (and none goes beside
#: the batch): below it too few would join a batch for the wait to pay.
LINGER_MIN_JOINING = 3
#: Once a linger has passed since a partition's last log transaction was sent, a batch still waits
#: until a linger from that transaction's end while fewer than one in LINGER_RETURNING of its
#: members' count is queued: its members' submitters (a closed loop) are about to submit again, and
#: would otherwise wait a round behind a batch of the few queued.
LINGER_RETURNING = 3
#: Bytes of a batch's data besides its members' (``{"members":[``, ``],"v":3}``): counted against
#: ``max_bytes`` with them, so that a full batch stays within it and within the client's message.
BATCH_FRAMING_BYTES = len(batch_data([]))
#: Contexts sent at once, alone, beyond ``max_in_flight`` per partition (lock-disjoint, nothing
#: queued): what keeps p99 at low load from waiting a round trip behind an unrelated transaction.
#: The default of the client's ``client.batchMaxInFlightAlone``, which the batcher takes.
DEFAULT_MAX_IN_FLIGHT_ALONE: int = WaltzClientConfig.model_fields["client_batch_max_in_flight_alone"].default

_Key = tuple[EntityInfo, tuple[Any, ...]]


@dataclass(eq=False)
class _Member:
    """A submitted context and its own future."""

    context: EntityTransactionContext
    future: concurrent.futures.Future[Outcome]
    alone: bool = False
    """Runs on its own (it read what a batch cannot show it, or it has a timeout)."""
    locks: tuple[PartitionLocalLock, ...] | None = None
    """Its expected locks, once asked (None: not asked yet, or the hint raised)."""
    count: int = 0
    """The partition count its queue's partition was chosen at (0: unknown)."""


class BatchPartedError(CrossPartitionError):
    """A batch's members map to different partitions at a newer count (a split moved some of
    their keys): never a member's outcome, the batcher queues each member again at its partition
    at that count (docs/design/splits.md "Clients across a split")."""


class _Batch(TransactionContext):
    """Several members of one partition as one client transaction (see the module docstring)."""

    sets_client_high_water_mark = True
    execute_blocks = True

    def __init__(self, batcher: EntityBatcher, partition_id: int, members: list[_Member]) -> None:
        super().__init__()
        self._batcher = batcher
        self._partition_id = partition_id
        self.members = members  # those not ended yet
        # Those the last attempt appended; every member until an attempt ran, so that a batch the
        # client ends before its first attempt (a closed client, a failing hint) ends them all.
        self.appended: list[_Member] = list(members)
        self.deferred: list[_Member] = []  # those left for after this batch
        # The last pass's members that dropped or raised after members appended before them: they
        # read those members' changes, so their outcome stands only when the batch commits.
        self.provisional: list[tuple[_Member, Outcome | BaseException]] = []
        self._keyed: list[tuple[_Member, str]] = []  # the last pass's members with a key to check
        self._member_data: list[bytes] = []  # the last pass's members, encoded (member_data)
        first = members[0].context
        self.reads_absorbed_state = first.reads_absorbed_state
        self._num_partitions = batcher.client.num_partitions
        # The batcher's grouping: the partition its members were queued for, at the count they
        # were queued at (-1 when they were queued at different counts, or it is not known).
        counts = {member.count for member in members}
        grouped_at = counts.pop() if len(counts) == 1 else -1
        self._grouped = (partition_id, grouped_at if grouped_at > 0 else -1)

    def partition_id(self, num_partitions: int) -> int:
        """The batch's partition at ``num_partitions``: the batcher's at the count its members were
        queued at; at a newer count (a split in the client's view of the partition epochs,
        docs/design/splits.md "Clients across a split") the one every member routes to at it.

        Raises:
            BatchPartedError: the members part at ``num_partitions`` (a split moves some of their
                keys to a new partition), or a member's own entities do: the batch ends, and the
                batcher queues each member again at its partition there, a member whose own
                entities part ending with its ``CrossPartitionError`` (:meth:`EntityBatcher.regroup`).
        """
        grouped, count = self._grouped
        if num_partitions == count:
            return grouped
        routes: set[int] = set()
        for member in self.members:
            try:
                routes.add(member.context.partition_id(num_partitions))
            except CrossPartitionError as exc:  # its own entities part: the batch parts, it ends
                raise BatchPartedError(
                    f"a member of a batch of {len(self.members)} entity transactions of partition "
                    f"{self._partition_id} parts at {num_partitions} partitions: {exc}"
                ) from exc
        if len(routes) != 1:
            raise BatchPartedError(
                f"a batch of {len(self.members)} entity transactions of partition {self._partition_id} "
                f"parts at {num_partitions} partitions (partitions {sorted(routes)}): a split moves some "
                'of its members\' keys (docs/design/splits.md, "Clients across a split")'
            )
        return routes.pop()

    def routed(self, partition_id: int, num_partitions: int) -> None:
        """The client routed the batch (docs/design/splits.md "Clients across a split"): it and its
        members read that partition's state and check their entities at that count."""
        self._partition_id = partition_id
        self._num_partitions = num_partitions
        for member in self.members:
            member.context.routed(partition_id, num_partitions)

    def expected_locks(self) -> Sequence[PartitionLocalLock]:
        locks: dict[PartitionLocalLock, None] = {}
        for member in self.members:  # each member's hint, asked once when it was submitted
            locks.update(dict.fromkeys(member.locks or ()))
        return list(locks)

    def execute(self, builder: TransactionBuilder) -> bool:
        members, self.appended = self.members, []
        try:
            return self._execute(members, builder)
        except BaseException:
            # The client ends the batch with this error: every member still in it ends so too.
            self.appended = [m for m in members if not m.future.done() and m not in self.deferred]
            self.provisional = []
            raise

    def _execute(self, members: list[_Member], builder: TransactionBuilder) -> bool:
        members, entities = self._attempt_entities(members)
        if not members:
            self.members = []
            return False
        first = members[0].context
        with contextlib.ExitStack() as stack:
            snapshot = first.open_attempt_state(stack, entities)
            # The members' keys are checked together after a pass; a pass that finds one applied
            # before ends that member and runs the others again on the same state (rare: a
            # request sent again), at most once per member.
            for _ in range(len(members) + 1):
                change_sets, read_locks, write_locks = self._run_members(members, snapshot)
                applied = self._applied_before(snapshot)
                if not applied:
                    break
                for member, earlier in applied:
                    own = TransactionBuilder(-1)
                    own.drop_as_applied(earlier.partition_id, earlier.transaction_id)
                    self._end(member, own.dropped_outcome(self._partition_id))
                # The others run again, those whose outcome waits for the batch among them: a
                # member before them is gone.
                ended = {a for a, _ in applied}
                members = [m for m in self._still_in(members) if m not in ended]
            mark = snapshot.high_water_mark
        # A lock failure runs again every member appended and every one whose outcome waited.
        self.members = self._still_in(members)
        if not change_sets:
            return False
        builder.set_client_high_water_mark(mark)
        builder.set_header(CHANGE_SET_HEADER)
        # Each member was encoded once, while its size was counted: the batch joins those bytes.
        data = change_sets[0].encode() if len(change_sets) == 1 else batch_data(self._member_data)
        builder.set_raw_data(data)
        builder.set_write_locks(list(write_locks))
        builder.set_read_locks([lock for lock in read_locks if lock not in write_locks])
        return True

    def _attempt_entities(self, members: list[_Member]) -> tuple[list[_Member], list[_Key]]:
        """The members an attempt runs and the entities its state reads: each member's
        :meth:`~waltz.jdbc_style.EntityTransactionContext.attempt_entities`, once each, of those
        with the first's callbacks (the others run alone after the batch, in their own database:
        docs/design/sql.md "Batched entity transactions", its members that leave). A member whose
        ``attempt_entities`` (its ``prefetch_entities``) raises ends with that error, as it would
        alone, and the batch goes on without it.

        Returns:
            The members still in the attempt, in their order, and the entities to read.
        """
        kept: list[_Member] = []
        entities: dict[_Key, None] = {}
        callbacks: ChangeSetCallbacks | None = None
        for member in members:
            context = member.context
            if callbacks is not None and context.callbacks is not callbacks:
                kept.append(member)  # another database: the pass leaves it for after the batch
                continue
            try:
                wanted = context.attempt_entities()
            except Exception as exc:  # its own hint's error: its end, not the batch's
                self._end(member, exc)
                continue
            callbacks = context.callbacks
            entities.update(dict.fromkeys(wanted))
            kept.append(member)
        return kept, list(entities)

    def _still_in(self, members: list[_Member]) -> list[_Member]:
        """Of ``members``, in their order, those the last pass appended or whose outcome waits
        for the batch (:attr:`provisional`)."""
        waiting = {member for member, _ in self.provisional}
        appended = set(self.appended)
        return [m for m in members if m in appended or m in waiting]

    def _run_members(
        self, members: list[_Member], snapshot: Any
    ) -> tuple[list[ChangeSet], dict[PartitionLocalLock, None], dict[PartitionLocalLock, None]]:
        """One pass: run each member in order on the state and what the ones before it left;
        :attr:`appended` becomes those whose change-sets the pass returns, with their locks, and
        :attr:`provisional` those that dropped or raised on what members appended before them
        left (their outcome waits for the batch's)."""
        self.appended = []
        self.provisional = []
        first = members[0].context if members else None
        overlay: dict[_Key, Any] = {}
        change_sets: list[ChangeSet] = []
        keys: set[str] = set()
        size = BATCH_FRAMING_BYTES
        read_locks: dict[PartitionLocalLock, None] = {}
        write_locks: dict[PartitionLocalLock, None] = {}
        self._keyed = []
        self._member_data = []
        for member in members:
            context = member.context
            if first is None or context.callbacks is not first.callbacks:  # another database
                member.alone = True
                self._defer(member)
                continue
            # The first member appended reads the state as it is (tx.session too).
            tx = EntityTransaction(
                context.callbacks, snapshot, self._num_partitions, overlay=overlay if self.appended else None
            )
            context.last_transaction = tx
            own = TransactionBuilder(-1)
            result: Outcome | BaseException | None
            try:
                dropped = context.run_attempt(tx, own, check_key=False)
            except NotBatchableError as exc:
                log.debug("%s leaves the batch and runs on its own: %s", type(context).__name__, exc)
                member.alone = True
                self._defer(member)
                continue
            except Exception as exc:
                result = exc
            else:
                result = None if dropped is None else own.dropped_outcome(self._partition_id)
            key = tx.idempotency_key
            if isinstance(key, str) and key in keys:
                # A request twice in one batch, whatever this copy's run made of the first copy's
                # changes (committed, dropped or raised): it waits for the next batch, whose key
                # check finds the first copy applied.
                self._defer(member)
                continue
            if result is not None:
                size = self._end_or_wait(member, result, tx, size, read_locks)
                continue
            change_set = tx.change_set()
            try:
                encoded = member_data(change_set)
                # Its bytes in the batch's data: itself and the comma before it (or, for a change-set
                # alone, its ``"v"``, which the framing covers), and its lock hashes.
                data = len(encoded) + 1 + LOCK_HASH_BYTES * (len(tx.write_locks) + len(tx.read_locks))
                if key is not None:
                    check_idempotency_key(key)
            except Exception as exc:  # this member's own error (a value JSON cannot hold, its key)
                self._end(member, exc)
                continue
            if change_sets and size + data > self._batcher.data_limit:
                self._defer(member)
                continue
            try:
                _follow(overlay, context, tx, self._batcher)
            except TypeError:  # a key value no row can be named by: on its own
                member.alone = True
                self._defer(member)
                continue
            size += data
            self._member_data.append(encoded)
            if key is not None:
                keys.add(key)
                if context.checks_idempotency_key:
                    self._keyed.append((member, key))
            change_sets.append(change_set)
            self.appended.append(member)
            for lock in tx.write_locks:
                write_locks[lock] = None
            read_locks.update(dict.fromkeys(tx.read_locks))
        return change_sets, read_locks, write_locks

    def _applied_before(self, snapshot: Any) -> list[tuple[_Member, AppliedRequest]]:
        """The members of the last pass whose key was applied before, as of the state (one read
        of every key, :func:`~waltz.jdbc_style.idempotency.find_idempotency_keys`)."""
        if not self._keyed:
            return []
        keys = [key for _, key in self._keyed]
        if isinstance(snapshot, CachedSnapshot):  # the cache's keys: no wait for the applies
            found = snapshot.applied_keys(keys)
        else:
            callbacks = self._keyed[0][0].context.callbacks
            found = find_idempotency_keys(snapshot.connection, cluster_name=callbacks.cluster_name, keys=keys)
        return [(member, found[key]) for member, key in self._keyed if key in found]

    def _end_or_wait(
        self,
        member: _Member,
        result: Outcome | BaseException,
        tx: EntityTransaction,
        size: int,
        read_locks: dict[PartitionLocalLock, None],
    ) -> int:
        """A member dropped or raised in a pass: it ends at once when it read the state alone (no
        member appended before it). Else it read those members' changes, which the log may still
        refuse, and its outcome waits for the batch (:meth:`end_provisional`); its read and write
        locks join the batch's ``read_locks``, so that a write after the state's mark to what it
        read fails the batch's lock check and it runs again (docs/design/sql.md "Batched entity
        transactions", its members that leave). When their hashes would take the batch's bytes past
        its limit, it waits for the next batch instead.

        Args:
            size: the batch's bytes so far (data and lock hashes, its framing counted).
            read_locks: the batch's read locks so far, added to.

        Returns:
            The batch's bytes with this member's lock hashes (``size`` when it ended or waits for
            the next batch).
        """
        if not self.appended:
            self._end(member, result)
            return size
        locks = (*tx.read_locks, *tx.write_locks)
        grown = size + LOCK_HASH_BYTES * len(locks)
        if grown > self._batcher.data_limit:
            self._defer(member)
            return size
        read_locks.update(dict.fromkeys(locks))
        self.provisional.append((member, result))
        return grown

    def end_provisional(self, committed: bool, error: BaseException | None = None) -> None:
        """The batch ended: the members whose outcome waited for it end with it when it
        committed (the state they read, members before them included, is the log's), or with
        ``error`` when it failed. Called once; a batch that a split parted regroups them instead."""
        waiting, self.provisional = self.provisional, []
        for member, result in waiting:
            if committed:
                self._end(member, result)
            else:
                self._end(member, error or ClientClosedError("the batch ended without committing"))

    def _defer(self, member: _Member) -> None:
        if member not in self.deferred:
            self.deferred.append(member)

    def end_member(self, member: _Member, result: Outcome | BaseException) -> None:
        """End a member with ``result`` (its callback, then its future): one the client's failure of
        the batch did not reach."""
        self._end(member, result)

    def _end(self, member: _Member, result: Outcome | BaseException) -> None:
        """End a member in an attempt: dropped, already applied, or failed (``run`` raised)."""
        context = member.context
        try:
            if isinstance(result, BaseException):
                context.on_exception(result)
            else:
                context.on_completion(False)
        except Exception:
            log.exception("%s: a callback raised", type(context).__name__)
        _settle(member.future, result)

    # --- the client's callbacks, for every member appended ------------------------------------------

    def on_completion(self, result: bool) -> None:
        for member in self.appended:
            _call(member.context.on_completion, result)

    def on_application(self) -> None:
        for member in self.appended:
            _call(member.context.on_application)

    def on_exception(self, exception: BaseException) -> None:
        if isinstance(exception, BatchPartedError):
            return  # not the members' end: the batcher queues each again at its new partition
        for member in self.appended:
            _call(member.context.on_exception, exception)

    def on_lock_failure(self) -> None:
        # Every member the next attempt runs again: those whose outcome waited for the batch too.
        for member in self.members:
            _call(member.context.on_lock_failure)


def _follow(
    overlay: dict[_Key, Any], context: EntityTransactionContext, tx: EntityTransaction, batcher: EntityBatcher
) -> None:
    """Put a member's changes in the batch's overlay: each entity's whole new row, None for a
    delete, or :data:`CHANGED_IN_BATCH` when the change does not carry the whole row or a value
    the database may store otherwise (a model the entity cache would not keep, a value not of its
    column's kind, :func:`~waltz.jdbc_style.entity_cache.exact_row`): a later member reading it
    runs on its own.

    Every change of a member whose idempotency key was not checked (``checks_idempotency_key``
    off) is :data:`CHANGED_IN_BATCH`: its apply skips them when an earlier transaction carried
    the key, which only the database knows, so no later member may build on them (as the entity
    cache keeps such rows pending; docs/design/sql.md "Batched entity transactions", its members
    that leave).

    Raises:
        TypeError: a key value that cannot name a row (unhashable).
    """
    registry = context.callbacks.registry
    unsure = tx.idempotency_key is not None and not context.checks_idempotency_key
    staged: dict[_Key, Any] = {}
    for change in tx.changes:
        info = registry.by_name(change.entity)
        key = tuple(change.key[name] for name in info.key) if set(change.key) == set(info.key) else None
        if change.operation is Operation.DELETE:
            if key is not None:
                hash(key)
                staged[(info, key)] = CHANGED_IN_BATCH if unsure else None
            continue
        values = change.values
        if key is None:
            key = tuple(values.get(name) for name in info.key)
        hash(key)
        if unsure:
            staged[(info, key)] = CHANGED_IN_BATCH
            continue
        kinds = batcher.kinds(info, context.callbacks)
        try:
            row = tuple(values[name] for name in info.attributes)
        except KeyError:
            staged[(info, key)] = CHANGED_IN_BATCH
            continue
        staged[(info, key)] = row if kinds is not None and exact_row(info, kinds, row) else CHANGED_IN_BATCH
    overlay.update(staged)


def _expected_locks(context: TransactionContext) -> tuple[PartitionLocalLock, ...] | None:
    """A context's expected locks (a hint), or None when its hint raises."""
    try:
        return tuple(dict.fromkeys(context.expected_locks()))
    except Exception:  # a hint only: the context runs, and fails if it must
        log.debug("%s: expected_locks raised; no hint", type(context).__name__, exc_info=True)
        return None


def _held_locks(members: Sequence[_Member]) -> list[PartitionLocalLock | None]:
    """The locks a transaction of ``members`` holds while in flight, once each; None stands for
    a member whose locks are not known (no hint, or an empty one)."""
    held: dict[PartitionLocalLock | None, None] = {}
    for member in members:
        held.update(dict.fromkeys(member.locks or (None,)))
    return list(held)


def _call(callback: Callable[..., None], *args: Any) -> None:
    try:
        callback(*args)
    except Exception:
        log.exception("a member's callback raised")


def _fail(member: _Member, error: BaseException) -> None:
    """End a member that the batcher fails (closed, the client's refusal, its own entities parting):
    its ``on_exception``, then its future; nothing when it ended already."""
    if member.future.done():
        return
    _call(member.context.on_exception, error)
    _settle(member.future, error)


def _settle(future: concurrent.futures.Future[Outcome], result: Outcome | BaseException) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


class EntityBatcher:
    """Submits entity transaction contexts through ``client``, batching those that are ready for
    the same partition while its earlier log transactions are in flight (see the module docstring;
    docs/design/sql.md "Batched entity transactions").

    Args:
        client: the instance's client (its callbacks a :class:`ChangeSetCallbacks`).
        max_members: contexts in one batch at most.
        max_bytes: bytes of a batch's data and lock hashes at most, its framing counted (a
            member is never cut: one larger alone goes alone).
        max_in_flight: log transactions of this batcher in flight per partition (a transaction
            alone or a batch); contexts submitted beyond it wait for the next batch.
        max_in_flight_alone: contexts that go at once, alone, beyond ``max_in_flight``: each
            the only context queued for its partition, with expected locks
            (``TransactionContext.expected_locks``) that no transaction in flight holds; 0 makes
            every context beyond ``max_in_flight`` wait for the next batch. With a linger, only
            while the partition's contexts come less often than three per linger (below). None:
            the client's ``client.batchMaxInFlightAlone`` (3 by default).
        linger: seconds at least between two log transactions of a partition: a batch that
            would go sooner after the partition's last one was sent waits out the rest, and
            contexts submitted meanwhile join it (up to ``max_members``). Once that has passed,
            while fewer than a third of that last one's members' count are queued, the batch
            waits until a linger from its end: its members' submitters are about to submit
            again (a closed loop), and would otherwise wait a round behind the few queued. A
            batch that cannot grow goes at once: a full one, or one with a context that has a
            timeout (it goes alone, and no later context passes it) queued behind it. Nothing
            waits while the partition's contexts come less often than three per linger (a
            running mean of the time between submits). A context sent alone beyond
            ``max_in_flight`` does not wait, nor does one with a timeout next in the queue. 0: no
            wait. None: the client's ``client.batchLinger`` (its default:
            ``WaltzClientConfig.client_batch_linger``).

    Raises:
        ValueError: a limit below 1 (below 0 for ``max_in_flight_alone``; for ``linger``, below
            0 or not finite).
        AsyncClientError: ``client`` is an ``AsyncWaltzClient``; the message says how an asyncio
            service uses a batcher.
    """

    def __init__(
        self,
        client: WaltzClient,
        *,
        max_members: int = DEFAULT_MAX_BATCH_MEMBERS,
        max_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        max_in_flight: int = 1,
        max_in_flight_alone: int | None = None,
        linger: float | None = None,
    ) -> None:
        if isinstance(client, AsyncWaltzClient):
            raise AsyncClientError(
                "EntityBatcher needs a WaltzClient, not an AsyncWaltzClient: it submits from the "
                "calling thread and threads of its own, and answers with concurrent.futures futures. "
                "On asyncio, give it a WaltzClient (made with asyncio.to_thread, in place of the "
                "AsyncWaltzClient) and submit from a thread: outcome = await asyncio.wrap_future("
                "await asyncio.to_thread(batcher.submit, context)); or submit each context alone "
                "with await client.submit_async(context)"
            )
        if max_in_flight_alone is None:
            max_in_flight_alone = client.config.client_batch_max_in_flight_alone
        if linger is None:
            linger = client.config.client_batch_linger
        for name, value in (
            ("max_members", max_members),
            ("max_bytes", max_bytes),
            ("max_in_flight", max_in_flight),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if max_in_flight_alone < 0:
            raise ValueError(f"max_in_flight_alone must be at least 0, got {max_in_flight_alone}")
        if not (linger >= 0 and math.isfinite(linger)):  # NaN too
            raise ValueError(f"linger must be at least 0 seconds and finite, got {linger}")
        self.client = client
        self.max_members = max_members
        self.max_bytes = max_bytes
        self.max_in_flight = max_in_flight
        self.max_in_flight_alone = max_in_flight_alone
        self.linger = linger
        self._lock = threading.Lock()
        # Per partition, when its last log transaction was taken to be sent (time.monotonic()),
        # the token of the call scheduled for when its linger passes (while its next batch waits
        # for it; a batch taken before the call comes makes the call stale), when its last context
        # was submitted, and the mean time between its submits (exponentially weighted,
        # LINGER_INTERVAL_WEIGHT to the newest).
        self._last_sent: dict[int, float] = {}
        self._lingering: dict[int, object] = {}
        self._last_submit: dict[int, float] = {}
        self._interval: dict[int, float] = {}
        # Per partition, with a linger: when its last log transaction ended (time.monotonic()),
        # and how many members it carried.
        self._last_end: dict[int, tuple[float, int]] = {}
        self._queues: dict[int, collections.deque[_Member]] = {}
        self._in_flight: dict[int, int] = {}
        # Per partition, the expected locks of its transactions in flight, counted: a context
        # sent alone beyond max_in_flight holds none of them.
        self._held: dict[int, collections.Counter[PartitionLocalLock | None]] = {}
        self._closed = False
        # Next batches are submitted off the completion thread, which must not wait on a first
        # attempt's database reads.
        self._sender_idents: set[int] = set()
        self._sender = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, min(8, client.num_partitions)),
            thread_name_prefix="waltz-batcher",
            initializer=self._note_sender,
        )
        #: Bytes of a batch's data and lock hashes at most: ``max_bytes``, within the client's
        #: largest message (``client.maxMessageBytes``) less an append's own bytes.
        self.data_limit = min(max_bytes, client.config.client_max_message_bytes - APPEND_OVERHEAD_BYTES)
        self._kinds: dict[EntityInfo, Kinds | None] = {}
        self.batches = 0
        """Batches committed (log transactions of more than one member)."""
        self.batched = 0
        """Members those batches carried."""
        self.lingered = 0
        """Log transactions that waited for the linger before they were sent."""
        #: The same counts by partition, with those of the client's other batchers, in the
        #: client's registry (:mod:`waltz.jdbc_style.batch_metrics`).
        self._counts = batcher_counts(client.metrics)

    def kinds(self, info: EntityInfo, callbacks: ChangeSetCallbacks) -> Kinds | None:
        """The column kinds of a model whose rows a batch's overlay may hand to later members
        (:func:`~waltz.jdbc_style.entity_cache.column_kinds`), or None; decided once per model."""
        if info not in self._kinds:
            exact_strings = callbacks.engine.dialect.name in EXACT_STRING_DIALECTS
            self._kinds[info] = column_kinds(info, exact_strings)
        return self._kinds[info]

    def submit(self, context: EntityTransactionContext) -> concurrent.futures.Future[Outcome]:
        """Submit a context: at once on its own when its partition has room in flight (and its
        ``linger`` has passed), else in the partition's next batch.

        Returns:
            A future of the context's :class:`~waltz.client.outcome.Outcome`, as
            ``client.submit``'s: committed (with the ID of the log transaction that carried it,
            which it may share), dropped, or already applied; it raises what ``run`` raised, or
            :class:`~waltz.errors.ClientClosedError`.

        Raises:
            CrossPartitionError: the context's entities map to different partitions.
            ClientClosedError: the batcher is closed.
        """
        count = self.client.num_partitions
        partition = context.partition_id(count)
        future: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # as the client's: a commit cannot be recalled
        member = _Member(
            context, future, alone=context.timeout is not None, locks=_expected_locks(context), count=count
        )
        with self._lock:
            if self._closed:
                raise ClientClosedError("the entity batcher is closed")
            queue = self._queues.setdefault(partition, collections.deque())
            queue.append(member)
            if self.linger:
                self._count_submit(partition)
            taken = self._take_ready(partition)
        for members in taken:  # in queue order, as the batches after the first were taken
            self._send(partition, members)
        return member.future

    def _count_submit(self, partition: int) -> None:
        """Under the lock: fold the time since the partition's last submit into its mean."""
        now = time.monotonic()
        last = self._last_submit.get(partition)
        self._last_submit[partition] = now
        if last is not None:
            mean = self._interval.get(partition)
            gap = now - last
            self._interval[partition] = gap if mean is None else mean + LINGER_INTERVAL_WEIGHT * (gap - mean)

    def close(self) -> None:
        """Stop taking contexts; those queued end with :class:`~waltz.errors.ClientClosedError`
        (those in flight end as the client ends them). Idempotent.

        Waits until the sender threads have sent the log transactions taken before the close,
        except when called from the client's completion thread (a context's callback, a future's
        done-callback) or from a sender thread: a sender may be waiting there for a concurrency
        slot that only the completion thread frees, so the close returns at once and those
        transactions are still sent (docs/design/sql.md "Batched entity transactions")."""
        with self._lock:
            self._closed = True
            queued = [m for queue in self._queues.values() for m in queue]
            self._queues.clear()
        for member in queued:
            _fail(member, ClientClosedError("the entity batcher is closed"))
        on_sender = threading.get_ident() in self._sender_idents
        self._sender.shutdown(wait=not (on_sender or self.client.on_completion_thread()))

    def _note_sender(self) -> None:
        """On each new sender thread, before its first send: note it (``close`` from it must not
        wait for the senders)."""
        self._sender_idents.add(threading.get_ident())

    def __enter__(self) -> EntityBatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take_ready(self, partition: int, *, lingered: bool = False) -> list[list[_Member]]:
        """Under the lock: the members of every log transaction the partition can send now, in
        queue order: the next batch, then, while room in flight is left (``max_in_flight`` above 1,
        or a context that may go alone), those after it. Each :meth:`_take` fills a place in
        flight, so this ends within ``max_in_flight + max_in_flight_alone`` takes. Taken members
        are counted in flight and must be sent: should a later take fail (scheduling the linger's
        call on a closed event loop), those taken are returned and the rest stays queued."""
        members = self._take(partition, lingered=lingered)
        taken: list[list[_Member]] = []
        while members:
            taken.append(members)
            try:
                members = self._take(partition)
            except Exception:
                log.exception("partition %d: taking the batch after one failed; it stays queued", partition)
                break
        return taken

    def _take(self, partition: int, *, lingered: bool = False) -> list[_Member]:
        """Under the lock: the members of the partition's next log transaction, when it has room
        in flight (counted taken, their expected locks held), else none. ``lingered``: the
        partition's linger has passed (the call it scheduled)."""
        queue = self._queues.get(partition)
        if not queue:
            return []
        in_flight = self._in_flight.get(partition, 0)
        if in_flight >= self.max_in_flight:
            if not self._goes_alone(partition, queue, in_flight):
                return []
            members = [queue.popleft()]
        elif queue[0].alone:
            members = [queue.popleft()]
        else:
            if not lingered and self._lingers(partition, queue):
                return []
            members = []
            while queue and len(members) < self.max_members and not queue[0].alone:
                members.append(queue.popleft())
            if lingered:
                self.lingered += 1
                self._counts.lingered(partition)
            else:  # taken before the linger's call came (it could not grow): that call is stale
                self._lingering.pop(partition, None)
        if self.linger:
            self._last_sent[partition] = time.monotonic()
        self._in_flight[partition] = in_flight + 1
        self._held.setdefault(partition, collections.Counter()).update(_held_locks(members))
        return members

    def _lingers(self, partition: int, queue: collections.deque[_Member]) -> bool:
        """Under the lock, with room in flight and a context that may join a batch next in the
        queue: whether the partition's next batch waits for the linger (its last log transaction
        went less than ``linger`` ago, or ended less than ``linger`` ago with fewer than one in
        ``LINGER_RETURNING`` of its members' count queued; its contexts have been submitted more
        often than three per linger, and the batch can still grow), scheduling the call that
        sends it when the linger has passed."""
        if not self.linger or self._cannot_grow(queue):
            return False
        if partition in self._lingering:
            return True  # the scheduled call takes it
        if not self._busy(partition):
            return False  # fewer than three contexts per linger: too few would join
        last = self._last_sent.get(partition)
        if last is None:
            return False
        now = time.monotonic()
        delay = last + self.linger - now
        ended, members = self._last_end.get(partition, (now, 0))
        if delay <= 0 and len(queue) * LINGER_RETURNING < members:
            delay = ended + self.linger - now  # its members come back
        if delay <= 0:
            return False
        token = self._lingering[partition] = object()
        loop, _ = shared_event_loop()
        loop.call_soon_threadsafe(loop.call_later, delay, self._linger_passed, partition, token)
        return True

    def _cannot_grow(self, queue: collections.deque[_Member]) -> bool:
        """Under the lock: whether the batch at the head of ``queue`` is as large as it can get:
        ``max_members`` are queued for it, or a context that goes alone (one with a timeout) is
        queued behind it, which no later context can pass."""
        if len(queue) >= self.max_members:
            return True
        return any(member.alone for member in queue)

    def _busy(self, partition: int) -> bool:
        """Under the lock, with a linger: whether the partition's contexts have come more often than
        three per linger (the running mean of the time between its submits)."""
        return self._interval.get(partition, math.inf) * LINGER_MIN_JOINING < self.linger

    def _linger_passed(self, partition: int, token: object) -> None:
        """On the client's event loop: the partition's linger has passed; send its next batch
        (off the loop, on a sender thread), unless a batch that could not grow went meanwhile
        (the call is stale: ``token`` is no longer the partition's)."""
        with self._lock:
            if self._lingering.get(partition) is not token:
                return
            del self._lingering[partition]
            taken = [] if self._closed else self._take_ready(partition, lingered=True)
        self._submit_send(partition, taken)

    def _goes_alone(self, partition: int, queue: collections.deque[_Member], in_flight: int) -> bool:
        """Under the lock, with the partition's ``max_in_flight`` reached: whether the one context
        queued goes at once, alone (nothing else queued, room beyond the limit, expected locks that
        no transaction in flight holds, a context without them waits; and, with a linger, the
        partition's contexts coming less often than three per linger)."""
        if len(queue) != 1 or in_flight >= self.max_in_flight + self.max_in_flight_alone:
            return False
        if self.linger and self._busy(partition):
            return False  # it would take a member from the batch that lingers for it
        locks = queue[0].locks
        if not locks:
            return False
        held = self._held.get(partition)
        return held is None or (None not in held and not any(lock in held for lock in locks))

    def _send(self, partition: int, members: list[_Member]) -> None:
        """Submit one log transaction: the context itself when it is alone, else a batch."""
        try:
            if len(members) == 1:
                future = self.client.submit(members[0].context)
                future.add_done_callback(
                    lambda f: self._ended(partition, f, members, [], members, alone=True)
                )
                return
            batch = _Batch(self, partition, members)
            future = self.client.submit(batch)
            future.add_done_callback(
                lambda f: self._ended(partition, f, batch.appended, batch.deferred, members, batch=batch)
            )
        except BatchPartedError:  # routed at a newer count, its members part: each goes again
            self._ended(partition, None, [], [], members)
            self.regroup(members)
        except Exception as exc:  # the client closed, or the partition is not mounted
            for member in members:
                _fail(member, exc)
            self._ended(partition, None, [], [], members)

    def _ended(
        self,
        partition: int,
        future: concurrent.futures.Future[Outcome] | None,
        appended: list[_Member],
        deferred: list[_Member],
        sent: list[_Member],
        *,
        alone: bool = False,
        batch: _Batch | None = None,
    ) -> None:
        """A log transaction of the partition ended: settle its members (the outcome of a context
        alone as the client gave it; a batch's committed members each committed with its ID, and
        those whose outcome waited for it with theirs), put the members it left for later back
        in front of the queue, and send the next."""
        parted = future is not None and not alone and isinstance(future.exception(), BatchPartedError)
        regrouped = appended
        try:
            if batch is not None and parted:
                regrouped, batch.provisional = list(batch.members), []
            if future is not None and appended and not parted:
                self._settle_members(future, appended, alone)
            if batch is not None and future is not None and not parted:
                error = future.exception()
                batch.end_provisional(error is None and future.result().committed, error)
                if error is not None:
                    # Failed by the client while an attempt was running (closed under it): the
                    # members that attempt had not reached end with the batch too.
                    for member in sent:
                        if not member.future.done() and member not in deferred:
                            batch.end_member(member, error)
        finally:
            self._next(partition, deferred, sent)
        if parted:  # routed again at a newer count, its members part: each goes again
            self.regroup(regrouped)

    def _settle_members(
        self, future: concurrent.futures.Future[Outcome], appended: list[_Member], alone: bool
    ) -> None:
        error = future.exception()
        if error is not None:
            for member in appended:
                _settle(member.future, error)
        elif alone:
            _settle(appended[0].future, future.result())
        else:
            outcome = future.result()
            if outcome.committed and len(appended) > 1:
                with self._lock:
                    self.batches += 1
                    self.batched += len(appended)
                self._counts.committed(outcome.partition_id, len(appended))
            committed = Outcome(OutcomeKind.COMMITTED, outcome.partition_id, outcome.transaction_id)
            for member in appended:
                _settle(member.future, committed)

    def regroup(self, members: list[_Member]) -> None:
        """Queue the members of a batch that a split parted again, each in front of the queue of
        its partition at the client's count now, in their order, and send what has room
        (docs/design/splits.md "Clients across a split"). A member whose own entities part ends
        with its :class:`~waltz.errors.CrossPartitionError`; with the batcher closed, each ends
        with :class:`~waltz.errors.ClientClosedError`."""
        count = self.client.num_partitions
        by_partition: dict[int, list[_Member]] = {}
        for member in members:
            try:
                by_partition.setdefault(member.context.partition_id(count), []).append(member)
            except Exception as exc:  # the member's own entities part: its end
                _fail(member, exc)
            else:
                member.count = count
        log.debug("a batch parted at %d partitions: its members go to %s", count, sorted(by_partition))
        sends: list[tuple[int, list[list[_Member]]]] = []
        with self._lock:
            closed = self._closed
            if not closed:
                for partition, regrouped in by_partition.items():
                    self._queues.setdefault(partition, collections.deque()).extendleft(reversed(regrouped))
                    sends.append((partition, self._take_ready(partition)))
        if closed:
            for regrouped in by_partition.values():
                for member in regrouped:
                    _fail(member, ClientClosedError("the entity batcher is closed"))
            return
        for partition, taken in sends:
            self._submit_send(partition, taken)

    def _next(self, partition: int, deferred: list[_Member], sent: list[_Member]) -> None:
        """The partition's transaction ended: release the locks it held, put back what it left
        for later, send the next."""
        with self._lock:
            self._in_flight[partition] -= 1
            if self.linger:
                self._last_end[partition] = (time.monotonic(), len(sent))
            self._held[partition].subtract(_held_locks(sent))
            self._held[partition] += collections.Counter()  # drops the counts that reached 0
            closed = self._closed
            if deferred and not closed:
                queue = self._queues.setdefault(partition, collections.deque())
                queue.extendleft(reversed(deferred))
            taken = [] if closed else self._take_ready(partition)
        if closed:  # what this transaction left for later has no later
            for member in deferred:
                _fail(member, ClientClosedError("the entity batcher is closed"))
        self._submit_send(partition, taken)

    def _submit_send(self, partition: int, taken: list[list[_Member]]) -> None:
        """Send the log transactions taken for a partition (:meth:`_take_ready`) one after the
        other, in their order, on a sender thread; with the batcher shut down meanwhile their
        members end with :class:`~waltz.errors.ClientClosedError`."""
        if not taken:
            return
        try:
            self._sender.submit(self._send_all, partition, taken)
        except RuntimeError:  # shut down meanwhile
            with self._lock:
                for members in taken:
                    self._in_flight[partition] -= 1
                    self._held[partition].subtract(_held_locks(members))
                self._held[partition] += collections.Counter()
            for members in taken:
                for member in members:
                    _fail(member, ClientClosedError("the entity batcher is closed"))

    def _send_all(self, partition: int, taken: list[list[_Member]]) -> None:
        """On a sender thread: send the partition's taken log transactions in their order."""
        for members in taken:
            self._send(partition, members)
