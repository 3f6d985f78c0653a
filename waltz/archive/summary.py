"""The archive and its summary in ZooKeeper: claiming a location, and recording what it holds.

Source: docs/design/archive.md "The archive's layout and forms", "The archiver";
docs/design/zookeeper.md "The archive's summary". The first run of the archiver writes
``archive.json`` and creates ``<root>/archive`` naming the location; a later run to another
location is refused unless the operator says the archive moved there (``relocate``). A
partition's entry is set by compare-and-set after its manifest names a verified chunk (raised), or
by ``waltz archive verify --hold`` (lowered).
"""

from __future__ import annotations

import datetime as dt
import logging

from waltz.archive.errors import ArchiveRefusedError
from waltz.archive.layout import ARCHIVE_MANIFEST, PARTITION_MANIFEST, ArchiveFiles, partition_directory
from waltz.archive.manifests import (
    ArchiveManifest,
    PartitionManifest,
    cluster_key_fingerprint,
    read_archive_manifest,
    read_partition_manifest,
    write_archive_manifest,
)
from waltz.errors import StaleMetadataError
from waltz.metadata.values import ArchivedPartition, ArchiveSummary
from waltz.metadata.zk import ClusterZk

__all__ = ["claim_archive", "entry_of", "record_partition", "relocation_problems"]

log = logging.getLogger(__name__)

#: Attempts of a compare-and-set of the summary before giving up (each re-reads the znode).
MAX_CAS_ATTEMPTS = 20


def entry_of(manifest: PartitionManifest) -> ArchivedPartition:
    """A partition's summary entry as its manifest gives it."""
    return ArchivedPartition(manifest.archived_through, len(manifest.chunks), manifest.size_bytes)


def claim_archive(cluster: ClusterZk, files: ArchiveFiles, *, relocate: bool = False) -> ArchiveManifest:
    """Make sure the cluster archives to ``files``: check or write ``archive.json``, and create or
    check the summary's location.

    Args:
        cluster: the cluster's znodes.
        files: the archive (its ``location`` normalised, as recorded).
        relocate: the archive was moved to this location: the summary is changed to name it.

    Returns:
        The archive's manifest.

    Raises:
        ArchiveRefusedError: another location is on record (without ``relocate``); the archive
            belongs to another cluster or has another partition count; or ZooKeeper says the
            archive holds transactions but the location holds no archive.
        ArchiveFormError: ``archive.json`` is not one this code reads.
        ArchiveUnreadableError, ArchiveUnwritableError: the location refused a read or a write
            (named, with its reason).
        OSError: the location refused listing a directory.
    """
    params = cluster.params()
    fingerprint = cluster_key_fingerprint(str(params.cluster_key))
    current = cluster.archive_summary()
    recorded = None if current is None else current.value.location
    if recorded is not None and recorded != files.location and not relocate:
        raise ArchiveRefusedError(
            f"the cluster archives to {recorded} ({cluster.paths.archive}), not {files.location}: give "
            f"--to {recorded}, or --relocate if the archive was moved to {files.location}"
        )
    manifest = read_archive_manifest(files)
    if manifest is None:
        held = (
            []
            if current is None
            else [p for p, e in current.value.partitions.items() if e.archived_through >= 0]
        )
        if held:
            raise ArchiveRefusedError(
                f"{files.name(ARCHIVE_MANIFEST)} is missing, yet {cluster.paths.archive} says the archive "
                f"holds transactions of partitions {sorted(held)}: "
                + (
                    "copy the archive to the new location first"
                    if recorded != files.location
                    else "the archive was lost or moved; give its location (--relocate if it moved)"
                )
            )
        manifest = ArchiveManifest(
            params.num_partitions, (fingerprint,), dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        )
        write_archive_manifest(files, manifest)
        log.info("started the archive at %s", files.location)
    else:
        where = files.name(ARCHIVE_MANIFEST)
        if manifest.num_partitions != params.num_partitions:
            raise ArchiveRefusedError(
                f"{where}: the archive has {manifest.num_partitions} partitions, the cluster "
                f"{params.num_partitions}: it is another log's archive"
            )
        if fingerprint not in manifest.cluster_key_fingerprints:
            raise ArchiveRefusedError(
                f"{where}: the archive was written by other clusters (key fingerprints "
                f"{list(manifest.cluster_key_fingerprints)}), not this one ({fingerprint}): give this "
                "cluster's archive"
            )
    if current is None:
        try:
            cluster.set_archive_summary(ArchiveSummary(files.location), -1)
        except StaleMetadataError:
            return claim_archive(cluster, files, relocate=relocate)  # another run created it: check it
    elif recorded != files.location:
        missing = relocation_problems(files, current.value)
        if missing:
            raise ArchiveRefusedError(
                f"refusing to move the archive from {recorded} to {files.location}: the new location does "
                f"not hold what {cluster.paths.archive} says is archived ({'; '.join(missing)}); copy the "
                f"whole archive there, check the copy with `waltz archive verify --archive "
                f"{files.location}`, then run --relocate again ({cluster.paths.archive} still names "
                f"{recorded})"
            )
        cluster.set_archive_summary(ArchiveSummary(files.location, current.value.partitions), current.version)
        log.warning("the cluster's archive moved from %s to %s", recorded, files.location)
    return manifest


