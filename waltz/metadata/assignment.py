"""Partition assignment to servers: members, the assignment znode, and the placement rule.

Design: docs/design/server.md "Cluster manager"; docs/design/zookeeper.md "Generations and store
session IDs" (the cluster manager assigns each partition to exactly one server and bumps the
partition's generation every time the partition moves). The elected cluster manager
(:mod:`waltz.services.server.cluster_manager`) computes placements with
:func:`compute_assignment` and writes them to ``<root>/server/assignment`` by compare-and-set;
servers register as ephemeral sequential ``<root>/server/members/member-<n>`` znodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Self

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from waltz.errors import MetadataError
from waltz.metadata.values import _dump, _field, _load
from waltz.metadata.zk import ClusterPaths
from waltz.metadata.zk_session import ZooKeeperUnavailableError, get_within

__all__ = [
    "PARTITION_EPOCHS_FEATURE",
    "SERVER_FEATURES",
    "Member",
    "PartitionAssignment",
    "Placement",
    "compute_assignment",
    "read_assignment",
    "read_members",
]

MEMBER_PREFIX = "member-"


#: The feature of a server that follows ``<root>/partitions/epochs``: it refuses appends routed
#: by an older epoch, writes its barrier when a parent it owns seals, and opens a split's new
#: partitions at their genesis (docs/design/splits.md "The handover").
PARTITION_EPOCHS_FEATURE = "partition-epochs"
#: What a server of this release writes in its member znode.
SERVER_FEATURES: tuple[str, ...] = (PARTITION_EPOCHS_FEATURE,)


@dataclass(frozen=True, slots=True)
class Member:
    """A live server: its member znode name, its client endpoint, its preferred partitions.

    Attributes:
        name: the member znode's name (``member-0000000007``); its number is the server ID.
        endpoint: ``host:port`` where clients reach the server.
        preferred_partitions: partitions this server should own when it can (its configured
            ``server.preferredPartitions``; ``<root>/server/preferred`` may override them).
        health_url: the server's ``/health`` URL when it serves one, else None.
        server_name: the name the operator gave the server (``server.name``), the same across
            its restarts, or None (tools then show its endpoint).
        features: what the server's release does that older releases do not (docs/zookeeper.md
            "``<root>/server/members/member-<n>``: a live server"):
            :data:`PARTITION_EPOCHS_FEATURE` for one that follows ``partitions/epochs``; empty
            for a release before features were listed.
    """

    name: str
    endpoint: str
    preferred_partitions: tuple[int, ...] = ()
    health_url: str | None = None
    server_name: str | None = None
    features: tuple[str, ...] = ()

    @property
    def display_name(self) -> str:
        """What tools call the server: its ``server.name``, else its endpoint."""
        return self.server_name or self.endpoint

    @property
    def server_id(self) -> int:
        """The server ID: the sequence number ZooKeeper gave the member znode."""
        return int(self.name.removeprefix(MEMBER_PREFIX))

    def encode(self) -> bytes:
        value: dict[str, object] = {
            "endpoint": self.endpoint,
            "preferred_partitions": list(self.preferred_partitions),
        }
        if self.health_url is not None:
            value["health_url"] = self.health_url
        if self.server_name is not None:
            value["server_name"] = self.server_name
        if self.features:
            value["features"] = list(self.features)
        return _dump(value)

    @classmethod
    def decode(cls, name: str, data: bytes, path: str) -> Self:
        value = _load(data, path)
        preferred = value.get("preferred_partitions", [])
        if not isinstance(preferred, list) or not all(isinstance(p, int) for p in preferred):
            raise MetadataError(f"znode {path}: preferred_partitions is {preferred!r}")
        health_url = value.get("health_url")
        if health_url is not None and not isinstance(health_url, str):
            raise MetadataError(f"znode {path}: health_url is {health_url!r}")
        server_name = value.get("server_name")
        if server_name is not None and not isinstance(server_name, str):
            raise MetadataError(f"znode {path}: server_name is {server_name!r}")
        features = value.get("features", [])
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise MetadataError(f"znode {path}: features is {features!r}")
        return cls(
            name,
            _field(value, "endpoint", str, path),
            tuple(preferred),
            health_url,
            server_name,
            tuple(features),
        )


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one partition lives: the owning member (None: no live server) and its generation."""

    member: str | None
    endpoint: str | None
    generation: int


