"""Schema versions and upcasters (docs/design/sql.md "Schema versions and upcasting"), no database.

The chains themselves: each upcaster kind, the declaration checks, the errors that make a partition
wait (a newer schema version or form than the code knows), and the change-set forms read back.
"""

from __future__ import annotations

import dataclasses
import decimal
import pickle
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.errors import ApplyPausedError
from waltz.jdbc_style import (
    AddAttribute,
    ChangeSet,
    ChangeSetFormatError,
    DropAttribute,
    EntityRegistry,
    Operation,
    RenameAttribute,
    RowChange,
    RowUpcaster,
    ScaleAttribute,
    SchemaVersionAheadError,
    UnknownEntityError,
    UpcastError,
    WaltzEntity,
    upcaster,
)
from waltz.jdbc_style.changeset import ChangeSetVersionError
from waltz.jdbc_style.upcasting import SchemaChain, SchemaChains, SchemaDeclarationError


def insert(values: dict[str, object], version: int = 1, entity: str = "widget") -> RowChange:
    return RowChange(Operation.INSERT, entity, {"widget_id": values["widget_id"]}, values, version)


@upcaster(from_version=1, description="split name into first and last")
def split_name(change: RowChange) -> RowChange:
    values = dict(change.values)
    if "name" in values:
        first, _, last = str(values.pop("name")).partition(" ")
        values["first_name"], values["last_name"] = first, last
    return dataclasses.replace(change, values=values)


def test_add_fills_inserts_and_updates_and_keeps_a_given_value() -> None:
    add = AddAttribute(1, "label", "none")
    assert add.upcast(insert({"widget_id": 1, "n": 2})).values == {"widget_id": 1, "n": 2, "label": "none"}
    kept = insert({"widget_id": 1, "label": "mine"})
    assert add.upcast(kept) == kept
    delete = RowChange(Operation.DELETE, "widget", {"widget_id": 1})
    assert add.upcast(delete) == delete


def test_rename_renames_key_and_values() -> None:
    renamed = RenameAttribute(1, "widget_id", "id").upcast(insert({"widget_id": 4, "n": 1}))
    assert renamed.key == {"id": 4}
    assert renamed.values == {"id": 4, "n": 1}
    delete = RenameAttribute(1, "widget_id", "id").upcast(
        RowChange(Operation.DELETE, "widget", {"widget_id": 4})
    )
    assert delete.key == {"id": 4}
    assert delete.values == {}


def test_drop_removes_and_refuses_a_key_attribute() -> None:
    assert DropAttribute(1, "old").upcast(insert({"widget_id": 1, "old": 3})).values == {"widget_id": 1}
    with pytest.raises(UpcastError, match="key attribute"):
        DropAttribute(1, "widget_id").upcast(insert({"widget_id": 1}))


@pytest.mark.parametrize(
    ("value", "factor", "expected"),
    [
        (125, 10, 1250),
        (125, decimal.Decimal("0.01"), decimal.Decimal("1.25")),
        (300, Fraction(1, 100), 3),
        (decimal.Decimal("1.5"), 100, decimal.Decimal("150.0")),
        (decimal.Decimal("1.5"), Fraction(1, 2), decimal.Decimal("0.75")),
        (2.5, 4, 10.0),
        (None, 10, None),
    ],
)
def test_scale_is_exact(value: object, factor: int | decimal.Decimal | Fraction, expected: object) -> None:
    scaled = ScaleAttribute(1, "amount", factor).upcast(insert({"widget_id": 1, "amount": value}))
    assert scaled.values["amount"] == expected
    assert type(scaled.values["amount"]) is type(expected)


def test_scale_refuses_what_it_cannot_hold_exactly() -> None:
    with pytest.raises(UpcastError, match="integer cannot hold"):
        ScaleAttribute(1, "amount", Fraction(1, 3)).upcast(insert({"widget_id": 1, "amount": 10}))
    with pytest.raises(UpcastError, match="not a number"):
        ScaleAttribute(1, "amount", 2).upcast(insert({"widget_id": 1, "amount": "ten"}))
    with pytest.raises(SchemaDeclarationError, match="must be an int, Decimal or Fraction"):
        ScaleAttribute(1, "amount", 0.01)  # type: ignore[arg-type]


