"""``waltz archive run|status|verify`` against one real local cluster shared by the module
(docs/operations.md, "Archive"): the status's JSON form, and each kind of damage verify finds,
named by file and range, with ``--hold`` lowering the archived-through to the last good chunk."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import support
from typer.testing import CliRunner, Result

from waltz.archive.layout import ArchiveFiles, chunk_name
from waltz.archive.manifests import PartitionManifest, read_partition_manifest
from waltz.archive.replicas import tell_replicas
from waltz.archive.summary import entry_of
from waltz.cli.main import app
from waltz.local.cluster import LocalCluster
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import connect_zookeeper
from waltz.protocol.records import ReqId
from waltz.protocol.server_client import ServerAdminClient

pytestmark = pytest.mark.timeout(600)

#: Records appended to each partition before the module's archive is made: chunks of 100.
RECORDS = 250


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    with LocalCluster(
        security=support.PLAINTEXT,
        storages=3,
        servers=1,
        partitions=2,
        name="archive-commands",
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path_factory.mktemp("archive-commands-cluster"),
        delete_root=True,
    ) as local:
        local.wait_ready(60)
        for partition in (0, 1):
            asyncio.run(_append(local, partition, RECORDS))
        yield local


async def _append(cluster: LocalCluster, partition: int, count: int) -> None:
    async with ServerAdminClient(cluster.owner(partition), timeout=60) as admin:
        batch = [(ReqId(5, 1, partition, i), 1, b"archived %d" % i) for i in range(count)]
        assert all(isinstance(o, int) for o in await admin.append(partition, batch))


@pytest.fixture
def zk(cluster: LocalCluster) -> Iterator[ClusterZk]:
    """The cluster's znodes; the archive's summary is deleted first (each test archives anew)."""
    client = connect_zookeeper(cluster.zookeeper_connect_string, security=cluster.zookeeper_security)
    try:
        cluster_zk = ClusterZk(client, cluster.root)
        if client.exists(cluster_zk.paths.archive):
            client.delete(cluster_zk.paths.archive)
        yield cluster_zk
    finally:
        client.stop()
        client.close()


def waltz(cluster: LocalCluster, *args: str, expect: int | None = 0) -> Result:
    where = ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    result = CliRunner().invoke(app, ["archive", *args, *where])
    if expect is not None:
        assert result.exit_code == expect, f"exit code {result.exit_code}:\n{result.output}"
    return result


def archived(cluster: LocalCluster, location: Path) -> Result:
    """``waltz archive run --once`` to ``location`` in chunks of 100, the tail at once."""
    return waltz(cluster, "run", "--to", str(location), "--chunk-transactions", "100", "--seal-after", "0")


def test_a_run_once_says_what_it_waits_for_before_the_tail_s_chunk(
    cluster: LocalCluster, zk: ClusterZk, tmp_path: Path
) -> None:
    """The tail of a partition waits --seal-after seconds of quiet: the run says so, and then
    writes it. The seconds said are what is left of the quiet, counted from when the run first saw
    the partition's tail (2 or a little less, as the other partition was archived meanwhile)."""
    location = tmp_path / "archive"
    ran = waltz(cluster, "run", "--to", str(location), "--chunk-transactions", "100", "--seal-after", "2")
    for partition in (0, 1):
        waits = rf"partition {partition}: waiting [0-2]s for transactions 200\.\.{RECORDS - 1} to stay"
        said = re.search(waits, ran.output)
        assert said is not None, ran.output
        written = ran.output.index(f"partition {partition}: chunk written 200..{RECORDS - 1}")
        assert said.start() < written, ran.output
    assert "(--seal-after 0 writes it now)" in ran.output


def zookeeper_through(zk: ClusterZk, partition: int) -> int:
    summary = zk.archive_summary()
    assert summary is not None
    return summary.value.of(partition).archived_through


