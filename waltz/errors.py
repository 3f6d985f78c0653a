"""The waltz-py exception hierarchy.

Every error raised on purpose by waltz-py derives from :class:`WaltzError`. Messages say what
happened, with the values involved, and what to do next.
"""

from __future__ import annotations

__all__ = [
    "ApplyContractError",
    "ApplyPausedError",
    "ArchivedReadError",
    "AsyncCallbackError",
    "AsyncClientError",
    "BelowCommittedError",
    "ClientAheadOfLogError",
    "ClientClosedError",
    "ClusterKeyMismatchError",
    "ClusterNotFoundError",
    "ConfigurationError",
    "CorruptDataError",
    "CrossPartitionError",
    "DiskFullError",
    "ExpiredCertificateError",
    "GenerationFencedError",
    "GenesisHeldError",
    "HighWaterMarkGapError",
    "MessageTooLargeError",
    "MetadataError",
    "ParentNotSealedError",
    "PartitionNotAssignedError",
    "PartitionNotMountedError",
    "PartitionNotOpenError",
    "PartitionPausedError",
    "PartitionUnavailableError",
    "ProtocolError",
    "ReadOnlySessionError",
    "RecordsArchivedError",
    "ServerFeedError",
    "SessionFencedError",
    "SessionJumpTooLargeError",
    "SessionNotOpenError",
    "SplitRecordFormatError",
    "SplitRecordVersionError",
    "SplitStateError",
    "SplitStorageError",
    "SqlFrameworkError",
    "StagedRowCountError",
    "StaleMetadataError",
    "StalePartitionEpochError",
    "StorageError",
    "StorageNotInitializedError",
    "StorageRpcError",
    "TransactionApplyError",
    "TransactionDataError",
    "TransactionExpiredError",
    "WaltzClientError",
    "WaltzError",
    "WaltzTimeoutError",
]


class WaltzError(Exception):
    """Base class of every error waltz-py raises on purpose."""


class ConfigurationError(WaltzError):
    """A configuration file, environment variable or command-line value is invalid."""


class ExpiredCertificateError(ConfigurationError):
    """A certificate about to be presented has expired: every peer would refuse it
    (docs/operations.md, "Certificates")."""


class MetadataError(WaltzError):
    """Cluster metadata in ZooKeeper is missing, malformed, or changed under us."""


class ClusterNotFoundError(MetadataError):
    """No cluster exists under the given cluster root."""


class StaleMetadataError(MetadataError):
    """A compare-and-set on a znode failed: someone else changed it first."""


class GenerationFencedError(MetadataError):
    """The partition's stored generation is higher than ours: a newer server owns the partition.

    Attributes:
        partition_id: the partition.
        generation: our generation.
        current_generation: the stored (higher) generation.
    """

    def __init__(self, partition_id: int, generation: int, current_generation: int) -> None:
        super().__init__(
            f"partition {partition_id}: generation {generation} is fenced by generation "
            f"{current_generation}; the partition has moved to another server"
        )
        self.partition_id = partition_id
        self.generation = generation
        self.current_generation = current_generation


class SplitStateError(MetadataError):
    """A change of ``<root>/partitions/epochs`` that the split's state refuses: a count that is not
    a whole multiple of at least 2 of the current one, another split unfinished, a barrier that
    differs from the one written, a genesis before its parent's barrier, an abort after a parent
    started sealing (docs/design/splits.md "What ZooKeeper holds", "The handover"). The znode is
    left as it was."""


class ParentNotSealedError(SplitStateError):
    """A new child cannot open yet: its parent has no barrier ``B(p)`` in ``partitions/epochs``
    (docs/design/splits.md "The handover", step 4: a child opens once its own parent has sealed).
    Nothing was written.

    Attributes:
        epoch: the epoch of the split.
        child: the new child.
        parent: its parent.
        sealing: whether the parent is marked sealing (its owner then appends the barrier and
            writes ``B(p)``: wait for it); False: mark it sealing first (step 3).
    """

    def __init__(self, epoch: int, child: int, parent: int, sealing: bool) -> None:
        what = (
            "its owner has not written B(p) yet (wait for it: the owner appends the barrier and writes it)"
            if sealing
            else "the parent is not marked sealing (step 3 first)"
        )
        super().__init__(
            f"epoch {epoch}: child {child} opens after its parent {parent}'s barrier, which is not "
            f"known yet: {what}; nothing was written"
        )
        self.epoch = epoch
        self.child = child
        self.parent = parent
        self.sealing = sealing


