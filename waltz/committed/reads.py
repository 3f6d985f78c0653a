"""Read a range of committed records of one partition (a Spark task's, or the archiver's), CRC-checked.

Source: docs/design/storage.md "Admin port" (record lists through the admin port), "Files on
disk" (segment files, read with :mod:`waltz.services.storage.inspect`). The ranges come
from :mod:`waltz.committed.plan`, which proved them committed; these readers only fetch, check
each record's CRC and the contiguity of transaction IDs, and fail over between replicas.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Generator, Iterator
from pathlib import Path

from waltz.committed.errors import CommittedReadError, CorruptRecordError, StorageDirectoryNotVisibleError
from waltz.committed.sources import LiveReplica, LiveSource, OfflineReplica, OfflineSource
from waltz.errors import WaltzError
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.records import Record
from waltz.protocol.storage_client import StorageAdminClient
from waltz.services.storage import format as fmt
from waltz.services.storage import inspect

__all__ = ["DEFAULT_BATCH_RECORDS", "check_visible", "read_committed", "read_directory", "read_replica"]

log = logging.getLogger(__name__)

#: Records asked for in one admin record-list request (the node also bounds the reply's bytes).
DEFAULT_BATCH_RECORDS = 5000


def _check(record: Record, partition_id: int, expected: int, where: str) -> None:
    if record.transaction_id != expected:
        raise CorruptRecordError(
            f"partition {partition_id}: {where} returned transaction {record.transaction_id} where "
            f"{expected} was expected"
        )
    if not record.checksum_ok():
        raise CorruptRecordError(
            f"partition {partition_id} transaction {expected} from {where}: data CRC mismatch"
        )


def read_committed(
    partition_id: int,
    first: int,
    last: int,
    source: LiveSource | OfflineSource,
    *,
    batch_records: int = DEFAULT_BATCH_RECORDS,
    timeout: float = 30.0,
) -> Iterator[Record]:
    """Yield the committed records ``first..last`` (inclusive) of a partition, in order.

    Args:
        partition_id: the partition.
        first: the first transaction ID (>= 0).
        last: the last transaction ID; must not exceed the plan's committed high-water mark.
        source: where the plan found the committed records.
        batch_records: records per admin request (live).
        timeout: seconds for each admin request (live).

    Raises:
        CommittedReadError: no replica could deliver a record of the range as committed.
        CorruptRecordError: a record failed its CRC, or replicas below their low-water marks disagree.
    """
    if last < first:
        return
    if isinstance(source, LiveSource):
        yield from _read_live(partition_id, first, last, source, batch_records, timeout)
    else:
        yield from _read_offline(partition_id, first, last, source)


# ---- live ----


def _read_live(
    partition_id: int, first: int, last: int, source: LiveSource, batch_records: int, timeout: float
) -> Iterator[Record]:
    candidates = [r for r in source.replicas if r.max_transaction_id >= last]
    if not candidates:
        raise CommittedReadError(
            f"partition {partition_id}: no replica of session {source.session_id} held transaction {last} "
            "when the plan was made"
        )
    # Spread the ranges of a partition over its replicas.
    start = (first // max(1, batch_records)) % len(candidates)
    ordered = candidates[start:] + candidates[:start]
    next_id = first
    failures: list[str] = []
    for replica in ordered:
        try:
            for record in _read_replica(partition_id, next_id, last, replica, source, batch_records, timeout):
                yield record
                next_id = record.transaction_id + 1
            return
        except (WaltzError, ConnectionError, OSError, TimeoutError) as exc:
            failures.append(f"{replica.admin_address}: {exc!r}")
            log.warning(
                "partition %d: reading from %s failed at %d (%r); trying the next replica",
                partition_id,
                replica.admin_address,
                next_id,
                exc,
            )
    raise CommittedReadError(
        f"partition {partition_id}: transactions {next_id}..{last} could not be read from any replica of "
        f"session {source.session_id}: {'; '.join(failures)}"
    )


def read_replica(
    partition_id: int,
    first: int,
    last: int,
    replica: LiveReplica,
    source: LiveSource,
    *,
    batch_records: int = DEFAULT_BATCH_RECORDS,
    timeout: float = 30.0,
) -> Generator[Record, None, None]:
    """Yield the records ``first..last`` of one replica of a live plan, in order, CRC-checked.

    For a reader that compares replicas record by record (the archiver); :func:`read_committed`
    reads each record from one replica and fails over. The admin stream is closed when the
    iterator ends or is closed.

    Args:
        partition_id: the partition.
        first: the first transaction ID.
        last: the last transaction ID; at most the replica's max when the plan was made.
        replica: one of ``source.replicas``.
        source: the live plan's source.
        batch_records: records per admin request.
        timeout: seconds for each admin request.

    Raises:
        CommittedReadError: the replica returned no record where one was due.
        CorruptRecordError: a record failed its CRC or came with another transaction ID.
        WaltzError, ConnectionError, OSError, TimeoutError: the replica failed or did not answer.
    """
    yield from _read_replica(partition_id, first, last, replica, source, batch_records, timeout)


def _read_replica(
    partition_id: int,
    first: int,
    last: int,
    replica: LiveReplica,
    source: LiveSource,
    batch_records: int,
    timeout: float,
) -> Iterator[Record]:
    async def connect() -> StorageAdminClient:
        # gRPC aio channels belong to the loop running when they are made: the shared one.
        client = StorageAdminClient(
            replica.admin_address, source.cluster_key, source.num_partitions, tls=source.tls, initialise=False
        )
        await asyncio.wait_for(client.open(), timeout)  # a failed open closes its own stream
        return client

    admin = run_on_shared_loop(connect())
    try:
        next_id = first
        while next_id <= last:
            batch = run_on_shared_loop(
                asyncio.wait_for(
                    admin.records(partition_id, next_id, min(batch_records, last - next_id + 1)), timeout
                )
            )
            if not batch:
                raise CommittedReadError(
                    f"partition {partition_id}: {replica.admin_address} returned no record at {next_id}"
                )
            for record in batch:
                if record.transaction_id > last:
                    break
                _check(record, partition_id, next_id, replica.admin_address)
                yield record
                next_id += 1
    finally:
        run_on_shared_loop(admin.close())


# ---- offline ----


def read_directory(storage_dir: str | Path, partition_id: int, first: int, last: int) -> Iterator[Record]:
    """Yield the valid records ``first..last`` of one replica directory, in order, CRC-checked.

    Stops early (without error) where the directory's records end or the first invalid record
    starts: what lies beyond is for a quorum of other replicas to prove.

    Raises:
        OSError: a segment file cannot be read.
    """
    paths = inspect.segment_paths(storage_dir, partition_id)
    firsts = [int(p.stem) for p in paths]
    chosen = [p for p, f in zip(paths, firsts, strict=True) if f <= first]
    start_index = paths.index(chosen[-1]) if chosen else 0
    next_id = first
    for path in paths[start_index:]:
        with inspect.SegmentFile(path) as segment:
            if segment.header.first_transaction_id > next_id:
                return
            for scanned in segment.scan(inspect.find_record_offset(segment, next_id)):
                record = scanned.record
                if record.transaction_id < next_id:
                    continue
                if record.transaction_id != next_id or record.transaction_id > last:
                    return
                yield record
                next_id += 1
        if next_id > last:
            return


def check_visible(directories: list[str]) -> None:
    """Check that the storage directories of an offline read are readable here (in a Spark task).

    The plan is made where the driver runs; the records are read where the tasks run. On a
    cluster the directories must be at the same path on every executor (a shared filesystem):
    without this check a missing directory would read as a replica holding nothing.

    Args:
        directories: the storage directories (each holding the control file).

    Raises:
        StorageDirectoryNotVisibleError: naming the first directory missing or unreadable, and
            this host (its name and ``SPARK_LOCAL_IP``).
    """
    for directory in directories:
        path = Path(directory)
        if path.is_dir() and os.access(path, os.R_OK | os.X_OK) and (path / fmt.CONTROL_FILE_NAME).is_file():
            continue
        address = os.environ.get("SPARK_LOCAL_IP")
        host = socket.gethostname() + (f" ({address})" if address else "")
        raise StorageDirectoryNotVisibleError(
            f"storage directory {directory} is not visible on host {host}, where a Spark task of the "
            "offline read runs (it was found where the read was planned): put the storage directories "
            "on a filesystem every executor mounts at the same path, or run the read with a local "
            "master (--master local[*]) on the machine that holds them"
        )


def _same(a: Record, b: Record) -> bool:
    return a.req_id == b.req_id and a.header == b.header and a.checksum == b.checksum and a.data == b.data


def _local_start(storage_dir: str | Path, partition_id: int) -> int | None:
    """The first transaction ID a replica directory holds of a partition: its first segment's
    (docs/design/archive.md, "Terms"); None when it holds no segment of the partition."""
    paths = inspect.segment_paths(storage_dir, partition_id)
    return int(paths[0].stem) if paths else None


def _require_on_disk(partition_id: int, first: int, last: int, source: OfflineSource) -> None:
    """Refuse a range whose first transaction retention deleted from the given directories, so
    that they cannot prove it: none holds it, or (majority mode) fewer than the majority do and
    none holds it below its low-water mark. Only the archive holds it then
    (docs/design/archive.md, "Reads below the local start")."""
    if first > last:
        return
    starts = {r.directory: _local_start(r.directory, partition_id) for r in source.replicas}
    holding = [r for r in source.replicas if (s := starts[r.directory]) is not None and s <= first]
    if any(first <= r.low_water_mark for r in holding):
        return  # one copy below its low-water mark proves it
    if holding and (source.quorum is None or len(holding) >= source.quorum):
        return
    later = sorted(s for s in starts.values() if s is not None and s > first)
    if not later:
        return  # not retention's doing: the read says what is missing
    held = ", ".join(f"{d} {s if s is not None else 'none'}" for d, s in starts.items())
    raise CommittedReadError(
        f"partition {partition_id}: the transactions from {first} (at least up to {min(last, later[0] - 1)}) "
        f"are in too few of the given replica directories to be proven (their local starts: {held}; "
        "retention deleted what the archive holds): give the archive that holds them (waltz rebuild "
        "--archive, the data source's archive option)"
    )


def _read_offline(partition_id: int, first: int, last: int, source: OfflineSource) -> Iterator[Record]:
    replicas: list[OfflineReplica] = list(source.replicas)
    check_visible([r.directory for r in replicas])
    _require_on_disk(partition_id, first, last, source)
    iterators = [read_directory(r.directory, partition_id, first, last) for r in replicas]
    current: list[Record | None] = [next(it, None) for it in iterators]
    top_session = max(r.session_id for r in replicas)
    for txid in range(first, last + 1):
        held = [
            (r, rec)
            for r, rec in zip(replicas, current, strict=True)
            if rec is not None and rec.transaction_id == txid
        ]
        chosen: Record | None = None
        proven_low = [rec for r, rec in held if txid <= r.low_water_mark]
        if proven_low:
            chosen = proven_low[0]
            if any(not _same(chosen, other) for other in proven_low[1:]):
                raise CorruptRecordError(
                    f"partition {partition_id} transaction {txid}: replica directories below their low-water "
                    "marks hold different records"
                )
        elif source.quorum is not None:
            for _, candidate in held:
                if sum(1 for _, other in held if _same(candidate, other)) >= source.quorum:
                    chosen = candidate
                    break
            if chosen is None:
                raise CommittedReadError(
                    f"partition {partition_id} transaction {txid}: fewer than {source.quorum} of the given "
                    f"replica directories hold identical records ({len(held)} hold one): give every replica "
                    "directory, or "
                    "an explicit high-water mark"
                )
        else:
            latest = [rec for r, rec in held if r.session_id == top_session]
            if not latest:
                raise CommittedReadError(
                    f"partition {partition_id} transaction {txid}: no directory of the latest session "
                    f"({top_session}) holds it; the given high-water mark is beyond what the directories hold"
                )
            chosen = latest[0]
            if any(not _same(chosen, other) for other in latest[1:]):
                raise CommittedReadError(
                    f"partition {partition_id} transaction {txid}: directories of session {top_session} "
                    "disagree"
                )
        _check(chosen, partition_id, txid, "the replica directories")
        yield chosen
        for i, rec in enumerate(current):
            if rec is not None and rec.transaction_id == txid:
                current[i] = next(iterators[i], None)
