"""``waltz archive restore``: a lost cluster made again from its archive (docs/design/archive.md,
"Restoring a cluster from the archive").

The first test loses a whole cluster: the counter example on PostgreSQL commits through cluster
A, the archiver archives everything, A's processes stop and its directories go; ``waltz archive
restore`` makes cluster B on new, empty storage nodes, and the counter's instances, on the same
database, go on: their marks continue from A's, nothing applied twice, nothing skipped, and new
transactions get the IDs after the archive's end. The others check what a restore refuses, with
nothing written: an archive that fails verification (each damage named by file and range), a root
that holds a cluster, a storage node that is not empty.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import support
from kazoo.client import KazooClient
from kazoo.security import ACL, Id, Permissions
from typer.testing import CliRunner, Result

from waltz.admin.storage_nodes import call_admin_on_nodes
from waltz.archive.chunks import write_chunk
from waltz.archive.layout import ArchiveFiles, chunk_name
from waltz.archive.manifests import (
    ArchiveManifest,
    cluster_key_fingerprint,
    read_archive_manifest,
    read_partition_manifest,
    write_archive_manifest,
    write_partition_manifest,
)
from waltz.cli.main import app
from waltz.local.certificates import make_cluster_certificates
from waltz.local.cluster import LocalCluster
from waltz.local.nodes import LocalServer, LocalStorageNode
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_roles import digest_identity
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient
from waltz_examples.counter.service import CounterService

pytestmark = pytest.mark.timeout(600)

#: Counters the application changes; they fall on both partitions.
COUNTERS = range(1, 9)


def waltz(*args: str, expect: int | None = 0) -> Result:
    result = CliRunner().invoke(app, list(args))
    if expect is not None:
        assert result.exit_code == expect, f"exit code {result.exit_code}:\n{result.output}"
    return result


def storage_spec(node: LocalStorageNode) -> str:
    return f"{node.address}={node.admin_port}"


@contextlib.contextmanager
def storage_nodes(directory: Path, count: int) -> Iterator[list[LocalStorageNode]]:
    """``count`` storage nodes with empty directories, running until the block ends."""
    nodes = [
        LocalStorageNode(
            directory / f"storage-{i}",
            name=f"storage-{i}",
            log_path=directory / "logs" / f"storage-{i}.log",
            insecure=True,
        )
        for i in range(count)
    ]
    with contextlib.ExitStack() as stack:
        for node in nodes:
            stack.enter_context(node)
        yield nodes


def marks_of(service: CounterService, partitions: int) -> dict[int, int]:
    return {p: service.callbacks.get_client_high_water_mark(p) for p in range(partitions)}


def test_a_lost_cluster_comes_back_from_the_archive_and_the_application_goes_on(
    zookeeper: Any, zk_root: str, tmp_path: Path, waltz_postgres_database: str
) -> None:
    connect = zookeeper.connect_string
    archive = tmp_path / "archive"
    expected: dict[int, int] = dict.fromkeys(COUNTERS, 0)
    # --- cluster A: the application commits, the archiver archives everything, then A is lost.
    a_dir = tmp_path / "cluster-a"
    with LocalCluster(
        security=support.PLAINTEXT,
        storages=3,
        servers=1,
        partitions=2,
        name="restore-a",
        zookeeper=connect,
        work_dir=a_dir,
        delete_root=True,
    ) as a:
        with CounterService(waltz_postgres_database, connect, a.root) as service:
            for round_ in range(3):
                for counter in COUNTERS:
                    service.increment(counter, counter + round_)
                    expected[counter] += counter + round_
            marks_a = marks_of(service, 2)
            assert min(marks_a.values()) >= 0, marks_a
        waltz("archive", "run", "--to", str(archive), "--seal-after", "0", "--chunk-transactions", "10",
              "--zookeeper", connect, "--root", a.root)  # fmt: skip
        files = ArchiveFiles.open(str(archive))
        through = {p: read_partition_manifest(files, p).archived_through for p in (0, 1)}
        assert through == marks_a, "the archive holds everything A committed"
        key_a = a.cluster_key
    shutil.rmtree(a_dir)  # its storage directories and logs: the cluster is lost

    # --- cluster B from the archive, on new empty storage nodes, under a new root.
    b_dir = tmp_path / "cluster-b"
    with storage_nodes(b_dir, 3) as nodes:
        restored = waltz(
            "archive", "restore", "--from", str(archive), "--name", "restored", "--replicas", "2",
            *[w for n in nodes for w in ("--storage", storage_spec(n))],
            "--zookeeper", connect, "--root", zk_root, "--json",
        )  # fmt: skip
        outcome = json.loads(restored.stdout)
        assert outcome["ok"] and outcome["num_partitions"] == 2 and outcome["archive"] == str(archive)
        assert {p["partition_id"]: p["start"] for p in outcome["partitions"]} == {
            p: m + 1 for p, m in marks_a.items()
        }
        fingerprints = read_archive_manifest(files)
        assert fingerprints is not None
        assert fingerprints.cluster_key_fingerprints == (
            cluster_key_fingerprint(key_a),
            outcome["cluster_key_fingerprint"],
        )
        with _zk(connect) as client:
            summary = ClusterZk(client, zk_root).archive_summary()
            assert summary is not None and summary.value.location == str(archive)
            assert {p: summary.value.of(p).archived_through for p in (0, 1)} == marks_a
        server = LocalServer(
            connect, zk_root, name="server-b", log_path=b_dir / "logs" / "server.log", insecure=True
        )
        with server:
            with CounterService(waltz_postgres_database, connect, zk_root) as service:
                assert marks_of(service, 2) == marks_a, "the database's marks are A's, and B starts there"
                for counter in COUNTERS:
                    assert service.get(counter) == expected[counter]
                written: dict[int, list[int]] = {0: [], 1: []}
                for counter in COUNTERS:
                    update = service.change(counter, 100)
                    expected[counter] += 100
                    assert update.value == expected[counter], "nothing applied twice, nothing skipped"
                    written[update.partition_id].append(update.transaction_id)
                for partition, ids in written.items():
                    start = marks_a[partition] + 1
                    assert ids == list(range(start, start + len(ids))), (partition, ids)
                assert marks_of(service, 2) == {p: marks_a[p] + len(written[p]) for p in (0, 1)}
                assert service.stats().uncaught_apply_errors == 0
            with CounterService(waltz_postgres_database, connect, zk_root) as second:
                assert {c: second.get(c) for c in COUNTERS} == expected, "a second instance agrees"
            # The archive goes on with B: its key is accepted, its chunks follow A's.
            waltz("archive", "run", "--to", str(archive), "--seal-after", "0", "--chunk-transactions", "10",
                  "--zookeeper", connect, "--root", zk_root)  # fmt: skip
            for partition in (0, 1):
                manifest = read_partition_manifest(files, partition)
                assert manifest.archived_through == marks_a[partition] + len(written[partition])
            assert "OK:" in waltz("archive", "verify", "--zookeeper", connect, "--root", zk_root).output


@contextlib.contextmanager
def _zk(connect: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=connect)
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


# --- what a restore refuses, with nothing written --------------------------------------------------


def records(partition: int, first: int, count: int) -> list[Record]:
    return [
        Record.create(t, ReqId(7, 1, partition, t), 1, b"archived %d" % t)
        for t in range(first, first + count)
    ]


@pytest.fixture
def synthetic_archive(tmp_path: Path) -> Path:
    """An archive of two partitions: 0 in chunks 0..99 and 100..199, 1 in 0..49."""
    location = tmp_path / "archive"
    files = ArchiveFiles.open(str(location))
    write_archive_manifest(
        files, ArchiveManifest(2, (cluster_key_fingerprint(str(uuid.uuid4())),), "2026-01-01")
    )
    for partition, chunks in ((0, [(0, 100), (100, 100)]), (1, [(0, 50)])):
        manifest = read_partition_manifest(files, partition)
        for first, count in chunks:
            entry = write_chunk(files, partition, records(partition, first, count), ["a:1", "b:1"])
            manifest = manifest.with_chunk(entry)
        write_partition_manifest(files, manifest)
    return location


def _chunk(location: Path) -> Path:
    return location / "partition_id=0" / chunk_name(100, 199)


def _manifest_edit(location: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = location / "partition_id=0" / "manifest.json"
    document = json.loads(path.read_text())
    edit(document["chunks"][1])
    path.write_text(json.dumps(document))


def _flip_byte(location: Path) -> None:
    data = bytearray(_chunk(location).read_bytes())
    data[len(data) // 3] ^= 0x01
    _chunk(location).write_bytes(bytes(data))


def _not_contiguous(location: Path) -> None:
    def shift(chunk: dict[str, Any]) -> None:
        chunk.update(first=101, rows=99, file=chunk_name(101, 199))

    _manifest_edit(location, shift)
    _chunk(location).rename(location / "partition_id=0" / chunk_name(101, 199))


#: The chunk 100..199 of partition 0, as a problem names it.
CHUNK = r"partition_id=0/" + chunk_name(100, 199) + r".*\(transactions 100\.\.199\)"

#: Damage -> (what does it, what the refusal says: the file and range, then the problem).
DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "a missing chunk": (lambda loc: _chunk(loc).unlink(), CHUNK + ": missing"),
    "a truncated chunk": (
        lambda loc: _chunk(loc).write_bytes(_chunk(loc).read_bytes()[:-50]),
        CHUNK + r": \d+ bytes, the manifest",
    ),
    "a corrupted byte": (_flip_byte, CHUNK + ": its SHA-256 is"),
    "a wrong data_crc in the manifest": (
        lambda loc: _manifest_edit(loc, lambda c: c.update(data_crc=(c["data_crc"] + 1) % 2**32)),
        CHUNK + ": .*data_crc",
    ),
    "a wrong SHA-256 in the manifest": (
        lambda loc: _manifest_edit(loc, lambda c: c.update(sha256=hashlib.sha256(b"x").hexdigest())),
        CHUNK + ": its SHA-256 is .*the manifest says",
    ),
    "a non-contiguous manifest": (
        _not_contiguous,
        r"partition_id=0/manifest\.json \(transactions 101\.\.199\): the chunk "
        + chunk_name(101, 199)
        + " leaves a gap",
    ),
    "a manifest that is not JSON": (
        lambda loc: (loc / "partition_id=0" / "manifest.json").write_text("{not json"),
        r"partition_id=0/manifest\.json is not JSON",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_an_archive_that_fails_verification_is_refused_naming_the_file_and_range(
    zookeeper: Any, zk_root: str, synthetic_archive: Path, damage: str
) -> None:
    harm, problem = DAMAGE[damage]
    harm(synthetic_archive)
    before = (synthetic_archive / "archive.json").read_bytes()
    refused = waltz(
        "archive", "restore", "--from", str(synthetic_archive), "--name", "restored",
        "--storage", "127.0.0.1:1=2", "--zookeeper", zookeeper.connect_string, "--root", zk_root,
        expect=1,
    )  # fmt: skip
    assert re.search(re.escape(str(synthetic_archive)) + "/" + problem, refused.output), refused.output
    assert "fails verification; nothing was restored" in refused.output
    with _zk(zookeeper.connect_string) as client:
        assert client.exists(zk_root) is None, "nothing written to ZooKeeper"
    assert (synthetic_archive / "archive.json").read_bytes() == before


def test_a_root_that_holds_a_cluster_and_nodes_that_are_not_empty_are_refused(
    zookeeper: Any, zk_root: str, synthetic_archive: Path, tmp_path: Path
) -> None:
    connect = zookeeper.connect_string
    before = (synthetic_archive / "archive.json").read_bytes()
    with storage_nodes(tmp_path / "nodes", 2) as (empty, used):
        other_key = str(uuid.uuid4())

        async def take(storage: str, admin: StorageAdminClient) -> None:
            await admin.assign_partition(0, True)

        outcome = _run(call_admin_on_nodes({used.address: used.admin_address}, other_key, 2, take))
        assert outcome[used.address].failure is None
        where = ["--zookeeper", connect, "--root", zk_root]
        refused = waltz(
            "archive", "restore", "--from", str(synthetic_archive), "--name", "restored",
            "--storage", storage_spec(empty), "--storage", storage_spec(used), *where, expect=1,
        )  # fmt: skip
        assert "not empty" in refused.output and used.address in refused.output, refused.output
        kept = re.search(r"--cluster-key-file (\S+),", refused.output)
        assert kept is not None and empty.address in refused.output, refused.output
        key_file = Path(kept.group(1))
        key = re.fullmatch(r"([0-9a-f-]{36})\n", key_file.read_text())
        assert key is not None and stat.S_IMODE(key_file.stat().st_mode) == 0o600
        # The message names the key by its fingerprint; the key itself is only in the private file.
        assert key.group(1) not in refused.output
        assert cluster_key_fingerprint(key.group(1)) in refused.output
        with _zk(connect) as client:
            assert client.exists(zk_root) is None, "nothing written to ZooKeeper"
        assert (synthetic_archive / "archive.json").read_bytes() == before

        # The empty node took the key the message gives: with it, the restore goes through on it.
        waltz(
            "archive", "restore", "--from", str(synthetic_archive), "--name", "restored",
            "--storage", storage_spec(empty), "--cluster-key-file", str(key_file), *where,
        )  # fmt: skip
        key_file.unlink()
        with _zk(connect) as client:
            cluster = ClusterZk(client, zk_root)
            assert str(cluster.params().cluster_key) == key.group(1)
            metadata = cluster.partition_metadata(0).value
            assert {s: (r.session_id, r.closing_high_water_mark) for s, r in metadata.replicas.items()} == {
                empty.address: (-1, 199)
            }

        async def status(storage: str, admin: StorageAdminClient) -> Any:
            return await admin.partition_status(-1)

        answer = _run(call_admin_on_nodes({empty.address: empty.admin_address}, key.group(1), 2, status))
        ranges = {
            p.partition_id: (p.local_start, p.max_transaction_id, p.archived_through)
            for p in answer[empty.address].value.partitions
        }
        assert ranges == {0: (200, 199, 199), 1: (50, 49, 49)}

        again = waltz(
            "archive", "restore", "--from", str(synthetic_archive), "--name", "restored",
            "--storage", storage_spec(empty), *where, expect=1,
        )  # fmt: skip
        assert f"{zk_root} exists already" in again.output and "waltz cluster delete" in again.output


def test_nodes_that_refuse_the_certificate_s_role_are_named_so_not_as_not_empty(
    zookeeper: Any, zk_root: str, synthetic_archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore with the operator's certificate: the empty nodes refuse to be initialised
    (PERMISSION_DENIED), and the refusal asks for the admin's certificate, not for empty
    directories; with it, the same nodes take the restore."""
    certificates = make_cluster_certificates(tmp_path / "tls")
    node = LocalStorageNode(
        tmp_path / "storage-0",
        name="storage-0",
        log_path=tmp_path / "logs" / "storage-0.log",
        env=certificates.storage_env(),
    )
    where = ["--zookeeper", zookeeper.connect_string, "--root", zk_root]
    restore = ["archive", "restore", "--from", str(synthetic_archive), "--name", "restored"]
    with node:
        for role in ("operator", "admin"):
            monkeypatch.setenv("WALTZ_CLUSTER_SSL_CA_FILE", str(certificates.ca_file))
            monkeypatch.setenv("WALTZ_CLUSTER_SSL_CERT_FILE", str(certificates.cert_file(role)))
            monkeypatch.setenv("WALTZ_CLUSTER_SSL_KEY_FILE", str(certificates.key_file(role)))
            if role == "operator":
                refused = waltz(*restore, "--storage", storage_spec(node), *where, expect=1)
                assert f"storage nodes {node.address} refused this certificate" in refused.output
                assert "needs a certificate of the admin role" in refused.output, refused.output
                assert "not empty" not in refused.output and "--cluster-key-file" not in refused.output
                with _zk(zookeeper.connect_string) as client:
                    assert client.exists(zk_root) is None, "nothing written to ZooKeeper"
            else:
                waltz(*restore, "--storage", storage_spec(node), *where)


