"""Whether a local cluster can write: each partition's owner, or what keeps it from writing.

A partition is ready when the assignment in ZooKeeper places it on a server, that server's
``Status`` (server admin protocol) lists it as writable under the assigned generation, and the
placement is the one the cluster manager keeps: every running server of the cluster has joined
(its member znode is there), and placing the partitions again over the members would move none
(docs/design/server.md "Preferred partitions"). Without the last two, a server that registers a
moment after the others is ready to take its share just as the cluster says it is ready, and the
owner a caller reads may be about to hand the partition over.

Each partition that is not ready yields a :class:`PartitionProblem`: a record of what is missing and
which process it concerns, from which :func:`not_ready_message` chooses the logs worth showing.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from kazoo.client import KazooClient

from waltz.admin.verify_servers import probe_servers
from waltz.errors import MetadataError, WaltzError
from waltz.local.nodes import LocalServer, LocalStorageNode
from waltz.local.processes import ManagedProcess
from waltz.local.zookeeper import LocalZooKeeper
from waltz.metadata.assignment import (
    Member,
    PartitionAssignment,
    compute_assignment,
    read_assignment,
    read_members,
)
from waltz.metadata.preferred import read_preferred, with_preferences
from waltz.metadata.zk import ClusterPaths
from waltz.protocol.channels import TlsConfig
from waltz.protocol.event_loop import run_on_shared_loop

__all__ = [
    "ClusterNotReadyError",
    "PartitionOwner",
    "PartitionProblem",
    "Problem",
    "not_ready_message",
    "pending_moves",
    "probe_partitions",
]


#: Seconds allowed for one server status call while polling.
STATUS_TIMEOUT = 2.0
#: Lines of a process's log shown when the cluster is not ready.
LOG_TAIL_LINES = 25


class ClusterNotReadyError(WaltzError, TimeoutError):
    """A partition of a local cluster had no writable owner in time, or has no owner right now.

    The message lists each partition that was not ready and why, the state of every process, and
    the tail of the relevant logs.
    """


@dataclass(frozen=True, slots=True)
class PartitionOwner:
    """The server that owns a partition and can write to it.

    Attributes:
        partition_id: the partition.
        endpoint: ``host:port`` of the owning server.
        generation: the generation under which it owns the partition.
        high_water_mark: the partition's committed high-water mark (-1: nothing committed yet).
    """

    partition_id: int
    endpoint: str
    generation: int
    high_water_mark: int


class Problem(enum.Enum):
    """What keeps the cluster from being ready, from the first step to the last (the last one: a
    partition its owner can write, but which the cluster manager is about to move)."""

    ZOOKEEPER_UNREADABLE = "the cluster's state could not be read from ZooKeeper"
    NOT_JOINED = "a running server has not joined the cluster yet"
    UNASSIGNED = "no server owns the partition yet"
    OWNER_SILENT = "the owner does not answer"
    NOT_OPENED = "the owner has not opened the partition yet"
    STALE_GENERATION = "the owner has another generation than the assigned one"
    NO_QUORUM = "the owner's store session has no quorum of replicas yet"
    MOVING = "the cluster manager has yet to move the partition to its share"


@dataclass(frozen=True, slots=True)
class PartitionProblem:
    """Why one partition is not ready (``str()`` gives the sentence shown to the user).

    Attributes:
        problem: what is missing.
        partition_id: the partition; None when the problem concerns the whole cluster.
        owner: the process name of the owning server (``server-1``), when one is assigned and
            is one of the cluster's servers.
        detail: the values that complete the sentence (an error, generations, replicas).
    """

    problem: Problem
    partition_id: int | None = None
    owner: str | None = None
    detail: str = ""

    def __str__(self) -> str:
        where = "the cluster" if self.partition_id is None else f"partition {self.partition_id}"
        return f"{where}: {self.problem.value}" + (f" ({self.detail})" if self.detail else "")


def pending_moves(
    zk: KazooClient, paths: ClusterPaths, partitions: int, assignment: PartitionAssignment
) -> tuple[list[Member], dict[int, Member]]:
    """The live members, and the partitions the cluster manager would place elsewhere now.

    The placement is computed again as the cluster manager computes it, with no member allowed
    to reclaim its preferred partitions early (that waits for its settling delay by design); on
    an assignment the manager wrote, and the members it wrote it for, this moves nothing.

    Returns:
        The members (their run-time preferred partitions applied), and partition ID -> the member
        it would move to, for each partition whose member would change.
    """
    members = read_members(zk, paths) if zk.exists(paths.members) else []
    try:
        preferred, _ = read_preferred(zk, paths)
        members = with_preferences(members, preferred)
    except MetadataError:
        pass  # the manager places by the configured preferences then too
    ids = set(range(partitions)) | set(assignment.placements)
    again = compute_assignment(ids, members, assignment)
    by_name = {m.name: m for m in members}
    moves = {}
    for pid, placement in again.placements.items():
        now = assignment.placements.get(pid)
        if placement.member is not None and (now is None or now.member != placement.member):
            moves[pid] = by_name[placement.member]
    return members, moves


def probe_partitions(
    zk: KazooClient,
    paths: ClusterPaths,
    partitions: int,
    replicas: int,
    servers: Sequence[LocalServer],
    tls: TlsConfig | None,
    *,
    active: Sequence[LocalServer] = (),
) -> tuple[dict[int, PartitionOwner], list[PartitionProblem]]:
    """The writable owners found now, and what is wrong with the other partitions.

    Args:
        zk: a started kazoo client of the cluster's ZooKeeper.
        paths: the cluster's znode paths.
        partitions: the cluster's number of partitions at creation (a split's new partitions are
            probed once placed).
        replicas: replicas per partition (the message of :attr:`Problem.NO_QUORUM` names it).
        servers: the cluster's servers (to name an owner by its process, and count the running).
        tls: client TLS files for the servers' ports; None: plaintext.
        active: the servers that run and are not paused: each must have joined (matched by its
            ``server.name``, the process name) before the cluster is ready.

    Returns:
        Partition ID -> its writable owner, and one problem per partition that is not ready
        (:attr:`Problem.NOT_JOINED` once per server that has not joined, for the whole cluster).

    Raises:
        ZooKeeperUnavailableError, kazoo errors: ZooKeeper could not be read.
        MetadataError: a znode of the cluster does not decode.
    """
    assignment, _ = read_assignment(zk, paths)
    members, moves = pending_moves(zk, paths, partitions, assignment)
    joined = {m.server_name or m.endpoint for m in members}
    names = {server.endpoint: server.process.name for server in servers}
    names.update({m.endpoint: m.server_name for m in members if m.server_name})
    problems: list[PartitionProblem] = [
        PartitionProblem(Problem.NOT_JOINED, None, s.process.name, f"{s.process.name} at {s.endpoint}")
        for s in active
        if s.process.name not in joined and s.endpoint not in joined
    ]
    placed: dict[Member, list[tuple[int, int]]] = {}
    # The partitions at creation, and every new partition of a split once the cluster manager
    # placed it (it is placed once opened: docs/design/splits.md "The handover", step 4).
    opened = {pid for pid in assignment.placements if pid >= partitions}
    for pid in sorted(set(range(partitions)) | opened):
        placement = assignment.placements.get(pid)
        if placement is None or placement.endpoint is None:
            running = sum(s.process.is_running() for s in servers)
            problems.append(
                PartitionProblem(Problem.UNASSIGNED, pid, detail=f"{running} of {len(servers)} servers run")
            )
        else:
            owner = Member(placement.member or "", placement.endpoint)
            placed.setdefault(owner, []).append((pid, placement.generation))
    probes = (
        run_on_shared_loop(probe_servers(list(placed), timeout=STATUS_TIMEOUT, tls=tls)) if placed else []
    )
    owners: dict[int, PartitionOwner] = {}
    for probe in probes:
        endpoint, placements = probe.member.endpoint, placed[probe.member]
        name = names.get(endpoint)
        who = f"{name} at {endpoint}" if name else endpoint
        if probe.status is None:
            problems += [
                PartitionProblem(Problem.OWNER_SILENT, pid, name, f"{who}: {probe.error}")
                for pid, _ in placements
            ]
            continue
        states = {p.partition_id: p for p in probe.status.partitions}
        for pid, generation in placements:
            state = states.get(pid)
            if state is None:
                problems.append(
                    PartitionProblem(Problem.NOT_OPENED, pid, name, f"{who}, generation {generation}")
                )
            elif state.generation != generation:
                problems.append(
                    PartitionProblem(
                        Problem.STALE_GENERATION,
                        pid,
                        name,
                        f"{who} has generation {state.generation}, assigned {generation}",
                    )
                )
            elif not state.writable:
                in_session = ", ".join(state.replicas_in_session) or "none"
                problems.append(
                    PartitionProblem(
                        Problem.NO_QUORUM,
                        pid,
                        name,
                        f"{who}; replicas in its store session: {in_session}; "
                        f"a majority of its {replicas} replicas is needed",
                    )
                )
            elif pid in moves:
                to = moves[pid]
                problems.append(
                    PartitionProblem(
                        Problem.MOVING,
                        pid,
                        name,
                        f"{who} holds it; {to.server_name or to.endpoint} at {to.endpoint} is to take it",
                    )
                )
            else:
                owners[pid] = PartitionOwner(pid, endpoint, generation, state.high_water_mark)
    return owners, problems


def not_ready_message(
    title: str,
    problems: Sequence[PartitionProblem],
    servers: Sequence[LocalServer],
    storages: Sequence[LocalStorageNode],
    zookeeper: LocalZooKeeper | None,
) -> str:
    """The message of a :class:`ClusterNotReadyError`: the problems, the processes, relevant logs.

    The logs shown are those the problems point at: each owner named by a problem, every server
    when a partition has no owner, the storage nodes when a store session lacks its quorum, and
    any process (ZooKeeper included) that is no longer running; every server's when none is.
    """
    lines = [title]
    lines += [f"  - {p}" for p in problems]
    lines.append("processes:")
    processes: list[ManagedProcess] = [*(n.process for n in storages), *(s.process for s in servers)]
    if zookeeper is not None:
        processes.insert(0, zookeeper.process)
    for process in processes:
        state = "running" if process.is_running() else f"NOT RUNNING (exit code {process.returncode})"
        lines.append(f"  {process.name}: {state}, pid {process.pid}, log {process.log_path}")
    kinds = {p.problem for p in problems}
    owners = {p.owner for p in problems if p.owner is not None}
    relevant = [
        s.process
        for s in servers
        if s.process.name in owners
        or kinds & {Problem.UNASSIGNED, Problem.MOVING}
        or not s.process.is_running()
    ]
    relevant += [n.process for n in storages if Problem.NO_QUORUM in kinds or not n.process.is_running()]
    if zookeeper is not None and not zookeeper.is_running():
        relevant.insert(0, zookeeper.process)
    for process in relevant or [s.process for s in servers]:
        lines.append(f"--- the last lines of {process.name}'s log ({process.log_path}):")
        lines.append(process.log_tail(LOG_TAIL_LINES))
    return "\n".join(lines)
