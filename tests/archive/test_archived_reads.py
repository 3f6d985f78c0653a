"""Reads below the replicas' local start come from the archive, through the server
(docs/design/archive.md, "Reads below the local start").

A real local cluster (ZooKeeper, one server, three storage nodes rolling small segments and
deleting archived ones at once) is written by ``waltz client validate``'s producers, archived by
the archiver, and its storage nodes delete their first segments. Then a client mounting from the
beginning, ``waltz client validate --since -1`` and the server's reads get every transaction, from
the archive below the local start; a damaged chunk or a missing archive stops them with an error
naming the file, the range and the archive, and nothing further is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import support
from kazoo.exceptions import NoNodeError

from tests.archive.archive_helpers import read_log
from tests.client.client_helpers import MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.admin.client_tools import run_validation, validation_number
from waltz.archive.archiver import Archiver, ChunkPolicy
from waltz.archive.layout import ArchiveFiles, partition_directory
from waltz.archive.manifests import read_partition_manifest
from waltz.archive.reader import read_archived
from waltz.errors import ArchivedReadError, WaltzTimeoutError
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import connect_zookeeper
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.storage_client import StorageAdminClient
from waltz.services.server.archived_reads import ArchivedReads

pytestmark = pytest.mark.timeout(300)

#: Storage settings that roll a segment every few kilobytes and delete archived segments at once.
RETENTION_ENV = {
    "WALTZ_STORAGE_SEGMENT_SIZE_THRESHOLD": "4096",
    "WALTZ_STORAGE_RETENTION_POLICY": "archived",
    "WALTZ_STORAGE_RETENTION_KEEP_SECONDS": "0",
    "WALTZ_STORAGE_RETENTION_CHECK_INTERVAL": "0.2",
}
#: Server caches far smaller than the log, so that old transactions are read from storage.
SERVER_ENV = {
    "WALTZ_SERVER_FEED_CACHE_SIZE": "10",
    "WALTZ_SERVER_TRANSACTION_DATA_CACHE_SIZE": "10",
}
TRANSACTIONS = 400
CHUNKS = ChunkPolicy(chunk_transactions=100, chunk_bytes=1 << 20, seal_after=0)


@dataclass
class Archived:
    """The cluster, its archive, and what retention left on its replicas."""

    cluster: LocalCluster
    zk: ClusterZk
    location: Path
    high_water_mark: int
    local_starts: list[int]


def wait_until(what: str, timeout: float, check: object) -> None:
    """Poll ``check()`` every 50 ms until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def local_starts(cluster: LocalCluster) -> list[int]:
    async def run() -> list[int]:
        starts = []
        for node in cluster.storages:
            async with StorageAdminClient(node.admin_address, cluster.cluster_key, 1) as admin:
                (found,) = (await admin.partition_status(0)).partitions
                starts.append(found.local_start)
        return starts

    return asyncio.run(run())


def settled_local_starts(cluster: LocalCluster, timeout: float = 30) -> list[int]:
    """The replicas' local starts once retention has stopped moving them: the same in two reads a
    second apart (five of the nodes' retention checks), within ``timeout`` seconds. Each node
    deletes on its own schedule, and the module's other tests write more (a replica was seen at
    281 while the others were at 374)."""
    deadline = time.monotonic() + timeout
    before = local_starts(cluster)
    while True:
        time.sleep(1)
        now = local_starts(cluster)
        if now == before:
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"retention still moves the local starts after {timeout} s: {before}, {now}")
        before = now


def client_config(cluster: LocalCluster) -> WaltzClientConfig:
    return WaltzClientConfig(**cluster.client_settings())


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[Archived]:
    work = tmp_path_factory.mktemp("archived-reads")
    with LocalCluster(
        security=support.PLAINTEXT,
        storages=3,
        servers=1,
        partitions=1,
        name="archived-reads",
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=work / "cluster",
        delete_root=True,
        processes=ProcessOptions(storage_env=RETENTION_ENV, server_env=SERVER_ENV),
    ) as cluster:
        cluster.wait_ready(60)
        written = run_validation(client_config(cluster), producers=1, transactions=TRANSACTIONS, timeout=120)
        assert written.passed and written.committed == TRANSACTIONS, written
        zk_client = connect_zookeeper(cluster.zookeeper_connect_string, security=cluster.zookeeper_security)
        try:
            zk = ClusterZk(zk_client, cluster.root)
            location = work / "archive"
            (result,) = Archiver(zk, str(location), policy=CHUNKS).run()
            assert result.error is None and result.archived_through == TRANSACTIONS - 1, result
            wait_until("retention on every replica", 30, lambda: all(s >= 100 for s in local_starts(cluster)))
            yield Archived(cluster, zk, location, TRANSACTIONS - 1, local_starts(cluster))
        finally:
            zk_client.stop()
            zk_client.close()