def test_run_then_status_shows_the_archive_the_replicas_and_no_lag(
    cluster: LocalCluster, zk: ClusterZk, tmp_path: Path
) -> None:
    location = tmp_path / "archive"
    output = archived(cluster, location).output
    assert f"archiving to {location} (once)" in output
    assert "waiting" not in output  # --seal-after 0: the tail's chunk at once
    assert "partition 0: chunk written 0..99 (100 records" in output
    assert f"partition 1: archived through {RECORDS - 1}, committed through {RECORDS - 1}" in output
    status: dict[str, Any] = json.loads(waltz(cluster, "status", "--json").stdout)
    assert status["location"] == str(location) and status["unanswered"] == {}
    assert [p["partition_id"] for p in status["partitions"]] == [0, 1]
    for line in status["partitions"]:
        assert line["archive"] == {
            "first": 0,
            "archived_through": RECORDS - 1,
            "chunks": 3,
            "bytes": line["archive"]["bytes"],
            "error": None,
        }
        assert line["archive"]["bytes"] > 0
        assert line["zookeeper"] == {
            "archived_through": RECORDS - 1,
            "chunks": 3,
            "bytes": line["archive"]["bytes"],
        }
        assert line["high_water_mark"] == RECORDS - 1 and line["lag"] == 0
        assert len(line["replicas"]) == 3
        for replica in line["replicas"]:
            assert set(replica) == {
                "storage",
                "local_start",
                "max_transaction_id",
                "archived_through",
                "error",
            }
            assert replica["error"] is None and replica["local_start"] == 0
            assert replica["max_transaction_id"] == RECORDS - 1
    text = waltz(cluster, "status", "--partition", "1").output
    assert f"partition 1: archived 0..{RECORDS - 1} in 3 chunks" in text and "partition 0" not in text
    assert "lag 0" in text and "local 0.." in text


def test_status_before_any_run_and_bad_options(cluster: LocalCluster, zk: ClusterZk, tmp_path: Path) -> None:
    status = json.loads(waltz(cluster, "status", "--json").stdout)
    assert status["location"] is None
    assert all(p["zookeeper"]["archived_through"] == -1 and p["lag"] == RECORDS for p in status["partitions"])
    assert "the cluster has no archive yet" in waltz(cluster, "verify", expect=2).output
    (tmp_path / "empty").mkdir()
    for hold in ([], ["--hold"]):  # a wrong location is not a damaged archive, and nothing is held
        wrong = waltz(cluster, "verify", "--archive", str(tmp_path / "empty"), *hold, expect=2)
        assert f"{tmp_path / 'empty'} is not an archive: it holds no archive.json" in wrong.output
    for where in (tmp_path / "empty", tmp_path / "nowhere"):  # status too: not "nothing archived"
        wrong = waltz(cluster, "status", "--archive", str(where), expect=2)
        assert f"{where} is not an archive: it holds no archive.json" in wrong.output
        assert "nothing archived" not in wrong.output
    assert "partitions [7] do not exist" in waltz(cluster, "status", "--partition", "7", expect=2).output
    bad = waltz(cluster, "run", "--to", str(tmp_path), "--chunk-transactions", "0", expect=2)
    assert "--chunk-transactions" in bad.output
    missing = CliRunner().invoke(
        app, ["archive", "run", "--to", str(tmp_path)], env={"WALTZ_CLUSTER_ROOT": ""}
    )
    assert missing.exit_code == 2 and "ZooKeeper connect string" in missing.output


def test_another_location_is_refused_without_relocate(
    cluster: LocalCluster, zk: ClusterZk, tmp_path: Path
) -> None:
    archived(cluster, tmp_path / "a")
    refused = waltz(cluster, "run", "--to", str(tmp_path / "b"), expect=2)
    assert "--relocate" in refused.output and str(tmp_path / "a") in refused.output


@pytest.mark.parametrize("where", ["under a regular file", "under /proc"])
def test_a_location_that_cannot_be_written_exits_2_naming_it(
    cluster: LocalCluster, zk: ClusterZk, tmp_path: Path, where: str
) -> None:
    """A --to where no directory can be made (as root, a read-only directory would not refuse) is
    a location that cannot be opened: exit 2 with a message naming the file and why, no traceback,
    and nothing recorded in ZooKeeper (docs/operations.md, "Archive"). Under a regular file the
    read of archive.json already fails; under /proc it reads as missing, and the write fails."""
    if where == "under /proc":
        location = Path(f"/proc/waltz-test-{tmp_path.name}/archive")
        why = "No such file or directory"
    else:
        (tmp_path / "afile").write_text("not a directory")
        location = tmp_path / "afile" / "archive"
        why = "Not a directory"
    refused = waltz(cluster, "run", "--to", str(location), "--seal-after", "0", expect=None)
    assert isinstance(refused.exception, SystemExit), repr(refused.exception)
    assert refused.exit_code == 2, refused.output
    said = " ".join(refused.output.split())
    assert re.search(rf"{re.escape(str(location))}/archive\.json cannot be (read|written): ", said), said
    assert why in said, said
    assert zk.archive_summary() is None


# --- damage, found by verify and held ------------------------------------------------------------


def _manifest(location: Path) -> tuple[Path, dict[str, Any]]:
    path = location / "partition_id=0" / "manifest.json"
    return path, json.loads(path.read_text())


