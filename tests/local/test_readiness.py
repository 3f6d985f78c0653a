"""What a not-ready local cluster reports: problems as records, and the logs they point at; and
the two checks on ZooKeeper's state that keep it not ready while a share is still to move.

The processes are real (a sleeping Python each, with a log file of its own) so that "running" and
"not running" are what the operating system says; no Waltz node is needed to choose logs. The
membership and assignment checks read a real ZooKeeper, with the znodes a server and the cluster
manager would write.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from waltz.local.nodes import LocalServer, LocalStorageNode
from waltz.local.processes import ManagedProcess
from waltz.local.readiness import (
    PartitionProblem,
    Problem,
    not_ready_message,
    pending_moves,
    probe_partitions,
)
from waltz.metadata.assignment import Member, PartitionAssignment, Placement, compute_assignment
from waltz.metadata.paths import ClusterPaths
from waltz.metadata.preferred import PreferredPartitions, preferred_path

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[list[LocalServer], list[LocalStorageNode]]]:
    """Two servers and two storage nodes whose processes sleep; each log holds its own name."""
    servers = [LocalServer("127.0.0.1:1", "/waltz/x", name=f"server-{j}") for j in range(2)]
    storages = [LocalStorageNode(tmp_path / f"storage-{i}", name=f"storage-{i}") for i in range(2)]
    processes = []
    for node in [*servers, *storages]:
        log = tmp_path / f"{node.process.name}.log"
        log.write_text(f"log line of {node.process.name}\n")
        node.process = ManagedProcess(SLEEP, name=node.process.name, log_path=log)
        processes.append(node.process)
    try:
        for process in processes:
            process.start()
        yield servers, storages
    finally:
        for process in processes:
            process.close()


def _logs_shown(message: str) -> set[str]:
    return {line.split("log line of ")[1] for line in message.splitlines() if line.startswith("log line of ")}


def test_a_problem_reads_as_a_sentence_with_its_partition_and_values() -> None:
    problem = PartitionProblem(Problem.NO_QUORUM, 3, "server-1", "replicas in its store session: none")
    assert str(problem) == (
        "partition 3: the owner's store session has no quorum of replicas yet "
        "(replicas in its store session: none)"
    )
    assert str(PartitionProblem(Problem.ZOOKEEPER_UNREADABLE, detail="ConnectionLoss()")) == (
        "the cluster: the cluster's state could not be read from ZooKeeper (ConnectionLoss())"
    )


def test_a_store_session_without_quorum_shows_its_owner_and_the_storage_nodes(
    nodes: tuple[list[LocalServer], list[LocalStorageNode]],
) -> None:
    servers, storages = nodes
    problems = [PartitionProblem(Problem.NO_QUORUM, 0, "server-1", "replicas in its store session: none")]
    message = not_ready_message("not ready:", problems, servers, storages, None)
    assert _logs_shown(message) == {"server-1", "storage-0", "storage-1"}
    assert "  - partition 0: the owner's store session has no quorum" in message


def test_a_partition_without_owner_shows_every_server_and_no_storage_node(
    nodes: tuple[list[LocalServer], list[LocalStorageNode]],
) -> None:
    servers, storages = nodes
    problems = [PartitionProblem(Problem.UNASSIGNED, 1, detail="2 of 2 servers run")]
    message = not_ready_message("not ready:", problems, servers, storages, None)
    assert _logs_shown(message) == {"server-0", "server-1"}


def test_a_silent_owner_shows_that_owner_alone(
    nodes: tuple[list[LocalServer], list[LocalStorageNode]],
) -> None:
    servers, storages = nodes
    problems = [PartitionProblem(Problem.OWNER_SILENT, 2, "server-0", "server-0 at 127.0.0.1:1: timeout")]
    message = not_ready_message("not ready:", problems, servers, storages, None)
    assert _logs_shown(message) == {"server-0"}


def test_a_stopped_process_is_shown_whatever_the_problems(
    nodes: tuple[list[LocalServer], list[LocalStorageNode]],
) -> None:
    servers, storages = nodes
    storages[1].process.kill()
    problems = [PartitionProblem(Problem.OWNER_SILENT, 2, "server-0", "timeout")]
    message = not_ready_message("not ready:", problems, servers, storages, None)
    assert _logs_shown(message) == {"server-0", "storage-1"}
    assert "storage-1: NOT RUNNING" in message


A = Member("member-0000000000", "127.0.0.1:1", server_name="server-0")
B = Member("member-0000000001", "127.0.0.1:2", server_name="server-1")
#: Four partitions, every one on server-0: what the manager writes before server-1 joins.
ALL_ON_A = PartitionAssignment({pid: Placement(A.name, A.endpoint, 1) for pid in range(4)})


def _join(zk: KazooClient, paths: ClusterPaths, *members: Member) -> None:
    for member in members:
        zk.create(f"{paths.members}/{member.name}", member.encode(), makepath=True)


def test_a_running_server_that_has_not_joined_keeps_the_cluster_not_ready(
    nodes: tuple[list[LocalServer], list[LocalStorageNode]], zk_client: KazooClient, zk_root: str
) -> None:
    servers, _ = nodes
    paths = ClusterPaths.of(zk_root)
    _join(zk_client, paths, A)  # server-0 joined; server-1 runs but has no member znode yet

    owners, problems = probe_partitions(zk_client, paths, 0, 3, servers, None, active=servers)

    assert owners == {}
    assert problems == [
        PartitionProblem(Problem.NOT_JOINED, None, "server-1", f"server-1 at {servers[1].endpoint}")
    ]
    assert str(problems[0]).startswith("the cluster: a running server has not joined the cluster yet")
    # A server that does not run, or is paused, is not waited for.
    assert probe_partitions(zk_client, paths, 0, 3, servers, None, active=servers[:1]) == ({}, [])


def test_a_share_still_to_move_to_a_new_member_is_a_pending_move(
    zk_client: KazooClient, zk_root: str
) -> None:
    paths = ClusterPaths.of(zk_root)
    _join(zk_client, paths, A, B)
    zk_client.create(paths.server_assignment, ALL_ON_A.encode(), makepath=True)

    members, moves = pending_moves(zk_client, paths, 4, ALL_ON_A)

    assert members == [A, B]
    assert sorted(moves) == [2, 3]
    assert set(moves.values()) == {B}
    # What the cluster manager writes for these members is stable: nothing left to move.
    placed = compute_assignment(4, [A, B], ALL_ON_A)
    assert pending_moves(zk_client, paths, 4, placed) == ([A, B], {})


def test_a_pending_move_follows_the_run_time_preferred_partitions(
    zk_client: KazooClient, zk_root: str
) -> None:
    paths = ClusterPaths.of(zk_root)
    _join(zk_client, paths, A, B)
    zk_client.create(
        preferred_path(paths), PreferredPartitions({A.endpoint: (0, 1, 2, 3)}).encode(), makepath=True
    )

    members, moves = pending_moves(zk_client, paths, 4, ALL_ON_A)

    # server-0 prefers every partition: the cluster manager leaves them all there.
    assert moves == {}
    assert members[0].preferred_partitions == (0, 1, 2, 3)