class SplitStorageError(SplitStateError):
    """A new child's replicas could not be made on every one of its parent's storage nodes
    (docs/design/splits.md "The handover", step 4): a node did not answer, or refused. Nothing was
    written to ZooKeeper; the nodes that answered are grown and hold the child's empty replica,
    which the step's next run finds as it left it: start or fix the nodes named, and run it again.

    Attributes:
        epoch: the epoch of the split.
        child: the new child.
        failures: storage connect string -> what went wrong there, for each node that failed.
        unreachable: the connect strings of the nodes that did not answer (a subset of
            ``failures``' keys; the others refused).
    """

    def __init__(
        self, epoch: int, child: int, failures: dict[str, str], unreachable: tuple[str, ...]
    ) -> None:
        named = "; ".join(f"{storage}: {why}" for storage, why in sorted(failures.items()))
        super().__init__(
            f"epoch {epoch}: child {child}'s replicas could not be made on every storage node of its "
            f"parent ({named}); nothing was written to ZooKeeper: start or fix those nodes and run the "
            "step again"
        )
        self.epoch = epoch
        self.child = child
        self.failures = dict(failures)
        self.unreachable = unreachable


class ProtocolError(WaltzError):
    """A peer sent a message that breaks the wire protocol (malformed, out of order, unknown)."""


class BelowCommittedError(ProtocolError):
    """A store session asked a storage node to remove, or to stop vouching for, committed
    transactions: a truncation below the partition's low-water mark, or a lower low-water mark
    (docs/design/storage.md, "The committed floor"). Nothing was changed.

    On the wire it is an ``INVALID_REQUEST``, so that servers of every version take it as a
    refused request.

    Attributes:
        partition_id: the partition.
        transaction_id: the transaction the request asked for (the truncation's last kept
            transaction, or the new low-water mark).
        floor: the lowest value the node accepts from a store session.
    """

    def __init__(self, partition_id: int, transaction_id: int, floor: int, why: str) -> None:
        super().__init__(
            f"partition {partition_id}: {why}; the floor is {floor}: every transaction up to the "
            "partition's low-water mark is committed. Nothing was changed. To remove committed "
            f"transactions on purpose, an operator with an admin certificate runs `waltz cluster "
            f"storage truncate-committed STORAGE --partition {partition_id} --to {transaction_id}` "
            '(docs/operations.md, "Truncating committed transactions")'
        )
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self.floor = floor


