"""What an application writes: transaction contexts, the builder they fill, and serializers.

Source: docs/design/client.md "Transaction contexts and callbacks" (``TransactionContext``,
``TransactionBuilder``, ``Serializer``); docs/design/locks.md "Optimistic locking in Waltz", "Lock
modes".

An application subclasses :class:`TransactionContext`. For every attempt the client reads the
partition's client high-water mark, makes a :class:`TransactionBuilder` with it and calls
``context.execute(builder)``; the context sets the header, the data and the locks. The builder's
high-water mark is what the server's lock check compares with the lock table, so the state the
context read must be the state at that mark.
"""

from __future__ import annotations

import abc
import inspect
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from waltz.client.arguments import as_bytes, check_client_mark, check_integer, check_seconds
from waltz.client.locks import LockMode, PartitionLocalLock
from waltz.client.outcome import Outcome, OutcomeKind
from waltz.errors import AsyncCallbackError
from waltz.protocol.records import crc32
from waltz.protocol.split_records import SPLIT_RECORD_HEADER

__all__ = [
    "AppendPayload",
    "BytesSerializer",
    "JsonSerializer",
    "Serializer",
    "TransactionBuilder",
    "TransactionContext",
    "refuse_awaitable",
]

T = TypeVar("T")

_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1


def refuse_awaitable(result: object, callback: str, answer: str) -> None:
    """Raise when a context's callback returned an awaitable (an ``async def`` one), closing the
    coroutine so that it is not reported as never awaited (docs/design/client.md "Transaction
    contexts and callbacks").

    Args:
        result: what the callback returned.
        callback: the callback's name in the message, e.g. ``"Deposit.execute"``.
        answer: what the callback must return instead, for the message.

    Raises:
        AsyncCallbackError: ``result`` is awaitable.
    """
    if not inspect.isawaitable(result):
        return
    if inspect.iscoroutine(result):
        result.close()
    raise AsyncCallbackError(
        f"{callback} returned {type(result).__name__} {getattr(result, '__qualname__', '')!s}: it is "
        f"async def, but the client calls it on its own threads and needs {answer} at once (a coroutine "
        f"would never run, and would count as True); make it a plain def (it may block, e.g. read the "
        "database, as synchronous code does)"
    )


class Serializer(abc.ABC, Generic[T]):
    """Turns transaction data into bytes and back.

    See docs/design/client.md "Transaction contexts and callbacks".
    """

    @abc.abstractmethod
    def serialize(self, data: T) -> bytes:
        """Encode ``data`` as the transaction's bytes."""

    @abc.abstractmethod
    def deserialize(self, data: bytes) -> T:
        """Decode a transaction's bytes."""


class BytesSerializer(Serializer[bytes]):
    """Transaction data that already is bytes."""

    def serialize(self, data: bytes) -> bytes:
        """``data`` as bytes.

        Raises:
            TypeError: ``data`` is not bytes-like.
        """
        return data if type(data) is bytes else as_bytes(data, "transaction data")

    def deserialize(self, data: bytes) -> bytes:
        return data


class JsonSerializer(Serializer[Any]):
    """Transaction data as compact UTF-8 JSON (sorted keys, so equal values give equal bytes)."""

    def serialize(self, data: Any) -> bytes:
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")

    def deserialize(self, data: bytes) -> Any:
        return json.loads(data)


class AppendPayload(NamedTuple):
    """Everything an append request carries besides its ReqId (``docs/protocol.md`` "Append").

    A named tuple (immutable, and cheap to make: one per attempt).

    Attributes:
        client_high_water_mark: the mark the lock check uses.
        write_locks / read_locks / append_locks: 32-bit lock hashes per mode.
        header: the 32-bit transaction header.
        data: the transaction data.
        checksum: CRC-32 of ``data``.
    """

    client_high_water_mark: int
    write_locks: tuple[int, ...]
    read_locks: tuple[int, ...]
    append_locks: tuple[int, ...]
    header: int
    data: bytes
    checksum: int