def test_a_client_mounted_from_the_beginning_reads_every_transaction_from_the_archive_and_the_replicas(
    archived: Archived,
) -> None:
    cluster, last = archived.cluster, archived.high_water_mark
    assert min(archived.local_starts) > 0
    store = MemoryStore({0: -1})
    with WaltzClient(store, client_config(cluster)):
        wait_until("the client applied the whole log", 60, lambda: store.marks[0] >= last or store.errors)
    assert not store.errors, store.errors
    # Every record, its data (fetched from the server, below the local start from the archive)
    # what the producer wrote: its own transaction ID.
    assert [a.transaction_id for a in store.applied[0]] == list(range(last + 1))
    assert all(validation_number(a.header, a.data) == a.transaction_id for a in store.applied[0])
    # The server's reads give the records themselves, the same as the archive's.
    start = max(archived.local_starts)
    from_server = read_log(cluster, 0, 0, last)
    assert from_server[:start] == list(read_archived(str(archived.location), 0, 0, start - 1))
    assert [r.transaction_id for r in from_server] == list(range(last + 1))
    assert all(validation_number(r.header, r.data) == r.transaction_id for r in from_server)


def test_waltz_client_validate_checks_the_whole_log_after_retention(archived: Archived) -> None:
    report = run_validation(
        client_config(archived.cluster), producers=1, transactions=5, since=-1, timeout=120
    )
    assert report.passed, (report.errors, report.mismatches)
    first, last = report.checked[0]
    assert first == 0 and last >= archived.high_water_mark + 5


def test_a_damaged_chunk_stops_the_feed_with_an_error_naming_the_file_and_range(archived: Archived) -> None:
    cluster = archived.cluster
    files = ArchiveFiles.open(str(archived.location))
    first_chunk = read_partition_manifest(files, 0).chunks[0]
    chunk = archived.location / partition_directory(0) / first_chunk.file
    original = chunk.read_bytes()
    starts_before = settled_local_starts(cluster)
    archive_before = sorted((p.name, p.stat().st_size) for p in chunk.parent.iterdir())
    chunk.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    try:
        store = MemoryStore({0: -1})
        with WaltzClient(store, client_config(cluster)):
            wait_until("an error reported to the application", 30, lambda: store.errors)
        assert store.marks[0] == -1 and not store.applied[0]  # nothing skipped
        reported = store.errors[0]
        assert "ServerFeedError" in reported and first_chunk.file in reported, reported
        assert f"transactions {first_chunk.first}..{first_chunk.last}" in reported, reported
        assert "SHA-256" in reported, reported
        # The server's own reads fail the same way.

        async def server_read() -> None:
            async with ServerAdminClient(cluster.owner(0), timeout=30) as admin:
                await admin.read(0, 0, 10)

        with pytest.raises(Exception, match=first_chunk.file):
            asyncio.run(server_read())
    finally:
        chunk.write_bytes(original)
    # Nothing was deleted further, in the archive or on the replicas.
    assert sorted((p.name, p.stat().st_size) for p in chunk.parent.iterdir()) == archive_before
    assert local_starts(cluster) == starts_before
    # waltz client validate --since -1 names the file too, not only that it could not mount.
    chunk.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    try:
        with pytest.raises(WaltzTimeoutError, match=r"not mounted within 8s.*last error reported") as failed:
            run_validation(client_config(cluster), producers=1, transactions=1, since=-1, timeout=8)
        assert first_chunk.file in str(failed.value)
    finally:
        chunk.write_bytes(original)


def test_no_archive_in_zookeeper_is_an_error_naming_the_partition_and_range(archived: Archived) -> None:
    zk = archived.zk
    summary = zk.archive_summary()
    assert summary is not None
    reads = ArchivedReads(zk)
    try:
        zk.zk.delete(zk.paths.archive)
        with pytest.raises(
            ArchivedReadError, match=r"partition 0: transactions 0\.\.9 .*is missing"
        ) as error:
            asyncio.run(reads.read(0, 0, 10, archived.local_starts[0]))
        assert error.value.location is None
    finally:
        with contextlib.suppress(NoNodeError):
            zk.zk.delete(zk.paths.archive)
        zk.set_archive_summary(summary.value, -1)
    # Asked beyond what the archive holds (a local start above its archived-through): named too.
    with pytest.raises(ArchivedReadError, match=r"the archive holds transactions 0\.\.") as beyond:
        asyncio.run(reads.read(0, 0, 10_000, 10_000))
    assert beyond.value.location == str(archived.location)


