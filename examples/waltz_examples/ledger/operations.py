"""The ledger's transactions within one partition (upstream's bank demo and SmallBank).

Each operation is an :class:`~waltz.jdbc_style.EntityTransactionContext`: it reads the entities it
depends on (READ locks), changes some (WRITE locks), and records in the change-set's ``meta`` its
name and ``delta``, the money it brings into (+) or takes out of (−) the ledger. The sum of the
deltas in the log is what the balances must add up to (``checks.py``). An operation that breaks a
rule (insufficient funds, closed account) is dropped: ``execute`` returns False, nothing reaches
the log, and :attr:`LedgerOperation.reason` says why.

Nothing the database cannot apply reaches the log: a transaction that fails its apply fails it on
every instance, for ever, and blocks its partition. So the constructors refuse (``ValueError``,
naming the argument) an amount or customer ID that is not an ``int`` (a ``bool`` is not one) or is
outside the columns' range (``BIGINT``: :data:`MIN_BALANCE` .. :data:`MAX_BALANCE`), and a holder's
name that is not a ``str``, is longer than :data:`MAX_HOLDER_LENGTH` characters, holds a control
character (PostgreSQL's text cannot hold NUL) or cannot be encoded as UTF-8; and an operation
whose new balance or total would leave that range is dropped by its rule, as any rule violation.

SmallBank transactions (Alomari et al., ICDE 2008; BenchBase's definitions): Balance (a read,
not a log transaction: ``LedgerService.balance``), DepositChecking, TransactSavings, Amalgamate,
WriteCheck, SendPayment. Amalgamate and SendPayment between customers of different partitions
become two-step transfers (``transfers.py``).
"""

from __future__ import annotations

import abc
import unicodedata
from typing import Any

from waltz.jdbc_style import ChangeSetCallbacks, EntityTransaction, EntityTransactionContext
from waltz_examples.ledger.models import AccountStatus, Checking, Savings, account_model

__all__ = [
    "MAX_BALANCE",
    "MAX_HOLDER_LENGTH",
    "MIN_BALANCE",
    "Amalgamate",
    "Deactivate",
    "DepositChecking",
    "LedgerOperation",
    "OpenAccount",
    "SendPayment",
    "TransactSavings",
    "Withdraw",
    "WriteCheck",
]

#: The largest balance, amount or total a ledger column holds (a signed 64-bit ``BIGINT``).
MAX_BALANCE = 2**63 - 1

#: The smallest (a checking balance may be negative: an overdraft).
MIN_BALANCE = -(2**63)

#: The longest holder's name the ``holder`` column (``String(64)``) holds, in characters.
MAX_HOLDER_LENGTH = 64


def check_cents(value: object, what: str, *, minimum: int = MIN_BALANCE) -> int:
    """``value`` if it is an ``int`` (not a ``bool``) from ``minimum`` to :data:`MAX_BALANCE`.

    Args:
        value: the argument.
        what: the argument's name, for the message.
        minimum: the smallest value allowed.

    Returns:
        ``value``.

    Raises:
        ValueError: ``value`` is not such an ``int``.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(
            f"{what} must be an int (cents, or a customer ID), got {value!r} ({type(value).__name__})"
        )
    if not minimum <= value <= MAX_BALANCE:
        raise ValueError(
            f"{what} must be from {minimum} to {MAX_BALANCE} (the columns are BIGINT), got {value}"
        )
    return value


def check_holder(name: object) -> str:
    """``name`` if a ``holder`` column can store it (see the module's docstring).

    Raises:
        ValueError: it is not a ``str``, is longer than :data:`MAX_HOLDER_LENGTH` characters, holds
            a control character, or is not encodable as UTF-8.
    """
    if not isinstance(name, str):
        raise ValueError(f"name must be a str, got {name!r} ({type(name).__name__})")
    if len(name) > MAX_HOLDER_LENGTH:
        raise ValueError(
            f"name must be at most {MAX_HOLDER_LENGTH} characters, got {len(name)}: {name[:20]!r}..."
        )
    for position, char in enumerate(name):
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise ValueError(
                f"name must hold no control character or lone surrogate, got {char!r} at index {position}"
            )
    return name


class LedgerOperation(EntityTransactionContext):
    """A ledger transaction: subclasses implement :meth:`apply_rules`.

    Attributes:
        op: the operation's name (in the change-set's ``meta``).
        reason: why the last attempt was dropped (None: not dropped).
        lock_failures: attempts that failed the server's lock check (each was retried).
        accounts: the ``Account`` model of the instance's release (``releases.py``).
    """

    op = "operation"

    def __init__(self, callbacks: ChangeSetCallbacks, *entities: tuple[type[Any], Any]) -> None:
        super().__init__(callbacks, *entities)
        self.accounts = account_model(callbacks)
        self.reason: str | None = None
        self.lock_failures = 0

    def run(self, tx: EntityTransaction) -> bool:
        self.reason = None
        delta = self.apply_rules(tx)
        if delta is None:
            return False
        tx.meta.update({"op": self.op, "delta": delta})
        return True

    @abc.abstractmethod
    def apply_rules(self, tx: EntityTransaction) -> int | None:
        """Read and change entities through ``tx``.

        Returns:
            The money the operation brings in (+) or takes out (−), or None to drop it (set
            :attr:`reason` first, with :meth:`drop`).
        """

    def drop(self, reason: str) -> None:
        """Record why the attempt is dropped (return None from :meth:`apply_rules` next)."""
        self.reason = reason

    def on_lock_failure(self) -> None:
        self.lock_failures += 1

    def out_of_range(self, value: int, what: str) -> bool:
        """Whether ``value`` (a new balance or total) leaves the ``BIGINT`` range; if so, drop
        the attempt saying so (return None from :meth:`apply_rules` next)."""
        if MIN_BALANCE <= value <= MAX_BALANCE:
            return False
        self.drop(f"{what} would be {value}, outside the columns' range {MIN_BALANCE} .. {MAX_BALANCE}")
        return True

    def open_account(self, tx: EntityTransaction, custid: int) -> Any | None:
        """The customer's account if it exists and is open (READ lock); else drop and None."""
        account = tx.get(self.accounts, custid)
        if account is None:
            self.drop(f"customer {custid} has no account")
            return None
        if account.status != AccountStatus.OPEN:
            self.drop(f"customer {custid}'s account is closed")
            return None
        return account

    def balances(self, tx: EntityTransaction, custid: int) -> tuple[Savings, Checking] | None:
        """The customer's savings and checking rows (READ locks), or drop and None."""
        savings = tx.get(Savings, custid)
        checking = tx.get(Checking, custid)
        if savings is None or checking is None:
            self.drop(f"customer {custid} has no balances")
            return None
        return savings, checking


