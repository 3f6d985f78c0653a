"""The checks of a quiet run that hold for any SmallBank application, and its own invariants after them.

What the demo, ``waltz perf smallbank`` and ``waltz chaos --workload ledger`` check once every
transaction is applied (docs/design/overview.md, "Workloads"), in this order:

- **database marks = server high-water marks**, per partition (the SQL framework's mark rows);
- **every (transaction, member) applied exactly once**: the application's record of its applies
  holds exactly the IDs 0..mark of each partition, a batched transaction's once per member it
  carries as the log holds it (docs/design/sql.md "Batched change-sets": a member that repeats an
  earlier member's idempotency key is skipped, and not counted);
- **the log read from the start holds the same transactions**: a fresh client (no database)
  reads every partition up to the marks and counts them;
- the application's own :class:`~waltz.workloads.application.Invariants`, which saw the
  ``meta`` of every change-set of that read, and, when they are
  :class:`~waltz.workloads.application.ChangeSetInvariants`, every change-set the live apply
  applies (for the ledger: money conserved, transfers exactly once, the balance rules, and every
  row of its tables as the log last wrote it);
- **replicas identical**, when the run knows the cluster's nodes: every storage replica of every
  partition holds the same records up to the mark;
- **the log holds every schema version**, when the run changed the models (a rolling deploy,
  :mod:`waltz.workloads.rollout`): the row changes of that read, by entity and the schema version
  they were written with, hold each version from 1 to the model's, and none newer.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select

from waltz import WaltzClientCallbacks
from waltz.client.config import WaltzClientConfig
from waltz.client.reading import read_up_to
from waltz.client.transaction import Transaction
from waltz.jdbc_style import CHANGE_SET_HEADER, ChangeSet, decode_members
from waltz.jdbc_style.changeset import repeated_key_members
from waltz.jdbc_style.schema import high_water_marks
from waltz.protocol.split_records import SPLIT_RECORD_HEADER
from waltz.workloads.application import ChangeSetInvariants, Check, SmallBankApplication

__all__ = [
    "Check",
    "LogTally",
    "applied_once_check",
    "check_application",
    "database_marks_check",
    "read_log",
    "schema_versions_check",
]


@dataclass
class LogTally:
    """What the log says: the number of transactions of each partition, the number of row
    changes of each entity written at each schema version (``{entity: {version: count}}``), and
    the members applied of each batched transaction (``{partition: {transaction ID: member
    indexes}}``, only where they are not just ``(0,)``)."""

    transactions: dict[int, int] = field(default_factory=dict)
    schema_versions: dict[str, Counter[int]] = field(default_factory=dict)
    members: dict[int, dict[int, tuple[int, ...]]] = field(default_factory=dict)
    split_records: dict[int, set[int]] = field(default_factory=dict)
    """Partition -> the IDs of its split records (a barrier, a genesis): no application's."""
    firsts: dict[int, int] = field(default_factory=dict)
    """Partition -> the first ID read (0, or a split's new partition's genesis)."""


class _Reader(WaltzClientCallbacks):
    """Counts what a fresh client reads, hands each change-set's meta to ``observe`` and each
    change-set the live apply applies to ``observe_change_set``."""

    def __init__(
        self,
        tally: LogTally,
        observe: Callable[[Mapping[str, Any]], None] | None,
        observe_change_set: Callable[[int, int, ChangeSet], None] | None = None,
    ) -> None:
        self.tally = tally
        self.observe = observe
        self.observe_change_set = observe_change_set
        self.marks: dict[int, int] = {}
        self.lock = threading.Lock()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        with self.lock:
            return self.marks.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        self.apply_transactions([transaction])

    def apply_transactions(self, transactions: Sequence[Transaction]) -> None:
        for t in transactions:
            metas: list[dict[str, Any]] = [{}]
            changes: tuple[tuple[str, int], ...] = ()
            applied: tuple[int, ...] = (0,)
            members: tuple[ChangeSet, ...] = ()
            if t.header == CHANGE_SET_HEADER:
                members = decode_members(t.get_raw_data())
                metas = [dict(member.meta) for member in members]  # a batch: each member's
                changes = tuple((c.entity, c.schema_version) for m in members for c in m.changes)
                repeated = repeated_key_members(members)
                applied = tuple(i for i in range(len(members)) if i not in repeated)
            with self.lock:
                self.tally.firsts.setdefault(t.partition_id, t.transaction_id)
                if t.header == SPLIT_RECORD_HEADER:
                    self.tally.split_records.setdefault(t.partition_id, set()).add(t.transaction_id)
                if applied != (0,):
                    self.tally.members.setdefault(t.partition_id, {})[t.transaction_id] = applied
                for entity, version in changes:
                    self.tally.schema_versions.setdefault(entity, Counter())[version] += 1
                self.tally.transactions[t.partition_id] = self.tally.transactions.get(t.partition_id, 0) + 1
                if self.observe is not None:
                    for meta in metas:
                        self.observe(meta)
                if self.observe_change_set is not None:
                    for index in applied if members else ():
                        self.observe_change_set(t.partition_id, t.transaction_id, members[index])
                self.marks[t.partition_id] = t.transaction_id

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        raise RuntimeError(f"reading the log failed at {partition_id}:{transaction_id}") from exception