def test_a_chain_runs_every_step_from_the_written_version() -> None:
    chain = SchemaChain(
        "widget",
        4,
        [
            AddAttribute(1, "label", ""),
            split_name,
            RenameAttribute(2, "n", "count"),
            ScaleAttribute(3, "count", 10),
        ],
    )
    old = insert({"widget_id": 1, "name": "Ada Lovelace", "n": 2})
    current = chain.upcast(old)
    assert current.schema_version == 4
    assert current.values == {
        "widget_id": 1,
        "label": "",
        "first_name": "Ada",
        "last_name": "Lovelace",
        "count": 20,
    }
    # A change of version 3 gets only the last step.
    assert chain.upcast(insert({"widget_id": 1, "count": 2}, 3)).values == {"widget_id": 1, "count": 20}
    same = insert({"widget_id": 1, "count": 2}, 4)
    assert chain.upcast(same) is same
    assert chain.describe() == [
        "1 -> 2: add label = ''; split name into first and last",
        "2 -> 3: rename n to count",
        "3 -> 4: scale count by 10",
    ]


def test_a_change_newer_than_the_model_waits_for_an_upgrade() -> None:
    chain = SchemaChain("widget", 2, [AddAttribute(1, "label", "")])
    with pytest.raises(SchemaVersionAheadError, match="widget row change of schema version 3") as raised:
        chain.upcast(insert({"widget_id": 1}, 3))
    assert isinstance(raised.value, ApplyPausedError)
    assert (raised.value.entity, raised.value.version, raised.value.known) == ("widget", 3, 2)
    # An entity still at version 1 has an empty chain: a version-2 change is ahead of it too.
    with pytest.raises(SchemaVersionAheadError):
        SchemaChains([SchemaChain("widget", 1)]).upcast(ChangeSet([insert({"widget_id": 1}, 2)]))


def test_an_upcaster_that_fails_or_changes_the_operation_is_named() -> None:
    def boom(change: RowChange) -> RowChange:
        raise KeyError("first_name")

    # Each says what to do: the change waits for a fixed upcaster, never applied half-read or skipped.
    remedy = r"fix the upcaster and run the fixed code \(nothing of this change is applied or skipped"
    with pytest.raises(
        UpcastError, match=rf"the upcaster 'boom' from version 1 failed: KeyError.*; {remedy}"
    ):
        SchemaChain("widget", 2, [RowUpcaster(1, boom, "boom")]).upcast(insert({"widget_id": 1}))

    def to_delete(change: RowChange) -> RowChange:
        return dataclasses.replace(change, operation=Operation.DELETE)

    with pytest.raises(UpcastError, match=rf"not a insert of widget; {remedy}"):
        SchemaChain("widget", 2, [RowUpcaster(1, to_delete)]).upcast(insert({"widget_id": 1}))


@pytest.mark.parametrize(
    ("version", "upcasters", "message"),
    [
        (2, [], r"no upcaster reads version\(s\) 1"),
        (3, [AddAttribute(1, "a")], r"no upcaster reads version\(s\) 2"),
        (2, [AddAttribute(2, "a")], "reads version 2, but the model is version 2"),
        (2, [AddAttribute(0, "a"), AddAttribute(1, "b")], "reads version 0"),
        (0, [], "must be an integer of at least 1"),
        (2, ["add a"], "is not an upcaster"),
    ],
)
def test_a_declaration_that_is_no_chain_is_refused(
    version: int, upcasters: list[object], message: str
) -> None:
    with pytest.raises(SchemaDeclarationError, match=message):
        SchemaChain("widget", version, upcasters)  # type: ignore[arg-type]


class Base(DeclarativeBase):
    pass


class Widget(Base):
    __tablename__ = "widgets"
    __waltz__ = WaltzEntity(
        "widget", key="widget_id", schema_version=2, upcasters=[AddAttribute(1, "label", "-")]
    )
    widget_id: Mapped[int] = mapped_column(primary_key=True)
    label: Mapped[str]


class Gadget(Base):
    __tablename__ = "gadgets"
    __waltz__ = WaltzEntity("gadget")
    gadget_id: Mapped[int] = mapped_column(primary_key=True)


