"""The change-set format and the declarative entity identity (no database needed)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import (
    ChangeSet,
    ChangeSetFormatError,
    EntityRegistry,
    Operation,
    RowChange,
    UnknownEntityError,
    WaltzEntity,
    lock_id_of,
)
from waltz.jdbc_style.changeset import decode_members, decode_value, encode_value

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.datetimes(timezones=st.just(dt.UTC)) | st.datetimes(),
    st.dates(),
    st.times(),
    st.binary(),
    st.uuids(),
)
names = st.text(alphabet="abcdefghij_", min_size=1, max_size=8)
changes = st.builds(
    lambda op, entity, key, row, version: RowChange(
        op, entity, key, {} if op is Operation.DELETE else row, version
    ),
    st.sampled_from(Operation),
    names,
    st.dictionaries(names, values, min_size=1, max_size=3),
    st.dictionaries(names, values, max_size=5),
    st.integers(min_value=1, max_value=5) | st.just(1),
)


@given(st.lists(changes, max_size=5), st.none() | st.text(min_size=1, max_size=20))
def test_a_change_set_survives_encoding(rows: list[RowChange], key: str | None) -> None:
    change_set = ChangeSet(rows, key, {"request": "transfer", "n": [1, 2]})
    data = change_set.encode()
    assert ChangeSet.decode(data) == change_set
    assert change_set.encode() == data  # deterministic bytes
    # Form 1, which every waltz-py reads, unless a change is of a schema version above 1.
    form = 2 if any(row.schema_version > 1 for row in rows) else 1
    assert json.loads(data)["v"] == form


def test_values_json_cannot_hold_are_tagged() -> None:
    assert encode_value(decimal.Decimal("1.10")) == {"$decimal": "1.10"}
    assert encode_value(b"\x00\xff") == {"$bytes": "AP8="}
    moment = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert decode_value(encode_value(moment)) == moment
    u = uuid.UUID(int=7)
    assert decode_value(encode_value(u)) == u
    with pytest.raises(ChangeSetFormatError, match="float nan"):
        encode_value(float("nan"))
    with pytest.raises(ChangeSetFormatError, match="type object"):
        encode_value(object())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"[1]", "version None"),
        (b'{"v": "2", "ops": []}', "version '2' is not supported"),
        (b'{"v": 1, "ops": [{"op": "delete", "entity": "a", "key": {}, "sv": 2}]}', "malformed"),
        (b'{"v": 2, "ops": [{"op": "delete", "entity": "a", "key": {}, "sv": 1}]}', "malformed"),
        (b'{"v": 2, "ops": [{"op": "delete", "entity": "a", "key": {}, "sv": "3"}]}', "malformed"),
        (b'{"v": 1}', "malformed"),
        (b'{"v": 1, "ops": [{"op": "upsert", "entity": "a", "key": {}}]}', "malformed"),
        (
            b'{"v": 1, "ops": [{"op": "insert", "entity": "a", "key": {"k": {"$nope": 1}}, "values": {}}]}',
            "malformed",
        ),
        (b'{"v": 1, "ops": [], "idempotency_key": 5}', "idempotency_key must be a string"),
    ],
)
def test_malformed_change_sets_are_refused_clearly(data: bytes, message: str) -> None:
    with pytest.raises(ChangeSetFormatError, match=message):
        ChangeSet.decode(data)


def _insert_of(value: bytes) -> bytes:
    """A form-1 change-set inserting account 1 with ``x`` set to the JSON text ``value``."""
    return (
        b'{"v":1,"ops":[{"op":"insert","entity":"account","key":{"account_id":1},'
        b'"values":{"account_id":1,"x":' + value + b"}}]}"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # Values no writer gives: the apply would store them, or store something else.
        (_insert_of(b"NaN"), "the constant NaN, which JSON does not have"),
        (_insert_of(b"-Infinity"), "the constant -Infinity"),
        (_insert_of(b"1e999"), "the number 1e999, which is not finite"),
        (_insert_of(b'{"$decimal":"sNaN"}'), r"malformed \$decimal value 'sNaN': not a finite number"),
        (_insert_of(b'{"$decimal":"-Infinity"}'), r"\$decimal value '-Infinity': not a finite number"),
        (_insert_of(b'{"$decimal":1.5}'), r"\$decimal value 1.5: not a string"),
        (_insert_of(b'{"$bytes":"@@@@"}'), r"malformed \$bytes value '@@@@'"),
        (_insert_of(b'{"$bytes":"AP8"}'), r"malformed \$bytes value 'AP8'"),  # padding cut off
        (b'{"v":1,"ops":[{"op":"delete","entity":{"a":1},"key":{"a":1}}]}', "entity must be a string"),
        (b'{"v":1,"ops":[{"op":"delete","entity":7,"key":{"a":1}}]}', "entity must be a string"),
        (b'{"v":1,"ops":[],"meta":[]}', "meta must be a JSON object, got list"),
        (b'{"v":1,"ops":[],"meta":""}', "meta must be a JSON object, got str"),
        (
            b'{"v":1,"ops":[{"op":"delete","entity":"account","key":{"account_id":1,"account_id":2}}]}',
            "the key 'account_id' twice",
        ),
        (b'{"v":1,"ops":[],"v":3}', "the key 'v' twice"),
    ],
)
def test_change_sets_no_writer_makes_are_refused_naming_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(ChangeSetFormatError, match=message):
        decode_members(data)


def test_what_readers_do_not_know_and_the_tags_of_every_form_still_decode() -> None:
    # Fields the form does not name are read past, as before (the design's form says nothing of them).
    [change_set] = decode_members(b'{"v":1,"ops":[],"opz":[{"op":"delete"}],"meta":{"n":[1,2]}}')
    assert (change_set.changes, change_set.meta) == ([], {"n": [1, 2]})
    row = decode_members(
        _insert_of(b'{"$decimal":"-1.10E+3"}')[:-4] + b',"y":{"$bytes":"AP8="},"z":{"$bytes":""},"f":-0.5}}]}'
    )[0].changes[0]
    assert row.values == {
        "account_id": 1,
        "x": decimal.Decimal("-1.10E+3"),
        "y": b"\x00\xff",
        "z": b"",
        "f": -0.5,
    }


class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "accounts"
    __waltz__ = WaltzEntity("account")
    account_id: Mapped[int] = mapped_column(primary_key=True)
    balance: Mapped[int] = mapped_column(default=0)


class Membership(Base):
    __tablename__ = "memberships"
    __waltz__ = WaltzEntity("membership", key=("group", "user"), partition_by=lambda key, n: len(key[0]) % n)
    group: Mapped[str] = mapped_column(String(20), primary_key=True)
    user: Mapped[str] = mapped_column(String(20), primary_key=True)


class Plain(Base):
    __tablename__ = "plain"
    plain_id: Mapped[int] = mapped_column(primary_key=True)


def test_lock_ids_and_default_partitions_are_stable() -> None:
    assert lock_id_of((42,)) == 42
    # Documented values: they must never change between releases (they are in the log's locks and
    # in every database's partition choice).
    assert lock_id_of(("ann", "g1")) == 8431161948188008971
    assert lock_id_of(("ann", "g1")) != lock_id_of(("g1", "ann"))
    registry = EntityRegistry.from_base(Base)
    account = registry.info(Account)
    assert account.key == ("account_id",)
    assert [account.partition_of((i,), 4) for i in range(8)] == [1, 3, 1, 3, 0, 2, 0, 2]
    assert {account.partition_of((i,), 4) for i in range(200)} == {0, 1, 2, 3}
    assert registry.by_name("membership").partition_of(("abc", "u"), 4) == 3
    assert account.lock((7,)).lock_hash == registry.info(Account).lock((7,)).lock_hash
    assert account.normalize_key({"account_id": 3}) == (3,)
    with pytest.raises(ValueError, match="expected 1 value"):
        account.normalize_key((1, 2))


def test_registry_errors_name_the_problem() -> None:
    registry = EntityRegistry.from_base(Base)
    assert sorted(info.name for info in registry) == ["account", "membership"]
    with pytest.raises(UnknownEntityError, match="Plain has no __waltz__"):
        registry.info(Plain)
    with pytest.raises(UnknownEntityError, match="no registered model has the entity name 'nope'"):
        registry.by_name("nope")
