"""The archiver on a real local cluster: what a client wrote comes back from the archive record for
record, across chunks and partitions; a stop between any two steps archives nothing twice and
skips nothing (docs/design/archive.md, "The archiver")."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.archive.archive_helpers import append_bulk, read_log, write_with_client
from waltz.archive.archiver import ArchiveEvent, Archiver, ChunkPolicy, PartitionRound, Step
from waltz.archive.chunks import encode_chunk, write_chunk
from waltz.archive.errors import ArchiveRefusedError
from waltz.archive.layout import ArchiveFiles, chunk_name, partition_directory
from waltz.archive.manifests import (
    cluster_key_fingerprint,
    read_archive_manifest,
    read_partition_manifest,
    write_partition_manifest,
)
from waltz.archive.reader import read_archived
from waltz.archive.replicas import TOLD, tell_replicas
from waltz.local.cluster import LocalCluster
from waltz.metadata.zk import ClusterZk
from waltz.protocol.storage_client import StorageAdminClient

pytestmark = pytest.mark.timeout(600)

#: Small chunks, written at once when short: every test makes several chunks of a small log.
SMALL = ChunkPolicy(chunk_transactions=100, chunk_bytes=1 << 20, seal_after=0)


class CrashError(Exception):
    """Stands for the archiver's process dying at a step."""


def archiver(
    zk: ClusterZk, location: Path, progress: Callable[[ArchiveEvent], None] | None = None, **options: object
) -> Archiver:
    return Archiver(zk, str(location), policy=SMALL, progress=progress, **options)  # type: ignore[arg-type]


def by_partition(results: list[PartitionRound]) -> dict[int, PartitionRound]:
    return {r.partition_id: r for r in results}


def check_archive(cluster: LocalCluster, zk: ClusterZk, location: Path, partition: int, through: int) -> None:
    """The archive holds 0..through of the partition exactly once, as the log does, and ZooKeeper
    and the manifest agree; no file outside the manifest is left in the partition's directory."""
    files = ArchiveFiles.open(str(location))
    manifest = read_partition_manifest(files, partition)
    assert manifest.start == 0 and manifest.archived_through == through
    assert list(read_archived(files, partition, 0, through)) == read_log(cluster, partition, 0, through)
    summary = zk.archive_summary()
    assert summary is not None and summary.value.location == str(location)
    entry = summary.value.of(partition)
    assert (entry.archived_through, entry.chunks, entry.size_bytes) == (
        through,
        len(manifest.chunks),
        manifest.size_bytes,
    )
    directory = location / partition_directory(partition)
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [c.file for c in manifest.chunks] + ["manifest.json"]
    )


def test_a_partition_written_by_a_client_comes_back_from_the_archive(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path
) -> None:
    write_with_client(cluster, 0, 130)
    append_bulk(cluster, 0, 120)
    events: list[ArchiveEvent] = []
    results = by_partition(archiver(archive_zk, location, events.append, partitions=[0]).run())
    mark = results[0].high_water_mark
    assert mark >= 249 and results[0].error is None and results[0].waiting == 0
    assert results[0].archived_through == mark and set(results) == {0}
    check_archive(cluster, archive_zk, location, 0, mark)
    manifest = read_partition_manifest(ArchiveFiles.open(str(location)), 0)
    assert [(c.first, c.last) for c in manifest.chunks][:2] == [(0, 99), (100, 199)]
    assert all(len(c.verified_replicas) == 2 for c in manifest.chunks)  # a quorum of 3 replicas
    steps = [e.step for e in events if e.last == 99]
    assert steps[:4] == [Step.CHUNK_WRITTEN, Step.MANIFEST_WRITTEN, Step.SUMMARY_RAISED, Step.REPLICAS_TOLD]
    top = read_archive_manifest(ArchiveFiles.open(str(location)))
    assert top is not None and top.num_partitions == 2
    assert top.cluster_key_fingerprints == (cluster_key_fingerprint(cluster.cluster_key),)
    # A second run finds nothing new and changes nothing.
    again = by_partition(archiver(archive_zk, location, partitions=[0]).run())
    assert again[0].chunks_added == 0 and again[0].archived_through == mark


