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
    """An append in flight in the tests below: its order and its lock hashes."""

    def __init__(self, order: int, locks: list[int]) -> None:
        self.order = order
        self.locks = locks

    def __repr__(self) -> str:
        return f"_Append({self.order}, {self.locks})"


@given(
    st.lists(
        st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=3), min_size=1, max_size=30
    ),
    st.randoms(use_true_random=False),
    st.lists(st.integers(min_value=0, max_value=15), max_size=20),
)
def test_pending_locks_find_exactly_the_locks_in_flight(
    appends: list[list[int]], rng: random.Random, probes: list[int]
) -> None:
    """Hold appends in order, release a random subset in a random order (resolution is in order in
    the server; the bookkeeping must not depend on it), then probe: a lock an unreleased append
    holds is always found, a lock none holds never is, and the append named is the latest
    unreleased holder of that very lock (or nobody, when a later holder was released first)."""
    pending: PendingLocks[_Append] = PendingLocks()
    held = [_Append(order, locks) for order, locks in enumerate(appends)]
    for entry in held:
        pending.hold(entry.locks, entry)
    released = rng.sample(held, rng.randrange(len(held) + 1))
    for entry in released:
        pending.release(entry.locks, entry)
    live = [entry for entry in held if entry not in released]
    for lock in probes + [lock for entry in held for lock in entry.locks]:
        holders = [entry for entry in live if lock in entry.locks]
        found, named = pending.holder([lock])
        assert found == bool(holders)
        if named is not None:
            assert named in live and named.order == max(entry.order for entry in holders)
        latest = max((entry for entry in held if lock in entry.locks), key=lambda e: e.order, default=None)
        if holders and latest in live:
            assert named is latest
    if not live:
        assert len(pending) == 0
        assert pending.holder(probes) == (False, None)


def test_pending_locks_sharing_lock_table_slots_is_no_conflict() -> None:
    """Two locks that share lock-table slots: while one is in flight the other is free; the same
    lock is held, named by its latest append; released, it is free again."""
    table = LockTable(-1, 64, 3)
    first = 1
    first_slots = set(table.slots_of([first])[0])
    other = next(lock for lock in range(2, 100_000) if first_slots & set(table.slots_of([lock])[0]))
    pending: PendingLocks[str] = PendingLocks()
    pending.hold([first], "first")
    assert pending.holder([other]) == (False, None)
    assert pending.holder([other, first]) == (True, "first")
    pending.hold([other, first], "both")
    assert pending.holder([first]) == (True, "both")
    pending.release([other, first], "both")
    assert pending.holder([first]) == (True, None)  # "first" still holds it; its latest holder left
    assert pending.holder([other]) == (False, None)
    pending.release([first], "first")
    assert pending.holder([first]) == (False, None)
    assert len(pending) == 0


def test_slots_of_remembers_recent_locks_and_forgets_them_when_full() -> None:
    table = LockTable(-1, 1 << 10, 3)
    first = table.slots_of([7, 8])
    assert first == [slot_indexes(7, 1 << 10, 3), slot_indexes(8, 1 << 10, 3)]
    assert table.slots_of(iter([8, 7])) == first[::-1]  # any iterable, in order
    for lock in range(100, 100 + (1 << 16)):
        table.slots_of([lock])
    assert len(table._indexes) <= 1 << 16
    assert table.slots_of([7]) == [slot_indexes(7, 1 << 10, 3)]
