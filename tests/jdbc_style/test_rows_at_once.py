"""A group's row changes of one shape as statements over arrays, on PostgreSQL with psycopg.

``ChangeSetCallbacks`` stages each row change with a statement built once per shape; with
``MIN_ROWS`` parameter sets or more, the direct path runs them in rounds that each write a row at
most once, a large enough round as one statement whose rows come from arrays (``unnest``). What
each row ends as, and which transaction fails, is what the changes one by one give: every change
runs (an over-long value is refused, never cut, also when a later change of the group writes the
row again), a missing row or a repeated delete fails the group (then applied one transaction at a
time, naming the change), and values of several Python types in one column run one by one
(docs/design/sql.md "Rows of one shape in one statement").
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, Literal

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.dialects.postgresql import CITEXT, ExcludeConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.client.transaction import Transaction
from waltz.errors import TransactionApplyError
from waltz.jdbc_style import (
    ChangeSet,
    ChangeSetApplyError,
    ChangeSetCallbacks,
    EntityRegistry,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER, Operation, RowChange
from waltz.jdbc_style.direct import direct_statements
from waltz.jdbc_style.migrations_api import upgrade
from waltz.jdbc_style.rows_at_once import MIN_ROWS, RowsShape, array_element_type, describe_rows, rows_form
from waltz.protocol.records import ReqId


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "arrays_items"
    __waltz__ = WaltzEntity("item")
    item_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    code: Mapped[str] = mapped_column(sa.String(8))
    price: Mapped[Decimal | None] = mapped_column(sa.Numeric(10, 2), nullable=True)
    seen_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True), nullable=True)
    stock: Mapped[int] = mapped_column(sa.SmallInteger)


class OneByOne(ChangeSetCallbacks):
    rows_at_once = False


T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    engine = create_framework_engine(postgres_url)
    upgrade(engine)  # the framework's tables
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    try:
        yield engine
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()


def callbacks(engine: Engine, kind: type[ChangeSetCallbacks] = ChangeSetCallbacks) -> ChangeSetCallbacks:
    name = "arrays" if kind.rows_at_once else "one-by-one"  # marks of their own
    made = kind(engine, cluster_name=name, registry=EntityRegistry.from_base(Base))
    assert made.get_client_high_water_mark(0) == -1
    return made


def group(first: int, *changes: list[RowChange]) -> list[Transaction]:
    """Change-set transactions of partition 0 from ID ``first`` on, one per list of changes."""
    return [
        Transaction(0, tid, ReqId(1, 1, 0, tid), CHANGE_SET_HEADER, None, ChangeSet(rows).encode())
        for tid, rows in enumerate(changes, start=first)
    ]


def insert(item_id: int, code: str, price: Any = None, seen_at: dt.datetime | None = None) -> RowChange:
    values = {"item_id": item_id, "code": code, "price": price, "seen_at": seen_at, "stock": 0}
    return RowChange(Operation.INSERT, "item", {"item_id": item_id}, values)


def update(
    item_id: int,
    code: str,
    price: Decimal | int | None = None,
    seen_at: dt.datetime | None = None,
    stock: int = 0,
) -> RowChange:
    """An update of the whole row: every update of this module is of one shape."""
    values = {"item_id": item_id, "code": code, "price": price, "seen_at": seen_at, "stock": stock}
    return RowChange(Operation.UPDATE, "item", {"item_id": item_id}, values)


def delete(item_id: int) -> RowChange:
    return RowChange(Operation.DELETE, "item", {"item_id": item_id}, {})


def fell_back(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether a group apply failed and was applied again one transaction at a time."""
    return any("applying them one by one" in record.getMessage() for record in caplog.records)


def items(engine: Engine) -> dict[int, tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(Item.item_id, Item.code, Item.price, Item.seen_at, Item.stock))
        return {int(row[0]): tuple(row[1:]) for row in rows}


