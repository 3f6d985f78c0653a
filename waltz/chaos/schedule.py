"""Fault kinds and fault schedules for ``waltz chaos``: random from a seed, or fixed, always printable.

A schedule is a list of :class:`Fault` s, each struck when the run has acknowledged a fraction of
its transactions (``at``) and healed ``duration`` seconds later. Faults never overlap, so at most
one storage node (or two of five), one server, or ZooKeeper is down at a time: always a minority
(docs/chaos.md "The fault schedule"). The same seed and options give the same schedule, printed at the start
of a run so that a failure can be replayed with ``--seed``.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "ARCHIVE_FAULTS",
    "DEFAULT_FAULTS",
    "NAMESPACE_DEFAULT_FAULTS",
    "NAMESPACE_FAULTS",
    "NETWORK_FAULTS",
    "OWNER_FAULTS",
    "OWNER_PAUSE_MARGIN",
    "SERVER_FAULTS",
    "SPLIT_FAULTS",
    "STORAGE_FAULTS",
    "Fault",
    "FaultKind",
    "fixed_schedule",
    "parse_fault_kinds",
    "random_schedule",
    "schedule_shortfalls",
]


class FaultKind(enum.Enum):
    """What a fault does; its value is the name used by ``--faults``."""

    KILL_STORAGE = "kill-storage"
    """``kill -9`` a minority of the storage nodes, restart them after the duration."""
    KILL_SERVER = "kill-server"
    """``kill -9`` one server, restart it after the duration."""
    KILL_ZOOKEEPER = "kill-zookeeper"
    """``kill -9`` ZooKeeper, restart it after the duration."""
    PAUSE_STORAGE = "pause-storage"
    """``SIGSTOP`` a minority of the storage nodes, ``SIGCONT`` after the duration."""
    PAUSE_SERVER = "pause-server"
    """``SIGSTOP`` one server, ``SIGCONT`` after the duration."""
    PAUSE_ZOOKEEPER = "pause-zookeeper"
    """``SIGSTOP`` ZooKeeper, ``SIGCONT`` after the duration."""
    PAUSE_OWNER = "pause-owner"
    """``SIGSTOP`` the server owning a partition for longer than the servers' ZooKeeper session
    timeout, ``SIGCONT`` after the duration: its partitions move while it sleeps, and it wakes up
    with the clients' appends in flight and their flushes waiting on it."""
    CUT_CLIENTS = "cut-clients"
    """Cut the client connections of one server and refuse new ones for the duration."""
    CUT_STORAGE = "cut-storage"
    """Cut the server connections of a minority of storage nodes, refuse new ones for the duration."""
    DELAY_CLIENTS = "delay-clients"
    """Delay every byte between clients and one server for the duration."""
    DELAY_STORAGE = "delay-storage"
    """Delay every byte between the servers and a minority of storage nodes for the duration."""
    ISOLATE_SERVER = "isolate-server"
    """Namespace mode: one server's host loses every peer (its link is down) for the duration."""
    ISOLATE_STORAGE = "isolate-storage"
    """Namespace mode: the hosts of a minority of the storage nodes lose every peer."""
    SPLIT_OWNER = "split-owner"
    """Namespace mode: the host of the server owning a partition, and the first client host, are
    cut from ZooKeeper's host, both ways, and from nothing else, for longer than the session
    timeout: the owner's session expires and another server takes its partitions under a newer
    generation while clients and storage nodes still reach the stale owner, and a client on its
    side does not learn of the move (split brain; the storage nodes' fence must stop it)."""
    PARTITION_STORAGE = "partition-storage"
    """Namespace mode: the hosts of a minority of the storage nodes are cut from every server's
    host, both ways; ZooKeeper and the other nodes still reach them."""
    ONE_WAY_STORAGE = "one-way-storage"
    """Namespace mode: what the servers send to a minority of the storage nodes is dropped, while
    what those nodes send still arrives."""
    ONE_WAY_OWNER = "one-way-owner"
    """Namespace mode: what ZooKeeper sends to the owner of a partition is dropped, while what
    the owner sends still reaches ZooKeeper, for longer than the session timeout."""
    KILL_SERVER_ARCHIVING = "kill-server-archiving"
    """``--archive``: ``kill -9`` one server right after the archiver reports a chunk (an archive
    round in progress), restart it after the duration."""
    KILL_STORAGE_ARCHIVING = "kill-storage-archiving"
    """``--archive``: ``kill -9`` a minority of the storage nodes (which the archiver reads from)
    right after the archiver reports a chunk, restart them after the duration."""
    KILL_ARCHIVER = "kill-archiver"
    """``--archive``: ``kill -9`` the archiver right after it reports a chunk (between writing it
    and raising the archived-through), start it again after the duration."""
    KILL_SERVER_SPLITTING = "kill-server-splitting"
    """``--split-to``: split the log to that count while the clients write (``waltz cluster
    split``), and ``kill -9`` the server owning a parent partition as soon as that parent is
    marked sealing, in the middle of the handover; restart it after the duration. The split is
    run again, resuming where it stopped, until it completes. Scheduled once by ``--split-to``
    (at ``--split-at``), never drawn at random."""


