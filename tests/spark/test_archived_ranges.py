"""The ``waltz`` data source reads archived ranges from the archive's chunks, so the log read and
a rebuild after retention deleted the storage nodes' first segments equal the log and the database
before
(docs/design/archive.md, "Reads below the local start"; docs/design/spark.md, "Archived ranges").

A real local cluster (ZooKeeper, one server, three storage nodes rolling small segments and
deleting archived ones at once), written by the counter example, archived by the archiver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import support
from sqlalchemy import select
from typer.testing import CliRunner

from waltz.archive.archiver import Archiver, ChunkPolicy, PartitionRound
from waltz.archive.errors import ArchiveCheckError
from waltz.archive.layout import parse_chunk_name, partition_directory
from waltz.cli.main import app as waltz_app
from waltz.committed import reads
from waltz.committed.errors import CommittedReadError
from waltz.committed.sources import OfflineReplica, OfflineSource
from waltz.errors import ConfigurationError
from waltz.jdbc_style import create_framework_engine
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import connect_zookeeper
from waltz.protocol.storage_client import StorageAdminClient
from waltz.spark.archived import ArchivedRange
from waltz.spark.errors import RebuildError
from waltz.spark.rebuild import LogSource, rebuild
from waltz.spark.source import LogRange, WaltzLogReader
from waltz_examples.counter.service import CounterService
from waltz_examples.counter.views import VIEWS as COUNTER_VIEWS

pytestmark = pytest.mark.timeout(600)

#: Storage settings that roll a segment every few kilobytes and delete archived segments at once.
RETENTION_ENV = {
    "WALTZ_STORAGE_SEGMENT_SIZE_THRESHOLD": "4096",
    "WALTZ_STORAGE_RETENTION_POLICY": "archived",
    "WALTZ_STORAGE_RETENTION_KEEP_SECONDS": "0",
    "WALTZ_STORAGE_RETENTION_CHECK_INTERVAL": "0.2",
}
CHUNKS = ChunkPolicy(chunk_transactions=40, chunk_bytes=1 << 20, seal_after=0)
OPERATIONS = 100


@dataclass
class Before:
    """The log and the rebuilt table as they were read before retention."""

    cluster: LocalCluster
    live_url: str
    location: Path
    log_rows: list[tuple[Any, ...]]
    marks: dict[int, int]


def _source(cluster: LocalCluster) -> LogSource:
    return LogSource.live(cluster.admin_settings())


def _log_rows(spark: Any, cluster: LocalCluster, **options: str) -> list[tuple[Any, ...]]:
    reader = spark.read.format("waltz").options(**_source(cluster).options())
    for name, value in options.items():
        reader = reader.option(name, value)
    return sorted(tuple(r) for r in reader.load().collect())


def _table_rows(url: str) -> list[tuple[Any, ...]]:
    engine = create_framework_engine(url)
    try:
        with engine.connect() as conn:
            table = COUNTER_VIEWS.tables[0]
            return sorted(tuple(r) for r in conn.execute(select(*table.columns)))
    finally:
        engine.dispose()


def _archive(cluster: LocalCluster, location: Path) -> PartitionRound:
    """One run of the archiver over the cluster's one partition."""
    zk_client = connect_zookeeper(cluster.zookeeper_connect_string, security=cluster.zookeeper_security)
    try:
        (result,) = Archiver(ClusterZk(zk_client, cluster.root), str(location), policy=CHUNKS).run()
    finally:
        zk_client.stop()
        zk_client.close()
    return result


def _local_starts(cluster: LocalCluster) -> list[int]:
    async def run() -> list[int]:
        starts = []
        for node in cluster.storages:
            async with StorageAdminClient(node.admin_address, cluster.cluster_key, 1) as admin:
                (found,) = (await admin.partition_status(0)).partitions
                starts.append(found.local_start)
        return starts

    return asyncio.run(run())


