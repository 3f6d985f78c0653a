"""The client's routing by partition epochs (docs/design/splits.md "Clients across a split", "The
routing rule"): the newest count whose parent for the key is sealing, over several epochs; and the
view the epochs' watch replaces, with its waits.

Pure values: the epochs are made by the same steps a split takes (``PartitionEpochs.prepare``,
``mark_sealing``...), and the keys are routed by ``hash mod count``, a divisible function.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from waltz.client.routing import EpochRouting, Route, RoutingView, route_by_epochs
from waltz.metadata.epochs import PartitionEpochs

#: Keys enough to meet every partition of 16 many times.
KEYS = range(160)


def completed(epochs: PartitionEpochs, number: int) -> PartitionEpochs:
    """Epoch ``number`` taken to ``complete``: every parent sealed with its barrier, every child
    opened with its genesis (the steps of docs/design/splits.md "The handover")."""
    epoch = epochs.epoch(number)
    for parent in epoch.parents:
        epochs = epochs.mark_sealing(number, parent)
        epochs = epochs.set_barrier(number, parent, 100 + parent)
    for child in epoch.children:
        epochs = epochs.mark_opened(number, child)
        epochs = epochs.set_genesis(number, child, 100 + child % epoch.previous_count + 1)
    return epochs.complete(number)


def never_split() -> PartitionEpochs:
    return PartitionEpochs(2)


def preparing() -> PartitionEpochs:
    return PartitionEpochs(2).prepare(4, {0: -1, 1: 5})


def parent_0_sealing() -> PartitionEpochs:
    return preparing().mark_sealing(1, 0)


def test_a_cluster_that_never_split_routes_every_key_by_its_count_with_epoch_0() -> None:
    for key in KEYS:
        assert route_by_epochs(never_split(), key % 2) == Route(key % 2, 0)


def test_a_prepared_split_changes_no_route() -> None:
    for key in KEYS:
        assert route_by_epochs(preparing(), key % 4) == Route(key % 2, 0)


def test_a_sealing_parent_routes_its_keys_by_the_new_count_and_the_others_stay() -> None:
    routes = {key % 4: route_by_epochs(parent_0_sealing(), key % 4) for key in KEYS}
    # Parent 0's keys: to 0 (child j = 0, itself) or to the new child 2, with epoch 1.
    assert routes[0] == Route(0, 1)
    assert routes[2] == Route(2, 1)
    # Parent 1 is not sealing: its keys stay in 1 with epoch 0, those moving to 3 included.
    assert routes[1] == Route(1, 0)
    assert routes[3] == Route(1, 0)


def test_a_complete_epoch_routes_every_key_by_its_count() -> None:
    epochs = completed(parent_0_sealing(), 1)
    for key in KEYS:
        assert route_by_epochs(epochs, key % 4) == Route(key % 4, 1)


def test_several_epochs_route_by_the_newest_whose_parent_for_the_key_is_sealing() -> None:
    # 2 -> 4 (complete) -> 16 (k = 4), parents 1 and 2 sealing.
    epochs = completed(parent_0_sealing(), 1).prepare(16, {p: -1 for p in range(4)})
    epochs = epochs.mark_sealing(2, 1).mark_sealing(2, 2)
    for key in KEYS:
        c = key % 16
        expected = Route(c, 2) if c % 4 in (1, 2) else Route(c % 4, 1)
        assert route_by_epochs(epochs, c) == expected, key
    # Three splits, the newest only prepared: every key by epoch 2's count.
    third = completed(epochs, 2).prepare(32, {p: -1 for p in range(16)})
    for key in KEYS:
        assert route_by_epochs(third, key % 32) == Route(key % 16, 2)
    # ... and once its parent 5 is sealing, the keys of 5 (5 and 21 at 32) by epoch 3.
    sealing = third.mark_sealing(3, 5)
    for key in KEYS:
        c = key % 32
        assert route_by_epochs(sealing, c) == (Route(c, 3) if c % 16 == 5 else Route(c % 16, 2))


def test_a_partition_outside_the_newest_count_is_refused() -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        route_by_epochs(parent_0_sealing(), 4)
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        route_by_epochs(never_split(), -1)


def test_the_view_moves_only_when_the_znode_changes_and_wakes_its_waiters() -> None:
    routing = EpochRouting(2)
    first = routing.view
    assert (first.serial, first.version, first.count, first.epoch) == (0, -1, 2, 0)
    assert not routing.update(PartitionEpochs(2), -1)  # the same value: no move
    assert routing.view is first

    async def scenario() -> tuple[bool, bool, RoutingView]:
        # A wait that nothing answers ends at its bound, without a move.
        timed_out = await routing.wait_newer(first.serial, 0.05)
        waiting = asyncio.ensure_future(routing.wait_newer(first.serial, 30))
        await asyncio.sleep(0)
        writer = threading.Thread(target=routing.update, args=(parent_0_sealing(), 1))
        writer.start()  # as the watch does, from another thread
        moved = await waiting
        writer.join(10)
        return timed_out, moved, routing.view

    timed_out, moved, view = asyncio.run(scenario())
    assert not timed_out and moved
    assert (view.serial, view.version, view.count, view.epoch) == (1, 1, 4, 1)
    assert view.route(2) == Route(2, 1) and view.route(3) == Route(1, 0)

    async def already_moved() -> bool:
        return await routing.wait_newer(first.serial, 0)

    assert asyncio.run(already_moved())
