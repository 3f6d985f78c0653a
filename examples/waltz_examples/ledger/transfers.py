"""Two-step transfers between customers of different partitions, and the sweeper.

Locks are scoped to a partition (docs/design/locks.md "Locks and their scope"), so a transfer between two
partitions cannot be one Waltz transaction. As real ledgers do, it is two, keyed by a transfer ID:

1. **Debit** (source partition): the sender's money leaves (checking for a payment; savings and
   checking for an amalgamation) and a ``TransferOut`` row, status ``pending``, is written in the
   same change-set: an outbox, applied in the same database transaction as the debit.
2. **Credit** (target partition): WRITE lock on the transfer's ``TransferIn`` row. If it exists
   the credit happened already: nothing to do. If the target account is open its checking
   receives the amount (``TransferIn`` ``credited``), otherwise the credit is ``rejected``.
3. **Settle** or **Refund** (source partition): a ``pending`` outbox row whose credit landed is
   marked ``credited``; one whose credit was rejected is ``refunded``: the sender's checking gets
   the money back. Both do nothing unless the row is still ``pending``.

A :class:`Sweeper` thread on every application instance scans the shared database for
``pending`` outbox rows and submits the next step (never from the apply thread). Several
instances may submit the same step: the WRITE locks let one commit and the others find it done.
A ``kill -9`` between a debit's apply and its credit loses nothing: the outbox row is in the
database, and any instance's sweeper resumes it. Money in flight (debited, not yet credited or
refunded) is :func:`money_in_flight`.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, func, or_, select

from waltz.jdbc_style import ChangeSetCallbacks, EntityTransaction
from waltz_examples.ledger.models import (
    Account,
    AccountStatus,
    Checking,
    Savings,
    TransferIn,
    TransferInStatus,
    TransferOut,
    TransferOutStatus,
)
from waltz_examples.ledger.operations import LedgerOperation

__all__ = [
    "CreditTransfer",
    "DebitForTransfer",
    "RefundTransfer",
    "SettleTransfer",
    "Sweeper",
    "TransferKind",
    "money_in_flight",
    "new_transfer_id",
    "pending_transfers",
]

log = logging.getLogger(__name__)

#: Outbox pages one sweep reads at most (see ``Sweeper._scan``).
MAX_PAGES = 100


class TransferKind:
    """What a transfer moves: a payment (checking to checking) or an amalgamation (everything)."""

    PAYMENT = "payment"
    AMALGAMATE = "amalgamate"


def new_transfer_id() -> str:
    """A fresh transfer ID (32 hex digits)."""
    return uuid.uuid4().hex


class DebitForTransfer(LedgerOperation):
    """Step 1: take the money from the sender and write the outbox row (source partition).

    Args:
        callbacks: the ledger's callbacks.
        from_custid / to_custid: sender and receiver (different partitions).
        amount: cents to pay (``PAYMENT``); ignored for ``AMALGAMATE`` (everything moves).
        kind: :class:`TransferKind`.
        transfer_id: the transfer's ID (default: a new one).
    """

    op = "transfer_debit"

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        from_custid: int,
        to_custid: int,
        amount: int,
        kind: str = TransferKind.PAYMENT,
        transfer_id: str | None = None,
    ):
        super().__init__(callbacks, (Account, from_custid))
        if from_custid == to_custid:
            raise ValueError("a transfer needs two different customers")
        if kind == TransferKind.PAYMENT and amount <= 0:
            raise ValueError(f"payment amount must be a positive number of cents, got {amount}")
        self.from_custid, self.to_custid, self.amount, self.kind = from_custid, to_custid, amount, kind
        self.transfer_id = transfer_id or new_transfer_id()
        self.moved = 0
        """Cents debited by the committed attempt."""

    def prefetch_entities(self) -> list[tuple[type[Any], Any]]:
        # Read with the mark: the account (declared) and both balances.
        return [(Account, self.from_custid), (Savings, self.from_custid), (Checking, self.from_custid)]

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        if self.open_account(tx, self.from_custid) is None:
            return None
        rows = self.balances(tx, self.from_custid)
        if rows is None:
            return None
        savings, checking = rows
        if self.kind == TransferKind.AMALGAMATE:
            moved = savings.balance + checking.balance
            tx.update(savings, balance=0)
            tx.update(checking, balance=0)
        else:
            if checking.balance < self.amount:
                self.drop(f"customer {self.from_custid} has insufficient funds for {self.amount}")
                return None
            moved = self.amount
            tx.update(checking, balance=checking.balance - moved)
        tx.insert(
            TransferOut,
            from_custid=self.from_custid,
            transfer_id=self.transfer_id,
            to_custid=self.to_custid,
            amount=moved,
            kind=self.kind,
            status=TransferOutStatus.PENDING.value,
        )
        self.moved = moved
        return 0


class CreditTransfer(LedgerOperation):
    """Step 2: credit the receiver once, or reject the credit (target partition)."""

    op = "transfer_credit"

    def __init__(self, callbacks: ChangeSetCallbacks, transfer: TransferOut):
        super().__init__(callbacks, (TransferIn, (transfer.to_custid, transfer.transfer_id)))
        self.transfer = transfer
        self.outcome: str | None = None

    def prefetch_entities(self) -> list[tuple[type[Any], Any]]:
        # Read with the mark: the credit's row (declared), the receiver's account and checking.
        t = self.transfer
        return [(TransferIn, (t.to_custid, t.transfer_id)), (Account, t.to_custid), (Checking, t.to_custid)]

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        t = self.transfer
        if tx.get(TransferIn, (t.to_custid, t.transfer_id)) is not None:
            self.drop(f"transfer {t.transfer_id} was credited already")
            return None
        account = tx.get(Account, t.to_custid)
        checking = tx.get(Checking, t.to_custid)
        if account is not None and account.status == AccountStatus.OPEN and checking is not None:
            tx.update(checking, balance=checking.balance + t.amount)
            self.outcome = TransferInStatus.CREDITED.value
            if t.amount < 0:
                tx.meta["overdraft_custid"] = t.to_custid  # an amalgamated overdraft (checks.py)
        else:
            self.outcome = TransferInStatus.REJECTED.value
        tx.insert(
            TransferIn,
            to_custid=t.to_custid,
            transfer_id=t.transfer_id,
            from_custid=t.from_custid,
            amount=t.amount,
            status=self.outcome,
        )
        return 0


class SettleTransfer(LedgerOperation):
    """Step 3a: mark a credited transfer's outbox row ``credited`` (source partition)."""

    op = "transfer_settle"

    def __init__(self, callbacks: ChangeSetCallbacks, transfer: TransferOut):
        super().__init__(callbacks, (TransferOut, (transfer.from_custid, transfer.transfer_id)))
        self.transfer = transfer

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        row = tx.get(TransferOut, (self.transfer.from_custid, self.transfer.transfer_id))
        if row is None or row.status != TransferOutStatus.PENDING:
            self.drop(f"transfer {self.transfer.transfer_id} is settled already")
            return None
        tx.update(row, status=TransferOutStatus.CREDITED.value)
        return 0


