"""The optimistic lock table of a partition (docs/design/locks.md "The lock table").

A fixed-size array of high-water marks, like a Bloom filter: each lock hash is spread over
``hash_count`` slots, a committed transaction raises every slot of its WRITE and APPEND locks to
its transaction ID, and the estimated high-water mark of a lock is the minimum over its slots.
Slots are only ever raised, and every slot of a lock was raised to at least the lock's true
high-water mark, so an estimate is never below it: no false negatives. Collisions can only make an
estimate too high (a false positive lock failure), with a rate that falls as the table grows.

When a server opens a partition every slot starts at the partition's high-water mark: whatever was
committed before is assumed to have touched every lock (never below, so never a false negative).

:class:`PendingLocks` keeps the locks of appends still in the store pipeline (``docs/protocol.md``
"Append"): per lock hash, the unresolved appends that hold it; a lock is held in flight when one of
them holds that very hash.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

__all__ = ["DEFAULT_HASH_COUNT", "DEFAULT_SIZE", "LockTable", "PendingLocks", "slot_indexes"]

T = TypeVar("T")

DEFAULT_SIZE = 1 << 16
DEFAULT_HASH_COUNT = 3

_MASK64 = (1 << 64) - 1
_INDEX_CACHE_SIZE = 1 << 16


def _mix(value: int) -> int:
    """splitmix64's finaliser: a stable 64-bit mix of a 32-bit lock hash."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def slot_indexes(lock_hash: int, size: int, hash_count: int) -> tuple[int, ...]:
    """The slots of a lock: ``hash_count`` indexes by double hashing of its mixed 32-bit hash.

    Not cached here: :meth:`LockTable.slots_of` remembers each table's recent locks.
    """
    mixed = _mix(lock_hash & 0xFFFFFFFF)
    first, step = mixed & 0xFFFFFFFF, (mixed >> 32) | 1
    return tuple((first + i * step) % size for i in range(hash_count))


class LockTable:
    """One partition's lock table.

    Args:
        high_water_mark: the partition's high-water mark when it opens; every slot starts there.
        size: the number of slots (``server.optimisticLockTableSize``).
        hash_count: slots per lock (``server.optimisticLockTableHashCount``).

    Raises:
        ValueError: a non-positive size or hash count.
    """

    def __init__(
        self, high_water_mark: int, size: int = DEFAULT_SIZE, hash_count: int = DEFAULT_HASH_COUNT
    ) -> None:
        if size <= 0 or hash_count <= 0:
            raise ValueError(f"lock table size {size} and hash count {hash_count} must be positive")
        self.size = size
        self.hash_count = hash_count
        self._slots = array("q", [high_water_mark]) * size
        self._indexes: dict[int, tuple[int, ...]] = {}  # lock hash -> its slots (recent locks)

    def slots_of(self, lock_hashes: Iterable[int]) -> list[tuple[int, ...]]:
        """The slots of each lock (compute once per append and reuse for checks and updates).

        Remembered for the most recent locks (up to 65,536, then forgotten all at once): the
        same locks come again and again, and a dictionary lookup is cheaper than the hashing.
        """
        cache = self._indexes
        result: list[tuple[int, ...]] = []
        for h in lock_hashes:
            indexes = cache.get(h)
            if indexes is None:
                if len(cache) >= _INDEX_CACHE_SIZE:
                    cache.clear()
                indexes = cache[h] = slot_indexes(h, self.size, self.hash_count)
            result.append(indexes)
        return result

    def estimate(self, lock_hash: int) -> int:
        """The estimated high-water mark of one lock: never below its true value."""
        return self._highest(self.slots_of((lock_hash,)))

    def estimate_all(self, lock_hashes: Sequence[int]) -> int:
        """The highest estimate among ``lock_hashes`` (-1 when there are none)."""
        return self._highest(self.slots_of(lock_hashes))

    def _highest(self, lock_slots: Sequence[Sequence[int]]) -> int:
        value = self._slots.__getitem__
        if len(lock_slots) == 1:  # the common case: one lock
            return min(map(value, lock_slots[0]))
        return max([min(map(value, indexes)) for indexes in lock_slots], default=-1)

    def conflict(self, client_high_water_mark: int, lock_hashes: Sequence[int]) -> int | None:
        """The lock compatibility test (docs/design/locks.md "The compatibility rule"): compatible
        when the client has seen every transaction that wrote one of the locks, i.e.
        ``client_high_water_mark >= estimate``.

        Returns:
            None when compatible, else the estimated high-water mark that the client must reach
            (the ID of the transaction that made the lock request fail, as far as the table knows).
        """
        return self.conflict_in_slots(client_high_water_mark, self.slots_of(lock_hashes))

    def conflict_in_slots(
        self, client_high_water_mark: int, lock_slots: Sequence[Sequence[int]]
    ) -> int | None:
        """:meth:`conflict` for locks given by their slots (:meth:`slots_of`)."""
        highest = self._highest(lock_slots)
        return None if client_high_water_mark >= highest else highest

    def update(self, transaction_id: int, lock_hashes: Iterable[int]) -> None:
        """Record that ``transaction_id`` committed holding these WRITE/APPEND locks."""
        self.update_slots(transaction_id, {i for indexes in self.slots_of(lock_hashes) for i in indexes})

    def update_slots(self, transaction_id: int, slot_set: Iterable[int]) -> None:
        """:meth:`update` for locks given by their slots."""
        slots = self._slots
        for i in slot_set:
            slots[i] = max(slots[i], transaction_id)


