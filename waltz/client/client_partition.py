"""The client-side partition: the feed it follows and applies, and the parts it is made of.

Source: docs/design/client.md "Appends, the feed and flush", "Failed-append detection",
"Reconnect", "Applying transactions"; ``docs/protocol.md`` "Feed entries". A
:class:`ClientPartition` is a proxy of a partition owned by some server. It lives on the client's
event loop (only its apply worker, its applied and absorbed marks and the claims of its first
attempts are touched from other threads).

It processes the feed (contiguity, this client's own entries, the apply queue of its
:class:`~waltz.client.apply_worker.ApplyWorker`) and the other server messages, and hands them to
its parts:

- :class:`~waltz.client.mount_procedure.MountProcedure`: its life cycle, placement and connection,
  with its feed window (:class:`~waltz.client.feed_window.FeedWindow`); the partition provides the
  mark to mount from and what a mount fails and unblocks (:class:`~waltz.client.mount_procedure.
  MountSteps`);
- :class:`~waltz.client.pending_appends.PendingAppends`: this client's appends on their way, sent
  (the transaction monitor), held back behind the locks of its own pending appends
  (:class:`~waltz.client.lock_holds.LockHolds`), blocked while mounting, and the claims of first
  attempts (:class:`~waltz.client.lock_claims.LockClaims`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from waltz.client.apply_worker import ApplyWorker
from waltz.client.connection import ServerConnection
from waltz.client.context import AppendPayload
from waltz.client.feed_window import FeedWindow
from waltz.client.genesis_hold import GenesisHold
from waltz.client.lock_claims import ClaimWaiter, LockClaims
from waltz.client.lock_holds import LockHolds, PendingAppend
from waltz.client.metrics import ClientMetrics, PartitionMetrics
from waltz.client.monitor import TransactionMonitor
from waltz.client.mount_procedure import MountHost, MountProcedure, PartitionState
from waltz.client.pending_appends import AttemptOutcomes, PendingAppends, RequestIds
from waltz.client.routing import SplitOrigin
from waltz.client.submission import Submission
from waltz.client.transaction import Transaction, TransactionDataSource
from waltz.client.waiting import Watermark
from waltz.errors import (
    ApplyPausedError,
    ClientAheadOfLogError,
    PartitionNotOpenError,
    ProtocolError,
    StalePartitionEpochError,
    WaltzError,
)
from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId, unequal_columns

__all__ = ["ClientPartition", "PartitionHost"]

log = logging.getLogger(__name__)

_CLOSED = PartitionState.CLOSED


class PartitionHost(MountHost, RequestIds, Protocol):
    """What a partition needs from the client that owns it (all on the event loop): its ID and
    ReqId sequence, its connections, the application's callbacks, the transaction data source,
    and a fresh look at the assignment."""

    data_source: TransactionDataSource

    def own_applied_mark(self, partition_id: int) -> Watermark | None:
        """This client's applied mark of a partition it mounts (None: it does not mount it); any
        thread."""
        ...


class ClientPartition:
    """One partition as this client sees it.

    Args:
        partition_id: the partition.
        host: the client.
        outcomes: where the outcomes of the attempts handed to the partition go.
        max_apply_batch: transactions per ``apply_transactions`` call.
        metrics: the partition's counters (default: counters of a registry of its own).
        apply_linger: seconds the apply worker waits to fill a batch (``client.applyLinger``).
        max_apply_backlog: the feed window: transactions the server may feed beyond what the
            application applied (``client.maxApplyBacklog``; 0: no limit).
        hold_conflicting_appends: hold back an append whose WRITE or READ lock a pending append of
            this client holds as a WRITE or APPEND lock (``client.holdConflictingAppends``; see
            :meth:`PendingAppends.send`).
        retry_linger: seconds a re-attempt's append may wait for the next first attempt's append
            to share its stream message (``client.retryLinger``; see :meth:`PendingAppends.send`).
        origin: for a new child of a split, its parent and the parent's ``B(p)``, its floor
            (docs/design/splits.md "Clients across a split"); None for a partition of the count at
            creation.
    """

    def __init__(
        self,
        partition_id: int,
        host: PartitionHost,
        outcomes: AttemptOutcomes,
        max_apply_batch: int,
        metrics: PartitionMetrics | None = None,
        *,
        apply_linger: float = 0.0,
        max_apply_backlog: int = 0,
        hold_conflicting_appends: bool = True,
        retry_linger: float = 0.0,
        origin: SplitOrigin | None = None,
    ) -> None:
        self.partition_id = partition_id
        self.origin = origin
        """A new child's parent and ``B(p)`` (None: a partition of the count at creation)."""
        self.floor = -1 if origin is None else origin.barrier
        """The lowest mark the partition is mounted from and read at: a new child's ``B(p)``, its
        log starting with the genesis after it; -1 otherwise."""
        self.metrics = metrics if metrics is not None else ClientMetrics().partition(partition_id)
        self._host = host
        self._outcomes = outcomes
        self._max_apply_batch = max_apply_batch
        self._apply_linger = apply_linger
        self.applied = Watermark(-1)
        """The highest transaction ID this client applied (or found applied) on the partition."""
        self.absorbed = Watermark(-1)
        """The highest transaction ID the callbacks absorbed (``absorb_transactions``; with
        callbacks that do not absorb, the same as :attr:`applied`); never below it."""
        self.worker: ApplyWorker | None = None
        self.own_committed_mark = -1
        """The highest transaction ID of this client's own commits on the partition."""
        self.server_high_water_mark = -1
        """The server's committed high-water mark as last known (feed, flush and mark responses)."""
        self.feed_gaps = 0
        self._feed_mark = -1
        self._mount_mark = -1  # the mark of the latest mount request: the feed starts after it
        self._queued_mark: int | None = None
        self._to_queue: list[tuple[Transaction, Submission | None]] = []  # handed over by end_of_batch
        window = FeedWindow(
            partition_id, max_apply_backlog, self.applied, self._applied_mark, self._new_req_id, self.metrics
        )
        self._mount = MountProcedure(partition_id, host, self, window, self._new_req_id, self.metrics)
        self._holds = LockHolds(self.applied, hold_conflicting_appends)
        self._claims = LockClaims(self._holds, self.metrics)
        self._appends = PendingAppends(
            partition_id, host, outcomes, self._mount, self._holds, self._claims, self.metrics, retry_linger
        )
        self.monitor: TransactionMonitor[PendingAppend] = self._appends.monitor
        """The appends sent and not resolved yet, in the order sent."""
        self.send_append: Callable[[Submission, AppendPayload], None] = self._appends.send
        """Send an attempt's append, or hold it back (:meth:`PendingAppends.send`; on the loop).
        The parts' own method, bound once: it runs for every append."""

    def __repr__(self) -> str:
        failure = self._mount.last_failure
        return (
            f"ClientPartition({self.partition_id}, {self.state.value}, {self.endpoint} "
            f"generation {self.generation}, pending {len(self.monitor)}, blocked {self._appends.blocked}"
            f"{'' if failure is None else f', last failure: {failure}'})"
        )

    def _applied_mark(self) -> int:
        """The applied mark, counting the floors the worker has not taken yet."""
        worker = self.worker
        return self.applied.value if worker is None else worker.applied_mark

    def _new_req_id(self, generation: int) -> ReqId:
        """The ReqId of this client's next request on the partition under ``generation``."""
        return ReqId(self._host.client_id, generation, self.partition_id, self._host.next_seq_num())

    # --- life cycle -------------------------------------------------------------------------------

    @property
    def state(self) -> PartitionState:
        """Where the partition is in its life cycle."""
        return self._mount.state

    @property
    def endpoint(self) -> str | None:
        """The server the assignment names for the partition (None: no server)."""
        return self._mount.endpoint

    @property
    def generation(self) -> int:
        """The partition's generation as the assignment names it (-1: not known yet)."""
        return self._mount.generation

    @property
    def connection(self) -> ServerConnection | None:
        """The connection of the partition's latest mount request (None: none, or it broke)."""
        return self._mount.connection

    @property
    def wanted(self) -> bool:
        """True while the application wants the partition mounted."""
        return self._mount.wanted

    @property
    def mounted(self) -> bool:
        """True when the partition is mounted and appends flow."""
        return self._mount.mounted

    @property
    def refusal(self) -> ClientAheadOfLogError | None:
        """Why the server refused the latest mount: the client's mark is above the partition's
        high-water mark (docs/design/client.md "Mount and the client high-water mark"); None
        otherwise. While it is set, every context submitted to the partition ends with it (read
        from any thread: a hint, confirmed on the loop when the append would be sent)."""
        return self._mount.refusal

    def on_apply_thread(self) -> bool:
        """True when called from the partition's apply worker (inside ``apply_transaction``)."""
        worker = self.worker
        return worker is not None and worker.is_current_thread()

    async def wait_mounted(self) -> None:
        """Wait until the partition is mounted.

        Raises:
            ClientAheadOfLogError: the server refused the mount (docs/design/client.md "Mount and
                the client high-water mark").
        """
        await self._mount.wait_mounted()

    def mount(self) -> None:
        """Start mounting (and applying the feed); no-op when already mounted or mounting."""
        mount = self._mount
        if mount.state is _CLOSED or mount.wanted:
            return
        if self.worker is None:
            self.worker = ApplyWorker(
                self.partition_id,
                self._host.callbacks,
                self.applied,
                max_batch=self._max_apply_batch,
                linger=self._apply_linger,
                metrics=self.metrics,
                absorbed=self.absorbed,
                hold=self._genesis_hold(),
                on_pause=self._apply_paused,
            )
            self.worker.start()
        mount.start()

    def _apply_paused(self, error: ApplyPausedError) -> None:
        """The apply worker started to wait for this instance's upgrade (on its thread): the
        attempt path ends the retries that wait for it (docs/design/client.md "Retries and lock
        failures")."""
        self._outcomes.apply_paused(self.partition_id, error)

    def _genesis_hold(self) -> GenesisHold | None:
        """A new child's genesis hold, for its next apply worker (docs/design/splits.md "Clients
        across a split"); None for a partition of the count at creation."""
        if self.origin is None:
            return None
        host = self._host
        return GenesisHold(self.origin, host.own_applied_mark, host.callbacks.get_client_high_water_mark)

    @property
    def holding_genesis(self) -> bool:
        """True while the partition's apply holds its genesis for its parent's mark."""
        worker = self.worker
        return worker is not None and worker.holding

    def remount(self, reason: str) -> None:
        """Run the reconnect procedure: block appends, mount again (docs/design/client.md "Reconnect")."""
        self._mount.remount(reason)

    def detach(self, *, unmount: bool = True) -> ApplyWorker | None:
        """Stop mounting and following the feed (unmount, or close); returns the worker to close.

        The caller makes sure nothing is in flight; the feed and the queue of the worker are
        forgotten, so the next mount starts from the callbacks' high-water mark. Feed entries
        already on their way are ignored.

        Args:
            unmount: tell the server on the partition's connection to stop its feed
                (``UnmountRequest``, ``docs/protocol.md`` "Unmount"); False when the connections
                close anyway (the client closes).
        """
        self._mount.stop(unmount=unmount)
        self._queued_mark = None
        self._to_queue.clear()
        worker, self.worker = self.worker, None
        return worker

    def close(self) -> tuple[ApplyWorker | None, list[Submission]]:
        """Stop for good; returns the worker to close and every submission still held."""
        worker = self.detach(unmount=False)
        self._mount.close()
        return worker, self._appends.close()

    def set_placement(self, endpoint: str | None, generation: int) -> None:
        """Take the partition's place from the assignment; a change means mounting again."""
        self._mount.set_placement(endpoint, generation)

    def connection_lost(self, connection: ServerConnection) -> None:
        """A connection broke: when it is the partition's, mount again (with a new network client)."""
        self._mount.connection_lost(connection)

    # --- the partition's steps of the mount procedure (MountSteps) --------------------------------

    def mount_from(self, callbacks_mark: int) -> int:
        """The high-water mark to mount from (docs/design/client.md "Mount and the client high-water
        mark", step 3): the callbacks' mark on a first mount; with appends pending, the lower of
        the callbacks' mark and the last transaction this client saw in its own feed, so that the
        fate of each pending append shows in the feed even when another instance sharing the
        database is ahead; otherwise the higher of the two. The feed restarts after it. A new
        child's callbacks' mark is read as its floor ``B(p)`` when below it (docs/design/splits.md
        "Clients across a split"), so its feed starts with the genesis."""
        worker = self.worker
        assert worker is not None
        callbacks_mark = max(callbacks_mark, self.floor)  # a new child: its feed starts with the genesis
        mark = self._mark_to_mount_from(callbacks_mark, worker)
        self._feed_mark = self._mount_mark = mark
        return mark

    def _mark_to_mount_from(self, callbacks_mark: int, worker: ApplyWorker) -> int:
        if self._queued_mark is None:
            self._queued_mark = callbacks_mark
            worker.set_floor(callbacks_mark)
            return callbacks_mark
        if self.monitor:
            return min(callbacks_mark, self._queued_mark)
        if callbacks_mark > self._queued_mark:
            self._queued_mark = callbacks_mark
            worker.set_floor(callbacks_mark)
        return self._queued_mark

    def on_mounted(self, mount_mark: int) -> None:
        """The server is ready for the mount: every append still pending failed (re-executed,
        and what it held back is sent), and the blocked appends are sent."""
        failed, blocked = self._appends.on_mounted()
        log.info(
            "partition %d: mounted on %s (generation %d, from transaction %d, feed at %d); "
            "%d pending append(s) failed, %d blocked",
            self.partition_id,
            self._mount.endpoint,
            self._mount.generation,
            mount_mark,
            self._feed_mark,
            failed,
            blocked,
        )

    def on_remount(self) -> None:
        """The partition mounts again: flushes sent before are answered no more."""
        self._appends.forget_flushes()

    def on_refused(self, error: ClientAheadOfLogError) -> None:
        """The server refused the mount (the client's mark is above the partition's high-water
        mark): every append of the partition, sent, held back or blocked, ends with ``error``
        instead of running again (docs/design/client.md "Mount and the client high-water mark")."""
        ended = self._appends.on_refused(error)
        if ended:
            log.error("partition %d: %d transaction(s) ended with the refusal", self.partition_id, ended)

    # --- appends (PendingAppends) -----------------------------------------------------------------

    def holds_any(self, lock_hashes: Sequence[int], seen: int = -1) -> bool:
        """Whether a pending append of this client holds one of these locks now, or a commit of
        this client after ``seen`` (the mark an attempt would read at) wrote one (read from any
        thread: a hint, confirmed on the loop by :meth:`queue_first_attempt`)."""
        return self._holds.holds_any(lock_hashes, seen)

    def committed_after(self, lock_hashes: Sequence[int], seen: int) -> int:
        """The latest commit of this client after ``seen`` that wrote one of ``lock_hashes``
        (see :meth:`LockHolds.committed_after`; on the loop)."""
        return self._holds.committed_after(lock_hashes, seen)

    def queue_first_attempt(self, submission: Submission, lock_hashes: Sequence[int]) -> None:
        """Queue a context behind the pending append holding one of its expected locks, before its
        first attempt runs (see :meth:`PendingAppends.queue_first_attempt`; on the loop)."""
        self._appends.queue_first_attempt(submission, lock_hashes)

    def claim(
        self, submission: Submission, lock_hashes: Sequence[int], waiters: deque[ClaimWaiter] | None = None
    ) -> bool:
        """Claim these expected locks for the first attempt of ``submission`` (any thread; see
        :meth:`LockClaims.claim`); False when it waits for another context's claim."""
        return self._claims.claim(submission, lock_hashes, waiters)

    def has_claims(self, submission: Submission) -> bool:
        """Whether ``submission`` holds claims (a hint read without the lock)."""
        return self._claims.has_claims(submission)

    def release_claims(self, submission: Submission) -> deque[ClaimWaiter]:
        """End the claims of ``submission`` (any thread); returns the contexts that waited for
        them, in order, for :meth:`claims_released` on the loop."""
        return self._claims.release(submission)

    def claims_released(self, waiters: deque[ClaimWaiter]) -> None:
        """Go on with the contexts that waited for a claim (see
        :meth:`PendingAppends.claims_released`; on the loop)."""
        self._appends.claims_released(waiters)

    def leader_ended(self, leader: Submission) -> None:
        """``leader`` ended without another append (on the loop): release those following it."""
        self._appends.leader_ended(leader)

    def send_flush(self) -> None:
        """Nudge the server with a flush request when appends are pending (learn their fate)."""
        self._appends.send_flush()

    # --- the feed and other server messages -------------------------------------------------------

    def on_feed_entries(self, connection: ServerConnection, feed: client_pb2.FeedEntries) -> None:
        """Process a run of feed entries (``FeedEntries``, docs/protocol.md "Feed entries"), each in
        turn: contiguity, the transaction monitor, the apply queue. A run whose columns differ in
        length (or are empty) is malformed, and a run that starts past the next transaction is a
        gap: either is dropped whole and the partition mounts again, which restarts the feed after
        what was applied."""
        mount = self._mount
        if connection is not mount.connection or not mount.wanted:
            return  # a stale connection's leftovers, or not following this partition
        client_ids = list(feed.client_ids)
        generations = list(feed.generations)
        seq_nums = list(feed.seq_nums)
        headers = list(feed.headers)
        count = len(client_ids)
        problem = unequal_columns(
            {
                "client_ids": count,
                "generations": len(generations),
                "seq_nums": len(seq_nums),
                "headers": len(headers),
            }
        )
        if problem is not None or not count:
            log.warning(
                "partition %d: %s sent feed entries whose %s; mounting again",
                self.partition_id,
                connection.endpoint,
                problem or "columns hold no entry",
            )
            self.remount("malformed feed entries")
            return
        first = feed.first_transaction_id
        last = first + count - 1
        self.server_high_water_mark = max(self.server_high_water_mark, last)
        expected = self._feed_mark + 1
        if first > expected:  # transactions missing: restart the feed after what was applied
            self.feed_gaps += 1
            self.metrics.feed_gaps.inc()
            log.warning(
                "partition %d: %s sent transaction %d after %d (a gap in the feed); mounting again",
                self.partition_id,
                connection.endpoint,
                first,
                self._feed_mark,
            )
            self.remount(f"feed gap after transaction {self._feed_mark}")
            return
        partition_id = self.partition_id
        own_client = self._host.client_id
        appends = self._appends
        monitor = self.monitor
        data_source = self._host.data_source
        to_queue = self._to_queue
        committed: list[tuple[Submission, int]] = []
        sent_at_sum = 0.0  # of the committed appends: their log round trips in one sum
        flushes = appends.awaits_flushes  # only a flush answer adds one: none comes during the run
        try:
            for index in range(expected - first, count):
                transaction_id = first + index
                self._feed_mark = transaction_id
                client_id = client_ids[index]
                req_id: ReqId | None = None
                data: bytes | None = None
                own: Submission | None = None
                if client_id == own_client and monitor:
                    req_id = ReqId(client_id, generations[index], partition_id, seq_nums[index])
                    succeeded = appends.on_feed(req_id)
                    if succeeded is not None:
                        own, data = succeeded.submission, succeeded.payload.data
                        sent_at_sum += succeeded.sent_at
                        self.own_committed_mark = transaction_id
                        committed.append((own, transaction_id))
                        appends.committed(succeeded, transaction_id)
                queued = self._queued_mark
                if queued is not None and transaction_id > queued and self.worker is not None:
                    self._queued_mark = transaction_id
                    if req_id is None:
                        req_id = ReqId(client_id, generations[index], partition_id, seq_nums[index])
                    to_queue.append(
                        (
                            Transaction(
                                partition_id, transaction_id, req_id, headers[index], data_source, data
                            ),
                            own,
                        )
                    )
                if flushes:
                    flushes = appends.feed_reached(transaction_id)
        finally:  # what committed before an error is still completed
            if committed:
                self.metrics.committed.inc(len(committed))
                now = time.monotonic()
                self.metrics.commit_seconds.observe_all([now - s.submitted_at for s, _ in committed])
                self.metrics.log_round_trip_seconds.add(len(committed) * now - sent_at_sum, len(committed))
                self._outcomes.completed(committed)

    def end_of_batch(self) -> None:
        """Hand the feed entries of the last batch of server messages to the apply worker at once."""
        if self._to_queue and self.worker is not None:
            self.worker.enqueue_many(self._to_queue)
            self._to_queue = []

    def on_message(self, connection: ServerConnection, kind: str, body: object) -> None:
        """Process a server message other than feed data (``kind`` is its oneof field name)."""
        if connection is not self._mount.connection:
            return
        if kind == "mount":
            assert isinstance(body, client_pb2.MountResponse)
            self._mount.on_response(body)
        elif kind == "lock_failure":
            assert isinstance(body, client_pb2.LockFailure)
            self._appends.on_lock_failure(ReqId.from_proto(body.req_id), body.transaction_id)
        elif kind == "flush":
            assert isinstance(body, client_pb2.FlushResponse)
            self.server_high_water_mark = max(self.server_high_water_mark, body.transaction_id)
            self._appends.on_flush(body, self._feed_mark, self._mount_mark)
        elif kind == "feed_suspended":
            self._host.refresh_assignment()
            self.remount(f"{connection.endpoint} suspended the feed")
        elif kind == "error":
            assert isinstance(body, client_pb2.ServerError)
            self._on_server_error(body)

    def _on_server_error(self, error: client_pb2.ServerError) -> None:
        req_id = ReqId.from_proto(error.req_id)
        if error.code in (client_pb2.STALE_PARTITION_EPOCH, client_pb2.PARTITION_NOT_OPEN):
            # Expected while a split runs: the context is routed again, and ends with the error
            # only when the epochs do not move in time (an append each: no line of its own).
            log.debug("partition %d: %s refused for its epoch: %s", self.partition_id, req_id, error.message)
        elif error.code != client_pb2.CLIENT_AHEAD_OF_LOG:  # the mount procedure logs its refusal
            log.warning("partition %d: server error for %s: %s", self.partition_id, req_id, error.message)
        if self._mount.on_error(req_id, error):
            return
        refusal = self._refusal(req_id, error)
        if isinstance(refusal, StalePartitionEpochError | PartitionNotOpenError):
            self._appends.on_refused_epoch(req_id, refusal)
        else:
            self._appends.on_rejected(req_id, refusal)

    def _refusal(self, req_id: ReqId, error: client_pb2.ServerError) -> WaltzError:
        """The failure a server's refusal of an append is (docs/protocol.md "Partition epochs"):
        the epoch refusals by their code (their context runs again, routed anew, docs/design/
        splits.md "Clients across a split"; the error ends it only when the epochs do not move in
        time), any other as a :class:`ProtocolError`."""
        code = error.code
        if code == client_pb2.STALE_PARTITION_EPOCH:
            return StalePartitionEpochError(
                self.partition_id, error.epoch, error.partition_count, error.message
            )
        if code == client_pb2.PARTITION_NOT_OPEN:
            return PartitionNotOpenError(self.partition_id, error.epoch, error.partition_count, error.message)
        return ProtocolError(f"server {self.endpoint} rejected the append {req_id}: {error.message}")
