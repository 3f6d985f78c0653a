"""The epoch gate of a partition's owner: which appends a partition refuses for the epoch they were
routed by, decided from ``<root>/partitions/epochs``.

Design: docs/design/splits.md "The handover" (step 3: a sealing parent's owner refuses every append
routed by an older epoch with ``STALE_PARTITION_EPOCH``; step 4: a new child refuses appends with
``PARTITION_NOT_OPEN`` until its genesis), "Why no update is lost" (with locks or without);
``docs/protocol.md`` "Partition epochs" (the ``epoch`` of an append and the refusals' codes).

The gate is worked out once per change of the znode (:func:`epoch_gate`) and kept by the
partition; an append costs one comparison with it (:meth:`EpochGate.refusal`), no ZooKeeper read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from waltz.metadata.epochs import EpochState, PartitionEpochs
from waltz.protocol import client_pb2, common_pb2

__all__ = ["EpochGate", "EpochRefusal", "epoch_gate"]

STALE_PARTITION_EPOCH = client_pb2.STALE_PARTITION_EPOCH
PARTITION_NOT_OPEN = client_pb2.PARTITION_NOT_OPEN


class EpochRefusal(NamedTuple):
    """Why a partition refuses an append, as the client is told (a ``ServerError``).

    Attributes:
        code: ``client_pb2.STALE_PARTITION_EPOCH`` or ``client_pb2.PARTITION_NOT_OPEN``.
        epoch: the epoch to route the append by (stale), or the split that made the partition
            (not open).
        partition_count: that epoch's partition count.
        message: what happened and what to do, for people.
    """

    code: client_pb2.ServerErrorCode.ValueType
    epoch: int
    partition_count: int
    message: str

    def to_proto(self, req_id: common_pb2.ReqId) -> client_pb2.ServerMessage:
        """The ``ServerError`` that tells the client, under ``req_id``."""
        error = client_pb2.ServerError(
            message=self.message,
            code=self.code,
            epoch=self.epoch,
            partition_count=self.partition_count,
        )
        error.req_id.CopyFrom(req_id)
        return client_pb2.ServerMessage(error=error)


@dataclass(frozen=True, slots=True)
class EpochGate:
    """What one partition takes: appends routed by ``min_epoch`` or later, unless it is not open.

    Attributes:
        partition_id: the partition.
        min_epoch: the lowest epoch an append may be routed by (an epoch in which the partition is
            a sealing parent, a parent of a finished split, or a new child).
        min_count: the partition count of ``min_epoch``.
        not_open: set while the partition is a new child of an unfinished split without its
            genesis: every append is refused with it.
    """

    partition_id: int
    min_epoch: int
    min_count: int
    not_open: EpochRefusal | None = None

    def refusal(self, epoch: int) -> EpochRefusal | None:
        """Why an append routed by ``epoch`` is refused, or None when it is taken.

        Every append alike, with locks or without (docs/design/splits.md "Why no update is lost").
        """
        if self.not_open is not None:
            return self.not_open
        if epoch >= self.min_epoch:
            return None
        return EpochRefusal(
            STALE_PARTITION_EPOCH,
            self.min_epoch,
            self.min_count,
            f"partition {self.partition_id} takes only appends routed by epoch {self.min_epoch} "
            f"({self.min_count} partitions) or later, and this one was routed by epoch {epoch} "
            f'(docs/design/splits.md, "The handover"): read partitions/epochs and route it again '
            f"by epoch {self.min_epoch}",
        )


def epoch_gate(epochs: PartitionEpochs, partition_id: int) -> EpochGate | None:
    """The gate of ``partition_id`` in the split state ``epochs``, or None when it takes every
    epoch (no split touched it: the common case, and a cluster that never split).

    Per epoch ``n`` (count ``C(n)``, after ``C(n-1)``), in order:

    - a parent (``partition_id < C(n-1)``) takes only epoch ``n`` or later once it is marked
      sealing, or once the epoch is complete (every parent was sealed then);
    - a new child (``C(n-1) <= partition_id < C(n)``) takes only epoch ``n`` or later, and none
      at all while the epoch is unfinished and the child has no genesis (``PARTITION_NOT_OPEN``).

    Args:
        epochs: the value of ``<root>/partitions/epochs``.
        partition_id: a partition of the newest count.

    Returns:
        The gate, or None.
    """
    min_epoch, min_count = 0, epochs.initial_count
    not_open: EpochRefusal | None = None
    for epoch in epochs.epochs:
        number, count = epoch.number, epoch.count
        if partition_id < epoch.previous_count:
            parent = epoch.parents.get(partition_id)
            if epoch.state is EpochState.COMPLETE or (parent is not None and parent.sealing):
                min_epoch, min_count = number, count
        elif partition_id < count:
            min_epoch, min_count = number, count
            child = epoch.children.get(partition_id)
            if epoch.unfinished and (child is None or child.genesis is None):
                not_open = EpochRefusal(
                    PARTITION_NOT_OPEN,
                    number,
                    count,
                    f"partition {partition_id} is a new partition of epoch {number} ({count} "
                    'partitions) and has no genesis yet (docs/design/splits.md, "The handover"): it '
                    "takes appends once its genesis commits; wait for partitions/epochs to name it "
                    "and send again",
                )
    if min_epoch == 0 and not_open is None:
        return None
    return EpochGate(partition_id, min_epoch, min_count, not_open)
