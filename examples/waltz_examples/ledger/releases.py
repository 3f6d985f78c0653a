"""The ledger's releases: the ``Account`` model of each, and the database revision it runs on.

A log outlives the code that wrote it, and a service's instances change code one at a time
(docs/sql.md, "Changing a model"). The ledger's ``Account`` changed twice, and the demo starts
on release 1 and rolls forward while transfers keep committing:

| release | ``Account`` | schema version | database revision | it goes out |
| --- | --- | --- | --- | --- |
| 1 | custid, name, status | 1 | ``ledger_0001`` | |
| 2 | + currency (``USD``) | 2 | ``ledger_0002`` adds the column | migrated, then one by one |
| 3 | name renamed holder, on the column ``name`` | 3 | ``ledger_0002`` | one by one |
| 4 | holder on its column (``models.Account``) | 3 | ``ledger_0004`` (0003 renames it) | all stop |

Release 3 renames what the log carries and keeps the column, so that it runs beside release 2 on
one database; release 4 renames the column, which no instance of release 3 could use any more,
so the instances stop for it (the demo does it once the mix is over). The log holds no trace of
release 4: schema version 3 is the same in both. Release 4 also records each member of a batched
log transaction in ``ledger_applied_transactions`` (its column ``member``, which ``ledger_0004``
adds): only its instances may batch (``LedgerRelease.records_members``); the earlier releases'
tables have no such column, and their instances record one row per transaction.

The operations are today's (``operations.py``); they take the ``Account`` model from their
instance's callbacks (:func:`~waltz_examples.ledger.models.account_model`) and the holder's
attribute from ``Account.holder_attribute``, so the demo drives every release with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sqlalchemy import BigInteger, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import AddAttribute, RenameAttribute, WaltzEntity
from waltz_examples.ledger.models import ACCOUNT, Account, AccountStatus, by_customer

__all__ = ["CURRENT", "RELEASES", "AccountV1", "AccountV2", "AccountV3", "LedgerRelease", "release"]


class _Release1(DeclarativeBase):
    pass


class AccountV1(_Release1):
    """Release 1's ``Account`` (schema version 1)."""

    __tablename__ = "ledger_accounts"
    __waltz__ = WaltzEntity(ACCOUNT, partition_by=by_customer)
    holder_attribute: ClassVar[str] = "name"

    custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(8), default=AccountStatus.OPEN.value)


class _Release2(DeclarativeBase):
    pass


class AccountV2(_Release2):
    """Release 2's ``Account`` (schema version 2): a new column with a default."""

    __tablename__ = "ledger_accounts"
    __waltz__ = WaltzEntity(
        ACCOUNT, partition_by=by_customer, schema_version=2, upcasters=(AddAttribute(1, "currency", "USD"),)
    )
    holder_attribute: ClassVar[str] = "name"

    custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(8), default=AccountStatus.OPEN.value)
    currency: Mapped[str] = mapped_column(String(3), default="USD", server_default="USD")


class _Release3(DeclarativeBase):
    pass


class AccountV3(_Release3):
    """Release 3's ``Account`` (schema version 3): ``name`` renamed ``holder``, kept on its column."""

    __tablename__ = "ledger_accounts"
    __waltz__ = WaltzEntity(
        ACCOUNT,
        partition_by=by_customer,
        schema_version=3,
        upcasters=(AddAttribute(1, "currency", "USD"), RenameAttribute(2, "name", "holder")),
    )
    holder_attribute: ClassVar[str] = "holder"

    custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    holder: Mapped[str] = mapped_column("name", String(64))  # the column keeps its name until release 4
    status: Mapped[str] = mapped_column(String(8), default=AccountStatus.OPEN.value)
    currency: Mapped[str] = mapped_column(String(3), default="USD", server_default="USD")


@dataclass(frozen=True, slots=True)
class LedgerRelease:
    """One release of the ledger.

    Attributes:
        number: 1, 2, ...
        account: its ``Account`` model.
        revision: the ledger's alembic revision it runs on (``migrations/versions``).
        change: what it changes, one line ("" for the first).
        rolls: True when its instances replace the previous release's one by one (its
            migration, if any, runs first and leaves the previous release working); False when
            every instance stops for its migration.
        records_members: its ``ledger_applied_transactions`` has the column ``member``, which
            its callbacks fill (a batch's members; docs/design/sql.md "Batched change-sets").
    """

    number: int
    account: type[Any]
    revision: str
    change: str = ""
    rolls: bool = True
    records_members: bool = False


#: Every release, oldest first.
RELEASES: tuple[LedgerRelease, ...] = (
    LedgerRelease(1, AccountV1, "ledger_0001"),
    LedgerRelease(2, AccountV2, "ledger_0002", "Account gets currency (schema version 2)"),
    LedgerRelease(3, AccountV3, "ledger_0002", "Account's name becomes holder (schema version 3)"),
    LedgerRelease(
        4,
        Account,
        "ledger_0004",
        "the column name becomes holder; a batch's members are recorded",
        rolls=False,
        records_members=True,
    ),
)

#: The release of this code (``models.Account``).
CURRENT = RELEASES[-1]


def release(number: int) -> LedgerRelease:
    """The release of a number.

    Raises:
        ValueError: no such release.
    """
    for candidate in RELEASES:
        if candidate.number == number:
            return candidate
    raise ValueError(f"the ledger has no release {number} (releases 1 to {CURRENT.number})")
