"""An entity insert carries every value a rebuild needs (docs/design/spark.md, "Computing views").

The database fills a column's server default or callable default itself, and the log would not
say with what: an insert that leaves such an attribute out would be applied live and refused by
every rebuild for the life of the log. It is refused when it is made instead, saying what to do;
a scalar default is filled into the change-set, so the log carries it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import DateTime, String, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import (
    ChangeSetCallbacks,
    EntityRegistry,
    EntityTransaction,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.migrations_api import upgrade


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "insert_items"
    __waltz__ = WaltzEntity("insert_item")
    item_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    warehouse: Mapped[str] = mapped_column(String(20), server_default="main")
    colour: Mapped[str] = mapped_column(String(20), default="red", server_default="red")
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=func.now())


@pytest.fixture
def callbacks(tmp_path: Path) -> Iterator[ChangeSetCallbacks]:
    engine = create_framework_engine(f"sqlite:///{tmp_path / 'items.db'}")
    upgrade(engine)
    Base.metadata.create_all(engine)
    try:
        yield ChangeSetCallbacks(engine, cluster_name="inserts", registry=EntityRegistry([Item]))
    finally:
        engine.dispose()


def _transaction(callbacks: ChangeSetCallbacks) -> EntityTransaction:
    info = callbacks.registry.info(Item)
    with callbacks.snapshot(0, entities=[(info, (1,))]) as snapshot:
        return EntityTransaction(callbacks, snapshot, 1)


def test_an_insert_leaving_out_a_server_or_callable_default_is_refused(callbacks: ChangeSetCallbacks) -> None:
    tx = _transaction(callbacks)
    with pytest.raises(ValueError, match=r"leaves out \['warehouse', 'created'\].*scalar default="):
        tx.insert(Item, item_id=1)
    assert tx.change_set().changes == []


def test_an_insert_giving_them_carries_every_value(callbacks: ChangeSetCallbacks) -> None:
    tx = _transaction(callbacks)
    created = dt.datetime(2026, 1, 2, 3, 4, 5)
    tx.insert(Item, item_id=1, warehouse="north", created=created)
    (change,) = tx.change_set().changes
    # The scalar default is filled in: the log says "red", whatever the server would have said.
    assert change.values == {"item_id": 1, "warehouse": "north", "colour": "red", "created": created}
