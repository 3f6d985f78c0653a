"""The transaction monitor: success and failure of append requests from the feed.

Source: docs/design/client.md "Failed-append detection"; ``docs/protocol.md``, "Transaction
monitor". One monitor per partition holds the client's pending appends in the order they were
sent. The server commits a partition's appends in the order it received them, so when the feed
shows one of them, that one succeeded and every older pending one failed. A mount response (the
reconnect procedure, docs/design/client.md "Mount and the client high-water mark") fails everything
still pending; a flush response fails everything sent before the flush once the feed has reached
the flush's high-water mark.

Order is the order of :meth:`TransactionMonitor.register` calls (a position that never wraps),
not the ReqId sequence number, which is a 32-bit value that wraps after 2**31 requests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, TypeVar

from waltz.protocol.records import ReqId

__all__ = ["TransactionMonitor"]

T = TypeVar("T")


class TransactionMonitor(Generic[T]):
    """Pending append requests of one partition, keyed by ReqId, in the order sent.

    ``T`` is whatever the caller keeps per append (the submission to retry or complete).
    """

    def __init__(self) -> None:
        # ReqId sequence number -> (ReqId, send position, item), in send order.
        self._pending: OrderedDict[int, tuple[ReqId, int, T]] = OrderedDict()
        self._position = 0

    def __len__(self) -> int:
        return len(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)

    @property
    def position(self) -> int:
        """How many appends were registered so far (the position of the next one)."""
        return self._position

    def register(self, req_id: ReqId, item: T) -> None:
        """Record an append just sent (call in the order appends are sent).

        Raises:
            ValueError: an append with the same sequence number is still pending.
        """
        if req_id.seq_num in self._pending:
            raise ValueError(
                f"append {req_id} registered while {self._pending[req_id.seq_num][0]} is pending"
            )
        self._pending[req_id.seq_num] = (req_id, self._position, item)
        self._position += 1

    def on_feed(self, req_id: ReqId) -> tuple[T | None, Sequence[T]]:
        """Process a feed entry's ReqId (docs/design/client.md "Failed-append detection").

        Returns:
            ``(succeeded, failed)``: the item of the append the entry confirms (None when the
            ReqId is not pending: another client's, or already resolved), and the items of the
            older pending appends, which failed, oldest first. Both leave the monitor.
        """
        seq_num = req_id.seq_num
        pending = self._pending
        entry = pending.get(seq_num)
        if entry is None or entry[0] != req_id:
            return None, ()
        seq, (_, _, item) = pending.popitem(last=False)
        if seq == seq_num:
            return item, ()  # the oldest pending one: the common case
        failed = [item]
        while True:
            seq, (_, _, item) = pending.popitem(last=False)
            if seq == seq_num:
                return item, failed
            failed.append(item)

    def on_lock_failure(self, req_id: ReqId) -> T | None:
        """Remove the append a lock failure names; None when it is not pending any more."""
        entry = self._pending.get(req_id.seq_num)
        if entry is None or entry[0] != req_id:
            return None
        del self._pending[req_id.seq_num]
        return entry[2]

    def remove(self, req_id: ReqId) -> T | None:
        """Remove one append (e.g. rejected by a server error); None when not pending."""
        return self.on_lock_failure(req_id)

    def fail_before(self, position: int) -> list[T]:
        """Remove and return every pending append registered before ``position`` (a flush's)."""
        failed: list[T] = []
        while self._pending:
            _, sent_at, item = next(iter(self._pending.values()))
            if sent_at >= position:
                break
            self._pending.popitem(last=False)
            failed.append(item)
        return failed

    def fail_all(self) -> list[T]:
        """Remove and return every pending append, oldest first (on a mount response)."""
        failed = [item for _, _, item in self._pending.values()]
        self._pending.clear()
        return failed