def _missing(location: Path) -> None:
    (location / "partition_id=0" / chunk_name(100, 199)).unlink()


def _truncated(location: Path) -> None:
    path = location / "partition_id=0" / chunk_name(100, 199)
    path.write_bytes(path.read_bytes()[:-50])


def _corrupted(location: Path) -> None:
    path = location / "partition_id=0" / chunk_name(100, 199)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))


def _wrong_sha256(location: Path) -> None:
    path, document = _manifest(location)
    document["chunks"][1]["sha256"] = hashlib.sha256(b"another file").hexdigest()
    path.write_text(json.dumps(document))


def _wrong_data_crc(location: Path) -> None:
    path, document = _manifest(location)
    document["chunks"][1]["data_crc"] = (document["chunks"][1]["data_crc"] + 1) % 2**32
    path.write_text(json.dumps(document))


def _not_contiguous(location: Path) -> None:
    path, document = _manifest(location)
    second = document["chunks"][1]
    second.update(first=101, rows=99, file=chunk_name(101, 199))
    (location / "partition_id=0" / chunk_name(100, 199)).rename(location / "partition_id=0" / second["file"])
    path.write_text(json.dumps(document))


DAMAGE = {
    "a missing chunk": (_missing, rf"{chunk_name(100, 199)} \(transactions 100\.\.199\): missing"),
    "a truncated chunk": (
        _truncated,
        rf"{chunk_name(100, 199)} \(transactions 100\.\.199\): \d+ bytes, the manifest",
    ),
    "a corrupted byte": (_corrupted, rf"{chunk_name(100, 199)} \(transactions 100\.\.199\): its SHA-256 is"),
    "a manifest with a wrong SHA-256": (
        _wrong_sha256,
        rf"{chunk_name(100, 199)} \(transactions 100\.\.199\): its SHA-256 is .*the manifest says",
    ),
    "a wrong data_crc in the manifest": (
        _wrong_data_crc,
        rf"{chunk_name(100, 199)} \(transactions 100\.\.199\): .*data_crc",
    ),
    "a non-contiguous manifest": (
        _not_contiguous,
        rf"manifest\.json \(transactions 101\.\.199\): the chunk {chunk_name(101, 199)} leaves a gap",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_verify_names_the_file_and_range_and_hold_lowers_archived_through(
    cluster: LocalCluster, zk: ClusterZk, tmp_path: Path, damage: str
) -> None:
    location = tmp_path / "archive"
    archived(cluster, location)
    ok = waltz(cluster, "verify")
    assert f"OK: 6 chunks checked, {2 * RECORDS} records verified in {location}" in ok.output
    assert "OK: 6 chunks checked" in waltz(cluster, "verify", "--archive", str(location)).output
    harm, message = DAMAGE[damage]
    harm(location)
    failed = waltz(cluster, "verify", expect=1)
    assert "FAILED:" in failed.output
    assert re.search(message, failed.output), failed.output
    assert str(location / "partition_id=0") in failed.output
    report = json.loads(waltz(cluster, "verify", "--json", expect=1).stdout)
    assert report["passed"] is False
    (zero, one) = report["partitions"]
    assert zero["passed"] is False and zero["good_through"] == 99 and one["passed"] is True
    assert zero["problems"][0]["file"].startswith(str(location / "partition_id=0"))
    assert zookeeper_through(zk, 0) == RECORDS - 1
    held = waltz(cluster, "verify", "--hold", expect=1)
    assert "held: partition 0 is archived through 99 in ZooKeeper and on its replicas" in held.output
    assert "NOT IN THE REPLICAS" not in held.output  # no retention here: the next run writes it again
    assert zookeeper_through(zk, 0) == 99 and zookeeper_through(zk, 1) == RECORDS - 1
    # The replicas were told too: none may delete a segment above the last good chunk.
    status = json.loads(waltz(cluster, "status", "--json").stdout)
    told = {
        line["partition_id"]: {r["archived_through"] for r in line["replicas"]}
        for line in status["partitions"]
    }
    assert told == {0: {99}, 1: {RECORDS - 1}}, told


def _crashed_before_zookeeper(cluster: LocalCluster, zk: ClusterZk, location: Path) -> None:
    """Partition 0 as a crash between a manifest's write and ZooKeeper's raise leaves it: the
    manifest (3 chunks, through 249) ahead of ZooKeeper and the replicas (its first chunk, 99)."""
    manifest = read_partition_manifest(ArchiveFiles.open(str(location)), 0)
    behind = PartitionManifest(0, manifest.chunks[:1])
    summary = zk.archive_summary()
    assert summary is not None
    zk.set_archive_summary(summary.value.with_partition(0, entry_of(behind)), summary.version)
    told = tell_replicas(zk, zk.params(), 0, behind.archived_through, str(location))
    assert set(told.values()) == {"told"}, told


def _replicas_told(cluster: LocalCluster) -> dict[int, set[int]]:
    status = json.loads(waltz(cluster, "status", "--json").stdout)
    lines = status["partitions"]
    return {line["partition_id"]: {r["archived_through"] for r in line["replicas"]} for line in lines}


def test_hold_never_raises_what_the_replicas_are_told_above_zookeeper(
    cluster: LocalCluster, zk: ClusterZk, tmp_path: Path
) -> None:
    """--hold only lowers: a manifest ahead of ZooKeeper (a crash before ZooKeeper was raised, or
    a copy ahead of the archive) must not tell the replicas more than ZooKeeper says is archived,
    or retention deletes records no archive holds (docs/design/archive.md, "The archiver")."""
    location = tmp_path / "archive"
    archived(cluster, location)
    _crashed_before_zookeeper(cluster, zk, location)
    path = location / "partition_id=0" / chunk_name(200, RECORDS - 1)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))  # the last chunk damaged: the good chunks reach 199
    copy = tmp_path / "copy"
    shutil.copytree(location, copy)
    # A copy is not what the cluster archives to: holding it is refused, nothing changed.
    refused = waltz(cluster, "verify", "--archive", str(copy), "--hold", expect=2)
    assert f"ZooKeeper names the archive {location}, not {copy}" in refused.output, refused.output
    assert zookeeper_through(zk, 0) == 99 and _replicas_told(cluster)[0] == {99}
    # The archive ZooKeeper names: held at ZooKeeper's 99, not the good chunks' 199.
    held = waltz(cluster, "verify", "--hold", expect=1)
    assert "held: partition 0 is archived through 99 in ZooKeeper and on its replicas" in held.output
    assert zookeeper_through(zk, 0) == 99 and _replicas_told(cluster) == {0: {99}, 1: {RECORDS - 1}}
    report = json.loads(waltz(cluster, "verify", "--hold", "--json", expect=1).stdout)
    assert report["partitions"][0]["held_to"] == 99 and report["partitions"][0]["good_through"] == 199


