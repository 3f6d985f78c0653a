"""The ledger example against a real local cluster: its rules and its transfers."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, insert, select, update

from waltz import Outcome, OutcomeKind, WaltzClientConfig
from waltz.errors import CrossPartitionError
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.workloads.checks import Check, check_application
from waltz_examples.ledger.checks import ROWS_CHECK
from waltz_examples.ledger.models import Checking, TransferIn, TransferOut, applied_transactions
from waltz_examples.ledger.operations import DepositChecking
from waltz_examples.ledger.service import LedgerService, prepare_database
from waltz_examples.ledger.smallbank import SMALLBANK
from waltz_examples.ledger.transfers import (
    CreditTransfer,
    CreditTransfers,
    RefundTransfers,
    SettleTransfers,
    money_in_flight,
    pending_transfers,
)


def service(config: WaltzClientConfig, db_url: str, cluster_name: str, **options: Any) -> LedgerService:
    """A ledger instance on the test's database, its marks under ``cluster_name``."""
    return LedgerService.from_config(db_url, config, cluster_name=cluster_name, prepare=False, **options)


def wait_settled(ledger: LedgerService, transfer_id: str) -> str:
    def status() -> str | None:
        with ledger.engine.connect() as conn:
            value = conn.execute(
                select(TransferOut.status).where(TransferOut.transfer_id == transfer_id)
            ).scalar()
        return None if value in (None, "pending") else str(value)

    wait_until(lambda: status() is not None, timeout=30, what=f"transfer {transfer_id} to settle")
    result = status()
    assert result is not None
    return result


def failed_checks(ledger: LedgerService, cluster: LocalCluster, cluster_name: str) -> list[Check]:
    """The checks the tools run after a workload (:mod:`waltz.workloads.checks`, the ledger's
    invariants among them) that fail, once ``ledger`` applied the log up to the servers' marks.
    The database applied the whole shared log, so they hold over all of it."""
    marks = {p: ledger.client.get_high_water_mark(p) for p in range(ledger.num_partitions)}
    for pid, mark in marks.items():
        assert mark < 0 or ledger.callbacks.wait_for(pid, mark, 30)
    checks = check_application(
        SMALLBANK,
        ledger.engine,
        cluster_name=cluster_name,
        server_marks=marks,
        client_config=WaltzClientConfig(**cluster.client_settings()),
    )
    return [c for c in checks if not c.passed]


def test_the_bank_operations_keep_their_rules(
    ledger_cluster: LocalCluster, ledger_config: WaltzClientConfig, ledger_db: str
) -> None:
    # The log is shared by the ledger's tests (a fresh database replays all of it): customers of
    # this test are b+1, b+2, b+5 for a fresh b, a multiple of the partitions (4), so that b+1 and
    # b+5 share a partition and b+2 is in another.
    name = f"bank-{os.urandom(4).hex()}"
    b = random.randrange(1, 10**9) * ledger_cluster.num_partitions
    one, two, five = b + 1, b + 2, b + 5
    with service(ledger_config, ledger_db, name) as ledger:
        for custid in (one, two, five):
            assert ledger.open_account(custid, f"c{custid}", savings=1000, checking=1000).committed
        assert not ledger.open_account(one, "again").committed

        deposit = ledger.deposit(one, 500)
        assert ledger.balance(one, wait_for=deposit) == (1000, 1500)
        refused = ledger.withdraw(one, 10_000)
        assert not refused.committed and "insufficient funds" in (refused.reason or "")
        check = ledger.write_check(five, 2500)  # savings + checking = 2000 < 2500: penalty of 1
        assert ledger.balance(five, wait_for=check) == (1000, 1000 - 2501)
        assert not ledger.transact_savings(two, -5000).committed  # savings never below zero

        same = ledger.transfer(one, five, 300)  # one partition: one transaction
        assert same.committed and same.transfer_id is None
        assert ledger.balance(five, wait_for=same) == (1000, -1501 + 300)

        across = ledger.transfer(one, two, 200)  # two partitions: debit now, credit by the sweeper
        assert across.committed and across.transfer_id is not None
        assert wait_settled(ledger, across.transfer_id) == "credited"
        assert ledger.balance(one) == (1000, 1500 - 300 - 200)
        assert ledger.balance(two) == (1000, 1200)

        assert ledger.deactivate(two).committed
        refunded = ledger.transfer(one, two, 100)  # the credit is rejected: the money comes back
        assert refunded.transfer_id is not None
        assert wait_settled(ledger, refunded.transfer_id) == "refunded"
        assert ledger.balance(one) == (1000, 1000)
        assert not ledger.deposit(two, 1).committed  # closed

        wait_until(lambda: money_in_flight(ledger.engine) == 0, timeout=30, what="no money in flight")
        assert failed_checks(ledger, ledger_cluster, name) == []
        assert ledger.callbacks.uncaught_count == 0


