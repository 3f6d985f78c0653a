"""SQL framework apply throughput: log transactions applied per second into a database, one
database transaction per log transaction versus group apply (prints; fails only on wrong results).

The apply of docs/design/sql.md ("The apply contract", "Group apply"); the choices it measured:
docs/decisions/0024-staged-writes.md, docs/decisions/0025-mark-moved-first.md,
docs/decisions/0026-kept-connections.md, docs/decisions/0050-mark-moved-with-the-first-statement.md
and docs/decisions/0051-begin-in-the-lead-s-pipeline.md.

Creates a fresh database ``waltz_bench_<8 hex>`` on the server of ``--db`` (PostgreSQL or
MySQL/MariaDB; dropped at the end) or a fresh SQLite file, creates the framework's tables
(``migrations_api.upgrade``), and for each group size of ``--batch`` applies ``--n`` ready-made
transactions spread over ``--partitions`` partitions with an ``AbstractClientCallbacksForSQL``
subclass, one applier thread per partition as the client's apply workers do. Group size 1 calls
``apply_transaction`` for each transaction (lock the mark row, apply, move the mark, commit:
one database transaction each); a larger size calls ``apply_transactions`` with that many
consecutive transactions of the partition (one database transaction for the group).

Each transaction carries a 200-byte JSON payload ``{"account": k, "amount": a, "pad": ...}``;
``apply`` decodes it and, through the session with SQLAlchemy Core, runs ``UPDATE accounts SET
balance = balance + a WHERE id = k`` (one of 1,000 accounts; by default account k belongs to
partition k mod partitions, so partitions never touch the same rows; ``--shared-accounts`` lets
every partition update every account) and ``INSERT`` of one history row keyed by (partition,
transaction ID). Every group size runs on tables of its own under a cluster name of its own.

``--style`` chooses how ``apply`` writes: ``plain`` executes the UPDATE and the INSERT (a round
trip each), ``staged`` stages them with ``ApplySession.stage`` (one ``executemany`` per statement
for a whole group, the UPDATE checked to change exactly one row per transaction); both by default.

Printed per style and group size: log transactions applied/s, database transactions committed/s, p50/p99
latency of one apply call (``apply_transaction`` or ``apply_transactions``), and the transient
database errors the framework retried. After each run the marks must be n/partitions - 1 in
every partition, the history must hold n rows and every balance must be the sum of its amounts;
otherwise the benchmark exits with an error.

With ``--through-cluster`` it also starts a LocalCluster (its own ZooKeeper, 3 storage nodes, 1
server, ``--partitions`` partitions), writes the n transactions with one WaltzClient, and then
times how long a second WaltzClient with the SQL callbacks (``client.maxApplyBatchSize`` each of
``--cluster-batch``) takes to catch up from -1 (the applying client fetches each transaction's
data from the server, as any client that did not write them does).

With ``--db-delay MS`` the framework reaches the database through a forwarding proxy (the chaos
tools' ``FaultProxy``, in a process of its own) that holds every chunk MS milliseconds in each
direction: a database server on another host, where every round trip costs about 2 x MS more
(plus the proxy's own hop), rather than one on loopback.

    .venv/bin/python -m benchmarks.sql_apply                              # PostgreSQL, n 20,000
    .venv/bin/python -m benchmarks.sql_apply --db mysql+pymysql://root@127.0.0.1:3306 --n 8000
    .venv/bin/python -m benchmarks.sql_apply --db sqlite:////tmp/bench.db --batch 1,10,100,1000
    .venv/bin/python -m benchmarks.sql_apply --n 4000 --through-cluster
    .venv/bin/python -m benchmarks.sql_apply --n 3000 --batch 1,100 --style staged --db-delay 0.25
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    bindparam,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from benchmarks.databases import delayed, fresh_database
from waltz.client.transaction import Transaction
from waltz.jdbc_style import AbstractClientCallbacksForSQL, ApplySession, create_framework_engine
from waltz.jdbc_style.migrations_api import upgrade
from waltz.protocol.records import ReqId

ACCOUNTS = 1_000
PAYLOAD_BYTES = 200
DEFAULT_DB = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


# ---- the application: tables, payloads, callbacks ----


def bench_tables(run: str) -> tuple[MetaData, Table, Table]:
    """The accounts and history tables of one run (fresh tables for every group size)."""
    metadata = MetaData()
    accounts = Table(
        f"bench_accounts_{run}",
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("balance", BigInteger, nullable=False),
    )
    history = Table(
        f"bench_history_{run}",
        metadata,
        Column("partition_id", Integer, nullable=False),
        Column("transaction_id", BigInteger, nullable=False),
        Column("account", Integer, nullable=False),
        Column("amount", Integer, nullable=False),
        PrimaryKeyConstraint("partition_id", "transaction_id"),
    )
    return metadata, accounts, history


def payload(account: int, amount: int) -> bytes:
    """``{"account": .., "amount": .., "pad": "xx.."}`` of exactly PAYLOAD_BYTES bytes."""
    empty = json.dumps({"account": account, "amount": amount, "pad": ""}, separators=(",", ":"))
    return json.dumps(
        {"account": account, "amount": amount, "pad": "x" * (PAYLOAD_BYTES - len(empty))},
        separators=(",", ":"),
    ).encode()


def make_payloads(n: int, partitions: int, shared: bool, seed: int = 1) -> list[bytes]:
    """Payload i belongs to partition i mod partitions (and, unless shared, so does its account)."""
    rng = random.Random(seed)
    result = []
    for i in range(n):
        partition = i % partitions
        if shared:
            account = rng.randrange(ACCOUNTS)
        else:
            account = partition + partitions * rng.randrange((ACCOUNTS - 1 - partition) // partitions + 1)
        result.append(payload(account, rng.randint(1, 100)))
    return result


#: How ``apply`` writes: ``plain`` executes its two statements (a round trip each, what a
#: SQLAlchemy user writes by habit); ``staged`` stages them (``ApplySession.stage``: one
#: ``executemany`` per statement for a whole group).
STYLES = ("plain", "staged")


class AccountCallbacks(AbstractClientCallbacksForSQL):
    """Applies a payload: one UPDATE of the account's balance and one INSERT into the history.

    Args:
        engine: the framework's engine on the run's database.
        cluster_name: the run's cluster name (its own mark rows).
        accounts: the run's accounts table.
        history: the run's history table.
        style: ``plain`` (execute each statement) or ``staged`` (``ApplySession.stage``).
    """

    def __init__(
        self, engine: Engine, *, cluster_name: str, accounts: Table, history: Table, style: str = "plain"
    ) -> None:
        super().__init__(engine, cluster_name=cluster_name)
        self.accounts = accounts
        self.history = history
        self.style = style
        # Built once, so that every parameter set of a group shares one compiled statement.
        self.deposit = (
            update(accounts)
            .where(accounts.c.id == bindparam("k"))
            .values(balance=accounts.c.balance + bindparam("a"))
        )
        self.record = insert(history)
        self.errors: list[str] = []
        self.fetch_seconds: dict[int, float] = collections.defaultdict(float)
        """Per partition, seconds spent getting transaction data (an RPC through a cluster)."""

    def apply(self, transaction: Transaction, session: Session) -> None:
        """Apply one transaction's payload (docs/design/sql.md, "The apply contract").

        Args:
            transaction: the log transaction; its data is the JSON payload.
            session: the apply's session (an ``ApplySession``, for ``staged``).

        Raises:
            LookupError: ``plain``: the account does not exist (``staged`` checks the row count).
        """
        began = time.perf_counter()
        raw = transaction.get_raw_data()
        self.fetch_seconds[transaction.partition_id] += time.perf_counter() - began
        data = json.loads(raw)
        account, amount = data["account"], data["amount"]
        if self.style == "staged":
            assert isinstance(session, ApplySession)
            session.stage(self.deposit, {"k": account, "a": amount}, rows=1)  # the account must exist
            session.stage(
                self.record,
                {
                    "partition_id": transaction.partition_id,
                    "transaction_id": transaction.transaction_id,
                    "account": account,
                    "amount": amount,
                },
            )
            return
        accounts = self.accounts
        result = session.execute(
            update(accounts).where(accounts.c.id == account).values(balance=accounts.c.balance + amount)
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            raise LookupError(f"account {account} does not exist")
        session.execute(
            insert(self.history).values(
                partition_id=transaction.partition_id,
                transaction_id=transaction.transaction_id,
                account=account,
                amount=amount,
            )
        )

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        """Record an apply that failed for good (the run then fails its check).

        Args:
            partition_id: the partition.
            transaction_id: the transaction.
            exception: what its apply raised.
        """
        message = f"partition {partition_id} transaction {transaction_id}: {exception!r}"
        self.errors.append(message)
        print(f"uncaught exception in {message}", file=sys.stderr)


def create_run_tables(engine: Engine, run: str) -> tuple[Table, Table]:
    """Create one run's accounts and history tables, with every account at a balance of 0.

    Args:
        engine: the run's database.
        run: the run's name (a suffix of the tables' names).

    Returns:
        The accounts and history tables.
    """
    metadata, accounts, history = bench_tables(run)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(accounts), [{"id": k, "balance": 0} for k in range(ACCOUNTS)])
    return accounts, history


def verify(
    callbacks: AccountCallbacks, n: int, partitions: int, payloads: Sequence[bytes], label: str
) -> None:
    """Marks n/partitions - 1 everywhere, n history rows, balances = sums of amounts; else exit."""
    problems = []
    expected_mark = n // partitions - 1
    marks = callbacks.high_water_marks()
    wrong = {p: marks.get(p) for p in range(partitions) if marks.get(p) != expected_mark}
    if wrong:
        problems.append(f"marks {wrong} (expected {expected_mark} in every partition)")
    expected_balance = [0] * ACCOUNTS
    for data in payloads:
        decoded = json.loads(data)
        expected_balance[decoded["account"]] += decoded["amount"]
    with callbacks.engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(callbacks.history)).scalar_one()
        balances = dict(conn.execute(select(callbacks.accounts.c.id, callbacks.accounts.c.balance)).all())
    if rows != n:
        problems.append(f"{rows} history rows (expected {n})")
    bad = [k for k in range(ACCOUNTS) if balances.get(k) != expected_balance[k]]
    if bad:
        k = bad[0]
        problems.append(
            f"{len(bad)} wrong balances (account {k}: {balances.get(k)}, expected {expected_balance[k]})"
        )
    if callbacks.errors:
        problems.append(f"{len(callbacks.errors)} uncaught exceptions, first: {callbacks.errors[0]}")
    if problems:
        sys.exit(f"VERIFICATION FAILED for {label}: " + "; ".join(problems))


# ---- counting what the framework does ----


class FrameworkLog(logging.Handler):
    """Counts the framework's retries of transient errors and its group-apply fallbacks."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.retries = 0
        self.fallbacks = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Count a retry or a fallback the framework logged (other records are left alone).

        Args:
            record: a record of ``waltz.jdbc_style.callbacks``.
        """
        message = record.getMessage()
        if message.startswith("transient database error"):
            self.retries += 1
        elif "group apply" in message:
            self.fallbacks += 1
        else:
            return
        if len(self.first) < 3:
            self.first.append(message)

    def reset(self) -> None:
        """Start counting again (the first messages are kept)."""
        self.retries = self.fallbacks = 0


class Commits:
    """Database commits and rollbacks on an engine (SQLAlchemy events).

    Args:
        engine: the engine to count on.
    """

    def __init__(self, engine: Engine) -> None:
        self._commits = itertools.count()
        self._rollbacks = itertools.count()
        self.commits_base = self.rollbacks_base = 0
        event.listen(engine, "commit", lambda conn: next(self._commits))
        event.listen(engine, "rollback", lambda conn: next(self._rollbacks))

    def reset(self) -> None:
        """Start counting again from now."""
        self.commits_base = next(self._commits) + 1
        self.rollbacks_base = next(self._rollbacks) + 1

    def counts(self) -> tuple[int, int]:
        """(commits, rollbacks) since :meth:`reset`."""
        return next(self._commits) - self.commits_base, next(self._rollbacks) - self.rollbacks_base


# ---- direct apply ----


@dataclass
class Result:
    """What one style and group size did.

    Attributes:
        label: the style and group size, e.g. ``staged batch 100``.
        seconds: wall time of the run.
        transactions: log transactions applied.
        commits: database commits.
        rollbacks: database rollbacks.
        retries: transient errors the framework retried.
        fallbacks: groups the framework applied again one by one.
        fetch_seconds: thread-seconds spent getting transaction data.
        latencies: each apply call's seconds.
    """

    label: str
    seconds: float
    transactions: int
    commits: int
    rollbacks: int
    retries: int
    fallbacks: int
    fetch_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def percentile(self, p: float) -> float:
        """A percentile of the apply calls' latencies, in milliseconds.

        Args:
            p: the quantile, 0 to 1.

        Returns:
            The percentile, NaN without latencies.
        """
        lat = sorted(self.latencies)
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")


def make_transactions(payloads: Sequence[bytes], partitions: int) -> list[list[Transaction]]:
    """Per partition, its transactions with IDs 0, 1, ... (payload i goes to partition i mod P)."""
    per_partition: list[list[Transaction]] = [[] for _ in range(partitions)]
    for i, data in enumerate(payloads):
        p = i % partitions
        tid = len(per_partition[p])
        per_partition[p].append(Transaction(p, tid, ReqId(1, 1, p, tid), 0, None, data))
    return per_partition


def run_direct(
    engine: Engine,
    run: str,
    batch: int,
    transactions: list[list[Transaction]],
    payloads: Sequence[bytes],
    counters: tuple[Commits, FrameworkLog],
    style: str = "plain",
) -> Result:
    """Apply every partition's transactions on a thread each, in groups of ``batch``."""
    commits, framework_log = counters
    partitions = len(transactions)
    accounts, history = create_run_tables(engine, run)
    callbacks = AccountCallbacks(
        engine, cluster_name=f"bench-{run}", accounts=accounts, history=history, style=style
    )
    for p in range(partitions):  # as the client does when it mounts a partition
        if (mark := callbacks.get_client_high_water_mark(p)) != -1:
            sys.exit(f"partition {p} starts at mark {mark}, not -1")
    latencies: list[list[float]] = [[] for _ in range(partitions)]
    failures: list[BaseException] = []
    barrier = threading.Barrier(partitions + 1)

    def worker(p: int) -> None:
        mine = transactions[p]
        lat = latencies[p]
        barrier.wait()
        try:
            for start in range(0, len(mine), batch):
                began = time.perf_counter()
                if batch == 1:
                    callbacks.apply_transaction(mine[start])
                else:
                    callbacks.apply_transactions(mine[start : start + batch])
                lat.append(time.perf_counter() - began)
        except BaseException as exc:
            failures.append(exc)
            raise

    threads = [threading.Thread(target=worker, args=(p,), name=f"apply-{p}") for p in range(partitions)]
    for thread in threads:
        thread.start()
    commits.reset()
    framework_log.reset()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    n = sum(len(t) for t in transactions)
    committed, rolled_back = commits.counts()
    if failures:
        sys.exit(f"{style} batch {batch}: an apply failed: {failures[0]!r}")
    verify(callbacks, n, partitions, payloads, f"{style} batch {batch}")
    return Result(
        label=f"{style} batch {batch}",
        seconds=seconds,
        transactions=n,
        commits=committed,
        rollbacks=rolled_back,
        retries=framework_log.retries,
        fallbacks=framework_log.fallbacks,
        latencies=[x for lat in latencies for x in lat],
    )


