"""An application instance that commits one batch of keyed increments and dies before it is applied.

Run by ``test_batch_crash.py`` beside it, as a process of its own. It follows every partition of
a Waltz cluster with :class:`~waltz.jdbc_style.ChangeSetCallbacks` (the entity cache on) and
submits through an :class:`~waltz.jdbc_style.entity_batches.EntityBatcher`:

1. creates the hot counter ``--counter-id`` at 0 and waits until its database has it;
2. arms its failpoint on the counter's partition, for transactions after that one;
3. submits a gate (a context that waits in ``run`` and drops itself), so that the partition has
   a log transaction in flight, then ``--members`` increments of the counter, each with its own
   idempotency key ``<--key-prefix>-<i>``; they queue, and go as one batch once the gate opens
   (docs/design/sql.md ("Batched entity transactions"));
4. once every member's outcome is committed, writes ``--report-file`` (JSON: ``partition``,
   ``members`` as ``[key, transaction ID]`` pairs) and logs ``REPORTED``.

The failpoint (``--failpoint``):

- ``hold-apply``: the partition's applies stop: each apply of a transaction after the counter's
  raises :class:`~waltz.errors.ApplyPausedError` before it writes anything (the framework's own
  wait for an upgrade: docs/design/sql.md ("Schema versions and upcasting")), so the batch is
  committed and never applied here. After its report the process waits for the test's SIGKILL.
- ``kill-in-apply``: the apply of the batch, at member 1, reads the counter in its database
  transaction (which runs the staged writes first: the transaction is open and has written the
  mark's move, the members' keys and members 0 and 1's rows), waits for the report, logs
  ``FAILPOINT partition=P transaction=T member=M value=V`` (V: the counter as that transaction
  sees it) and kills this process with SIGKILL.

The process logs to stderr; every wait is bounded (it exits with 1 when the test never kills it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

from sqlalchemy import BigInteger, Engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from waltz import Outcome, Transaction, WaltzClient, WaltzClientConfig
from waltz.errors import ApplyPausedError
from waltz.jdbc_style import (
    ChangeSetCallbacks,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    RowChange,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.changeset import ChangeSet
from waltz.jdbc_style.entity_batches import EntityBatcher

__all__ = [
    "FAILPOINT_PATTERN",
    "Base",
    "BatchCrashCallbacks",
    "CreateCounter",
    "Gate",
    "HotCounter",
    "KeyedIncrement",
    "main",
    "submit_behind_gate",
]

log = logging.getLogger("batch_instance")

#: Seconds any one wait of this program lasts at most.
TIMEOUT = 60.0
#: What the ``kill-in-apply`` failpoint logs before the kill (a regular expression).
FAILPOINT_PATTERN = (
    r"FAILPOINT partition=(?P<partition>\d+) transaction=(?P<transaction>\d+) member=(?P<member>\d+)"
    r" value=(?P<value>\d+)"
)


class Base(DeclarativeBase):
    pass


class HotCounter(Base):
    """The hot row: one counter every member of the batch increments."""

    __tablename__ = "batch_crash_counters"
    __waltz__ = WaltzEntity("batch_crash_counter")

    counter_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False)


class BatchCrashCallbacks(ChangeSetCallbacks):
    """Change-set callbacks for a database following the session's shared log, with a failpoint.

    Command-style transactions and changes of entities other tests declare are passed over (the
    mark still moves past them). :meth:`arm` sets the failpoint (see the module docstring); until
    then, and without one, these are plain :class:`ChangeSetCallbacks`.
    """

    def __init__(self, engine: Engine, *, cluster_name: str, entity_cache: bool = True) -> None:
        # The overrides write no entity rows the change-sets do not carry: the cache may be on.
        super().__init__(
            engine,
            cluster_name=cluster_name,
            registry=EntityRegistry.from_base(Base),
            entity_cache=entity_cache,
        )
        self._armed: tuple[str, int, int] | None = None  # (failpoint, partition, after transaction)
        self.reported = threading.Event()

    def arm(self, failpoint: str, partition_id: int, after: int) -> None:
        """Set ``failpoint`` for the partition's transactions above ``after``."""
        self._armed = (failpoint, partition_id, after)

    def _hits(self, failpoint: str, transaction: Transaction) -> bool:
        armed = self._armed
        return (
            armed is not None
            and armed[0] == failpoint
            and transaction.partition_id == armed[1]
            and transaction.transaction_id > armed[2]
        )

    def apply(self, transaction: Transaction, session: Session) -> None:
        if self._hits("hold-apply", transaction):
            raise ApplyPausedError(
                f"partition {transaction.partition_id} transaction {transaction.transaction_id}: "
                "held by the test's failpoint (hold-apply)"
            )
        super().apply(transaction, session)

    def apply_command(self, transaction: Transaction, session: Session) -> None:
        return None

    def apply_change(self, change: RowChange, session: Session, transaction: Transaction) -> None:
        if change.entity in {info.name for info in self.registry}:
            super().apply_change(change, session, transaction)

    def apply_change_set(self, change_set: ChangeSet, transaction: Transaction, session: Session) -> None:
        super().apply_change_set(change_set, transaction, session)
        member = self.member_index(transaction)
        if member >= 1 and self._hits("kill-in-apply", transaction):
            # The staged writes reach the database first: its open transaction has written.
            counter_id = change_set.changes[0].key["counter_id"]
            value = session.execute(
                select(HotCounter.value).where(HotCounter.counter_id == counter_id)
            ).scalar_one()
            if not self.reported.wait(TIMEOUT):
                log.error("the members' outcomes were not reported within %.0fs", TIMEOUT)
            log.warning(
                "FAILPOINT partition=%d transaction=%d member=%d value=%d: killing this process "
                "(SIGKILL) with the apply's database transaction open (the counter's value in it)",
                transaction.partition_id,
                transaction.transaction_id,
                member,
                value,
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)


