"""The console's look at the cluster, taken again every refresh interval and kept for the pages.

Design: docs/design/console.md "Cluster map", "Metrics". One :class:`Observer` per console runs
on the web server's event loop: ZooKeeper reads go to worker threads (kazoo blocks), the storage
and server probes are the admin tools' own coroutines (gRPC), the metrics scrapes are HTTP
requests, all concurrent. Pages read only the last look, so any number of browsers cost the
cluster nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from waltz.admin.cluster_admin import ClusterAdmin
from waltz.admin.verify import probe_storage_nodes
from waltz.admin.verify_all import cluster_checks
from waltz.admin.verify_servers import probe_servers
from waltz.console.cluster_map import ClusterMap, LastSeen, build_map
from waltz.console.config import MetricsTarget
from waltz.console.metrics import (
    MetricsHistory,
    PartitionMetrics,
    Scrape,
    TargetMetrics,
    derive,
    now,
    parse_scrape,
)
from waltz.console.zookeeper_health import ZooKeeperHealth, probe_ensemble
from waltz.metadata.assignment import read_assignment, read_members

__all__ = ["Look", "Observer"]

log = logging.getLogger(__name__)

#: Bytes of a ``/metrics`` reply read at most.
MAX_METRICS_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Look:
    """The last look at the cluster.

    Attributes:
        map: the cluster map of the last successful look, or None before the first one.
        error: why the last look failed (ZooKeeper unreachable, no cluster under the root), or
            None; ``map`` is then the one before, shown as stale.
        zookeeper: the health of ZooKeeper at the last look (also when the look failed).
        partitions: per-partition figures of the last round of scrapes.
        targets: each metrics target's state.
        round: how many looks were taken.
    """

    map: ClusterMap | None
    error: str | None
    zookeeper: ZooKeeperHealth | None
    partitions: dict[int, PartitionMetrics]
    targets: list[TargetMetrics]
    round: int


class Observer:
    """Look at the cluster every ``refresh`` seconds; the pages read :attr:`look`.

    Args:
        admin: the console's cluster admin (owns the ZooKeeper session).
        connect_string: ZooKeeper's connect string (its servers are asked ``srvr``).
        targets: the ``/metrics`` endpoints to scrape.
        refresh: seconds between two looks.
        http: the HTTP client of the scrapes (TLS set up by the caller); owned by the caller.
    """

    def __init__(
        self,
        admin: ClusterAdmin,
        connect_string: str,
        targets: Sequence[MetricsTarget],
        refresh: float,
        http: httpx.AsyncClient,
    ) -> None:
        self.admin = admin
        self.connect_string = connect_string
        self.targets = list(targets)
        self.refresh = refresh
        self.history = MetricsHistory()
        self.look = Look(None, None, None, {}, [], 0)
        self._http = http
        self._last_seen: LastSeen = {}
        self._previous: dict[str, Scrape] = {}

    @property
    def timeout(self) -> float:
        """Seconds allowed to each probe and scrape: the refresh interval, at least 1 s, at most
        the admin's storage timeout."""
        return min(max(1.0, self.refresh), self.admin.storage_timeout)

    async def run(self) -> None:
        """Look again and again until cancelled; a failed look is recorded, never raised."""
        while True:
            started = time.monotonic()
            try:
                await self.look_once()
            except Exception as exc:  # a defect in a look must not end the looking
                log.exception("console: a look at %s failed", self.admin.root)
                previous = self.look
                self.look = Look(
                    previous.map,
                    f"{type(exc).__name__}: {exc}",
                    previous.zookeeper,
                    previous.partitions,
                    previous.targets,
                    previous.round + 1,
                )
            await asyncio.sleep(max(0.0, self.refresh - (time.monotonic() - started)))

    async def look_once(self) -> Look:
        """Take one look: the cluster map and the metrics, concurrently."""
        taken_at = time.time()
        (cluster_map, error, zookeeper), scrapes = await asyncio.gather(
            self._map(taken_at), asyncio.gather(*(self._scrape(t) for t in self.targets))
        )
        partitions, targets = derive(scrapes, self._previous)
        for scrape, figures in zip(scrapes, targets, strict=True):
            if figures.up:  # a target whose samples made no figures is not the one before next time
                self._previous[scrape.target.name] = scrape
        self.history.add(taken_at, partitions, targets)
        look = Look(
            cluster_map if cluster_map is not None else self.look.map,
            error,
            zookeeper,
            partitions,
            targets,
            self.look.round + 1,
        )
        self.look = look
        return look

    async def _map(self, taken_at: float) -> tuple[ClusterMap | None, str | None, ZooKeeperHealth | None]:
        admin = self.admin
        zk, paths = admin.cluster.zk, admin.cluster.paths
        health = asyncio.ensure_future(
            probe_ensemble(zk, self.connect_string, paths.root, timeout=self.timeout)
        )
        try:
            description = await asyncio.to_thread(admin.describe)
            members = await asyncio.to_thread(read_members, zk, paths)
            assignment, _ = await asyncio.to_thread(read_assignment, zk, paths)
            summary = await asyncio.to_thread(admin.cluster.archive_summary)
            storage, servers = await asyncio.gather(
                probe_storage_nodes(description, timeout=self.timeout, tls=admin.tls),
                probe_servers(members, timeout=self.timeout, tls=admin.tls),
            )
            report = await asyncio.to_thread(
                cluster_checks, admin.cluster, description, storage, assignment, servers
            )
        except Exception as exc:  # a failed look is shown, and the next one tried
            log.debug("console: look at %s failed", paths.root, exc_info=True)
            return None, f"{type(exc).__name__}: {exc}", await health
        zookeeper = await health
        cluster_map = build_map(
            description,
            assignment,
            storage,
            servers,
            zookeeper,
            checks=report.checks,
            last_seen=self._last_seen,
            taken_at=taken_at,
            archive=None if summary is None else summary.value,
        )
        return cluster_map, None, zookeeper

    async def _scrape(self, target: MetricsTarget) -> Scrape:
        at = now()
        try:
            response = await self._http.get(target.url, timeout=self.timeout)
            response.raise_for_status()
            if len(response.content) > MAX_METRICS_BYTES:
                raise ValueError(f"reply of {len(response.content)} bytes is too large")
            return parse_scrape(target, response.text, at)
        except Exception as exc:  # whatever one target serves is that target's error, not the look's
            return Scrape(target, at, error=f"{type(exc).__name__}: {exc}")
