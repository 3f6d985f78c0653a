"""The barrier a sealing parent's owner appends: which one a partition owes, its ReqId, and how a
recovered log's record is recognised as one.

Design: docs/design/splits.md "The owner's barrier" (how an owner does it), "The handover" (step
3: once a parent is marked sealing, its owner appends the barrier as one more append of its append
order, and writes its ID as ``B(p)`` once it commits; an owner that opens a sealing parent first
looks for a barrier of the epoch in its recovered log above ``H(p)``), "Record forms" (the
barrier's header and data), "Terms" (``B(p)`` is the first barrier of the epoch in the parent's
log).

The partition (:class:`~waltz.services.server.server_partition.Partition`) does the appending and
the scan; this module holds the decisions, free of I/O.

The barrier's ReqId is ``(SPLIT_CLIENT_ID, generation, partition, epoch)``: client ID 0 is never
handed out to a client (client IDs run from 1, docs/design/zookeeper.md "Client IDs"), so no client
takes a barrier's feed entry for one of its own appends, and the sequence number, the epoch, is
one per barrier of a partition. A server's member number is not used: it is not kept apart from
the client IDs, and a barrier must stay the same whichever server writes it.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from waltz.errors import SplitRecordFormatError
from waltz.metadata.epochs import PartitionEpochs
from waltz.protocol.records import Record, ReqId
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitBarrier, SplitRecord, decode_split_record

__all__ = ["SPLIT_CLIENT_ID", "BarrierDue", "barrier_due", "is_barrier_of", "owned_split_record"]

log = logging.getLogger(__name__)

#: The client ID of the ReqIds of the records an owner writes for a split (never a client's: the
#: client ID counter and ``client/ids`` hand out 1 and above).
SPLIT_CLIENT_ID = 0


class BarrierDue(NamedTuple):
    """A barrier a partition's owner owes: its parent is marked sealing and ``B(p)`` is unknown.

    Attributes:
        barrier: the record to append (its epoch, counts and parent).
        high_water_mark: ``H(p)``, the parent's high-water mark when the split started (-1:
            empty); a barrier of the epoch is looked for above it.
    """

    barrier: SplitBarrier
    high_water_mark: int

    @property
    def epoch(self) -> int:
        """The epoch the barrier starts (``n+1``)."""
        return self.barrier.epoch

    @property
    def parent(self) -> int:
        """The parent partition."""
        return self.barrier.parent

    def req_id(self, generation: int) -> ReqId:
        """The barrier's ReqId when appended under ``generation`` (see the module docstring)."""
        return ReqId(SPLIT_CLIENT_ID, generation, self.parent, self.epoch)


def barrier_due(epochs: PartitionEpochs, partition_id: int) -> BarrierDue | None:
    """The barrier ``partition_id`` owes in the split state ``epochs``, or None.

    One is owed in an epoch whose parent ``partition_id`` is marked sealing with no ``B(p)``
    written (docs/design/splits.md "The handover", step 3); once ``B(p)`` is in the znode nothing
    is owed. Only the newest epoch can be unfinished, so at most one is owed.

    Args:
        epochs: the value of ``<root>/partitions/epochs``.
        partition_id: a partition of the newest count.

    Returns:
        The barrier owed, or None.
    """
    for epoch in epochs.epochs:
        if partition_id >= epoch.previous_count:
            continue
        parent = epoch.parents.get(partition_id)
        if parent is not None and parent.sealing and parent.barrier is None:
            barrier = SplitBarrier(epoch.number, epoch.count, epoch.previous_count, partition_id)
            return BarrierDue(barrier, parent.high_water_mark)
    return None


def owned_split_record(record: Record, partition_id: int, sought: str) -> SplitRecord | None:
    """``record`` decoded as a split record, or None when it carries another header.

    A record under the split header that does not decode (a form this release does not read, or
    data no split writes) is logged as an error naming ``sought`` (what the owner looked for, e.g.
    ``"the barrier of epoch 1"``) and is None: an owner never takes it for its own record.
    """
    if record.header != SPLIT_RECORD_HEADER:
        return None
    try:
        return decode_split_record(record.data)
    except SplitRecordFormatError as exc:  # SplitRecordVersionError too
        log.error(
            "partition %d: transaction %d has the split records' header but is no record this "
            "server reads (%s): it is not taken for %s",
            partition_id,
            record.transaction_id,
            exc,
            sought,
        )
        return None


def is_barrier_of(record: Record, due: BarrierDue) -> bool:
    """True when ``record`` is a barrier of ``due``'s epoch and parent (docs/design/splits.md
    "Record forms": the split records' header, a ``"barrier"`` of that ``epoch`` and ``parent``).

    A record under the split header that does not decode is logged as an error and is not taken
    for the barrier (:func:`owned_split_record`).
    """
    decoded = owned_split_record(record, due.parent, f"the barrier of epoch {due.epoch}")
    return isinstance(decoded, SplitBarrier) and decoded.epoch == due.epoch and decoded.parent == due.parent