def _positive(amount: int, what: str) -> int:
    return check_cents(amount, f"{what} amount", minimum=1)


class OpenAccount(LedgerOperation):
    """Open an account with initial balances (the money comes in: delta = savings + checking)."""

    op = "open"

    def __init__(self, callbacks: ChangeSetCallbacks, custid: int, name: str, savings: int, checking: int):
        super().__init__(callbacks, (account_model(callbacks), check_cents(custid, "custid")))
        check_holder(name)
        check_cents(savings, "savings", minimum=0)
        check_cents(checking, "checking", minimum=0)
        if savings + checking > MAX_BALANCE:
            raise ValueError(f"savings + checking must be at most {MAX_BALANCE}, got {savings + checking}")
        self.custid, self.name, self.savings, self.checking = custid, name, savings, checking
        self.expected_models = (self.accounts, Savings, Checking)

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        if tx.get(self.accounts, self.custid) is not None:
            self.drop(f"customer {self.custid} already has an account")
            return None
        holder = {self.accounts.holder_attribute: self.name}  # ``name`` before release 3
        tx.insert(self.accounts, custid=self.custid, status=AccountStatus.OPEN.value, **holder)
        tx.insert(Savings, custid=self.custid, balance=self.savings)
        tx.insert(Checking, custid=self.custid, balance=self.checking)
        return self.savings + self.checking


class DepositChecking(LedgerOperation):
    """SmallBank DepositChecking / the bank demo's deposit: checking += amount."""

    op = "deposit_checking"
    expected_models = (Checking,)

    def __init__(self, callbacks: ChangeSetCallbacks, custid: int, amount: int):
        super().__init__(callbacks, (account_model(callbacks), custid))
        self.custid, self.amount = custid, _positive(amount, "deposit")

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        if self.open_account(tx, self.custid) is None:
            return None
        checking = tx.get(Checking, self.custid)
        if checking is None:
            self.drop(f"customer {self.custid} has no checking balance")
            return None
        if self.out_of_range(checking.balance + self.amount, f"customer {self.custid}'s checking"):
            return None
        tx.update(checking, balance=checking.balance + self.amount)
        return self.amount


class Withdraw(LedgerOperation):
    """The bank demo's withdraw: checking -= amount, refused when checking < amount."""

    op = "withdraw"
    expected_models = (Checking,)

    def __init__(self, callbacks: ChangeSetCallbacks, custid: int, amount: int):
        super().__init__(callbacks, (account_model(callbacks), custid))
        self.custid, self.amount = custid, _positive(amount, "withdrawal")

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        if self.open_account(tx, self.custid) is None:
            return None
        checking = tx.get(Checking, self.custid)
        if checking is None or checking.balance < self.amount:
            self.drop(f"customer {self.custid} has insufficient funds for {self.amount}")
            return None
        tx.update(checking, balance=checking.balance - self.amount)
        return -self.amount


