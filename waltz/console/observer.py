"""The console's look at the cluster, taken again every refresh interval and kept for the pages.

Design: docs/design/console.md "Cluster map", "Metrics". One :class:`Observer` per console runs
on the web server's event loop: ZooKeeper reads go to worker threads (kazoo blocks), the storage
and server probes are the admin tools' own coroutines (gRPC), the metrics scrapes are HTTP
requests, all concurrent. Pages read only the last look, so any number of browsers cost the
cluster nothing more. Each scrape has a deadline over its whole reply and reads at most
:data:`MAX_METRICS_BYTES` of it, so no target can hold up a look or fill the console's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from waltz.errors import WaltzError
from waltz.metadata.assignment import read_assignment, read_members

__all__ = [
    "MAX_METRICS_BYTES",
    "Look",
    "MetricsReplyError",
    "MetricsReplyTooLargeError",
    "MetricsTimedOutError",
    "Observer",
]

log = logging.getLogger(__name__)

#: Bytes of a ``/metrics`` reply read at most: a larger declared Content-Length is refused before
#: any of the body is read, a longer body as soon as it passes the limit (docs/design/console.md
#: "Metrics").
MAX_METRICS_BYTES = 8 * 1024 * 1024


class MetricsReplyError(WaltzError):
    """A ``/metrics`` reply the console does not read (shown as its target's error)."""


class MetricsReplyTooLargeError(MetricsReplyError):
    """A ``/metrics`` reply is larger than :data:`MAX_METRICS_BYTES` (docs/design/console.md
    "Metrics").

    Args:
        declared: the reply's Content-Length when it declared too much, else None.
    """

    def __init__(self, declared: int | None) -> None:
        said = f" (Content-Length {declared})" if declared is not None else ""
        super().__init__(
            f"the reply is larger than {MAX_METRICS_BYTES} bytes{said}, the most the console reads "
            "of one: give --metrics one process's own /metrics endpoint"
        )


class MetricsTimedOutError(MetricsReplyError):
    """A ``/metrics`` reply did not come whole within the scrape's deadline (docs/design/console.md
    "Metrics").

    Args:
        deadline: the deadline, seconds.
    """

    def __init__(self, deadline: float) -> None:
        super().__init__(
            f"timed out: no whole reply within {deadline:g}s (the scrape's deadline); check that "
            "the process answers /metrics promptly (not hung, not overloaded)"
        )


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
        self._wake = asyncio.Event()

    @property
    def timeout(self) -> float:
        """Seconds allowed to each probe and scrape (a scrape's deadline covers its whole reply):
        the refresh interval, at least 1 s, at most the admin's storage timeout."""
        return min(max(1.0, self.refresh), self.admin.storage_timeout)

    def look_soon(self) -> None:
        """Have :meth:`run` take its next look now, not at the end of the refresh interval (after
        an action); returns at once. A look under way ends first, and the next starts after it.

        Design: docs/design/console.md "Operator actions".
        """
        self._wake.set()

    async def run(self) -> None:
        """Look again and again until cancelled; a failed look is recorded, never raised."""
        while True:
            started = time.monotonic()
            self._wake.clear()
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake.wait(), max(0.0, self.refresh - (time.monotonic() - started))
                )

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
        deadline = self.timeout
        try:
            try:
                async with asyncio.timeout(deadline):  # the whole reply, however slowly it comes
                    text = await self._read(target, deadline)
            except (TimeoutError, httpx.TimeoutException):
                raise MetricsTimedOutError(deadline) from None
            return parse_scrape(target, text, at)
        except Exception as exc:  # whatever one target serves is that target's error, not the look's
            return Scrape(target, at, error=f"{type(exc).__name__}: {exc}")

    async def _read(self, target: MetricsTarget, deadline: float) -> str:
        """The text of ``target``'s reply, read as a stream up to :data:`MAX_METRICS_BYTES`.

        Raises:
            MetricsReplyTooLargeError: the reply declares or sends more.
            MetricsReplyError: the reply is compressed (none was asked for).
            httpx.HTTPError: the request failed or the status is not 2xx.
        """
        headers = {"Accept-Encoding": "identity"}  # the limit counts the bytes as parsed
        async with self._http.stream("GET", target.url, headers=headers, timeout=deadline) as response:
            response.raise_for_status()
            declared = response.headers.get("content-length", "")
            if declared.isascii() and declared.isdecimal() and int(declared) > MAX_METRICS_BYTES:
                raise MetricsReplyTooLargeError(int(declared))
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise MetricsReplyError(
                    f"the reply is compressed ({encoding}) although the console asked for none "
                    "(Accept-Encoding: identity): serve /metrics uncompressed to such a request"
                )
            body = bytearray()
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) > MAX_METRICS_BYTES:
                    raise MetricsReplyTooLargeError(None)
            return body.decode(response.charset_encoding or "utf-8", errors="replace")