class MessageTooLargeError(ProtocolError):
    """A message exceeds the configured size limit.

    Attributes:
        size: the size of the message in bytes.
        limit: the configured limit in bytes.
    """

    def __init__(self, message: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class StorageError(WaltzError):
    """Base class of errors raised by a storage node (docs/design/storage.md "What a storage node does")."""


class ClusterKeyMismatchError(StorageError):
    """An open request carried a cluster key that differs from the storage's control file."""


class SessionFencedError(StorageError):
    """A request carried a store session ID lower than the partition's current one.

    The writer has been fenced by a newer store session (docs/design/storage.md "Fencing by store
    session ID").

    Attributes:
        partition_id: the partition.
        session_id: the session ID of the rejected request.
        current_session_id: the partition's current (higher) session ID.
    """

    def __init__(self, partition_id: int, session_id: int, current_session_id: int) -> None:
        super().__init__(
            f"partition {partition_id}: store session {session_id} is fenced by session "
            f"{current_session_id}; a newer writer owns this partition, open a new store session (if "
            f"ZooKeeper's store session ID of the partition stays below {current_session_id}, a "
            "forged or corrupt ID raised the fence: an operator sets it back with `waltz cluster "
            "storage set-fence`)"
        )
        self.partition_id = partition_id
        self.session_id = session_id
        self.current_session_id = current_session_id


class SessionNotOpenError(StorageError):
    """A read carried a store session ID above the partition's fence.

    Reads never move the fence: a store session opens its replica session on the partition (an
    open-session request, or its first write) before it reads (docs/design/storage.md "Fencing by
    store session ID").

    Attributes:
        partition_id: the partition.
        session_id: the session ID of the refused read.
        fence: the partition's fence, unchanged.
    """

    def __init__(self, partition_id: int, session_id: int, fence: int) -> None:
        super().__init__(
            f"partition {partition_id}: store session {session_id} has not opened its replica session "
            f"on this storage node (the fence is {fence}); reads never move the fence: send an "
            "open-session request first"
        )
        self.partition_id = partition_id
        self.session_id = session_id
        self.fence = fence


class SessionJumpTooLargeError(StorageError):
    """A write or open-session request would raise a partition's fence further than allowed.

    Store session IDs come from a ZooKeeper counter that grows by one per store session, so a jump
    far above the fence is a forged or corrupt ID; the fence stays where it was
    (docs/design/storage.md "Fencing by store session ID", ``storage.fence.maxJump``).

    Attributes:
        partition_id: the partition.
        session_id: the session ID of the refused request.
        fence: the partition's fence, unchanged.
        max_jump: the largest raise the node accepts in one request.
    """

    def __init__(self, partition_id: int, session_id: int, fence: int, max_jump: int) -> None:
        super().__init__(
            f"partition {partition_id}: store session {session_id} is {session_id - fence} above the "
            f"fence {fence}, more than storage.fence.maxJump ({max_jump}); refused, the fence stays "
            f"{fence}. Store session IDs grow by one per session, so this ID is forged or corrupt; if "
            "ZooKeeper really holds it, an operator sets the fence with `waltz cluster storage "
            "set-fence`"
        )
        self.partition_id = partition_id
        self.session_id = session_id
        self.fence = fence
        self.max_jump = max_jump


class PartitionNotAssignedError(StorageError):
    """The partition is not assigned to this storage node (no partition directory)."""


class StorageNotInitializedError(StorageError):
    """The storage node has no control file yet: an admin open with the cluster key creates it."""


class PartitionUnavailableError(StorageError):
    """The partition is assigned but currently not readable or not writable (admin toggle).

    Attributes:
        for_writes: True when writes are switched off, False when reads are.
    """

    def __init__(self, message: str, *, for_writes: bool) -> None:
        super().__init__(message)
        self.for_writes = for_writes


class CorruptDataError(StorageError):
    """A file failed a checksum or structural check.

    Attributes:
        path: the file that failed the check.
        partition_id: the partition, or -1 when the file is not a partition file.
        offset: the byte offset of the failing structure in the file.
        transaction_id: the transaction ID involved, or -1 if not known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str,
        partition_id: int = -1,
        offset: int = -1,
        transaction_id: int = -1,
    ) -> None:
        super().__init__(
            f"{message} (file {path}, partition {partition_id}, offset {offset}, "
            f"transaction {transaction_id})"
        )
        self.path = path
        self.partition_id = partition_id
        self.offset = offset
        self.transaction_id = transaction_id


class DiskFullError(StorageError):
    """The storage device has no space left; the append failed and the log is unchanged."""


class StorageRpcError(StorageError):
    """A storage node answered a request with a failure response (docs/design/storage.md "Storage requests").

    Attributes:
        code: the failure code name sent by the storage node (e.g. ``"SESSION_FENCED"``).
        remote_message: the exception message sent by the storage node.
    """

    def __init__(self, code: str, remote_message: str) -> None:
        super().__init__(f"storage node failed the request: {code}: {remote_message}")
        self.code = code
        self.remote_message = remote_message


class RecordsArchivedError(StorageRpcError):
    """A read asked a replica for a transaction below its local start: the archive holds it.

    A storage node keeps no record below its local start (the first transaction on its disk:
    docs/design/archive.md, "Terms"); every transaction below it is committed and archived, so the
    reader reads it from the archive (docs/design/archive.md, "Reads below the local start"). The
    storage node raises it for the read, answers ``RECORDS_ARCHIVED`` with this message, and the
    Python clients raise it again from the answer.

    Attributes:
        partition_id: the partition.
        transaction_id: the transaction asked for (-1 when the answer did not name it).
        local_start: the replica's local start: the first transaction it holds.
    """

    def __init__(self, partition_id: int, transaction_id: int, local_start: int) -> None:
        message = (
            f"partition {partition_id}: transaction {transaction_id} is below the local start "
            f"{local_start} of this replica (the transactions before it are archived and no longer "
            "on its disk); read them from the archive"
        )
        # The message alone, not StorageRpcError's "storage node failed the request: ...": the
        # storage node raises it too, and sends its text as the failure's message.
        StorageError.__init__(self, message)
        self.code = "RECORDS_ARCHIVED"
        self.remote_message = message
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self.local_start = local_start


class ArchivedReadError(WaltzError):
    """A read below the replicas' local start could not be served from the archive.

    The transactions are no longer on the storage nodes' disks; the archive that ZooKeeper names
    (``<root>/archive``) is missing, does not hold the range, or a file of it fails a check
    (docs/design/archive.md, "Reads below the local start"). Nothing is skipped: the reader
    stops, and ``waltz archive verify`` names what is wrong with the archive.

    Attributes:
        partition_id: the partition.
        first: the first transaction of the range asked for.
        last: the last transaction of that range.
        location: the archive read (None: ZooKeeper names none).
    """

    def __init__(self, partition_id: int, first: int, last: int, location: str | None, problem: str) -> None:
        where = "no archive is recorded" if location is None else f"the archive {location}"
        super().__init__(
            f"partition {partition_id}: transactions {first}..{last} are below the replicas' local start "
            f"and cannot be read from the archive ({where}): {problem}"
        )
        self.partition_id = partition_id
        self.first = first
        self.last = last
        self.location = location


class WaltzClientError(WaltzError):
    """Base class of errors raised by the Waltz client (docs/design/client.md "The client's parts")."""


class AsyncCallbackError(WaltzClientError, TypeError):
    """A transaction context's ``execute`` (or an entity context's ``run``) returned an awaitable:
    it is ``async def``, but the client calls it on its own threads and needs its answer at once,
    so the coroutine would never run (docs/design/client.md "Transaction contexts and callbacks").
    """


class PartitionPausedError(WaltzClientError):
    """A context's lock check failed on a transaction its partition's apply waits at for this
    instance's upgrade (:class:`ApplyPausedError`): its retry would wait for that transaction to be
    applied, which this instance cannot do, so it ends with this error. Nothing of it was committed;
    submit it to an instance of the newer release, or again once this one is upgraded
    (docs/design/client.md "Retries and lock failures")."""


class ClientClosedError(WaltzClientError):
    """The Waltz client was closed: transactions still pending and new submissions fail with it."""


class PartitionNotMountedError(WaltzClientError):
    """A transaction context chose a partition this client has not mounted.

    With ``client.autoMount`` off, mount the partition first with ``set_partitions``.

    Attributes:
        partition_id: the partition the context chose.
    """

    def __init__(self, partition_id: int, mounted: object) -> None:
        super().__init__(
            f"partition {partition_id} is not mounted by this client (mounted: {mounted}); add it with "
            "set_partitions(...) or enable client.autoMount"
        )
        self.partition_id = partition_id


class StalePartitionEpochError(WaltzClientError):
    """A server refused an append routed by an epoch below its partition's (``STALE_PARTITION_EPOCH``):
    the partition is a parent sealing, or sealed, in a split (docs/design/splits.md "The handover",
    step 3). Nothing of the append was kept; routed by ``epoch`` its key may now belong to
    another partition. The client routes such a context again once its watch of the epochs moves
    (docs/design/splits.md "Clients across a split"): the context ends with this error only when
    the epochs do not move in time.

    Attributes:
        partition_id: the partition that refused it.
        epoch: the lowest epoch the partition takes.
        partition_count: that epoch's partition count.
    """

    def __init__(self, partition_id: int, epoch: int, partition_count: int, message: str) -> None:
        super().__init__(f"stale partition epoch: {message}")
        self.partition_id = partition_id
        self.epoch = epoch
        self.partition_count = partition_count


class PartitionNotOpenError(WaltzClientError):
    """A server refused an append to a new partition of a split that has no genesis yet
    (``PARTITION_NOT_OPEN``; docs/design/splits.md "The handover", step 4). Nothing of the append
    was kept; the partition takes appends once its genesis commits. The client waits for its
    watch of the epochs to move, as for :class:`StalePartitionEpochError`; a context routed to a
    new partition this client does not mount ends with this error too when the epochs do not move
    in time (docs/design/splits.md "Clients across a split").

    Attributes:
        partition_id: the new partition.
        epoch: the split that makes it.
        partition_count: that epoch's partition count.
    """

    def __init__(self, partition_id: int, epoch: int, partition_count: int, message: str) -> None:
        super().__init__(f"partition not open: {message}")
        self.partition_id = partition_id
        self.epoch = epoch
        self.partition_count = partition_count


class TransactionExpiredError(WaltzClientError):
    """A transaction context expired before one of its attempts was committed.

    It is raised from the future of the submission after ``on_expiration()``; no attempt of the
    context is in flight any more, so it will never be committed.

    Attributes:
        partition_id: the context's partition.
        attempts: how many append attempts were made.
    """

    def __init__(self, partition_id: int, attempts: int, timeout: float) -> None:
        super().__init__(
            f"transaction context on partition {partition_id} expired after {attempts} attempt(s) "
            f"(timeout {timeout:g}s); submit it again or give it a longer timeout"
        )
        self.partition_id = partition_id
        self.attempts = attempts


class TransactionDataError(WaltzClientError):
    """The data of a committed transaction could not be fetched, or failed its CRC-32 check.

    Attributes:
        partition_id: the partition.
        transaction_id: the transaction.
    """

    def __init__(self, message: str, partition_id: int, transaction_id: int) -> None:
        super().__init__(f"partition {partition_id}, transaction {transaction_id}: {message}")
        self.partition_id = partition_id
        self.transaction_id = transaction_id


class ServerFeedError(WaltzClientError):
    """A server could not feed a partition from the client's position, and said why (for example
    an archived range it cannot read: :class:`ArchivedReadError`'s message). The client tells the
    application through ``uncaught_exception`` and mounts again after a pause.

    Attributes:
        partition_id: the partition.
        endpoint: the server.
    """

    def __init__(self, partition_id: int, endpoint: str, message: str) -> None:
        super().__init__(f"partition {partition_id}: {endpoint} cannot feed it: {message}")
        self.partition_id = partition_id
        self.endpoint = endpoint


class ClientAheadOfLogError(WaltzClientError):
    """A server refused to mount a partition (``CLIENT_AHEAD_OF_LOG``, docs/protocol.md "Mount"):
    the client's high-water mark, the application's ``get_client_high_water_mark``, is above the
    partition's committed high-water mark. The application's database is ahead of this log: it was
    restored from another cluster, the cluster was rebuilt, or the client names the wrong cluster
    root. The client tells the application through ``uncaught_exception``, keeps the partition
    unmounted (asking again now and then, in case its view of the owner was stale), and ends every
    context submitted to it with this error: nothing is committed there
    (docs/design/client.md "Mount and the client high-water mark").

    Attributes:
        partition_id: the partition.
        endpoint: the server that refused the mount.
        client_high_water_mark: the mark the client mounted from.
        high_water_mark: the partition's committed high-water mark.
    """

    def __init__(
        self,
        partition_id: int,
        endpoint: str,
        client_high_water_mark: int,
        high_water_mark: int,
        message: str,
    ) -> None:
        super().__init__(
            f"partition {partition_id}: {endpoint} refused the mount: {message}; the partition stays "
            "unmounted and every transaction submitted to it ends with this error"
        )
        self.partition_id = partition_id
        self.endpoint = endpoint
        self.client_high_water_mark = client_high_water_mark
        self.high_water_mark = high_water_mark


class WaltzTimeoutError(WaltzClientError, TimeoutError):
    """A client operation (flush, high-water mark, mount) did not finish within its time limit."""


class ApplyPausedError(WaltzError):
    """A transaction this instance cannot apply until its code is upgraded; its partition waits.

    The record is of a newer form or schema version than the instance's code knows (a rolling
    deploy under way: docs/design/sql.md "Schema versions and upcasting"). It is never skipped,
    not even on an operator's request (docs/design/sql.md "Skipping a transaction": refused, the
    request stays pending), and nothing of it is applied: the partition's apply waits and retries
    rarely, its health names the reason, and the instance's other partitions go on. Restarting the
    instance on the new code resumes it.
    """


class SplitRecordFormatError(WaltzError):
    """Transaction data under the split records' header (``0x57505348``) that is not a barrier or
    a genesis as this code reads them: not UTF-8 JSON, a field missing, of the wrong type or not
    in the form, an unknown kind (docs/design/splits.md "Record forms"). The record is never
    skipped: its partition's apply retries it and reports the error."""


