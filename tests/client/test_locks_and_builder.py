"""Lock hashes (stable, documented values) and the transaction builder."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz import BytesSerializer, JsonSerializer, LockMode, PartitionLocalLock, TransactionBuilder
from waltz.client.locks import lock_hash
from waltz.protocol.records import crc32
from waltz.protocol.split_records import SPLIT_RECORD_HEADER

#: The values documented in waltz/client/locks.py: they must never change (the server's lock
#: table and every running client agree on them).
DOCUMENTED = {
    ("account", 1): -1354360118,
    ("account", 2): 911166320,
    ("counter", 0): -1627299275,
    ("", -1): 558161692,
}


@pytest.mark.parametrize(("name", "lock_id"), list(DOCUMENTED))
def test_documented_lock_hashes(name: str, lock_id: int) -> None:
    assert PartitionLocalLock(name, lock_id).lock_hash == DOCUMENTED[(name, lock_id)]


@given(st.text(), st.integers(-(1 << 63), (1 << 63) - 1))
def test_lock_hash_is_the_documented_formula(name: str, lock_id: int) -> None:
    # docs/protocol.md: crc32(name utf-8 + id as 8 big-endian signed bytes), as a signed int32.
    unsigned = zlib.crc32(name.encode("utf-8") + lock_id.to_bytes(8, "big", signed=True))
    expected = unsigned - (1 << 32) if unsigned >= 1 << 31 else unsigned
    value = lock_hash(name, lock_id)
    assert value == expected
    assert -(1 << 31) <= value < 1 << 31


def test_lock_id_must_fit_in_64_bits() -> None:
    with pytest.raises(ValueError, match="64-bit"):
        PartitionLocalLock("x", 1 << 63)
    with pytest.raises(ValueError, match="64-bit"):
        lock_hash("x", -(1 << 63) - 1)


def test_locks_are_values() -> None:
    assert PartitionLocalLock("a", 1) == PartitionLocalLock("a", 1)
    assert len({PartitionLocalLock("a", 1), PartitionLocalLock("a", 1), PartitionLocalLock("a", 2)}) == 2


def test_builder_defaults() -> None:
    payload = TransactionBuilder(41).build()
    assert payload.client_high_water_mark == 41
    assert payload.header == 0
    assert payload.data == b""
    assert payload.checksum == crc32(b"")
    assert payload.write_locks == payload.read_locks == payload.append_locks == ()


def test_builder_collects_header_data_and_locks() -> None:
    builder = TransactionBuilder(7)
    builder.set_header(-5)
    builder.set_transaction_data({"b": 2, "a": 1}, JsonSerializer())
    a1, a2, c0 = (
        PartitionLocalLock("account", 1),
        PartitionLocalLock("account", 2),
        PartitionLocalLock("counter", 0),
    )
    builder.set_write_locks([a2, a1, a1])
    builder.set_read_locks([c0])
    builder.set_append_locks([a1])
    assert builder.locks(LockMode.WRITE) == (a2, a1, a1)
    payload = builder.build()
    assert payload.header == -5
    assert payload.data == b'{"a":1,"b":2}'
    assert payload.checksum == crc32(payload.data)
    # Hashes per mode, deduplicated and sorted (a stable wire form).
    assert payload.write_locks == tuple(sorted({a1.lock_hash, a2.lock_hash}))
    assert payload.read_locks == (c0.lock_hash,)
    assert payload.append_locks == (a1.lock_hash,)


def test_builder_high_water_mark_override() -> None:
    builder = TransactionBuilder(3)
    builder.set_client_high_water_mark(10)
    assert builder.client_high_water_mark == 10
    assert builder.build().client_high_water_mark == 10
    builder.set_client_high_water_mark(-1)
    assert builder.build().client_high_water_mark == -1
    with pytest.raises(ValueError, match="below -1"):
        builder.set_client_high_water_mark(-2)


@pytest.mark.parametrize("header", [1 << 31, -(1 << 31) - 1])
def test_builder_header_is_32_bits(header: int) -> None:
    with pytest.raises(ValueError, match="32-bit"):
        TransactionBuilder(0).set_header(header)


def test_builder_refuses_the_split_records_header() -> None:
    """docs/design/splits.md "Why no update is lost": only a partition's owner writes a split record."""
    builder = TransactionBuilder(0)
    with pytest.raises(ValueError, match="header 0x57505348 is reserved for partition split records"):
        builder.set_header(SPLIT_RECORD_HEADER)
    assert builder.header == 0


def test_serializers_round_trip() -> None:
    assert BytesSerializer().deserialize(BytesSerializer().serialize(b"\x00\xff")) == b"\x00\xff"
    value = {"x": [1, 2, {"y": None}], "z": "é"}
    assert JsonSerializer().deserialize(JsonSerializer().serialize(value)) == value