#: Seconds a ``pause-owner`` fault lasts beyond the servers' ZooKeeper session timeout (at least):
#: time for ZooKeeper to expire the session, the cluster manager to move the partitions and their
#: new owners to recover them while the old owner still sleeps.
OWNER_PAUSE_MARGIN = 2.0

#: Kinds that need the fault proxies (processes on loopback only).
NETWORK_FAULTS = frozenset(
    {FaultKind.CUT_CLIENTS, FaultKind.CUT_STORAGE, FaultKind.DELAY_CLIENTS, FaultKind.DELAY_STORAGE}
)
#: Kinds that cut hosts apart: they need every process on a host of its own (namespace mode).
NAMESPACE_FAULTS = frozenset(
    {
        FaultKind.ISOLATE_SERVER,
        FaultKind.ISOLATE_STORAGE,
        FaultKind.SPLIT_OWNER,
        FaultKind.PARTITION_STORAGE,
        FaultKind.ONE_WAY_STORAGE,
        FaultKind.ONE_WAY_OWNER,
    }
)
#: Kinds that need the archiver of ``--archive``.
ARCHIVE_FAULTS = frozenset(
    {FaultKind.KILL_SERVER_ARCHIVING, FaultKind.KILL_STORAGE_ARCHIVING, FaultKind.KILL_ARCHIVER}
)
#: Kinds that need ``--split-to``: the schedule holds one, at ``--split-at``.
SPLIT_FAULTS = frozenset({FaultKind.KILL_SERVER_SPLITTING})
#: Kinds aimed at the owner of a partition (found when they strike), which last longer than the
#: servers' session timeout so that the partition moves while they last.
OWNER_FAULTS = frozenset({FaultKind.PAUSE_OWNER, FaultKind.SPLIT_OWNER, FaultKind.ONE_WAY_OWNER})
#: Kinds whose targets are storage node indexes.
STORAGE_FAULTS = frozenset(
    {
        FaultKind.KILL_STORAGE,
        FaultKind.KILL_STORAGE_ARCHIVING,
        FaultKind.PAUSE_STORAGE,
        FaultKind.CUT_STORAGE,
        FaultKind.DELAY_STORAGE,
        FaultKind.ISOLATE_STORAGE,
        FaultKind.PARTITION_STORAGE,
        FaultKind.ONE_WAY_STORAGE,
    }
)
#: Kinds whose targets are server indexes.
SERVER_FAULTS = frozenset(
    {
        FaultKind.KILL_SERVER,
        FaultKind.KILL_SERVER_ARCHIVING,
        FaultKind.PAUSE_SERVER,
        FaultKind.CUT_CLIENTS,
        FaultKind.DELAY_CLIENTS,
        FaultKind.ISOLATE_SERVER,
    }
)
#: Kinds of the random schedule on loopback when ``--faults`` is ``all`` (or not given).
DEFAULT_FAULTS: tuple[FaultKind, ...] = tuple(
    k for k in FaultKind if k not in NAMESPACE_FAULTS and k not in ARCHIVE_FAULTS and k not in SPLIT_FAULTS
)
#: Kinds of the random schedule in namespace mode when ``--faults`` is ``all``: real cuts instead
#: of the proxies.
NAMESPACE_DEFAULT_FAULTS: tuple[FaultKind, ...] = tuple(
    k for k in FaultKind if k not in NETWORK_FAULTS and k not in ARCHIVE_FAULTS and k not in SPLIT_FAULTS
)


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of a schedule.

    Attributes:
        at: the fraction (0..1) of the run's transactions acknowledged when it strikes.
        kind: what it does.
        targets: indexes of the storage nodes or servers it hits (empty for ZooKeeper; for
            ``pause-owner``, ``split-owner``, ``one-way-owner`` and ``kill-server-splitting`` the
            partition whose owner it hits, found when it strikes).
        duration: seconds until it is healed (restart, resume, unblock, no more delay).
        delay: seconds of added latency (delay kinds only).
    """

    at: float
    kind: FaultKind
    targets: tuple[int, ...] = ()
    duration: float = 3.0
    delay: float = 0.0

    def describe(self) -> str:
        """One line for people, e.g. ``at 25%: kill-storage [1] for 3.0s``."""
        if self.kind in OWNER_FAULTS or self.kind in SPLIT_FAULTS:
            targets = "".join(f" of partition {t}" for t in self.targets)
        else:
            targets = f" {list(self.targets)}" if self.targets else ""
        delay = f" by {self.delay * 1000:.0f}ms" if self.delay else ""
        return f"at {self.at:.0%}: {self.kind.value}{targets}{delay} for {self.duration:.1f}s"


def parse_fault_kinds(
    text: str, network: str = "loopback", *, archive: bool = False
) -> tuple[FaultKind, ...]:
    """Parse ``--faults``: comma-separated kind names, ``all``, or ``none``.

    Args:
        text: the option's value.
        network: ``loopback`` or ``namespaces``: what ``all`` means (:data:`DEFAULT_FAULTS` or
            :data:`NAMESPACE_DEFAULT_FAULTS`).
        archive: a run with the archiver: ``all`` also means every kind of :data:`ARCHIVE_FAULTS`.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names in (["all"], []):
        if not names:
            return ()
        kinds = NAMESPACE_DEFAULT_FAULTS if network == "namespaces" else DEFAULT_FAULTS
        return kinds + tuple(k for k in FaultKind if k in ARCHIVE_FAULTS) if archive else kinds
    if names == ["none"]:
        return ()
    known = {k.value: k for k in FaultKind}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(known)}, all, none")
    return tuple(dict.fromkeys(known[n] for n in names))


