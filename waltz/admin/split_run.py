"""The operator's split, ``waltz cluster split --to M``: check, prepare, seal, open, complete.

Design: docs/design/splits.md "The handover" (steps 1 to 5; every step can be taken again, so the
same command resumes a split that stopped), "What ZooKeeper holds" (``partitions/epochs`` and the
raised format of ``discovery``), "The epochs znode's record form" (each step's compare-and-set and
its refusals), "The owner's barrier" (a parent's owner appends its barrier and writes ``B(p)``
by itself once the parent is marked sealing); docs/design/zookeeper.md "Roles";
docs/design/overview.md "Roles" (a split is an operator action that needs the admin role).

:class:`SplitRun` takes the steps in order over one ZooKeeper session:

1. :meth:`SplitRun.check`: the caller's authority (:func:`check_authority`), the count, no other
   split unfinished (the same count resumes it), an owner for every parent that still owes a
   barrier, every live server of a release that follows ``partitions/epochs`` (its member znode
   names :data:`~waltz.metadata.assignment.PARTITION_EPOCHS_FEATURE`).
2. :meth:`SplitRun.prepare`: the epoch with each parent's committed high-water mark ``H(p)``
   (read through the storage nodes' admin ports, as ``waltz rebuild`` does), then ``discovery``'s
   epoch and raised format.
3. :meth:`SplitRun.seal`: parent by parent, mark it sealing and wait, within the run's bound, for
   its owner to write ``B(p)``. A wait that runs out leaves the split where it stands.
4. :meth:`SplitRun.open_children`: each child whose parent has ``B(p)`` is opened
   (``waltz.admin.split_open.open_child``: its parent's storage nodes grown, its replicas there
   from ``B(p) + 1``, ``store/partition/<child>``, the opened mark); the cluster manager places
   it and its owner appends its genesis and writes its ID; the step waits for the geneses within
   the run's bound, and reports each child's state.
5. :meth:`SplitRun.complete`: the epoch is complete once every child has its genesis; until then
   nothing is written and the report names the children without one.

:meth:`SplitRun.abort` deletes an epoch no parent of which is sealing and writes ``discovery``
back; after the first sealing mark the split only goes forward. :meth:`SplitRun.plan` is the dry
run: step 1 and the ``H(p)`` reads, nothing written.

Error handling: a refusal (bad count, another split, no owner, an abort after sealing, a caller
without the authority) raises :class:`~waltz.errors.SplitStateError` or
:class:`SplitNotAuthorisedError` before the step that would write; ZooKeeper away raises
:class:`~waltz.metadata.zk_session.ZooKeeperUnavailableError` wherever the split stands, and
running the same command again resumes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from waltz.admin.admin_role import missing_admin_role
from waltz.admin.split_open import open_child
from waltz.admin.split_report import (
    DRY_RUN,
    WAITING_FOR_BARRIER,
    ChildStatus,
    ParentStatus,
    SplitPhase,
    SplitReport,
    child_status,
    waiting_reason,
)
from waltz.admin.storage_nodes import DEFAULT_STORAGE_TIMEOUT
from waltz.committed.plan import plan_live_on
from waltz.errors import SplitStateError, WaltzError
from waltz.metadata.assignment import PARTITION_EPOCHS_FEATURE, read_assignment, read_members
from waltz.metadata.epochs import Epoch, EpochState, PartitionEpochs, PartitionEpochsZk
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_roles import Role as ZooKeeperRole
from waltz.metadata.zk_roles import session_identities
from waltz.metadata.zk_session import ZooKeeperUnavailableError, zookeeper_errors
from waltz.protocol.channels import TlsConfig

__all__ = ["SplitCheck", "SplitNotAuthorisedError", "SplitRun", "check_authority"]

log = logging.getLogger(__name__)

#: Seconds between reads of ``partitions/epochs`` while waiting for a parent's ``B(p)``.
BARRIER_POLL_INTERVAL = 0.2
#: Seconds between the progress lines of a wait.
PROGRESS_INTERVAL = 5.0


class SplitNotAuthorisedError(WaltzError, PermissionError):
    """The caller may not split the cluster: a split is an operator action that needs the
    operators' ZooKeeper credential and, with mutual TLS, a certificate of the admin role
    (docs/design/splits.md "The handover"; docs/design/overview.md "Roles"). Nothing was written."""


@dataclass(frozen=True, slots=True)
class SplitCheck:
    """Step 1's findings: what the run writes or resumes.

    Attributes:
        epoch: the epoch ``n+1`` of the split.
        count: its partition count ``M``.
        previous_count: the count before, ``C(n)``.
        existing: the epoch as the znode holds it when the split was started already (resumed,
            or complete), else None.
        owners: parent -> its owner's endpoint, for every parent with an owner.
        notes: what the check could not check, one line each.
    """

    epoch: int
    count: int
    previous_count: int
    existing: Epoch | None
    owners: Mapping[int, str]
    notes: tuple[str, ...] = ()


def check_authority(cluster: ClusterZk, tls: TlsConfig | None, *, planning: bool = False) -> tuple[str, ...]:
    """Refuse a caller that may not split the cluster, before anything is written.

    A split is an operator action that needs the admin role (docs/design/splits.md "The
    handover"): in a cluster made with ZooKeeper credentials per role, the session must hold the
    operators' (servers may write ``partitions/epochs`` for their barriers, but a split is not
    theirs); with mutual TLS to the nodes (``tls`` with a certificate), the certificate must name
    the role ``admin``, which ZooKeeper cannot tell from ``operator`` (both hold the operators'
    credential). A cluster made with one credential lets its holder do everything. A session
    without a credential on a cluster open to anyone is let through, as every other tool is, with
    a warning. A plan (``--dry-run``) writes nothing and only reads the storage nodes' admin
    ports, as the operator role may: a certificate without the admin role is a warning there, not
    a refusal.

    Args:
        cluster: the cluster's znodes, over the caller's session.
        tls: the caller's TLS files for the storage admin ports (``cluster.ssl.*``), or None.
        planning: the caller only plans the split (a dry run).

    Returns:
        Warnings to show (empty when none).

    Raises:
        SplitNotAuthorisedError: the session holds another role's credential, or the certificate
            lacks the admin role.
        ZooKeeperAuthError: the session may not read ``<root>/roles`` (no credential, or a
            wrong one, on a protected cluster).
        OSError, ValueError: the certificate file cannot be read, or is not PEM.
    """
    warnings: list[str] = []
    own = session_identities(cluster.zk)
    roles = cluster.access.roles()
    if roles is not None:
        role = roles.role_of(own)
        if role is not ZooKeeperRole.OPERATOR:
            held = f"the {role.value}s'" if role is not None else "none of the cluster's"
            raise SplitNotAuthorisedError(
                f"a split needs the operators' ZooKeeper credential (zookeeper.auth.digestFile: "
                f"operator.digest of the cluster's --digest-dir); this session holds {held}. "
                "Nothing was written"
            )
    elif not own:
        warnings.append(
            f"the cluster under {cluster.paths.root} has no ZooKeeper credential: anyone who reaches "
            "ZooKeeper may split it, or write its epochs; protect it with `waltz cluster secure`"
        )
    needed = missing_admin_role(tls)
    if needed is not None:
        if not planning:
            raise SplitNotAuthorisedError(
                f"a split needs {needed}: it changes what every partition's owner accepts. "
                "Nothing was written"
            )
        warnings.append(f"the split itself needs {needed}")
    return tuple(warnings)


class SplitRun:
    """The steps of one ``waltz cluster split --to M`` over a ZooKeeper session (module docstring).

    Args:
        cluster: the cluster's znodes (the caller owns the session).
        tls: client TLS files for the storage admin ports (``H(p)`` is read there), or None.
        storage_timeout: seconds allowed for each storage node's admin call.
        wait: seconds the run waits, in all, for the parents' owners to write ``B(p)``.
        progress: called with one human line per step taken and, during a wait, every
            :data:`PROGRESS_INTERVAL` seconds; None: nothing reported.
    """

    def __init__(
        self,
        cluster: ClusterZk,
        *,
        tls: TlsConfig | None = None,
        storage_timeout: float = DEFAULT_STORAGE_TIMEOUT,
        wait: float = 60.0,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.tls = tls
        self.storage_timeout = storage_timeout
        self.wait = wait
        self._progress = progress
        self.epochs = PartitionEpochsZk(cluster.zk, cluster.paths, timeout=cluster.timeout)

    def _say(self, line: str) -> None:
        log.info("%s", line)
        if self._progress is not None:
            self._progress(line)

    # ---- step 1 ----

    def check(self, count: int, *, planning: bool = False) -> SplitCheck:
        """Step 1: may this split run, and is it new or resumed? Writes nothing.

        Args:
            count: ``M``, the partition count to split to.
            planning: for a dry run (:func:`check_authority`'s ``planning``).

        Returns:
            The findings: the epoch, the counts, the epoch as it stands when it was started
            already, the parents' owners, and what was not checked.

        Raises:
            SplitNotAuthorisedError: as :func:`check_authority`.
            SplitStateError: ``count`` is not a whole multiple of at least 2 of the current count;
                another split, to another count, is unfinished (the message names it); a parent
                that still owes a barrier has no owner among the live servers; a live server's
                release predates splits (its member znode does not name
                :data:`~waltz.metadata.assignment.PARTITION_EPOCHS_FEATURE`).
            ZooKeeperUnavailableError, ZooKeeperAuthError, MetadataError: ZooKeeper away, a
                refused read, a znode that does not decode.
        """
        notes = list(check_authority(self.cluster, self.tls, planning=planning))
        value = self.epochs.read().value
        existing = self._existing(value, count)
        if existing is None:
            # The count's refusals are prepare's own, taken on the value read (nothing written).
            value.prepare(count, dict.fromkeys(range(value.current_count), -1))
            number, previous = value.current_number + 1, value.current_count
            owing = list(range(previous))
        else:
            number, previous = existing.number, existing.previous_count
            owing = [p for p, progress in sorted(existing.parents.items()) if progress.barrier is None]
        owners = self._owners(previous)
        unowned = [p for p in owing if p not in owners]
        if unowned:
            raise SplitStateError(
                f"partitions {unowned} have no owner: no live server holds them in server/assignment, "
                "and a parent's owner writes its barrier. Start the servers (or wait for the cluster "
                "manager to place the partitions), then run the command again. Nothing was written"
            )
        older = [
            m.display_name
            for m in read_members(self.cluster.zk, self.cluster.paths, timeout=self.cluster.timeout)
            if PARTITION_EPOCHS_FEATURE not in m.features
        ]
        if older:
            raise SplitStateError(
                f"server(s) {', '.join(older)} predate partition splits (their member znodes do not "
                f"name {PARTITION_EPOCHS_FEATURE!r}): such a server would take appends the split "
                "must refuse. Upgrade every server, then run the command again. Nothing was written"
            )
        return SplitCheck(number, count, previous, existing, owners, tuple(notes))

    @staticmethod
    def _existing(value: PartitionEpochs, count: int) -> Epoch | None:
        """The newest epoch when it is this split (to ``count``); a refusal when another is unfinished."""
        current = value.current
        if current is None:
            return None
        if current.count == count:
            return current
        if current.unfinished:
            # An abort is offered only while it would be taken: no parent is sealing yet.
            abort = (
                f", or abort it with `--to {current.count} --abort`"
                if current.state is EpochState.PREPARING
                else " (its parents are sealing: it only goes forward)"
            )
            raise SplitStateError(
                f"the split to epoch {current.number} ({current.previous_count} -> {current.count} "
                f"partitions) is unfinished ({current.state.value}): finish it with `waltz cluster "
                f"split --to {current.count}`{abort}, before splitting to {count}. Nothing was written"
            )
        return None

    def _owners(self, count: int) -> dict[int, str]:
        """Partition -> the endpoint of its owner, for the partitions below ``count`` that a live
        server holds in ``server/assignment``."""
        zk, paths, timeout = self.cluster.zk, self.cluster.paths, self.cluster.timeout
        # read_members makes the members' parent when missing: a cluster no server joined has none.
        try:
            joined = zk.exists_async(paths.members).get(timeout=timeout) is not None
        except zk.handler.timeout_exception:
            raise ZooKeeperUnavailableError(
                f"ZooKeeper did not answer whether {paths.members} exists within {timeout:g}s"
            ) from None
        live = {m.name for m in read_members(zk, paths, timeout=timeout)} if joined else set()
        assignment, _ = read_assignment(zk, paths, timeout=timeout)
        return {
            p: placement.endpoint or placement.member or ""
            for p, placement in assignment.placements.items()
            if p < count and placement.member in live
        }

    # ---- step 2 ----

    def committed_high_water_marks(self, parents: int) -> dict[int, int]:
        """``H(p)`` of parents ``0 .. parents-1``: each one's committed high-water mark, proven by
        its current store session's replicas through their admin ports (no store session is
        opened, docs/design/spark.md "Live reads through admin ports").

        Raises:
            CommittedReadError: no replica of a partition's current session proved its state.
        """
        planned = plan_live_on(self.cluster, range(parents), timeout=self.storage_timeout, tls=self.tls)
        return {p.partition_id: p.high_water_mark for p in planned}

    def prepare(self, check: SplitCheck) -> Epoch:
        """Step 2: write the epoch with each parent's ``H(p)`` (kept as first written when the
        split is resumed), then ``discovery``'s epoch and raised format.

        Returns:
            The epoch as the znode holds it.

        Raises:
            SplitStateError: another split was started meanwhile.
            CommittedReadError: as :meth:`committed_high_water_marks`.
            ZooKeeperUnavailableError, ZooKeeperAuthError, StaleMetadataError: as the writes.
        """
        if check.existing is None:
            marks = self.committed_high_water_marks(check.previous_count)
            epoch = self.epochs.prepare(check.count, marks).value.epoch(check.epoch)
            marks_text = ", ".join(f"H({p}) = {m}" for p, m in sorted(marks.items()))
            counts = f"{epoch.previous_count} -> {epoch.count} partitions"
            self._say(f"prepared epoch {epoch.number}: {counts} ({marks_text})")
        else:
            epoch = self.epochs.read().value.epoch(check.epoch)
            counts = f"{epoch.previous_count} -> {epoch.count} partitions"
            self._say(f"resuming epoch {epoch.number}: {counts} ({epoch.state.value})")
        self.cluster.set_discovery_epoch(epoch.number)
        self._say(
            f"discovery: epoch {epoch.number}, raised format (clients that predate splits refuse the cluster)"
        )
        return epoch

    # ---- step 3 ----

    def seal(self, epoch: int, deadline: float) -> Epoch:
        """Step 3, parent by parent: mark it sealing, then wait for its owner's ``B(p)``.

        Args:
            epoch: the epoch ``n+1``.
            deadline: ``time.monotonic()`` past which the run stops waiting; the parents not
                marked by then are left for the next run.

        Returns:
            The epoch as the znode holds it when every parent has ``B(p)``, or when the wait ran out.

        Raises:
            ZooKeeperUnavailableError, ZooKeeperAuthError, StaleMetadataError: as the writes.
        """
        current = self.epochs.read().value.epoch(epoch)
        for parent in sorted(current.parents):
            if current.parents[parent].barrier is None:
                if not current.parents[parent].sealing:
                    current = self.epochs.mark_sealing(epoch, parent).value.epoch(epoch)
                    self._say(f"parent {parent}: marked sealing; its owner appends the barrier")
                current = self._wait_for_barrier(epoch, parent, deadline)
            progress = current.parents[parent]
            if progress.barrier is None:
                self._say(f"parent {parent}: no barrier yet after waiting {self.wait:g} s")
                return current
            self._say(
                f"parent {parent}: barrier at {progress.barrier} (H({parent}) = {progress.high_water_mark})"
            )
        return current

    def _wait_for_barrier(self, epoch: int, parent: int, deadline: float) -> Epoch:
        """The epoch once ``B(parent)`` is written, or at ``deadline``."""
        return self._wait_for(
            epoch,
            lambda e: [] if e.parents[parent].barrier is not None else [parent],
            lambda waiting, seconds: f"parent {parent}: waiting for its owner's barrier ({seconds:.0f} s)",
            deadline,
        )

    def _wait_for(
        self,
        epoch: int,
        waiting_in: Callable[[Epoch], list[int]],
        line: Callable[[list[int], float], str],
        deadline: float,
    ) -> Epoch:
        """The epoch once ``waiting_in`` of it is empty, or at ``deadline``: reads the znode every
        :data:`BARRIER_POLL_INTERVAL` seconds, and says ``line`` every :data:`PROGRESS_INTERVAL`."""
        started = time.monotonic()
        next_line = started + PROGRESS_INTERVAL
        polls = int(max(0.0, deadline - started) / BARRIER_POLL_INTERVAL) + 2
        current = self.epochs.read().value.epoch(epoch)
        for _ in range(polls):
            waiting = waiting_in(current)
            if not waiting:
                return current
            now = time.monotonic()
            if now >= deadline:
                break
            if now >= next_line:
                self._say(line(waiting, now - started))
                next_line = now + PROGRESS_INTERVAL
            time.sleep(min(BARRIER_POLL_INTERVAL, max(0.0, deadline - now)))
            current = self.epochs.read().value.epoch(epoch)
        return current

    # ---- step 4 ----

    def open_children(self, epoch: int, deadline: float) -> tuple[ChildStatus, ...]:
        """Step 4: open each new child whose parent has ``B(p)`` and that is not opened yet
        (:func:`waltz.admin.split_open.open_child`: its replicas on its parent's storage nodes from
        ``B(p) + 1``, its ``store/partition/<child>``, then ``mark_opened``), then wait until every
        opened child's owner has written its genesis, or ``deadline``.

        Returns:
            One status per new child, in order, as the znode holds them at the end.

        Raises:
            SplitStorageError: a storage node of a parent did not answer or refused; the children
                before it are opened, the rest are left for the next run.
            ZooKeeperUnavailableError, ZooKeeperAuthError, StaleMetadataError: as the writes.
        """
        current = self.epochs.read().value.epoch(epoch)
        for child in current.new_partitions:
            parent, barrier = current.parent_barrier(child)
            if barrier is None or current.children[child].opened:
                continue
            plan = open_child(
                self.cluster,
                epoch,
                child,
                tls=self.tls,
                storage_timeout=self.storage_timeout,
                operator="split",
            )
            self._say(
                f"child {child} (parent {parent}): opened, its log starting at {plan.start} on "
                f"{len(plan.storages)} storage node(s); its owner appends its genesis"
            )
        current = self._wait_for_geneses(epoch, deadline)
        statuses = tuple(child_status(current, child) for child in current.new_partitions)
        for status in statuses:
            genesis = f" (genesis at {status.genesis})" if status.genesis is not None else ""
            self._say(f"child {status.child} (parent {status.parent}): {status.state}{genesis}")
        return statuses

    def _wait_for_geneses(self, epoch: int, deadline: float) -> Epoch:
        """The epoch once every opened child has its genesis, or at ``deadline``."""
        return self._wait_for(
            epoch,
            lambda e: [c for c, p in sorted(e.children.items()) if p.opened and p.genesis is None],
            lambda waiting, seconds: f"children {waiting}: waiting for their genesis ({seconds:.0f} s)",
            deadline,
        )

    # ---- step 5 ----

    def complete(self, epoch: int) -> Epoch:
        """Step 5: move the epoch to ``complete`` once every child has its genesis; write nothing
        before.

        Returns:
            The epoch as the znode holds it.
        """
        current = self.epochs.read().value.epoch(epoch)
        if current.state is EpochState.COMPLETE:
            return current
        if any(child.genesis is None for child in current.children.values()):
            return current
        current = self.epochs.complete(epoch).value.epoch(epoch)
        self._say(f"epoch {epoch} complete: {current.count} partitions")
        return current

    # ---- the runs ----

    @zookeeper_errors
    def plan(self, count: int) -> SplitReport:
        """The dry run: step 1 and, for a new split, each parent's ``H(p)``; writes nothing.

        Raises:
            As :meth:`check` and :meth:`committed_high_water_marks`.
        """
        check = self.check(count, planning=True)
        if check.existing is not None:
            return self._report(check, check.existing, resumed=True, dry_run=True)
        marks = self.committed_high_water_marks(check.previous_count)
        parents = tuple(
            ParentStatus(p, marks[p], False, None, check.owners.get(p), self._children_of(p, check))
            for p in range(check.previous_count)
        )
        children = tuple(
            ChildStatus(c, c % check.previous_count, False, None, WAITING_FOR_BARRIER)
            for c in range(check.previous_count, count)
        )
        return SplitReport(
            check.epoch,
            count,
            check.previous_count,
            SplitPhase.PLANNED,
            parents,
            children,
            dry_run=True,
            waiting=DRY_RUN,
            notes=check.notes,
        )

    @staticmethod
    def _children_of(parent: int, check: SplitCheck) -> tuple[int, ...]:
        return tuple(parent + j * check.previous_count for j in range(1, check.count // check.previous_count))

    @zookeeper_errors
    def run(self, count: int) -> SplitReport:
        """Steps 1 to 5, from wherever the split stands; each step already taken writes nothing.

        Returns:
            Where the split stands: complete, or why not (a barrier not written within the run's
            wait, children waiting to be opened or for their genesis).

        Raises:
            SplitNotAuthorisedError, SplitStateError: step 1 refused (nothing written).
            CommittedReadError: a parent's ``H(p)`` could not be read (nothing written).
            ZooKeeperUnavailableError: ZooKeeper went away; the split stands where it stopped and
                the same command resumes it.
        """
        check = self.check(count)
        resumed = check.existing is not None
        if check.existing is not None and check.existing.state is EpochState.COMPLETE:
            self.cluster.set_discovery_epoch(check.existing.number)
            return self._report(check, check.existing, resumed=True)
        epoch = self.prepare(check)
        deadline = time.monotonic() + self.wait
        epoch = self.seal(epoch.number, deadline)
        self.open_children(epoch.number, deadline)
        epoch = self.complete(epoch.number)
        return self._report(check, epoch, resumed=resumed)

    @zookeeper_errors
    def abort(self, count: int, *, dry_run: bool = False) -> SplitReport:
        """Roll back the split to ``count`` while none of its parents is sealing: delete its epoch,
        then write ``discovery``'s epoch back (docs/design/splits.md "The handover").

        A split that is not there (never started, or aborted already) is reported aborted, and
        ``discovery`` is written back all the same (an abort that stopped between the two writes).

        Args:
            count: ``M`` of the split to abort.
            dry_run: only check; write nothing.

        Raises:
            SplitNotAuthorisedError: as :func:`check_authority`.
            SplitStateError: a parent is sealing (the split only goes forward: run it again); the
                split is complete; another split, to another count, is unfinished.
            ZooKeeperUnavailableError: ZooKeeper went away (running the abort again finishes it).
        """
        notes = check_authority(self.cluster, self.tls, planning=dry_run)
        value = self.epochs.read().value
        current = value.current
        if current is None or current.count != count:
            if current is not None and current.unfinished:
                raise SplitStateError(
                    f"the unfinished split is to epoch {current.number} ({current.count} partitions), "
                    f"not to {count}: nothing to abort. Nothing was written"
                )
            if not dry_run:
                self.cluster.set_discovery_epoch(value.current_number)
            previous = value.current_count
            return SplitReport(
                value.current_number + 1,
                count,
                previous,
                SplitPhase.ABORTED,
                (),
                dry_run=dry_run,
                notes=(*notes, f"no split to {count} partitions is under way"),
            )
        if current.state is EpochState.COMPLETE:
            raise SplitStateError(
                f"the split to epoch {current.number} ({current.count} partitions) is complete: "
                "it cannot be aborted"
            )
        sealing = [p for p, progress in sorted(current.parents.items()) if progress.sealing]
        if sealing:
            raise SplitStateError(
                f"the split to epoch {current.number} ({current.previous_count} -> {current.count} "
                f"partitions) cannot be aborted: parents {sealing} are sealing, so it only goes forward. "
                f"Run `waltz cluster split --to {current.count}` again to resume it. Nothing was written"
            )
        check = SplitCheck(current.number, current.count, current.previous_count, current, {}, notes)
        if dry_run:
            return self._report(check, current, resumed=True, dry_run=True)
        after = self.epochs.abort(current.number).value
        self._say(f"epoch {current.number} deleted: no parent was sealing")
        self.cluster.set_discovery_epoch(after.current_number)
        self._say(
            f"discovery: epoch {after.current_number}"
            + (", format 1 again" if after.current_number == 0 else "")
        )
        report = self._report(check, current, resumed=True)
        return SplitReport(
            report.epoch, report.count, report.previous_count, SplitPhase.ABORTED, report.parents, notes=notes
        )

    def _report(
        self, check: SplitCheck, epoch: Epoch, *, resumed: bool, dry_run: bool = False
    ) -> SplitReport:
        parents = tuple(
            ParentStatus(
                p,
                progress.high_water_mark,
                progress.sealing,
                progress.barrier,
                check.owners.get(p),
                epoch.children_of(p),
            )
            for p, progress in sorted(epoch.parents.items())
        )
        children = tuple(child_status(epoch, c) for c in epoch.new_partitions)
        state = SplitPhase(epoch.state.value)
        if dry_run:
            waiting: str | None = DRY_RUN
        else:
            waiting = None if state is SplitPhase.COMPLETE else waiting_reason(epoch)
        return SplitReport(
            epoch.number,
            epoch.count,
            epoch.previous_count,
            state,
            parents,
            children,
            resumed=resumed,
            dry_run=dry_run,
            waiting=waiting,
            notes=check.notes,
        )
