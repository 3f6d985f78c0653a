"""The server's recent-data cache keeps the newest transactions within its count and byte budgets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from waltz.services.server.server_partition import TransactionDataCache


def test_the_oldest_leave_first_by_count_and_by_bytes() -> None:
    cache = TransactionDataCache(max_transactions=3, max_bytes=1000)
    for tid in range(5):
        cache.put(tid, b"x" * 100, tid)
    assert [tid for tid in range(5) if cache.get(tid)] == [2, 3, 4]  # the count bound
    cache.put(5, b"y" * 700, 5)
    assert [tid for tid in range(6) if cache.get(tid)] == [3, 4, 5] and cache.bytes == 900
    cache.put(6, b"v" * 300, 6)  # the count bound drops 3, then the byte budget 4 (1,100 bytes)
    assert [tid for tid in range(7) if cache.get(tid)] == [5, 6] and cache.bytes == 1000
    cache.put(8, b"z" * 5000, 8)  # larger than the whole budget: nothing of it or before it stays
    assert len(cache) == 0 and cache.bytes == 0
    cache.put(9, b"w", 9)
    assert cache.get(9) == (b"w", 9)


def test_a_zero_byte_budget_keeps_only_empty_data() -> None:
    cache = TransactionDataCache(max_transactions=10, max_bytes=0)
    cache.put(0, b"data", 0)
    cache.put(1, b"", 1)
    assert cache.get(0) is None and cache.get(1) == (b"", 1)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=500), max_size=60),
    max_transactions=st.integers(min_value=1, max_value=20),
    max_bytes=st.integers(min_value=0, max_value=3000),
)
def test_it_holds_the_longest_newest_run_within_both_budgets(
    sizes: list[int], max_transactions: int, max_bytes: int
) -> None:
    cache = TransactionDataCache(max_transactions, max_bytes)
    for tid, size in enumerate(sizes):
        cache.put(tid, bytes(size), tid)
        kept = [t for t in range(tid + 1) if cache.get(t) is not None]
        # A run ending at the newest (or nothing), within both budgets, that one more would break.
        assert kept == list(range(tid + 1 - len(kept), tid + 1))
        assert len(kept) <= max_transactions and cache.bytes == sum(sizes[t] for t in kept) <= max_bytes
        older = tid - len(kept)
        if older >= 0:
            assert len(kept) + 1 > max_transactions or cache.bytes + sizes[older] > max_bytes
