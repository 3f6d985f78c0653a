"""``ChangeSetCallbacks``: the framework applies change-set transactions itself.

Source: docs/design/sql.md "Change-sets" (one message maps to several DML statements in one SQL
transaction). A service built from declared entities (:mod:`waltz.jdbc_style.entities`) and entity
transaction contexts (:mod:`waltz.jdbc_style.entity_context`) needs no hand-written ``apply``;
the records of a partition split (:mod:`waltz.protocol.split_records`) are applied as changing no
row (docs/design/splits.md "Record forms"); command-style transactions (any other header) go to
:meth:`ChangeSetCallbacks.apply_command`.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import deque
from collections.abc import Collection, Hashable, Sequence
from typing import Any

from sqlalchemy import Engine, and_, bindparam, delete, insert, update
from sqlalchemy.orm import Session

from waltz.client.apply_worker import on_apply_thread
from waltz.client.routing import PartitionRouter
from waltz.client.transaction import Transaction
from waltz.errors import ApplyPausedError, SqlFrameworkError
from waltz.jdbc_style.apply_session import ApplySession
from waltz.jdbc_style.callbacks import AbstractClientCallbacksForSQL
from waltz.jdbc_style.changeset import (
    CHANGE_SET_HEADER,
    ChangeSet,
    ChangeSetFormatError,
    Operation,
    RowChange,
    decode_members,
    repeated_key_members,
)
from waltz.jdbc_style.direct import direct_statements
from waltz.jdbc_style.entities import EntityInfo, EntityNotDeclaredError, EntityRegistry, UnknownEntityError
from waltz.jdbc_style.entity_cache import EntityCache
from waltz.jdbc_style.entity_reads import (
    DEFAULT_TIMEOUT,
    EntityRead,
    read_entities,
    read_entities_from_cache,
)
from waltz.jdbc_style.idempotency import record_idempotency_keys
from waltz.jdbc_style.rows_at_once import RowsShape, describe_rows
from waltz.jdbc_style.upcasting import UpcastError
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitBarrier, decode_split_record

__all__ = ["ChangeSetApplyError", "ChangeSetCallbacks", "partial_row_problem", "row_change_problem"]

log = logging.getLogger(__name__)


class ChangeSetApplyError(ChangeSetFormatError):
    """A change-set does not fit the database: an update or delete found no row to change.

    The database has diverged from the log (edited by hand, or restored inconsistently); the
    transaction is not skipped.
    """


def row_change_problem(
    change: RowChange,
    *,
    key: Sequence[str],
    primary_key: Sequence[str],
    attributes: Collection[str],
    model_name: str,
) -> str | None:
    """What makes a row change not fit its entity's model, or None when it fits
    (docs/design/sql.md "Change-sets"): its key must name exactly the entity's key attributes (or
    its primary key's, which identify one row too), its values only column attributes, the key
    values in an insert's or update's row must be the key's, and an insert's row must carry every
    key attribute (else the database would give the row a key of its choosing, autoincrement or
    default, and the row would differ from the log's).

    The live apply (:class:`ChangeSetCallbacks`) and the Spark rebuild
    (:func:`waltz.spark.views.change_problems`) refuse the same changes with it.

    Args:
        change: the row change (values as decoded, or all rendered as text: only equality is used).
        key: the entity's key attribute names.
        primary_key: the attribute names of its model's primary key.
        attributes: every column attribute name of its model.
        model_name: the model's class name, for the message.

    Returns:
        A sentence naming the change and what does not fit, or None.
    """
    what = f"{change.operation.value} of {change.entity}"
    if set(change.key) != set(key) and set(change.key) != set(primary_key):
        return (
            f"{what} has the key attributes {sorted(change.key)}, but the entity's key is "
            f"{list(key)} (or its primary key {list(primary_key)})"
        )
    unknown = sorted(set(change.values) - set(attributes))
    if unknown:
        return (
            f"{what} sets {unknown}, which are not column attributes of {model_name} (a model "
            "changed without an upcaster for the records written before? declare its schema_version "
            'and an upcaster, e.g. RenameAttribute: docs/sql.md, "Changing a model")'
        )
    moved = [n for n in change.key if n in change.values and change.values[n] != change.key[n]]
    if moved:
        return f"{what} {dict(change.key)} changes its key attributes {moved}"
    if change.operation is Operation.INSERT:
        absent = [n for n in change.key if n not in change.values]
        if absent:
            return (
                f"{what} {dict(change.key)} does not carry its key attributes {absent} in its values "
                "(the database would choose the new row's key)"
            )
    return None


def left_out_attributes(
    change: RowChange, attributes: Collection[str], defaulted: Collection[str]
) -> list[str]:
    """The attributes a row change leaves out that the live apply and a rebuild's replay would
    give different values (:func:`partial_row_problem`), sorted: every attribute an update does
    not carry, and those with a column default an insert does not carry; none for a delete."""
    if change.operation is Operation.DELETE:
        return []
    wanted = attributes if change.operation is Operation.UPDATE else defaulted
    return sorted(set(wanted) - set(change.values))


def partial_row_problem(
    change: RowChange, attributes: Collection[str], defaulted: Collection[str]
) -> str | None:
    """What keeps a rebuild's replay (:func:`waltz.spark.views.replay`) from rebuilding a row
    change's row exactly, or None.

    The replay takes a key's last insert or update as its row, with the attributes that change
    does not carry empty (docs/design/spark.md "Computing views"). The live apply gives them other
    values: an update that sets only some attributes keeps the others' old values, and an insert
    gives those it does not carry their column defaults. Such a change would rebuild a table that
    differs from the live one, so the rebuild refuses it. An insert that leaves out an attribute
    without a default is no problem: both give it NULL. The live apply refuses such a change too
    when upcasters made it (docs/design/sql.md "Schema versions and upcasting"): the upcasters do
    not lead its older version to the model.

    Args:
        change: the row change (values as decoded, or rendered as text).
        attributes: every column attribute name of its entity's model.
        defaulted: the attributes whose columns have a default (SQLAlchemy's or the server's).

    Returns:
        A sentence naming the change and the attributes it leaves out, or None.
    """
    missing = left_out_attributes(change, attributes, defaulted)
    if not missing:
        return None
    if change.operation is Operation.UPDATE:
        kept, remedy = "old", "carry the whole row, as the entity transactions' updates do"
    else:
        kept, remedy = "default", "give them values in the insert"
    return (
        f"{change.operation.value} of {change.entity} {dict(change.key)} leaves out {missing}, which "
        f"the live apply gives their {kept} values and a rebuild cannot ({remedy}; if the model gained "
        "them after this change was written, raise its schema_version and give the older version an "
        'AddAttribute upcaster: docs/sql.md, "Changing a model")'
    )


#: Databases whose default collations compare strings exactly (``'abc'``, ``'ABC'`` and
#: ``'abc '`` are three keys): the entity cache keeps models keyed by string columns there.
EXACT_STRING_DIALECTS = frozenset({"postgresql", "sqlite"})


class ChangeSetCallbacks(AbstractClientCallbacksForSQL):
    """Callbacks that apply change-set transactions of declared entities, exactly once.

    Args:
        engine: the application database.
        cluster_name: the log this database follows (see :class:`AbstractClientCallbacksForSQL`).
        registry: the application's declared models.
        entity_cache: keep the rows of entities as this instance applies them, so that entity
            transactions read them without a database snapshot (:mod:`waltz.jdbc_style.entity_cache`,
            docs/design/sql.md "The entity cache"). None (the default): on unless a subclass
            overrides :meth:`apply`, :meth:`apply_change_set` or :meth:`apply_change` (which may
            write entity rows the change-set does not carry); a subclass whose override writes
            only other tables passes True. Turn it off when something other than this log's
            applies writes the entity tables (triggers, other programs).
        kwargs: more :class:`AbstractClientCallbacksForSQL` arguments.

    Attributes:
        uncaught: the last 100 ``(partition_id, transaction_id, exception)`` reported to
            :meth:`uncaught_exception`; ``uncaught_count`` counts them all.
        entity_cache: the :class:`~waltz.jdbc_style.entity_cache.EntityCache`, or None (off).
    """

    #: A barrier or a genesis reaches :meth:`apply`: the entity cache follows them.
    applies_split_records = True

    #: On PostgreSQL with psycopg, an apply's staged row changes of one shape (model, operation,
    #: attribute names), five or more, run in rounds that each write a row at most once, a round
    #: of five or more as one statement over arrays of their values (docs/design/sql.md
    #: "Rows of one shape in one statement"); False runs them one parameter set at a time, as a
    #: statement-level trigger that should fire once per row change (or an AFTER row trigger that
    #: must see each change at once) needs.
    rows_at_once = True

    def __init__(
        self,
        engine: Engine,
        *,
        cluster_name: str,
        registry: EntityRegistry,
        entity_cache: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(engine, cluster_name=cluster_name, **kwargs)
        if kwargs.get("check_schema", True):
            present = check_model_tables(self.engine, registry)
            warn_of_another_name(self.engine, cluster_name, present)
        if entity_cache is None:
            cls = type(self)
            entity_cache = (
                cls.apply is ChangeSetCallbacks.apply
                and cls.apply_change_set is ChangeSetCallbacks.apply_change_set
                and cls.apply_change is ChangeSetCallbacks.apply_change
            )
        # PostgreSQL and SQLite compare strings exactly: models keyed by strings may be kept too.
        exact_strings = engine.dialect.name in EXACT_STRING_DIALECTS
        self.entity_cache: EntityCache | None = (
            EntityCache(registry, exact_string_keys=exact_strings) if entity_cache else None
        )
        # Change-sets decoded by apply (the members of each transaction), by partition and
        # transaction, for the entity cache.
        self._decoded: dict[int, dict[int, tuple[ChangeSet, ...]]] = {}
        # With the entity cache, by partition and (transaction, member): whether the apply in
        # progress recorded a change-set's idempotency key first (its changes applied), for the
        # cache to settle the entries the change-set left pending once the apply commits.
        self._key_outcomes: dict[int, dict[tuple[int, int], bool]] = {}
        # By partition: the member of the transaction being applied (one apply thread each).
        self._members: dict[int, int] = {}
        # By partition, while a batch is applied: its members' keys, recorded up front in two
        # statements, and whether the batch's transaction recorded each first.
        self._recorded: dict[int, dict[str, bool]] = {}
        # Statements of staged row changes, built once per (model, operation, attribute names).
        self._statements: dict[RowsShape, Any] = {}
        self.registry = registry
        self.uncaught: deque[tuple[int, int, BaseException]] = deque(maxlen=100)
        self.uncaught_count = 0
        self._uncaught_lock = threading.Lock()
        # Per partition, the failure last logged with its traceback: (transaction ID, error text).
        self._uncaught_logged: dict[int, tuple[int, str]] = {}

    def apply(self, transaction: Transaction, session: Session) -> None:
        """Apply a change-set transaction, each of a batch's members in order through
        :meth:`apply_change_set`; pass a split record (a barrier or a genesis) over, changing no
        row (its partition's mark moves past it); hand others to :meth:`apply_command`.

        Raises:
            ChangeSetFormatError: the data is not a valid change-set.
            ChangeSetApplyError: an update or delete found no row.
            UnknownEntityError: the change-set names an entity the registry does not know.
            SplitRecordVersionError: a split record of a form newer than this code reads (an
                :class:`~waltz.errors.ApplyPausedError`: the partition waits for an upgrade).
            SplitRecordFormatError: a split record that is not one of the form it declares.
        """
        if transaction.header == SPLIT_RECORD_HEADER:
            self._split_record_members(transaction)
            return
        if transaction.header != CHANGE_SET_HEADER:
            self.apply_command(transaction, session)
            return
        pid = transaction.partition_id
        members = self._members_of(transaction)
        if len(members) == 1:
            self.apply_change_set(members[0], transaction, session)
            return
        repeated = repeated_key_members(members)
        if type(self).record_idempotency_key is AbstractClientCallbacksForSQL.record_idempotency_key:
            batch_keys = [m.idempotency_key for m in members if m.idempotency_key is not None]
            if batch_keys:  # the members' keys in two statements, not two per member
                self._recorded[pid] = record_idempotency_keys(
                    session.connection(),
                    cluster_name=self.cluster_name,
                    keys=batch_keys,
                    partition_id=pid,
                    transaction_id=transaction.transaction_id,
                )
        try:
            for index, member in enumerate(members):
                self._members[pid] = index
                if index in repeated:
                    # The key is recorded for this transaction already: a second copy of the
                    # request in one batch changes nothing, as a copy in a later transaction.
                    self._skip_repeated(member, transaction, index)
                    continue
                self.apply_change_set(member, transaction, session)
        finally:
            self._members.pop(pid, None)
            self._recorded.pop(pid, None)

    def _skip_repeated(self, member: ChangeSet, transaction: Transaction, index: int) -> None:
        if self.entity_cache is not None:
            self._key_outcomes.setdefault(transaction.partition_id, {})[transaction.transaction_id, index] = (
                False
            )
        log.info(
            "partition %d transaction %d member %d: request %r is an earlier member's; changes skipped",
            transaction.partition_id,
            transaction.transaction_id,
            index,
            member.idempotency_key,
        )

    def member_index(self, transaction: Transaction) -> int:
        """Which change-set of ``transaction`` is being applied: 0 for a transaction of one
        change-set, the member's place in a batch (docs/design/sql.md "Batched change-sets").
        For an override of :meth:`apply_change_set` that keeps rows per change-set, keyed by
        transaction and member."""
        return self._members.get(transaction.partition_id, 0)

    def _members_of(self, transaction: Transaction) -> tuple[ChangeSet, ...]:
        """The transaction's change-sets (one, or a batch's members), decoded and upcast to the
        current models (with the entity cache, once for the absorb and the apply, and kept until
        the apply ends): the one decoding step of the live apply and the cache
        (docs/design/sql.md "Schema versions and upcasting").

        Raises:
            ChangeSetFormatError: the data is not a valid change-set.
            UpcastError: an upcaster failed on one of its row changes.
            ApplyPausedError: a form or a schema version newer than this instance knows (its
                partition waits for an upgrade).
        """
        if self.entity_cache is None:
            return self._decode(transaction)
        decoded = self._decoded.setdefault(transaction.partition_id, {})
        members = decoded.get(transaction.transaction_id)
        if members is None:
            members = self._decode(transaction)
            decoded[transaction.transaction_id] = members
        return members

    def _split_record_members(self, transaction: Transaction) -> tuple[ChangeSet, ...] | None:
        """Read a split record (docs/design/splits.md "Record forms"): the change-sets the entity
        cache follows for it, none for a barrier (kept, with the cache, until the apply ends, as
        :meth:`_members_of` keeps a change-set's), None for a genesis, which starts a new child's
        log: the cache starts that partition again, empty (docs/design/splits.md "The SQL
        framework across a split").

        Raises:
            SplitRecordVersionError: a form newer than this code reads.
            SplitRecordFormatError: not a barrier or a genesis of form 1.
        """
        record = decode_split_record(transaction.get_raw_data())
        if not isinstance(record, SplitBarrier):
            return None
        if self.entity_cache is not None:
            self._decoded.setdefault(transaction.partition_id, {})[transaction.transaction_id] = ()
        return ()

    def _decode(self, transaction: Transaction) -> tuple[ChangeSet, ...]:
        chains = self.registry.schema_chains()
        written = decode_members(transaction.get_raw_data())
        members = tuple(chains.upcast(member) for member in written)
        if chains.upcasts:
            for before, after in zip(written, members, strict=True):
                if after is not before:
                    self._check_upcast(before, after, chains.retired, transaction)
        return members

    def _check_upcast(
        self, written: ChangeSet, upcast: ChangeSet, retired: Collection[str], transaction: Transaction
    ) -> None:
        """Refuse a row change of an older schema version that its upcasters did not make a row of
        the current model: one a rebuild cannot replay (:func:`partial_row_problem`: an update
        without every attribute, an insert without one that has a default), as an attribute the
        model gained without an ``AddAttribute``. Applied, it would take the column's default, or
        keep the row's value, where the migrated database holds what the migration gave it, and a
        rebuild refuses it (docs/design/sql.md "Schema versions and upcasting").

        Raises:
            UpcastError: naming the transaction, the change, its versions and what it lacks.
        """
        kept = [change for change in written.changes if change.entity not in retired]
        for before, after in zip(kept, upcast.changes, strict=True):
            if before.schema_version == after.schema_version:
                continue
            info = self.registry.by_name(after.entity)
            missing = left_out_attributes(after, info.attributes, info.defaulted)
            if not missing:
                continue
            raise UpcastError(
                f"{self._where(transaction)}: {after.operation.value} of {after.entity} {dict(after.key)}, "
                f"written at schema version {before.schema_version} and upcast to {after.schema_version}, "
                f"lacks {missing}: no upcaster gives them to the older version's changes, so its apply "
                "would take defaults or keep old values where the migrated database holds what the "
                f"migration gave, and a rebuild refuses it. Declare AddAttribute({before.schema_version}, "
                f"{missing[0]!r}, value) with the value the migration gives the rows already there "
                '(docs/sql.md, "Changing a model"); this transaction is not applied, and never skipped'
            )

    def read_entities(
        self,
        entities: Sequence[tuple[type[Any], Any]],
        *,
        num_partitions: int | PartitionRouter,
        after: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> EntityRead:
        """Read declared entities of one partition as of one position, without a log transaction:
        from the entity cache when it holds them all (no database round trip), else from a
        snapshot that reads the partition's mark and the rows in one statement (docs/design/sql.md
        "Reading entities outside a transaction").

        Args:
            entities: ``(model, key)`` pairs, all of one partition; a key as ``tx.get`` takes it
                (a scalar, a tuple or a mapping of the key attributes).
            num_partitions: the client (a :class:`~waltz.client.routing.PartitionRouter`): the
                entities' partition is the one their transactions go to now, routed by the
                client's view of the partition epochs, during a split too (docs/design/splits.md
                "Clients across a split"), and a new partition of a split is read once its
                genesis, ``B(p) + 1``, is applied (before it, the rows of its keys may miss their
                parent's last changes; ``after`` is raised to it, ``timeout`` bounds the wait); or
                a count: their partition at that count, computed as a transaction's is.
            after: a transaction ID of that partition the read must include (read-your-writes:
                the ID a submission's future returned); None: whatever position the read finds.
                Not on that partition's apply thread (it would wait for its own apply).
            timeout: seconds to wait for the database to apply ``after`` when what was read (the
                cache, or the database at its mark) is older.

        Returns:
            :class:`~waltz.jdbc_style.entity_reads.EntityRead`: ``partition_id``,
            ``high_water_mark`` (the position the entities are at), ``entities`` (detached
            instances or None, in the order asked) and ``from_cache``.

        Raises:
            UnknownEntityError: a model is not declared.
            CrossPartitionError: the entities belong to different partitions.
            ValueError: a key has the wrong number of values, ``entities`` is empty, or a model's
                ``partition_by`` gives a partition outside ``0 .. num_partitions - 1``.
            TimeoutError: ``after`` (or a new partition's genesis) was not applied within
                ``timeout``.
            RuntimeError: ``after`` is not applied yet and this is the partition's apply thread.
            sqlalchemy.exc.DBAPIError: the database failed beyond the callbacks' retries.
        """
        return read_entities(self, entities, num_partitions=num_partitions, after=after, timeout=timeout)

    async def read_entities_async(
        self,
        entities: Sequence[tuple[type[Any], Any]],
        *,
        num_partitions: int | PartitionRouter,
        after: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> EntityRead:
        """The ``await`` twin of :meth:`read_entities` (same arguments, result and errors): an
        answer of the entity cache alone is given on the event loop (memory only); a read of the
        database, and a wait for ``after``, run on the framework's threads (docs/design/sql.md
        "The SQL framework on asyncio")."""
        cached = read_entities_from_cache(self, entities, num_partitions=num_partitions, after=after)
        if cached is not None:
            return cached
        read = functools.partial(read_entities, self, entities, num_partitions=num_partitions)
        found = await self.run_in_executor(read)
        if after is None or found.high_water_mark >= after:
            return found
        if not await self.wait_for_async(found.partition_id, after, timeout):  # no thread waits
            raise TimeoutError(
                f"transaction {after} of partition {found.partition_id} was not applied within {timeout:g}s"
            )
        return await self.run_in_executor(functools.partial(read, after=after, timeout=timeout))

    def catch_up_to_cache(self, partition_id: int) -> None:
        """Before a database read: let this instance's applies reach the entity cache's position,
        which may be ahead of them (absorbed, not yet applied), so that the read is not older than
        what was already read from the cache or waited for. Bounded (see
        :meth:`wait_applied_here`); never on an apply thread, which would wait for itself; nothing
        without the cache or before it has a position."""
        cache = self.entity_cache
        position = None if cache is None else cache.position(partition_id)
        if position is not None and not on_apply_thread():
            self.wait_applied_here(partition_id, position)

    # --- the entity cache ---------------------------------------------------------------------------

    @property
    def absorbs_transactions(self) -> bool:
        """True with the entity cache: it follows each apply batch before the batch is applied."""
        return self.entity_cache is not None

    def absorb_transactions(self, transactions: Sequence[Transaction]) -> None:
        """Move the entity cache by a batch the client is about to apply (docs/design/sql.md
        "The entity cache"): a split barrier changes no row; a genesis, a transaction that is not
        a change-set and one that is not valid reset it (its apply reports the error)."""
        cache = self.entity_cache
        if cache is None or not transactions:
            return
        change_sets: list[tuple[ChangeSet, ...] | None] = []
        for transaction in transactions:
            members = None
            try:
                if transaction.header == CHANGE_SET_HEADER:
                    members = self._members_of(transaction)
                elif transaction.header == SPLIT_RECORD_HEADER:
                    members = self._split_record_members(transaction)
            except Exception:  # the apply raises it where it is reported and retried
                members = None
            change_sets.append(members)
        cache.absorb(transactions[0].partition_id, transactions[0].transaction_id, change_sets)

    def absorb_floor(self, partition_id: int, mark: int) -> None:
        """Transactions up to ``mark`` were found applied at a mount: the cache starts there."""
        if self.entity_cache is not None:
            self.entity_cache.floor(partition_id, mark)

    def absorb_stopped(self, partition_id: int) -> None:
        """The client no longer follows the partition: the entity cache forgets it (its rows
        would fall behind the log) until a mount starts it again."""
        if self.entity_cache is not None:
            self.entity_cache.stop(partition_id)

    def _after_apply(self, partition_id: int, applied: Sequence[Transaction], mark: int) -> None:
        """After a group is known applied: the entity cache follows what this instance applied
        (absorbed already when the client absorbed it first), or drops its rows when another
        instance applied the group (whole or in part; the database may lack an operator's skip)."""
        cache = self.entity_cache
        if cache is None:
            return
        decoded = self._decoded.pop(partition_id, None) or {}
        noted = self._key_outcomes.pop(partition_id, None) or {}
        if not applied:
            cache.drop_rows(partition_id)
            cache.floor(partition_id, mark)
            return
        change_sets = [decoded.get(t.transaction_id) for t in applied]
        cache.absorb(partition_id, applied[0].transaction_id, change_sets)
        outcomes = {
            (t.transaction_id, index): noted.get((t.transaction_id, index), False)  # not noted: not kept
            for t, members in zip(applied, change_sets, strict=True)
            for index, member in enumerate(members or ())
            if member.idempotency_key is not None
        }
        if outcomes:
            cache.settle(partition_id, outcomes)

    def _apply_failed(self, partition_id: int) -> None:
        """An apply failed: the entity cache drops its rows (an operator may skip the transaction
        it absorbed); rows come back from the database."""
        self._decoded.pop(partition_id, None)
        self._key_outcomes.pop(partition_id, None)
        if self.entity_cache is not None:
            self.entity_cache.drop_rows(partition_id)

    def apply_change_set(self, change_set: ChangeSet, transaction: Transaction, session: Session) -> None:
        """Apply a decoded change-set: record its idempotency key (skipping a repeated request's
        changes), then each row change in order. Called once per change-set, for each member of a
        batch in order (:meth:`member_index` says which). Override to add to it (e.g. an audit row
        from ``change_set.meta``) and call ``super()``.

        Raises:
            ChangeSetApplyError: an update or delete found no row.
        """
        key = change_set.idempotency_key
        if key is None:
            recorded = True
        else:
            known = self._recorded.get(transaction.partition_id)
            if known is not None and key in known:  # recorded with the batch's other keys
                recorded = known[key]
            else:
                recorded = self.record_idempotency_key(session, key, transaction)
            if self.entity_cache is not None:  # settles what the change-set left in the cache
                noted = self._key_outcomes.setdefault(transaction.partition_id, {})
                noted[transaction.transaction_id, self.member_index(transaction)] = recorded
        if not recorded:
            log.info(
                "partition %d transaction %d: request %r was applied before; its changes are skipped",
                transaction.partition_id,
                transaction.transaction_id,
                change_set.idempotency_key,
            )
            return
        for change in change_set.changes:
            self.apply_change(change, session, transaction)

    def apply_change(self, change: RowChange, session: Session, transaction: Transaction) -> None:
        """Apply one row change (override to customise, e.g. to keep history rows).

        Raises:
            ChangeSetApplyError: an update or delete found no row.
            EntityNotDeclaredError: the registry neither declares nor retires the entity (the
                partition waits for this instance's upgrade, or for the entity to be retired).
        """
        try:
            info = self.registry.by_name(change.entity)
        except UnknownEntityError as exc:
            declared = sorted(info.spec.lock_name for info in self.registry)
            raise EntityNotDeclaredError(
                f"{self._where(transaction)}: {change.operation.value} of {change.entity!r}, an entity this "
                f"instance's registry does not declare (declared: {declared}): "
                "a newer release may declare it (this partition waits until this instance runs it), or the "
                "application dropped its model: then retire it, EntityRegistry(..., retired=["
                f'{change.entity!r}]) (docs/sql.md, "Changing a model")'
            ) from exc
        self._check_change(info, change, self._where(transaction))
        model = info.model
        if isinstance(session, ApplySession) and self._stageable(info, change):
            statement, parameters = self._shaped(model, change)
            if not session.alone:
                session.stage(
                    statement,
                    parameters,
                    rows=None if change.operation is Operation.INSERT else 1,
                    row=_row_of(info, change),
                )
                return
            # Applied again alone, after the staged try failed: the statement built once, run at
            # once on the session's connection (after the staged writes and, as session.execute
            # would, an autoflush of the session), so that a missing row names its change.
            if session.autoflush:
                session.flush()
            connection = session.connection()
            rowcount = direct_statements(connection.engine).run(connection, statement, (parameters,))
        elif change.operation is Operation.INSERT:
            session.execute(insert(model).values(**change.values))
            return
        else:
            where = and_(*(getattr(model, name) == value for name, value in change.key.items()))
            if change.operation is Operation.UPDATE:
                stmt: Any = update(model).where(where).values(**change.values)
            else:
                stmt = delete(model).where(where)
            rowcount = session.execute(stmt.execution_options(synchronize_session=False)).rowcount  # type: ignore[attr-defined]
        if change.operation is Operation.INSERT:
            return
        if rowcount != 1:
            found = "no row" if rowcount == 0 else f"{rowcount} rows"
            raise ChangeSetApplyError(
                f"{self._where(transaction)}: {change.operation.value} of {change.entity} "
                f"{dict(change.key)} found {found}, not one; the database has diverged from the log, "
                "or the entity's key does not identify "
                "a row (restore the database or rebuild it from the log; nothing was changed)"
            )

    def _where(self, transaction: Transaction) -> str:
        """The transaction, and the member of a batch being applied, for an error message."""
        where = f"partition {transaction.partition_id} transaction {transaction.transaction_id}"
        member = self._members.get(transaction.partition_id)
        return where if member is None else f"{where} member {member}"

    @staticmethod
    def _check_change(info: EntityInfo, change: RowChange, where: str) -> None:
        """Refuse a row change that does not fit its model before it reaches the database: its key
        must name exactly the entity's key attributes (or its primary key's, which identify one row
        too), its values only column attributes, and the key values in an insert's or update's row
        must be the key's.

        Raises:
            ChangeSetFormatError: naming the transaction and what does not fit.
        """
        problem = row_change_problem(
            change,
            key=info.key,
            primary_key=info.primary_key,
            attributes=info.attributes,
            model_name=info.model.__name__,
        )
        if problem is not None:
            raise ChangeSetFormatError(f"{where}: {problem}; refused")

    @staticmethod
    def _stageable(info: EntityInfo, change: RowChange) -> bool:
        """Whether a row change runs as a statement built once per shape (:meth:`_shaped`),
        staged: an insert, or an update or delete by the
        whole primary key (so that each hits at most one row, and the summed row count of a
        statement's parameter sets is exactly the check that every one hit one). Staged writes
        (of a group, or of one transaction) run by statement; each change names its row
        (:func:`_row_of`), so that a row written again by a statement staged earlier than its
        last write's runs the staged writes first: the changes of one row keep the log's order.
        A change that still depended on the order (a row named by other values than its primary
        key's) fails the row count or a unique key, and the group is applied again one
        transaction at a time, and a transaction alone with each change written at once, in
        order (:attr:`ApplySession.alone`)."""
        return change.operation is Operation.INSERT or set(change.key) == set(info.primary_key)

    def _shaped(self, model: type[Any], change: RowChange) -> tuple[Any, dict[str, Any]]:
        """A row change (see :meth:`_stageable`) as a statement built once per shape (model,
        operation, attribute names) and its parameters."""
        operation = change.operation
        keys = tuple(sorted(change.key)) if operation is not Operation.INSERT else ()
        values = tuple(sorted(change.values)) if operation is not Operation.DELETE else ()
        shape = RowsShape(model, operation, keys, values)
        statement = self._statements.get(shape)
        if statement is None:
            if operation is Operation.INSERT:
                # Bound by attribute name: a parameter dict keyed by attribute names would be
                # matched against column keys, and a renamed column's value silently dropped.
                statement = insert(model).values({name: bindparam(f"v_{name}") for name in values})
            else:
                where = and_(*(getattr(model, name) == bindparam(f"k_{name}") for name in keys))
                if operation is Operation.UPDATE:
                    statement = (
                        update(model).where(where).values({name: bindparam(f"v_{name}") for name in values})
                    )
                else:
                    statement = delete(model).where(where)
            if self.rows_at_once:
                describe_rows(statement, shape)
            self._statements[shape] = statement
        parameters = {f"k_{name}": change.key[name] for name in keys}
        if operation is not Operation.DELETE:
            parameters.update({f"v_{name}": value for name, value in change.values.items()})
        return statement, parameters

    def apply_command(self, transaction: Transaction, session: Session) -> None:
        """Apply a transaction that is neither a change-set nor a split record (override for
        command-style data).

        Raises:
            NotImplementedError: by default, naming the header and the usual cause: another
                program's transactions in the application's partitions (docs/sql.md, "Skipping a
                transaction whose apply keeps failing").
        """
        raise NotImplementedError(
            f"partition {transaction.partition_id} transaction {transaction.transaction_id} has header "
            f"{transaction.header}, not a change-set ({CHANGE_SET_HEADER}): another program wrote it "
            "into this application's partitions (a log is one application's: a plain client's, or the "
            "`waltz client validate` of an earlier release). Give the application a cluster of its own, "
            "pass over the transaction with `waltz db skip`, or override apply_command() to apply "
            "command-style transactions"
        )

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        """Log the failure (ERROR, with traceback) and keep it in :attr:`uncaught`; a transaction
        that waits for this instance's upgrade (:class:`~waltz.errors.ApplyPausedError`) is logged
        as a WARNING, without traceback and without the advice to skip it. The same failure again
        (the same transaction of the partition, the same error), at the client's retries, is kept
        and counted but not logged again: the client logs each retry in a line of its own."""
        key = (transaction_id, f"{type(exception).__name__}: {exception}")
        with self._uncaught_lock:
            self.uncaught.append((partition_id, transaction_id, exception))
            self.uncaught_count += 1
            again = self._uncaught_logged.get(partition_id) == key
            self._uncaught_logged[partition_id] = key
        if again:
            return
        if isinstance(exception, ApplyPausedError):
            log.warning(
                "cluster %r partition %d waits at transaction %d for this instance's upgrade: %s",
                self.cluster_name,
                partition_id,
                transaction_id,
                exception,
            )
            return
        log.error(
            "cluster %r partition %d: applying transaction %d failed; it is retried and never skipped "
            "(an operator can skip it with `waltz db skip`)",
            self.cluster_name,
            partition_id,
            transaction_id,
            exc_info=exception,
        )


class ModelTablesBehindError(SqlFrameworkError):
    """A registered model maps columns its table in the database lacks: the application's own
    migrations have not been run for this release (docs/sql.md, "Changing a model")."""


def check_model_tables(engine: Engine, registry: EntityRegistry) -> list[EntityInfo]:
    """Check that every registered model's table, where it exists, has the columns the model maps
    (a table not created yet is left to the application: a warning names it, since every apply of
    a change to it fails until the application's migrations create it).

    Returns:
        The registered models whose tables exist.

    Raises:
        ModelTablesBehindError: a table lacks columns of its model; the message names them and the
            migrations to run.
    """
    from sqlalchemy import inspect as inspect_database

    with engine.connect() as conn:
        inspector = inspect_database(conn)
        behind = []
        absent = []
        existing: list[EntityInfo] = []
        for info in registry:
            table = info.model.__table__
            if not inspector.has_table(table.name, schema=table.schema):
                absent.append(f"{table.name} ({info.model.__name__})")
                continue
            existing.append(info)
            present = {column["name"] for column in inspector.get_columns(table.name, schema=table.schema)}
            missing = sorted(column.name for column in table.columns if column.name not in present)
            if missing:
                behind.append(f"table {table.name} lacks {missing}, which {info.model.__name__} maps")
    if absent:
        log.warning(
            "tables %s are not in %s yet: every apply of a change to them fails, and is retried, until "
            "the application's migrations create them (e.g. `alembic upgrade head`)",
            ", ".join(absent),
            engine.url.render_as_string(hide_password=True),
        )
    if behind:
        raise ModelTablesBehindError(
            f"{'; '.join(behind)} on {engine.url.render_as_string(hide_password=True)}: run the "
            "application's migrations for this release (e.g. `alembic upgrade head`) before it starts, "
            "or pass check_schema=False"
        )
    return existing


def warn_of_another_name(engine: Engine, cluster_name: str, models: Sequence[EntityInfo]) -> None:
    """Log a warning when the database holds other logs' marks and none of ``cluster_name``'s,
    while a table of ``models`` (registered models whose tables exist, as
    :func:`check_model_tables` returns them) holds rows: an instance started under a new name
    applies the log from its start onto them, which is right only for a second log of the
    database (docs/design/sql.md, "Migrations")."""
    from sqlalchemy import select

    from waltz.jdbc_style.marks import HighWaterMarks, logs_followed

    with engine.connect() as conn:
        # Asked of the database, which compares the names as its collation does (MariaDB's
        # default calls "Ledger" and "ledger" equal: an instance named either resumes the log).
        if HighWaterMarks(cluster_name).read_all(conn):
            return
        others = logs_followed(conn)
        if not others:
            return
        held = [
            info.model.__table__.name
            for info in models
            if conn.execute(select(1).select_from(info.model.__table__).limit(1)).first() is not None
        ]
    if held:
        log.warning(
            "%s holds the marks of the logs %s, none of %r, and rows in %s: this instance applies the "
            "log %r from its start onto those rows (an insert of a row already there fails its apply "
            "for good). If this database follows that log under another name, give that cluster_name; "
            "for a second log of the database, nothing is wrong (said until its marks exist)",
            engine.url.render_as_string(hide_password=True),
            sorted(others),
            cluster_name,
            ", ".join(held),
            cluster_name,
        )


def _row_of(info: EntityInfo, change: RowChange) -> Hashable | None:
    """The row a staged change writes: its table and primary key values (from the key of an
    update or delete, the values of an insert), or None when they are not all given or cannot
    name a row (unhashable)."""
    source = change.values if change.operation is Operation.INSERT else change.key
    try:
        row = (info.mapper.local_table, tuple(source[name] for name in info.primary_key))
        hash(row)
    except (KeyError, TypeError):  # not all given, or a value no row is named by
        return None
    return row
