"""The genesis a new child's owner appends: which one a partition owes, its ReqId, what its
recovered log tells the owner to do, and how a record is recognised as one.

Design: docs/design/splits.md "The handover" (step 4: the child's owner's recovery finds an empty
log whose high-water mark is ``B(p)``; it appends the genesis at ``B(p) + 1``, raises every slot
of its lock table to ``B(p) + 1``, and then accepts appends), "Why no update is lost" (the child's
lock table starts at ``B(p) + 1``), "Record forms" (the genesis's header and data), "The owner's
barrier" (the ReqId of a split record, client ID 0).

This module holds the decisions, free of I/O, as :mod:`waltz.services.server.split_barrier` does
for the barrier; the partition (``Partition._genesis_at_open``) carries them out after its
recovery and its read of the epochs, before it makes its lock table, and the server writes the
genesis's ID into the epochs znode (``ServerApp.write_genesis``).

Once the genesis commits, the committed high-water mark is ``B(p) + 1``, and a lock table made
then starts every slot there (a lock table starts at the high-water mark,
docs/design/locks.md "The lock table"): that is the raise step 4 asks for.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from waltz.errors import WaltzError
from waltz.metadata.epochs import PartitionEpochs
from waltz.protocol.records import Record, ReqId
from waltz.protocol.split_records import SplitGenesis
from waltz.services.server.split_barrier import SPLIT_CLIENT_ID, owned_split_record

__all__ = ["GenesisDue", "GenesisStep", "genesis_due", "genesis_step", "is_genesis_of"]


class GenesisDue(NamedTuple):
    """A genesis a new child's owner owes: the child is opened and its genesis is not in the
    epochs znode.

    Attributes:
        genesis: the record (its epoch, counts, parent and the parent's ``B(p)``).
        child: the new child, the partition that appends it.
    """

    genesis: SplitGenesis
    child: int

    @property
    def epoch(self) -> int:
        """The epoch the genesis starts (``n+1``)."""
        return self.genesis.epoch

    @property
    def barrier(self) -> int:
        """The parent's ``B(p)``: the high-water mark the child's log starts with."""
        return self.genesis.barrier

    @property
    def transaction_id(self) -> int:
        """Where the genesis is, ``B(p) + 1``: the first record of the child's log."""
        return self.genesis.barrier + 1

    def req_id(self, generation: int) -> ReqId:
        """The genesis's ReqId when appended under ``generation``: ``(0, generation, child,
        epoch)``, as a barrier's (docs/design/splits.md "The owner's barrier")."""
        return ReqId(SPLIT_CLIENT_ID, generation, self.child, self.epoch)


def genesis_due(epochs: PartitionEpochs, partition_id: int) -> GenesisDue | None:
    """The genesis ``partition_id`` owes in the split state ``epochs``, or None.

    One is owed by a new child marked opened whose genesis is not written (docs/design/splits.md
    "The epochs znode's record form": ``opened`` is set only after the parent's ``B(p)``); once
    the genesis is in the znode nothing is owed. Only the newest epoch can be unfinished, so at
    most one is owed.

    Args:
        epochs: the value of ``<root>/partitions/epochs``.
        partition_id: a partition of the newest count.

    Returns:
        The genesis owed, or None.
    """
    for epoch in epochs.epochs:
        child = epoch.children.get(partition_id)
        if child is None or not child.opened or child.genesis is not None:
            continue
        parent, barrier = epoch.parent_barrier(partition_id)
        if barrier is None:  # no reader lets an opened child's parent lack B(p)
            continue
        genesis = SplitGenesis(epoch.number, epoch.count, epoch.previous_count, parent, barrier)
        return GenesisDue(genesis, partition_id)
    return None


class GenesisStep(enum.Enum):
    """What the owner of a genesis does after its recovery, from the recovered high-water mark."""

    APPEND = "append"
    """The log is empty at ``B(p)``: append the genesis, wait for its commit at ``B(p) + 1``."""
    FIND = "find"
    """The log holds ``B(p) + 1``: an earlier owner appended the genesis there (no append is taken
    before it): read it, check it with :func:`is_genesis_of`, and write its ID; append none."""


def genesis_step(due: GenesisDue, high_water_mark: int) -> GenesisStep:
    """What the owner of ``due`` does with a log recovered at ``high_water_mark``.

    Raises:
        WaltzError: the high-water mark is below ``B(p)``: the child's replicas were not made as
            step 4 makes them (each closed at ``B(p)``); the partition takes no append.
    """
    if high_water_mark == due.barrier:
        return GenesisStep.APPEND
    if high_water_mark > due.barrier:
        return GenesisStep.FIND
    raise WaltzError(
        f"partition {due.child}: its recovered high-water mark {high_water_mark} is below its parent "
        f"{due.genesis.parent}'s barrier {due.barrier}: a new child's log starts closed at the barrier "
        '(docs/design/splits.md, "The handover", step 4); it takes no append'
    )


def is_genesis_of(record: Record, due: GenesisDue) -> bool:
    """True when ``record`` is ``due``'s genesis: at ``B(p) + 1``, under the split records' header,
    decoding as a genesis equal to ``due.genesis`` (docs/design/splits.md "Record forms").

    A record under the split header that does not decode is logged as an error and is not taken
    for the genesis (:func:`~waltz.services.server.split_barrier.owned_split_record`).
    """
    if record.transaction_id != due.transaction_id:
        return False
    return owned_split_record(record, due.child, f"the genesis of epoch {due.epoch}") == due.genesis