class TransactionBuilder:
    """Collects a transaction's header, data and locks during ``TransactionContext.execute``.

    Args:
        client_high_water_mark: the partition's client high-water mark when the attempt began
            (from ``WaltzClientCallbacks.get_client_high_water_mark``).
    """

    __slots__ = (
        "_append_locks",
        "_applied_before",
        "_data",
        "_drop_reason",
        "_header",
        "_high_water_mark",
        "_read_locks",
        "_write_locks",
    )

    def __init__(self, client_high_water_mark: int) -> None:
        self._high_water_mark = client_high_water_mark
        self._header = 0
        self._data = b""
        self._write_locks: tuple[PartitionLocalLock, ...] = ()
        self._read_locks: tuple[PartitionLocalLock, ...] = ()
        self._append_locks: tuple[PartitionLocalLock, ...] = ()
        self._drop_reason: str | None = None
        self._applied_before: tuple[int, int] | None = None

    @property
    def client_high_water_mark(self) -> int:
        """The high-water mark the server's lock check will compare with the lock table."""
        return self._high_water_mark

    def set_client_high_water_mark(self, high_water_mark: int) -> None:
        """Override the high-water mark the lock check uses.

        A framework that reads the application's state and its high-water mark in one database
        transaction sets the mark it read here, so the lock check matches what it saw.

        Raises:
            TypeError: the mark is not an int.
            ValueError: the mark is below -1 (no transaction applied) or above a signed 64-bit
                integer.
        """
        self._high_water_mark = check_client_mark(high_water_mark, "client high-water mark")

    @property
    def header(self) -> int:
        """The 32-bit transaction header (0 unless set)."""
        return self._header

    def set_header(self, header: int) -> None:
        """Set the application-defined 32-bit transaction header.

        Raises:
            TypeError: ``header`` is not an int (a float, a bool, a string).
            ValueError: ``header`` does not fit in a signed 32-bit integer, or it is the header of
                partition split records, which only a partition's owner writes (servers refuse a
                client's append with it: docs/design/splits.md "Why no update is lost"). Raised in
                ``execute``, it fails the context at once, before anything is sent.
        """
        header = check_integer(header, "transaction header")
        if not _INT32_MIN <= header <= _INT32_MAX:
            raise ValueError(f"transaction header {header} does not fit in a signed 32-bit integer")
        if header == SPLIT_RECORD_HEADER:
            raise ValueError(
                f"the header 0x{SPLIT_RECORD_HEADER:08X} is reserved for partition split records, which "
                "only a partition's owner writes: a client's append may not carry it; choose another header"
            )
        self._header = header

    def set_transaction_data(self, data: T, serializer: Serializer[T]) -> None:
        """Set the transaction data, encoded with ``serializer``.

        Raises:
            TypeError: the serializer returned something other than bytes.
        """
        encoded = serializer.serialize(data)
        self._data = (
            encoded if type(encoded) is bytes else as_bytes(encoded, f"{type(serializer).__name__}.serialize")
        )

    def set_raw_data(self, data: bytes) -> None:
        """Set the transaction data as bytes.

        Raises:
            TypeError: ``data`` is not bytes-like (``bytes``, ``bytearray``, ``memoryview``); an
                ``int`` is refused rather than taken as a count of zero bytes.
        """
        self._data = data if type(data) is bytes else as_bytes(data, "transaction data")

    @property
    def data(self) -> bytes:
        """The transaction data as it will be sent."""
        return self._data

    def set_write_locks(self, locks: Iterable[PartitionLocalLock]) -> None:
        """Lock these IDs for writing: the append fails if another transaction wrote one of them
        after the client high-water mark; on commit the transaction is recorded on them."""
        self._write_locks = tuple(locks)

    def set_read_locks(self, locks: Iterable[PartitionLocalLock]) -> None:
        """Lock these IDs for reading: the append fails if another transaction wrote one of them
        after the client high-water mark; the commit leaves them unchanged."""
        self._read_locks = tuple(locks)

    def set_append_locks(self, locks: Iterable[PartitionLocalLock]) -> None:
        """Record the transaction on these IDs at commit, without checking them against the lock
        table (only against appends still in flight)."""
        self._append_locks = tuple(locks)

    def locks(self, mode: LockMode) -> tuple[PartitionLocalLock, ...]:
        """The locks set for ``mode``."""
        if mode is LockMode.WRITE:
            return self._write_locks
        return self._read_locks if mode is LockMode.READ else self._append_locks

    def drop(self, reason: str) -> bool:
        """Drop the transaction for a reason the submitter is told (``Outcome.reason``): ``return
        builder.drop("insufficient funds")`` in ``execute`` (docs/design/client.md "Outcomes").

        Returns:
            False, what ``execute`` returns to drop the transaction.
        """
        self._drop_reason = reason
        self._applied_before = None
        return False

    def drop_as_applied(self, partition_id: int, transaction_id: int, reason: str | None = None) -> bool:
        """Drop the transaction because the request was applied before by another transaction
        (an idempotency key it carried): the submitter's outcome is ``ALREADY_APPLIED`` with that
        transaction's partition and ID (docs/design/client.md "Outcomes").

        Returns:
            False, what ``execute`` returns to drop the transaction.
        """
        self._drop_reason = reason
        self._applied_before = (partition_id, transaction_id)
        return False

    def dropped_outcome(self, partition_id: int) -> Outcome:
        """The outcome of an attempt whose ``execute`` returned False (``partition_id``: the
        context's): already applied when :meth:`drop_as_applied` was called, else dropped, with
        the reason given to :meth:`drop` (None without one)."""
        if self._applied_before is not None:
            return Outcome(OutcomeKind.ALREADY_APPLIED, *self._applied_before, self._drop_reason)
        return Outcome(OutcomeKind.DROPPED, partition_id, None, self._drop_reason)

    def build(self) -> AppendPayload:
        """The append payload: lock hashes, header, data and its CRC-32."""

        data = self._data
        return AppendPayload(  # positional: half the cost of keywords, once per attempt
            self._high_water_mark,
            _hashes(self._write_locks),
            _hashes(self._read_locks),
            _hashes(self._append_locks),
            self._header,
            data,
            crc32(data),
        )