def test_the_registry_gives_picklable_chains_of_every_model() -> None:
    registry = EntityRegistry([Widget, Gadget])
    assert registry.info(Widget).schema_version == 2
    assert registry.info(Widget).key == ("widget_id",)
    chains = registry.schema_chains()
    assert chains.upcasts
    assert (chains.version_of("widget"), chains.version_of("gadget"), chains.version_of("nope")) == (
        2,
        1,
        None,
    )
    shipped = pickle.loads(pickle.dumps(chains))  # Spark ships them to its executors
    old = ChangeSet([insert({"widget_id": 1}), RowChange(Operation.DELETE, "gadget", {"gadget_id": 1})])
    assert shipped.upcast(old).changes[0].values == {"widget_id": 1, "label": "-"}
    # A change of an entity the application lacks is left for the apply to refuse.
    unknown = ChangeSet([insert({"widget_id": 1}, 5, entity="elsewhere")])
    assert shipped.upcast(unknown) is unknown


def test_a_retired_entity_s_changes_are_passed_over_by_every_reader() -> None:
    """docs/design/sql.md "Retiring an entity": the chains every reader decodes with drop the row
    changes of a retired entity, shipped to Spark's executors too; a model cannot take its name."""
    registry = EntityRegistry([Widget], retired=["gadget"])
    assert registry.retired == frozenset({"gadget"})
    chains = pickle.loads(pickle.dumps(registry.schema_chains()))
    written = ChangeSet(
        [
            RowChange(Operation.DELETE, "gadget", {"gadget_id": 1}),
            insert({"widget_id": 1}),
            RowChange(Operation.INSERT, "gadget", {"gadget_id": 2}, {"gadget_id": 2}),
        ],
        idempotency_key="request-7",
    )
    read = chains.upcast(written)
    assert [c.entity for c in read.changes] == ["widget"] and read.idempotency_key == "request-7"
    assert read.changes[0].values == {"widget_id": 1, "label": "-"}
    only_retired = chains.upcast(
        ChangeSet([RowChange(Operation.INSERT, "gadget", {"gadget_id": 3}, {"gadget_id": 3})])
    )
    assert only_retired.changes == ()
    with pytest.raises(UnknownEntityError, match="'gadget', which this registry retires"):
        EntityRegistry([Widget, Gadget], retired=["gadget"])
    assert EntityRegistry.from_base(Base, retired=["old"]).retired == frozenset({"old"})


def test_a_change_set_of_current_changes_is_not_copied() -> None:
    chains = EntityRegistry([Widget, Gadget]).schema_chains()
    current = ChangeSet([insert({"widget_id": 1, "label": "x"}, 2)])
    assert chains.upcast(current) is current


def test_a_newer_form_waits_for_an_upgrade_and_an_unknown_one_is_refused() -> None:
    with pytest.raises(ChangeSetVersionError, match="form 4 is newer than this waltz-py reads") as raised:
        ChangeSet.decode(b'{"v": 4, "ops": []}')
    assert isinstance(raised.value, ApplyPausedError)
    with pytest.raises(ChangeSetFormatError) as refused:
        ChangeSet.decode(b'{"v": 0, "ops": []}')
    assert not isinstance(refused.value, ApplyPausedError)


def _written(n: int, label: str, version: int) -> RowChange:
    values: dict[str, object] = {"widget_id": n} if version == 1 else {"widget_id": n, "label": label}
    return insert(values, version)


@given(
    st.lists(st.builds(_written, st.integers(0, 1000), st.text(max_size=5), st.integers(1, 2)), max_size=6)
)
def test_upcasting_after_a_round_trip_gives_current_changes(rows: list[RowChange]) -> None:
    """Whatever the mix of versions written, a reader sees version 2 only: a change written at
    version 1 gets the added label, one written at version 2 keeps its own."""
    chains = EntityRegistry([Widget]).schema_chains()
    read = chains.upcast(ChangeSet.decode(ChangeSet(rows).encode()))
    assert [change.schema_version for change in read.changes] == [2] * len(rows)
    for written, current in zip(rows, read.changes, strict=True):
        expected = "-" if written.schema_version == 1 else written.values["label"]
        assert current.values == {"widget_id": written.values["widget_id"], "label": expected}


