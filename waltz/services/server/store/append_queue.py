"""The appends of a store partition: queued, then in flight in a store session, then resolved.

Design: docs/design/server.md "Store partition", "Quorum writes and batching". A transaction
appended to a store partition waits in its queue as a :class:`PendingAppend` until a store session
puts it in a batch; it is then in flight until a quorum of replicas has flushed it (committed), a
recovery drops it (:class:`AppendFailedError`), or the store partition closes
(:class:`AppendUndecidedError` in flight, :class:`StoreClosedError` still queued).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from waltz.errors import WaltzError
from waltz.protocol.records import Record, ReqId

__all__ = [
    "RECORD_OVERHEAD_BYTES",
    "AppendDone",
    "AppendFailedError",
    "AppendUndecidedError",
    "PendingAppend",
    "StoreClosedError",
]

log = logging.getLogger(__name__)

#: Bytes a record takes in an append request besides its data (transaction ID, ReqId, header,
#: checksum and their tags), rounded up: what a batch's byte budget counts per record.
RECORD_OVERHEAD_BYTES = 64


class AppendFailedError(WaltzError):
    """The record was not committed: its store session ended and the recovery did not keep it."""


class StoreClosedError(WaltzError):
    """The store partition is closed (shut down, or fenced by a newer generation)."""


class AppendUndecidedError(StoreClosedError):
    """The store partition closed while the record was in flight: its fate is undecided.

    The record was sent to the replicas but no quorum acknowledged it before the store closed, so
    some replicas may hold it. The recovery of the partition's next store session (on this server
    or on the partition's next owner) commits it or drops it; the partition's log (its feed) tells
    which. See docs/design/server.md "Generations and server fencing".
    """


#: What :meth:`StorePartition.enqueue` calls once a transaction is resolved: with its transaction ID
#: and None when committed, or with an error when it will never be.
AppendDone = Callable[[int, "BaseException | None"], None]


@dataclass(slots=True)
class PendingAppend:
    """A transaction queued in a store partition or in flight in one of its store sessions.

    Attributes:
        req_id: the client's request ID of the append.
        header: the transaction header (an application value, 32 bits).
        data: the transaction data.
        checksum: the CRC-32 of ``data``.
        on_done: called once when the transaction is committed or has failed (None after).
        transaction_id: the transaction ID, set when the record is put in a batch (-1 before).
        trace: None, unless the transaction is traced: its server append span, then its store
            batch's span once in a batch (``waltz.tracing.store_batch``).
    """

    req_id: ReqId
    header: int
    data: bytes
    checksum: int
    on_done: AppendDone | None
    transaction_id: int = -1  # set when the record is put in a batch
    trace: Any = None

    @property
    def record(self) -> Record:
        return Record(self.transaction_id, self.req_id, self.header, self.data, self.checksum)

    def resolve(self, error: BaseException | None) -> None:
        """Commit (``error`` None) or fail the transaction, once."""
        on_done = self.on_done
        if on_done is not None:
            self.on_done = None
            try:
                on_done(self.transaction_id, error)
            except Exception:
                log.exception("append callback of transaction %d raised", self.transaction_id)
