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
``pending`` outbox rows and submits the next step (never from the apply thread), the steps of one
kind and partition found by a scan in one transaction (:class:`CreditTransfers`,
:class:`SettleTransfers`, :class:`RefundTransfers`; a transfer already past the step is left as
it is). Several instances may submit the same step: the WRITE locks let one commit and the
others find it done.
A ``kill -9`` between a debit's apply and its credit loses nothing: the outbox row is in the
database, and any instance's sweeper resumes it. Money in flight (debited, not yet credited or
refunded) is :func:`money_in_flight`.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, func, or_, select

from waltz import Outcome
from waltz.jdbc_style import ChangeSetCallbacks, EntityTransaction
from waltz_examples.ledger.models import (
    AccountStatus,
    Checking,
    Savings,
    TransferIn,
    TransferInStatus,
    TransferOut,
    TransferOutStatus,
    account_model,
)
from waltz_examples.ledger.operations import MAX_BALANCE, MIN_BALANCE, LedgerOperation, check_cents

__all__ = [
    "MAX_STEP_BATCH",
    "CreditTransfer",
    "CreditTransfers",
    "DebitForTransfer",
    "RefundTransfer",
    "RefundTransfers",
    "SettleTransfer",
    "SettleTransfers",
    "Sweeper",
    "TransferKind",
    "money_in_flight",
    "new_transfer_id",
    "pending_transfers",
]

log = logging.getLogger(__name__)

#: Outbox pages one sweep reads at most (see ``Sweeper._scan``).
MAX_PAGES = 100

#: Transfers one step transaction moves at most when the sweeper batches them (see ``Sweeper``).
MAX_STEP_BATCH = 50


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
        super().__init__(callbacks, (account_model(callbacks), check_cents(from_custid, "from_custid")))
        check_cents(to_custid, "to_custid")
        if from_custid == to_custid:
            raise ValueError("a transfer needs two different customers")
        if kind == TransferKind.PAYMENT:
            check_cents(amount, "payment amount", minimum=1)
        self.from_custid, self.to_custid, self.amount, self.kind = from_custid, to_custid, amount, kind
        self.transfer_id = transfer_id or new_transfer_id()
        self.moved = 0
        """Cents debited by the committed attempt."""

    def prefetch_entities(self) -> list[tuple[type[Any], Any]]:
        # Read with the mark: the account (declared) and both balances.
        return [(self.accounts, self.from_custid), (Savings, self.from_custid), (Checking, self.from_custid)]

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        if self.open_account(tx, self.from_custid) is None:
            return None
        rows = self.balances(tx, self.from_custid)
        if rows is None:
            return None
        savings, checking = rows
        if self.kind == TransferKind.AMALGAMATE:
            moved = savings.balance + checking.balance
            if self.out_of_range(moved, f"the amount moved from customer {self.from_custid}"):
                return None
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


class _TransferStep(LedgerOperation):
    """A step of one or more transfers whose step runs on one partition (the sweeper batches them).

    Args:
        callbacks: the ledger's callbacks.
        transfers: the outbox rows (``TransferOut``) whose step this is; each row once, all of
            them on the step's partition (a transfer listed twice counts once).

    Raises:
        ValueError: no transfer given.
        CrossPartitionError: from ``submit``, when the transfers' steps run on different partitions.
    """

    def __init__(self, callbacks: ChangeSetCallbacks, transfers: Sequence[TransferOut]) -> None:
        unique = list({(t.from_custid, t.to_custid, t.transfer_id): t for t in transfers}.values())
        if not unique:
            raise ValueError(f"{type(self).__name__} needs at least one transfer")
        super().__init__(callbacks, *(self._declared(t) for t in unique))
        self.transfers = unique
        self.outcomes: dict[str, str] = {}
        """Transfer ID -> what the committed attempt did to it (transfers already past this step
        are not in it)."""

    @staticmethod
    def _declared(transfer: TransferOut) -> tuple[type[Any], Any]:
        """The entity a transfer's step writes, declared (it chooses the partition)."""
        return TransferOut, (transfer.from_custid, transfer.transfer_id)

    def _nothing_to_do(self, state: str) -> None:
        """Drop the attempt: every transfer is past this step (``state`` says where)."""
        ids = [t.transfer_id for t in self.transfers]
        if len(ids) == 1:
            self.drop(f"transfer {ids[0]} is {state}")
        else:
            self.drop(f"transfers {', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''} are {state}")

    @staticmethod
    def _note_overdrafts(tx: EntityTransaction, custids: list[int]) -> None:
        """Record the customers whose checking this step leaves negative (checks.py)."""
        if len(custids) == 1:
            tx.meta["overdraft_custid"] = custids[0]
        elif custids:
            tx.meta["overdraft_custids"] = custids