# ---- through a local cluster ----


def run_through_cluster(
    engine: Engine,
    args: argparse.Namespace,
    payloads: Sequence[bytes],
    counters: tuple[Commits, FrameworkLog],
) -> list[Result]:
    """Write the payloads through a LocalCluster, then time SQL-applying clients catching up."""
    from waltz import (
        TransactionBuilder,
        TransactionContext,
        WaltzClient,
        WaltzClientCallbacks,
        WaltzClientConfig,
    )
    from waltz.local.cluster import LocalCluster
    from waltz.local.options import SecurityOptions

    class MemoryMarks(WaltzClientCallbacks):
        def __init__(self) -> None:
            self.marks: dict[int, int] = {}

        def get_client_high_water_mark(self, partition_id: int) -> int:
            return self.marks.get(partition_id, -1)

        def apply_transaction(self, transaction: Transaction) -> None:
            self.marks[transaction.partition_id] = transaction.transaction_id

        def uncaught_exception(
            self, partition_id: int, transaction_id: int, exception: BaseException
        ) -> None:
            print(f"writer: uncaught in {partition_id}/{transaction_id}: {exception!r}", file=sys.stderr)

    class Write(TransactionContext):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

        def partition_id(self, num_partitions: int) -> int:
            return self.index % num_partitions

        def execute(self, builder: TransactionBuilder) -> bool:
            builder.set_raw_data(payloads[self.index])
            return True

    commits, framework_log = counters
    partitions = args.partitions
    results = []
    print(f"starting a LocalCluster (3 storage nodes, 1 server, {partitions} partitions) ...", flush=True)
    # The protocol's figures, comparable with the earlier runs: plaintext, on purpose (what TLS
    # costs: benchmarks/tls_cost.py; decision 0065).
    with LocalCluster(
        storages=3, servers=1, partitions=partitions, security=SecurityOptions.plaintext()
    ) as cluster:
        base: dict[str, Any] = {
            "zookeeper_connect_string": cluster.zookeeper_connect_string,
            "cluster_root": cluster.root,
        }
        started = time.perf_counter()
        with WaltzClient(MemoryMarks(), WaltzClientConfig(**base)) as writer:
            writer.wait_mounted(30)
            futures = [writer.submit(Write(i)) for i in range(len(payloads))]
            for future in futures:
                future.result(300)
        print(
            f"wrote {len(payloads):,} transactions in {time.perf_counter() - started:.1f}s",
            flush=True,
        )
        for index, batch in enumerate(args.cluster_batch):
            run = f"c{index}_b{batch}"
            accounts, history = create_run_tables(engine, run)
            callbacks = AccountCallbacks(
                engine, cluster_name=f"bench-{run}", accounts=accounts, history=history, style=args.style[-1]
            )
            config = WaltzClientConfig(**base, client_max_apply_batch_size=batch)
            commits.reset()
            framework_log.reset()
            started = time.perf_counter()
            with WaltzClient(callbacks, config) as reader:
                last = len(payloads) // partitions - 1
                for p in range(partitions):  # the client's applied marks (wait_for would poll the DB)
                    if not reader.wait_applied(p, last, timeout=600):
                        sys.exit(f"cluster batch {batch}: partition {p} did not reach {last} in 600 s")
                seconds = time.perf_counter() - started
                committed, rolled_back = commits.counts()
            verify(callbacks, len(payloads), partitions, payloads, f"cluster batch {batch}")
            results.append(
                Result(
                    label=f"cluster maxApplyBatchSize {batch}",
                    seconds=seconds,
                    transactions=len(payloads),
                    commits=committed,
                    rollbacks=rolled_back,
                    retries=framework_log.retries,
                    fallbacks=framework_log.fallbacks,
                    fetch_seconds=sum(callbacks.fetch_seconds.values()),
                )
            )
            print_result(results[-1])
    return results