class SplitRecordVersionError(SplitRecordFormatError, ApplyPausedError):
    """A split record of a form newer than this code reads: its partition's apply waits for this
    instance's upgrade (docs/design/splits.md "Record forms").

    Attributes:
        form: the form the record declares (its ``"v"``).
    """

    def __init__(self, message: str, form: int) -> None:
        super().__init__(message)
        self.form = form


class SqlFrameworkError(WaltzError):
    """Base class of errors raised by the SQL framework (``waltz.jdbc_style``)."""


class AsyncEngineError(SqlFrameworkError, TypeError):
    """The SQL framework was given an asyncio engine or URL (``AsyncEngine``, ``+psycopg_async``,
    ``+asyncpg``, ``+aiosqlite``, ...): it drives a synchronous engine on threads of its own, and
    offers ``await`` twins of its reads (docs/design/sql.md "The SQL framework on asyncio").

    Attributes:
        sync_url: the synchronous URL to pass instead (the password hidden).
    """

    def __init__(self, what: str, sync_url: str) -> None:
        super().__init__(
            f"the SQL framework needs a synchronous SQLAlchemy engine, not {what}: pass "
            f"create_framework_engine({sync_url!r}) (or sqlalchemy.create_engine with that URL); "
            "a service on asyncio awaits the framework's async twins (read_entities_async, "
            "find_idempotency_key_async, wait_for_async), which run on the framework's threads"
        )
        self.sync_url = sync_url