class CreditTransfers(_TransferStep):
    """Step 2: credit each receiver once, or reject the credit (target partition).

    A transfer whose ``TransferIn`` row exists was credited (or rejected) already and is left as
    it is; the attempt is dropped when that holds for all of them. A receiver of several transfers
    gets one update of its checking. A credit that would take the receiver's checking out of the
    ``BIGINT`` range is rejected (the sender is refunded), as the credit to a closed account is.
    """

    op = "transfer_credit"

    @staticmethod
    def _declared(transfer: TransferOut) -> tuple[type[Any], Any]:
        return TransferIn, (transfer.to_custid, transfer.transfer_id)

    def prefetch_entities(self) -> list[tuple[type[Any], Any]]:
        # Read with the mark (or from the entity cache): the receivers' accounts and checking.
        # Not the credits' rows: they are new, so no cache holds them, and one mark statement
        # joining each of them would be a join of tens of tables; run reads them in one statement.
        entities: list[tuple[type[Any], Any]] = []
        for custid in dict.fromkeys(t.to_custid for t in self.transfers):
            entities += [(self.accounts, custid), (Checking, custid)]
        return entities

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        self.outcomes = {}
        receivers: dict[int, Checking | None] = {}  # None: closed, missing or without checking
        credits: dict[int, int] = {}
        overdrafts: dict[int, None] = {}
        done = tx.get_many(TransferIn, [(t.to_custid, t.transfer_id) for t in self.transfers])
        for t in self.transfers:
            if done[(t.to_custid, t.transfer_id)] is not None:
                continue  # credited or rejected already: another sweeper's step committed first
            if t.to_custid not in receivers:
                account = tx.get(self.accounts, t.to_custid)
                checking = tx.get(Checking, t.to_custid)
                is_open = account is not None and account.status == AccountStatus.OPEN
                receivers[t.to_custid] = checking if is_open else None
            receiver = receivers[t.to_custid]
            new_balance = (
                None if receiver is None else receiver.balance + credits.get(t.to_custid, 0) + t.amount
            )
            if new_balance is not None and MIN_BALANCE <= new_balance <= MAX_BALANCE:
                outcome = TransferInStatus.CREDITED.value
                credits[t.to_custid] = credits.get(t.to_custid, 0) + t.amount
                if t.amount < 0:
                    overdrafts[t.to_custid] = None  # an amalgamated overdraft (checks.py)
            else:
                outcome = TransferInStatus.REJECTED.value
            tx.insert(
                TransferIn,
                to_custid=t.to_custid,
                transfer_id=t.transfer_id,
                from_custid=t.from_custid,
                amount=t.amount,
                status=outcome,
            )
            self.outcomes[t.transfer_id] = outcome
        if not self.outcomes:
            self._nothing_to_do("credited already")
            return None
        for custid, amount in credits.items():
            checking = receivers[custid]
            assert checking is not None
            tx.update(checking, balance=checking.balance + amount)
        self._note_overdrafts(tx, list(overdrafts))
        return 0


class SettleTransfers(_TransferStep):
    """Step 3a: mark credited transfers' outbox rows ``credited`` (source partition); a row no
    longer ``pending`` is left as it is (the attempt is dropped when no row is)."""

    op = "transfer_settle"

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        self.outcomes = {}
        for t in self.transfers:
            row = tx.get(TransferOut, (t.from_custid, t.transfer_id))
            if row is None or row.status != TransferOutStatus.PENDING:
                continue
            tx.update(row, status=TransferOutStatus.CREDITED.value)
            self.outcomes[t.transfer_id] = TransferOutStatus.CREDITED.value
        if not self.outcomes:
            self._nothing_to_do("settled already")
            return None
        return 0


class RefundTransfers(_TransferStep):
    """Step 3b: rejected credits: the senders' checking gets the money back (source partition).

    A row no longer ``pending``, or whose sender has no checking row or whose refund would take the
    sender's checking out of the ``BIGINT`` range, is left as it is (the attempt is dropped when no
    row is refunded). A sender of several refunds gets one update of its checking.
    """

    op = "transfer_refund"

    def prefetch_entities(self) -> list[tuple[type[Any], Any]]:
        # Read with the mark: the outbox rows (declared) and the senders' checking.
        entities: list[tuple[type[Any], Any]] = [self._declared(t) for t in self.transfers]
        entities += [(Checking, custid) for custid in dict.fromkeys(t.from_custid for t in self.transfers)]
        return entities

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        self.outcomes = {}
        senders: dict[int, Checking | None] = {}
        refunds: dict[int, int] = {}
        for t in self.transfers:
            row = tx.get(TransferOut, (t.from_custid, t.transfer_id))
            if row is None or row.status != TransferOutStatus.PENDING:
                continue
            if row.from_custid not in senders:
                senders[row.from_custid] = tx.get(Checking, row.from_custid)
            sender = senders[row.from_custid]
            if sender is None:
                self.drop(f"customer {row.from_custid} has no checking balance")
                continue  # stays pending
            refunded = sender.balance + refunds.get(row.from_custid, 0) + row.amount
            if self.out_of_range(refunded, f"customer {row.from_custid}'s checking"):
                continue  # stays pending
            tx.update(row, status=TransferOutStatus.REFUNDED.value)
            refunds[row.from_custid] = refunds.get(row.from_custid, 0) + row.amount
            self.outcomes[t.transfer_id] = TransferOutStatus.REFUNDED.value
        if not self.outcomes:
            if self.reason is None:
                self._nothing_to_do("settled already")
            return None
        self.reason = None
        overdrafts = []
        for custid, amount in refunds.items():
            checking = senders[custid]
            assert checking is not None
            tx.update(checking, balance=checking.balance + amount)
            if checking.balance < 0:
                overdrafts.append(custid)  # an amalgamated overdraft came back (checks.py)
        self._note_overdrafts(tx, overdrafts)
        return 0