@pytest.mark.parametrize("ledger_db", ["postgresql"], indirect=True)
def test_arguments_and_balances_the_database_cannot_store_never_reach_the_log(
    ledger_cluster: LocalCluster, ledger_config: WaltzClientConfig, ledger_db: str
) -> None:
    """An amount past BIGINT, a bool or float amount, a holder's name too long, with NUL or not a
    str are refused before anything is submitted; a deposit or savings transaction whose new
    balance would pass BIGINT is dropped by its rule. Nothing reaches the log (the partition's
    high-water mark stays), so no apply fails for ever: the next deposit is applied and read."""
    name = f"poison-{os.urandom(4).hex()}"
    b = random.randrange(1, 10**9) * ledger_cluster.num_partitions
    one, new = b + 1, b + 5  # one partition
    with service(ledger_config, ledger_db, name) as ledger:
        opened = ledger.open_account(one, "alice", savings=100, checking=100)
        assert opened.committed and opened.transaction_id is not None
        mark = ledger.client.get_high_water_mark(opened.partition_id)
        refused: list[tuple[Any, str]] = [
            (lambda: ledger.deposit(one, 2**63), "deposit amount"),
            (lambda: ledger.deposit(one, True), "deposit amount"),
            (lambda: ledger.deposit(one, 0.5), "deposit amount"),  # type: ignore[arg-type]
            (lambda: ledger.withdraw(one, 10**30), "withdrawal amount"),
            (lambda: ledger.transact_savings(one, -(2**63)), "savings amount"),
            (lambda: ledger.transfer(one, new, 2**64), "payment amount"),
            (lambda: ledger.transfer(one, b + 2, 2**64), "payment amount"),  # across partitions
            (lambda: ledger.open_account(new, "x" * 65), "name"),
            (lambda: ledger.open_account(new, "bob\x00"), "name"),
            (lambda: ledger.open_account(new, "\ud800"), "name"),
            (lambda: ledger.open_account(new, 7), "name"),  # type: ignore[arg-type]
            (lambda: ledger.open_account(new, "bob", 2**63 - 1, 1), r"savings \+ checking"),
            (lambda: ledger.open_account(2**63, "bob"), "custid"),
        ]
        for call, argument in refused:
            with pytest.raises(ValueError, match=argument):
                call()
        for dropped in (ledger.deposit(one, 2**63 - 1), ledger.transact_savings(one, 2**63 - 1)):
            assert not dropped.committed and "outside the columns' range" in (dropped.reason or ""), dropped
        assert ledger.client.get_high_water_mark(opened.partition_id) == mark
        assert ledger.open_account(new, "b" * 64).committed  # 64 characters fit

        deposit = ledger.deposit(one, 1)
        assert deposit.committed
        assert ledger.balance(one, wait_for=deposit, timeout=30) == (100, 101)
        assert ledger.callbacks.uncaught_count == 0


