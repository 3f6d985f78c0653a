"""Partition-local lock IDs and their stable 32-bit wire hash (docs/design/locks.md "Lock hashes").

A lock ID is an application-defined name and a 64-bit integer ID; Waltz does not know what it
stands for. Its scope is one partition. On the wire a lock is its 32-bit hash (``docs/protocol.md``,
"Locks")::

    crc32(name.encode("utf-8") + id.to_bytes(8, "big", signed=True))   as a signed 32-bit int

which never changes between processes or Python versions (unlike ``hash()``). Documented values::

    PartitionLocalLock("account", 1).lock_hash  == -1354360118
    PartitionLocalLock("account", 2).lock_hash  == 911166320
    PartitionLocalLock("counter", 0).lock_hash  == -1627299275
    PartitionLocalLock("", -1).lock_hash        == 558161692
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from waltz.client.arguments import check_integer
from waltz.protocol.records import crc32

__all__ = ["LockMode", "PartitionLocalLock", "lock_hash"]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class LockMode(enum.Enum):
    """How an append holds a lock (docs/design/locks.md "Lock modes").

    - ``WRITE``: checked against the lock table; the commit records the transaction on the lock.
    - ``READ``: checked against the lock table; the commit leaves the lock unchanged.
    - ``APPEND``: not checked against the table (only against appends in flight); the commit
      records the transaction on the lock.
    """

    WRITE = "write"
    READ = "read"
    APPEND = "append"


def lock_hash(name: str, lock_id: int) -> int:
    """The stable 32-bit hash of a lock (``docs/protocol.md``, "Locks").

    Args:
        name: the lock's name (any text; hashed as UTF-8).
        lock_id: the lock's 64-bit signed integer ID.

    Returns:
        ``crc32(name.encode("utf-8") + lock_id.to_bytes(8, "big", signed=True))`` as a signed
        32-bit integer, in ``[-2**31, 2**31)``.

    Raises:
        TypeError: ``name`` is not a string or ``lock_id`` not an int.
        ValueError: ``lock_id`` does not fit in a signed 64-bit integer.
    """
    if type(name) is not str:
        raise TypeError(f"lock name must be a str, not {type(name).__name__} {name!r}")
    lock_id = check_integer(lock_id, "lock ID")
    if not _INT64_MIN <= lock_id <= _INT64_MAX:
        raise ValueError(f"lock ID {lock_id} does not fit in a signed 64-bit integer")
    return _hash(name, lock_id)


@functools.lru_cache(maxsize=1 << 16)
def _hash(name: str, lock_id: int) -> int:
    """:func:`lock_hash` of a valid ID; cached (the most recent 65,536 locks): applications take
    the same locks again and again, and every attempt hashes its locks."""
    value = crc32(name.encode("utf-8") + lock_id.to_bytes(8, "big", signed=True))
    return value - (1 << 32) if value >= 1 << 31 else value


@dataclass(frozen=True, slots=True)
class PartitionLocalLock:
    """A lock ID local to a partition: an application-defined name and a 64-bit integer ID.

    Args:
        name: what kind of thing is locked, e.g. ``"account"``.
        id: which one, e.g. the account number (a signed 64-bit integer).

    Raises:
        TypeError: ``name`` is not a string or ``id`` not an int (a float, a bool, a string).
        ValueError: ``id`` does not fit in a signed 64-bit integer.
    """

    name: str
    id: int

    def __post_init__(self) -> None:
        if type(self.name) is not str:
            raise TypeError(f"lock name must be a str, not {type(self.name).__name__} {self.name!r}")
        if type(self.id) is not int:
            object.__setattr__(self, "id", check_integer(self.id, f"lock ID of {self.name!r}"))
        if not _INT64_MIN <= self.id <= _INT64_MAX:
            raise ValueError(f"lock ID {self.id} of {self.name!r} does not fit in a signed 64-bit integer")

    @property
    def lock_hash(self) -> int:
        """The 32-bit hash sent on the wire (see :func:`lock_hash`)."""
        return _hash(self.name, self.id)  # the ID was checked on construction
