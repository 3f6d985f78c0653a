"""The archiver: each partition's committed records into the archive, verified, in chunks.

Source: docs/design/archive.md "The archiver"; the decision to make it a process of its own:
docs/decisions/0055-the-archiver-a-process-of-its-own.md. Per partition, from its manifest's
archived-through + 1:

1. plan what is committed (:func:`~waltz.committed.plan.plan_live_on`);
2. read a chunk's records from a quorum of the proven replicas and compare them
   (:func:`~waltz.archive.replicas.read_quorum`);
3. write the chunk, read it back and check it (:func:`~waltz.archive.chunks.write_chunk`), then
   add it to the partition's manifest;
4. raise the partition's archived-through in ZooKeeper and tell the replicas
   (:func:`~waltz.archive.replicas.tell_replicas`).

Each round also asks every storage node what it was told (one status call per node): before any
partition's work it lowers every replica told more than ZooKeeper's archived-through, and each
partition's round tells the replicas whose archived-through differs from ZooKeeper's (one a run
could not tell: down, or a certificate without the admin role; one that joined the partition
since). A replica that is still not told is named in its :class:`PartitionRound`.

A chunk is written when it is full (``chunk_transactions`` records or ``chunk_bytes`` of data) or
when the partition has been quiet (its committed high-water mark unchanged) for ``seal_after``
seconds. Restarted after a stop at any step, it archives nothing twice and skips nothing: the
manifest is the record; a chunk file it does not list yet is checked against the replicas and
adopted if it matches, replaced if not; a manifest ahead of ZooKeeper has its chunks above
ZooKeeper's archived-through checked (one that fails is written again from the replicas) before
ZooKeeper is raised to it.

Error handling: a partition that cannot go on (replicas that disagree, too few replicas, a chunk
that fails its check, a malformed manifest, ZooKeeper ahead of the manifest) is reported in its
:class:`PartitionRound` and left for the next round; the other partitions go on. A manifest of a
newer form, or a location that cannot be opened, stops the run.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from kazoo.exceptions import KazooException

from waltz.admin.description import opened_partitions
from waltz.admin.storage_nodes import DEFAULT_STORAGE_TIMEOUT
from waltz.archive.chunks import adopt_chunk, read_chunk, read_unlisted_chunk, write_chunk
from waltz.archive.errors import ArchiveCheckError, ArchiveError, ArchiveFormTooNewError
from waltz.archive.layout import ArchiveFiles, parse_chunk_name, partition_directory
from waltz.archive.location import normal_location
from waltz.archive.manifests import (
    ChunkEntry,
    PartitionManifest,
    read_partition_manifest,
    write_partition_manifest,
)
from waltz.archive.metrics import ArchiverMetrics
from waltz.archive.replicas import (
    UNKNOWN_REQUEST,
    QuorumRead,
    read_quorum,
    replica_partition_statuses,
    statuses_by_partition,
    tell_replicas,
    was_told,
)
from waltz.archive.summary import claim_archive, entry_of, record_partition
from waltz.committed.errors import CommittedReadError
from waltz.committed.plan import CommittedPartition, LiveSource, plan_live_on
from waltz.errors import MetadataError
from waltz.metadata.values import ClusterParams, ReplicaAssignments
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import ZooKeeperUnavailableError
from waltz.protocol.channels import TlsConfig
from waltz.protocol.records import Record

__all__ = ["ArchiveEvent", "Archiver", "ChunkPolicy", "PartitionRound", "Step"]

log = logging.getLogger(__name__)


class Step(enum.Enum):
    """A step of the archiver, as :class:`ArchiveEvent` reports it."""

    CHUNK_WRITTEN = "chunk written"
    CHUNK_ADOPTED = "chunk adopted"
    CHUNK_REPLACED = "chunk replaced"
    MANIFEST_WRITTEN = "manifest written"
    SUMMARY_RAISED = "summary raised"
    REPLICAS_TOLD = "replicas told"
    WAITING_FOR_QUIET = "waiting for quiet"


@dataclass(frozen=True, slots=True)
class ArchiveEvent:
    """One step done, for progress lines.

    Attributes:
        step: what was done.
        partition_id: the partition.
        first: the first transaction of the chunk concerned.
        last: its last transaction (for ``SUMMARY_RAISED`` and ``REPLICAS_TOLD``: the new
            archived-through; for ``WAITING_FOR_QUIET``, a run without ``follow`` about to wait for
            the partition's last transactions to stay quiet, ``first..last`` are those).
        detail: one line on it (rows, bytes, replicas; for ``WAITING_FOR_QUIET``, the seconds to
            wait, as text).
    """

    step: Step
    partition_id: int
    first: int
    last: int
    detail: str = ""


Progress = Callable[[ArchiveEvent], None]


@dataclass(frozen=True, slots=True)
class ChunkPolicy:
    """When a chunk is written.

    Attributes:
        chunk_transactions: records of a full chunk.
        chunk_bytes: data bytes of a full chunk (the chunk ends at the record that reaches them).
        seal_after: seconds a partition's committed high-water mark must stay unchanged before a
            chunk shorter than full is written (0: at once).
    """

    chunk_transactions: int = 100_000
    chunk_bytes: int = 64 << 20
    seal_after: float = 60.0


@dataclass(slots=True)
class PartitionRound:
    """What one round did for a partition.

    Attributes:
        partition_id: the partition.
        high_water_mark: its committed high-water mark when planned (-1: nothing committed).
        archived_through: its archived-through after the round.
        chunks_added: chunks added to its manifest.
        records: records in them.
        size_bytes: their file bytes.
        waiting: committed transactions left for a full chunk or quiet.
        seal_at: ``time.monotonic()`` at which those are written if the partition stays quiet.
        error: why the partition stopped, or None.
        untold: replicas (storage connect string -> why) that were not told the archived-through
            in this round: they keep their archived segments until a later round tells them.
    """

    partition_id: int
    high_water_mark: int = -1
    archived_through: int = -1
    chunks_added: int = 0
    records: int = 0
    size_bytes: int = 0
    waiting: int = 0
    seal_at: float | None = None
    error: str | None = None
    untold: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Quiet:
    """When a partition's high-water mark was first seen at its value."""

    mark: int
    since: float
    tail_read_at: int | None = field(default=None)


class Archiver:
    """Archives a cluster's partitions to one location (docs/design/archive.md, "The archiver").

    Use :meth:`run` (once, or following the log until ``stop`` is set), or :meth:`run_round`.
    The caller owns the ZooKeeper session of ``cluster``; the archiver opens an admin stream for
    each read and closes it.

    Args:
        cluster: the cluster's znodes.
        location: the archive: a directory or a URL pyarrow opens.
        policy: when a chunk is written.
        partitions: the partitions to archive (None: all).
        relocate: the archive was moved to ``location``: record it as the cluster's archive.
        storage_timeout: seconds for each storage node's admin call.
        tls: client TLS files for the admin ports.
        operator: who runs it, as told to the storage nodes.
        progress: called after each step.
        clock: the clock of ``seal_after`` (``time.monotonic``).
        metrics: counted and set as it archives (chunks, bytes, each partition's lag), or None.

    Raises:
        LocationError: the location cannot be opened.
    """

    def __init__(
        self,
        cluster: ClusterZk,
        location: str,
        *,
        policy: ChunkPolicy | None = None,
        partitions: Sequence[int] | None = None,
        relocate: bool = False,
        storage_timeout: float = DEFAULT_STORAGE_TIMEOUT,
        tls: TlsConfig | None = None,
        operator: str = "",
        progress: Progress | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: ArchiverMetrics | None = None,
    ) -> None:
        self._cluster = cluster
        self._metrics = metrics
        self._files = ArchiveFiles.open(normal_location(location))
        self._policy = policy or ChunkPolicy()
        self._partitions = None if partitions is None else sorted(set(partitions))
        self._relocate = relocate
        self._timeout = storage_timeout
        self._tls = tls
        self._operator = operator
        self._progress = progress or (lambda _: None)
        self._clock = clock
        self._params: ClusterParams | None = None
        self._warned: set[int] = set()  # new partitions of a split said to be not archived
        self._quiet: dict[int, _Quiet] = {}
        self._untold: dict[int, dict[str, str]] = {}  # this round's replicas not told, and why
        self._said: dict[str, str] = {}  # storage -> the failure to tell it last logged
        self._silent: dict[str, str] = {}  # storage -> why it did not answer, as last logged
        # This round's view of each replica: the partition's replicas (ZooKeeper's assignment), what
        # each was told and where its disk starts (its status, updated as the round tells it), or
        # why it did not answer.
        self._replicas: ReplicaAssignments = ReplicaAssignments({})
        self._told: dict[int, dict[str, int]] = {}
        self._local_starts: dict[int, dict[str, int]] = {}
        self._unanswered: dict[str, str] = {}
        self._unaware: set[str] = set()
        self._stop = threading.Event()

    @property
    def location(self) -> str:
        """The archive's location, as recorded in ZooKeeper."""
        return self._files.location

    def run(
        self, *, follow: bool = False, stop: threading.Event | None = None, interval: float = 10.0
    ) -> list[PartitionRound]:
        """Archive until nothing more is ready (``follow`` False) or until ``stop`` is set.

        Without ``follow``, a partition whose last transactions wait only for quiet is given one
        more round after ``seal_after`` seconds (written if it stayed quiet).

        Args:
            follow: keep archiving, a round every ``interval`` seconds, until ``stop`` is set.
            stop: set to stop after the chunk in progress (SIGTERM).
            interval: seconds between rounds when following.

        Returns:
            The last round's outcome per partition.

        Raises:
            ArchiveRefusedError: another location is on record, or the archive is another cluster's.
            ArchiveFormTooNewError: a manifest of a form newer than this code reads.
            LocationError, OSError: the location cannot be used.
            ZooKeeperUnavailableError, ClusterNotFoundError, ConfigurationError: ZooKeeper, the
                cluster or the partitions asked for are not there (with ``follow``, a round that
                ZooKeeper fails is logged and the next one tries again).
        """
        if stop is not None:
            self._stop = stop
        if not follow:
            results = self.run_round()
            waiting = [r for r in results if r.seal_at is not None and r.error is None]
            if not waiting:
                return results
            now = self._clock()
            for r in waiting:
                seconds = max(0.0, (r.seal_at or now) - now)
                first = r.archived_through + 1
                self._progress(
                    ArchiveEvent(
                        Step.WAITING_FOR_QUIET, r.partition_id, first, r.high_water_mark, f"{seconds:.0f}"
                    )
                )
            if not self._stop.wait(max(0.0, max(r.seal_at or now for r in waiting) - now)):
                results = self.run_round()
            return results
        results = self._following_round([], interval)
        while not self._stop.wait(interval):
            results = self._following_round(results, interval)
        return results

    def _following_round(self, last: list[PartitionRound], interval: float) -> list[PartitionRound]:
        """A round of ``--follow``: a round that ZooKeeper failed (a lost connection, a stall) is
        logged and left for the next one; the last round's outcome stays."""
        try:
            return self.run_round()
        except (KazooException, ZooKeeperUnavailableError) as exc:
            log.error(
                "a round failed on ZooKeeper (%r): nothing is lost; the next round, in %gs, tries again",
                exc,
                interval,
            )
            return last

    def run_round(self) -> list[PartitionRound]:
        """One pass over the partitions: archive every chunk that is ready.

        Once the stop event is set, the pass ends after the partition in progress.

        Returns:
            The outcome per partition, in partition order (those the pass reached).

        Raises:
            As :meth:`run`.
        """
        params = self._claimed()
        ids = self._partitions if self._partitions is not None else range(params.num_partitions)
        self._warn_of_split(params)
        self._take_statuses(params)
        self._lower_first(ids)
        results: list[PartitionRound] = []
        for pid in ids:
            if results and self._stop.is_set():
                break  # stopped (SIGTERM): the partitions left wait for the next run
            results.append(self._round(pid))
        if self._metrics is not None:
            self._metrics.round_done(results)
        return results

    def _warn_of_split(self, params: ClusterParams) -> None:
        """Say once per new partition that a split opened that it is not archived: the archive
        does not follow a split yet (docs/design/archive.md "Partitions a split opened")."""
        new = [pid for pid in opened_partitions(self._cluster, params) if pid not in self._warned]
        if new:
            self._warned.update(new)
            log.warning(
                "partition(s) %s, opened by a split, are not archived: the archive does not follow a "
                "split yet (their records stay on the storage nodes, which delete archived segments "
                "only; a restore from the archive would not hold them)",
                ", ".join(map(str, new)),
            )

    def _claimed(self) -> ClusterParams:
        """The cluster's parameters, once the archive is claimed (on the first round)."""
        if self._params is None:
            claim_archive(self._cluster, self._files, relocate=self._relocate)
            self._params = self._cluster.params()
        return self._params

    # ---- one partition ----

    def _round(self, partition_id: int) -> PartitionRound:
        result = PartitionRound(partition_id)
        try:
            (plan,) = plan_live_on(self._cluster, [partition_id], timeout=self._timeout, tls=self._tls)
            result.high_water_mark = plan.high_water_mark
            self._archive(plan, result)
        except ArchiveFormTooNewError:
            raise
        except (ArchiveError, CommittedReadError, MetadataError, OSError) as exc:
            result.error = str(exc)
            log.error("partition %d: %s", partition_id, exc)
        result.untold = dict(self._untold.get(partition_id, {}))
        return result

    def _take_statuses(self, params: ClusterParams) -> None:
        """Ask every storage node for its partitions' status (one request per node) and keep, per
        partition, what each replica was told and where its disk starts."""
        statuses = replica_partition_statuses(self._cluster, params, timeout=self._timeout, tls=self._tls)
        self._replicas = self._cluster.assignments().value
        self._told, self._local_starts, self._untold = {}, {}, {}
        self._unanswered = {s: st for s, st in statuses.items() if isinstance(st, str)}
        for storage in statuses:
            if storage not in self._unanswered:
                self._silent.pop(storage, None)
        for storage, why in sorted(self._unanswered.items()):
            if self._silent.get(storage) != why:  # once per failure, not once per round
                self._silent[storage] = why
                log.warning(
                    "storage node %s did not answer: its replicas are not told what is archived "
                    "(they keep their segments) until it does: %s",
                    storage,
                    why,
                )
        for pid, entries in statuses_by_partition(statuses).items():
            self._told.setdefault(pid, {}).update({s: e.archived_through for s, e in entries.items()})
            self._local_starts.setdefault(pid, {}).update({s: e.local_start for s, e in entries.items()})

    def _lower_first(self, ids: Sequence[int]) -> None:
        """Before any partition's round: tell ZooKeeper's archived-through to every replica told
        more (after ``verify --hold`` could not tell it), so that it deletes nothing the archive
        may not give back, whatever stops a partition's round later."""
        summary = self._cluster.archive_summary()
        for pid in ids:
            recorded = -1 if summary is None else summary.value.of(pid).archived_through
            ahead = {s for s, told in self._told.get(pid, {}).items() if told > recorded}
            if ahead:
                self._tell(pid, recorded, only=ahead)

    def _archive(self, plan: CommittedPartition, result: PartitionRound) -> None:
        pid = plan.partition_id
        manifest = read_partition_manifest(self._files, pid)
        summary = self._cluster.archive_summary()
        recorded = -1 if summary is None else summary.value.of(pid).archived_through
        if recorded > manifest.archived_through:
            raise ArchiveCheckError(
                self._files.name(f"{partition_directory(pid)}/manifest.json"),
                f"partition {pid}: ZooKeeper ({self._cluster.paths.archive}) says the archive holds "
                f"transactions through {recorded}, the manifest through {manifest.archived_through}: chunks "
                "were lost, or this is not the archive ZooKeeper names; run waltz archive verify",
            )
        differing = self._told_otherwise(pid, recorded)
        if differing:
            self._tell(pid, recorded, only=differing)
        if manifest.archived_through > recorded:
            manifest = self._confirm(plan, manifest, recorded)
        result.archived_through = manifest.archived_through
        self._remove_temporaries(pid)
        quiet = self._observe(pid, plan.high_water_mark)
        while not self._stop.is_set():
            first = manifest.next_first()
            if first > plan.high_water_mark:
                break
            entry = self._next_chunk(plan, manifest, first, quiet)
            if entry is None:
                result.waiting = plan.high_water_mark - first + 1
                result.seal_at = quiet.since + self._policy.seal_after
                break
            manifest = self._record(manifest.with_chunk(entry))
            if self._metrics is not None:
                self._metrics.chunk_added(pid, entry)
            result.archived_through = manifest.archived_through
            result.chunks_added += 1
            result.records += entry.rows
            result.size_bytes += entry.size_bytes

    def _told_otherwise(self, partition_id: int, archived_through: int) -> set[str]:
        """The replicas of the partition that answered this round's status and were told another
        archived-through than ``archived_through`` (ZooKeeper's), or do not hold the partition."""
        told = self._told.get(partition_id, {})
        return {
            storage
            for storage in self._replicas.storages_of(partition_id)
            if storage not in self._unanswered and told.get(storage) != archived_through
        }

    def _replicas_hold(self, plan: CommittedPartition, first: int) -> bool:
        """Whether a quorum of the partition's replicas still holds transaction ``first`` on disk
        (retention deletes what the replicas were told is archived)."""
        starts = self._local_starts.get(plan.partition_id, {})
        source = plan.source
        quorum = source.quorum if isinstance(source, LiveSource) else len(starts) // 2 + 1
        return sum(1 for start in starts.values() if start <= first) >= quorum

    def _observe(self, partition_id: int, mark: int) -> _Quiet:
        now = self._clock()
        quiet = self._quiet.get(partition_id)
        if quiet is None or quiet.mark != mark:
            quiet = self._quiet[partition_id] = _Quiet(mark, now)
        return quiet

    def _is_quiet(self, quiet: _Quiet) -> bool:
        return self._clock() - quiet.since >= self._policy.seal_after

    def _next_chunk(
        self, plan: CommittedPartition, manifest: PartitionManifest, first: int, quiet: _Quiet
    ) -> ChunkEntry | None:
        """The next chunk, in the archive but not yet in the manifest; None when it is not ready."""
        pid, mark = plan.partition_id, plan.high_water_mark
        unlisted = self._unlisted(pid, first)
        if unlisted is not None:
            name, last = unlisted
            if last > mark:
                return None  # written when more was proven committed: taken up when it is again
            return self._adopt_or_replace(plan, name, first, last)
        policy = self._policy
        last = min(first + policy.chunk_transactions - 1, mark)
        short = last - first + 1 < policy.chunk_transactions
        if short and not self._is_quiet(quiet) and quiet.tail_read_at == mark:
            return None  # read at this mark already: not full by bytes either
        read = self._read(plan, first, last, max_bytes=policy.chunk_bytes)
        full = len(read.records) == policy.chunk_transactions or read.data_bytes >= policy.chunk_bytes
        if not full and not self._is_quiet(quiet):
            quiet.tail_read_at = mark
            return None
        entry = write_chunk(self._files, pid, read.records, read.replicas)
        self._say(Step.CHUNK_WRITTEN, pid, entry, f"verified against {', '.join(read.replicas)}")
        return entry

    def _read(
        self, plan: CommittedPartition, first: int, last: int, max_bytes: int | None = None
    ) -> QuorumRead:
        return read_quorum(plan, first, last, max_bytes=max_bytes, timeout=max(self._timeout, 30.0))

    def _unlisted(self, partition_id: int, first: int) -> tuple[str, int] | None:
        """A chunk file starting at ``first`` that the manifest does not list (a stop after step 3)."""
        for name in self._files.files_in(partition_directory(partition_id)):
            parsed = parse_chunk_name(name)
            if parsed is not None and parsed[0] == first:
                return name, parsed[1]
        return None

    def _adopt_or_replace(self, plan: CommittedPartition, name: str, first: int, last: int) -> ChunkEntry:
        pid = plan.partition_id
        read = self._read(plan, first, last)
        try:
            held = read_unlisted_chunk(self._files, pid, name, first, last)
        except ArchiveCheckError as exc:
            log.warning("partition %d: %s; writing it again", pid, exc)
            held = None
        if held == read.records:
            entry = adopt_chunk(self._files, pid, name, held, read.replicas)
            self._say(Step.CHUNK_ADOPTED, pid, entry, "a file not yet in the manifest matched the replicas")
            return entry
        entry = write_chunk(self._files, pid, read.records, read.replicas)
        self._say(
            Step.CHUNK_REPLACED, pid, entry, "a file not yet in the manifest did not match: written again"
        )
        return entry

    def _confirm(
        self, plan: CommittedPartition, manifest: PartitionManifest, recorded: int
    ) -> PartitionManifest:
        """Check the chunks the manifest lists above ZooKeeper's archived-through against a quorum
        of the replicas, writing again any that fails its own check, then raise ZooKeeper to the
        manifest. A chunk the replicas no longer hold (ZooKeeper's mark went back after they were
        told) is taken on its own check.

        Raises:
            ArchiveCheckError: a chunk lists transactions past the committed high-water mark, or
                holds other records than the replicas: not this cluster's (another cluster, one
                restored from this archive, archives to this location); nothing is raised.
        """
        pid = plan.partition_id
        for entry in manifest.chunks:
            if entry.last <= recorded:
                continue
            where = self._files.name(f"{partition_directory(pid)}/{entry.file}")
            if entry.last > plan.high_water_mark:
                raise ArchiveCheckError(
                    where,
                    f"partition {pid}: the manifest lists transactions through {entry.last}, past the "
                    f"committed high-water mark this run proved ({plan.high_water_mark}) and above "
                    f"ZooKeeper's archived-through ({recorded}): if replicas are down, the partition "
                    "waits for them; otherwise another cluster archives to this location (a cluster "
                    "restored from this archive?): give each cluster an archive of its own",
                    entry.first,
                    entry.last,
                )
            holding = self._replicas_hold(plan, entry.first)
            try:
                held: list[Record] | None = read_chunk(self._files, pid, entry)
            except ArchiveCheckError as problem:
                if not holding:
                    raise ArchiveCheckError(
                        where,
                        f"{problem.problem}; the replicas no longer hold these transactions (retention "
                        "deleted them), so it cannot be written again from them: copy the chunk back from "
                        "a copy of the archive (waltz archive verify --archive COPY checks one)",
                        entry.first,
                        entry.last,
                    ) from problem
                log.warning("partition %d: %s; writing it again from the replicas", pid, problem)
                held = None
            if not holding:
                # ZooKeeper's mark went back (restored, or its archive znode deleted) after the
                # replicas were told: the chunk passed its own check, which is all there is left.
                log.warning(
                    "partition %d: %s: above ZooKeeper's archived-through (%d), and no longer on a "
                    "quorum of the replicas (retention deleted it): taken on its own check",
                    pid,
                    where,
                    recorded,
                )
                continue
            read = self._read(plan, entry.first, entry.last)
            if held is None:
                replaced = write_chunk(self._files, pid, read.records, read.replicas)
                manifest = manifest.with_chunk_replaced(replaced)
                write_partition_manifest(self._files, manifest)
                self._say(Step.CHUNK_REPLACED, pid, replaced, "it failed its check")
            elif held != read.records:
                differs = next(a.transaction_id for a, b in zip(held, read.records, strict=True) if a != b)
                raise ArchiveCheckError(
                    where,
                    f"partition {pid}: the chunk, above ZooKeeper's archived-through ({recorded}), holds "
                    f"another record than this cluster's replicas ({', '.join(read.replicas)}) at "
                    f"transaction {differs}: another cluster archives to this location (a cluster "
                    "restored from this archive?); nothing is raised: give each cluster an archive of "
                    "its own",
                    entry.first,
                    entry.last,
                )
        self._raise(manifest)
        return manifest

    def _record(self, manifest: PartitionManifest) -> PartitionManifest:
        """Steps 3 (the manifest) and 4 (ZooKeeper, the replicas) for the manifest's last chunk."""
        write_partition_manifest(self._files, manifest)
        self._say(Step.MANIFEST_WRITTEN, manifest.partition_id, manifest.chunks[-1])
        self._raise(manifest)
        return manifest

    def _raise(self, manifest: PartitionManifest) -> None:
        pid, through = manifest.partition_id, manifest.archived_through
        record_partition(self._cluster, self.location, pid, entry_of(manifest))
        self._progress(ArchiveEvent(Step.SUMMARY_RAISED, pid, manifest.start or 0, through))
        self._tell(pid, through)

    def _tell(self, partition_id: int, archived_through: int, only: Collection[str] | None = None) -> None:
        """Tell the replicas (``only`` those; by default every one that answered this round's
        status) the archived-through, and keep which were not told, and why (a replica that did
        not answer the status is not tried: it counts as not told)."""
        replicas = self._replicas.storages_of(partition_id)
        untold = self._untold.setdefault(partition_id, {})
        for storage in replicas:
            if storage in self._unanswered:
                untold[storage] = self._unanswered[storage]
        targets = [s for s in (replicas if only is None else only) if s not in self._unanswered]
        if not targets:
            return
        outcomes = tell_replicas(
            self._cluster,
            self._claimed(),
            partition_id,
            archived_through,
            self.location,
            operator=self._operator,
            timeout=self._timeout,
            tls=self._tls,
            said=self._said,
            only=targets,
        )
        for storage in sorted(
            s for s, o in outcomes.items() if o == UNKNOWN_REQUEST and s not in self._unaware
        ):
            self._unaware.add(storage)
            log.warning(
                "storage node %s does not know the set-archived-through request: it is not told what is "
                "archived, and keeps every segment (upgrade it)",
                storage,
            )
        for storage, outcome in outcomes.items():
            if was_told(outcome):
                untold.pop(storage, None)
                self._told.setdefault(partition_id, {})[storage] = archived_through
            else:
                untold[storage] = outcome
        detail = "; ".join(f"{s}: {o}" for s, o in sorted(outcomes.items()))
        self._progress(
            ArchiveEvent(Step.REPLICAS_TOLD, partition_id, archived_through, archived_through, detail)
        )

    def _remove_temporaries(self, partition_id: int) -> None:
        """Delete the hidden files of chunk writes that a stop interrupted."""
        directory = partition_directory(partition_id)
        for name in self._files.files_in(directory):
            if name.startswith(".") and name.endswith(".tmp"):
                self._files.delete(f"{directory}/{name}")
                log.info("partition %d: removed %s, left by an interrupted write", partition_id, name)

    def _say(self, step: Step, partition_id: int, entry: ChunkEntry, detail: str = "") -> None:
        rows = f"{entry.rows} records, {entry.size_bytes / 1e6:.1f} MB"
        self._progress(
            ArchiveEvent(step, partition_id, entry.first, entry.last, f"{rows}; {detail}" if detail else rows)
        )