class AsyncClientError(SqlFrameworkError, TypeError):
    """A part of the SQL framework that submits from the caller's thread (``EntityBatcher``) was
    given an ``AsyncWaltzClient``: it needs a ``WaltzClient``, which an asyncio service drives
    from threads (docs/design/sql.md "The SQL framework on asyncio")."""


class StagedRowCountError(SqlFrameworkError):
    """Writes staged with ``ApplySession.stage`` changed another number of rows than they said.

    Attributes:
        statement: the staged statement.
        parameter_sets: how many parameter sets ran with it.
        expected: the rows they said they change, in all.
        changed: the rows the database reported changed.
    """

    def __init__(self, statement: object, parameter_sets: int, expected: int, changed: int) -> None:
        text = " ".join(str(statement).split())
        super().__init__(
            f"the staged statement {text[:120]!r} with {parameter_sets} parameter set(s) changed "
            f"{changed} row(s), not the {expected} they said: a row it should change is missing "
            "(or a key matches several rows); the group is rolled back and applied one transaction "
            "at a time, so the error names the transaction"
        )
        self.statement = statement
        self.parameter_sets = parameter_sets
        self.expected = expected
        self.changed = changed


class ApplyContractError(SqlFrameworkError):
    """``apply`` tried to end or reshape the framework's database transaction.

    The framework owns the transaction that applies a log transaction and moves the high-water
    mark (docs/design/sql.md "The apply contract": both change together or not at all): ``apply``
    may read, write, flush and use savepoints (``begin_nested``), but must not commit, roll back,
    begin, or change the isolation level.
    """


