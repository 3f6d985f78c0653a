"""What a chaos client applies: a running checksum per partition, and the payloads it can re-derive.

Like upstream Waltz's smoke test, every client folds each transaction it applies into a running
checksum per partition (CRC-32 over transaction ID, header and data, in ID order); two clients that
applied the same sequence hold the same checksum at the same high-water mark. Payloads are random
but derived from ``(seed, writer, sequence number)``, so a reader can tell exactly which submission
a logged transaction came from and whether its bytes are intact (docs/chaos.md "What runs").

Payload layout (big-endian): writer index (4 bytes), sequence number (8 bytes), then 40 to 400
random bytes (raw workload), or the counter's key (4 bytes) and its new value (8 bytes) (counter
workload: a read-modify-write of a counter under the key's WRITE lock, as in docs/design/overview.md
"Why the log is the source of truth").
"""

from __future__ import annotations

import random
import struct
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from waltz.client.callbacks import WaltzClientCallbacks
from waltz.client.transaction import Transaction
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, opening_genesis

__all__ = [
    "ChecksumCallbacks",
    "PartitionSequence",
    "counter_key_for",
    "counter_payload",
    "decode_counter",
    "decode_tag",
    "payload_for",
    "split_genesis_start",
]

_TAG = struct.Struct(">IQ")
_COUNTER = struct.Struct(">IQIq")
_ENTRY = struct.Struct(">qi")


def payload_for(seed: int, writer: int, sequence: int) -> bytes:
    """The payload writer ``writer`` submits as its ``sequence``-th transaction of run ``seed``.

    Returns:
        12 bytes of tag (writer, sequence) and 40 to 400 random bytes; always the same for the same
        arguments.
    """
    rng = random.Random(seed * 1_000_003 + writer * 7_919_000_009 + sequence)
    return _TAG.pack(writer, sequence) + rng.randbytes(rng.randint(40, 400))


def counter_key_for(seed: int, writer: int, sequence: int, keys: int) -> int:
    """The counter key writer ``writer`` increments as its ``sequence``-th transaction (0..keys-1)."""
    return random.Random(seed * 1_000_003 + writer * 7_919_000_009 + sequence).randrange(keys)


def counter_payload(writer: int, sequence: int, key: int, value: int) -> bytes:
    """A counter increment: tag, key, and the value the counter takes (the one read, plus one)."""
    return _COUNTER.pack(writer, sequence, key, value)


def decode_counter(data: bytes) -> tuple[int, int, int, int] | None:
    """``(writer, sequence, key, value)`` of a counter payload, or None when ``data`` is not one."""
    if len(data) != _COUNTER.size:
        return None
    writer, sequence, key, value = _COUNTER.unpack(data)
    return int(writer), int(sequence), int(key), int(value)


def decode_tag(data: bytes) -> tuple[int, int] | None:
    """``(writer, sequence)`` of a chaos payload, or None when ``data`` is not one."""
    if len(data) < _TAG.size:
        return None
    writer, sequence = _TAG.unpack_from(data)
    return int(writer), int(sequence)


@dataclass
class PartitionSequence:
    """What one client applied of one partition.

    Attributes:
        mark: the highest transaction ID applied (-1: none).
        checksum: CRC-32 over ``(transaction ID, header, data)`` of transactions 0..mark, in order.
        count: transactions applied.
        errors: what was wrong (a gap, a transaction applied twice); empty when all is well.
    """

    mark: int = -1
    checksum: int = 0
    count: int = 0
    errors: list[str] = field(default_factory=list)


def split_genesis_start(transaction: Transaction) -> int | None:
    """The mark before ``transaction`` when it is the genesis that opens a new partition of a split
    (``B(p)``, its log starts after it: docs/design/splits.md "Record forms"), else None."""
    if transaction.header != SPLIT_RECORD_HEADER or transaction.transaction_id <= 0:
        return None
    genesis = opening_genesis(transaction.transaction_id, transaction.get_raw_data())
    return None if genesis is None else genesis.barrier


class ChecksumCallbacks(WaltzClientCallbacks):
    """Client callbacks that keep a :class:`PartitionSequence` per partition, in memory.

    Every client of a chaos run starts from nothing (mark -1), so it applies the whole log: a new
    partition of a split from its genesis, ``B(p) + 1``, where its log starts. A transaction that
    does not follow the mark (a gap, or one applied twice) is recorded as an error and not folded
    in; the client's guarantee is that this never happens. The counters are the keys' (a key's
    increments go to its parent, then after a split to its new partition; the client applies a
    new partition's genesis only once the parent is applied to the barrier).

    Args:
        observe: called with every applied transaction and its data, on the partition's apply
            thread (the log reader records the tags).
        counters: the payloads are counter increments: keep every key's value too.
    """

    prefetch_transaction_data = True

    def __init__(
        self, observe: Callable[[Transaction, bytes], None] | None = None, *, counters: bool = False
    ) -> None:
        self._counters = counters
        self._lock = threading.Lock()
        self._observe = observe
        self.partitions: dict[int, PartitionSequence] = {}
        self.values: dict[int, int] = {}
        """Counter key -> its value (the counter workload)."""
        self.uncaught: list[str] = []

    def sequence(self, partition_id: int) -> PartitionSequence:
        """The partition's sequence (created empty on first use)."""
        with self._lock:
            return self.partitions.setdefault(partition_id, PartitionSequence())

    def snapshot(self, partition_id: int, key: int) -> tuple[int, int]:
        """The partition's mark and a counter's value (0 if never written), read together."""
        state = self.sequence(partition_id)
        with self._lock:
            return state.mark, self.values.get(key, 0)

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.sequence(partition_id).mark

    def apply_transaction(self, transaction: Transaction) -> None:
        self.apply_transactions([transaction])

    def apply_transactions(self, transactions: Sequence[Transaction]) -> None:
        for t in transactions:
            data = t.get_raw_data()
            state = self.sequence(t.partition_id)
            start = split_genesis_start(t) if state.mark == -1 and state.count == 0 else None
            with self._lock:
                if start is not None:
                    state.mark = start  # a new partition's log starts with its genesis
                if t.transaction_id != state.mark + 1:
                    what = "applied twice" if t.transaction_id <= state.mark else "a gap"
                    state.errors.append(
                        f"partition {t.partition_id}: transaction {t.transaction_id} "
                        f"after {state.mark} ({what})"
                    )
                    continue
                crc = zlib.crc32(_ENTRY.pack(t.transaction_id, t.header), state.checksum)
                state.checksum = zlib.crc32(data, crc)
                state.mark = t.transaction_id
                state.count += 1
                if self._counters and (counter := decode_counter(data)) is not None:
                    self.values[counter[2]] = counter[3]
            if self._observe is not None:
                self._observe(t, data)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        with self._lock:
            self.uncaught.append(f"partition {partition_id}, transaction {transaction_id}: {exception!r}")