# ---- main ----


def int_list(text_value: str) -> list[int]:
    """Parse ``1,10,100``: positive integers separated by commas.

    Args:
        text_value: the option's text.

    Returns:
        The integers.

    Raises:
        argparse.ArgumentTypeError: not positive integers.
    """
    values = [int(x) for x in text_value.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive integers separated by commas, got {text_value!r}"
        )
    return values


def print_result(result: Result) -> None:
    """Print one run's line: applied and committed per second, latencies, retries.

    Args:
        result: the run.
    """
    latency = (
        f"; per call p50 {result.percentile(0.5):.2f} ms, p99 {result.percentile(0.99):.2f} ms"
        if result.latencies
        else ""
    )
    fetch = (
        f"; getting data {result.fetch_seconds:.1f} thread-seconds "
        f"({result.fetch_seconds / result.transactions * 1000:.2f} ms per transaction)"
        if result.fetch_seconds >= 0.05
        else ""
    )
    print(
        f"{result.label}: {result.transactions / result.seconds:,.0f} transactions/s, "
        f"{result.commits / result.seconds:,.0f} DB commits/s ({result.seconds:.2f}s){latency}{fetch}; "
        f"retries {result.retries}, group fallbacks {result.fallbacks}, rollbacks {result.rollbacks}",
        flush=True,
    )