def test_names_at_undoes_the_renames_back_to_a_version() -> None:
    """The key attributes an older snapshot's rows were stored under, from the current ones."""
    chain = SchemaChain(
        "e",
        4,
        [
            RenameAttribute(1, "a", "b"),  # 1 -> 2
            AddAttribute(2, "x", 0),  # 2 -> 3
            RenameAttribute(3, "c", "a"),  # 3 -> 4: a new "a", from "c"
            RenameAttribute(3, "b", "d"),
        ],
    )
    assert chain.names_at(4, ["a", "d", "x"]) == ("a", "d", "x")
    assert chain.names_at(3, ["a", "d", "x"]) == ("c", "b", "x")
    assert chain.names_at(2, ["a", "d", "x"]) == ("c", "b", "x")
    assert chain.names_at(1, ["a", "d", "x"]) == ("c", "a", "x")
    with pytest.raises(SchemaVersionAheadError):
        chain.names_at(5, ["a"])
    with pytest.raises(ValueError, match="below 1"):
        chain.names_at(0, ["a"])


def test_a_change_of_a_version_below_1_is_refused() -> None:
    chain = SchemaChain("e", 2, [AddAttribute(1, "x", 0)])
    with pytest.raises(UpcastError, match="below 1"):
        chain.upcast(RowChange(Operation.INSERT, "e", {"id": 1}, {"id": 1}, 0))


def test_stored_rows_upcast_as_the_log_s_changes_and_must_give_the_model() -> None:
    import uuid

    from waltz.jdbc_style.upcasting import StoredRows

    seen: list[tuple[type, ...]] = []

    def typed(change: RowChange) -> RowChange:
        seen.append((type(change.values["token"]), type(change.values["blob"])))
        return dataclasses.replace(change, values={**change.values, "n": change.key["k"] * 2})

    chain = SchemaChain("e", 2, [RowUpcaster(1, typed)])
    rows = StoredRows(
        chain,
        1,
        (("k", "k_col"), ("token", "token_col"), ("blob", "blob_col")),
        ("k",),
        ("k", "token", "blob", "n"),
        uuids=("token_col",),
    )
    token = uuid.uuid4()
    got = rows.upcast({"k_col": 3, "token_col": str(token), "blob_col": bytearray(b"ab")})
    assert got == {"k": 3, "token": token, "blob": b"ab", "n": 6}
    assert seen == [(uuid.UUID, bytes)]
    lacking = dataclasses.replace(rows, current=("k", "token", "blob", "n", "m"))
    with pytest.raises(UpcastError, match=r"lacks the model's attributes \['m'\]: the upcasters"):
        lacking.upcast({"k_col": 3, "token_col": str(token), "blob_col": b""})
    with pytest.raises(UpcastError, match="not a UUID"):
        rows.upcast({"k_col": 3, "token_col": "nope", "blob_col": b""})


def test_stored_rows_give_a_decimal_kept_as_text_as_the_log_s_decimal() -> None:
    """A snapshot keeps a decimal column of no Parquet decimal's precision as its exact text: the
    upcasters get it as the log's changes give it, a ``decimal.Decimal`` of every digit."""
    from waltz.jdbc_style.upcasting import StoredRows

    seen: list[object] = []

    def typed(change: RowChange) -> RowChange:
        seen.append(change.values["rate"])
        return change

    chain = SchemaChain("e", 2, [RowUpcaster(1, typed)])
    rows = StoredRows(chain, 1, (("k", "k"), ("rate", "rate")), ("k",), ("k", "rate"), decimals=("rate",))
    exact = "0.123456789012345678901234567890"
    assert rows.upcast({"k": 1, "rate": exact}) == {"k": 1, "rate": decimal.Decimal(exact)}
    assert seen == [decimal.Decimal(exact)] and isinstance(seen[0], decimal.Decimal)
    assert rows.upcast({"k": 2, "rate": None}) == {"k": 2, "rate": None}
    with pytest.raises(UpcastError, match="stored in a decimal column is not a number"):
        rows.upcast({"k": 3, "rate": "x"})
