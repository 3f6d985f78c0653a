"""Server membership and the elected cluster manager (kazoo recipes).

Design: docs/design/server.md "Cluster manager"; docs/design/zookeeper.md "Generations and store
session IDs", "Server members and partition assignment". Every server registers an ephemeral
sequential member znode and watches ``server/assignment``. One server, elected with kazoo's
``Election`` recipe, is the cluster manager: it watches the member znodes and rewrites the
assignment (by compare-and-set) whenever members come or go, so that each partition has exactly
one live server and its generation goes up each time it moves. A server whose ZooKeeper session
is lost loses its member znode with it, and the manager moves its partitions.

Preferred partitions (docs/design/server.md "Preferred partitions"): the manager also watches
``server/preferred`` (run-time preferences, :mod:`waltz.metadata.preferred`) and lets a member take
its preferred partitions back from another live server once the manager has seen it registered
for ``reclaim_delay`` seconds without a break (a restarted server is a new member and waits again).
The same delay holds a member that joined below its share (``floor(partitions / members)``) from
taking partitions from the most loaded members.

Partitions a split adds (docs/design/splits.md "The handover", step 4): the manager places the
partitions that exist, those of the count at creation and each new child marked opened in
``partitions/epochs`` (``PartitionEpochs.partition_ids``), which it watches as it watches the
members. A new child goes to the least loaded member (or one that prefers it); the partitions that
were there keep their owner, since the fair share only grows with the count (a settled member
below its share takes partitions from the most loaded, with or without a split).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NoAuthError, NodeExistsError, NoNodeError
from kazoo.recipe.election import Election

from waltz.errors import MetadataError
from waltz.metadata.assignment import (
    MEMBER_PREFIX,
    SERVER_FEATURES,
    Member,
    PartitionAssignment,
    compute_assignment,
    read_assignment,
    read_members,
)
from waltz.metadata.epochs import PartitionEpochsZk
from waltz.metadata.preferred import read_preferred, with_preferences
from waltz.metadata.zk import ClusterPaths
from waltz.metadata.zk_session import auth_error

__all__ = ["REPEATED_FAILURE_LOG_INTERVAL", "ClusterManager", "ServerMembership"]

log = logging.getLogger(__name__)

#: Seconds between two log lines of the same failure of the elected manager, which retries every
#: half second.
REPEATED_FAILURE_LOG_INTERVAL = 30.0


class ServerMembership:
    """A server's member znode and its view of the partition assignment.

    Args:
        zk: a started kazoo client (owned by the caller).
        paths: the cluster's znode paths.
        endpoint: ``host:port`` where clients reach this server.
        preferred_partitions: partitions this server should own when it can.
        on_assignment: called (on a kazoo thread) with partition ID -> generation of every
            partition placed on this server, each time the assignment changes.
        health_url: the server's ``/health`` URL, published in the member znode for tools, or
            None when it serves none.
        server_name: the server's ``server.name``, published for tools, or None.
    """

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        endpoint: str,
        preferred_partitions: tuple[int, ...],
        on_assignment: Callable[[dict[int, int]], None],
        health_url: str | None = None,
        server_name: str | None = None,
    ) -> None:
        self._zk = zk
        self._paths = paths
        self._endpoint = endpoint
        self._server_name = server_name
        self._preferred = preferred_partitions
        self._health_url = health_url
        self._on_assignment = on_assignment
        self.member: str | None = None

    def register(self) -> str:
        """Create this server's ephemeral sequential member znode and start watching the assignment.

        Returns:
            The member name (its number is the server ID).
        """
        path = self._zk.create(
            f"{self._paths.members}/{MEMBER_PREFIX}",
            Member(
                "", self._endpoint, self._preferred, self._health_url, self._server_name, SERVER_FEATURES
            ).encode(),
            ephemeral=True,
            sequence=True,
            makepath=True,
        )
        member: str = path.rsplit("/", 1)[1]
        self.member = member
        log.info(
            "registered as %s (server ID %d) at %s%s",
            member,
            int(member.removeprefix(MEMBER_PREFIX)),
            self._endpoint,
            f", named {self._server_name}" if self._server_name else "",
        )
        self._zk.DataWatch(self._paths.server_assignment, self._assignment_changed)
        return member

    def _assignment_changed(self, data: bytes | None, stat: object, event: object = None) -> bool:
        member = self.member
        if member is None:
            return False  # stops this watch: a new registration starts another one
        if data is None or not data:
            self._on_assignment({})
            return True
        try:
            assignment = PartitionAssignment.decode(data, self._paths.server_assignment)
        except MetadataError:
            log.exception("cannot read the partition assignment")
            return True
        self._on_assignment(assignment.partitions_of(member))
        return True

    def unregister(self, timeout: float = 5.0) -> bool:
        """Delete the member znode (partitions then move at once). Idempotent.

        Args:
            timeout: seconds to wait for ZooKeeper's answer. A client cut off from ZooKeeper
                would otherwise queue the delete until the connection comes back.

        Returns:
            True if the znode is gone; False if ZooKeeper did not answer in time or the connection
            was lost (the ephemeral znode then goes when the session expires, and a warning says so).
        """
        member, self.member = self.member, None
        if member is None:
            return True
        path = f"{self._paths.members}/{member}"
        try:
            self._zk.delete_async(path).get(timeout=timeout)
        except NoNodeError:
            pass
        except (KazooException, self._zk.handler.timeout_exception) as exc:
            log.warning(
                "could not delete member znode %s (%s): it goes when the ZooKeeper session expires, "
                "and the partitions move then",
                path,
                type(exc).__name__,
            )
            return False
        return True


class ClusterManager:
    """Takes part in the cluster manager election; while elected, keeps the assignment current.

    Args:
        zk: a started kazoo client (owned by the caller).
        paths: the cluster's znode paths.
        num_partitions: the cluster's number of partitions at creation: the partitions placed while
            ``partitions/epochs`` names no opened child (or cannot be read yet).
        identifier: this server's name in the election (for logs).
        reclaim_delay: seconds a member must have been seen registered, without a break, before
            it takes its preferred partitions back from another live server
            (``server.preferredPartitionsReclaimDelay``).
        clock: monotonic seconds (tests may pass their own).
    """

    #: Seconds between rebalances when nothing wakes the manager earlier.
    IDLE_WAKEUP = 5.0

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        num_partitions: int,
        identifier: str,
        *,
        reclaim_delay: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._zk = zk
        self._paths = paths
        # The partitions that exist, from the last good read of partitions/epochs.
        self._partition_ids: tuple[int, ...] = tuple(range(num_partitions))
        self._epochs = PartitionEpochsZk(zk, paths)
        self._reclaim_delay = reclaim_delay
        self._clock = clock
        # Member name -> when this manager first saw it (reset each time it is elected).
        self._first_seen: dict[str, float] = {}
        self._election = Election(zk, paths.election, identifier)
        self._changed = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.leading = False

    def start(self) -> None:
        """Join the election on a background thread."""
        self._thread = threading.Thread(target=self._run, name="cluster-manager", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Leave the election and stop managing. Idempotent.

        Args:
            timeout: seconds to wait for the manager's thread to end. Cut off from ZooKeeper, the
                thread waits in kazoo for the deletion of its election znode until the connection
                comes back or the client stops (the thread is a daemon: it never holds the
                process's exit; docs/design/server.md, "Stopping within a bound").

        Returns:
            True when the thread ended (or never ran), False when it still waits.
        """
        self._stopping.set()
        self._changed.set()
        self._election.cancel()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeout)
            return not thread.is_alive()
        return True

    def _run(self) -> None:
        failures = _RepeatedFailures(self._zk, "the cluster manager's election", self._clock)
        while not self._stopping.is_set():
            try:
                self._election.run(self._lead)
            except Exception as exc:
                if self._stopping.is_set():
                    return
                failures.log(exc, "cluster manager election failed; rejoining every 1 s")
                self._stopping.wait(1.0)

    def _lead(self) -> None:
        self.leading = True
        self._first_seen.clear()
        log.info("elected cluster manager")
        failures = _RepeatedFailures(
            self._zk, "the cluster manager's update of the partition assignment", self._clock
        )
        try:
            while not self._stopping.is_set() and self._zk.connected:
                self._changed.clear()
                try:
                    self.rebalance()
                    failures.clear()
                except Exception as exc:
                    failures.log(exc, "cluster manager could not update the assignment; retrying every 0.5 s")
                    self._stopping.wait(0.5)
                    continue
                # Wake up on member or preference changes (the watches), when a member settles,
                # or every few seconds.
                self._changed.wait(self._next_wakeup())
        finally:
            self.leading = False

    def _next_wakeup(self) -> float:
        now = self._clock()
        pending = [
            seen + self._reclaim_delay - now
            for seen in self._first_seen.values()
            if seen + self._reclaim_delay > now
        ]
        return min([self.IDLE_WAKEUP, *(p + 0.05 for p in pending)])

    def _settled(self, members: Sequence[Member]) -> set[str]:
        """Members seen for ``reclaim_delay`` seconds without a break (first sight starts the clock)."""
        now = self._clock()
        live = {m.name for m in members}
        for name in list(self._first_seen):
            if name not in live:
                del self._first_seen[name]
        for name in live:
            self._first_seen.setdefault(name, now)
        return {name for name in live if now - self._first_seen[name] >= self._reclaim_delay}

    def effective_members(self, members: Sequence[Member], watch: bool = False) -> list[Member]:
        """The members with their run-time preferred partitions (``server/preferred`` over config)."""
        try:
            preferred, _ = read_preferred(
                self._zk, self._paths, watch=self._members_changed if watch else None
            )
        except MetadataError:
            # A bad run-time preference must never stop failover: use the configured ones.
            log.exception(
                "ignoring the run-time preferred partitions: fix the znode with waltz server preferred"
            )
            return list(members)
        return with_preferences(members, preferred)

    def _members_changed(self, event: object) -> None:
        self._changed.set()

    def partition_ids(self) -> tuple[int, ...]:
        """The partitions that exist (module docstring), read from ``partitions/epochs`` with the
        manager's watch on it. A znode that does not decode keeps the last good answer, with an
        error logged: a bad znode must never stop failover."""
        try:
            epochs = self._epochs.read(watch=self._members_changed).value
        except MetadataError:
            log.exception(
                "cannot read partitions/epochs: placing the partitions of its last good read, %s",
                list(self._partition_ids),
            )
            return self._partition_ids
        if epochs.partition_ids != self._partition_ids:
            log.info("partitions to place: %s", list(epochs.partition_ids))
        self._partition_ids = epochs.partition_ids
        return self._partition_ids

    def rebalance(self) -> PartitionAssignment:
        """Recompute the assignment from the live members and the partitions that exist, and write
        it if it changed."""
        for _ in range(20):
            members = self.effective_members(
                read_members(self._zk, self._paths, watch=self._members_changed), watch=True
            )
            partitions = self.partition_ids()
            current, version = read_assignment(self._zk, self._paths)
            new = compute_assignment(partitions, members, current, self._settled(members))
            if new == current and version >= 0:
                return current
            try:
                if version < 0:
                    self._zk.create(self._paths.server_assignment, new.encode(), makepath=True)
                else:
                    self._zk.set(self._paths.server_assignment, new.encode(), version=version)
            except (BadVersionError, NodeExistsError):
                continue
            moved = [
                pid
                for pid, placement in new.placements.items()
                if current.placements.get(pid) is None or current.placements[pid].member != placement.member
            ]
            log.info(
                "assignment updated for %d member(s); partitions moved: %s",
                len(members),
                moved or "none",
            )
            return new
        raise MetadataError("the partition assignment kept changing under the cluster manager")