def print_table(backend: str, results: Sequence[Result]) -> None:
    """Print the table of every run.

    Args:
        backend: the database's name, the table's first column.
        results: the runs.
    """
    print()
    print(
        f"{'backend':<11} {'mode':<30} {'txns/s':>9} {'DB txns/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'retries':>7} {'secs':>7}"
    )
    for r in results:
        p50, p99 = (f"{r.percentile(q):.2f}" if r.latencies else "-" for q in (0.5, 0.99))
        print(
            f"{backend:<11} {r.label:<30} {r.transactions / r.seconds:>9,.0f} "
            f"{r.commits / r.seconds:>10,.0f} {p50:>8} {p99:>8} {r.retries:>7} {r.seconds:>7.2f}"
        )


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--db",
        default=DEFAULT_DB,
        help="server URL (a fresh database is created on it and dropped) or sqlite:///new-file.db",
    )
    parser.add_argument(
        "--n", type=int, default=20_000, help="transactions in all (a multiple of --partitions)"
    )
    parser.add_argument("--partitions", type=int, default=4, help="partitions, one applier thread each")
    parser.add_argument(
        "--batch", type=int_list, default=[1, 10, 100], help="group sizes to try (1: apply_transaction each)"
    )
    parser.add_argument(
        "--style",
        type=lambda text: [s for s in text.split(",") if s],
        default=list(STYLES),
        help="how apply writes: plain (a round trip per statement), staged (ApplySession.stage); "
        "--through-cluster uses the last",
    )
    parser.add_argument(
        "--shared-accounts",
        action="store_true",
        help="every partition updates any account (row lock contention across partitions)",
    )
    parser.add_argument(
        "--through-cluster", action="store_true", help="also apply through a LocalCluster and a WaltzClient"
    )
    parser.add_argument(
        "--cluster-batch",
        type=int_list,
        default=[1, 100],
        help="client.maxApplyBatchSize values for --through-cluster",
    )
    parser.add_argument(
        "--db-delay",
        type=float,
        default=0.0,
        metavar="MS",
        help="reach the database through a proxy that adds MS milliseconds each way (a remote server)",
    )
    args = parser.parse_args()
    if args.partitions < 1 or args.n < args.partitions or args.n % args.partitions:
        parser.error("--n must be a positive multiple of --partitions")
    print("command:", " ".join(sys.argv))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    framework_log = FrameworkLog()
    framework_logger = logging.getLogger("waltz.jdbc_style.callbacks")
    framework_logger.setLevel(logging.INFO)
    framework_logger.addHandler(framework_log)
    framework_logger.propagate = False

    payloads = make_payloads(args.n, args.partitions, args.shared_accounts)
    transactions = make_transactions(payloads, args.partitions)
    results: list[Result] = []
    with fresh_database(args.db) as created, delayed(created, args.db_delay) as url:
        engine = create_framework_engine(url)
        backend = engine.dialect.name
        try:
            upgrade(engine)
            connections = [engine.connect() for _ in range(args.partitions)]  # fill the pool
            server_version = connections[0].dialect.server_version_info
            for conn in connections:
                conn.close()
            print(
                f"{backend} {'.'.join(map(str, server_version or ()))} at "
                f"{make_url(url).render_as_string(hide_password=True)}; n={args.n:,} "
                f"partitions={args.partitions} payload={PAYLOAD_BYTES}B accounts={ACCOUNTS} "
                f"({'shared by' if args.shared_accounts else 'disjoint between'} partitions); "
                f"cpus={os.cpu_count()} load={' '.join(f'{x:.1f}' for x in os.getloadavg())}",
                flush=True,
            )
            counters = (Commits(engine), framework_log)
            for style in args.style:
                for index, batch in enumerate(args.batch):
                    run = f"r{index}_b{batch}_{style}"
                    result = run_direct(engine, run, batch, transactions, payloads, counters, style)
                    print_result(result)
                    results.append(result)
            if args.through_cluster:
                results.extend(run_through_cluster(engine, args, payloads, counters))
        finally:
            engine.dispose()
    print_table(backend, results)
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if framework_log.first:
        print("framework log (first messages):", *framework_log.first, sep="\n  ")
    print("verified: marks, history rows and balances correct after every run")


if __name__ == "__main__":
    main()