class ReadOnlySessionError(SqlFrameworkError):
    """A write through ``tx.session`` in an entity transaction's ``run``: an ``INSERT``,
    ``UPDATE`` or ``DELETE`` executed on it, an object added or deleted, or an attribute of a
    loaded object changed. The session reads the attempt's snapshot only, which is rolled back:
    nothing written through it would reach the log or the database. A change goes through
    ``tx.insert``, ``tx.update`` and ``tx.delete``, which the log carries (docs/design/sql.md
    "Entity transactions").
    """


class GenesisHeldError(SqlFrameworkError):
    """A new child's genesis waits: its parent's mark in the same database is below the parent's
    barrier ``B(p)`` (docs/design/splits.md "The SQL framework across a split"). Nothing was
    applied; the apply is tried again, and goes on once the parent's applies reach ``B(p)``.

    Attributes:
        partition_id: the new child.
        parent: its parent partition.
        barrier: the parent's ``B(p)``.
        parent_mark: the parent's mark the apply read (-1: no row).
    """

    def __init__(
        self, cluster_name: str, partition_id: int, parent: int, barrier: int, parent_mark: int
    ) -> None:
        super().__init__(
            f"cluster {cluster_name!r} partition {partition_id}: its genesis waits for partition {parent} "
            f"to be applied up to its barrier {barrier} in this database (its mark is {parent_mark}): "
            "the instance that mounts the parent applies it; the child goes on after it "
            '(docs/design/splits.md, "The SQL framework across a split")'
        )
        self.partition_id = partition_id
        self.parent = parent
        self.barrier = barrier
        self.parent_mark = parent_mark


