"""The epoch gate's decision: which appends a partition's owner refuses for the epoch they were
routed by, in every state of ``partitions/epochs`` (docs/design/splits.md "The handover", steps 3
and 4). New children are not created as partitions yet, so ``PARTITION_NOT_OPEN`` is reachable
only here, not on a running cluster. Also which barrier a sealing parent owes, and which record of
its log is one (docs/design/splits.md "The owner's barrier"); and which genesis an opened child
owes, what its recovered high-water mark tells its owner to do, and which record is its genesis
(docs/design/splits.md "The handover", step 4)."""

from __future__ import annotations

import pytest

from waltz.errors import WaltzError
from waltz.metadata.epochs import ChildProgress, Epoch, EpochState, ParentProgress, PartitionEpochs
from waltz.protocol import client_pb2, common_pb2
from waltz.protocol.records import Record, ReqId
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitBarrier, SplitGenesis
from waltz.services.server.epoch_gate import EpochGate, epoch_gate
from waltz.services.server.split_barrier import SPLIT_CLIENT_ID, BarrierDue, barrier_due, is_barrier_of
from waltz.services.server.split_genesis import (
    GenesisDue,
    GenesisStep,
    genesis_due,
    genesis_step,
    is_genesis_of,
)

NEVER_SPLIT = PartitionEpochs(2)
PREPARED = NEVER_SPLIT.prepare(4, {0: 10, 1: 20})
SEALING_0 = PREPARED.mark_sealing(1, 0)
BARRIER_0 = SEALING_0.set_barrier(1, 0, 11).mark_opened(1, 2)
GENESIS_2 = BARRIER_0.set_genesis(1, 2, 12)
#: Epoch 1 (2 -> 4) complete, epoch 2 (4 -> 8) sealing parent 1 only.
SPLIT_TWICE = PartitionEpochs(
    2,
    (
        Epoch(
            1,
            4,
            2,
            EpochState.COMPLETE,
            {0: ParentProgress(10, True, 11), 1: ParentProgress(20, True, 21)},
            {2: ChildProgress(True, 12), 3: ChildProgress(True, 22)},
        ),
        Epoch(
            2,
            8,
            4,
            EpochState.SEALING,
            {p: ParentProgress(30, p == 1, None) for p in range(4)},
            {c: ChildProgress() for c in range(4, 8)},
        ),
    ),
)


def test_no_split_and_a_prepared_split_take_every_epoch() -> None:
    for epochs in (NEVER_SPLIT, PREPARED):
        for partition in (0, 1):
            assert epoch_gate(epochs, partition) is None
    # A parent not sealing while another is: untouched.
    assert epoch_gate(SEALING_0, 1) is None


def test_a_sealing_parent_refuses_older_epochs_naming_the_epoch_and_its_count() -> None:
    gate = epoch_gate(SEALING_0, 0)
    assert gate == EpochGate(0, 1, 4)
    refusal = gate.refusal(0)
    assert refusal is not None
    assert (refusal.code, refusal.epoch, refusal.partition_count) == (client_pb2.STALE_PARTITION_EPOCH, 1, 4)
    assert "epoch 1 (4 partitions)" in refusal.message and "routed by epoch 0" in refusal.message
    assert gate.refusal(1) is None and gate.refusal(2) is None
    # On the wire: a ServerError under the append's ReqId, with its code, epoch and count.
    req_id = common_pb2.ReqId(client_id=3, generation=4, partition_id=0, seq_num=5)
    error = refusal.to_proto(req_id).error
    assert (error.req_id, error.code, error.epoch, error.partition_count, error.message) == (
        req_id,
        client_pb2.STALE_PARTITION_EPOCH,
        1,
        4,
        refusal.message,
    )


def test_a_new_child_without_its_genesis_is_not_open_to_any_epoch() -> None:
    for epochs in (PREPARED, SEALING_0, BARRIER_0):  # not yet opened, opened without a genesis
        gate = epoch_gate(epochs, 2)
        assert gate is not None and gate.min_epoch == 1
        for epoch in (0, 1, 2):
            refusal = gate.refusal(epoch)
            assert refusal is not None
            assert (refusal.code, refusal.epoch, refusal.partition_count) == (
                client_pb2.PARTITION_NOT_OPEN,
                1,
                4,
            )
            assert "partition 2 is a new partition of epoch 1 (4 partitions)" in refusal.message
    # Its genesis committed: open to epoch 1 and later, stale below.
    opened = epoch_gate(GENESIS_2, 2)
    assert opened == EpochGate(2, 1, 4)
    assert opened.refusal(1) is None
    stale = opened.refusal(0)
    assert stale is not None and stale.code == client_pb2.STALE_PARTITION_EPOCH
    # A sibling still without its genesis stays closed.
    sibling = epoch_gate(GENESIS_2, 3)
    assert sibling is not None and sibling.not_open is not None


def test_a_complete_epoch_binds_every_parent_and_the_newest_sealing_epoch_wins() -> None:
    assert epoch_gate(SPLIT_TWICE, 0) == EpochGate(0, 1, 4)  # sealed in epoch 1, not sealing in 2
    assert epoch_gate(SPLIT_TWICE, 1) == EpochGate(1, 2, 8)  # sealing in epoch 2
    assert epoch_gate(SPLIT_TWICE, 2) == EpochGate(2, 1, 4)  # a child of epoch 1, a parent of 2
    child = epoch_gate(SPLIT_TWICE, 5)
    assert child is not None and child.not_open is not None and child.not_open.epoch == 2
    stale = epoch_gate(SPLIT_TWICE, 1)
    assert stale is not None
    refused = stale.refusal(1)
    assert refused is not None and (refused.epoch, refused.partition_count) == (2, 8)