@pytest.fixture(scope="module")
def before(spark: Any, tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[Before]:
    work = tmp_path_factory.mktemp("spark-archived")
    with LocalCluster(
        security=support.PLAINTEXT,  # the archiver and raw admin reads of the protocol tests
        storages=3,
        servers=1,
        partitions=1,
        name="spark-archived",
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=work / "cluster",
        delete_root=True,
        processes=ProcessOptions(storage_env=RETENTION_ENV),
    ) as cluster:
        cluster.wait_ready(60)
        live_url = f"sqlite:///{work / 'counter.db'}"
        zookeeper, root, settings = support.client_parts(cluster)
        with CounterService(live_url, zookeeper, root, client_config=settings) as service:
            for i in range(OPERATIONS):
                service.increment(i % 7, 1 + i)
        log_rows = _log_rows(spark, cluster)
        assert len(log_rows) >= OPERATIONS
        marks = {0: max(row[1] for row in log_rows)}
        yield Before(cluster, live_url, work / "archive", log_rows, marks)


@pytest.fixture(scope="module")
def after(before: Before) -> Before:
    """``before``'s cluster once archived and its replicas' archived segments deleted."""
    cluster = before.cluster
    result = _archive(cluster, before.location)
    assert result.error is None and result.archived_through == before.marks[0], result
    deadline = time.monotonic() + 30
    while min(_local_starts(cluster)) < 40:
        assert time.monotonic() < deadline, (
            f"retention did not delete archived segments: {_local_starts(cluster)}"
        )
        time.sleep(0.1)
    return before


def test_the_log_read_after_retention_equals_the_log_read_before(spark: Any, after: Before) -> None:
    cluster = after.cluster
    assert min(_local_starts(cluster)) > 0
    reader = WaltzLogReader(_source(cluster).options())
    planned = list(reader.partitions())
    archived = [r for r in planned if isinstance(r, ArchivedRange)]
    assert archived and archived[0].first == 0, planned
    assert [(r.first, r.last) for r in archived] == [(c.first, c.last) for c in (r.chunk for r in archived)]
    tail = [r for r in planned if isinstance(r, LogRange)]
    assert all(r.first > archived[-1].last for r in tail)
    assert _log_rows(spark, cluster) == after.log_rows
    # The storage nodes alone no longer hold the start of the log.
    with pytest.raises(Exception, match="below the local start"):
        _log_rows(spark, cluster, archive="off")


def test_a_rebuild_after_retention_equals_the_live_database(
    spark: Any, after: Before, tmp_path: Path
) -> None:
    """The counter's live database applied the whole log as it was written: the rebuild from the
    archive and the storage nodes gives the same table."""
    url = f"sqlite:///{tmp_path / 'after.db'}"
    result = rebuild(spark, COUNTER_VIEWS, _source(after.cluster), url, up_to=after.marks)
    assert dict(result.marks) == after.marks
    rows = _table_rows(url)
    assert len(rows) == 7 and rows == _table_rows(after.live_url)


def test_a_damaged_chunk_fails_the_read_naming_the_file_and_range(after: Before) -> None:
    reader = WaltzLogReader(_source(after.cluster).options())
    archived = next(r for r in reader.partitions() if isinstance(r, ArchivedRange))
    chunk = after.location / partition_directory(0) / archived.chunk.file
    original = chunk.read_bytes()
    chunk.write_bytes(original[: len(original) // 2])
    try:
        with pytest.raises(
            ArchiveCheckError, match=rf"{archived.chunk.file} \(transactions 0\.\.39\).*truncated"
        ):
            list(reader.read(archived))
    finally:
        chunk.write_bytes(original)
    assert sum(b.num_rows for b in reader.read(archived)) == archived.last - archived.first + 1


def test_an_offline_rebuild_reads_what_retention_deleted_from_the_archive_it_is_given(
    spark: Any, after: Before, tmp_path: Path
) -> None:
    """The storage directories alone no longer hold the log's start: without the archive the
    read names what is missing and where it is; with it the rebuild equals the live database."""
    offline = LogSource(storage_dirs=[str(node.directory) for node in after.cluster.storages], replicas=3)
    missing = r"transactions from 0 \(at least up to \d+\) are in too few of the given"
    with pytest.raises(Exception, match=missing):
        rebuild(spark, COUNTER_VIEWS, offline, f"sqlite:///{tmp_path / 'without.db'}", up_to=after.marks)
    url = f"sqlite:///{tmp_path / 'offline.db'}"
    with_archive = dataclasses.replace(offline, archive=str(after.location))
    assert with_archive.options()["archive"] == str(after.location)
    result = rebuild(spark, COUNTER_VIEWS, with_archive, url, up_to=after.marks)
    assert dict(result.marks) == after.marks
    assert _table_rows(url) == _table_rows(after.live_url)


def test_a_location_that_holds_no_archive_is_refused_while_planning(after: Before, tmp_path: Path) -> None:
    """A mistyped --archive stops the rebuild before Spark starts, naming the location; not in a
    Spark task asking for the archive it was given (docs/design/spark.md, "Planning before Spark
    starts")."""
    typo = tmp_path / "archve"
    offline = LogSource(storage_dirs=[str(node.directory) for node in after.cluster.storages], replicas=3)
    for source in (
        dataclasses.replace(offline, archive=str(typo)),
        dataclasses.replace(_source(after.cluster), archive=str(typo)),
    ):
        with pytest.raises(RebuildError, match=rf"--archive {re.escape(str(typo))} holds no archive"):
            source.planned()
    assert dataclasses.replace(offline, archive=str(after.location)).planned().plans


def test_an_archive_of_another_cluster_is_refused_while_planning(after: Before, tmp_path: Path) -> None:
    """An archive whose ``archive.json`` does not list this cluster's key, or has another
    partition count, is another log's: a rebuild given it would read that log's chunks as this
    one's. Refused before Spark starts, naming both fingerprints (both counts), offline, live and
    through the data source's ``archive`` option, as the archiver refuses to write to it."""
    from waltz.archive.layout import ArchiveFiles
    from waltz.archive.manifests import read_archive_manifest, write_archive_manifest
    from waltz.protocol.cluster_key import cluster_key_fingerprint

    other = tmp_path / "other-archive"
    shutil.copytree(after.location, other)
    files = ArchiveFiles.open(str(other))
    ours = read_archive_manifest(files)
    assert ours is not None
    (fingerprint,) = ours.cluster_key_fingerprints
    foreign = cluster_key_fingerprint(str(uuid.uuid4()))
    offline = LogSource(storage_dirs=[str(node.directory) for node in after.cluster.storages], replicas=3)
    sources = [dataclasses.replace(s, archive=str(other)) for s in (offline, _source(after.cluster))]
    write_archive_manifest(files, dataclasses.replace(ours, cluster_key_fingerprints=(foreign,)))
    for source in sources:
        with pytest.raises(
            RebuildError, match=rf"--archive {re.escape(str(other))} is another cluster's"
        ) as refused:
            source.planned()
        assert foreign in str(refused.value) and fingerprint in str(refused.value), refused.value
    with pytest.raises(ConfigurationError, match=rf"archive={re.escape(str(other))} is another cluster's"):
        WaltzLogReader({**_source(after.cluster).options(), "archive": str(other)}).partitions()
    write_archive_manifest(files, dataclasses.replace(ours, num_partitions=2))
    for source in sources:
        with pytest.raises(
            RebuildError, match=r"holds an archive of 2 partitions, and the log's cluster has 1"
        ):
            source.planned()
    # A restored cluster's key is listed beside the first one's: its archive.
    write_archive_manifest(files, dataclasses.replace(ours, cluster_key_fingerprints=(foreign, fingerprint)))
    assert all(source.planned().plans for source in sources)


def test_hold_says_when_retention_deleted_a_damaged_chunk_s_range_from_every_replica(
    after: Before, tmp_path: Path
) -> None:
    """A chunk damaged after retention deleted its range: the next archive run cannot write it
    again, and ``verify --hold`` says so from the replicas' local starts (it runs last: the hold
    lowers the module cluster's archived-through, which the archiver then raises again)."""
    cluster = after.cluster
    chunk = sorted((after.location / partition_directory(0)).glob("*.parquet"))[0]
    original = chunk.read_bytes()
    chunk.write_bytes(original[: len(original) // 2])
    where = ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    try:
        held = CliRunner().invoke(waltz_app, ["archive", "verify", "--hold", *where])
        assert held.exit_code == 1, held.output
        assert "held: partition 0 is archived through -1" in held.output, held.output
        # The damaged chunk's own range, then what retention deleted (which the next chunks of the
        # archive, intact, also cover).
        first, last = parse_chunk_name(chunk.name)
        deleted = re.search(
            rf"NOT IN THE REPLICAS: partition 0 transactions {first}\.\.{last} are damaged in the archive, "
            r"and retention deleted 0\.\.(\d+) from every replica",
            held.output,
        )
        assert deleted is not None, held.output
        assert int(deleted.group(1)) >= last
        assert "copy the damaged chunks back from a copy of the archive" in held.output
        report = json.loads(CliRunner().invoke(waltz_app, ["archive", "verify", "--json", *where]).stdout)
        assert report["partitions"][0]["lost_from_replicas"] is False  # only --hold reads the replicas
    finally:
        chunk.write_bytes(original)
        result = _archive(cluster, after.location)
    assert result.error is None and result.archived_through == after.marks[0], result


def test_a_rebuild_that_meets_a_damaged_chunk_names_it_in_one_line(after: Before, tmp_path: Path) -> None:
    """A chunk that fails its check in a Spark task: the rebuild stops, writing nothing, with the
    task's error (the file, its range, what is wrong) as its one error line, not the worker's
    traceback."""
    cluster = after.cluster
    copy = tmp_path / "archive-copy"
    shutil.copytree(after.location, copy)
    chunk = sorted((copy / partition_directory(0)).glob("*.parquet"))[0]
    chunk.write_bytes(chunk.read_bytes()[:100])
    database = tmp_path / "rebuilt.db"
    outcome = CliRunner().invoke(
        waltz_app,
        [
            "rebuild", "--app", "waltz_examples.counter", "--zookeeper", cluster.zookeeper_connect_string,
            "--root", cluster.root, "--archive", str(copy), "--db", f"sqlite:///{database}",
        ],
    )  # fmt: skip
    assert outcome.exit_code == 2, outcome.output
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("error:")]
    first, last = parse_chunk_name(chunk.name)
    assert errors == [
        f"error: the Spark job failed: {chunk} (transactions {first}..{last}): 100 bytes, the manifest says "
        f"{len(_intact_chunk(after.location, chunk.name))} (truncated or replaced)"
    ], outcome.stderr
    assert "Traceback" not in outcome.stderr


def _intact_chunk(location: Path, file: str) -> bytes:
    """The bytes of an intact chunk of partition 0."""
    return (location / partition_directory(0) / file).read_bytes()


def _replica(tmp_path: Path, name: str, first_segment: int | None, low_water_mark: int) -> OfflineReplica:
    """A replica directory whose partition 0 starts at ``first_segment`` (None: no segment); the
    offline read's retention check looks at the segments' names only."""
    partition = tmp_path / name / "0"
    partition.mkdir(parents=True)
    if first_segment is not None:
        (partition / f"{first_segment:019d}.seg").write_bytes(b"")
    return OfflineReplica(str(tmp_path / name), 1, low_water_mark, 1000)


def test_an_offline_read_refuses_what_too_few_directories_still_hold(tmp_path: Path) -> None:
    """Majority mode: one directory of three still holds transaction 0 (retention ran on the
    other two) and did not prove it below its low-water mark: it cannot be proven, and the read
    says to give the archive; below that low-water mark, the one copy proves it."""
    lagging = _replica(tmp_path, "lagging", 0, -1)
    others = [_replica(tmp_path, name, 600, 900) for name in ("a", "b")]
    source = OfflineSource((lagging, *others), quorum=2)
    with pytest.raises(CommittedReadError, match=r"from 0 \(at least up to 599\) are in too few"):
        reads._require_on_disk(0, 0, 700, source)
    proven = OfflineSource((dataclasses.replace(lagging, low_water_mark=700), *others), quorum=2)
    reads._require_on_disk(0, 0, 700, proven)
    reads._require_on_disk(0, 600, 700, source)  # from the local starts on, the directories hold it
    explicit = OfflineSource((lagging,), quorum=None)  # a mark the user vouched for: one copy is read
    reads._require_on_disk(0, 0, 700, explicit)
