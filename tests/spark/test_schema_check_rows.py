"""The rebuild's check of one transaction (``waltz rebuild --check``, docs/design/sql.md "Retiring
an entity"), without Spark: a retired entity's row changes are counted and raise no
problem, and the entity is no model the live apply would wait on."""

from __future__ import annotations

from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import ChangeSet, EntityRegistry, Operation, RowChange, WaltzEntity
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER
from waltz.spark.decoders import DecoderRegistry
from waltz.spark.schema_check import _check_one
from waltz.spark.views import change_check


class Base(DeclarativeBase):
    pass


class Book(Base):
    __tablename__ = "books"
    __waltz__ = WaltzEntity("book")
    book_id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str]


def test_a_retired_entity_is_counted_and_passes_the_check() -> None:
    data = ChangeSet(
        [
            RowChange(Operation.INSERT, "reservation", {"reservation_id": 1}, {"reservation_id": 1}),
            RowChange(Operation.INSERT, "book", {"book_id": 1}, {"book_id": 1, "title": "Emma"}),
        ]
    ).encode()
    retiring = EntityRegistry([Book], retired=["reservation"])
    rows = _check_one(
        DecoderRegistry(), retiring.schema_chains(), change_check(retiring), CHANGE_SET_HEADER, data
    )
    assert sorted(rows, key=str) == [("book", 1, None), ("reservation", 1, None)]
    # Undeclared and not retired: counted too (the views may take it), with no problem either.
    plain = EntityRegistry([Book])
    rows = _check_one(DecoderRegistry(), plain.schema_chains(), change_check(plain), CHANGE_SET_HEADER, data)
    assert sorted(rows, key=str) == [("book", 1, None), ("reservation", 1, None)]


def test_a_record_of_a_newer_release_is_named_for_a_rebuild_not_for_a_live_instance() -> None:
    """A live instance waits for its upgrade; a rebuild or its check must be run with the newer
    release's code, and says so (from the check's row, and from a Spark task's failure text)."""
    from waltz.cli.rebuild import _newer_release, task_error_line

    data = ChangeSet(
        [RowChange(Operation.INSERT, "book", {"book_id": 1}, {"book_id": 1, "title": "Emma"}, 9)]
    ).encode()
    registry = EntityRegistry([Book])
    ((entity, version, problem),) = _check_one(
        DecoderRegistry(), registry.schema_chains(), change_check(registry), CHANGE_SET_HEADER, data
    )
    assert (entity, version) == ("book", 9)
    assert problem is not None and "newer than the models here (version 1)" in problem
    assert "run the rebuild with that release's code" in problem and "this instance" not in problem
    failure = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "decoders.py", line 183, in decode\n'
        "waltz.jdbc_style.upcasting.SchemaVersionAheadError: book row change of schema version 9, but "
        "this instance's model of book is version 1: the partition waits until this instance runs the "
        "newer model (a rolling deploy under way; nothing is applied or skipped meanwhile)\n"
        "\tat org.apache.spark.api.python.BasePythonRunner..."
    )
    found = task_error_line(failure, "SchemaVersionAheadError")
    assert found is not None and found.startswith("book row change of schema version 9")
    said = _newer_release(found)
    assert "book row change of schema version 9, newer than the models here (version 1)" in said
    assert "this instance" not in said
    assert task_error_line("no such error here", "SchemaVersionAheadError") is None


def test_a_transaction_of_waltz_client_validate_holds_no_row_change_for_a_rebuild() -> None:
    """``waltz client validate`` writes an empty change-set carrying its number in ``meta``: the
    rebuild decodes it as no row change, and its check finds nothing to refuse."""
    from waltz.admin.client_tools import validation_data

    registry = EntityRegistry([Book])
    data = validation_data(7)
    (member,) = DecoderRegistry().decode_members(CHANGE_SET_HEADER, data)
    assert member.changes == [] and member.meta == {"waltz_validate": 7}
    assert (
        _check_one(
            DecoderRegistry(), registry.schema_chains(), change_check(registry), CHANGE_SET_HEADER, data
        )
        == []
    )