class PendingLocks(Generic[T]):
    """The locks held by appends that are not resolved yet (one partition's store pipeline).

    Keyed by lock hash (``docs/protocol.md`` "Append"): :meth:`hold` counts an append on each of its
    WRITE and APPEND lock hashes until :meth:`release`; a lock is *held* while an unresolved append
    holds that hash. Two appends on the same lock always find each other, and locks that only share
    lock-table slots do not (one dictionary operation per lock, not one per slot). Each hash also
    remembers its latest holder, so that a lock failure can name the append to wait for.

    Entries are compared by identity; hold each at most once at a time.
    """

    __slots__ = ("_counts", "_latest", "_order")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}  # lock hash -> unresolved appends holding it
        self._latest: dict[int, tuple[int, T]] = {}  # lock hash -> (hold order, latest holder)
        self._order = itertools.count()

    def __len__(self) -> int:
        """The number of lock hashes held."""
        return len(self._counts)

    def hold(self, lock_hashes: Iterable[int], entry: T) -> None:
        """Count ``entry`` on each of ``lock_hashes`` until it is released (a hash given twice
        counts twice: release the same hashes)."""
        counts = self._counts
        latest = self._latest
        held = (next(self._order), entry)
        for lock in lock_hashes:
            counts[lock] = counts.get(lock, 0) + 1
            latest[lock] = held

    def release(self, lock_hashes: Iterable[int], entry: T) -> None:
        """Stop counting ``entry`` (resolved) on the ``lock_hashes`` it was held on."""
        counts = self._counts
        latest = self._latest
        for lock in lock_hashes:
            left = counts.get(lock, 0) - 1
            if left > 0:
                counts[lock] = left
            else:
                counts.pop(lock, None)
            holder = latest.get(lock)
            if holder is not None and holder[1] is entry:
                del latest[lock]

    def holder(self, lock_hashes: Iterable[int]) -> tuple[bool, T | None]:
        """Whether one of these locks is held in flight, and by which append.

        Returns:
            ``(False, None)`` when no lock is held. ``(True, entry)`` when one is: ``entry`` is the
            latest append that took the first held lock. Every append holding that lock took it no
            later, so once ``entry`` is committed (commits follow the order appends are held in)
            so is every such append. ``(True, None)`` when the lock's latest holder resolved before
            older ones: held, but no one to name.
        """
        counts = self._counts
        if not counts:
            return False, None
        for lock in lock_hashes:
            if lock in counts:
                held = self._latest.get(lock)
                return True, (None if held is None else held[1])
        return False, None