def test_a_group_s_changes_of_one_shape_run_over_arrays_and_leave_what_one_by_one_leaves(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    changes = (
        [insert(1, "a", Decimal("1.50"), T0), insert(2, "b"), insert(3, "c", Decimal(7)), insert(4, "d")],
        [insert(5, "e"), insert(6, "f")],
        [update(1, "a2", Decimal("2.25"), None, 1), update(2, "b2", Decimal("2.255"), stock=2)],
        [update(3, "c2", None, T0), update(4, "d2", stock=4), delete(6)],
        [update(1, "a3", Decimal("3.333"), T0, 1), update(5, "e2", stock=5)],
        [insert(7, "g"), insert(8, "h"), insert(9, "i")],
        [delete(7), delete(8), delete(9), delete(5)],
    )
    arrays = callbacks(engine)
    direct = direct_statements(engine)
    before = direct.statements_over_arrays
    with caplog.at_level(logging.INFO, logger="waltz.jdbc_style.callbacks"):
        arrays.apply_transactions(group(0, *changes))
    assert not fell_back(caplog)
    assert arrays.uncaught_count == 0 and arrays.get_client_high_water_mark(0) == 6
    # over arrays: the inserts, the first update of each row (row 1's second after them, on its
    # own) and the deletes
    assert direct.statements_over_arrays - before == 3
    expected = {
        1: ("a3", Decimal("3.33"), T0, 1),
        2: ("b2", Decimal("2.26"), None, 2),  # rounded by the column, through the arrays
        3: ("c2", None, T0, 0),
        4: ("d2", None, None, 4),
    }
    assert items(engine) == expected

    # The same group one change at a time leaves the same rows.
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    one_by_one = callbacks(engine, OneByOne)
    before = direct.statements_over_arrays
    one_by_one.apply_transactions(group(0, *changes))
    assert direct.statements_over_arrays == before
    assert items(engine) == expected


def test_an_over_long_value_is_refused_not_cut(engine: Engine) -> None:
    arrays = callbacks(engine)
    arrays.apply_transactions(group(0, [insert(k, "x") for k in range(1, 6)]))
    before = direct_statements(engine).statements_over_arrays
    with pytest.raises(TransactionApplyError) as raised:
        arrays.apply_transactions(
            group(
                1, [update(k, code="12345678", stock=k) for k in range(1, 5)], [update(5, code="123456789")]
            )
        )
    assert raised.value.transaction_id == 2  # named by the one-by-one retry
    assert direct_statements(engine).statements_over_arrays > before  # the group's try went so
    codes = {k: row[0] for k, row in items(engine).items()}
    assert codes == {1: "12345678", 2: "12345678", 3: "12345678", 4: "12345678", 5: "x"}
    assert arrays.get_client_high_water_mark(0) == 1


def test_a_missing_row_among_updates_fails_the_group_and_names_the_change(engine: Engine) -> None:
    arrays = callbacks(engine)
    arrays.apply_transactions(group(0, [insert(k, "a") for k in range(1, 5)]))
    before = direct_statements(engine).statements_over_arrays
    with pytest.raises(TransactionApplyError) as raised:
        arrays.apply_transactions(
            group(1, *([update(k, code="u")] for k in range(1, 5)), [update(9, code="q")])
        )
    assert direct_statements(engine).statements_over_arrays > before  # the group's try went so
    assert raised.value.transaction_id == 5
    assert isinstance(raised.value.__cause__, ChangeSetApplyError)
    assert {k: row[0] for k, row in items(engine).items()} == {1: "u", 2: "u", 3: "u", 4: "u"}
    assert arrays.get_client_high_water_mark(0) == 4


def test_an_over_long_value_written_over_later_in_the_group_still_fails_its_transaction(
    engine: Engine,
) -> None:
    """Every change runs: a later update of the same row does not hide an earlier one's error."""
    arrays = callbacks(engine)
    arrays.apply_transactions(group(0, [insert(k, "x") for k in range(1, 6)]))
    with pytest.raises(TransactionApplyError) as raised:
        arrays.apply_transactions(
            group(
                1,
                [update(k, code="ok") for k in range(1, 6)],
                [update(1, code="123456789")],
                [update(1, "fine")],
            )
        )
    assert raised.value.transaction_id == 2
    assert {k: row[0] for k, row in items(engine).items()} == dict.fromkeys(range(1, 6), "ok")
    assert arrays.get_client_high_water_mark(0) == 1


def test_a_row_deleted_twice_in_a_group_fails_as_one_by_one(engine: Engine) -> None:
    arrays = callbacks(engine)
    arrays.apply_transactions(group(0, [insert(k, "x") for k in range(1, 7)]))
    with pytest.raises(TransactionApplyError) as raised:
        arrays.apply_transactions(group(1, [delete(k) for k in range(1, 6)], [delete(1)]))
    assert raised.value.transaction_id == 2
    assert isinstance(raised.value.__cause__, ChangeSetApplyError)
    assert set(items(engine)) == {6}
    assert arrays.get_client_high_water_mark(0) == 1


def update_sets(writes: list[tuple[Any, Any, Any]]) -> list[dict[str, Any]]:
    """Parameter sets of the update statement of :func:`update`'s shape: (key, code, price)."""
    return [
        {"k_item_id": k, "v_item_id": k, "v_code": c, "v_price": p, "v_seen_at": None, "v_stock": 0}
        for k, c, p in writes
    ]


def update_form(callbacks: ChangeSetCallbacks) -> Any:
    form = rows_form(callbacks._shaped(Item, update(1, "v"))[0])  # the statement of this shape
    assert form is not None
    return form


def test_values_of_several_types_in_one_column_run_one_by_one(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    arrays = callbacks(engine)
    arrays.apply_transactions(group(0, [insert(k, "x") for k in range(1, 6)]))
    prices = {1: 5, 2: Decimal("1.5"), 3: Decimal(2), 4: None, 5: Decimal("0.25")}
    assert update_form(arrays).arrays(update_sets([(k, "y", p) for k, p in prices.items()])) is None
    assert update_form(arrays).arrays(update_sets([(k, "y", Decimal(k)) for k in prices])) is not None
    direct = direct_statements(engine)
    before = direct.statements_over_arrays
    with caplog.at_level(logging.INFO, logger="waltz.jdbc_style"):
        arrays.apply_transactions(
            group(1, [update(k, code="y", price=p, stock=0) for k, p in prices.items()])
        )
    assert direct.statements_over_arrays == before  # an int and Decimals: not one array
    assert not fell_back(caplog) and not any("again alone" in r.getMessage() for r in caplog.records)
    assert {k: row[1] for k, row in items(engine).items()} == {
        1: Decimal("5.00"),
        2: Decimal("1.50"),
        3: Decimal("2.00"),
        4: None,
        5: Decimal("0.25"),
    }
    assert arrays.uncaught_count == 0


def test_fewer_row_changes_than_the_threshold_run_one_by_one(engine: Engine) -> None:
    arrays = callbacks(engine)
    direct = direct_statements(engine)
    before = direct.statements_over_arrays
    arrays.apply_transactions(group(0, [insert(k, "x") for k in range(1, MIN_ROWS)]))
    assert direct.statements_over_arrays == before
    arrays.apply_transactions(group(1, [insert(k, "x") for k in range(MIN_ROWS, 2 * MIN_ROWS)]))
    assert direct.statements_over_arrays == before + 1
    assert set(items(engine)) == set(range(1, 2 * MIN_ROWS))


class Shouting(sa.types.TypeDecorator[str]):
    impl = sa.String(8)
    cache_ok = True


@pytest.mark.parametrize(
    ("column_type", "element"),
    [
        (sa.String(8), sa.Text),
        (sa.Unicode(20), sa.Text),
        (sa.CHAR(2), None),
        (sa.String(8, collation="C"), None),
        (sa.Numeric(10, 2), sa.Numeric),
        (sa.BigInteger(), sa.BigInteger),
        (sa.Integer(), sa.Integer),
        (sa.Boolean(), None),
        (CITEXT(), None),
        (sa.DateTime(timezone=True), sa.DateTime),
        (sa.Enum("a", "b", name="ab"), None),
        (sa.Float(), None),
        (sa.JSON(), None),
        (Shouting(), None),
    ],
)
def test_arrays_are_cast_to_the_column_s_type_without_its_length_or_precision(
    column_type: sa.types.TypeEngine[Any], element: type | None
) -> None:
    got = array_element_type(column_type)
    if element is None:
        assert got is None
    else:
        assert type(got) is element
        assert getattr(got, "length", None) is None and getattr(got, "precision", None) is None
        assert getattr(got, "timezone", None) == getattr(column_type, "timezone", None)


def test_writes_of_one_row_go_in_rounds_in_their_order(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    arrays = callbacks(engine)
    arrays.apply_transactions(group(0, [insert(k, "x") for k in range(1, 6)]))
    statement = arrays._shaped(Item, update(1, "v"))[0]  # the statement built for this shape
    form = rows_form(statement)
    assert form is not None
    writes = [(1, "v1"), (2, "w1"), (1, "v2"), (3, "c"), (1, "v3"), (2, "w2"), (4, "d"), (5, "e")]
    sets = [
        {"k_item_id": k, "v_item_id": k, "v_code": c, "v_price": None, "v_seen_at": None, "v_stock": 0}
        for k, c in writes
    ]
    rounds = form.rounds(sets)
    assert rounds is not None
    assert [[(p["k_item_id"], p["v_code"]) for p in r] for r in rounds] == [
        [(1, "v1"), (2, "w1"), (3, "c"), (4, "d"), (5, "e")],
        [(1, "v2"), (2, "w2")],
        [(1, "v3")],
    ]
    direct = direct_statements(engine)
    before = direct.statements_over_arrays
    with caplog.at_level(logging.INFO, logger="waltz.jdbc_style.callbacks"):
        arrays.apply_transactions(group(1, *([update(k, c)] for k, c in writes)))
    assert not fell_back(caplog)
    assert direct.statements_over_arrays == before + 1  # the first round; the others one by one
    assert {k: row[0] for k, row in items(engine).items()} == {1: "v3", 2: "w2", 3: "c", 4: "d", 5: "e"}
    assert arrays.get_client_high_water_mark(0) == len(writes)


class Tag(Base):
    """A unique column besides the key: its updates and inserts go one by one."""

    __tablename__ = "arrays_tags"
    __waltz__ = WaltzEntity("tag")
    tag_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    label: Mapped[str] = mapped_column(sa.String(8), unique=True)


class Node(Base):
    """A reference to its own table: its writes go one by one."""

    __tablename__ = "arrays_nodes"
    __waltz__ = WaltzEntity("node")
    node_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    parent_id: Mapped[int | None] = mapped_column(sa.ForeignKey("arrays_nodes.node_id"), nullable=True)


class Declared(DeclarativeBase):
    """Models only declared (their tables are never created)."""


class Slot(Declared):
    """A unique constraint, a unique index and an exclusion constraint, each besides the key."""

    __tablename__ = "arrays_slots"
    __waltz__ = WaltzEntity("slot")
    __table_args__ = (
        sa.UniqueConstraint("room", "day"),
        sa.Index("arrays_slots_code", "code", unique=True),
        ExcludeConstraint(("room", "=")),
    )
    slot_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    room: Mapped[int] = mapped_column(sa.Integer)
    day: Mapped[int] = mapped_column(sa.Integer)
    code: Mapped[str] = mapped_column(sa.String(8))


class Booking(Declared):
    """Only an exclusion constraint besides the key."""

    __tablename__ = "arrays_bookings"
    __waltz__ = WaltzEntity("booking")
    __table_args__ = (ExcludeConstraint(("room", "=")),)
    booking_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    room: Mapped[int] = mapped_column(sa.Integer)


@pytest.mark.parametrize(
    ("model", "operation", "over_arrays"),
    [
        (Slot, "update", False),
        (Slot, "delete", True),
        (Booking, "insert", False),
        (Tag, "update", False),
        (Tag, "insert", False),
        (Tag, "delete", True),
        (Node, "update", False),
        (Node, "delete", False),
        (Item, "update", True),
    ],
)
def test_constraints_checked_per_statement_keep_a_model_s_writes_one_by_one(
    model: type[Any], operation: Literal["insert", "update", "delete"], over_arrays: bool
) -> None:
    key = sa.inspect(model).primary_key[0].key
    others = tuple(sorted(c.key for c in sa.inspect(model).columns if c.key != key))
    keys = () if operation == "insert" else (key,)
    values = () if operation == "delete" else (key, *others)
    statement = sa.delete(model.__table__)  # any statement object: only its description counts
    describe_rows(statement, RowsShape(model, Operation(operation), keys, values))
    assert (rows_form(statement) is not None) is over_arrays