def test_a_barrier_is_owed_by_a_sealing_parent_until_its_barrier_is_written() -> None:
    # Nothing before the mark, nothing for a parent not sealing, nothing once B(p) is written.
    for epochs, partition in (
        (NEVER_SPLIT, 0),
        (PREPARED, 0),
        (SEALING_0, 1),
        (BARRIER_0, 0),
        (GENESIS_2, 0),
    ):
        assert barrier_due(epochs, partition) is None
    due = barrier_due(SEALING_0, 0)
    assert due == BarrierDue(SplitBarrier(epoch=1, count=4, previous_count=2, parent=0), 10)
    assert due.req_id(7) == ReqId(SPLIT_CLIENT_ID, 7, 0, 1) and SPLIT_CLIENT_ID == 0
    # Split twice: parent 1 of epoch 2 (4 -> 8) owes its barrier; the others of epoch 2 do not,
    # and the new children of epoch 1 are parents of epoch 2 like the others.
    assert barrier_due(SPLIT_TWICE, 1) == BarrierDue(SplitBarrier(2, 8, 4, 1), 30)
    for partition in (0, 2, 3, 4):
        assert barrier_due(SPLIT_TWICE, partition) is None


def test_a_barrier_is_recognised_by_its_header_epoch_and_parent() -> None:
    due = barrier_due(SEALING_0, 0)
    assert due is not None

    def record(header: int, data: bytes) -> Record:
        return Record.create(11, ReqId(0, 1, 0, 1), header, data)

    assert is_barrier_of(record(SPLIT_RECORD_HEADER, SplitBarrier(1, 4, 2, 0).encode()), due)
    others = (
        SplitBarrier(2, 8, 4, 0).encode(),  # another epoch
        SplitBarrier(1, 4, 2, 1).encode(),  # another parent
        SplitGenesis(1, 4, 2, 0, 11).encode(),  # not a barrier
        b'{"v": 2, "kind": "barrier"}',  # a newer form: logged, not taken
        b"not json",
    )
    for data in others:
        assert not is_barrier_of(record(SPLIT_RECORD_HEADER, data), due)
    # The same bytes under another header are an application's record.
    assert not is_barrier_of(record(7, SplitBarrier(1, 4, 2, 0).encode()), due)


def test_a_genesis_is_owed_by_an_opened_child_until_its_genesis_is_written() -> None:
    # Nothing before the child is opened, nothing for a parent, nothing once the genesis is written.
    for epochs, partition in (
        (NEVER_SPLIT, 2),
        (PREPARED, 2),
        (SEALING_0, 2),
        (SEALING_0.set_barrier(1, 0, 11), 2),
        (BARRIER_0, 0),
        (BARRIER_0, 3),
        (GENESIS_2, 2),
        (SPLIT_TWICE, 2),
        (SPLIT_TWICE, 4),
    ):
        assert genesis_due(epochs, partition) is None
    due = genesis_due(BARRIER_0, 2)
    assert due == GenesisDue(SplitGenesis(epoch=1, count=4, previous_count=2, parent=0, barrier=11), 2)
    assert (due.epoch, due.barrier, due.transaction_id) == (1, 11, 12)
    assert due.req_id(7) == ReqId(SPLIT_CLIENT_ID, 7, 2, 1)
    # Epoch 2 (4 -> 8): child 5 of parent 1 opened after B(1) of epoch 2.
    twice = SPLIT_TWICE.set_barrier(2, 1, 31).mark_opened(2, 5)
    assert genesis_due(twice, 5) == GenesisDue(SplitGenesis(2, 8, 4, 1, 31), 5)


def test_a_child_appends_its_genesis_on_an_empty_log_and_finds_it_on_one_that_holds_it() -> None:
    due = genesis_due(BARRIER_0, 2)
    assert due is not None
    assert genesis_step(due, 11) is GenesisStep.APPEND
    assert genesis_step(due, 12) is GenesisStep.FIND
    with pytest.raises(WaltzError, match="high-water mark 10 is below its parent 0's barrier 11"):
        genesis_step(due, 10)


def test_a_genesis_is_recognised_by_its_place_header_and_every_field() -> None:
    due = genesis_due(BARRIER_0, 2)
    assert due is not None

    def record(data: bytes, transaction_id: int = 12, header: int = SPLIT_RECORD_HEADER) -> Record:
        return Record.create(transaction_id, ReqId(0, 1, 2, 1), header, data)

    genesis = SplitGenesis(1, 4, 2, 0, 11).encode()
    assert is_genesis_of(record(genesis), due)
    assert not is_genesis_of(record(genesis, transaction_id=13), due)  # not the log's first
    assert not is_genesis_of(record(genesis, header=7), due)  # an application's record
    others = (
        SplitGenesis(2, 8, 4, 0, 11).encode(),  # another epoch
        SplitGenesis(1, 4, 2, 0, 10).encode(),  # another barrier
        SplitGenesis(1, 4, 2, 1, 11).encode(),  # another parent
        SplitBarrier(1, 4, 2, 0).encode(),  # not a genesis
        b'{"v": 2, "kind": "genesis"}',  # a newer form: logged, not taken
        b"not json",
    )
    for data in others:
        assert not is_genesis_of(record(data), due)
