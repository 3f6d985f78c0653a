"""Staged writes (``ApplySession.stage``) on SQLite, PostgreSQL and MariaDB, without a cluster.

A group's staged writes run as one ``executemany`` per statement when ``apply`` returns (or
before the session's next statement), in the group's database transaction with the mark; a row
count that differs from the staged one fails the group, which is then applied one transaction at
a time and names the transaction (docs/design/sql.md "Group apply").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, bindparam, event
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from waltz.client.transaction import Transaction
from waltz.errors import ApplyContractError, StagedRowCountError, TransactionApplyError
from waltz.jdbc_style import (
    AbstractClientCallbacksForSQL,
    ApplySession,
    ChangeSet,
    ChangeSetApplyError,
    ChangeSetCallbacks,
    EntityRegistry,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER, Operation, RowChange
from waltz.jdbc_style.direct import LeadMissedError, direct_statements
from waltz.protocol.records import ReqId

metadata = sa.MetaData()
accounts = sa.Table(
    "staged_accounts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("balance", sa.Integer, nullable=False),
)
history = sa.Table(
    "staged_history",
    metadata,
    sa.Column("transaction_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("account", sa.Integer, nullable=False),
    sa.Column("balance_seen", sa.Integer),
)
DEPOSIT = (
    sa.update(accounts)
    .where(accounts.c.id == bindparam("k"))
    .values(balance=accounts.c.balance + bindparam("amount"))
)
RECORD = sa.insert(history)


@pytest.fixture
def engine(app_db_url: str) -> Iterator[Engine]:
    """The application database (SQLite, PostgreSQL, MariaDB) with three accounts."""
    engine = create_framework_engine(app_db_url)
    metadata.drop_all(engine)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(accounts), [{"id": k, "balance": 0} for k in (1, 2, 3)])
    try:
        yield engine
    finally:
        metadata.drop_all(engine)
        engine.dispose()


class Deposits(AbstractClientCallbacksForSQL):
    """Each transaction's data is ``b"<account> <amount>"``: stage a deposit and a history row.

    With ``read_back`` set, the transaction with that ID reads its account's balance through the
    session (which must see the deposits staged before it) and records it in its history row.
    """

    def __init__(self, engine: Engine, read_back: int | None = None) -> None:
        super().__init__(engine, cluster_name="staged")
        self.read_back = read_back
        self.uncaught: list[tuple[int, int, BaseException]] = []

    def apply(self, transaction: Transaction, session: Session) -> None:
        assert isinstance(session, ApplySession)
        account, amount = (int(x) for x in transaction.get_raw_data().split())
        session.stage(DEPOSIT, {"k": account, "amount": amount}, rows=1)
        seen = None
        if transaction.transaction_id == self.read_back:
            seen = session.execute(sa.select(accounts.c.balance).where(accounts.c.id == account)).scalar_one()
        session.stage(
            RECORD, {"transaction_id": transaction.transaction_id, "account": account, "balance_seen": seen}
        )

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.uncaught.append((partition_id, transaction_id, exception))


def _deposits(*pairs: tuple[int, int]) -> list[Transaction]:
    return [
        Transaction(0, tid, ReqId(1, 1, 0, tid), 0, None, f"{account} {amount}".encode())
        for tid, (account, amount) in enumerate(pairs)
    ]


def _balances(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(accounts.c.id, accounts.c.balance)).all())


def _history(engine: Engine) -> list[tuple[int, int, int | None]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(history).order_by(history.c.transaction_id)).all()
        return [(int(t), int(a), None if s is None else int(s)) for t, a, s in rows]


def _statements(engine: Engine) -> list[tuple[str, bool]]:
    """Records (statement text, executemany) of every statement run on ``engine``."""
    seen: list[tuple[str, bool]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(conn: object, cursor: object, statement: str, params: object, ctx: object, many: bool) -> None:
        seen.append((" ".join(statement.split()), many))

    return seen


def test_a_group_s_staged_writes_run_as_one_executemany_per_statement_with_the_mark(engine: Engine) -> None:
    callbacks = Deposits(engine)
    assert callbacks.get_client_high_water_mark(0) == -1
    statements = _statements(engine)
    callbacks.apply_transactions(_deposits((1, 5), (2, 7), (1, 1), (3, 3)))
    assert _balances(engine) == {1: 6, 2: 7, 3: 3}
    assert [row[:2] for row in _history(engine)] == [(0, 1), (1, 2), (2, 1), (3, 3)]
    assert callbacks.get_client_high_water_mark(0) == 3
    # One UPDATE of the four deposits, one INSERT of the four history rows (insertmanyvalues may
    # send it as a single statement), besides the mark's statements.
    deposits = [many for text, many in statements if text.upper().startswith("UPDATE STAGED_ACCOUNTS")]
    assert deposits == [True]
    assert len([text for text, _ in statements if text.upper().startswith("INSERT INTO STAGED_HISTORY")]) == 1


def test_the_framework_s_writes_run_on_the_cursor_on_database_servers(engine: Engine) -> None:
    """Without listeners, the mark's move and a group's staged writes take the direct path on
    PostgreSQL (psycopg: all of them in one pipeline) and MariaDB (PyMySQL) (docs/design/sql.md
    "Group apply"), the ordinary one on SQLite; the results are the same."""
    direct = direct_statements(engine)
    ran: list[list[int] | None] = []
    execute_all = direct.execute_all

    def recording(*args: Any, **kwargs: Any) -> list[int] | None:
        ran.append(result := execute_all(*args, **kwargs))
        return result

    callbacks = Deposits(engine)
    callbacks.get_client_high_water_mark(0)
    direct.execute_all = recording  # type: ignore[method-assign, assignment]
    try:
        callbacks.apply_transactions(_deposits((1, 5), (2, 7), (1, 1)))
    finally:
        del direct.execute_all
    assert _balances(engine) == {1: 6, 2: 7, 3: 0}
    assert callbacks.get_client_high_water_mark(0) == 2
    if engine.dialect.name == "postgresql":
        # the mark's UPDATE (1 row), the deposits (3 rows) and the history rows (3 rows) in one pipeline
        assert ran == [[1, 3, 3]]
    elif engine.dialect.name != "sqlite":
        # no pipelines: the mark's UPDATE alone first, then the deposits and the history rows
        assert ran == [[1], [3, 3]]
    else:  # declined: the mark, the staged writes together, then each staged statement alone
        assert ran == [None, None, None, None]


def test_a_group_another_instance_applied_meanwhile_rolls_back_when_its_mark_misses(engine: Engine) -> None:
    """An instance that has not seen another apply the partition moves the mark with the group's
    first statement (on PostgreSQL in the pipeline of its staged writes); when another instance
    applied the group meanwhile, that move changes no row, the group rolls back (its history rows,
    whose keys exist, fail after it: the move's count decides) and nothing is reported
    (docs/design/sql.md "The apply contract")."""
    direct = direct_statements(engine)
    led: list[str] = []
    execute_led = direct.execute_led

    def recording(*args: Any, **kwargs: Any) -> list[int] | None:
        try:
            result = execute_led(*args, **kwargs)
        except LeadMissedError:
            led.append("missed")
            raise
        led.append("none" if result is None else "moved")
        return result

    first, second = Deposits(engine), Deposits(engine)
    first.get_client_high_water_mark(0)
    second.get_client_high_water_mark(0)
    group = _deposits((1, 5), (2, 7))
    direct.execute_led = recording  # type: ignore[method-assign]
    try:
        first.apply_transactions(group)
        second.apply_transactions(group)
    finally:
        del direct.execute_led
    assert _balances(engine) == {1: 5, 2: 7, 3: 0}
    assert [row[:2] for row in _history(engine)] == [(0, 1), (1, 2)]
    assert second.get_client_high_water_mark(0) == 1
    assert first.uncaught == [] and second.uncaught == []
    # the mechanism: a pipeline on psycopg, the move alone first elsewhere (and nothing after it)
    assert led == (["moved", "missed"] if engine.dialect.name == "postgresql" else ["none", "none"])
    # the second goes on from there, and the first finds the next group applied by it
    later = _deposits((1, 5), (2, 7), (3, 1))[2:]
    second.apply_transactions(later)
    first.apply_transactions(later)
    assert _balances(engine) == {1: 5, 2: 7, 3: 1}
    assert first.get_client_high_water_mark(0) == second.get_client_high_water_mark(0) == 2
    assert first.uncaught == [] and second.uncaught == []


class HidesReadErrors(Deposits):
    """Reads a balance first and ignores any error of that read, then stages the deposit only."""

    def apply(self, transaction: Transaction, session: Session) -> None:
        with contextlib.suppress(Exception):  # an application that hides the errors of its reads
            session.execute(sa.select(accounts.c.balance).where(accounts.c.id == 1)).scalar_one()
        account, amount = (int(x) for x in transaction.get_raw_data().split())
        session.stage(DEPOSIT, {"k": account, "amount": amount}, rows=1)


def test_a_missed_mark_hidden_by_the_apply_still_commits_nothing(engine: Engine) -> None:
    """The move of the mark went with the apply's read, which missed (another instance applied the
    group) and whose error the apply ignored: its deposits ran, but nothing commits."""
    hider = HidesReadErrors(engine)
    hider.get_client_high_water_mark(0)  # -1: it knows nothing of what follows
    Deposits(engine).apply_transactions(_deposits((1, 5), (2, 7)))
    hider.apply_transactions(_deposits((1, 5), (2, 7)))
    assert _balances(engine) == {1: 5, 2: 7, 3: 0}  # not twice
    assert hider.get_client_high_water_mark(0) == 1
    assert hider.uncaught == []
    # its own next group applies (with the mark moved first: the partition counts as shared now)
    hider.apply_transactions(_deposits((1, 5), (2, 7), (3, 4))[2:])
    assert _balances(engine) == {1: 5, 2: 7, 3: 4}


def test_applies_give_the_driver_its_own_transaction_control_back(engine: Engine) -> None:
    """On PostgreSQL an apply's ``BEGIN`` goes in the lead's pipeline, psycopg in autocommit until
    the transaction ends (docs/design/sql.md "The apply contract"): after a commit, a lost race and
    a failed apply, every connection given back to the pool is out of autocommit."""
    if engine.dialect.name != "postgresql":
        pytest.skip("only psycopg has pipelines")
    given_back: list[bool] = []

    @event.listens_for(engine, "checkin")
    def checkin(dbapi_connection: Any, record: object) -> None:
        given_back.append(bool(dbapi_connection.autocommit))

    first, second = Deposits(engine), Deposits(engine)
    first.get_client_high_water_mark(0)
    second.get_client_high_water_mark(0)
    group = _deposits((1, 5), (2, 7), (9, 1))  # account 9 does not exist
    first.apply_transactions(group[:2])  # committed
    second.apply_transactions(group[:2])  # a lost race: rolled back, then found applied
    with pytest.raises(StagedRowCountError):
        first.apply_transaction(group[2])
    first.release_connections()
    second.release_connections()
    assert len(given_back) >= 3 and not any(given_back)
    assert _balances(engine) == {1: 5, 2: 7, 3: 0}
    assert first.get_client_high_water_mark(0) == second.get_client_high_water_mark(0) == 1


def test_a_read_in_apply_sees_the_writes_staged_before_it(engine: Engine) -> None:
    callbacks = Deposits(engine, read_back=2)
    callbacks.get_client_high_water_mark(0)
    callbacks.apply_transactions(_deposits((1, 5), (1, 7), (1, 1)))
    assert _history(engine)[2] == (2, 1, 13)  # 5 + 7 + 1: its own deposit and the two before it
    assert _balances(engine)[1] == 13


def test_a_row_count_other_than_staged_fails_the_group_and_names_the_transaction(engine: Engine) -> None:
    callbacks = Deposits(engine)
    callbacks.get_client_high_water_mark(0)
    with pytest.raises(TransactionApplyError) as raised:
        callbacks.apply_transactions(_deposits((1, 5), (9, 1), (2, 2)))  # account 9 does not exist
    assert raised.value.transaction_id == 1
    assert isinstance(raised.value.__cause__, StagedRowCountError)
    assert "changed 0 row(s), not the 1" in str(raised.value.__cause__)
    # The transaction before it was kept (applied on its own), nothing of the failing one.
    assert _balances(engine) == {1: 5, 2: 0, 3: 0}
    assert callbacks.get_client_high_water_mark(0) == 0


class StagesInSavepoint(Deposits):
    """Stages a deposit, then tries to stage another inside a savepoint it rolls back."""

    def apply(self, transaction: Transaction, session: Session) -> None:
        assert isinstance(session, ApplySession)
        session.stage(DEPOSIT, {"k": 1, "amount": 5}, rows=1)
        savepoint = session.begin_nested()  # the deposit staged before it runs now
        try:
            session.stage(DEPOSIT, {"k": 2, "amount": 7}, rows=1)
        finally:
            savepoint.rollback()


def test_staging_inside_a_savepoint_is_refused_and_writes_staged_before_it_are_kept(engine: Engine) -> None:
    callbacks = StagesInSavepoint(engine)
    callbacks.get_client_high_water_mark(0)
    with pytest.raises(ApplyContractError, match="inside a savepoint"):
        callbacks.apply_transaction(_deposits((1, 5))[0])
    assert _balances(engine) == {1: 0, 2: 0, 3: 0}  # the apply failed: rolled back as a whole
    assert callbacks.get_client_high_water_mark(0) == -1

    class Kept(Deposits):
        def apply(self, transaction: Transaction, session: Session) -> None:
            assert isinstance(session, ApplySession)
            session.stage(DEPOSIT, {"k": 1, "amount": 5}, rows=1)
            savepoint = session.begin_nested()
            session.execute(sa.update(accounts).where(accounts.c.id == 2).values(balance=99))
            savepoint.rollback()  # takes back the update of 2, not the deposit staged before

    kept = Kept(engine)
    kept.apply_transaction(_deposits((1, 5))[0])
    assert _balances(engine) == {1: 5, 2: 0, 3: 0}


# ---- change-sets: ChangeSetCallbacks stages the row changes of a group --------------------------


class Base(DeclarativeBase):
    pass


class Wallet(Base):
    __tablename__ = "staged_wallets"
    __waltz__ = WaltzEntity("wallet")
    wallet_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    balance: Mapped[int] = mapped_column()


class Badge(Base):
    """A row with a unique column besides its key: changes of different rows depend on their order."""

    __tablename__ = "staged_badges"
    __waltz__ = WaltzEntity("badge")
    badge_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    code: Mapped[str] = mapped_column(sa.String(10), unique=True)


@pytest.fixture
def wallets(engine: Engine) -> Iterator[ChangeSetCallbacks]:
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    callbacks = ChangeSetCallbacks(
        engine, cluster_name="staged-wallets", registry=EntityRegistry.from_base(Base)
    )
    assert callbacks.get_client_high_water_mark(0) == -1
    try:
        yield callbacks
    finally:
        Base.metadata.drop_all(engine)


def _change_sets(*changes: list[RowChange]) -> list[Transaction]:
    return [
        Transaction(0, tid, ReqId(1, 1, 0, tid), CHANGE_SET_HEADER, None, ChangeSet(rows).encode())
        for tid, rows in enumerate(changes)
    ]


def _put(op: Operation, wallet_id: int, balance: int | None = None) -> RowChange:
    values = {} if balance is None else {"wallet_id": wallet_id, "balance": balance}
    return RowChange(op, "wallet", {"wallet_id": wallet_id}, values)


def _wallets(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {int(k): int(v) for k, v in conn.execute(sa.select(Wallet.wallet_id, Wallet.balance)).all()}


def test_a_group_of_change_sets_runs_its_row_changes_as_one_statement_each(
    engine: Engine, wallets: ChangeSetCallbacks
) -> None:
    statements = _statements(engine)
    group = _change_sets(
        [_put(Operation.INSERT, 1, 10), _put(Operation.INSERT, 2, 20)],
        [_put(Operation.UPDATE, 1, 11)],
        [_put(Operation.INSERT, 3, 30), _put(Operation.UPDATE, 2, 21)],
        [_put(Operation.DELETE, 3)],
        [_put(Operation.UPDATE, 1, 12)],
    )
    wallets.apply_transactions(group)
    assert _wallets(engine) == {1: 12, 2: 21}
    assert wallets.get_client_high_water_mark(0) == 4
    wallet_updates = [many for text, many in statements if text.upper().startswith("UPDATE STAGED_WALLETS")]
    assert wallet_updates == [True]  # the three updates in one executemany, in log order
    assert len([t for t, _ in statements if t.upper().startswith("INSERT INTO STAGED_WALLETS")]) == 1
    assert wallets.uncaught_count == 0


def test_a_group_whose_changes_depend_on_their_order_is_applied_in_order(
    engine: Engine, wallets: ChangeSetCallbacks
) -> None:
    # By statement, the two inserts of wallet 1 would run before its delete: a duplicate key. The
    # second insert of the row runs the staged writes first, so they keep the log's order.
    group = _change_sets(
        [_put(Operation.INSERT, 1, 10)],
        [_put(Operation.DELETE, 1)],
        [_put(Operation.INSERT, 1, 15)],
    )
    wallets.apply_transactions(group)
    assert _wallets(engine) == {1: 15}
    assert wallets.get_client_high_water_mark(0) == 2


def test_updates_of_one_row_in_two_shapes_keep_the_log_s_order_in_a_group(
    engine: Engine, wallets: ChangeSetCallbacks
) -> None:
    """A change-set may carry a partial row (hand-built, or from another producer): an update of
    only some columns is a statement of another shape than an update of the whole row. By
    statement, wallet 1's partial update (its shape staged first, by wallet 2) would run before
    its whole-row update and leave the older value, every row count right."""
    wallets.apply_transactions(_change_sets([_put(Operation.INSERT, 1, 10), _put(Operation.INSERT, 2, 20)]))
    partial = [
        RowChange(Operation.UPDATE, "wallet", {"wallet_id": k}, {"balance": v}) for k, v in ((2, 21), (1, 13))
    ]
    group = [
        Transaction(0, tid, ReqId(1, 1, 0, tid), CHANGE_SET_HEADER, None, ChangeSet(rows).encode())
        for tid, rows in ((1, [partial[0]]), (2, [_put(Operation.UPDATE, 1, 12)]), (3, [partial[1]]))
    ]
    wallets.apply_transactions(group)
    assert _wallets(engine) == {1: 13, 2: 21}
    assert wallets.get_client_high_water_mark(0) == 3


def test_a_staged_update_of_a_missing_row_fails_as_a_change_set_apply_error(
    engine: Engine, wallets: ChangeSetCallbacks
) -> None:
    group = _change_sets([_put(Operation.INSERT, 1, 10)], [_put(Operation.UPDATE, 7, 1)])
    with pytest.raises(TransactionApplyError) as raised:
        wallets.apply_transactions(group)
    assert raised.value.transaction_id == 1
    assert isinstance(raised.value.__cause__, ChangeSetApplyError)  # named by the one-by-one retry
    assert _wallets(engine) == {1: 10}
    assert wallets.get_client_high_water_mark(0) == 0


def test_one_change_set_transaction_stages_its_row_changes_with_the_mark(
    engine: Engine, wallets: ChangeSetCallbacks
) -> None:
    """A transaction applied on its own stages its row changes too: one statement per shape for
    all of its changes, as in a group (docs/design/sql.md "Change-sets")."""
    wallets.apply_transaction(_change_sets([_put(Operation.INSERT, 1, 10), _put(Operation.INSERT, 2, 20)])[0])
    statements = _statements(engine)
    one = _change_sets([], [_put(Operation.UPDATE, 1, 11), _put(Operation.UPDATE, 2, 21)])[1]
    wallets.apply_transaction(one)
    assert _wallets(engine) == {1: 11, 2: 21}
    assert wallets.get_client_high_water_mark(0) == 1
    wallet_updates = [many for text, many in statements if text.upper().startswith("UPDATE STAGED_WALLETS")]
    assert wallet_updates == [True]  # both updates in one executemany


def test_one_transaction_whose_staged_changes_fail_is_applied_again_alone(
    engine: Engine, wallets: ChangeSetCallbacks
) -> None:
    """Staged by statement, a transaction's changes of different rows may meet in another order
    than the log's (here a unique code taken before the update that frees it): the transaction
    is applied again alone, each change at once, in order; a missing row then fails as the change
    that missed it."""
    first = ChangeSet([RowChange(Operation.INSERT, "badge", {"badge_id": 1}, {"badge_id": 1, "code": "a"})])
    wallets.apply_transaction(Transaction(0, 0, ReqId(1, 1, 0, 0), CHANGE_SET_HEADER, None, first.encode()))
    swap = ChangeSet(
        [
            RowChange(Operation.INSERT, "badge", {"badge_id": 5}, {"badge_id": 5, "code": "q"}),
            RowChange(Operation.UPDATE, "badge", {"badge_id": 1}, {"badge_id": 1, "code": "z"}),
            RowChange(Operation.INSERT, "badge", {"badge_id": 6}, {"badge_id": 6, "code": "a"}),
        ]
    )
    wallets.apply_transaction(Transaction(0, 1, ReqId(1, 1, 0, 1), CHANGE_SET_HEADER, None, swap.encode()))
    with engine.connect() as conn:
        assert dict(conn.execute(sa.select(Badge.badge_id, Badge.code)).all()) == {1: "z", 5: "q", 6: "a"}
    assert wallets.get_client_high_water_mark(0) == 1
    missing = _change_sets([], [], [_put(Operation.INSERT, 2, 20), _put(Operation.UPDATE, 7, 1)])[2]
    with pytest.raises(ChangeSetApplyError, match="update of wallet"):
        wallets.apply_transaction(missing)
    assert _wallets(engine) == {}
    assert wallets.get_client_high_water_mark(0) == 1
