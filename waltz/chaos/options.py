"""What a chaos run does (:class:`ChaosOptions`, the ``waltz chaos`` options) and what it saw.

See ``docs/chaos.md`` "What runs", "The fault schedule". A run is bounded by a number of transactions or, with
``duration``, by time (the transactions are then only an upper bound); its fault schedule is drawn
from the seed or fixed, and :meth:`ChaosOptions.replay_command` prints the command that runs the
same schedule again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from waltz.chaos.checks import ChaosCheck
from waltz.chaos.schedule import (
    ARCHIVE_FAULTS,
    DEFAULT_FAULTS,
    NAMESPACE_FAULTS,
    NETWORK_FAULTS,
    SPLIT_FAULTS,
    Fault,
    FaultKind,
    fixed_schedule,
    random_schedule,
    schedule_shortfalls,
)
from waltz.workloads.application import DEFAULT_APPLICATION

__all__ = [
    "DEFAULT_TRANSACTIONS",
    "DURATION_TRANSACTION_CAP",
    "ChaosOptions",
    "ChaosResult",
    "database_on_loopback",
]

#: Transactions of a run without ``duration`` when none are given.
DEFAULT_TRANSACTIONS = 3000
#: The bound on transactions of a ``duration`` run when none is given (time ends it first).
DURATION_TRANSACTION_CAP = 100_000_000
#: Seconds of a ``duration`` run per fault of a random schedule (default fault count).
SECONDS_PER_FAULT = 30.0
#: What a run writes in its work directory: one that holds any of them holds an earlier run.
RUN_ENTRIES = ("cluster", "clients", "archive", "archiver.log", "ledger.db")


@dataclass(frozen=True, slots=True)
class ChaosOptions:
    """What a chaos run does (the ``waltz chaos`` options).

    Attributes:
        transactions: transactions to submit in all (split evenly between the clients); None:
            3,000, or with ``duration`` no bound but time (:data:`DURATION_TRANSACTION_CAP`).
        duration: seconds the clients submit for; the fault points are then fractions of it
            (None: the run ends when ``transactions`` are submitted).
        seed: the seed of the payloads, partitions, locks and the random schedule.
        faults: the fault kinds the schedule may use.
        schedule: ``"random"`` (``fault_count`` faults drawn from ``seed``) or ``"fixed"``
            (:func:`~waltz.chaos.schedule.fixed_schedule`, the network's).
        fault_count: faults of a random schedule; None means one per 5,000 transactions (one per
            30 s with ``duration``), at least 3 and at most 200.
        max_fault_duration: the longest fault of a random schedule, in seconds.
        workload: ``"raw"`` (random payloads under random WRITE locks, as upstream's smoke test)
            ``"counter"`` (read-modify-write increments of ``lock_pool`` counters, the counter of
            docs/design/overview.md "Why the log is the source of truth": no update may be lost), or
            ``"ledger"`` (the SmallBank mix of the application ``app``, by default the ledger example
            of ``examples/waltz_examples/ledger``, whose money must be conserved).
        db_url: the ledger's shared database (None: SQLite in the work directory).
        accounts: SmallBank customers of the ledger workload.
        app: the ledger workload's SmallBank application, by module name
            (:func:`~waltz.workloads.application.load_application`).
        batch: the ledger workload's instances submit through an ``EntityBatcher``: operations
            ready for a partition while its last log transaction is in flight go as one batch
            (docs/design/sql.md "Batched entity transactions"), and the checks count each member.
        storages: storage nodes (3 or 5); every partition has a replica on each, so a fault on a
            minority of the nodes hits a minority of every partition's replicas.
        servers: servers.
        partitions: partitions.
        clients: client processes.
        in_flight: submissions in flight per client.
        lock_pool: the WRITE lock of each transaction is drawn from this many.
        work_dir: where data and logs go, always kept (None: a temporary directory).
        keep: keep the temporary work directory after a passing run (a failing run always keeps it).
        timeout: seconds the submission phase may take (None: 600 s + 20 ms per transaction, or
            the duration + 600 s).
        restart_check: stop everything cleanly and check again after starting it again.
        tick_time_ms: ZooKeeper's tickTime.
        session_timeout: the servers' ZooKeeper session timeout in seconds.
        network: ``"loopback"`` (every process on 127.0.0.1; network faults through proxies) or
            ``"namespaces"`` (ZooKeeper, every node and every client process on a host of its own,
            a network namespace; network faults are real cuts between hosts, the kinds of
            :data:`~waltz.chaos.schedule.NAMESPACE_FAULTS`). Needs root.
        archive: run the archiver (``waltz archive run --follow``, small chunks) through the run,
            on storage nodes that roll small segments and delete archived ones
            (:mod:`waltz.chaos.archiving`); the schedule may then kill a server or storage nodes
            while an archive round is in progress, and the archiver itself
            (:data:`~waltz.chaos.schedule.ARCHIVE_FAULTS`), and the checks add the archive's
            (docs/chaos.md "Archiving under faults"). Loopback only.
        split_to: split the log to this many partitions (a multiple of ``partitions``, at least
            twice) while the clients write, with the owner of parent partition 0 killed during the
            handover (:attr:`~waltz.chaos.schedule.FaultKind.KILL_SERVER_SPLITTING`); the checks
            then cover every partition of both counts (docs/chaos.md "A split under faults"). The
            raw and counter workloads only. None: no split.
        split_at: the fraction of the run (0..1) at which the split starts.
    """

    transactions: int | None = None
    duration: float | None = None
    seed: int = 1
    faults: tuple[FaultKind, ...] = DEFAULT_FAULTS
    schedule: str = "random"
    fault_count: int | None = None
    max_fault_duration: float = 6.0
    workload: str = "raw"
    db_url: str | None = None
    accounts: int = 200
    app: str = DEFAULT_APPLICATION
    batch: bool = False
    storages: int = 3
    servers: int = 3
    partitions: int = 4
    clients: int = 3
    in_flight: int = 32
    lock_pool: int = 1000
    work_dir: Path | None = None
    keep: bool = False
    timeout: float | None = None
    restart_check: bool = True
    tick_time_ms: int = 500
    session_timeout: float = 4.0
    network: str = "loopback"
    archive: bool = False
    split_to: int | None = None
    split_at: float = 0.5

    @property
    def transaction_bound(self) -> int:
        """The most transactions the run submits (the cap of a ``duration`` run)."""
        if self.transactions is not None:
            return self.transactions
        return DEFAULT_TRANSACTIONS if self.duration is None else DURATION_TRANSACTION_CAP

    @property
    def submit_timeout(self) -> float:
        """Seconds the submission phase may take before the run fails."""
        if self.timeout is not None:
            return self.timeout
        if self.duration is not None:
            return self.duration + 600.0
        return 600.0 + 0.02 * self.transaction_bound

    def validate(self) -> None:
        """Check the options that cannot be checked one at a time.

        Raises:
            ValueError: storages not 3 or 5, an unknown workload or schedule, ``batch`` or ``db_url``
                with a workload other than the ledger, fewer transactions
                than clients, a duration that is not positive, a ``split_to`` that is no split of
                ``partitions`` (or with the ledger workload or the archiver), a fixed schedule
                that strikes a server, storage node or partition the cluster does not have, fault
                kinds that leave the schedule without a fault while faults were asked for
                (docs/chaos.md "The fault schedule"), a ``work_dir`` that holds an earlier run
                (docs/chaos.md "Work directory").
        """
        if self.storages not in (3, 5):
            raise ValueError(f"storages must be 3 or 5, got {self.storages}")
        if self.workload not in ("raw", "counter", "ledger"):
            raise ValueError(f"unknown workload {self.workload!r}: use raw, counter or ledger")
        if self.batch and self.workload != "ledger":
            raise ValueError(f"--batch is for the ledger workload, not --workload {self.workload}")
        if self.db_url is not None and self.workload != "ledger":
            raise ValueError(f"--db-url is the ledger workload's database, not --workload {self.workload}'s")
        if self.schedule not in ("random", "fixed"):
            raise ValueError(f"unknown schedule {self.schedule!r}: use random or fixed")
        if self.transaction_bound < self.clients:
            raise ValueError(
                f"transactions ({self.transaction_bound}) must be at least clients ({self.clients})"
            )
        if self.duration is not None and self.duration <= 0:
            raise ValueError(f"duration must be positive, got {self.duration}")
        if self.network not in ("loopback", "namespaces"):
            raise ValueError(f"unknown network {self.network!r}: use loopback or namespaces")
        if self.archive and self.network != "loopback":
            raise ValueError("--archive runs on loopback only: leave out --network namespaces")
        if self.split_to is not None:
            if self.split_to < 2 * self.partitions or self.split_to % self.partitions:
                raise ValueError(
                    f"--split-to {self.split_to} is no split of {self.partitions} partitions: give a "
                    f"multiple of {self.partitions} by at least 2 (e.g. {2 * self.partitions})"
                )
            if self.workload == "ledger":
                raise ValueError(
                    "--split-to runs the raw and counter workloads; the ledger's checks follow a split "
                    "in waltz demo --split-to"
                )
            if self.archive:
                raise ValueError(
                    "--split-to and --archive together: the archiver does not follow a split yet"
                )
            if not 0.0 < self.split_at < 1.0:
                raise ValueError(
                    f"--split-at is a fraction of the run between 0 and 1, got {self.split_at:g}"
                )
        splitting = [k.value for k in self.faults if k in SPLIT_FAULTS]
        if splitting and self.split_to is None:
            raise ValueError(f"fault kind(s) {', '.join(splitting)} need a split: add --split-to")
        archiving = [k.value for k in self.faults if k in ARCHIVE_FAULTS]
        if archiving and not self.archive:
            raise ValueError(f"fault kind(s) {', '.join(archiving)} need the archiver: add --archive")
        wrong = NETWORK_FAULTS if self.network == "namespaces" else NAMESPACE_FAULTS
        misplaced = [k.value for k in self.faults if k in wrong]
        if misplaced and self.network == "namespaces":
            raise ValueError(
                f"fault kind(s) {', '.join(misplaced)} work through proxies on loopback; in namespace "
                "mode cut hosts apart instead (isolate-server, isolate-storage, split-owner, "
                "partition-storage, one-way-storage, one-way-owner)"
            )
        if misplaced:
            raise ValueError(
                f"fault kind(s) {', '.join(misplaced)} cut hosts apart: they need --network namespaces"
            )
        if self.schedule == "fixed":
            short = schedule_shortfalls(
                self.make_schedule(), storages=self.storages, servers=self.servers, partitions=self.partitions
            )
            if short:
                raise ValueError(
                    f"the fixed schedule needs {' and '.join(short)}: give them, leave those fault kinds "
                    "out of --faults, or use --schedule random (it strikes only what the cluster has)"
                )
        self._refuse_an_emptied_schedule()
        if self.work_dir is not None:
            earlier = [name for name in RUN_ENTRIES if (self.work_dir / name).exists()]
            if earlier:
                raise ValueError(
                    f"--work-dir {self.work_dir} holds an earlier run ({', '.join(earlier)}): a run "
                    "starts a new cluster and checks its log from the first transaction; give a new or "
                    "empty directory (to replay a run, give the replay line another --work-dir), or "
                    "remove those first"
                )

    def _refuse_an_emptied_schedule(self) -> None:
        """Refuse fault kinds that leave the schedule without a fault although faults were asked
        for (``--faults`` not ``none``, ``--fault-count`` not 0): the run would strike nothing and
        pass as a run under faults (docs/chaos.md "The fault schedule").

        Raises:
            ValueError: the schedule is empty, naming the kinds the fixed schedule strikes.
        """
        if not self.faults or self.fault_count == 0 or self.make_schedule():
            return
        asked = ",".join(k.value for k in self.faults)
        if self.schedule == "fixed":
            strikes = fixed_schedule(
                network=self.network, session_timeout=self.session_timeout, archive=self.archive
            )
            raise ValueError(
                f"--faults {asked} leaves the fixed schedule without a fault: it strikes only "
                f"{', '.join(dict.fromkeys(f.kind.value for f in strikes))}; add one of those kinds to "
                "--faults, use --schedule random, or give --faults none for a run without faults"
            )
        raise ValueError(
            f"--faults {asked} leaves the {self.schedule} schedule without a fault: give other kinds, "
            "or --faults none for a run without faults"
        )

    def make_schedule(self) -> list[Fault]:
        """The run's fault schedule, with the split's fault at ``split_at`` when ``split_to`` is
        given (never drawn at random: a log splits once to a count).

        Raises:
            ValueError: an unknown ``schedule``.
        """
        faults = self._fault_schedule()
        if self.split_to is None:
            return faults
        split = Fault(self.split_at, FaultKind.KILL_SERVER_SPLITTING, (0,), 3.0)
        return sorted([f for f in faults if f.kind not in SPLIT_FAULTS] + [split], key=lambda f: f.at)

    def _fault_schedule(self) -> list[Fault]:
        if self.schedule == "fixed":
            return fixed_schedule(
                self.faults,
                network=self.network,
                session_timeout=self.session_timeout,
                archive=self.archive,
            )
        if self.schedule == "random":
            count = self.fault_count
            if count is None:
                basis = (
                    self.duration / SECONDS_PER_FAULT
                    if self.duration is not None
                    else self.transaction_bound / 5000
                )
                count = min(200, max(3, int(basis)))
            return random_schedule(
                self.seed,
                self.faults,
                count=count,
                storages=self.storages,
                servers=self.servers,
                max_duration=self.max_fault_duration,
                partitions=self.partitions,
                session_timeout=self.session_timeout,
            )
        raise ValueError(f"unknown schedule {self.schedule!r}: use random or fixed")

    def replay_command(self) -> str:
        """The ``waltz chaos`` command that runs the same schedule and workload again.

        Everything that shapes the schedule, the payloads or the cluster is spelled out; the work
        directory and the database are not (give them again if they matter).
        """
        kinds = ",".join(k.value for k in self.faults) or "none"
        parts = [f"waltz chaos --seed {self.seed}"]
        if self.transactions is not None or self.duration is None:
            parts.append(f"--transactions {self.transaction_bound}")
        if self.duration is not None:
            parts.append(f"--duration {self.duration:g}")
        parts += [
            f"--schedule {self.schedule}",
            f"--faults {kinds}",
            f"--workload {self.workload}",
            f"--storages {self.storages}",
            f"--servers {self.servers}",
            f"--partitions {self.partitions}",
            f"--clients {self.clients}",
            f"--in-flight {self.in_flight}",
            f"--lock-pool {self.lock_pool}",
            f"--max-fault-duration {self.max_fault_duration:g}",
        ]
        if self.fault_count is not None:
            parts.append(f"--fault-count {self.fault_count}")
        if self.workload == "ledger":
            parts.append(f"--accounts {self.accounts}")
            if self.app != DEFAULT_APPLICATION:
                parts.append(f"--app {self.app}")
            if self.batch:
                parts.append("--batch")
        if not self.restart_check:
            parts.append("--no-restart-check")
        if self.network != "loopback":
            parts.append(f"--network {self.network}")
        if self.archive:
            parts.append("--archive")
        if self.split_to is not None:
            parts.append(f"--split-to {self.split_to} --split-at {self.split_at:g}")
        return " ".join(parts)


def database_on_loopback(db_url: str) -> bool:
    """Whether a database URL names a server on this machine's loopback (no host: a local socket).

    In namespace mode the client hosts reach such a server through a forwarder on the bridge
    address (``waltz chaos`` starts one); SQLite is a file, never on loopback.
    """
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        return False
    host = url.host or "localhost"
    return host == "localhost" or host.startswith("127.") or host == "::1"


@dataclass
class ChaosResult:
    """What a chaos run saw.

    Attributes:
        checks: every invariant's verdict, in order.
        faults: the faults struck, as described.
        acknowledged: transactions the clients saw committed.
        failed: submissions that ended with an exception.
        lock_failures: lock failures the clients retried.
        seconds: the submission phase's duration.
        work_dir: the work directory (kept when the run failed or ``keep`` was set).
        errors: what stopped the run before its checks (a worker error, a timeout).
    """

    checks: list[ChaosCheck] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    acknowledged: int = 0
    failed: int = 0
    lock_failures: int = 0
    seconds: float = 0.0
    work_dir: Path | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when there were checks, all passed, and nothing stopped the run."""
        return bool(self.checks) and all(c.passed for c in self.checks) and not self.errors