def test_a_batched_run_on_a_hot_customer_passes_every_check(
    ledger_cluster: LocalCluster, ledger_config: WaltzClientConfig, ledger_db: str
) -> None:
    """Deposits, payments and transfers on one hot customer, submitted together through the
    service's ``EntityBatcher`` (docs/sql.md "Batching entity transactions"): they go as batched
    log transactions, each member recorded once in ``ledger_applied_transactions`` under its
    place, and every check passes; a member's row missing, or one too many, fails the check of
    each (transaction, member) applied exactly once, naming it."""
    name = f"batch-{os.urandom(4).hex()}"
    b = random.randrange(1, 10**9) * ledger_cluster.num_partitions
    hot, near, far = b + 1, b + 5, b + 2  # near shares hot's partition, far is in another
    with service(ledger_config, ledger_db, name, batch=True) as ledger:
        for custid in (hot, near, far):
            assert ledger.open_account(custid, f"c{custid}", savings=1000, checking=1000).committed
        operations: list[Any] = []
        for i in range(60):
            if i % 3 == 0:
                operations.append(DepositChecking(ledger.callbacks, hot, 10 + i))
            elif i % 3 == 1:
                operations.append(ledger.payment(hot, near, 1))  # one transaction
            else:
                operations.append(ledger.payment(hot, far, 2))  # a transfer: debit, then credit
        futures = [ledger.submit(operation) for operation in operations]
        outcomes = [future.result(60) for future in futures]
        assert all(outcome.committed for outcome in outcomes), [o for o in outcomes if not o.committed]
        batches, members = ledger.batch_counts()
        assert batches > 0 and members > batches, (batches, members)

        for outcome in outcomes:  # every debit applied: its outbox row is there
            assert outcome.transaction_id is not None
            assert ledger.callbacks.wait_for(outcome.partition_id, outcome.transaction_id, 30)
        wait_until(lambda: pending_transfers(ledger.engine) == 0, timeout=60, what="no transfer pending")
        failed = failed_checks(ledger, ledger_cluster, name)
        assert failed == [], "\n".join(map(str, failed))
        assert ledger.balance(hot) == (1000, 1000 + sum(10 + i for i in range(0, 60, 3)) - 20 - 40)
        assert ledger.callbacks.uncaught_count == 0

        t = applied_transactions.c
        with ledger.engine.connect() as conn:
            p, tid, last = conn.execute(
                select(t.partition_id, t.transaction_id, func.max(t.member))
                .group_by(t.partition_id, t.transaction_id)
                .having(func.max(t.member) > 0)
                .limit(1)
            ).one()
            op = conn.execute(select(t.op).where(t.partition_id == p, t.transaction_id == tid)).scalar()
        with ledger.engine.begin() as conn:  # a member applied twice: one row too many
            conn.execute(insert(applied_transactions).values(
                partition_id=p, transaction_id=tid, member=last + 1, op=op, delta=0
            ))  # fmt: skip
        failed = failed_checks(ledger, ledger_cluster, name)
        assert [c.name for c in failed] == ["every (transaction, member) applied exactly once"], failed
        assert f"extra [({tid}, {last + 1})] (1)" in failed[0].detail, failed[0].detail
        with ledger.engine.begin() as conn:  # a member never applied: its row missing
            conn.execute(
                delete(applied_transactions).where(
                    t.partition_id == p, t.transaction_id == tid, t.member.in_([1, last + 1])
                )
            )
        failed = failed_checks(ledger, ledger_cluster, name)  # money conserved fails too: a delta lost
        once = [c for c in failed if c.name == "every (transaction, member) applied exactly once"]
        assert once and f"missing [({tid}, 1)] (1), extra [] (0)" in once[0].detail, failed


