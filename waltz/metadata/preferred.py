"""Servers' preferred partitions set at run time: the ``<root>/server/preferred`` znode.

Design: docs/design/server.md "Preferred partitions"; docs/design/zookeeper.md "Server members and
partition assignment". A server states preferred partitions in its configuration
(``server.preferredPartitions``, copied into its member znode). An operator changes them at run
time with ``waltz server preferred add|remove``, which writes this znode by compare-and-set: a map
from a server's endpoint (``host:port``, stable across restarts, unlike its member name) to its
partitions. An entry replaces that server's configured list; the cluster manager watches the
znode and applies it at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Self

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from waltz.errors import MetadataError, StaleMetadataError
from waltz.metadata.assignment import Member
from waltz.metadata.values import _dump, _field, _load
from waltz.metadata.zk import ClusterPaths

__all__ = [
    "PreferredPartitions",
    "preferred_path",
    "read_preferred",
    "update_preferred",
    "with_preferences",
]

#: Attempts of the compare-and-set loop of :func:`update_preferred`.
MAX_CAS_ATTEMPTS = 20


def preferred_path(paths: ClusterPaths) -> str:
    """The znode path ``<root>/server/preferred``."""
    return paths.server_preferred


@dataclass(frozen=True, slots=True)
class PreferredPartitions:
    """Run-time preferred partitions: server endpoint -> partitions (sorted, unique).

    An endpoint with an entry (even an empty one) uses it instead of its configured
    ``server.preferredPartitions``.
    """

    servers: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump({"servers": {e: list(p) for e, p in sorted(self.servers.items())}})

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        raw = _field(_load(data, path), "servers", dict, path)
        servers: dict[str, tuple[int, ...]] = {}
        for endpoint, partitions in raw.items():
            if not isinstance(partitions, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) for p in partitions
            ):
                raise MetadataError(f"znode {path}: server {endpoint!r} has partitions {partitions!r}")
            servers[endpoint] = tuple(sorted(set(partitions)))
        return cls(servers)

    def of(self, endpoint: str, configured: Sequence[int]) -> tuple[int, ...]:
        """The partitions the server at ``endpoint`` prefers: its entry, else ``configured``."""
        entry = self.servers.get(endpoint)
        return tuple(sorted(set(configured))) if entry is None else entry


def with_preferences(members: Sequence[Member], preferred: PreferredPartitions) -> list[Member]:
    """The members with their effective preferred partitions: the znode's entry for a member's
    endpoint where there is one, its configured list otherwise (what the cluster manager places
    by: docs/design/server.md "Preferred partitions")."""
    return [
        dataclasses.replace(m, preferred_partitions=preferred.of(m.endpoint, m.preferred_partitions))
        for m in members
    ]


def read_preferred(
    zk: KazooClient, paths: ClusterPaths, watch: Callable[..., None] | None = None
) -> tuple[PreferredPartitions, int]:
    """The run-time preferences and the znode's version (-1: not written yet).

    Args:
        zk: a started kazoo client.
        paths: the cluster's znode paths.
        watch: a one-shot kazoo watch, set on the znode (also when it does not exist yet).

    Raises:
        MetadataError: the znode does not decode.
    """
    path = preferred_path(paths)
    try:
        data, stat = zk.get(path, watch=watch)
    except NoNodeError:
        if watch is not None:
            zk.exists(path, watch=watch)  # fires when the znode is created
        return PreferredPartitions(), -1
    return PreferredPartitions.decode(data, path), stat.version


def update_preferred(
    zk: KazooClient,
    paths: ClusterPaths,
    endpoint: str,
    configured: Sequence[int],
    *,
    add: Iterable[int] = (),
    remove: Iterable[int] = (),
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Add and remove preferred partitions of one server, by compare-and-set.

    Args:
        zk: a started kazoo client.
        paths: the cluster's znode paths.
        endpoint: the server's ``host:port`` (as in its member znode).
        configured: the server's configured preferred partitions (the starting point when the
            znode has no entry for it yet).
        add: partitions to add.
        remove: partitions to remove.

    Returns:
        The server's preferred partitions before and after the change.

    Raises:
        StaleMetadataError: the znode kept changing under the update.
        MetadataError: the znode does not decode.
    """
    path = preferred_path(paths)
    to_add, to_remove = set(add), set(remove)
    for _ in range(MAX_CAS_ATTEMPTS):
        current, version = read_preferred(zk, paths)
        before = current.of(endpoint, configured)
        after = tuple(sorted((set(before) | to_add) - to_remove))
        new = PreferredPartitions({**current.servers, endpoint: after})
        try:
            if version < 0:
                zk.create(path, new.encode(), makepath=True)
            else:
                zk.set(path, new.encode(), version=version)
        except (BadVersionError, NodeExistsError):
            continue
        return before, after
    raise StaleMetadataError(f"znode {path} kept changing: gave up after {MAX_CAS_ATTEMPTS} attempts")