def test_two_partitions_are_archived_each_in_its_directory(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path
) -> None:
    append_bulk(cluster, 0, 150)
    append_bulk(cluster, 1, 230)
    results = by_partition(archiver(archive_zk, location).run())
    assert set(results) == {0, 1}
    for partition in (0, 1):
        assert results[partition].error is None
        check_archive(cluster, archive_zk, location, partition, results[partition].high_water_mark)


def test_a_short_tail_waits_for_quiet_and_full_chunks_do_not(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path
) -> None:
    append_bulk(cluster, 1, 250)
    if (cluster.wait_ready(30)[1].high_water_mark + 1) % 100 == 0:
        append_bulk(cluster, 1, 10)  # a tail shorter than a chunk
    now = [1000.0]
    patient = Archiver(
        archive_zk,
        str(location),
        policy=ChunkPolicy(chunk_transactions=100, seal_after=30),
        partitions=[1],
        clock=lambda: now[0],
    )
    (first,) = patient.run_round()
    mark = first.high_water_mark
    assert first.archived_through == (mark + 1) // 100 * 100 - 1  # every full chunk, at once
    assert first.waiting == mark - first.archived_through and first.seal_at == 1030.0
    (unchanged,) = patient.run_round()  # not quiet long enough: nothing read, nothing written
    assert unchanged.archived_through == first.archived_through and unchanged.chunks_added == 0
    now[0] += 30
    (sealed,) = patient.run_round()
    assert sealed.archived_through == mark and sealed.waiting == 0
    check_archive(cluster, archive_zk, location, 1, mark)


@pytest.mark.parametrize("step", [Step.CHUNK_WRITTEN, Step.MANIFEST_WRITTEN, Step.SUMMARY_RAISED])
def test_a_stop_between_steps_archives_nothing_twice_and_skips_nothing(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path, step: Step
) -> None:
    append_bulk(cluster, 0, 320)
    seen: list[ArchiveEvent] = []

    def crash_at_second(event: ArchiveEvent) -> None:
        seen.append(event)
        if event.step is step and sum(1 for e in seen if e.step is step) == 2:
            raise CrashError(f"stopped after {step.value} of {event.first}..{event.last}")

    with pytest.raises(CrashError) as stopped:
        archiver(archive_zk, location, crash_at_second, partitions=[0]).run()
    files = ArchiveFiles.open(str(location))
    manifest = read_partition_manifest(files, 0)
    summary = archive_zk.archive_summary()
    assert summary is not None
    recorded = summary.value.of(0).archived_through
    if step is Step.CHUNK_WRITTEN:  # the second chunk's file is there, the manifest lists the first
        assert manifest.archived_through == 99 and recorded == 99
        assert (location / partition_directory(0) / chunk_name(100, 199)).exists()
    elif step is Step.MANIFEST_WRITTEN:  # the manifest lists two chunks, ZooKeeper one
        assert manifest.archived_through == 199 and recorded == 99
    else:  # ZooKeeper raised, the replicas not told
        assert manifest.archived_through == 199 and recorded == 199
    assert "stopped after" in str(stopped.value)

    events: list[ArchiveEvent] = []
    results = by_partition(archiver(archive_zk, location, events.append, partitions=[0]).run())
    assert results[0].error is None
    check_archive(cluster, archive_zk, location, 0, results[0].high_water_mark)
    written = [(e.first, e.last) for e in events if e.step in (Step.CHUNK_WRITTEN, Step.CHUNK_ADOPTED)]
    if step is Step.CHUNK_WRITTEN:
        assert written[0] == (100, 199)
        assert next(e.step for e in events if e.first == 100) is Step.CHUNK_ADOPTED
    else:
        assert all(first >= 200 for first, _ in written)
    if step is Step.MANIFEST_WRITTEN:
        raised = [e for e in events if e.step is Step.SUMMARY_RAISED]
        assert raised[0].last == 199  # ZooKeeper caught up with the manifest before anything new