class HighWaterMarkGapError(SqlFrameworkError):
    """The database's high-water mark is below ``transaction_id - 1``: transactions are missing.

    A gap is never skipped: applying past it would make the database diverge from the log. It
    means the database went back while the instances ran (restored from a backup, a failover to a
    standby that missed commits: its tables and marks went back together), and the instances,
    which never ask again about what they applied, must be restarted to catch up from its marks;
    or its marks were edited by hand, and it must be rebuilt from the log (docs/sql.md, "Applying
    the log exactly once").

    Attributes:
        cluster_name: the log the mark belongs to.
        partition_id: the partition.
        high_water_mark: the mark found in the database.
        transaction_id: the transaction the client handed over.
    """

    def __init__(
        self, cluster_name: str, partition_id: int, high_water_mark: int, transaction_id: int
    ) -> None:
        super().__init__(
            f"cluster {cluster_name!r} partition {partition_id}: the database's high-water mark is "
            f"{high_water_mark} but the next transaction to apply is {transaction_id}; transactions "
            f"{high_water_mark + 1}..{transaction_id - 1} are missing. If the database went back while "
            "the application ran (restored from a backup, a failover to a standby that missed commits), "
            "restart the application's instances: they read the database's marks and apply the log "
            "again from there. If its marks were edited by hand, rebuild it from the log (waltz "
            "rebuild)."
        )
        self.cluster_name = cluster_name
        self.partition_id = partition_id
        self.high_water_mark = high_water_mark
        self.transaction_id = transaction_id


class CrossPartitionError(SqlFrameworkError):
    """A transaction's entities map to more than one partition.

    Locks are scoped to a partition (docs/design/locks.md "Locks and their scope"), so one
    transaction cannot cover entities of two partitions: split it (e.g. a two-step transfer) or
    change the entities' partition mapping so that they land together.
    """


class TransactionApplyError(SqlFrameworkError):
    """Applying one transaction of a batch failed; names the transaction (the cause is chained).

    The client reports ``cause`` for ``transaction_id`` (not for the first of the batch).

    Attributes:
        partition_id: the partition.
        transaction_id: the transaction whose apply failed.
        cause: the exception ``apply`` raised.
    """

    def __init__(self, partition_id: int, transaction_id: int, cause: BaseException) -> None:
        super().__init__(f"partition {partition_id}: applying transaction {transaction_id} failed: {cause!r}")
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self.cause = cause
