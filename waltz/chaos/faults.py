"""Striking and healing the faults of a schedule on a local cluster and its fault proxies.

:class:`FaultInjector` runs on a thread of its own: it waits until the run reaches each fault's
point, strikes it, waits its duration, heals it, and waits until every partition is writable
again before the next one (faults never overlap, so at most a minority is ever down). Every
event is reported through ``say`` with the time since the run started (docs/chaos.md "The fault schedule").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import tenacity

from waltz.chaos.archiving import ChaosArchiver
from waltz.chaos.proxy import FaultProxy
from waltz.chaos.schedule import ARCHIVE_FAULTS, NAMESPACE_FAULTS, SPLIT_FAULTS, Fault, FaultKind
from waltz.local.cluster import LocalCluster
from waltz.local.netns import Direction

if TYPE_CHECKING:
    from waltz.admin.split_report import SplitReport

__all__ = ["FaultInjector"]

log = logging.getLogger(__name__)

#: Seconds allowed for the cluster to be writable again after a fault is healed.
_READY_TIMEOUT = 90.0
#: Seconds an archiving fault waits for the archiver to report a chunk before it strikes anyway.
_CHUNK_WAIT = 60.0
#: Seconds ``kill-server-splitting`` waits for its parent to be marked sealing before it gives up.
_SEALING_WAIT = 60.0
#: Seconds, after its heal, that ``kill-server-splitting`` allows the split to complete in.
_SPLIT_WAIT = 300.0


def _for_each(action: Callable[[int], object], targets: Sequence[int]) -> Callable[[], None]:
    def run() -> None:
        for index in targets:
            action(index)

    return run


class FaultInjector:
    """Strikes the faults of a schedule when the run's progress reaches them, one at a time.

    Args:
        cluster: returns the running cluster.
        schedule: the faults, by increasing ``at``.
        progress: returns the run's progress, 0..1.
        client_proxies: the proxy in front of each server (index = server index); may be empty
            when the schedule has no client network fault.
        storage_proxies: the proxy in front of each storage node.
        say: receives one line per event.
        gate: called with the fraction of the run the clients may submit up to: the next fault's
            point while it has not struck, so that every fault strikes under load however fast
            the clients are; half way from the last fault's point to the end while it lasts (so
            that it lasts its whole duration under load), 1.0 once it is healed; None lets them
            run free.
        archiver: the archiver of a ``--archive`` run (the archiving kinds need it).
        split_to: the count of a ``--split-to`` run (``kill-server-splitting`` needs it).
    """

    def __init__(
        self,
        cluster: Callable[[], LocalCluster],
        schedule: Sequence[Fault],
        progress: Callable[[], float],
        client_proxies: Sequence[FaultProxy],
        storage_proxies: Sequence[FaultProxy],
        say: Callable[[str], None],
        gate: Callable[[float], None] | None = None,
        archiver: ChaosArchiver | None = None,
        split_to: int | None = None,
    ) -> None:
        self._cluster = cluster
        self._archiver = archiver
        self._split_to = split_to
        self._schedule = list(schedule)
        self._progress = progress
        self._client_proxies = client_proxies
        self._storage_proxies = storage_proxies
        self._say = say
        self._gate = gate or (lambda fraction: None)
        self._stop = threading.Event()
        self._started = time.monotonic()
        self.struck: list[str] = []
        """The faults struck so far, as described."""
        self.errors: list[str] = []
        """Faults that could not be struck or healed (the run fails on them)."""
        self.not_ready: list[str] = []
        """Faults after whose healing the cluster was not writable in time (information)."""
        self.splits: list[str] = []
        """What the split of ``kill-server-splitting`` did: each run's outcome, one line each."""
        self._healing: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name="chaos-faults", daemon=True)

    def start(self) -> None:
        """Start striking faults."""
        self._started = time.monotonic()
        self._thread.start()

    def stop(self, timeout: float = 120.0) -> None:
        """Strike no more faults, heal the current one, and wait for the thread.

        Args:
            timeout: seconds to wait for the thread (a heal in progress finishes first).
        """
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.errors.append(f"the fault thread did not stop within {timeout:g}s")

    def _note(self, text: str) -> None:
        self._say(f"[{time.monotonic() - self._started:7.1f}s] fault: {text}")

    def _run(self) -> None:
        try:
            self._strike_all()
        except Exception as exc:  # the run's check of the faults fails on it, not only a log line
            log.exception("the fault thread failed")
            self.errors.append(f"the fault thread failed: {exc!r}")
        finally:
            self._gate(1.0)

    def _strike_all(self) -> None:
        # Each fault's next point: the next fault's, the end after the last (none without faults).
        points = [f.at for f in self._schedule[1:]] + [1.0] if self._schedule else []
        self._gate(self._schedule[0].at if self._schedule else 1.0)
        for fault, next_point in zip(self._schedule, points, strict=True):
            while not self._stop.is_set() and self._progress() < fault.at - 1e-9:
                self._stop.wait(0.1)
            if self._stop.is_set():
                return
            if fault.kind in ARCHIVE_FAULTS:
                # It strikes after the archiver's next chunk: let the clients write it.
                self._gate((fault.at + next_point) / 2)
            try:
                heal = self._strike(fault)
            except Exception as exc:
                log.exception("could not strike %s", fault.describe())
                self.errors.append(f"could not strike {fault.describe()}: {exc!r}")
                self._gate(next_point)
                continue
            if heal is None:  # the run stopped while the fault waited for its moment
                self._note(f"{fault.describe()} not struck: the run is stopping")
                return
            # The last fault holds the clients half way to the end until it is healed: else they
            # would finish while it lasts, and the run would stop it early, without load.
            self._gate(next_point if next_point < 1.0 else (fault.at + 1.0) / 2)
            self.struck.append(fault.describe())
            self._note(f"{fault.describe()} struck")
            self._stop.wait(fault.duration)  # stop() cuts the fault short, but still heals it
            try:
                heal()
            except Exception as exc:
                log.exception("could not heal %s", fault.describe())
                self.errors.append(f"could not heal {fault.describe()}: {exc!r}")
                continue
            started = time.monotonic()
            try:
                self._cluster().wait_ready(_READY_TIMEOUT)
                self._note(f"healed; every partition writable again after {time.monotonic() - started:.1f}s")
            except Exception as exc:
                self.not_ready.append(f"{fault.describe()}: {exc}")
                self._note(f"healed, but not every partition is writable after {_READY_TIMEOUT:g}s")

    def _owner_index(self, cluster: LocalCluster, partition_id: int) -> int:
        """The index of the server owning a partition now (which may advertise its proxy).

        Raises:
            ClusterNotReadyError: no server of the cluster owns the partition right now.
        """
        endpoint = cluster.owner(partition_id)
        for index, proxy in enumerate(self._client_proxies):
            if proxy.address == endpoint:
                return index
        return cluster.owner_index(partition_id)

    def _strike(self, fault: Fault) -> Callable[[], None] | None:
        """Strike a fault; return what heals it, or None when the run stopped before it struck."""
        cluster = self._cluster()
        kind, targets = fault.kind, fault.targets
        if kind in ARCHIVE_FAULTS:
            return self._strike_archiving(cluster, fault)
        if kind in SPLIT_FAULTS:
            return self._strike_split(cluster, fault)
        if kind is FaultKind.KILL_STORAGE:
            _for_each(cluster.kill_storage, targets)()
            return _for_each(cluster.restart_storage, targets)
        if kind is FaultKind.PAUSE_STORAGE:
            _for_each(cluster.pause_storage, targets)()
            return _for_each(cluster.resume_storage, targets)
        if kind is FaultKind.KILL_SERVER:
            _for_each(cluster.kill_server, targets)()
            return _for_each(cluster.restart_server, targets)
        if kind is FaultKind.PAUSE_SERVER:
            _for_each(cluster.pause_server, targets)()
            return _for_each(cluster.resume_server, targets)
        if kind is FaultKind.PAUSE_OWNER:
            # The owner now: the partition may have moved since the schedule was drawn.
            owners = sorted({self._owner_index(cluster, pid) for pid in targets})
            self._note(f"pausing server(s) {owners}, the owner of partition(s) {list(targets)}")
            _for_each(cluster.pause_server, owners)()
            return _for_each(cluster.resume_server, owners)
        if kind in (FaultKind.KILL_ZOOKEEPER, FaultKind.PAUSE_ZOOKEEPER):
            zookeeper = cluster.zookeeper
            if zookeeper is None:
                raise RuntimeError("the cluster's ZooKeeper is external: it cannot be killed or paused here")
            if kind is FaultKind.KILL_ZOOKEEPER:
                zookeeper.kill()
                return zookeeper.start
            zookeeper.pause()
            return zookeeper.resume
        if kind in NAMESPACE_FAULTS:
            return self._cut_hosts(cluster, fault)
        if kind in (FaultKind.CUT_CLIENTS, FaultKind.DELAY_CLIENTS):
            proxies = [self._client_proxies[i] for i in targets]
        elif kind in (FaultKind.CUT_STORAGE, FaultKind.DELAY_STORAGE):
            proxies = [self._storage_proxies[i] for i in targets]
        else:
            raise ValueError(f"unknown fault kind {kind}")
        if kind in (FaultKind.CUT_CLIENTS, FaultKind.CUT_STORAGE):
            for proxy in proxies:
                proxy.block()

            def unblock() -> None:
                for proxy in proxies:
                    proxy.unblock()

            return unblock
        for proxy in proxies:
            proxy.set_delay(fault.delay)

        def undelay() -> None:
            for proxy in proxies:
                proxy.set_delay(0.0)

        return undelay

    def _strike_archiving(self, cluster: LocalCluster, fault: Fault) -> Callable[[], None] | None:
        """Strike a fault of ``--archive`` right after the archiver reports a chunk; return its heal,
        or None when :meth:`stop` came while it waited (it is not struck then)."""
        archiver = self._archiver
        if archiver is None:
            raise RuntimeError(f"{fault.kind.value} needs the archiver: run with --archive")
        reported = archiver.wait_for_chunk(_CHUNK_WAIT, self._stop)
        if self._stop.is_set():
            return None
        if reported:
            self._note(f"the archiver reported chunk {archiver.chunks}: an archive round is in progress")
        else:
            self._note(f"the archiver reported no chunk in {_CHUNK_WAIT:g}s; striking anyway")
        if fault.kind is FaultKind.KILL_ARCHIVER:
            archiver.kill()
            return archiver.start
        if fault.kind is FaultKind.KILL_SERVER_ARCHIVING:
            _for_each(cluster.kill_server, fault.targets)()
            return _for_each(cluster.restart_server, fault.targets)
        if fault.kind is FaultKind.KILL_STORAGE_ARCHIVING:
            _for_each(cluster.kill_storage, fault.targets)()
            return _for_each(cluster.restart_storage, fault.targets)
        raise ValueError(f"unknown fault kind {fault.kind}")

    def _strike_split(self, cluster: LocalCluster, fault: Fault) -> Callable[[], None]:
        """Start the split to ``split_to`` on a thread of its own, then ``kill -9`` the server owning
        parent ``fault.targets[0]`` as soon as ZooKeeper shows that parent sealing (its barrier
        maybe written already: either is the middle of the handover). The heal restarts the server
        and waits, at most :data:`_SPLIT_WAIT` seconds, for the split to complete.

        Raises:
            RuntimeError: no ``split_to``; the split ended (or failed) before the parent sealed.
        """
        if self._split_to is None:
            raise RuntimeError(f"{fault.kind.value} needs the count to split to: run with --split-to")
        parent = fault.targets[0]
        split = _SplitThread(cluster, self._split_to, self._note, self.splits)
        split.start()
        deadline = time.monotonic() + _SEALING_WAIT
        stage: str | None = None
        while stage is None and split.is_alive() and time.monotonic() < deadline:
            current = cluster.partition_epochs().unfinished
            progress = current.parents.get(parent) if current is not None else None
            if progress is not None and progress.barrier is not None:
                stage = f"its barrier written at {progress.barrier}"
            elif progress is not None and progress.sealing:
                stage = "marked sealing, its barrier not written yet"
            else:
                self._stop.wait(0.02)
        if stage is None:
            split.join(_SPLIT_WAIT)
            raise RuntimeError(
                f"parent partition {parent} was not seen sealing within {_SEALING_WAIT:g}s "
                f"(split: {'; '.join(self.splits) or 'no outcome'}): no server was killed during the handover"
            )
        index = self._owner_index(cluster, parent)
        cluster.kill_server(index)
        self._note(
            f"parent partition {parent} {stage}: killed server-{index}, its owner, during the handover"
        )

        def heal() -> None:
            cluster.restart_server(index)
            split.join(_SPLIT_WAIT)
            if not split.complete:
                raise RuntimeError(
                    f"the split to {self._split_to} did not complete within {_SPLIT_WAIT:g}s of the "
                    f"restart: {'; '.join(self.splits) or 'no outcome'}"
                )

        return heal

    def _cut_hosts(self, cluster: LocalCluster, fault: Fault) -> Callable[[], None]:
        """Strike a fault of namespace mode (real cuts between hosts); return what heals it."""
        lab = cluster.network_lab
        if lab is None:
            raise RuntimeError(
                f"{fault.kind.value} cuts hosts apart: the cluster must run with network namespaces"
            )
        kind, targets = fault.kind, fault.targets
        servers = [f"server-{j}" for j in range(len(cluster.servers))]
        storages = [f"storage-{i}" for i in targets]
        zookeeper = lab.address("zookeeper")
        if kind is FaultKind.ISOLATE_SERVER or kind is FaultKind.ISOLATE_STORAGE:
            hosts = [f"server-{j}" for j in targets] if kind is FaultKind.ISOLATE_SERVER else storages
            return _strike_hosts(hosts, lab.isolate, lab.heal)
        if kind is FaultKind.SPLIT_OWNER or kind is FaultKind.ONE_WAY_OWNER:
            owners = sorted({f"server-{self._owner_index(cluster, pid)}" for pid in targets})
            direction: Direction = "both" if kind is FaultKind.SPLIT_OWNER else "in"
            # A split brain with a client on the stale owner's side: client-0 loses ZooKeeper too,
            # so it may not learn of the move while the stale owner still answers it.
            beside = ["client-0"] if kind is FaultKind.SPLIT_OWNER and "client-0" in lab.hosts else []
            self._note(
                f"cutting {', '.join(owners + beside)} (owner of partition(s) {list(targets)}"
                + (", and a client" if beside else "")
                + ") from ZooKeeper"
                + (", both ways" if direction == "both" else ": ZooKeeper's packets to it are dropped")
            )
            return _strike_hosts(
                owners + beside, lambda host: lab.cut(host, zookeeper, direction=direction), lab.uncut
            )
        if kind is FaultKind.PARTITION_STORAGE or kind is FaultKind.ONE_WAY_STORAGE:
            way: Direction = "both" if kind is FaultKind.PARTITION_STORAGE else "in"

            def cut_from_servers(host: str) -> None:
                for server in servers:
                    lab.cut(host, lab.address(server), direction=way)

            return _strike_hosts(storages, cut_from_servers, lab.uncut)
        raise ValueError(f"unknown fault kind {kind}")