def test_a_newer_form_asks_for_an_upgrade(cluster: LocalCluster, zk: ClusterZk, tmp_path: Path) -> None:
    location = tmp_path / "archive"
    archived(cluster, location)
    path, document = _manifest(location)
    path.write_text(json.dumps({**document, "form": 2}))
    failed = waltz(cluster, "verify", expect=1)
    assert "archive form 2 is newer than this waltz-py reads (1); upgrade waltz-py" in failed.output
    assert str(path) in failed.output
    top = location / "archive.json"
    top.write_text(json.dumps({**json.loads(top.read_text()), "form": 3}))
    for args in (("verify",), ("run", "--to", str(location))):
        refused = waltz(cluster, *args, expect=2)
        assert f"{top}: archive form 3 is newer" in refused.output and "upgrade waltz-py" in refused.output


def test_a_run_after_hold_writes_the_damaged_chunk_again(
    cluster: LocalCluster, zk: ClusterZk, tmp_path: Path
) -> None:
    location = tmp_path / "archive"
    archived(cluster, location)
    _corrupted(location)
    waltz(cluster, "verify", "--hold", expect=1)
    assert zookeeper_through(zk, 0) == 99
    repaired = archived(cluster, location)
    assert "partition 0: chunk replaced 100..199" in repaired.output
    waltz(cluster, "verify")
    assert zookeeper_through(zk, 0) == RECORDS - 1


@pytest.mark.timeout(300)
def test_follow_exits_cleanly_on_sigterm(cluster: LocalCluster, zk: ClusterZk, tmp_path: Path) -> None:
    location = tmp_path / "archive"
    command = [sys.executable, "-m", "waltz", "archive", "run", "--follow", "--to", str(location)]
    command += ["--interval", "0.5", "--chunk-transactions", "100", "--seal-after", "0"]
    command += ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 120
    try:
        for line in run.stdout:
            seen.append(line.rstrip())
            if "partition 1: chunk written 200.." in line or time.monotonic() > deadline:
                break
        assert any("partition 1: chunk written 200.." in line for line in seen), "\n".join(seen)
        run.send_signal(signal.SIGTERM)
        rest, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    output = "\n".join(seen) + rest
    assert run.returncode == 0, output
    assert "stopped by a signal after the chunk in progress" in output
    assert zookeeper_through(zk, 1) == RECORDS - 1
