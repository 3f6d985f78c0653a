"""The cluster's servers as operators see them (``waltz server list``, ``waltz server preferred``).

Design: docs/design/server.md "Cluster manager", "Preferred partitions"; docs/design/zookeeper.md
"Server members and partition assignment". :func:`list_servers` joins the member znodes, the
partition assignment, the run-time preferences, each server's status (its admin service) and its
``/health`` endpoint when it publishes one. :func:`change_preferred` edits a server's run-time
preferred partitions in ``<root>/server/preferred``; the cluster manager applies them at once.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient

from waltz.admin.description import unknown_partitions
from waltz.admin.verify_servers import probe_servers
from waltz.errors import ConfigurationError
from waltz.metadata.assignment import Member, read_assignment, read_members
from waltz.metadata.preferred import read_preferred, update_preferred
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import zookeeper_errors
from waltz.protocol.channels import TlsConfig
from waltz.protocol.event_loop import run_on_shared_loop

__all__ = ["ServerInfo", "change_preferred", "is_live", "list_servers", "resolve_server"]


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """One live server.

    Attributes:
        member: its member znode name.
        server_id: its server ID.
        endpoint: ``host:port`` where clients reach it.
        configured_preferred: its ``server.preferredPartitions``.
        preferred: the preferred partitions in effect (``server/preferred`` over the configured).
        assigned: partition ID -> generation, per the assignment in ZooKeeper.
        cluster_manager: whether it is the elected cluster manager (None: no status).
        served: partition ID -> ``(generation, high-water mark, writable)`` from its status.
        status_error: why its status could not be read, or None.
        health: ``"healthy"``, ``"unhealthy"``, ``"unreachable"``, or None without a ``/health``.
        health_detail: the ``/health`` body's details, or what failed.
        name: its ``server.name``, or its endpoint when it has none.
    """

    member: str
    server_id: int
    endpoint: str
    configured_preferred: tuple[int, ...]
    preferred: tuple[int, ...]
    assigned: dict[int, int]
    cluster_manager: bool | None
    served: dict[int, tuple[int, int, bool]]
    status_error: str | None
    health: str | None
    health_detail: str = ""
    name: str = ""

    @property
    def heading(self) -> str:
        """``name: endpoint``, or the endpoint alone for a server without a ``server.name``."""
        return self.endpoint if self.name in ("", self.endpoint) else f"{self.name}: {self.endpoint}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``waltz server list --json``)."""
        return {
            "name": self.name or self.endpoint,
            "member": self.member,
            "server_id": self.server_id,
            "endpoint": self.endpoint,
            "configured_preferred_partitions": list(self.configured_preferred),
            "preferred_partitions": list(self.preferred),
            "partitions": [
                {
                    "partition_id": pid,
                    "generation": generation,
                    "high_water_mark": self.served[pid][1] if pid in self.served else None,
                    "writable": self.served[pid][2] if pid in self.served else None,
                }
                for pid, generation in sorted(self.assigned.items())
            ],
            "cluster_manager": self.cluster_manager,
            "status_error": self.status_error,
            "health": self.health,
            "health_detail": self.health_detail,
        }


def _health(url: str, timeout: float, tls: TlsConfig | None) -> tuple[str, str]:
    context = None
    if url.startswith("https:"):
        context = (tls or TlsConfig()).https_context()
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            body = response.read()
            state = "healthy"
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            return "unreachable", f"{url}: HTTP {exc.code}"
        body, state = exc.read(), "unhealthy"
    except (OSError, ValueError) as exc:
        return "unreachable", f"{url}: {exc}"
    try:
        detail = json.dumps(json.loads(body), sort_keys=True)
    except ValueError:
        detail = body.decode("utf-8", "replace")[:200]
    return state, detail