class _SplitThread(threading.Thread):
    """Runs ``waltz cluster split --to`` on a local cluster, again while it does not complete
    (each run resumes where the last stopped: a killed owner leaves a parent without its barrier
    until its next owner writes it), at most :data:`_SPLIT_RUNS` times (docs/design/splits.md
    "The handover")."""

    def __init__(
        self, cluster: LocalCluster, to: int, note: Callable[[str], None], events: list[str]
    ) -> None:
        super().__init__(name="chaos-split", daemon=True)
        self._cluster, self._to, self._note, self._events = cluster, to, note, events
        self.complete = False

    def run(self) -> None:
        started = time.monotonic()

        def resumed(state: tenacity.RetryCallState) -> None:  # a run that did not complete
            outcome = state.outcome
            if outcome is None:
                return
            error = outcome.exception()
            if error is not None:  # ZooKeeper away, say: the next run resumes the split
                log.warning("split to %d, run %d: %r", self._to, state.attempt_number, error)
                self._events.append(f"run {state.attempt_number}: {type(error).__name__}: {error}")
            else:
                self._events.append(f"run {state.attempt_number}: {outcome.result().state.value}, resumed")

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(_SPLIT_RUNS),
            wait=tenacity.wait_fixed(1.0),
            retry=tenacity.retry_if_exception_type(Exception)
            | tenacity.retry_if_result(lambda report: not report.complete),
            before_sleep=resumed,
            retry_error_callback=resumed,
        )
        report: SplitReport | None = retrying(self._cluster.split, self._to, wait=60.0)
        seconds = time.monotonic() - started
        if report is not None and report.complete:
            self.complete = True
            self._events.append(f"complete: {self._to} partitions, {seconds:.1f}s after it started")
            self._note(f"the split to {self._to} partitions completed in {seconds:.1f}s")
        else:
            self._note(f"the split to {self._to} partitions did not complete in {_SPLIT_RUNS} runs")


#: Runs of ``waltz cluster split`` a ``kill-server-splitting`` fault makes at most.
_SPLIT_RUNS = 5


def _strike_hosts(
    hosts: Sequence[str], strike: Callable[[str], object], heal: Callable[[str], object]
) -> Callable[[], None]:
    """Strike every host; return what heals them all. A strike that fails part way heals the hosts
    it touched before raising, so no cut outlives its fault."""

    def heal_all() -> None:
        for host in hosts:
            heal(host)

    try:
        for host in hosts:
            strike(host)
    except BaseException:
        heal_all()
        raise
    return heal_all