def _hashes(locks: tuple[PartitionLocalLock, ...]) -> tuple[int, ...]:
    """Lock hashes as sent: deduplicated and sorted (a stable wire form)."""
    if not locks:
        return ()
    if len(locks) == 1:
        return (locks[0].lock_hash,)
    return tuple(sorted({lock.lock_hash for lock in locks}))


class TransactionContext(abc.ABC):
    """The code that builds one transaction; subclass it.

    See docs/design/client.md "Transaction contexts and callbacks". The client calls :meth:`execute`
    once per attempt, again after an attempt failed (a lost append, a reconnect, a lock failure),
    each time with a fresh builder and the current high-water mark. Exactly one of
    :meth:`on_completion`, :meth:`on_exception` and :meth:`on_expiration` ends a context, once. The
    callbacks run on a client thread (the caller's for a first attempt that ends at once); keep them
    short.

    Args:
        timeout: seconds after its ``submit`` (or ``execute``) when the context expires, or None
            (never). Expiry is checked between attempts and while an attempt's append waits unsent
            for its partition to be mounted; an append that was sent is resolved first, so an
            expired context never commits afterwards (docs/design/client.md "Transaction contexts
            and callbacks").

    Raises:
        ValueError: ``timeout`` is zero, negative, NaN or infinite.
        TypeError: ``timeout`` is not a number.
    """

    #: Seconds after ``submit`` when the context expires (None: never); see the constructor.
    timeout: float | None = None

    #: True when ``execute`` always sets the builder's mark itself (``set_client_high_water_mark``,
    #: e.g. read in the same database transaction as the state it reads): the client then skips
    #: ``get_client_high_water_mark`` before each attempt and starts the builder at -1, the most
    #: conservative mark (an attempt that forgot to set it fails the lock check, never passes it).
    sets_client_high_water_mark: bool = False

    #: True when ``execute`` reads state that follows the log as the callbacks absorb it
    #: (``WaltzClientCallbacks.absorb_transactions``, e.g. the SQL framework's entity cache),
    #: up to the absorbed mark at least: after a lock failure (or behind a lock of this client's)
    #: the next attempt then runs once the transaction it waits for is absorbed, not applied.
    reads_absorbed_state: bool = False

    #: True when ``execute`` blocks on I/O (reads a database, e.g. the SQL framework's entity
    #: contexts): ``AsyncWaltzClient`` then runs its first attempt on the client's attempt threads
    #: (``client.numTransactionRetryThreads`` of them), never on the caller's event loop
    #: (docs/design/client.md "WaltzClient and AsyncWaltzClient").
    execute_blocks: bool = False

    def __init__(self, *, timeout: float | None = None) -> None:
        self.creation_time = time.time()
        if timeout is not None:
            if check_seconds(timeout, "context timeout") == 0:
                raise ValueError(
                    "context timeout of 0 seconds: give a positive number, or None for no timeout"
                )
            self.timeout = timeout

    @abc.abstractmethod
    def partition_id(self, num_partitions: int) -> int:
        """The partition of this transaction, in ``0 .. num_partitions - 1``."""

    @abc.abstractmethod
    def execute(self, builder: TransactionBuilder) -> bool:
        """Build the transaction with ``builder``.

        Returns:
            True to append the transaction, False to drop it (the context then completes with
            ``on_completion(False)``); ``return builder.drop(reason)`` drops it with a reason the
            submitter's ``Outcome`` carries. An exception ends the context with ``on_exception``.
        """

    def expected_locks(self) -> Sequence[PartitionLocalLock]:
        """Locks this context's attempts are expected to take, known before an attempt runs (an
        optional hint; none by default).

        While a pending append of this client holds one of them (as a WRITE or APPEND lock), the
        client queues the context behind that append instead of running its first attempt now:
        the attempt would be held back behind it and run again once it commits anyway
        (docs/design/locks.md, "Locks of appends in flight"). A wrong hint costs only that wait;
        the locks the attempt really takes are what the server checks.
        """
        return ()

    def routed(self, partition_id: int, num_partitions: int) -> None:  # noqa: B027 (optional hook)
        """Called when the client routed the context, after :meth:`partition_id` and before its
        first attempt (again when it is routed anew after a refusal of its epoch): the partition
        its appends go to and the count of the epoch it was routed by (docs/design/splits.md
        "Clients across a split"). During a split the partition may be the key's partition at an
        older count (its parent there is not sealing yet), ``partition_id(num_partitions)`` for a
        divisible partition function. A context that reads state by its partition (the SQL
        framework's entity contexts read their partition's mark) reads that one's. The default
        does nothing.
        """

    def on_completion(self, result: bool) -> None:  # noqa: B027 (optional hook)
        """Called once when the context ends without error or expiry.

        A committed context's completion runs on the client's completion thread, in commit order
        with the others (and so do the done-callbacks of ``submit``'s future): keep it short and
        never wait in it for another transaction to end.

        Args:
            result: True when the transaction was committed, False when ``execute`` dropped it.
        """

    def on_application(self) -> None:  # noqa: B027 (optional hook)
        """Called (on the partition's apply thread) once this client has applied the committed
        transaction, i.e. ``apply_transaction`` returned for it."""

    def on_exception(self, exception: BaseException) -> None:  # noqa: B027 (optional hook)
        """Called once when ``execute`` raised (or the transaction cannot be sent); no retry follows."""

    def on_lock_failure(self) -> None:  # noqa: B027 (optional hook)
        """Called each time an attempt failed its lock check; the client retries once it has
        applied the transaction that made the attempt fail."""

    def on_expiration(self) -> None:  # noqa: B027 (optional hook)
        """Called once when the context expired between attempts; no retry follows."""