@dataclass(frozen=True, slots=True)
class PartitionAssignment:
    """The content of ``<root>/server/assignment``: a placement per partition."""

    placements: Mapping[int, Placement] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump(
            {
                "partitions": {
                    str(pid): {"member": p.member, "endpoint": p.endpoint, "generation": p.generation}
                    for pid, p in sorted(self.placements.items())
                }
            }
        )

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        raw = _field(_load(data, path), "partitions", dict, path)
        placements: dict[int, Placement] = {}
        for key, value in raw.items():
            if not (key.isascii() and key.isdigit()) or not isinstance(value, dict):
                raise MetadataError(f"znode {path}: bad placement {key!r}: {value!r}")
            member, endpoint = value.get("member"), value.get("endpoint")
            if member is not None and not isinstance(member, str):
                raise MetadataError(f"znode {path}: partition {key} has member {member!r}")
            if endpoint is not None and not isinstance(endpoint, str):
                raise MetadataError(f"znode {path}: partition {key} has endpoint {endpoint!r}")
            placements[int(key)] = Placement(member, endpoint, _field(value, "generation", int, path))
        return cls(placements)

    def partitions_of(self, member: str) -> dict[int, int]:
        """Partition ID -> generation of every partition placed on ``member``."""
        return {pid: p.generation for pid, p in self.placements.items() if p.member == member}