class CreateCounter(EntityTransactionContext):
    """Inserts the counter at 0."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        super().__init__(callbacks, (HotCounter, counter_id))
        self.counter_id = counter_id

    def run(self, tx: EntityTransaction) -> bool:
        if tx.get(HotCounter, self.counter_id) is not None:
            return tx.drop(f"counter {self.counter_id} exists")
        tx.insert(HotCounter, counter_id=self.counter_id, value=0)
        return True


class KeyedIncrement(EntityTransactionContext):
    """Adds 1 to the counter, as the request ``key`` (its idempotency key)."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int, key: str) -> None:
        super().__init__(callbacks, (HotCounter, counter_id))
        self.counter_id = counter_id
        self.key = key

    def run(self, tx: EntityTransaction) -> bool:
        counter = tx.get(HotCounter, self.counter_id)
        if counter is None:
            raise LookupError(f"counter {self.counter_id} does not exist at mark {tx.high_water_mark}")
        tx.idempotency_key = self.key
        tx.update(counter, value=counter.value + 1)
        return True


class Gate(EntityTransactionContext):
    """Holds its partition's place in flight: ``run`` waits until :attr:`opened` is set, then drops
    the transaction (nothing is appended). Contexts submitted meanwhile queue for one batch."""

    def __init__(self, callbacks: ChangeSetCallbacks, counter_id: int) -> None:
        super().__init__(callbacks, (HotCounter, counter_id))
        self.entered = threading.Event()
        self.opened = threading.Event()

    def run(self, tx: EntityTransaction) -> bool:
        self.entered.set()
        if not self.opened.wait(TIMEOUT):
            raise TimeoutError(f"the gate was not opened within {TIMEOUT:.0f}s")
        return tx.drop("the gate only holds the partition's place")