class TransactSavings(LedgerOperation):
    """SmallBank TransactSavings: savings += amount (negative: a withdrawal), never below zero."""

    op = "transact_savings"
    expected_models = (Savings,)

    def __init__(self, callbacks: ChangeSetCallbacks, custid: int, amount: int):
        super().__init__(callbacks, (account_model(callbacks), custid))
        if check_cents(amount, "savings amount", minimum=-MAX_BALANCE) == 0:
            raise ValueError("a savings transaction needs a non-zero amount")
        self.custid, self.amount = custid, amount

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        if self.open_account(tx, self.custid) is None:
            return None
        savings = tx.get(Savings, self.custid)
        if savings is None or savings.balance + self.amount < 0:
            self.drop(f"customer {self.custid}'s savings cannot cover {-self.amount}")
            return None
        if self.out_of_range(savings.balance + self.amount, f"customer {self.custid}'s savings"):
            return None
        tx.update(savings, balance=savings.balance + self.amount)
        return self.amount


class WriteCheck(LedgerOperation):
    """SmallBank WriteCheck: checking -= amount, or amount + 1 (a penalty) when savings + checking
    < amount. Reads savings (READ lock): a concurrent savings withdrawal makes it retry."""

    op = "write_check"
    expected_models = (Savings, Checking)

    def __init__(self, callbacks: ChangeSetCallbacks, custid: int, amount: int):
        super().__init__(callbacks, (account_model(callbacks), custid))
        self.custid, self.amount = custid, _positive(amount, "check")

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        if self.open_account(tx, self.custid) is None:
            return None
        rows = self.balances(tx, self.custid)
        if rows is None:
            return None
        savings, checking = rows
        charge = self.amount + 1 if savings.balance + checking.balance < self.amount else self.amount
        if checking.balance - charge < 0:
            tx.meta["overdraft_custid"] = self.custid  # the overdraft rule (checks.py)
        if self.out_of_range(checking.balance - charge, f"customer {self.custid}'s checking"):
            return None
        tx.update(checking, balance=checking.balance - charge)
        return -charge


class Amalgamate(LedgerOperation):
    """SmallBank Amalgamate within a partition: move all of ``custid0``'s money to ``custid1``'s
    checking. Across partitions use ``transfers.start_transfer``."""

    op = "amalgamate"
    expected_models = (Savings, Checking)

    def __init__(self, callbacks: ChangeSetCallbacks, custid0: int, custid1: int):
        accounts = account_model(callbacks)
        super().__init__(callbacks, (accounts, custid0), (accounts, custid1))
        if custid0 == custid1:
            raise ValueError("amalgamate needs two different customers")
        self.custid0, self.custid1 = custid0, custid1

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        if self.open_account(tx, self.custid0) is None or self.open_account(tx, self.custid1) is None:
            return None
        source = self.balances(tx, self.custid0)
        target = tx.get(Checking, self.custid1)
        if source is None or target is None:
            self.drop("missing balances")
            return None
        savings, checking = source
        total = savings.balance + checking.balance
        if self.out_of_range(target.balance + total, f"customer {self.custid1}'s checking"):
            return None
        tx.update(savings, balance=0)
        tx.update(checking, balance=0)
        tx.update(target, balance=target.balance + total)
        if total < 0:
            tx.meta["overdraft_custid"] = self.custid1  # inherits an overdraft (checks.py)
        return 0


class SendPayment(LedgerOperation):
    """SmallBank SendPayment / the bank demo's transfer within a partition: checking to checking,
    refused when the sender's checking < amount. Across partitions use ``transfers.start_transfer``."""

    op = "send_payment"
    expected_models = (Checking,)

    def __init__(self, callbacks: ChangeSetCallbacks, from_custid: int, to_custid: int, amount: int):
        accounts = account_model(callbacks)
        super().__init__(callbacks, (accounts, from_custid), (accounts, to_custid))
        if from_custid == to_custid:
            raise ValueError("a payment needs two different customers")
        self.from_custid, self.to_custid, self.amount = from_custid, to_custid, _positive(amount, "payment")

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        if self.open_account(tx, self.from_custid) is None or self.open_account(tx, self.to_custid) is None:
            return None
        source = tx.get(Checking, self.from_custid)
        target = tx.get(Checking, self.to_custid)
        if source is None or target is None or source.balance < self.amount:
            self.drop(f"customer {self.from_custid} has insufficient funds for {self.amount}")
            return None
        if self.out_of_range(target.balance + self.amount, f"customer {self.to_custid}'s checking"):
            return None
        tx.update(source, balance=source.balance - self.amount)
        tx.update(target, balance=target.balance + self.amount)
        return 0


class Deactivate(LedgerOperation):
    """The bank demo's deactivate: the account closes; its balances stay, frozen. Credits that
    arrive later are refunded to their senders."""

    op = "deactivate"

    def __init__(self, callbacks: ChangeSetCallbacks, custid: int):
        super().__init__(callbacks, (account_model(callbacks), custid))
        self.custid = custid
        self.expected_models = (self.accounts,)

    def apply_rules(self, tx: EntityTransaction) -> int | None:
        account = self.open_account(tx, self.custid)
        if account is None:
            return None
        tx.update(account, status=AccountStatus.CLOSED.value)
        return 0