def relocation_problems(files: ArchiveFiles, summary: ArchiveSummary) -> list[str]:
    """What a location the archive is said to have moved to lacks of what the summary records
    (docs/design/archive.md, "The archiver": the new location must hold the archive).

    Each partition the summary says is archived must have a manifest reaching its archived-through,
    and every chunk that manifest lists must be there with the manifest's size. Reads the manifests
    and lists the partitions' directories; the chunks' contents are ``waltz archive verify``'s to
    check.

    Args:
        files: the new location.
        summary: the cluster's archive summary, naming the old location.

    Returns:
        One line per problem (a partition whose manifest falls short, a chunk missing or of
        another size), in partition order; empty when the location holds the archive.

    Raises:
        ArchiveFormError, ArchiveCheckError: a manifest is not one this code reads.
        OSError: the location refused a read.
    """
    problems: list[str] = []
    for partition_id, entry in sorted(summary.partitions.items()):
        if entry.archived_through < 0:
            continue
        directory = partition_directory(partition_id)
        manifest = read_partition_manifest(files, partition_id)
        if manifest.archived_through < entry.archived_through:
            problems.append(
                f"partition {partition_id}: {files.name(directory + '/' + PARTITION_MANIFEST)} holds "
                f"transactions through {manifest.archived_through}, not {entry.archived_through}"
            )
        sizes = files.file_sizes(directory)
        for chunk in manifest.chunks:
            size = sizes.get(chunk.file)
            if size is None:
                problems.append(f"{files.name(directory + '/' + chunk.file)} is missing")
            elif size != chunk.size_bytes:
                problems.append(
                    f"{files.name(directory + '/' + chunk.file)} has {size} bytes, its manifest says "
                    f"{chunk.size_bytes}"
                )
    return problems


def record_partition(cluster: ClusterZk, location: str, partition_id: int, entry: ArchivedPartition) -> None:
    """Set a partition's entry in the summary by compare-and-set (raised or lowered).

    Raises:
        ArchiveRefusedError: the summary is gone or names another location now.
        StaleMetadataError: the znode kept changing under the update.
    """
    for _ in range(MAX_CAS_ATTEMPTS):
        current = cluster.archive_summary()
        if current is None or current.value.location != location:
            raise ArchiveRefusedError(
                f"{cluster.paths.archive} no longer names {location} "
                f"({'missing' if current is None else current.value.location}): another archiver or an "
                "operator changed it; stopping"
            )
        try:
            cluster.set_archive_summary(current.value.with_partition(partition_id, entry), current.version)
        except StaleMetadataError:
            continue
        return
    raise StaleMetadataError(
        f"znode {cluster.paths.archive} kept changing: gave up after {MAX_CAS_ATTEMPTS} attempts"
    )
