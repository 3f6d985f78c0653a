"""The lock table: no false negatives ever, and a bounded false-positive rate."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.services.server.lock_table import LockTable, PendingLocks, slot_indexes

int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@given(
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=-1, max_value=100),
    st.lists(st.tuples(st.lists(int32, min_size=1, max_size=3)), max_size=60),
    st.lists(int32, min_size=1, max_size=20),
)
def test_no_false_negatives(
    size: int, hash_count: int, start: int, commits: list[tuple[list[int]]], probes: list[int]
) -> None:
    table = LockTable(start, size, hash_count)
    truth: dict[int, int] = {}
    txn = start
    for (locks,) in commits:
        txn += 1
        table.update(txn, locks)
        for lock in locks:
            truth[lock] = txn
    for lock in probes + list(truth):
        # Never below the true high-water mark, nor below the partition's opening mark.
        assert table.estimate(lock) >= truth.get(lock, start)
        assert table.conflict(truth.get(lock, start), [lock]) is None or table.estimate(lock) > truth.get(
            lock, start
        )
        assert table.conflict(truth.get(lock, start) - 1, [lock]) is not None


def test_opening_mark_is_the_floor() -> None:
    table = LockTable(41, 128, 3)
    assert table.estimate(12345) == 41
    assert table.conflict(41, [12345]) is None
    assert table.conflict(40, [12345]) == 41


@pytest.mark.parametrize("writes", [2_000, 10_000])
def test_false_positive_rate_is_bounded(writes: int) -> None:
    """A lock table of 65,536 slots with 3 hashes, after ``writes`` commits of random locks.

    A client that has seen nothing of those commits asks for locks none of them wrote: the fraction
    that fails is the false-positive rate. It must stay within the Bloom filter bound
    (1 - e^(-k n / m))^k (about 0.07% for 2,000 writes, 5% for 10,000) plus sampling noise.
    """
    size, hashes = 1 << 16, 3
    rng = random.Random(7)
    table = LockTable(-1, size, hashes)
    written = set()
    for txn in range(writes):
        lock = rng.randrange(10_000_000)
        written.add(lock)
        table.update(txn, [lock])
    fresh = [lock for lock in (rng.randrange(10_000_000) for _ in range(50_000)) if lock not in written]
    rate = sum(1 for lock in fresh if table.conflict(-1, [lock]) is not None) / len(fresh)
    bound = (1 - math.exp(-hashes * writes / size)) ** hashes
    assert rate <= bound * 1.3 + 0.001, (rate, bound)


def test_slot_indexes_are_stable() -> None:
    # The lock hash goes over the wire; the table layout must not depend on PYTHONHASHSEED.
    assert slot_indexes(42, 1000, 3) == slot_indexes(42, 1000, 3)
    assert len(set(slot_indexes(42, 1 << 16, 3))) == 3
    assert slot_indexes(-1, 97, 2) == slot_indexes(0xFFFFFFFF, 97, 2)


class _Append:
    """An append in flight in the tests below: its order and the slots of its locks."""

    def __init__(self, order: int, locks: list[int], table: LockTable) -> None:
        self.order = order
        self.locks = locks
        self.slots = {slot for indexes in table.slots_of(locks) for slot in indexes}

    def __repr__(self) -> str:
        return f"_Append({self.order}, {self.locks})"


@given(
    st.integers(min_value=1, max_value=40),
    st.integers(min_value=1, max_value=4),
    st.lists(st.lists(int32, min_size=1, max_size=3), min_size=1, max_size=30),
    st.randoms(use_true_random=False),
    st.lists(int32, max_size=20),
)
def test_pending_locks_find_every_lock_in_flight(
    size: int, hash_count: int, appends: list[list[int]], rng: random.Random, probes: list[int]
) -> None:
    """Hold appends in order, release a random subset in a random order (resolution is in order in
    the server; the filter must not depend on it), then probe: a lock an unreleased append holds is
    always found, and the append named is unreleased and never earlier than the latest holder of
    that very lock."""
    table = LockTable(-1, size, hash_count)
    pending: PendingLocks[_Append] = PendingLocks()
    held = [_Append(order, locks, table) for order, locks in enumerate(appends)]
    for entry in held:
        pending.hold(entry.slots, entry)
    released = rng.sample(held, rng.randrange(len(held) + 1))
    for entry in released:
        pending.release(entry.slots, entry)
    live = [entry for entry in held if entry not in released]
    for lock in probes + [lock for entry in held for lock in entry.locks]:
        holders = [entry for entry in live if lock in entry.locks]
        found, named = pending.holder(table.slots_of([lock]))
        if holders:
            assert found
        if named is not None:
            assert found and named in live
            if holders:
                assert named.order >= max(entry.order for entry in holders)
        covered = {slot for entry in live for slot in entry.slots}
        if not set(table.slots_of([lock])[0]) <= covered:
            assert not found
    if not live:
        assert len(pending) == 0
        assert pending.holder(table.slots_of(probes)) == (False, None)


def test_pending_locks_sharing_some_slots_is_no_conflict() -> None:
    """Two locks that share one slot of three: while one is in flight the other is free; the same
    lock is held, named by its append; released, it is free again."""
    table = LockTable(-1, 64, 3)
    first = 1
    first_slots = set(table.slots_of([first])[0])
    other = next(
        lock
        for lock in range(2, 100_000)
        if first_slots & set(table.slots_of([lock])[0]) and not set(table.slots_of([lock])[0]) <= first_slots
    )
    pending: PendingLocks[str] = PendingLocks()
    pending.hold(first_slots, "first")
    assert pending.holder(table.slots_of([other])) == (False, None)
    assert pending.holder(table.slots_of([other, first])) == (True, "first")
    pending.hold(set(table.slots_of([other])[0]), "other")
    assert pending.holder(table.slots_of([first])) == (True, "first")
    pending.release(first_slots, "first")
    assert pending.holder(table.slots_of([first])) == (False, None)
    assert pending.holder(table.slots_of([other])) == (True, "other")