def read_log(
    config: WaltzClientConfig,
    high_water_marks: dict[int, int],
    *,
    observe: Callable[[Mapping[str, Any]], None] | None = None,
    observe_change_set: Callable[[int, int, ChangeSet], None] | None = None,
    timeout: float = 300.0,
) -> LogTally:
    """Read every transaction from the start with a fresh client (no database) and tally it.

    Args:
        config: the client settings that reach the cluster.
        high_water_marks: partition -> the mark to read up to.
        observe: called with the ``meta`` of each change-set (each member of a batch; an empty
            one for a transaction that is not a change-set), one call at a time, in log order
            within a partition.
        observe_change_set: called with the partition, the transaction ID and each change-set
            the live apply applies (a batch's members but those whose idempotency key an
            earlier member of the transaction carried), one call at a time, in log order within
            a partition (:meth:`~waltz.workloads.application.ChangeSetInvariants.observe_change_set`).
        timeout: seconds the read may take.

    Returns:
        The number of transactions of each partition, the row changes by entity and schema
        version, and the members of each batched transaction.
    """
    tally = LogTally()
    read_up_to(_Reader(tally, observe, observe_change_set), config, high_water_marks, timeout=timeout)
    return tally


def check_application(
    application: SmallBankApplication,
    engine: Engine,
    *,
    cluster_name: str,
    server_marks: dict[int, int],
    client_config: WaltzClientConfig,
    replicas: Mapping[int, Collection[int]] | None = None,
    schema_versions: Mapping[str, int] | None = None,
) -> list[Check]:
    """Every check of the module docstring, once the workload and the application are quiet.

    Args:
        application: the application that ran.
        engine: its database, which applied the log up to ``server_marks``.
        cluster_name: the log's name in the database's mark rows.
        server_marks: partition -> the servers' high-water mark.
        client_config: the client settings that reach the cluster (the log is read again).
        replicas: partition -> the distinct digests of its replicas' records up to the mark
            (``LocalCluster.replica_digests``); None: not compared.
        schema_versions: entity -> its model's schema version, when the run changed the models
            (:meth:`~waltz.workloads.application.EvolvingApplication.schema_versions`); None:
            not checked.

    Returns:
        The checks, in the order of the module docstring.
    """
    invariants = application.invariants()
    fold = invariants.observe_change_set if isinstance(invariants, ChangeSetInvariants) else None
    tally = read_log(client_config, server_marks, observe=invariants.observe, observe_change_set=fold)
    checks = [
        _marks_check(server_marks, _database_marks(engine, cluster_name)),
        applied_once_check(
            server_marks,
            application.applied_transactions(engine),
            tally.members,
            split_records=tally.split_records,
            firsts=tally.firsts,
        ),
        _log_check(server_marks, tally),
        *invariants.checks(engine),
    ]
    if replicas is not None:
        checks.append(_replicas_check(replicas))
    if schema_versions is not None:
        checks.append(schema_versions_check(schema_versions, tally.schema_versions))
    return checks


def schema_versions_check(models: Mapping[str, int], written: Mapping[str, Counter[int]]) -> Check:
    """Whether the log holds row changes of every schema version of each model, 1 to the model's,
    and none newer (the detail lists them: ``ledger.account v1 40, v2 3, v3 2``).

    Args:
        models: entity -> the model's schema version.
        written: entity -> {schema version: row changes written at it} (:attr:`LogTally.schema_versions`).
    """
    wrong = []
    for entity, version in sorted(models.items()):
        seen = set(written.get(entity, Counter()))
        if not set(range(1, version + 1)) <= seen or max(seen, default=0) > version:
            wrong.append(f"{entity} is version {version}, the log holds {sorted(seen)}")
    unknown = sorted(set(written) - set(models))
    if unknown:
        wrong.append(f"entities without a model: {unknown}")
    listed = "; ".join(
        f"{entity} " + ", ".join(f"v{v} {n}" for v, n in sorted(counts.items()))
        for entity, counts in sorted(written.items())
    )
    return Check(
        "the log holds every schema version of the models",
        not wrong,
        listed if not wrong else "; ".join(wrong) + f" ({listed})",
    )


