"""The rebuild's check of one transaction (``waltz rebuild --check``, docs/sql.md "Adding and
retiring an entity"), without Spark: a retired entity's row changes are counted and raise no
problem, and the entity is no model the live apply would wait on."""

from __future__ import annotations

from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import ChangeSet, EntityRegistry, Operation, RowChange, WaltzEntity
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER
from waltz.spark.decoders import DecoderRegistry
from waltz.spark.schema_check import Shape, _check_one


class Base(DeclarativeBase):
    pass


class Book(Base):
    __tablename__ = "books"
    __waltz__ = WaltzEntity("book")
    book_id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str]


def _shapes(registry: EntityRegistry) -> dict[str, Shape]:
    return {
        info.spec.lock_name: (
            tuple(info.key),
            tuple(info.primary_key),
            tuple(info.attributes),
            info.model.__name__,
            info.defaulted,
        )
        for info in registry
    }


def test_a_retired_entity_is_counted_and_passes_the_check() -> None:
    data = ChangeSet(
        [
            RowChange(Operation.INSERT, "reservation", {"reservation_id": 1}, {"reservation_id": 1}),
            RowChange(Operation.INSERT, "book", {"book_id": 1}, {"book_id": 1, "title": "Emma"}),
        ]
    ).encode()
    retiring = EntityRegistry([Book], retired=["reservation"])
    rows = _check_one(DecoderRegistry(), retiring.schema_chains(), _shapes(retiring), CHANGE_SET_HEADER, data)
    assert sorted(rows, key=str) == [("book", 1, None), ("reservation", 1, None)]
    # Undeclared and not retired: counted too (the views may take it), with no problem either.
    plain = EntityRegistry([Book])
    rows = _check_one(DecoderRegistry(), plain.schema_chains(), _shapes(plain), CHANGE_SET_HEADER, data)
    assert sorted(rows, key=str) == [("book", 1, None), ("reservation", 1, None)]