def submit_behind_gate(
    batcher: EntityBatcher, gate: Gate, contexts: Sequence[EntityTransactionContext]
) -> tuple[Future[Outcome], list[Future[Outcome]]]:
    """Submit ``gate``, then ``contexts`` while it holds the partition's place, then open it: the
    contexts go as one batch (up to the batcher's ``max_members``). Returns the futures of the
    gate and of the contexts.

    Raises:
        TimeoutError: the gate's ``run`` did not start, or its submission did not return.
    """
    submitted: list[Future[Outcome]] = []
    # The client runs a context's first attempt on the submitting thread: the gate's waits there.
    thread = threading.Thread(target=lambda: submitted.append(batcher.submit(gate)), daemon=True)
    thread.start()
    try:
        if not gate.entered.wait(TIMEOUT):
            raise TimeoutError(f"the gate's run did not start within {TIMEOUT:.0f}s")
        futures = [batcher.submit(context) for context in contexts]
    finally:
        gate.opened.set()
        thread.join(TIMEOUT)
    if not submitted:
        raise TimeoutError("the gate's submission did not return (see the log)")
    return submitted[0], futures


def _write_report(path: Path, report: dict[str, object]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(report))
    partial.rename(path)  # the test never reads half a report


def run(args: argparse.Namespace) -> int:
    engine = create_framework_engine(args.db)
    callbacks = BatchCrashCallbacks(engine, cluster_name=args.cluster_name)
    config = WaltzClientConfig(
        zookeeper_connect_string=args.zookeeper,
        cluster_root=args.root,
        zookeeper_session_timeout=10.0,
    )
    try:
        with WaltzClient(callbacks, config) as client:
            client.wait_mounted(timeout=TIMEOUT)
            created = client.submit(CreateCounter(callbacks, args.counter_id)).result(TIMEOUT)
            if not created.committed or created.transaction_id is None:
                raise RuntimeError(f"creating counter {args.counter_id}: {created}")
            partition = created.partition_id
            if not callbacks.wait_for(partition, created.transaction_id, timeout=TIMEOUT):
                raise TimeoutError(f"partition {partition} transaction {created.transaction_id} not applied")
            callbacks.arm(args.failpoint, partition, created.transaction_id)
            log.info(
                "counter %d created at partition %d transaction %d",
                args.counter_id,
                partition,
                created.transaction_id,
            )

            keys = [f"{args.key_prefix}-{i}" for i in range(args.members)]
            with EntityBatcher(client) as batcher:
                increments = [KeyedIncrement(callbacks, args.counter_id, key) for key in keys]
                gated, futures = submit_behind_gate(batcher, Gate(callbacks, args.counter_id), increments)
                if not gated.result(TIMEOUT).dropped:
                    raise RuntimeError("the gate was not dropped")
                outcomes = [future.result(TIMEOUT) for future in futures]
            for key, outcome in zip(keys, outcomes, strict=True):
                if not outcome.committed or outcome.partition_id != partition:
                    raise RuntimeError(f"request {key}: {outcome}, not committed on partition {partition}")
            _write_report(
                Path(args.report_file),
                {
                    "partition": partition,
                    "members": [[k, o.transaction_id] for k, o in zip(keys, outcomes, strict=True)],
                },
            )
            callbacks.reported.set()
            log.info(
                "REPORTED %d members in transactions %s",
                len(keys),
                sorted({o.transaction_id for o in outcomes if o.transaction_id is not None}),
            )
            # The test kills this process now (hold-apply), or the apply's failpoint does.
            threading.Event().wait(TIMEOUT * 2)
            log.error("not killed within %.0fs", TIMEOUT * 2)
            return 1
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="SQLAlchemy URL of the database")
    parser.add_argument("--zookeeper", required=True, help="ZooKeeper connect string")
    parser.add_argument("--root", required=True, help="the Waltz cluster root znode")
    parser.add_argument("--cluster-name", required=True, help="the log's name in waltz_high_water_marks")
    parser.add_argument("--counter-id", type=int, required=True, help="the hot counter's key")
    parser.add_argument("--members", type=int, required=True, help="keyed increments in the batch")
    parser.add_argument("--key-prefix", required=True, help="the increments' keys are <prefix>-<i>")
    parser.add_argument("--report-file", required=True, help="where the members' outcomes go (JSON)")
    parser.add_argument("--failpoint", required=True, choices=("hold-apply", "kill-in-apply"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s batch-instance %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("waltz", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