def database_marks_check(engine: Engine, cluster_name: str, server_marks: Mapping[int, int]) -> Check:
    """Whether the database's mark rows of ``cluster_name`` equal the servers' high-water marks
    (``server_marks``: partition -> mark), the first check of :func:`check_application`."""
    return _marks_check(server_marks, _database_marks(engine, cluster_name))


def _database_marks(engine: Engine, cluster_name: str) -> dict[int, int]:
    marks = high_water_marks
    query = select(marks.c.partition_id, marks.c.high_water_mark).where(marks.c.cluster_name == cluster_name)
    with engine.connect() as conn:
        return {int(p): int(m) for p, m in conn.execute(query)}


def _marks_check(server_marks: Mapping[int, int], db_marks: Mapping[int, int]) -> Check:
    wrong = {p: (db_marks.get(p), m) for p, m in server_marks.items() if db_marks.get(p, -1) != m}
    return Check(
        "database marks = server high-water marks",
        not wrong,
        f"server {dict(server_marks)}, database {dict(db_marks)}",
    )


def applied_once_check(
    server_marks: Mapping[int, int],
    applied: Mapping[int, Collection[int | tuple[int, int]]],
    members: Mapping[int, Mapping[int, tuple[int, ...]]],
    *,
    split_records: Mapping[int, Collection[int]] | None = None,
    firsts: Mapping[int, int] | None = None,
) -> Check:
    """Whether the applies recorded are exactly the log's: each transaction 0..mark of each
    partition once (from a split's new partition's genesis on, and but the split records, which
    are no application's: docs/design/splits.md "Record forms"), a batched one once per member it
    carries (docs/design/sql.md "Batched change-sets"), the second check of
    :func:`check_application`.

    Args:
        server_marks: partition -> the servers' high-water mark.
        applied: partition -> the applies recorded
            (:meth:`~waltz.workloads.application.SmallBankApplication.applied_transactions`):
            ``(transaction ID, member)`` pairs, one per applied change-set, compared with the
            log's members; or, from an application that records its applies by transaction,
            bare transaction IDs, one per transaction whatever members it carries.
        members: partition -> {transaction ID: the member indexes the live apply applies}, for
            the transactions where that is not ``(0,)`` (:attr:`LogTally.members`).

        split_records: partition -> the IDs of its split records (:attr:`LogTally.split_records`).
        firsts: partition -> its first ID (:attr:`LogTally.firsts`; absent: 0).

    Returns:
        The check; its detail names, per partition that differs, the first pairs missing and
        the first applied too often or never in the log.
    """
    by_member = any(isinstance(a, tuple) for records in applied.values() for a in records)
    wrong: dict[int, str] = {}
    total = batched = 0
    for p, mark in sorted(server_marks.items()):
        batches = members.get(p, {}) if by_member else {}
        skipped = (split_records or {}).get(p, ())
        first = (firsts or {}).get(p, 0)
        expected = Counter(
            (t, member) for t in range(first, mark + 1) if t not in skipped for member in batches.get(t, (0,))
        )
        total += sum(expected.values())
        batched += len(batches)
        seen = Counter(a if isinstance(a, tuple) else (a, 0) for a in applied.get(p, ()))
        missing = sorted((expected - seen).elements())
        extra = sorted((seen - expected).elements())
        if missing or extra:
            wrong[p] = (
                f"partition {p}: missing {missing[:5]} ({len(missing)}), extra {extra[:5]} ({len(extra)})"
            )
    transactions = sum(m + 1 - (firsts or {}).get(p, 0) for p, m in server_marks.items())
    done = f"{transactions} transactions" + (f", {total} change-sets ({batched} batches)" if batched else "")
    return Check(
        "every (transaction, member) applied exactly once",
        not wrong,
        done if not wrong else "; ".join(wrong.values()),
    )


def _log_check(server_marks: Mapping[int, int], tally: LogTally) -> Check:
    log_total = sum(tally.transactions.values())
    total = sum(m + 1 - tally.firsts.get(p, 0) for p, m in server_marks.items())
    return Check(
        "the log read from the start holds the same transactions",
        log_total == total,
        f"log {log_total}, applied {total}",
    )


def _replicas_check(replicas: Mapping[int, Collection[int]]) -> Check:
    differing = {p: len(d) for p, d in replicas.items() if len(d) != 1}
    return Check(
        "replicas hold identical record sequences",
        not differing,
        f"{len(replicas)} partitions compared" if not differing else f"differing: {differing}",
    )