class RefundTransfer(LedgerOperation):
    """Step 3b: a rejected credit: the sender's checking gets the money back (source partition)."""

    op = "transfer_refund"

    def __init__(self, callbacks: ChangeSetCallbacks, transfer: TransferOut):
        super().__init__(callbacks, (TransferOut, (transfer.from_custid, transfer.transfer_id)))
        self.transfer = transfer

    def prefetch_entities(self) -> list[tuple[type[Any], Any]]:
        # Read with the mark: the outbox row (declared) and the sender's checking.
        t = self.transfer
        return [(TransferOut, (t.from_custid, t.transfer_id)), (Checking, t.from_custid)]

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        row = tx.get(TransferOut, (self.transfer.from_custid, self.transfer.transfer_id))
        if row is None or row.status != TransferOutStatus.PENDING:
            self.drop(f"transfer {self.transfer.transfer_id} is settled already")
            return None
        checking = tx.get(Checking, row.from_custid)
        if checking is None:
            self.drop(f"customer {row.from_custid} has no checking balance")
            return None
        tx.update(row, status=TransferOutStatus.REFUNDED.value)
        tx.update(checking, balance=checking.balance + row.amount)
        if checking.balance < 0:
            tx.meta["overdraft_custid"] = row.from_custid  # an amalgamated overdraft came back (checks.py)
        return 0


def pending_transfers(engine: Engine) -> int:
    """Outbox rows still ``pending`` (neither settled nor refunded)."""
    stmt = (
        select(func.count())
        .select_from(TransferOut)
        .where(TransferOut.status == TransferOutStatus.PENDING.value)
    )
    with engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def money_in_flight(engine: Engine) -> int:
    """Cents debited by transfers and neither credited nor refunded yet.

    A pending outbox row counts unless its credit has landed (then the money is in the receiver's
    balance, and only the settle step is missing).
    """
    credited = and_(
        TransferIn.transfer_id == TransferOut.transfer_id,
        TransferIn.to_custid == TransferOut.to_custid,
        TransferIn.status == TransferInStatus.CREDITED.value,
    )
    stmt = (
        select(func.coalesce(func.sum(TransferOut.amount), 0))
        .select_from(TransferOut)
        .outerjoin(TransferIn, credited)
        .where(TransferOut.status == TransferOutStatus.PENDING.value, TransferIn.transfer_id.is_(None))
    )
    with engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


@dataclass(frozen=True, slots=True)
class _Pending:
    """A pending outbox row (its columns, no ORM instance) and the state of its credit."""

    from_custid: int
    transfer_id: str
    to_custid: int
    amount: int
    kind: str
    credit: str | None  # TransferIn status, or None when no credit yet

    @property
    def step_name(self) -> str:
        """The next step: ``credit`` (no credit yet), ``settle`` (credited) or ``refund``."""
        if self.credit is None:
            return "credit"
        return "settle" if self.credit == TransferInStatus.CREDITED else "refund"

    @property
    def step_customer(self) -> int:
        """The customer whose partition the next step runs on (the credit's receiver, else the
        sender)."""
        return self.to_custid if self.credit is None else self.from_custid

    def transfer(self) -> TransferOut:
        """The outbox row as a (transient) ``TransferOut``."""
        return TransferOut(
            from_custid=self.from_custid,
            transfer_id=self.transfer_id,
            to_custid=self.to_custid,
            amount=self.amount,
            kind=self.kind,
            status=TransferOutStatus.PENDING.value,
        )