def test_the_checks_find_a_database_that_differs_from_the_log_row_by_row(
    ledger_cluster: LocalCluster, ledger_config: WaltzClientConfig, ledger_db: str
) -> None:
    """A finished database edited behind the log so that every sum still agrees (a credited
    transfer there twice, one lost, money moved between two customers, each with the balances
    moved to match) fails the row check, naming the rows; as applied, and once each edit is
    undone, it passes every check."""
    name = f"rows-{os.urandom(4).hex()}"
    b = random.randrange(1, 10**9) * ledger_cluster.num_partitions
    one, two = b + 1, b + 2  # two partitions: the transfer is debited, then credited
    with service(ledger_config, ledger_db, name) as ledger:
        for custid in (one, two):
            assert ledger.open_account(custid, f"c{custid}", savings=1000, checking=1000).committed
        assert ledger.deposit(one, 50).committed
        across = ledger.transfer(one, two, 200)
        assert across.committed and across.transfer_id is not None
        tid = across.transfer_id
        assert wait_settled(ledger, tid) == "credited"
        wait_until(lambda: money_in_flight(ledger.engine) == 0, timeout=30, what="no money in flight")
        assert failed_checks(ledger, ledger_cluster, name) == []

        def move(conn: Any, source: int, target: int, amount: int) -> None:
            debit = Checking.balance - amount
            conn.execute(update(Checking).where(Checking.custid == source).values(balance=debit))
            conn.execute(
                update(Checking).where(Checking.custid == target).values(balance=Checking.balance + amount)
            )

        def only_rows_check_fails(*named: str) -> None:
            failed = failed_checks(ledger, ledger_cluster, name)
            assert [c.name for c in failed] == [ROWS_CHECK], failed
            for text in named:
                assert text in failed[0].detail, (text, failed[0].detail)

        with ledger.engine.connect() as conn:
            out_row = conn.execute(select(TransferOut.__table__).where(TransferOut.transfer_id == tid)).one()
            in_row = conn.execute(select(TransferIn.__table__).where(TransferIn.transfer_id == tid)).one()
        assert out_row.status == in_row.status == "credited"

        dup = f"{tid[:29]}dup"  # the transfer a second time, under an ID of its own
        with ledger.engine.begin() as conn:
            conn.execute(insert(TransferOut).values({**out_row._asdict(), "transfer_id": dup}))
            conn.execute(insert(TransferIn).values({**in_row._asdict(), "transfer_id": dup}))
            move(conn, one, two, 200)
        only_rows_check_fails(
            f"ledger_checking custid={one}: balance {1050 - 400} in the database, {1050 - 200} by the log",
            f"ledger_checking custid={two}: balance {1400} in the database, {1200} by the log",
            f"ledger_transfers_out from_custid={one} transfer_id='{dup}': in the database, not in the log",
            f"ledger_transfers_in to_custid={two} transfer_id='{dup}': in the database, not in the log",
        )
        with ledger.engine.begin() as conn:
            conn.execute(delete(TransferOut).where(TransferOut.transfer_id == dup))
            conn.execute(delete(TransferIn).where(TransferIn.transfer_id == dup))
            move(conn, two, one, 200)
        assert failed_checks(ledger, ledger_cluster, name) == []

        with ledger.engine.begin() as conn:  # the transfer lost, its money back with the sender
            conn.execute(delete(TransferOut).where(TransferOut.transfer_id == tid))
            conn.execute(delete(TransferIn).where(TransferIn.transfer_id == tid))
            move(conn, two, one, 200)
        only_rows_check_fails(
            f"ledger_checking custid={one}: balance 1050 in the database, 850 by the log",
            f"ledger_transfers_out from_custid={one} transfer_id='{tid}': not in the database",
            f"ledger_transfers_in to_custid={two} transfer_id='{tid}': not in the database",
        )
        with ledger.engine.begin() as conn:
            conn.execute(insert(TransferOut).values(out_row._asdict()))
            conn.execute(insert(TransferIn).values(in_row._asdict()))
            move(conn, one, two, 200)
        assert failed_checks(ledger, ledger_cluster, name) == []

        with ledger.engine.begin() as conn:  # 100 cents from one to two, no transaction says so
            move(conn, one, two, 100)
        only_rows_check_fails(
            f"ledger_checking custid={one}: balance 750 in the database, 850 by the log",
            f"ledger_checking custid={two}: balance 1300 in the database, 1200 by the log",
        )
        with ledger.engine.begin() as conn:
            move(conn, two, one, 100)
        assert failed_checks(ledger, ledger_cluster, name) == []


def test_the_row_check_replays_the_log_as_the_apply_and_the_rebuild_do(tmp_path: Path) -> None:
    """The replay behind the row check, without a cluster: an account of schema version 1 upcast,
    a split's new partition's write kept over its parent's read after it, a delete removing the
    row, a change-set repeating an earlier one's idempotency key passed over; a database that
    differs fails naming the row."""
    from waltz.jdbc_style import ChangeSet, Operation, RowChange
    from waltz_examples.ledger.checks import LedgerInvariants
    from waltz_examples.ledger.models import Account, Savings

    def write(entity: str, key: dict[str, Any], values: dict[str, Any], version: int = 1) -> RowChange:
        return RowChange(Operation.UPDATE, entity, key, {**key, **values}, version)

    invariants = LedgerInvariants()
    one = {"custid": 1}
    transfer = {"from_custid": 2, "transfer_id": "t"}
    log = [
        (0, 0, ChangeSet([write("ledger.account", one, {"name": "a", "status": "open"})])),
        (0, 1, ChangeSet([write("ledger.savings", one, {"balance": 10})])),
        (2, 5, ChangeSet([write("ledger.checking", one, {"balance": 7})])),  # a split's child
        (0, 2, ChangeSet([write("ledger.checking", one, {"balance": 99})])),  # its parent, earlier
        (1, 0, ChangeSet([write("ledger.transfer_out", transfer, {"to_custid": 1, "amount": 1})])),
        (1, 1, ChangeSet([RowChange(Operation.DELETE, "ledger.transfer_out", transfer)])),
        (0, 3, ChangeSet([write("ledger.savings", one, {"balance": 20})], idempotency_key="k")),
        (0, 4, ChangeSet([write("ledger.savings", one, {"balance": 30})], idempotency_key="k")),
    ]
    for partition_id, transaction_id, change_set in log:
        invariants.observe_change_set(partition_id, transaction_id, change_set)
    engine = prepare_database(f"sqlite:///{tmp_path / 'ledger.db'}")
    with engine.begin() as conn:
        conn.execute(insert(Account).values(custid=1, holder="a", status="open", currency="USD"))
        conn.execute(insert(Savings).values(custid=1, balance=20))
        conn.execute(insert(Checking).values(custid=1, balance=7))

    def row_check() -> Check:
        return next(c for c in invariants.checks(engine) if c.name == ROWS_CHECK)

    assert row_check().passed, row_check().detail
    with engine.begin() as conn:
        conn.execute(update(Checking).where(Checking.custid == 1).values(balance=99))
        conn.execute(update(Account).where(Account.custid == 1).values(status="closed"))
    check = row_check()
    assert not check.passed
    assert check.detail == (
        "2 rows differ from the log's last write: ledger_accounts custid=1: status 'closed' in the "
        "database, 'open' by the log; ledger_checking custid=1: balance 99 in the database, 7 by the log"
    )
    engine.dispose()