def compute_assignment(
    partitions: int | Collection[int],
    members: Sequence[Member],
    current: PartitionAssignment,
    settled: Collection[str] = (),
) -> PartitionAssignment:
    """Place every partition on exactly one live member (docs/design/server.md "Preferred partitions").

    In order:

    1. a partition stays on its member while that member is alive and prefers it;
    2. a partition that a *settled* member prefers moves to it (the least loaded such member):
       this is how a preferred server reclaims its partitions once it has been back long enough;
    3. any other partition stays where it is while its member is alive and holds no more than
       its fair share (``ceil(partitions / members)``);
    4. the rest go first to a member that prefers them, then to the least loaded member, each
       below its fair share;
    5. a *settled* member that holds fewer than ``floor(partitions / members)`` takes partitions,
       one at a time, from the most loaded member holding more than that (a partition that member
       does not prefer, one the taker prefers first): a server that joined while the others were
       within their fair share, or the last one of a rolling restart, gets its share once settled
       (docs/design/server.md, "Cluster manager").

    Only preferred partitions take a member past its fair share. A partition's generation goes up
    by one every time its member changes, and is kept otherwise. Without members every partition
    is unplaced. Recomputing from the result changes nothing.

    Args:
        partitions: the IDs of the partitions that exist (the count at creation and the new
            children a split opened: ``PartitionEpochs.partition_ids``), or a count ``n`` for
            ``0 .. n - 1``. A placement in ``current`` of a partition not among them is dropped.
        members: the live servers, with their effective preferred partitions.
        current: the assignment now in ZooKeeper (may be empty).
        settled: names of the members allowed to take partitions from a live member, their
            preferred partitions (step 2) or their share (step 5): the cluster manager's
            hysteresis; empty: none may.

    Returns:
        The new assignment (equal to ``current`` when nothing needs to move).
    """
    ids = sorted(range(partitions) if isinstance(partitions, int) else set(partitions))
    by_name = {m.name: m for m in members}
    previous = {pid: current.placements.get(pid, Placement(None, None, 0)) for pid in ids}
    if not members:
        return PartitionAssignment({pid: Placement(None, None, p.generation) for pid, p in previous.items()})
    share = math.ceil(len(ids) / len(members))
    prefers = {m.name: frozenset(m.preferred_partitions) for m in members}
    load = dict.fromkeys(by_name, 0)
    owner: dict[int, str] = {}

    def place(pid: int, member: str) -> None:
        owner[pid] = member
        load[member] += 1

    for pid, placement in previous.items():
        if placement.member in by_name and pid in prefers[placement.member]:
            place(pid, placement.member)
    for pid in ids:
        claimants = [m for m in sorted(by_name) if m in settled and pid in prefers[m]]
        if pid not in owner and claimants:
            place(pid, min(claimants, key=lambda m: (load[m], m)))
    for pid, placement in previous.items():
        if pid not in owner and placement.member in by_name and load[placement.member] < share:
            place(pid, placement.member)
    # Unplaced partitions go first to members that prefer them, then to the least loaded.
    for preferred_only in (True, False):
        for pid in ids:
            if pid in owner:
                continue
            candidates = [
                m for m in sorted(by_name) if load[m] < share and (not preferred_only or pid in prefers[m])
            ]
            if candidates:
                place(pid, min(candidates, key=lambda m: (load[m], m)))
    floor = len(ids) // len(members)
    for taker in sorted(m for m in by_name if m in settled):
        while load[taker] < floor:
            donors = [
                m
                for m in by_name
                if load[m] > floor and any(o == m and p not in prefers[m] for p, o in owner.items())
            ]
            if not donors:
                break
            donor = max(donors, key=lambda m: (load[m], m))
            movable = [p for p, o in owner.items() if o == donor and p not in prefers[donor]]
            pid = max(movable, key=lambda p: (p in prefers[taker], p))
            load[donor] -= 1
            place(pid, taker)
    placements = {}
    for pid, placement in previous.items():
        member = owner[pid]
        generation = placement.generation if placement.member == member else placement.generation + 1
        placements[pid] = Placement(member, by_name[member].endpoint, generation)
    return PartitionAssignment(placements)


def read_members(
    zk: KazooClient,
    paths: ClusterPaths,
    watch: Callable[..., None] | None = None,
    *,
    timeout: float | None = None,
) -> list[Member]:
    """The live servers (their member znodes), sorted by name.

    Args:
        timeout: seconds each ZooKeeper read waits for its answer; None waits as long as kazoo
            does. The members' parent is made when missing, as kazoo waits.

    Raises:
        ZooKeeperUnavailableError: ZooKeeper did not answer within ``timeout``.
    """
    zk.ensure_path(paths.members)
    try:
        names = zk.get_children_async(paths.members, watch=watch).get(timeout=timeout)
    except zk.handler.timeout_exception:
        raise ZooKeeperUnavailableError(
            f"ZooKeeper did not list {paths.members} within {timeout:g}s"
        ) from None
    members = []
    for name in sorted(names):
        if not name.startswith(MEMBER_PREFIX):
            continue
        path = f"{paths.members}/{name}"
        try:
            data, _ = get_within(zk, path, timeout)
        except NoNodeError:
            continue  # it left while we listed
        members.append(Member.decode(name, data, path))
    return members


def read_assignment(
    zk: KazooClient, paths: ClusterPaths, *, timeout: float | None = None
) -> tuple[PartitionAssignment, int]:
    """The current partition assignment and its znode version (-1: not written yet).

    Args:
        timeout: seconds the read waits for ZooKeeper's answer; None waits as long as kazoo does.

    Raises:
        ZooKeeperUnavailableError: ZooKeeper did not answer within ``timeout``.
    """
    try:
        data, stat = get_within(zk, paths.server_assignment, timeout)
    except NoNodeError:
        return PartitionAssignment(), -1
    return PartitionAssignment.decode(data, paths.server_assignment), stat.version