#: The operation of each step a pending transfer can be at (``_Pending.step_name``).
_STEPS: dict[str, type[CreditTransfer | SettleTransfer | RefundTransfer]] = {
    "credit": CreditTransfer,
    "settle": SettleTransfer,
    "refund": RefundTransfer,
}

#: ``submit(context) -> future``: how the sweeper hands a step to the Waltz client.
Submit = Callable[[LedgerOperation], "Future[int | None]"]


class Sweeper:
    """Moves pending transfers forward: submits credits, settles and refunds (every instance runs one).

    Args:
        callbacks: the ledger's callbacks (database, registry).
        submit: submits a context to this instance's Waltz client.
        interval: seconds between scans of the outbox.
        batch: outbox rows looked at per scan.
        owns: whether this instance moves the steps that run on a customer's partition (one it
            mounts), given the customer ID; None: all.
    """

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        submit: Submit,
        *,
        interval: float = 0.2,
        batch: int = 500,
        owns: Callable[[int], bool] | None = None,
    ):
        self._callbacks = callbacks
        self._submit = submit
        self._owns = owns
        self._interval = interval
        self._batch = batch
        self._in_flight: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-sweeper", daemon=True)
        self.submitted = 0
        """Steps submitted so far."""
        self.scans = 0

    def start(self) -> None:
        """Start the sweeper thread."""
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop scanning (steps already submitted finish in the client). Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def pending(self, after: tuple[int, str] | None = None) -> list[_Pending]:
        """Pending outbox rows with the state of their credit (one Core query, no ORM loading):
        ``batch`` rows at most, in (sender, transfer ID) order, after ``after`` if given."""
        out, into = TransferOut.__table__, TransferIn.__table__
        stmt = (
            select(
                out.c.from_custid, out.c.transfer_id, out.c.to_custid, out.c.amount, out.c.kind, into.c.status
            )
            .select_from(
                out.outerjoin(
                    into, and_(into.c.transfer_id == out.c.transfer_id, into.c.to_custid == out.c.to_custid)
                )
            )
            .where(out.c.status == TransferOutStatus.PENDING.value)
            .order_by(out.c.from_custid, out.c.transfer_id)
            .limit(self._batch)
        )
        if after is not None:
            stmt = stmt.where(
                or_(
                    out.c.from_custid > after[0],
                    and_(out.c.from_custid == after[0], out.c.transfer_id > after[1]),
                )
            )
        with self._callbacks.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        return [
            _Pending(
                int(source),
                str(transfer_id),
                int(target),
                int(amount),
                str(kind),
                None if credit is None else str(credit),
            )
            for source, transfer_id, target, amount, kind, credit in rows
        ]

    def sweep_once(self) -> int:
        """Submit the next step of every pending transfer not already in flight from here.

        Returns:
            Steps submitted.
        """
        submitted = 0
        for item in self._scan():
            name = item.step_name
            key = (item.transfer_id, name)
            with self._lock:
                if key in self._in_flight:
                    continue
                self._in_flight.add(key)
            try:
                future = self._submit(self._step(item, name))
            except Exception as exc:
                with self._lock:
                    self._in_flight.discard(key)
                log.warning(
                    "sweeper: could not submit the %s of transfer %s: %r", name, item.transfer_id, exc
                )
                continue
            future.add_done_callback(functools.partial(self._done, key))
            submitted += 1
        self.submitted += submitted
        return submitted

    def _step(self, item: _Pending, name: str) -> LedgerOperation:
        """The next step of a pending transfer, ``name`` its ``_Pending.step_name``."""
        return _STEPS[name](self._callbacks, item.transfer())

    def _scan(self) -> Iterator[_Pending]:
        """The pending rows whose next step this instance moves: the first page, and further
        pages (at most :data:`MAX_PAGES` in all) while no row so far was this instance's to
        move, so that the rows of partitions other instances move (an instance mounting their
        partition does) never hide its own."""
        after: tuple[int, str] | None = None
        owns = self._owns
        for _ in range(MAX_PAGES):
            page = self.pending(after)
            owned = False
            for item in page:
                if owns is None or owns(item.step_customer):
                    owned = True
                    yield item
            if owned or len(page) < self._batch:
                return
            after = (page[-1].from_custid, page[-1].transfer_id)

    def _done(self, key: tuple[str, str], future: object) -> None:
        with self._lock:
            self._in_flight.discard(key)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sweep_once()
                self.scans += 1
            except Exception:
                log.exception("sweeper: scan failed; trying again in %.1fs", self._interval)
