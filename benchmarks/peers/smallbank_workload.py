"""The SmallBank workload of the peers: the ledger example's mix, drawn as its load generator draws it.

The peers measure what a team would run instead of waltz-py (docs/design/overview.md, "Why the
log is the source of truth") under the workload of ``waltz perf smallbank``: the one of
``waltz/workloads/smallbank.py`` (the demo's). Customers ``0 .. accounts-1`` are
opened before the measured phase with savings and checking drawn from 10,000..50,000 cents;
BenchBase's mix (Amalgamate 15 %, Balance 15 %, DepositChecking 15 %, SendPayment 25 %,
TransactSavings 15 %, WriteCheck 15 %) with its amounts; 90 % of the picks from a hotspot of the
first 10 % of the customers (at least 2). The options of a run, and the command line both
SmallBank peers take, are here too.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import NamedTuple

from waltz.workloads.smallbank import (  # the ledger's mix and amounts, exactly
    DEPOSIT_CHECKING,
    MIX,
    SEND_PAYMENT,
    TRANSACT_SAVINGS,
    WRITE_CHECK,
)

#: Draws of the second customer of a two-customer operation until it differs from the first.
MAX_SECOND_DRAWS = 10_000


@dataclass(frozen=True)
class Options:
    """One run.

    Attributes:
        transactions: measured draws of the mix (Balance included), split over the threads.
        processes: worker processes.
        threads: threads per worker process, each with its own connection (closed loop).
        accounts: customers ``0 .. accounts-1``.
        hotspot_fraction: share of the customers in the hotspot (at least 2 customers).
        hotspot_probability: share of the picks from the hotspot.
        warmup: draws before the measured phase (not measured; their money is in the check).
        seed: seeds the opening balances and every thread's draws.
        time_limit: seconds the measured phase may take; the threads stop drawing then.
    """

    transactions: int = 6000
    processes: int = 3
    threads: int = 21
    accounts: int = 200
    hotspot_fraction: float = 0.1
    hotspot_probability: float = 0.9
    warmup: int = 300
    seed: int = 7
    time_limit: float = 600.0

    def __post_init__(self) -> None:
        if self.accounts < 2 or self.processes < 1 or self.threads < 1:
            raise ValueError(f"need at least 2 accounts, 1 process and 1 thread: {self}")
        if self.transactions < 0 or self.warmup < 0 or self.time_limit <= 0:
            raise ValueError(f"transactions and warmup must be >= 0 and the time limit > 0: {self}")

    @property
    def hotspot(self) -> int:
        """Customers in the hotspot: ``0 .. hotspot-1``."""
        return min(self.accounts, max(2, int(self.accounts * self.hotspot_fraction)))

    @property
    def workers(self) -> int:
        """Worker threads in all: ``processes x threads`` (each one operation in flight)."""
        return self.processes * self.threads

    def share(self, total: int, worker: int) -> int:
        """The draws of worker thread ``worker`` (0 .. workers-1) out of ``total``."""
        return total // self.workers + (1 if worker < total % self.workers else 0)

    def describe(self) -> str:
        """The load, one line."""
        return (
            f"SmallBank (BenchBase mix), {self.accounts} customers, "
            f"{self.hotspot_probability:.0%} of picks on a hotspot of {self.hotspot}; closed loop, "
            f"{self.processes} process(es) x {self.threads} thread(s) = {self.workers} in flight"
        )


class Op(NamedTuple):
    """One draw of the mix: the operation, its customers (in the operation's order), its amount."""

    name: str
    custids: tuple[int, ...]
    amount: int = 0


class Mix:
    """Draws operations as the ledger example's ``SmallBankWorkload`` does.

    Args:
        options: the run's customers and hotspot.
        rng: the thread's own seeded generator (draws are reproducible per thread).
    """

    def __init__(self, options: Options, rng: random.Random) -> None:
        self.options = options
        self.rng = rng

    def customer(self) -> int:
        """One customer: from the hotspot with ``hotspot_probability``, otherwise from all.

        Returns:
            A customer ID in ``0 .. accounts-1``.
        """
        if self.rng.random() < self.options.hotspot_probability:
            return self.rng.randrange(self.options.hotspot)
        return self.rng.randrange(self.options.accounts)

    def two_customers(self) -> tuple[int, int]:
        """Two different customers, for Amalgamate and SendPayment (first, second).

        Returns:
            The customer IDs, in the operation's order; the second redrawn until it differs (at most
            :data:`MAX_SECOND_DRAWS` times, then the next customer).
        """
        first = self.customer()
        for _ in range(MAX_SECOND_DRAWS):
            second = self.customer()
            if second != first:
                return first, second
        return first, (first + 1) % self.options.accounts

    def name(self) -> str:
        """The next operation's name, by the mix's weights (percent).

        Returns:
            A key of the ledger's ``MIX``.
        """
        pick = self.rng.randrange(100)
        for name, weight in MIX.items():
            if pick < weight:
                return name
            pick -= weight
        return "balance"

    def draw(self) -> Op:
        """The next operation: its name, its customers and its amount (the ledger's amounts).

        Returns:
            The operation; TransactSavings deposits or withdraws its amount with even odds.
        """
        name = self.name()
        if name == "amalgamate":
            return Op(name, self.two_customers())
        if name == "send_payment":
            return Op(name, self.two_customers(), SEND_PAYMENT)
        if name == "deposit_checking":
            return Op(name, (self.customer(),), DEPOSIT_CHECKING)
        if name == "transact_savings":
            custid = self.customer()
            return Op(name, (custid,), TRANSACT_SAVINGS if self.rng.random() < 0.5 else -TRANSACT_SAVINGS)
        if name == "write_check":
            return Op(name, (self.customer(),), WRITE_CHECK)
        return Op(name, (self.customer(),))


def opening_balances(options: Options) -> list[tuple[int, int]]:
    """Every customer's opening ``(savings, checking)`` in cents, 10,000..50,000 each.

    Args:
        options: the run (its ``accounts`` and ``seed``).

    Returns:
        One pair per customer, by customer ID; the same for the same seed.
    """
    rng = random.Random(options.seed)
    return [(rng.randint(10_000, 50_000), rng.randint(10_000, 50_000)) for _ in range(options.accounts)]


def parser(description: str | None) -> argparse.ArgumentParser:
    """The command line both SmallBank peers take (defaults: :class:`Options`').

    Args:
        description: the help's text (the peer's module docstring).

    Returns:
        A parser whose arguments :func:`options_of` turns into :class:`Options`.
    """
    defaults = Options()
    arguments = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    arguments.add_argument(
        "--transactions", type=int, default=defaults.transactions, help="measured draws of the mix"
    )
    arguments.add_argument("--processes", type=int, default=defaults.processes, help="worker processes")
    arguments.add_argument(
        "--threads", type=int, default=defaults.threads, help="threads per process, each a connection"
    )
    arguments.add_argument("--accounts", type=int, default=defaults.accounts, help="customers")
    arguments.add_argument(
        "--warmup", type=int, default=defaults.warmup, help="draws before the measured phase"
    )
    arguments.add_argument("--seed", type=int, default=defaults.seed, help="seed of balances and draws")
    arguments.add_argument(
        "--time-limit", type=float, default=defaults.time_limit, help="seconds of the measured phase, at most"
    )
    return arguments


def options_of(args: argparse.Namespace) -> Options:
    """The run's options from the parsed command line of :func:`parser`.

    Args:
        args: what ``parser(...).parse_args()`` returned.

    Returns:
        The options.

    Raises:
        ValueError: an option is out of range (see :class:`Options`).
    """
    return Options(
        transactions=args.transactions,
        processes=args.processes,
        threads=args.threads,
        accounts=args.accounts,
        warmup=args.warmup,
        seed=args.seed,
        time_limit=args.time_limit,
    )