def test_zookeeper_behind_the_manifest_after_retention_is_caught_up_on_the_chunks_own_checks(
    archived: Archived,
) -> None:
    """ZooKeeper's archive summary lost (a restored ZooKeeper, a deleted znode) after the replicas
    deleted the archived segments: the chunks above its mark cannot be compared with the replicas
    any more, so each is taken on its own check and ZooKeeper is raised to the manifest again
    (docs/design/archive.md, "The archiver"); the replicas are told it again."""
    zk = archived.zk
    summary = zk.archive_summary()
    assert summary is not None
    through = summary.value.of(0).archived_through
    zk.zk.delete(zk.paths.archive)
    (result,) = Archiver(zk, str(archived.location), policy=CHUNKS).run()
    assert result.error is None, result.error
    assert result.archived_through >= through  # the tests before wrote more
    through = result.archived_through
    restored = zk.archive_summary()
    assert restored is not None and restored.value.of(0).archived_through == through

    async def told() -> list[int]:
        marks = []
        for node in archived.cluster.storages:
            async with StorageAdminClient(node.admin_address, archived.cluster.cluster_key, 1) as admin:
                (found,) = (await admin.partition_status(0)).partitions
                marks.append(found.archived_through)
        return marks

    assert asyncio.run(told()) == [through] * len(archived.cluster.storages)


def test_a_damaged_chunk_retention_deleted_from_the_replicas_stops_the_run_naming_it_once(
    archived: Archived,
) -> None:
    """ZooKeeper's summary lost after retention, and the first chunk damaged: the run cannot write
    it again from the replicas, stops the partition and says so, naming the file and range once;
    once the chunk is copied back, the next run takes it on its own check."""
    zk = archived.zk
    files = ArchiveFiles.open(str(archived.location))
    entry = read_partition_manifest(files, 0).chunks[0]
    chunk = archived.location / partition_directory(0) / entry.file
    original = chunk.read_bytes()
    chunk.write_bytes(original[: len(original) // 2])
    try:
        zk.zk.delete(zk.paths.archive)
        (stopped,) = Archiver(zk, str(archived.location), policy=CHUNKS).run()
        assert stopped.error is not None
        where = f"{chunk} (transactions {entry.first}..{entry.last})"
        assert stopped.error.startswith(f"{where}: "), stopped.error
        assert stopped.error.count(str(chunk)) == 1, stopped.error
        assert "cannot be written again from them: copy the chunk back" in stopped.error
    finally:
        chunk.write_bytes(original)
    (result,) = Archiver(zk, str(archived.location), policy=CHUNKS).run()
    assert result.error is None, result.error


def test_a_range_every_replica_deleted_and_the_archive_lacks_says_to_copy_the_chunks_back(
    archived: Archived, tmp_path: Path
) -> None:
    """The archiver sent to an empty archive with ZooKeeper's summary gone, after retention: every
    replica answers that the range is below its local start. The message says so, with the local
    starts, points to ``waltz archive verify`` and copying the chunks back, and counts the replicas
    as they are (all up: not "start the storage nodes that are down") (docs/design/archive.md,
    "The archiver")."""
    zk = archived.zk
    summary = zk.archive_summary()
    assert summary is not None
    zk.zk.delete(zk.paths.archive)
    try:
        (stopped,) = Archiver(zk, str(tmp_path / "empty-archive"), policy=CHUNKS).run()
    finally:  # the module's archive named again, and its replicas told it again
        zk.zk.delete(zk.paths.archive)
        zk.set_archive_summary(summary.value, -1)
        (again,) = Archiver(zk, str(archived.location), policy=CHUNKS).run()
        assert again.error is None, again.error
    assert stopped.error is not None
    error = stopped.error
    assert "start the storage nodes that are down" not in error, error
    assert "3 of its 3 replicas hold them, 2 failed, leaving 1 untried, fewer than the quorum" in error, error
    assert "the range is below the local start of 2 replica(s)" in error, error
    assert "`waltz archive verify`" in error and "copy the chunks of 0..99 back" in error, error