def test_an_unlisted_chunk_that_does_not_match_is_replaced(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path
) -> None:
    append_bulk(cluster, 0, 210)

    def crash(event: ArchiveEvent) -> None:
        if event.step is Step.CHUNK_WRITTEN and event.first == 100:
            raise CrashError("stopped")

    with pytest.raises(CrashError):
        archiver(archive_zk, location, crash, partitions=[0]).run()
    # The file of 100..199 is damaged before the restart; an interrupted write left a hidden file.
    directory = location / partition_directory(0)
    stale = read_log(cluster, 0, 100, 199)
    stale[3] = stale[3]._replace(header=stale[3].header + 1)
    (directory / chunk_name(100, 199)).write_bytes(encode_chunk(stale)[0])
    (directory / f".{chunk_name(200, 299)}.tmp").write_bytes(b"partial")
    events: list[ArchiveEvent] = []
    results = by_partition(archiver(archive_zk, location, events.append, partitions=[0]).run())
    assert results[0].error is None
    assert next(e.step for e in events if e.first == 100) is Step.CHUNK_REPLACED
    check_archive(cluster, archive_zk, location, 0, results[0].high_water_mark)


def test_another_location_is_refused_unless_the_archive_moved_there(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path, tmp_path: Path
) -> None:
    append_bulk(cluster, 1, 120)
    archiver(archive_zk, location, partitions=[1]).run()
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(ArchiveRefusedError, match="--relocate") as refused:
        archiver(archive_zk, elsewhere, partitions=[1]).run()
    assert f"archives to {location} ({archive_zk.paths.archive}), not {elsewhere}" in str(refused.value)
    with pytest.raises(ArchiveRefusedError, match="copy the archive to the new location first"):
        archiver(archive_zk, elsewhere, partitions=[1], relocate=True).run()
    shutil.copytree(location, elsewhere)
    append_bulk(cluster, 1, 30)
    results = by_partition(archiver(archive_zk, elsewhere, partitions=[1], relocate=True).run())
    assert results[1].error is None
    check_archive(cluster, archive_zk, elsewhere, 1, results[1].high_water_mark)


def test_a_move_to_an_incomplete_copy_is_refused_and_the_archive_stays_where_it_was(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path, tmp_path: Path
) -> None:
    """--relocate to a copy that lacks a chunk, or a partition's manifest, changes nothing: a
    reader below the replicas' local start would otherwise find nothing there."""
    append_bulk(cluster, 1, 220)
    archiver(archive_zk, location, partitions=[1]).run()
    chunks = read_partition_manifest(ArchiveFiles.open(str(location)), 1).chunks
    assert len(chunks) >= 2
    short = tmp_path / "short"
    shutil.copytree(location, short)
    (short / partition_directory(1) / chunks[0].file).unlink()
    no_manifest = tmp_path / "no-manifest"
    shutil.copytree(location, no_manifest)
    (no_manifest / partition_directory(1) / "manifest.json").unlink()
    for copy, problem in (
        (short, f"{short / partition_directory(1) / chunks[0].file} is missing"),
        (no_manifest, f"manifest.json holds transactions through -1, not {chunks[-1].last}"),
    ):
        with pytest.raises(ArchiveRefusedError, match="copy the whole archive there") as refused:
            archiver(archive_zk, copy, partitions=[1], relocate=True).run()
        assert problem in str(refused.value), refused.value
        summary = archive_zk.archive_summary()
        assert summary is not None and summary.value.location == str(location)
    whole = tmp_path / "whole"
    shutil.copytree(location, whole)
    (result,) = archiver(archive_zk, whole, partitions=[1], relocate=True).run()
    assert result.error is None
    check_archive(cluster, archive_zk, whole, 1, result.high_water_mark)


