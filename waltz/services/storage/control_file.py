"""The control file ``waltz-storage.ctl``: cluster key, partition count, partition infos, fences.

Design: docs/design/storage.md "Control file". Each partition has two partition-info structs, written
alternately and flushed (fdatasync) before the write returns; a struct whose CRC fails is ignored
and the other one is used (the partition rolls back to it); when both fail the partition does
not open. The fence section (after the partition-info body, see ``docs/format.md``) persists the highest
store session ID a partition has seen, so that a restarted node still fences an older writer.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from waltz.errors import CorruptDataError, PartitionNotAssignedError
from waltz.private_files import PRIVATE_FILE_MODE, open_private
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.records import MAX_PARTITIONS
from waltz.services.storage import format as fmt
from waltz.services.storage.fsutil import fsync_directory

__all__ = ["ControlFile", "FenceReset", "current_fence", "current_struct", "held_records_lost"]

log = logging.getLogger(__name__)


def current_struct(structs: list[fmt.PartitionInfo | None]) -> tuple[fmt.PartitionInfo, int] | None:
    """Choose the partition-info struct a node uses, from the two decoded ones (None: bad CRC).

    Session IDs only grow, and within one session the low-water mark only grows: the valid struct
    with the highest (session ID, low-water mark, local low-water mark) is the newest; struct 0
    on a tie.

    Returns:
        The struct and its slot (0 or 1), or None when both are corrupt.
    """
    valid = [(info, slot) for slot, info in enumerate(structs) if info is not None]
    if not valid:
        return None
    return max(valid, key=lambda pair: pair[0])


def current_fence(fences: list[int | None], info: fmt.PartitionInfo | None) -> tuple[int, int]:
    """Choose the effective fence from the two decoded fence slots (None: bad CRC).

    Returns:
        The fence (at least the current struct's session ID; -1 when nothing was ever fenced) and
        the slot holding the highest valid fence (1 when neither is valid, so the next write goes
        to slot 0).
    """
    valid = [(fence, slot) for slot, fence in enumerate(fences) if fence is not None]
    fence, slot = max(valid) if valid else (-1, 1)
    return max(fence, info.session_id if info is not None else -1), slot


#: What a partition whose two partition-info structs are corrupt means for its replica, as the node,
#: ``waltz disk verify`` and ``waltz disk control`` say it (docs/design/storage.md "Control file").
UNRECOVERABLE_REPLICA = "no store session can recover this replica"


def held_records_lost(max_transaction_id: int, info: fmt.PartitionInfo) -> str | None:
    """What is wrong when a replica's records end below its local low-water mark, or None.

    The local low-water mark is a transaction this replica held, flushed, when a store session set
    its low-water mark (docs/design/storage.md "Control file"), and only an operator's
    truncate-committed lowers it: records that end below it lost acknowledged, committed
    transactions (damaged or replaced files), which no torn tail of an append explains
    (docs/design/storage.md "Start-up checks and torn tails").

    Args:
        max_transaction_id: the last transaction its records hold once start-up has cut a torn
            tail (-1: none).
        info: its current partition-info struct.

    Returns:
        One sentence naming the lost range and what to do (without the partition, which the
        caller names), or None when nothing is missing.
    """
    if max_transaction_id >= info.local_low_water_mark:
        return None
    return (
        f"the records end at transaction {max_transaction_id}, below the "
        f"local low-water mark {info.local_low_water_mark} (the records it held, flushed, when store "
        f"session {info.session_id} set the low-water mark {info.low_water_mark}): committed "
        f"transactions {max_transaction_id + 1}..{info.local_low_water_mark} are lost on this replica "
        "(damaged or replaced files, or a reset start a crash interrupted); the server's recovery copies "
        "them back from the other replicas, so check the disk, and that the others hold them "
        "(waltz cluster storage max-transaction-id)"
    )


@dataclass(frozen=True, slots=True)
class FenceReset:
    """What :meth:`ControlFile.reset_fence` changed.

    Attributes:
        previous_fence: the fence before.
        fence: the fence now (the value asked for).
        previous_last_session_id: the session ID of the current partition-info struct before.
        last_session_id: and now: lowered to the new fence when it was above it (-2: both structs
            are corrupt, so there is none).
    """

    previous_fence: int
    fence: int
    previous_last_session_id: int
    last_session_id: int


@dataclass(slots=True)
class _PartitionEntry:
    info: fmt.PartitionInfo | None  # None: both structs failed their CRC
    current_struct: int  # 0 or 1: the slot holding ``info``; the next write goes to the other one
    fence: int  # the highest store session ID seen (at least info.session_id)
    current_fence_slot: int
    problem: str = ""


class ControlFile:
    """An open control file. Thread-safe: partitions update their entries from their own threads.

    Use :meth:`create` for a new storage node and :meth:`open` for an existing one.
    """

    def __init__(self, path: Path, header: fmt.ControlFileHeader, entries: list[_PartitionEntry]) -> None:
        self._path = path
        self._header = header
        self._entries = entries
        self._lock = threading.Lock()
        self._fd: int | None = os.open(path, os.O_RDWR)
        if os.fstat(self._fd).st_mode & 0o777 != PRIVATE_FILE_MODE:
            os.fchmod(self._fd, PRIVATE_FILE_MODE)  # a control file written before it was created private

    # ---- life cycle ----

    @staticmethod
    def path_in(directory: Path) -> Path:
        """Return the control file's path in a storage directory."""
        return directory / fmt.CONTROL_FILE_NAME

    @classmethod
    def create(cls, directory: Path, cluster_key: uuid.UUID, num_partitions: int) -> ControlFile:
        """Create a new control file atomically (temp file, fsync, rename, fsync directory).

        Raises:
            FileExistsError: the directory already holds a control file.
        """
        path = cls.path_in(directory)
        if path.exists():
            raise FileExistsError(f"{path} already exists")
        header = fmt.ControlFileHeader(fmt.FORMAT_VERSION, fmt.now_ms(), cluster_key, num_partitions)
        body = bytearray()
        for pid in range(num_partitions):
            struct_bytes = fmt.encode_partition_info_struct(pid, fmt.INITIAL_PARTITION_INFO)
            body += fmt.encode_partition_id(pid) + struct_bytes + struct_bytes
        for pid in range(num_partitions):
            slot = fmt.encode_fence_slot(pid, -1)
            body += slot + slot
        tmp = path.with_suffix(".ctl.tmp")
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as f:
            f.write(header.encode())
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_directory(directory)
        log.info(
            "created control file %s: cluster key fingerprint %s, %d partitions",
            path,
            cluster_key_fingerprint(cluster_key),
            num_partitions,
        )
        return cls.open(directory)

    @classmethod
    def open(cls, directory: Path) -> ControlFile:
        """Open and validate an existing control file.

        A partition whose two structs both fail their CRC is recorded as broken: the file opens,
        but :meth:`partition_info` raises for that partition.

        Raises:
            FileNotFoundError: there is no control file.
            CorruptDataError: the header is invalid or the file is shorter than its header says.
        """
        path = cls.path_in(directory)
        header, decoded = fmt.decode_control_file(path.read_bytes(), str(path))
        entries = [
            cls._entry(e.partition_id, e.stored_partition_id, list(e.structs), list(e.fences), str(path))
            for e in decoded
        ]
        return cls(path, header, entries)

    @staticmethod
    def _entry(
        pid: int,
        stored_pid: int,
        structs: list[fmt.PartitionInfo | None],
        fences: list[int | None],
        path: str,
    ) -> _PartitionEntry:
        chosen = current_struct(structs)
        fence, fence_slot = current_fence(fences, chosen[0] if chosen else None)
        if chosen is None:
            problem = (
                f"partition {pid}: both partition-info structs of the control file {path} are corrupt"
                + (f" (entry holds partition ID {stored_pid})" if stored_pid != pid else "")
                + ": its last session info, low-water mark and truncations are refused (CORRUPT_DATA), so"
                f" {UNRECOVERABLE_REPLICA}: restore the control file or recover the partition from another"
                " replica"
            )
            log.error("%s", problem)
            return _PartitionEntry(None, 1, fence, fence_slot, problem)
        info, current = chosen
        if structs[1 - current] is None:
            log.warning(
                "partition %d: partition-info struct %d of %s failed its CRC; using struct %d",
                pid,
                1 - current,
                path,
                current,
            )
        return _PartitionEntry(info, current, fence, fence_slot)

    def grow(self, num_partitions: int) -> bool:
        """Make room for ``num_partitions`` partitions, keeping every existing partition's structs
        and fence slots byte for byte: the count a split raises (docs/design/splits.md "The
        handover", step 4; the layout is unchanged, docs/design/storage.md "Control file").

        The whole file is written again for the new count, as :meth:`create` writes one (a temp
        file, fsync, rename, fsync of the directory): a crash leaves the old file or the new one,
        never a mix (a temp file a crash leaves behind is written over by the next growth). The
        new partitions start as a new node's do (no session, no fence). A running node grows by
        an admin request (:meth:`StorageNode.grow <waltz.services.storage.node.StorageNode.grow>`,
        docs/design/storage.md "Partition count"), which holds the count's rules.

        Args:
            num_partitions: the new count, at least the current one, at most
                :data:`~waltz.protocol.records.MAX_PARTITIONS`.

        Returns:
            True when the file grew, False when it holds that count already.

        Raises:
            ValueError: ``num_partitions`` is below the current count or above the maximum.
            OSError: the new file cannot be written (the old one stays in force).
        """
        with self._lock:
            before = self._header.num_partitions
            if num_partitions == before:
                return False
            if not before < num_partitions <= MAX_PARTITIONS:
                raise ValueError(
                    f"control file {self._path}: {before} partitions cannot become {num_partitions} "
                    f"(a count only grows, up to {MAX_PARTITIONS})"
                )
            if self._fd is None:
                raise ValueError(f"control file {self._path} is closed")
            old = os.pread(self._fd, fmt.control_file_size(before), 0)
            if len(old) != fmt.control_file_size(before):
                raise OSError(f"short read of {self._path}: {len(old)} bytes")
            header = fmt.ControlFileHeader(
                self._header.version, self._header.creation_time_ms, self._header.cluster_key, num_partitions
            )
            added = range(before, num_partitions)
            entries = bytearray()
            fences = bytearray()
            for pid in added:
                struct_bytes = fmt.encode_partition_info_struct(pid, fmt.INITIAL_PARTITION_INFO)
                entries += fmt.encode_partition_id(pid) + struct_bytes + struct_bytes
                slot = fmt.encode_fence_slot(pid, -1)
                fences += slot + slot
            body_end = fmt.fence_slot_offset(before, 0, 0)
            data = header.encode() + old[fmt.HEADER_SIZE : body_end] + entries + old[body_end:] + fences
            tmp = self._path.with_suffix(".ctl.tmp")
            with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)
            fsync_directory(self._path.parent)
            os.close(self._fd)
            self._fd = os.open(self._path, os.O_RDWR)
            self._header = header
            _, decoded = fmt.decode_control_file(data, str(self._path))
            self._entries.extend(
                self._entry(
                    e.partition_id, e.stored_partition_id, list(e.structs), list(e.fences), str(self._path)
                )
                for e in decoded[before:]
            )
            log.info("control file %s: grew from %d to %d partitions", self._path, before, num_partitions)
            return True

    def close(self) -> None:
        """Close the file. Idempotent."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> ControlFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- accessors ----

    @property
    def path(self) -> Path:
        """The control file's path."""
        return self._path

    @property
    def header(self) -> fmt.ControlFileHeader:
        """The control file header."""
        return self._header

    @property
    def cluster_key(self) -> uuid.UUID:
        """The cluster key the storage node belongs to."""
        return self._header.cluster_key

    @property
    def num_partitions(self) -> int:
        """The number of partitions of the cluster."""
        return self._header.num_partitions

    def _entry_for(self, partition_id: int) -> _PartitionEntry:
        if not 0 <= partition_id < len(self._entries):
            raise PartitionNotAssignedError(
                f"partition {partition_id} is out of range: the cluster has {len(self._entries)} partitions"
            )
        return self._entries[partition_id]

    def partition_info(self, partition_id: int) -> fmt.PartitionInfo:
        """Return the current partition info of a partition.

        Raises:
            CorruptDataError: both structs of the partition are corrupt.
            PartitionNotAssignedError: the partition ID is out of range.
        """
        entry = self._entry_for(partition_id)
        if entry.info is None:
            raise CorruptDataError(entry.problem, path=str(self._path), partition_id=partition_id)
        return entry.info

    def fence(self, partition_id: int) -> int:
        """Return the highest store session ID the partition has seen (-1: none)."""
        return self._entry_for(partition_id).fence

    # ---- updates ----

    def _write(self, offset: int, data: bytes) -> None:
        if self._fd is None:
            raise ValueError(f"control file {self._path} is closed")
        written = os.pwrite(self._fd, data, offset)
        if written != len(data):
            raise OSError(f"short write to {self._path}: {written} of {len(data)} bytes")
        os.fdatasync(self._fd)

    def set_partition_info(self, partition_id: int, info: fmt.PartitionInfo) -> None:
        """Write a new partition info into the struct not currently in use, and flush it.

        The fence is raised to ``info.session_id`` if it is lower.
        """
        with self._lock:
            entry = self._entry_for(partition_id)
            slot = 1 - entry.current_struct
            if entry.info is None:
                # Both structs were corrupt: rewrite the partition ID too, then both structs.
                struct_bytes = fmt.encode_partition_info_struct(partition_id, info)
                self._write(
                    fmt.partition_entry_offset(partition_id),
                    fmt.encode_partition_id(partition_id) + struct_bytes + struct_bytes,
                )
            else:
                self._write(
                    fmt.partition_info_struct_offset(partition_id, slot),
                    fmt.encode_partition_info_struct(partition_id, info),
                )
            entry.info = info
            entry.current_struct = slot
            entry.problem = ""
            entry.fence = max(entry.fence, info.session_id)

    def lower_low_water_mark(self, partition_id: int, low_water_mark: int) -> fmt.PartitionInfo:
        """Lower a partition's low-water mark (and its local low-water mark) to ``low_water_mark``,
        keeping its session ID: an operator's truncation below the committed transactions
        (docs/design/storage.md, "The committed floor").

        Both structs are rewritten, since the highest (session ID, low-water mark, local low-water
        mark) wins on load; each write is flushed before the next. A crash in between leaves
        the old struct in force: the truncation that follows has not happened yet either.

        Args:
            partition_id: the partition.
            low_water_mark: the new low-water mark, at least -1; a value at or above the current
                one changes nothing.

        Returns:
            The partition info now in force.

        Raises:
            ValueError: ``low_water_mark`` is below -1.
            CorruptDataError: both structs of the partition are corrupt.
            PartitionNotAssignedError: the partition ID is out of range.
        """
        if low_water_mark < -1:
            raise ValueError(f"partition {partition_id}: a low-water mark cannot be {low_water_mark}")
        with self._lock:
            info = self.partition_info(partition_id)
            if low_water_mark >= info.low_water_mark:
                return info
            entry = self._entry_for(partition_id)
            lowered = fmt.PartitionInfo(
                info.session_id, low_water_mark, min(info.local_low_water_mark, low_water_mark)
            )
            struct_bytes = fmt.encode_partition_info_struct(partition_id, lowered)
            for slot in (1 - entry.current_struct, entry.current_struct):
                self._write(fmt.partition_info_struct_offset(partition_id, slot), struct_bytes)
            entry.info = lowered
            return lowered

    def set_fence(self, partition_id: int, session_id: int) -> None:
        """Persist a higher fence session ID for a partition (alternate slot, flushed).

        Raises:
            ValueError: ``session_id`` is not higher than the current fence.
        """
        with self._lock:
            entry = self._entry_for(partition_id)
            if session_id <= entry.fence:
                raise ValueError(
                    f"partition {partition_id}: fence {session_id} is not above the current {entry.fence}"
                )
            slot = 1 - entry.current_fence_slot
            offset = fmt.fence_slot_offset(self._header.num_partitions, partition_id, slot)
            self._write(offset, fmt.encode_fence_slot(partition_id, session_id))
            entry.fence = session_id
            entry.current_fence_slot = slot

    def reset_fence(self, partition_id: int, session_id: int) -> FenceReset:
        """Set a partition's fence to ``session_id``, lower or higher (the operator's repair of a
        fence raised by a forged or corrupt session ID; docs/design/storage.md "Fencing by store
        session ID").

        Both fence slots are rewritten, since the highest valid slot wins on load. The effective
        fence is never below the current partition-info struct's session ID, so when that is above
        ``session_id`` both structs are rewritten too, with ``session_id`` and the same low-water
        marks. Every write is flushed before the next; a crash in between leaves the old value in
        force in the slots not yet written (the highest valid one wins), never a mix that opens
        wrong: run the command again.

        Args:
            partition_id: the partition.
            session_id: the new fence, at least -1.

        Returns:
            What changed.

        Raises:
            ValueError: ``session_id`` is below -1.
            PartitionNotAssignedError: the partition ID is out of range.
        """
        if session_id < -1:
            raise ValueError(f"partition {partition_id}: a fence cannot be {session_id} (at least -1)")
        with self._lock:
            entry = self._entry_for(partition_id)
            previous_fence = entry.fence
            info = entry.info
            previous_last = -2 if info is None else info.session_id
            if info is not None and info.session_id > session_id:
                lowered = fmt.PartitionInfo(session_id, info.low_water_mark, info.local_low_water_mark)
                struct_bytes = fmt.encode_partition_info_struct(partition_id, lowered)
                for slot in (1 - entry.current_struct, entry.current_struct):
                    self._write(fmt.partition_info_struct_offset(partition_id, slot), struct_bytes)
                entry.info = lowered
                info = lowered
            slot_bytes = fmt.encode_fence_slot(partition_id, session_id)
            for slot in (1 - entry.current_fence_slot, entry.current_fence_slot):
                self._write(
                    fmt.fence_slot_offset(self._header.num_partitions, partition_id, slot), slot_bytes
                )
            entry.fence = session_id
            return FenceReset(
                previous_fence, session_id, previous_last, -2 if info is None else info.session_id
            )
