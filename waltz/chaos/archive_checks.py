"""The checks a ``waltz chaos --archive`` run adds (docs/chaos.md "Archiving under faults").

- :func:`check_archive_verified`: ``waltz archive verify`` passes (every chunk against its
  manifest, the manifests against ZooKeeper);
- :func:`check_chunks_once`: each partition's chunks are contiguous from transaction 0, and its
  directory holds exactly the chunk files its manifest lists: no range archived twice;
- :func:`local_ranges`: with every node stopped, each replica's records as its storage directory
  holds them, from its local start (retention deletes what is archived);
- :func:`check_local_ranges`: nothing lost (every replica's local start at most the
  archived-through + 1, and every replica holding its records up to the high-water mark) and the
  replicas byte-identical over their common local range;
- :func:`check_online_local_ranges`: the same through the storage nodes' admin ports;
- :func:`compare_local_ranges`: a clean restart changed no record a replica kept, and removed only
  archived ones.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from waltz.archive.layout import ArchiveFiles, parse_chunk_name, partition_directory
from waltz.archive.manifests import read_partition_manifest
from waltz.chaos.checks import ChaosCheck
from waltz.errors import RecordsArchivedError
from waltz.local.cluster import LocalCluster
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.storage_client import StorageAdminClient
from waltz.services.storage import format as fmt
from waltz.services.storage.inspect.reader import SegmentFile, StopKind

__all__ = [
    "LocalRange",
    "check_archive_verified",
    "check_chunks_once",
    "check_local_ranges",
    "check_online_local_ranges",
    "compare_local_ranges",
    "local_ranges",
]


@dataclass(frozen=True, slots=True)
class LocalRange:
    """One replica of one partition from its local start, as its storage directory holds it.

    Attributes:
        local_start: the first transaction of its first segment.
        record_crcs: the CRC-32 of each record's bytes, from the local start on, in order.
        problems: a scan that did not end cleanly, or transaction IDs out of order, with where.
    """

    local_start: int
    record_crcs: tuple[int, ...]
    problems: tuple[str, ...]

    @property
    def last(self) -> int:
        """The last transaction the replica holds (``local_start - 1``: none)."""
        return self.local_start + len(self.record_crcs) - 1

    def crcs_from(self, first: int) -> tuple[int, ...]:
        """The record CRCs from transaction ``first`` on."""
        return self.record_crcs[max(0, first - self.local_start) :]


def check_archive_verified(cluster: LocalCluster, location: Path, timeout: float = 300.0) -> ChaosCheck:
    """Run ``waltz archive verify --json`` on the archive; it must exit 0 and report no problem."""
    command = [
        sys.executable, "-m", "waltz", "archive", "verify", "--archive", str(location), "--json",
        "--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root,
    ]  # fmt: skip
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **cluster.admin_env()},
        check=False,
    )
    name = "waltz archive verify passes (every chunk against its manifest, the manifests against ZooKeeper)"
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        return ChaosCheck(name, False, f"exit {done.returncode}: {(done.stdout + done.stderr)[-500:]}")
    partitions = report.get("partitions", [])
    chunks = sum(int(p.get("chunks_checked", 0)) for p in partitions)
    records = sum(int(p.get("records_checked", 0)) for p in partitions)
    problems = [q["message"] for p in partitions for q in p.get("problems", [])] + [
        q["message"] for q in report.get("problems", [])
    ]
    passed = done.returncode == 0 and bool(report.get("passed")) and not problems
    detail = f"{chunks} chunks, {records} records checked" + (
        ""
        if passed
        else f"; exit {done.returncode}; {problems[:3]}; its standard error ends: {done.stderr[-800:]!r}"
    )
    return ChaosCheck(name, passed, detail)


def check_chunks_once(location: Path, num_partitions: int) -> tuple[ChaosCheck, dict[int, int]]:
    """Each partition's chunks contiguous from 0, and exactly the files its manifest lists.

    Returns:
        The check, and each partition's archived-through by its manifest (-1: nothing).
    """
    files = ArchiveFiles.open(str(location))
    wrong: list[str] = []
    through: dict[int, int] = {}
    chunks = 0
    for pid in range(num_partitions):
        manifest = read_partition_manifest(files, pid)
        through[pid] = manifest.archived_through
        expected = 0
        for entry in manifest.chunks:
            if entry.first != expected:
                wrong.append(f"partition {pid}: chunk {entry.first}..{entry.last} after {expected - 1}")
            expected = entry.last + 1
        chunks += len(manifest.chunks)
        listed = {entry.file for entry in manifest.chunks}
        directory = location / partition_directory(pid)
        on_disk = {p.name for p in directory.glob("*.parquet")} if directory.is_dir() else set()
        extra = sorted(on_disk - listed)
        missing = sorted(listed - on_disk)
        if extra:
            wrong.append(f"partition {pid}: chunk files no manifest entry lists: {extra[:3]}")
        if missing:
            wrong.append(f"partition {pid}: manifest entries without their file: {missing[:3]}")
        ranges = sorted(r for r in (parse_chunk_name(n) for n in on_disk) if r is not None)
        overlapping = [(a, b) for a, b in itertools.pairwise(ranges) if b[0] <= a[1]]
        if overlapping:
            wrong.append(f"partition {pid}: chunk files overlap: {overlapping[:3]}")
    marks = ", ".join(f"p{pid} {mark}" for pid, mark in sorted(through.items()))
    return (
        ChaosCheck(
            "the archive's chunks are contiguous from 0, each range archived once",
            not wrong,
            f"{chunks} chunks; archived through {marks}" if not wrong else "; ".join(wrong[:5]),
        ),
        through,
    )


def local_ranges(storage_dirs: Mapping[str, Path]) -> dict[int, dict[str, LocalRange]]:
    """Each replica's records from its local start, read from stopped storage nodes' directories.

    Args:
        storage_dirs: storage node name -> its storage directory (the node must not run).

    Returns:
        partition -> storage node name -> its replica's local range.

    Raises:
        OSError: a file cannot be read.
        CorruptDataError: a segment header is unreadable.
    """
    result: dict[int, dict[str, LocalRange]] = {}
    for name, storage_dir in sorted(storage_dirs.items()):
        for child in sorted(storage_dir.iterdir()):
            if child.is_dir() and child.name.isdigit() and str(int(child.name)) == child.name:
                result.setdefault(int(child.name), {})[name] = _local_range(child)
    return result


def _local_range(directory: Path) -> LocalRange:
    crcs: list[int] = []
    problems: list[str] = []
    start: int | None = None
    for path in sorted(directory.glob("*" + fmt.SEGMENT_SUFFIX)):
        with SegmentFile(path) as segment:
            first = segment.header.first_transaction_id
            if start is None:
                start = first
            elif first != start + len(crcs):
                problems.append(f"{path.name}: starts at {first}, expected {start + len(crcs)}")
            scan = segment.scan()
            for scanned in scan:
                crcs.append(zlib.crc32(segment.pread(scanned.size, scanned.offset)))
            stop = scan.stop
            if stop is not None and stop.kind is not StopKind.END:
                problems.append(f"{path.name}: {stop.kind.value} at byte {stop.offset} ({stop.reason})")
    return LocalRange(start if start is not None else 0, tuple(crcs), tuple(problems))


def check_local_ranges(
    ranges: Mapping[int, Mapping[str, LocalRange]],
    marks: Mapping[int, int],
    archived_through: Mapping[int, int],
    replicas: int,
) -> list[ChaosCheck]:
    """Nothing lost between the archive and the replicas; replicas identical over their common range.

    Args:
        ranges: from :func:`local_ranges`.
        marks: partition -> its high-water mark (each replica must hold records up to it, no more).
        archived_through: partition -> its archived-through (each replica's local start must be
            at most one above it: the archive holds what the replica deleted).
        replicas: replicas per partition.
    """
    lost: list[str] = []
    differ: list[str] = []
    starts: list[str] = []
    compared = 0
    for pid, mark in sorted(marks.items()):
        held = ranges.get(pid, {})
        if len(held) != replicas:
            lost.append(f"partition {pid}: {len(held)} replicas on disk, expected {replicas}")
        archived = archived_through.get(pid, -1)
        for name, replica in sorted(held.items()):
            if replica.local_start > archived + 1:
                lost.append(
                    f"partition {pid} on {name}: local start {replica.local_start}, archived only "
                    f"through {archived}: transactions {archived + 1}..{replica.local_start - 1} lost"
                )
            if replica.last != mark:
                lost.append(f"partition {pid} on {name}: holds up to {replica.last}, the mark is {mark}")
            differ += [f"partition {pid} on {name}: {p}" for p in replica.problems]
        if not held:
            continue
        common = max(r.local_start for r in held.values())
        starts.append(f"p{pid} {'/'.join(str(r.local_start) for _, r in sorted(held.items()))}")
        tails = {name: r.crcs_from(common) for name, r in held.items()}
        compared += len(next(iter(tails.values())))
        if len(set(tails.values())) > 1:
            differ.append(
                f"partition {pid}: replicas differ from {common}: "
                + ", ".join(
                    f"{name} {len(t)} records crc {zlib.crc32(repr(t).encode()):08x}"
                    for name, t in sorted(tails.items())
                )
            )
    return [
        ChaosCheck(
            "every committed record is in the archive or on every replica (nothing lost)",
            not lost,
            f"local starts {'; '.join(starts)}" if not lost else "; ".join(lost[:5]),
        ),
        ChaosCheck(
            "replicas byte-identical on disk over their common local range (CRC-32 of every record)",
            not differ,
            f"{compared} records per replica compared" if not differ else "; ".join(differ[:5]),
        ),
    ]


def compare_local_ranges(
    before: Mapping[int, Mapping[str, LocalRange]],
    after: Mapping[int, Mapping[str, LocalRange]],
    archived_through: Mapping[int, int],
) -> ChaosCheck:
    """After a clean restart every replica still holds every record it held up to its last, every
    record it kept is unchanged, and it removed only archived ones at its start (docs/chaos.md
    "Archiving under faults").

    Args:
        before: :func:`local_ranges` before the restart.
        after: :func:`local_ranges` after it.
        archived_through: partition -> its archived-through (retention may remove records up to it).
    """
    wrong: list[str] = []
    for pid, held in sorted(before.items()):
        for name, old in sorted(held.items()):
            new = after.get(pid, {}).get(name)
            if new is None:
                wrong.append(f"partition {pid} on {name}: gone after the restart")
                continue
            if new.last < old.last:
                wrong.append(
                    f"partition {pid} on {name}: holds up to {new.last}, held up to {old.last} before the "
                    f"restart: records {max(new.last + 1, new.local_start)}..{old.last} lost"
                )
            wrong += [f"partition {pid} on {name}: {p}" for p in new.problems]
            if new.local_start > old.local_start and new.local_start - 1 > archived_through.get(pid, -1):
                wrong.append(
                    f"partition {pid} on {name}: local start {old.local_start} -> {new.local_start}, "
                    f"archived through {archived_through.get(pid, -1)}"
                )
            first, last = max(old.local_start, new.local_start), min(old.last, new.last)
            if old.crcs_from(first)[: last - first + 1] != new.crcs_from(first)[: last - first + 1]:
                wrong.append(
                    f"partition {pid} on {name}: a record of {first}..{last} changed across the restart"
                )
    return ChaosCheck(
        "after the restart, every replica holds what it held, unchanged (only archived ones removed)",
        not wrong,
        "same records" if not wrong else "; ".join(wrong[:5]),
    )


def check_online_local_ranges(
    cluster: LocalCluster, marks: Mapping[int, int], attempts: int = 3
) -> ChaosCheck:
    """Every replica serves the same records over the replicas' common local range (admin ports).

    The common range starts at the highest local start of the partition's replicas; a replica
    whose retention moves it further while it is read is read again (at most ``attempts`` times).
    """
    name = "every replica serves the same records over the common local range (admin port)"
    problem = ""
    for _ in range(attempts):
        try:
            starts = run_on_shared_loop(_local_starts(cluster))
            firsts = {pid: max(starts[pid].values()) for pid in marks}
            digests = cluster.replica_digests(marks, timeout=120.0, first_ids=firsts)
        except RecordsArchivedError as exc:
            problem = str(exc)
            continue
        differing = {pid: len(d) for pid, d in digests.items() if len(d) != 1}
        spans = ", ".join(f"p{pid} {firsts[pid]}..{mark}" for pid, mark in sorted(marks.items()))
        return ChaosCheck(name, not differing, spans if not differing else f"differing: {differing}")
    return ChaosCheck(name, False, f"retention kept moving the local starts: {problem}")


async def _local_starts(cluster: LocalCluster) -> dict[int, dict[str, int]]:
    starts: dict[int, dict[str, int]] = {}
    for index, node in enumerate(cluster.storages):
        async with StorageAdminClient(
            node.admin_address, str(cluster.cluster_key), cluster.num_partitions, tls=cluster.admin_tls
        ) as admin:
            for found in (await admin.partition_status(-1)).partitions:
                starts.setdefault(found.partition_id, {})[f"storage-{index}"] = found.local_start
    return starts
