"""The lock table: no false negatives ever, and a bounded false-positive rate."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.services.server.lock_table import LockTable, slot_indexes

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
