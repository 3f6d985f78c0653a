"""What a local cluster leaves on disk: nothing another local user may read, and no cluster key in a
log (docs/design/storage.md, "File modes"; docs/design/overview.md, "The cluster key").

One default ``LocalCluster`` (secure: certificates and ZooKeeper credentials made for it) with its
own ZooKeeper writes a few transactions; then every file and directory of its work directory
(storage data, ZooKeeper's snapshots and transaction log, the certificates and keys, the
credentials, the nodes' settings, the logs) is checked.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl
from support.storage import run
from typer.testing import CliRunner

from waltz.cli.main import app as waltz_app
from waltz.local.cluster import LocalCluster
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.records import ReqId
from waltz.protocol.server_client import ServerAdminClient
from waltz.services.storage import format as fmt

pytestmark = pytest.mark.security

TRANSACTIONS = 5


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A default local cluster (its own ZooKeeper), kept in a work directory, with transactions."""
    with LocalCluster(work_dir=tmp_path_factory.mktemp("files") / "cluster") as cluster:
        for partition_id in range(cluster.num_partitions):

            async def append(pid: int = partition_id) -> None:
                async with ServerAdminClient(cluster.owner(pid), tls=cluster.admin_tls, timeout=20) as client:
                    for seq in range(TRANSACTIONS):
                        [outcome] = await client.append(pid, [(ReqId(9, 0, pid, seq), 0, b"private")])
                        assert isinstance(outcome, int), outcome

            run(append())
        yield cluster


def _everything(directory: Path) -> list[Path]:
    found = [directory]
    for parent, directories, files in os.walk(directory):
        found += [Path(parent) / name for name in (*directories, *files)]
    return found


def test_nothing_a_local_cluster_writes_is_open_to_other_users(written: LocalCluster) -> None:
    paths = _everything(written.work_dir)
    kinds = {path.name for path in paths}
    # The scan covers what matters: storage data, ZooKeeper's data, logs and the nodes' settings.
    assert fmt.CONTROL_FILE_NAME in kinds
    assert any(name.endswith(fmt.SEGMENT_SUFFIX) for name in kinds)
    assert any(name.endswith(fmt.INDEX_SUFFIX) for name in kinds)
    assert any(name.startswith("log.") for name in kinds), "no ZooKeeper transaction log was found"
    assert any(name.endswith(".log") for name in kinds)
    assert {"ca.pem", "admin-key.pem", "client-key.pem", "node-key.pem", "operator.digest"} <= kinds
    open_to_others = []
    for path in paths:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        if stat.S_ISLNK(os.lstat(path).st_mode):
            continue
        if mode & 0o077:
            open_to_others.append(f"{oct(mode)} {path.relative_to(written.work_dir)}")
    assert open_to_others == [], "readable by other users:\n" + "\n".join(open_to_others)
    controls = [path for path in paths if path.name == fmt.CONTROL_FILE_NAME]
    assert len(controls) == len(written.storages)
    assert {stat.S_IMODE(path.stat().st_mode) for path in controls} == {0o600}
    assert {stat.S_IMODE(path.stat().st_mode) for path in paths if path.is_dir()} == {0o700}


def test_no_log_and_no_description_holds_the_cluster_key(written: LocalCluster) -> None:
    """The logs of every node and of ZooKeeper, and ``describe()`` (what ``waltz up`` prints), show
    the key's fingerprint, never the key."""
    key = written.cluster_key
    fingerprint = cluster_key_fingerprint(key)
    logs = [path for path in _everything(written.work_dir) if path.suffix == ".log"]
    assert len(logs) >= len(written.storages) + len(written.servers) + 1
    for path in logs:
        text = path.read_text(errors="replace")
        assert key not in text and key.replace("-", "") not in text, f"{path} holds the cluster key"
    storage_logs = [path for path in logs if path.name.startswith("storage")]
    assert storage_logs and all(fingerprint in path.read_text() for path in storage_logs)
    description = written.describe()
    assert key not in description and fingerprint in description


def test_on_its_own_zookeeper_anonymous_sessions_create_nothing(written: LocalCluster) -> None:
    """ZooKeeper holds every znode in memory: anyone creating znodes where they may could exhaust
    it. A local cluster's own ZooKeeper lets anyone only read ``/`` and the root's parents, and
    ``waltz cluster verify`` finds no parent anyone else may change."""
    anonymous = KazooClient(hosts=written.zookeeper_connect_string)
    anonymous.start(timeout=10)
    try:
        parts = written.root.strip("/").split("/")[:-1]
        parents = ["/", *("/" + "/".join(parts[: i + 1]) for i in range(len(parts)))]
        assert len(parents) >= 2, written.root
        # ZooKeeper's own znodes too: /zookeeper/quota is open to all by default.
        parents += ["/zookeeper", "/zookeeper/quota"]
        for parent in parents:
            with pytest.raises(NoAuthError):
                anonymous.create(f"{parent.rstrip('/')}/filler", b"x" * 1000)
            with pytest.raises(NoAuthError):
                anonymous.set_acls(parent, [make_digest_acl("intruder", "pw", all=True)])
        assert anonymous.get_children("/")  # reading stays open
    finally:
        anonymous.stop()
        anonymous.close()
    env = {**os.environ, **written.admin_env()}
    report = CliRunner().invoke(waltz_app, ["cluster", "verify", "--json"], env=env)
    checks = {c["name"]: c for c in json.loads(report.stdout)["checks"]}
    assert checks["zookeeper: root's parents"]["status"] == "PASSED", checks["zookeeper: root's parents"]