#: The operator's ZooKeeper credential of the guarded parent below.
OPERATOR_DIGEST = "restorer:secret-of-the-operator"


@contextlib.contextmanager
def _guarded_parent(connect: str, zk_root: str, *others: ACL) -> Iterator[str]:
    """``<zk_root>/guarded``, where anyone may read (and delete, for the cleanup) but only the
    operator's credential, and ``others``, may create: a session without it cannot make a root."""
    parent = f"{zk_root}/guarded"
    anyone = ACL(Permissions.READ | Permissions.DELETE, Id("world", "anyone"))
    operator = ACL(Permissions.ALL, Id("digest", digest_identity(OPERATOR_DIGEST)))
    with _zk(connect) as client:
        client.ensure_path(zk_root)
        client.create(parent, b"", acl=[anyone, operator, *others])
    try:
        yield parent
    finally:  # what the restore made carries the operator's ACL: zk_root's cleaner cannot delete it
        client = KazooClient(hosts=connect, auth_data=[("digest", OPERATOR_DIGEST)])
        client.start(timeout=10)
        try:
            client.delete(parent, recursive=True)
        finally:
            client.stop()
            client.close()


@pytest.mark.parametrize("caught", ["before the storage nodes", "after the storage nodes took the key"])
def test_a_restore_zookeeper_refuses_leaves_nothing_a_retry_trips_on(
    zookeeper: Any,
    zk_root: str,
    synthetic_archive: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caught: str,
) -> None:
    """A restore without the operator's ZooKeeper credential where the root's parent needs it:
    refused before any storage node takes a key when the parent's ACL says so; when only ZooKeeper
    can tell (an ACL of the ip scheme), the key the nodes took is kept in a file as for any refusal
    after they took it. Either way archive.json is unchanged, and the restore with the credential
    (and that key) goes through (docs/design/archive.md, "Restoring a cluster from the archive")."""
    connect = zookeeper.connect_string
    before = (synthetic_archive / "archive.json").read_bytes()
    others = [] if caught.startswith("before") else [ACL(Permissions.CREATE, Id("ip", "192.0.2.1"))]
    digest_file = tmp_path / "operator.digest"
    digest_file.write_text(OPERATOR_DIGEST + "\n")
    with storage_nodes(tmp_path / "nodes", 2) as nodes, _guarded_parent(connect, zk_root, *others) as parent:
        root = f"{parent}/restored"
        restore = ["archive", "restore", "--from", str(synthetic_archive), "--name", "restored"]
        restore += [arg for node in nodes for arg in ("--storage", storage_spec(node))]
        restore += ["--zookeeper", connect, "--root", root]
        refused = waltz(*restore, expect=None)
        output = " ".join(refused.output.split())
        assert "ZooKeeper refused creating" in output, output
        assert (synthetic_archive / "archive.json").read_bytes() == before, (
            "no fingerprint of a cluster never made"
        )
        kept = re.search(r"--cluster-key-file (\S+),", refused.output)
        if caught.startswith("before"):
            assert refused.exit_code == 2, refused.output
            assert kept is None and "nothing was written" in output, output
            again: list[str] = []
        else:
            assert refused.exit_code == 1, refused.output
            assert kept is not None, refused.output
            again = ["--cluster-key-file", kept.group(1)]
        monkeypatch.setenv("WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE", str(digest_file))
        done = waltz(*restore, *again)
        assert "restored: cluster 'restored'" in done.output, done.output
        manifest = read_archive_manifest(ArchiveFiles.open(str(synthetic_archive)))
        assert manifest is not None and len(manifest.cluster_key_fingerprints) == 2
        if kept is not None:
            key = Path(kept.group(1)).read_text().strip()
            Path(kept.group(1)).unlink()
            assert cluster_key_fingerprint(key) in manifest.cluster_key_fingerprints


def _run(coroutine: Any) -> Any:
    # The process's one loop for gRPC's asyncio layer, as the restore in this process uses
    # (docs/design/client.md, "The client's parts").
    return run_on_shared_loop(coroutine)


def test_a_location_without_an_archive_is_refused(zookeeper: Any, zk_root: str, tmp_path: Path) -> None:
    refused = waltz(
        "archive", "restore", "--from", str(tmp_path), "--name", "restored", "--storage", "127.0.0.1:1=2",
        "--zookeeper", zookeeper.connect_string, "--root", zk_root, expect=1,
    )  # fmt: skip
    assert f"{tmp_path}/archive.json is missing" in " ".join(refused.output.split()), refused.output
    with _zk(zookeeper.connect_string) as client:
        assert client.exists(zk_root) is None, "nothing written to ZooKeeper"


def test_help_explains_the_restore() -> None:
    text = waltz("archive", "restore", "--help").output
    for words in (
        "--from",
        "--storage",
        "archived-through + 1",
        "verified first",
        "Nothing is written",
        "its certificate needs the admin role",
    ):
        assert words in " ".join(text.split()), words
    hold = " ".join(waltz("archive", "verify", "--help").output.split())
    assert "telling the replicas needs a certificate of the admin role" in hold, hold
