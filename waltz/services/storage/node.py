"""The storage node: the control file, the assigned partitions and one I/O thread per partition.

Design: docs/design/storage.md "What a storage node does", "Admin port". The node is passive: it
never talks to ZooKeeper; servers and the admin tools drive it over gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from waltz.errors import (
    ClusterKeyMismatchError,
    ConfigurationError,
    CorruptDataError,
    PartitionNotAssignedError,
    ProtocolError,
    StorageNotInitializedError,
)
from waltz.private_files import hold_directory, open_to_others, private_directory, replaceable_by_others
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.records import MAX_PARTITIONS
from waltz.services.storage import format as fmt
from waltz.services.storage.control_file import ControlFile
from waltz.services.storage.fsutil import fsync_directory
from waltz.services.storage.retention import RetentionSettings
from waltz.services.storage.storage_partition import (
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_MAX_FENCE_JUMP,
    DEFAULT_SEGMENT_SIZE_THRESHOLD,
    StoragePartition,
)

__all__ = ["StorageNode", "accepts_count"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds since a source's last append (a store session stream's, or a partition's) within which
#: it counts as appending on the node (see :meth:`StorageNode.run`).
INLINE_QUIET_SECONDS = 0.1
#: Sources (store session streams: one per server writing here) that may append on the event loop
#: at once; when more are appending, appends run on their partitions' I/O threads
#: (``storage.inlineAppendStreams``; see :meth:`StorageNode.run` and
#: docs/decisions/0006-inline-append-streams.md).
DEFAULT_INLINE_APPEND_STREAMS = 2
#: Bytes of records above which an append runs on its partition's I/O thread, not on the event loop
#: (writing and flushing them would hold up the node's other streams for longer).
INLINE_MAX_BYTES = 1 << 20


def accepts_count(node_count: int, num_partitions: int) -> bool:
    """Whether a node holding ``node_count`` partitions takes an open (admin or store session)
    that gives ``num_partitions`` (docs/design/storage.md, "Partition count").

    An open gives the cluster's count at creation, from ZooKeeper's cluster parameters; a split
    grows a node to a whole multiple of it, so the node takes every count that divides its own:
    the count at creation and each epoch's count up to the node's. A count above the node's, or
    one that does not divide it, belongs to another cluster or to a split the node has not grown
    for.
    """
    return 0 < num_partitions <= node_count and node_count % num_partitions == 0


class StorageNode:
    """All partitions of one storage directory.

    Partition work runs on the partition's own single thread (:meth:`run`), so requests on a
    partition are applied in order and file I/O of one partition never holds up another's. An
    append may run on the event loop itself while few streams append on this node (see
    :meth:`run`). Node-wide changes (initialisation, assignment) are serialised by a lock.

    Args:
        directory: the storage directory (created if missing).
        segment_size_threshold: bytes after which a partition starts a new segment.
        checkpoint_interval: transactions between index flushes.
        inline_appends: let :meth:`run` run an append on the event loop when that is safe and
            saves the two thread switches (``storage.inlineAppends``).
        inline_append_streams: how many sources may append on the event loop at once
            (``storage.inlineAppendStreams``, at least 1).
        max_fence_jump: the largest raise of a partition's fence one request may make
            (``storage.fence.maxJump``, at least 1; docs/design/storage.md "Fencing by store
            session ID").
        retention: what the partitions may delete once archived (``storage.retention.*``;
            docs/design/archive.md, "Retention on the storage nodes"); by default nothing.

    Raises:
        ValueError: ``inline_append_streams`` or ``max_fence_jump`` is below 1.
    """

    def __init__(
        self,
        directory: Path,
        *,
        segment_size_threshold: int = DEFAULT_SEGMENT_SIZE_THRESHOLD,
        checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
        inline_appends: bool = False,
        inline_append_streams: int = DEFAULT_INLINE_APPEND_STREAMS,
        max_fence_jump: int = DEFAULT_MAX_FENCE_JUMP,
        retention: RetentionSettings | None = None,
    ) -> None:
        if inline_append_streams < 1:
            raise ValueError(f"inline_append_streams must be at least 1, not {inline_append_streams}")
        if max_fence_jump < 1:
            raise ValueError(f"max_fence_jump must be at least 1, not {max_fence_jump}")
        self.max_fence_jump = max_fence_jump
        self.retention = retention or RetentionSettings()
        """What the partitions may delete once archived (see :meth:`StoragePartition.apply_retention`)."""
        self.directory = directory
        self.inline_appends = inline_appends
        self.inline_append_streams = inline_append_streams
        self.inline_runs = 0
        """Appends that ran on the event loop (see :meth:`run`)."""
        self._outstanding: dict[int, int] = {}  # partition -> work submitted to its thread, not awaited yet
        self._last_append: dict[Hashable, float] = {}  # source -> monotonic time of its last append
        self._segment_size_threshold = segment_size_threshold
        self._checkpoint_interval = checkpoint_interval
        self._control: ControlFile | None = None
        self._partitions: dict[int, StoragePartition] = {}
        self._broken: dict[int, CorruptDataError] = {}
        self._executors: dict[int, ThreadPoolExecutor] = {}
        self._lock = threading.RLock()
        self._closed = False
        self._directory_fd: int | None = None

    # ---- life cycle ----

    def start(self) -> None:
        """Open the control file (if the node is initialised) and every assigned partition.

        A partition that fails to open is kept as broken: its requests fail with the reason.

        Raises:
            CorruptDataError: the control file header is invalid.
            ConfigurationError: the directory, an entry in it or a parent is not the node's user's
                own (another user could replace what it holds), or another storage node holds it.
        """
        private_directory(self.directory)
        replaceable = replaceable_by_others(self.directory)
        if replaceable is not None:
            raise ConfigurationError(
                f"storage directory {self.directory} is not safe to serve from: {replaceable}. "
                "Another user could have put its control file or segments there, or could "
                "replace or delete them; give it to this node's user alone (chown, chmod go-w) "
                '(docs/design/storage.md, "File modes")'
            )
        self._hold_directory()
        try:
            self._open_files()
        except BaseException:
            self._release_directory()
            raise

    def _hold_directory(self) -> None:
        """Take the directory for this node alone: an exclusive ``flock`` on it, held until
        :meth:`close` (or the process ends). A second node on the same files would be taken by
        the cluster for another replica of the same partitions (docs/design/storage.md, "File
        modes").

        Raises:
            ConfigurationError: another storage node (process or object) holds the directory.
        """
        fd = hold_directory(self.directory)
        if fd is None:
            raise ConfigurationError(
                f"storage directory {self.directory} is in use by another storage node: one "
                "directory serves one node (a second one on the same files would count as another "
                "replica of the same partitions); give this node a directory of its own, or stop "
                "the other one first"
            )
        self._directory_fd = fd

    def _release_directory(self) -> None:
        if self._directory_fd is not None:
            os.close(self._directory_fd)  # closing the descriptor releases the flock
            self._directory_fd = None

    def _open_files(self) -> None:
        if open_to_others(self.directory):
            log.warning(
                "storage directory %s may be read by other users (mode %o): its partitions' "
                "directories and the control file are private, but give it mode 700 "
                '(chmod 700 %s; docs/design/storage.md, "File modes")',
                self.directory,
                self.directory.stat().st_mode & 0o777,
                self.directory,
            )
        if ControlFile.path_in(self.directory).exists():
            self._control = ControlFile.open(self.directory)
            kept: list[Path] = []
            for partition_id in fmt.partition_directories(self.directory, kept):
                self._open_partition(partition_id)
            for child in kept:
                log.info(
                    "partition %s: unassigned from this node with its files kept in %s: not opened "
                    "(assigning it again reuses them)",
                    child.name,
                    child,
                )
            log.info(
                "storage node %s: cluster key fingerprint %s, %d partitions, %d assigned here",
                self.directory,
                cluster_key_fingerprint(self._control.cluster_key),
                self._control.num_partitions,
                len(self._partitions) + len(self._broken),
            )
        else:
            self._refuse_partition_data_without_control()
            log.info("storage node %s: not initialised yet (waiting for an admin open)", self.directory)

    def _refuse_partition_data_without_control(self) -> None:
        """Refuse a storage directory whose partition directories hold segments but which has no
        control file: the fences and the committed floor lived in the lost file only, and a fresh
        one (fence -1, low-water mark -1) would let a fenced store session truncate committed
        records (docs/design/storage.md, "Control file").

        Raises:
            ConfigurationError: a partition directory (assigned or kept unassigned) holds a
                segment or index file.
        """
        kept: list[Path] = []
        found = list(fmt.partition_directories(self.directory, kept).values()) + kept
        holding = [
            child.name
            for child in found
            if any(entry.suffix in (fmt.SEGMENT_SUFFIX, fmt.INDEX_SUFFIX) for entry in child.iterdir())
        ]
        if holding:
            raise ConfigurationError(
                f"storage directory {self.directory} holds partition data but no control file "
                f"({ControlFile.path_in(self.directory).name} is missing; segments in partition "
                f"directories {', '.join(holding)}); restore waltz-storage.ctl from a backup of "
                "this node, or move the partition directories away to start empty (the cluster's "
                "recovery then copies the partitions back from other replicas). Their fences and "
                "committed floor were kept in that file only: a new one would let a fenced store "
                'session truncate committed records (docs/design/storage.md, "Control file")'
            )

    def _open_partition(self, partition_id: int, first_transaction_id: int = 0) -> None:
        control = self._require_control()
        if partition_id >= control.num_partitions:
            log.warning(
                "ignoring partition directory %d: the cluster has %d partitions",
                partition_id,
                control.num_partitions,
            )
            return
        try:
            self._partitions[partition_id] = StoragePartition.create(
                self.directory / str(partition_id),
                partition_id,
                control,
                segment_size_threshold=self._segment_size_threshold,
                checkpoint_interval=self._checkpoint_interval,
                max_fence_jump=self.max_fence_jump,
                first_transaction_id=first_transaction_id,
            )
            self._broken.pop(partition_id, None)
        except CorruptDataError as exc:
            log.error("partition %d does not open: %s", partition_id, exc)
            self._broken[partition_id] = exc
        except OSError as exc:
            log.error("partition %d does not open: %s", partition_id, exc)
            self._broken[partition_id] = CorruptDataError(
                f"partition {partition_id} does not open: {exc}",
                path=str(self.directory / str(partition_id)),
                partition_id=partition_id,
            )

    def close(self) -> None:
        """Close every partition and the control file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for executor in self._executors.values():
                executor.shutdown(wait=True)
            for partition in self._partitions.values():
                partition.close()
            self._partitions.clear()
            if self._control is not None:
                self._control.close()
            self._release_directory()

    def __enter__(self) -> StorageNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- access ----

    @property
    def initialized(self) -> bool:
        """True when the node has a control file."""
        return self._control is not None

    def _require_control(self) -> ControlFile:
        if self._control is None:
            raise StorageNotInitializedError(
                f"storage node {self.directory} is not initialised: add it to a cluster first "
                "(an admin open with the cluster key creates its control file)"
            )
        return self._control

    @property
    def control_file(self) -> ControlFile:
        """The control file.

        Raises:
            StorageNotInitializedError: the node has no control file yet.
        """
        return self._require_control()

    def check_open(self, cluster_key: str, num_partitions: int) -> None:
        """Check an open request against the control file (docs/design/storage.md "Storage
        requests", "Partition count").

        Raises:
            StorageNotInitializedError: the node has no control file yet.
            ClusterKeyMismatchError: the cluster key differs, or the number of partitions does not
                divide the node's (:func:`accepts_count`).
        """
        control = self._require_control()
        self._check_identity(control, cluster_key, num_partitions)

    @staticmethod
    def _check_identity(control: ControlFile, cluster_key: str, num_partitions: int) -> None:
        try:
            key = uuid.UUID(cluster_key)
        except ValueError:
            raise ClusterKeyMismatchError("the cluster key of the request is not a UUID") from None
        if key != control.cluster_key:
            # The node's own key and paths stay in its log: the answer goes to whoever asked,
            # and the key is what a storage admin request is authorised with.
            log.warning(
                "refused a request for the cluster key with fingerprint %s: this storage node belongs "
                "to the cluster whose key has the fingerprint %s (%s)",
                cluster_key_fingerprint(key),
                cluster_key_fingerprint(control.cluster_key),
                control.path,
            )
            raise ClusterKeyMismatchError(
                f"the cluster key with fingerprint {cluster_key_fingerprint(key)} does not match this "
                "storage node's: the server or tool is "
                "configured for another cluster (the node's log says which)"
            )
        if not accepts_count(control.num_partitions, num_partitions):
            raise ClusterKeyMismatchError(
                f"number of partitions {num_partitions} does not match this storage node's "
                f"{control.num_partitions}: an open gives the cluster's count at creation, which "
                'divides the node\'s (docs/design/storage.md, "Partition count")'
            )

    def admin_open(self, cluster_key: str, num_partitions: int, *, initialise: bool = True) -> None:
        """Initialise the node for a cluster, or check that it belongs to it.

        The admin open of docs/design/storage.md "Admin port".

        Args:
            cluster_key: the cluster key, a UUID's text.
            num_partitions: the cluster's number of partitions.
            initialise: whether the caller may initialise a node that has no control file yet
                (with mutual TLS, only a peer with the ``admin`` role may, and only with an admin
                open that is not ``existing_only``).

        Raises:
            ClusterKeyMismatchError: the node belongs to another cluster, or ``num_partitions``
                does not divide its partition count (:func:`accepts_count`).
            StorageNotInitializedError: the node has no control file and ``initialise`` is False.
            ConfigurationError: the node has no control file but its partition directories hold
                segments (restored or left behind): a new control file would reset their fences
                and committed floor; nothing is written.
        """
        with self._lock:
            if self._control is None:
                if not initialise:
                    raise StorageNotInitializedError(
                        "this storage node is not initialised (its directory holds no control file): a "
                        "reading tool does not initialise it; waltz cluster create, or "
                        "waltz cluster storage add and assign, with the admin role, do (if the node "
                        "should hold a cluster's partitions already, check its storage.directory)"
                    )
                try:
                    key = uuid.UUID(cluster_key)
                except ValueError:
                    raise ClusterKeyMismatchError("the cluster key of the request is not a UUID") from None
                if not 0 < num_partitions <= MAX_PARTITIONS:
                    raise ClusterKeyMismatchError(
                        f"cannot initialise with {num_partitions} partitions (1..{MAX_PARTITIONS})"
                    )
                self._refuse_partition_data_without_control()
                self._control = ControlFile.create(self.directory, key, num_partitions)
                return
            self._check_identity(self._control, cluster_key, num_partitions)

    def grow(self, num_partitions: int) -> tuple[int, int]:
        """Grow the node's partition count to ``num_partitions`` (docs/design/storage.md,
        "Partition count"; a split's step 4, docs/design/splits.md "The handover").

        The control file is written again for the new count (:meth:`ControlFile.grow`: a temp
        file, fsync, rename, so a crash leaves the old file or the new one); every partition keeps
        its structs, fences and segments; the new partitions exist, unassigned. Opens then take
        any count that divides the new one (:func:`accepts_count`), the cluster's count at
        creation among them.

        Args:
            num_partitions: the new count: the node's count (nothing changes: a repeated request),
                or a whole multiple of it, at most
                :data:`~waltz.protocol.records.MAX_PARTITIONS`.

        Returns:
            The count before and the count now.

        Raises:
            StorageNotInitializedError: the node has no control file yet.
            ProtocolError: ``num_partitions`` is below the node's count (a node never shrinks),
                not a whole multiple of it, or above the maximum; nothing changed.
            OSError: the new control file could not be written (the old one stays in force).
        """
        with self._lock:
            control = self._require_control()
            before = control.num_partitions
            if num_partitions == before:
                return before, before
            if num_partitions < before:
                raise ProtocolError(
                    f"this storage node holds {before} partitions: it cannot shrink to {num_partitions} "
                    "(a node's partition count only grows)"
                )
            if num_partitions % before or num_partitions > MAX_PARTITIONS:
                raise ProtocolError(
                    f"this storage node holds {before} partitions: it grows only to a whole multiple "
                    f"of that, at most {MAX_PARTITIONS}, not to {num_partitions}"
                )
            control.grow(num_partitions)
            return before, num_partitions

    def partition(self, partition_id: int) -> StoragePartition:
        """Return an assigned, open partition.

        Raises:
            StorageNotInitializedError: the node has no control file yet.
            PartitionNotAssignedError: the partition is not assigned to this node.
            CorruptDataError: the partition is assigned but did not open.
        """
        partition = self._partitions.get(partition_id)
        if partition is not None:
            return partition
        control = self._require_control()
        broken = self._broken.get(partition_id)
        if broken is not None:
            raise broken
        raise PartitionNotAssignedError(
            f"partition {partition_id} is not assigned to this storage node"
            + (
                f" (the cluster has {control.num_partitions} partitions)"
                if partition_id >= control.num_partitions
                else ""
            )
        )

    def assigned_partitions(self) -> list[int]:
        """The IDs of the partitions assigned to this node (open or broken), sorted."""
        return sorted(set(self._partitions) | set(self._broken))

    def set_assignment(
        self,
        partition_id: int,
        assigned: bool,
        *,
        delete_files: bool = False,
        first_transaction_id: int = 0,
    ) -> None:
        """Create (assign) or remove (unassign) a partition on this node.

        Unassigning keeps the files unless ``delete_files`` is set, with an ``unassigned`` marker
        file so that a restart does not open the partition again; assigning it again removes the
        marker and reuses them (docs/design/storage.md "Admin port"). Assigning an assigned
        partition changes nothing.

        Args:
            partition_id: the partition.
            assigned: create it (True) or remove it.
            delete_files: on removal, delete its directory too.
            first_transaction_id: on creation, start its log at this transaction (a cluster
                restored from its archive: docs/design/archive.md, "Restoring a cluster from the
                archive"); 0 by default. Above 0, a partition that exists already (assigned, or
                its segment files kept) is refused, unless it is empty and starts there already.

        Raises:
            StorageNotInitializedError: the node has no control file yet.
            PartitionNotAssignedError: the partition ID is outside the cluster's range.
            ProtocolError: ``first_transaction_id`` is negative, or above 0 for a partition that
                exists.
        """
        with self._lock:
            control = self._require_control()
            if not 0 <= partition_id < control.num_partitions:
                raise PartitionNotAssignedError(
                    f"partition {partition_id} is out of range: the cluster has {control.num_partitions}"
                )
            if assigned:
                if first_transaction_id != 0:
                    self._check_new_start(partition_id, first_transaction_id)
                if partition_id not in self._partitions:
                    marker = self.directory / str(partition_id) / fmt.UNASSIGNED_MARKER
                    if marker.exists():  # its kept files are used again
                        marker.unlink()
                        fsync_directory(marker.parent)
                    self._open_partition(partition_id, first_transaction_id)
                    if partition_id in self._broken:
                        raise self._broken[partition_id]
                    log.info(
                        "partition %d assigned to this storage node%s",
                        partition_id,
                        f", its log starting at transaction {first_transaction_id}"
                        if first_transaction_id
                        else "",
                    )
                return
            partition = self._partitions.pop(partition_id, None)
            self._broken.pop(partition_id, None)
            executor = self._executors.pop(partition_id, None)
            if executor is not None:
                executor.shutdown(wait=True)
            directory = self.directory / str(partition_id)
            if partition is not None:
                if delete_files:
                    partition.delete_files()
                else:
                    partition.close()
            elif delete_files and directory.exists():
                shutil.rmtree(directory)
            if not delete_files and directory.is_dir():
                # Kept, but not opened again at the next start: it is no longer this node's.
                (directory / fmt.UNASSIGNED_MARKER).touch()
                fsync_directory(directory)
            log.info(
                "partition %d unassigned from this storage node%s",
                partition_id,
                " (files deleted)" if delete_files else "",
            )

    def _check_new_start(self, partition_id: int, first_transaction_id: int) -> None:
        """Refuse to create ``partition_id`` starting at ``first_transaction_id`` where it exists.

        Raises:
            ProtocolError: the start is negative, or the partition exists and is not an empty log
                starting there already (a repeated request is answered as the first was).
        """
        if first_transaction_id < 0:
            raise ProtocolError(
                f"partition {partition_id}: a log cannot start at transaction {first_transaction_id}"
            )
        existing = self._partitions.get(partition_id)
        if existing is not None:
            if (
                existing.local_start == first_transaction_id
                and existing.max_transaction_id < first_transaction_id
            ):
                return
            raise ProtocolError(
                f"partition {partition_id} exists on this storage node (transactions "
                f"{existing.local_start} to {existing.max_transaction_id}): it cannot be created to start "
                f"at transaction {first_transaction_id}; remove it first"
            )
        directory = self.directory / str(partition_id)
        if partition_id in self._broken or any(directory.glob("*" + fmt.SEGMENT_SUFFIX)):
            raise ProtocolError(
                f"partition {partition_id} has segment files on this storage node ({directory.name}/): "
                f"it cannot be created to start at transaction {first_transaction_id}; remove it with "
                "its files first"
            )

    # ---- execution ----

    def _executor(self, partition_id: int) -> ThreadPoolExecutor:
        executor = self._executors.get(partition_id)
        if executor is None:
            with self._lock:
                executor = self._executors.get(partition_id)
                if executor is None:
                    executor = ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix=f"partition-{partition_id}"
                    )
                    self._executors[partition_id] = executor
        return executor

    async def run(
        self,
        partition_id: int,
        work: Callable[[], T],
        *,
        append_bytes: int | None = None,
        source: Hashable | None = None,
    ) -> T:
        """Run ``work`` on the partition's I/O thread, after every earlier work on it.

        An append (``append_bytes``: the size of the records it writes and flushes) runs on the
        calling event loop instead, saving the hand-off to the I/O thread and back (two thread
        switches per batch), when all of these hold: inline appends are on; the records take at
        most :data:`INLINE_MAX_BYTES`; no work of this partition is queued or running on its
        thread (so its work stays in order); fewer than ``inline_append_streams`` other sources
        appended on this node within :data:`INLINE_QUIET_SECONDS`; and the node lock is free (an
        assignment change or a close, which take it, never overlap the append).

        ``source`` is where the append came from: the store session stream, which may carry the
        appends of many partitions (default: the partition). One stream's appends of several
        partitions run on the loop one after another, and so do those of up to
        ``inline_append_streams`` streams (one per server; 2 by default). With more streams
        appending, appends go to the I/O threads, which flush partitions in parallel. Why and
        measured: docs/decisions/0004-appends-on-the-storage-event-loop.md and
        docs/decisions/0006-inline-append-streams.md.

        Raises:
            Whatever ``work`` raises.
        """
        if append_bytes is not None:
            now = time.monotonic()
            key = partition_id if source is None else source
            self._last_append[key] = now
            if (
                self.inline_appends
                and append_bytes <= INLINE_MAX_BYTES
                and not self._outstanding.get(partition_id)
                and self._few_sources(key, now)
                and self._lock.acquire(blocking=False)
            ):
                try:
                    if not self._closed:
                        self.inline_runs += 1
                        return work()
                finally:
                    self._lock.release()
        loop = asyncio.get_running_loop()
        outstanding = self._outstanding
        outstanding[partition_id] = outstanding.get(partition_id, 0) + 1
        try:
            return await loop.run_in_executor(self._executor(partition_id), work)
        finally:
            left = outstanding[partition_id] - 1
            if left:
                outstanding[partition_id] = left
            else:
                del outstanding[partition_id]

    def _few_sources(self, source: Hashable, now: float) -> bool:
        """True when fewer than ``inline_append_streams`` other sources appended within
        :data:`INLINE_QUIET_SECONDS`."""
        last = self._last_append
        limit = self.inline_append_streams
        if len(last) <= limit:
            return True
        quiet = now - INLINE_QUIET_SECONDS
        others = 0
        for other, at in list(last.items()):
            if other != source:
                if at <= quiet:
                    del last[other]  # quiet for long enough: forget it until it appends again
                else:
                    others += 1
        return others < limit