def test_zookeeper_ahead_of_the_manifest_stops_the_partition(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path
) -> None:
    append_bulk(cluster, 0, 150)
    archiver(archive_zk, location, partitions=[0]).run()
    manifest_path = location / partition_directory(0) / "manifest.json"
    manifest_path.unlink()  # the archive lost its record of partition 0
    (result,) = archiver(archive_zk, location, partitions=[0]).run()
    assert result.error is not None
    assert "ZooKeeper" in result.error and "the manifest through -1" in result.error
    assert str(manifest_path) in result.error


def test_every_replica_is_told_and_reports_it(cluster: LocalCluster, archive_zk: ClusterZk) -> None:
    """Every replica of the partition is asked, takes it, and reports it in its status (a node of an
    older release that does not know the request would be passed over, logged)."""
    outcomes = tell_replicas(archive_zk, archive_zk.params(), 0, 41, "/archive/x", operator="test")
    assert set(outcomes) == set(archive_zk.assignments().value.storages_of(0))
    assert set(outcomes.values()) == {TOLD}, outcomes
    connection = archive_zk.connection().value
    for storage in outcomes:
        assert asyncio.run(_archived_through(cluster, connection.admin_address(storage), 0)) == 41
    tell_replicas(archive_zk, archive_zk.params(), 0, -1, "/archive/x", operator="test")  # as it was


async def _archived_through(cluster: LocalCluster, admin_address: str, partition: int) -> int:
    async with StorageAdminClient(admin_address, cluster.cluster_key, cluster.num_partitions) as admin:
        (status,) = (await admin.partition_status(partition)).partitions
        return status.archived_through


def test_a_replica_left_untold_is_told_by_a_later_run_with_nothing_new_to_archive(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica down when the archive was raised is named in the round (its failure logged once,
    not once per chunk), and a later run (a new process, nothing new committed) tells it; so does
    one told another value since."""
    append_bulk(cluster, 0, 330)
    down = cluster.storages[2]
    cluster.stop_storage(2)
    caplog.set_level(logging.WARNING)
    (result,) = archiver(archive_zk, location, partitions=[0], storage_timeout=3.0).run()
    through = result.high_water_mark
    assert result.error is None and result.archived_through == through and result.chunks_added >= 4
    assert list(result.untold) == [down.address], result.untold
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and down.address in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    cluster.heal(timeout=60)
    assert asyncio.run(_archived_through(cluster, down.admin_address, 0)) != through

    (again,) = archiver(archive_zk, location, partitions=[0]).run()
    assert again.error is None and again.chunks_added == 0 and again.untold == {}
    for node in cluster.storages:
        assert asyncio.run(_archived_through(cluster, node.admin_address, 0)) == through, node.address

    # A replica told less than the archive holds (as by a tool of its own) is told again; a run
    # that finds every replica at ZooKeeper's mark tells none.
    told = tell_replicas(archive_zk, archive_zk.params(), 0, through - 50, "/elsewhere", operator="test")
    assert set(told.values()) == {TOLD}
    events: list[ArchiveEvent] = []
    archiver(archive_zk, location, events.append, partitions=[0]).run()
    assert [(e.step, e.last) for e in events] == [(Step.REPLICAS_TOLD, through)]
    for node in cluster.storages:
        assert asyncio.run(_archived_through(cluster, node.admin_address, 0)) == through, node.address
    events.clear()
    archiver(archive_zk, location, events.append, partitions=[0]).run()
    assert events == []


def test_chunks_of_another_log_above_zookeeper_s_mark_stop_the_partition(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path
) -> None:
    """A chunk the manifest lists above ZooKeeper's archived-through is checked against the
    replicas: one of another log (a cluster restored from this archive archiving to it too), or one
    past the committed high-water mark, stops the partition and raises nothing."""
    append_bulk(cluster, 0, 150)
    (result,) = archiver(archive_zk, location, partitions=[0]).run()
    through = result.archived_through
    append_bulk(cluster, 0, 100)
    files = ArchiveFiles.open(str(location))
    ours = read_partition_manifest(files, 0)
    theirs = [r._replace(header=r.header + 1) for r in read_log(cluster, 0, through + 1, through + 50)]
    written = write_chunk(files, 0, theirs, ("elsewhere:1",))
    write_partition_manifest(files, ours.with_chunk(written))
    (result,) = archiver(archive_zk, location, partitions=[0]).run()
    assert result.error is not None, result
    assert "another cluster archives to this location" in result.error
    assert f"at transaction {through + 1}" in result.error
    assert _zookeeper_through(archive_zk, 0) == through

    # Past what this cluster committed: stopped too, before any read.
    (location / partition_directory(0) / written.file).unlink()
    mark = result.high_water_mark
    beyond = read_log(cluster, 0, through + 1, mark) + [
        r._replace(transaction_id=mark + 1 + i) for i, r in enumerate(read_log(cluster, 0, 0, 9))
    ]
    written = write_chunk(files, 0, beyond, ("elsewhere:1",))
    write_partition_manifest(files, ours.with_chunk(written))
    (result,) = archiver(archive_zk, location, partitions=[0]).run()
    assert result.error is not None
    assert f"past the committed high-water mark this run proved ({mark})" in result.error
    assert _zookeeper_through(archive_zk, 0) == through

    # The archive put back as this cluster left it: the next run goes on.
    (location / partition_directory(0) / written.file).unlink()
    write_partition_manifest(files, ours)
    (result,) = archiver(archive_zk, location, partitions=[0]).run()
    assert result.error is None
    check_archive(cluster, archive_zk, location, 0, result.high_water_mark)


def test_a_replica_told_more_than_zookeeper_is_lowered_even_when_its_partition_stops(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path
) -> None:
    """A replica told more than ZooKeeper's archived-through (as after a verify --hold that could
    not tell it) could delete what the archive cannot give back: each round lowers it before any
    partition's work, so a partition that then stops (here: its manifest lost) does not keep it."""
    append_bulk(cluster, 0, 120)
    (result,) = archiver(archive_zk, location, partitions=[0]).run()
    through = result.archived_through
    told = tell_replicas(archive_zk, archive_zk.params(), 0, through + 1000, "/elsewhere", operator="test")
    assert set(told.values()) == {TOLD}
    (location / partition_directory(0) / "manifest.json").unlink()
    (result,) = archiver(archive_zk, location, partitions=[0]).run()
    assert result.error is not None and "the manifest through -1" in result.error
    for node in cluster.storages:
        assert asyncio.run(_archived_through(cluster, node.admin_address, 0)) == through, node.address