class _RepeatedFailures:
    """The log of a loop that retries a failing step: a failure is logged when it first happens
    and, while the same failure lasts, again every :data:`REPEATED_FAILURE_LOG_INTERVAL` seconds;
    ZooKeeper's refusal (``NoAuth``) names the credential setting to check.

    Args:
        zk: the session that may be refused (whether it holds a credential changes the advice).
        what: the step, for the refusal's message, e.g. ``"the cluster manager's election"``.
        clock: monotonic seconds, the manager's.
    """

    def __init__(self, zk: KazooClient, what: str, clock: Callable[[], float]) -> None:
        self._zk = zk
        self._what = what
        self._clock = clock
        self._logged: tuple[str, float] | None = None  # the failure last logged, and when

    def clear(self) -> None:
        """The step succeeded: its next failure is logged at once."""
        self._logged = None

    def log(self, exc: Exception, message: str) -> None:
        """Log ``exc`` with ``message`` (an error, with the exception) unless it was just logged."""
        failure: BaseException = (
            auth_error(self._zk, self._what, exc) if isinstance(exc, NoAuthError) else exc
        )
        what, now = f"{type(failure).__name__}: {failure}", self._clock()
        logged = self._logged
        if logged is not None and logged[0] == what and now - logged[1] < REPEATED_FAILURE_LOG_INTERVAL:
            return
        log.error(
            "%s (the same failure is logged again every %.0f s while it lasts)",
            message,
            REPEATED_FAILURE_LOG_INTERVAL,
            exc_info=failure,
        )
        self._logged = (what, now)