@zookeeper_errors
def list_servers(
    zk: KazooClient, root: str, *, timeout: float = 5.0, tls: TlsConfig | None = None
) -> list[ServerInfo]:
    """Every live server with its partitions, generations, preferences, status and health.

    Args:
        zk: a started kazoo client.
        root: the cluster root znode.
        timeout: seconds for each server's status and ``/health``.
        tls: client TLS files for the server ports (and an ``https`` ``/health``), or None.

    Raises:
        ClusterNotFoundError: no cluster exists under the root.
        MetadataError: a znode does not decode.
        ZooKeeperAuthError: ZooKeeper refused a read (the message names the credential to check).
        ZooKeeperUnavailableError: the connection to ZooKeeper was lost.
    """
    cluster = ClusterZk(zk, root)
    cluster.params()  # no cluster: ClusterNotFoundError
    members = read_members(zk, cluster.paths)
    assignment, _ = read_assignment(zk, cluster.paths)
    preferred, _ = read_preferred(zk, cluster.paths)
    probes = run_on_shared_loop(probe_servers(members, timeout=timeout, tls=tls))
    servers = []
    for member, probe in zip(members, probes, strict=True):
        health, detail = (None, "") if member.health_url is None else _health(member.health_url, timeout, tls)
        status = probe.status
        servers.append(
            ServerInfo(
                name=member.display_name,
                member=member.name,
                server_id=member.server_id,
                endpoint=member.endpoint,
                configured_preferred=tuple(sorted(member.preferred_partitions)),
                preferred=preferred.of(member.endpoint, member.preferred_partitions),
                assigned=assignment.partitions_of(member.name),
                cluster_manager=None if status is None else status.cluster_manager,
                served={}
                if status is None
                else {
                    p.partition_id: (p.generation, p.high_water_mark, p.writable) for p in status.partitions
                },
                status_error=probe.error,
                health=health,
                health_detail=detail,
            )
        )
    return servers


def resolve_server(members: Iterable[Member], server: str) -> tuple[str, tuple[int, ...]]:
    """Find a server by endpoint, ``server.name``, member name or server ID; return its endpoint and
    configured preferences.

    An endpoint (``host:port``) that is not a live member is accepted as it is (its preferences
    apply when it comes back), with no configured preferences known.

    Raises:
        ConfigurationError: a member name or server ID that no live member has.
    """
    for member in members:
        if server in (member.endpoint, member.name, str(member.server_id), member.server_name):
            return member.endpoint, member.preferred_partitions
    host, _, port = server.rpartition(":")
    if host and port.isdigit():
        return server, ()
    raise ConfigurationError(
        f"no live server is {server!r}: give its endpoint host:port, name, member name or server ID "
        "(waltz server list shows them)"
    )


@zookeeper_errors
def change_preferred(
    zk: KazooClient,
    root: str,
    server: str,
    *,
    add: Iterable[int] = (),
    remove: Iterable[int] = (),
) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """Add or remove run-time preferred partitions of a server (``<root>/server/preferred``).

    Args:
        zk: a started kazoo client.
        root: the cluster root znode.
        server: the server's endpoint, ``server.name``, member name or server ID.
        add: partitions to add.
        remove: partitions to remove.

    Returns:
        ``(endpoint, preferred before, preferred after)``.

    Raises:
        ClusterNotFoundError: no cluster exists under the root.
        ConfigurationError: no such server, or a partition outside the cluster.
        StaleMetadataError: the znode kept changing.
        ZooKeeperAuthError: ZooKeeper refused the change (only operators write the znode).
        ZooKeeperUnavailableError: the connection to ZooKeeper was lost.
    """
    cluster = ClusterZk(zk, root)
    params = cluster.params()
    problem = unknown_partitions(cluster, params, {*add, *remove})
    if problem is not None:
        raise ConfigurationError(problem)
    endpoint, configured = resolve_server(read_members(zk, cluster.paths), server)
    before, after = update_preferred(zk, cluster.paths, endpoint, configured, add=add, remove=remove)
    return endpoint, before, after


@zookeeper_errors
def is_live(zk: KazooClient, root: str, endpoint: str) -> bool:
    """Whether a live member of the cluster's servers has ``endpoint`` (``host:port``).

    Raises:
        ClusterNotFoundError: no cluster exists under the root.
    """
    return any(m.endpoint == endpoint for m in read_members(zk, ClusterZk(zk, root).paths))