class CreditTransfer(CreditTransfers):
    """Step 2 of one transfer (:class:`CreditTransfers` of one); :attr:`outcome` says what it did."""

    def __init__(self, callbacks: ChangeSetCallbacks, transfer: TransferOut):
        super().__init__(callbacks, [transfer])
        self.transfer = transfer

    @property
    def outcome(self) -> str | None:
        """``credited`` or ``rejected`` (``TransferInStatus``); None when credited already."""
        return self.outcomes.get(self.transfer.transfer_id)


class SettleTransfer(SettleTransfers):
    """Step 3a of one transfer (:class:`SettleTransfers` of one)."""

    def __init__(self, callbacks: ChangeSetCallbacks, transfer: TransferOut):
        super().__init__(callbacks, [transfer])
        self.transfer = transfer


class RefundTransfer(RefundTransfers):
    """Step 3b of one transfer (:class:`RefundTransfers` of one)."""

    def __init__(self, callbacks: ChangeSetCallbacks, transfer: TransferOut):
        super().__init__(callbacks, [transfer])
        self.transfer = transfer


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
_STEPS: dict[str, type[CreditTransfers | SettleTransfers | RefundTransfers]] = {
    "credit": CreditTransfers,
    "settle": SettleTransfers,
    "refund": RefundTransfers,
}

#: ``submit(context) -> future``: how the sweeper hands a step to the Waltz client.
Submit = Callable[[LedgerOperation], "Future[Outcome]"]


class Sweeper:
    """Moves pending transfers forward: submits credits, settles and refunds (every instance runs one).

    With ``partition_of``, the steps one scan finds are batched: one transaction per step kind and
    partition moves up to :data:`MAX_STEP_BATCH` transfers (:class:`CreditTransfers`,
    :class:`SettleTransfers`, :class:`RefundTransfers`), so that a scan costs the log a few
    transactions rather than one per transfer. Without it, every step is a transaction of its own.

    Args:
        callbacks: the ledger's callbacks (database, registry).
        submit: submits a context to this instance's Waltz client.
        interval: seconds between scans of the outbox.
        batch: outbox rows looked at per scan.
        owns: whether this instance moves the steps that run on a customer's partition (one it
            mounts), given the customer ID; None: all.
        partition_of: a customer's partition, given the customer ID (it batches the steps); None:
            one transaction per step.
    """

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        submit: Submit,
        *,
        interval: float = 0.2,
        batch: int = 500,
        owns: Callable[[int], bool] | None = None,
        partition_of: Callable[[int], int] | None = None,
    ):
        self._callbacks = callbacks
        self._submit = submit
        self._owns = owns
        self._partition_of = partition_of
        self._interval = interval
        self._batch = batch
        self._in_flight: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-sweeper", daemon=True)
        self.submitted = 0
        """Steps submitted so far (a transfer's step counts once, however batched)."""
        self.step_transactions = 0
        """Transactions those steps were submitted in."""
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
            Steps submitted (transfers moved on; batched ones count once each).
        """
        groups: dict[tuple[str, int], list[_Pending]] = {}
        for item in self._scan():
            name = item.step_name
            with self._lock:
                if (item.transfer_id, name) in self._in_flight:
                    continue
                self._in_flight.add((item.transfer_id, name))
            if self._partition_of is None:
                group = (name, len(groups))  # a transaction per step
            else:
                group = (name, self._partition_of(item.step_customer))
            groups.setdefault(group, []).append(item)
        submitted = 0
        for (name, _), items in groups.items():
            for start in range(0, len(items), MAX_STEP_BATCH):
                submitted += self._submit_step(name, items[start : start + MAX_STEP_BATCH])
        self.submitted += submitted
        return submitted

    def _submit_step(self, name: str, items: list[_Pending]) -> int:
        """Submit one step transaction for ``items`` (their keys already in flight); the number
        of steps submitted (0 when the client refused it: the keys are released)."""
        keys = [(item.transfer_id, name) for item in items]
        try:
            future = self._submit(_STEPS[name](self._callbacks, [item.transfer() for item in items]))
        except Exception as exc:
            self._done(keys, None)
            log.warning(
                "sweeper: could not submit the %s of %d transfer(s) (%s, ...): %r",
                name,
                len(items),
                items[0].transfer_id,
                exc,
            )
            return 0
        future.add_done_callback(functools.partial(self._done, keys))
        self.step_transactions += 1
        return len(items)

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

    def _done(self, keys: list[tuple[str, str]], future: object) -> None:
        with self._lock:
            self._in_flight.difference_update(keys)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sweep_once()
                self.scans += 1
            except Exception:
                log.exception("sweeper: scan failed; trying again in %.1fs", self._interval)