def _zookeeper_through(zk: ClusterZk, partition: int) -> int:
    summary = zk.archive_summary()
    assert summary is not None
    return summary.value.of(partition).archived_through


def test_fewer_than_a_quorum_of_replicas_stops_the_partition_until_they_are_back(
    cluster: LocalCluster, archive_zk: ClusterZk, location: Path
) -> None:
    append_bulk(cluster, 1, 120)
    for index in (1, 2):
        cluster.stop_storage(index)
    (result,) = archiver(archive_zk, location, partitions=[1], storage_timeout=3.0).run()
    assert result.error is not None and result.archived_through == -1
    cluster.heal(timeout=60)
    (result,) = archiver(archive_zk, location, partitions=[1]).run()
    assert result.error is None
    check_archive(cluster, archive_zk, location, 1, result.high_water_mark)


def test_appends_right_after_storage_nodes_restart_all_commit(
    cluster: LocalCluster, archive_zk: ClusterZk
) -> None:
    """Two storage nodes stopped and healed: the server's store sessions ended when the streams to
    them failed, so the first appends after the heal go to a new session and commit, both through
    the admin append, which sends nothing again, and through a client (docs/design/server.md
    "Store sessions")."""
    append_bulk(cluster, 1, 20)
    for index in (1, 2):
        cluster.stop_storage(index)
    cluster.heal(timeout=60)
    append_bulk(cluster, 0, 20)
    append_bulk(cluster, 1, 20)
    assert len(write_with_client(cluster, 0, 20)) == 20