def test_one_step_transaction_moves_several_transfers_each_once(
    ledger_cluster: LocalCluster, ledger_config: WaltzClientConfig, ledger_db: str
) -> None:
    """The sweeper's batched steps: a receiver of two credits gets both, a transfer credited
    already is left alone, rejected credits are refunded together, a step is dropped when every
    transfer is past it, and the money adds up."""
    name = f"steps-{os.urandom(4).hex()}"
    b = random.randrange(1, 10**9) * ledger_cluster.num_partitions
    one, two, five, six = b + 1, b + 2, b + 5, b + 6  # one and five share a partition, two and six another
    with service(ledger_config, ledger_db, name, sweep_interval=None) as ledger:
        for custid in (one, two, five, six):
            assert ledger.open_account(custid, f"c{custid}", savings=1000, checking=1000).committed
        assert ledger.deactivate(six).committed
        debits = [
            ledger.transfer(one, two, 100),
            ledger.transfer(five, two, 200),
            ledger.transfer(one, six, 300),
            ledger.transfer(five, six, 400),
        ]
        ids: list[str] = []
        for debit in debits:
            assert debit.committed and debit.transfer_id is not None
            assert debit.transaction_id is not None
            assert ledger.callbacks.wait_for(debit.partition_id, debit.transaction_id, 30)
            ids.append(debit.transfer_id)
        with ledger.engine.connect() as conn:
            rows = conn.execute(select(TransferOut.__table__).where(TransferOut.transfer_id.in_(ids))).all()
        outbox = {row.transfer_id: TransferOut(**row._asdict()) for row in rows}
        assert len(outbox) == 4

        first = CreditTransfer(ledger.callbacks, outbox[ids[0]])
        assert ledger.run(first).committed and first.outcome == "credited"
        credits = CreditTransfers(ledger.callbacks, [outbox[i] for i in ids])
        credited = ledger.run(credits)
        assert credited.committed
        assert credits.outcomes == {ids[1]: "credited", ids[2]: "rejected", ids[3]: "rejected"}
        assert ledger.balance(two, wait_for=credited) == (1000, 1300)
        again = ledger.run(CreditTransfers(ledger.callbacks, [outbox[i] for i in ids]))
        assert not again.committed and "credited already" in (again.reason or "")

        settled = ledger.run(SettleTransfers(ledger.callbacks, [outbox[i] for i in ids[:2]]))
        refunds = RefundTransfers(ledger.callbacks, [outbox[i] for i in ids[2:]])
        refunded = ledger.run(refunds)
        assert settled.committed and refunded.committed
        assert refunds.outcomes == {ids[2]: "refunded", ids[3]: "refunded"}
        assert ledger.balance(one, wait_for=refunded) == (1000, 900)
        assert ledger.balance(five, wait_for=refunded) == (1000, 800)
        for transfer_id in ids:
            assert wait_settled(ledger, transfer_id) in ("credited", "refunded")
        assert not ledger.run(SettleTransfers(ledger.callbacks, [outbox[i] for i in ids[:2]])).committed

        elsewhere = TransferOut(
            from_custid=two, transfer_id="t", to_custid=one, amount=1, kind="payment", status="pending"
        )
        with pytest.raises(CrossPartitionError):  # credits of receivers in two partitions
            ledger.submit(CreditTransfers(ledger.callbacks, [outbox[ids[0]], elsewhere]))

        assert failed_checks(ledger, ledger_cluster, name) == []