def _minority(count: int) -> int:
    """The largest minority of ``count`` nodes (1 of 3, 2 of 5)."""
    return max(1, (count - 1) // 2)


def random_schedule(
    seed: int,
    kinds: Sequence[FaultKind],
    *,
    count: int,
    storages: int,
    servers: int,
    max_duration: float = 6.0,
    partitions: int = 1,
    session_timeout: float = 4.0,
) -> list[Fault]:
    """A random schedule of ``count`` faults of the given kinds, spread over the run.

    The same arguments always give the same schedule.

    Args:
        seed: the run's seed.
        kinds: the kinds to draw from (empty: no fault; :data:`SPLIT_FAULTS` are never drawn).
        count: how many faults.
        storages: the number of storage nodes (a minority of them may be hit at once).
        servers: the number of servers.
        max_duration: the longest duration in seconds (durations are drawn from 1 to this).
        partitions: the number of partitions (the owner faults hit the owner of one of them).
        session_timeout: the servers' ZooKeeper session timeout in seconds: an owner fault
            (:data:`OWNER_FAULTS`) lasts that long plus :data:`OWNER_PAUSE_MARGIN` plus its drawn
            duration, so that the session expires and the partitions move while it lasts.

    Returns:
        The faults by increasing ``at``, between 5% and 85% of the run.
    """
    kinds = [k for k in kinds if k not in SPLIT_FAULTS]  # scheduled by --split-to, never drawn
    if not kinds or count <= 0:
        return []
    rng = random.Random(f"chaos-schedule-{seed}")
    points = sorted(rng.uniform(0.05, 0.85) for _ in range(count))
    faults: list[Fault] = []
    for at in points:
        kind = rng.choice(kinds)
        targets: tuple[int, ...] = ()
        if kind in STORAGE_FAULTS:
            targets = tuple(sorted(rng.sample(range(storages), rng.randint(1, _minority(storages)))))
        elif kind in SERVER_FAULTS:
            targets = (rng.randrange(servers),)
        elif kind in OWNER_FAULTS:
            targets = (rng.randrange(partitions),)
        delay = (
            round(rng.uniform(0.02, 0.3), 3)
            if kind in (FaultKind.DELAY_CLIENTS, FaultKind.DELAY_STORAGE)
            else 0.0
        )
        duration = rng.uniform(1.0, max_duration)
        if kind in OWNER_FAULTS:
            duration += session_timeout + OWNER_PAUSE_MARGIN
        faults.append(Fault(round(at, 3), kind, targets, round(duration, 1), delay))
    return faults


def fixed_schedule(
    kinds: Iterable[FaultKind] | None = None,
    *,
    network: str = "loopback",
    session_timeout: float = 4.0,
    archive: bool = False,
) -> list[Fault]:
    """The short run's fixed schedule.

    On loopback: kill -9 a storage node, a server, and cut server→storage through a proxy. In
    namespace mode, one real cut of each kind of :data:`NAMESPACE_FAULTS`: the partition 0 owner cut
    from ZooKeeper (split brain), a storage host isolated, ZooKeeper's packets to the partition 1
    owner dropped, a storage host cut from the servers, the servers' packets to a storage host
    dropped, a server host isolated (the last fault of a run may be cut short when the clients
    finish first, so the long owner faults come early).

    Args:
        kinds: keep only faults of these kinds (None: all of the network's).
        network: ``loopback`` or ``namespaces``.
        session_timeout: the servers' ZooKeeper session timeout in seconds (owner faults outlast it
            by :data:`OWNER_PAUSE_MARGIN` and a second).
        archive: a run with the archiver (on loopback): a server killed while an archive round is
            in progress, the archiver killed and started again, and a storage node killed while
            an archive round is in progress, between the loopback faults.

    Returns:
        The faults by increasing ``at``.
    """
    if network == "namespaces":
        owner = round(session_timeout + OWNER_PAUSE_MARGIN + 1.0, 1)
        schedule = [
            Fault(0.10, FaultKind.SPLIT_OWNER, (0,), owner),
            Fault(0.25, FaultKind.ISOLATE_STORAGE, (1,), 2.0),
            Fault(0.40, FaultKind.ONE_WAY_OWNER, (1,), owner),
            Fault(0.55, FaultKind.PARTITION_STORAGE, (2,), 2.0),
            Fault(0.70, FaultKind.ONE_WAY_STORAGE, (0,), 2.0),
            Fault(0.85, FaultKind.ISOLATE_SERVER, (1,), 2.0),
        ]
    elif archive:
        schedule = [
            Fault(0.15, FaultKind.KILL_STORAGE, (0,), 2.0),
            Fault(0.30, FaultKind.KILL_SERVER_ARCHIVING, (1,), 2.0),
            Fault(0.45, FaultKind.KILL_ARCHIVER, (), 2.0),
            Fault(0.60, FaultKind.KILL_STORAGE_ARCHIVING, (1,), 2.0),
            Fault(0.75, FaultKind.CUT_STORAGE, (2,), 2.0),
        ]
    else:
        schedule = [
            Fault(0.20, FaultKind.KILL_STORAGE, (0,), 2.0),
            Fault(0.45, FaultKind.KILL_SERVER, (1,), 2.0),
            Fault(0.70, FaultKind.CUT_STORAGE, (2,), 2.0),
        ]
    wanted = set(FaultKind) if kinds is None else set(kinds)
    return [f for f in schedule if f.kind in wanted]


def schedule_shortfalls(
    schedule: Iterable[Fault], *, storages: int, servers: int, partitions: int
) -> list[str]:
    """What a schedule strikes that the cluster does not have, one phrase per option to raise.

    A fault of :data:`STORAGE_FAULTS` targets storage node indexes, of :data:`SERVER_FAULTS` server
    indexes, of :data:`OWNER_FAULTS` and :data:`SPLIT_FAULTS` partitions (docs/chaos.md "The fault
    schedule").

    Returns:
        E.g. ``["--servers 2 or more (kill-server of server 1)"]``; empty when every target exists.
    """
    counts = {"storage": storages, "server": servers, "partition": partitions}
    needed: dict[str, tuple[int, list[str]]] = {}
    for fault in schedule:
        if not fault.targets:
            continue
        if fault.kind in STORAGE_FAULTS:
            what = "storage"
        elif fault.kind in SERVER_FAULTS:
            what = "server"
        elif fault.kind in OWNER_FAULTS or fault.kind in SPLIT_FAULTS:
            what = "partition"
        else:
            continue
        highest = max(fault.targets)
        if highest >= counts[what]:
            least, faults = needed.get(what, (0, []))
            needed[what] = (max(least, highest + 1), [*faults, f"{fault.kind.value} of {what} {highest}"])
    return [
        f"--{what}s {least} or more ({', '.join(faults)})"
        for what, (least, faults) in sorted(needed.items(), key=lambda item: list(counts).index(item[0]))
    ]