def test_kill_9_between_a_debit_and_its_credit_loses_nothing(
    ledger_cluster: LocalCluster, ledger_config: WaltzClientConfig, ledger_db: str, tmp_path: Path
) -> None:
    name = f"kill-{os.urandom(4).hex()}"
    b = random.randrange(1, 10**9) * ledger_cluster.num_partitions
    source, target = b + 3, b + 4  # two partitions
    with service(ledger_config, ledger_db, name, sweep_interval=None) as setup:
        for custid in (source, target):
            assert setup.open_account(custid, f"c{custid}", savings=0, checking=1000).committed
    script = Path(__file__).with_name("debit_then_hang.py")
    env = {**os.environ, "LEDGER_CLUSTER_NAME": name}  # the cluster's credential too (ledger_config)
    stderr = (tmp_path / "instance.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            str(script),
            ledger_db,
            ledger_cluster.zookeeper_connect_string,
            ledger_cluster.root,
            str(source),
            str(target),
            "250",
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # bounded: the script times out its own waits
        log = (tmp_path / "instance.log").read_text()[-3000:]
        assert line.startswith("DEBITED "), f"the instance did not debit: {line!r}\n{log}"
        transfer_id = line.split()[1]
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        stderr.close()

    with service(ledger_config, ledger_db, name) as survivor:
        with survivor.engine.connect() as conn:
            assert (
                conn.execute(select(TransferIn).where(TransferIn.transfer_id == transfer_id)).first() is None
            )
        assert survivor.balance(source) == (0, 750)  # debited: the money is in flight, not lost
        assert wait_settled(survivor, transfer_id) == "credited"
        assert survivor.balance(target) == (0, 1250)


def test_a_partition_routed_sweeper_finds_its_steps_behind_other_partitions_pages(tmp_path: Path) -> None:
    """With other instances' pending transfers first in the outbox's order (a whole page and more),
    a sweeper that moves only its own partitions' steps still reaches them."""
    from concurrent.futures import Future

    from waltz_examples.ledger.models import registry
    from waltz_examples.ledger.service import LedgerCallbacks
    from waltz_examples.ledger.transfers import Sweeper

    engine = prepare_database(f"sqlite:///{tmp_path / 'ledger.db'}")
    # Credits go to the target's partition: customers 0..9 (targets of the first 120 rows, by
    # sender order) are another instance's; the last 5 rows credit customer 11, this instance's.
    pairs = [*((s, s % 10) for s in range(100, 220)), *((s, 11) for s in range(300, 305))]
    rows = [
        {"from_custid": f, "transfer_id": f"t{f:04d}", "to_custid": t, "amount": 1, "kind": "payment"}
        for f, t in pairs
    ]
    with engine.begin() as conn:
        conn.execute(insert(TransferOut), rows)
    callbacks = LedgerCallbacks(engine, cluster_name="ledger", registry=registry())
    submitted: list[Any] = []

    def submit(step: Any) -> Future[Outcome]:
        submitted.append(step)
        future: Future[Outcome] = Future()
        future.set_result(Outcome(OutcomeKind.DROPPED, 0))
        return future

    def owns(custid: int) -> bool:
        return custid == 11  # a credit runs on its receiver's partition

    sweeper = Sweeper(callbacks, submit, batch=50, owns=owns)
    assert sweeper.sweep_once() == 5
    assert len(submitted) == 5  # without partition_of, a transaction per step
    assert sorted(t.from_custid for step in submitted for t in step.transfers) == list(range(300, 305))

    # With partition_of, the steps of one partition and kind are one transaction (in batches).
    submitted.clear()
    batching = Sweeper(callbacks, submit, batch=50, owns=owns, partition_of=lambda custid: custid % 4)
    assert batching.sweep_once() == 5
    assert len(submitted) == 1 and batching.step_transactions == 1
    assert sorted(t.from_custid for t in submitted[0].transfers) == list(range(300, 305))
    engine.dispose()
