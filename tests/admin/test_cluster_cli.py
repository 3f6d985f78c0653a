"""``waltz cluster``: create, list, verify, delete and storage commands against a real ZooKeeper and
real storage node processes (docs/zookeeper.md; docs/design/zookeeper.md "Replica assignments and
groups", "Storage admin ports", "Partition metadata")."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import support
from kazoo.client import KazooClient
from typer.testing import CliRunner, Result

from waltz.cli.main import app
from waltz.errors import StorageRpcError
from waltz.local.certificates import make_cluster_certificates
from waltz.local.nodes import LocalStorageNode
from waltz.local.processes import free_port, wait_until
from waltz.local.zookeeper import DockerZooKeeper, LocalZooKeeper
from waltz.metadata.values import PartitionMetadata, ReplicaState
from waltz.metadata.zk import ClusterZk
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient
from waltz.services.storage import format as fmt

StartStorage = Callable[[], LocalStorageNode]


@pytest.fixture
def start_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StartStorage]:
    """Start storage node processes on loopback; every one is killed at teardown."""
    nodes: list[LocalStorageNode] = []

    def start() -> LocalStorageNode:
        name = f"storage-{len(nodes)}"
        node = LocalStorageNode(tmp_path / name, name=name, log_path=tmp_path / f"{name}.log", insecure=True)
        nodes.append(node)
        support.add_failure_logs(request.node, f"{name} log", node.process.log_tail)
        node.start()
        return node

    try:
        yield start
    finally:
        for node in nodes:
            node.close()


class Cli:
    """Runs ``waltz cluster ...`` in-process against the test's ZooKeeper and cluster root."""

    def __init__(self, zookeeper: str, root: str) -> None:
        self.zookeeper = zookeeper
        self.root = root
        self.runner = CliRunner()

    def __call__(
        self, *args: str, input: str | None = None, expect: int | None = 0, env: dict[str, str] | None = None
    ) -> Result:
        result = self.runner.invoke(
            app,
            ["cluster", *args, "--zookeeper", self.zookeeper, "--root", self.root, "--timeout", "3"],
            input=input,
            env=env,
        )
        if expect is not None:
            assert result.exit_code == expect, f"exit code {result.exit_code}:\n{result.output}"
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json").stdout)


@pytest.fixture
def cli(zookeeper: LocalZooKeeper | DockerZooKeeper, zk_root: str) -> Cli:
    return Cli(zookeeper.connect_string, zk_root)


def spec(node: LocalStorageNode, group: int | None = None) -> str:
    return f"{node.address}={node.admin_port}" + ("" if group is None else f",{group}")


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def node_partitions(node: LocalStorageNode, cluster_key: str, num_partitions: int) -> dict[int, Any]:
    """The partitions a storage node reports through its admin port, by ID."""

    async def status() -> dict[int, Any]:
        async with StorageAdminClient(node.admin_address, cluster_key, num_partitions) as admin:
            response = await admin.partition_status(-1)
            return {p.partition_id: p for p in response.partitions}

    result: dict[int, Any] = asyncio.run(status())
    return result


def lines_with(output: str, *words: str) -> list[str]:
    return [line for line in output.splitlines() if all(w in line for w in words)]


def create(
    cli: Cli,
    nodes: list[LocalStorageNode],
    partitions: int,
    *extra: str,
    expect: int = 0,
    env: dict[str, str] | None = None,
) -> Result:
    # Open znodes on purpose (these tests read them anonymously) unless a credential is given.
    args = ["create", "--name", "test", "--partitions", str(partitions)]
    if not any(name.startswith("WALTZ_ZOOKEEPER_AUTH") for name in env or {}):
        args.append("--insecure")
    for node in nodes:
        args += ["--storage", spec(node)]
    return cli(*args, *extra, expect=expect, env=env)


# ---- create, list, verify -----------------------------------------------------------------------


@pytest.mark.security
def test_the_cluster_key_is_printed_and_logged_by_its_fingerprint_only(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str, tmp_path: Path
) -> None:
    """create, list (text and JSON) and verify print the key's fingerprint, never the key, and so do
    the storage nodes' logs; --show-key is the one way to print the key itself."""
    nodes = [start_storage() for _ in range(2)]
    outputs = [create(cli, nodes, 2).output]
    key = str(ClusterZk(zk_client, zk_root).params().cluster_key)
    fingerprint = cluster_key_fingerprint(key)
    outputs += [cli("list").output, cli("list", "--json").output, cli("verify").output]
    outputs.append(cli("verify", "--json").output)
    logs = sorted(tmp_path.glob("storage-*.log"))
    assert len(logs) == 2
    for text in [*outputs, *(path.read_text() for path in logs)]:
        assert key not in text and key.upper() not in text
        assert key.replace("-", "") not in text
    assert all(fingerprint in text for text in [*outputs, *(path.read_text() for path in logs)])
    # The explicit way to the key: --show-key, in text and in JSON.
    assert key in cli("list", "--show-key").output
    assert cli.json("list", "--show-key")["cluster_key"] == key


def test_create_then_list_and_verify_pass(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str, tmp_path: Path
) -> None:
    nodes = [start_storage() for _ in range(3)]
    result = create(cli, nodes, 4)
    assert result.output.count("initialised, partitions 0-3") == 3, result.output

    cluster = ClusterZk(zk_client, zk_root)
    params = cluster.params()
    assert (params.name, params.num_partitions) == ("test", 4)
    assert cluster.assignments().value.replicas == {n.address: (0, 1, 2, 3) for n in nodes}
    assert cluster.connection().value.admin_ports == {n.address: n.admin_port for n in nodes}
    assert cluster.groups().value.groups == {n.address: 0 for n in nodes}
    for node in nodes:  # initialised with the cluster key, and holding every partition
        assert sorted(node_partitions(node, str(params.cluster_key), 4)) == [0, 1, 2, 3]

    listed = cli.json("list")
    assert listed["cluster_key_fingerprint"] == cluster_key_fingerprint(params.cluster_key)
    assert "cluster_key" not in listed
    assert [n["connect_string"] for n in listed["storage_nodes"]] == sorted(n.address for n in nodes)
    assert all(n["admin_port"] and n["partitions"] == [0, 1, 2, 3] for n in listed["storage_nodes"])
    assert [(p["generation"], p["session_id"]) for p in listed["partitions"]] == [(0, -1)] * 4
    text = cli("list").output
    assert f"cluster key: {cluster_key_fingerprint(params.cluster_key)}" in text
    assert len(lines_with(text, "no replica state yet")) == 12

    # Settings from the environment and from a YAML file work as well as the options.
    env = {"WALTZ_ZOOKEEPER_CONNECT_STRING": cli.zookeeper, "WALTZ_CLUSTER_ROOT": cli.root}
    from_env = cli.runner.invoke(app, ["cluster", "verify"], env=env)
    assert from_env.exit_code == 0, from_env.output
    config = tmp_path / "cluster.yaml"
    config.write_text(f"zookeeper:\n  connectString: {cli.zookeeper}\ncluster.root: {cli.root}\n")
    from_file = cli.runner.invoke(app, ["cluster", "verify", "--json", "--config", str(config)])
    assert from_file.exit_code == 0, from_file.output
    report = json.loads(from_file.stdout)
    assert report["passed"] is True
    acl_checks = {
        c["name"]: c["status"]
        for c in report["checks"]
        if c["name"].startswith("zookeeper: root") and c["name"] != "zookeeper: root's parents"
    }
    # Created without a credential: its znodes are open to anyone, a warning (not a failure).
    assert acl_checks == {
        "zookeeper: root and children ACLs": "WARNING",
        "zookeeper: root children": "PASSED",
    }
    storage_checks = [
        c for c in report["checks"] if not c["name"].startswith(("servers:", "zookeeper: root"))
    ]
    assert {c["status"] for c in storage_checks} == {"PASSED"}
    # 4 ZooKeeper checks, 3 per storage node, 3 per partition.
    assert len(storage_checks) == 4 + 3 * 3 + 3 * 4
    # No server runs yet: a warning, not a failure.
    assert [c["status"] for c in report["checks"] if c["name"].startswith("servers:")] == ["WARNING"]
    assert "3 of 3 replicas available, quorum 2" in from_file.stdout


def test_create_with_replicas_spreads_them_round_robin(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    a, b, c = (start_storage() for _ in range(3))
    create(cli, [a, b, c], 4, "--replicas", "2")
    assignments = ClusterZk(zk_client, zk_root).assignments().value
    assert assignments.replicas == {a.address: (0, 2, 3), b.address: (0, 1, 3), c.address: (1, 2)}
    key = str(ClusterZk(zk_client, zk_root).params().cluster_key)
    assert sorted(node_partitions(c, key, 4)) == [1, 2]
    cli("verify")


def test_create_writes_nothing_when_a_storage_node_is_unreachable(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    node = start_storage()
    missing = f"127.0.0.1:{free_port()}={free_port()}"
    args = ["create", "--name", "x", "--partitions", "2", "--storage", spec(node), "--storage", missing]
    result = cli(*args, "--insecure", expect=2)
    assert "unreachable" in result.output and "nothing was written to ZooKeeper" in result.output
    assert not ClusterZk(zk_client, zk_root).exists()


@pytest.mark.security
def test_create_without_a_credential_refuses_open_znodes_unless_told(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    node = start_storage()
    args = ["create", "--name", "x", "--partitions", "1", "--storage", spec(node)]
    refused = cli(*args, expect=2)
    assert "no ZooKeeper credential: the cluster's znodes would be open to anyone" in refused.output
    assert "--digest-dir DIR" in refused.output and "--insecure" in refused.output
    assert "Nothing was written" in refused.output
    assert not ClusterZk(zk_client, zk_root).exists()
    created = cli(*args, "--insecure", expect=0)
    assert "warning: --insecure: the cluster's znodes are open to anyone" in created.output
    assert ClusterZk(zk_client, zk_root).exists()


def test_node_of_another_cluster_is_reported_by_create_and_fails_verify(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    a, b, foreign = (start_storage() for _ in range(3))

    async def join_other_cluster() -> None:
        async with StorageAdminClient(foreign.admin_address, str(uuid.uuid4()), 4):
            pass

    run(join_other_cluster())
    result = create(cli, [a, b, foreign], 4, expect=1)
    failed = lines_with(result.output, foreign.address, "FAILED")
    assert len(failed) == 1 and "CLUSTER_KEY_MISMATCH" in failed[0], result.output
    assert len(lines_with(result.output, "initialised")) == 2
    # The znodes stay, and the fix is spelled out.
    assert ClusterZk(zk_client, zk_root).exists()
    assert f"waltz cluster storage assign {foreign.address} --partition 0-3" in result.output

    verify = cli("verify", expect=1)
    assert lines_with(verify.output, "PASSED", f"storage {foreign.address}: reachable")
    key_check = lines_with(verify.output, f"storage {foreign.address}: cluster key and partition count")
    assert len(key_check) == 1 and key_check[0].startswith("FAILED"), verify.output
    assert len(lines_with(verify.output, "PASSED", "quorum of replicas available", "2 of 3")) == 4


def test_stopped_node_fails_connectivity_but_quorum_passes(cli: Cli, start_storage: StartStorage) -> None:
    nodes = [start_storage() for _ in range(3)]
    create(cli, nodes, 2)
    nodes[2].kill()
    result = cli("verify", expect=1)
    reachable = lines_with(result.output, f"storage {nodes[2].address}: reachable")
    assert len(reachable) == 1 and reachable[0].startswith("FAILED"), result.output
    assert "unreachable" in reachable[0]
    quorum = lines_with(result.output, "quorum of replicas available")
    assert len(quorum) == 2 and all(line.startswith("PASSED") for line in quorum), result.output
    assert "unavailable: " + nodes[2].address in quorum[0]
    failed = [line for line in result.output.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1, result.output  # nothing else is blamed on the stopped node

    nodes[1].kill()  # now 1 of 3: no quorum
    result = cli("verify", expect=1)
    quorum = lines_with(result.output, "quorum of replicas available")
    assert all(line.startswith("FAILED") and "1 of 3" in line for line in quorum), result.output


def test_verify_reports_corrupt_records_and_replicas_behind_zookeeper(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    node = start_storage()
    create(cli, [node], 2)
    cluster = ClusterZk(zk_client, zk_root)
    key = str(cluster.params().cluster_key)

    async def write() -> None:
        async with StorageSessionClient(node.address, key, 2, 1) as session:
            await session.append(0, [Record.create(t, ReqId(1, 2, 0, t), 0, b"x" * 50) for t in range(20)])

    run(write())
    node.stop()
    data_file = node.directory / "0" / fmt.segment_file_name(0, fmt.SEGMENT_SUFFIX)
    raw = bytearray(data_file.read_bytes())
    offsets = {r.transaction_id: o for o, r in fmt.iter_records(bytes(raw), fmt.HEADER_SIZE)}
    raw[offsets[12] + fmt.RECORD_HEADER_SIZE - 2] ^= 0xFF  # transaction 12's data CRC
    data_file.write_bytes(bytes(raw))
    node.start()
    # ZooKeeper says the replica of partition 1 took part in session 5; the node never saw it.
    current = cluster.partition_metadata(1)
    cluster.set_partition_metadata(
        1, PartitionMetadata(1, 5, {node.address: ReplicaState(5, None)}), current.version
    )

    result = cli("verify", expect=1)
    corrupt = lines_with(result.output, "partition 0: no corrupt records")
    assert corrupt[0].startswith("FAILED") and "transaction 12" in corrupt[0], result.output
    behind = lines_with(result.output, "partition 1: replica sessions consistent with ZooKeeper")
    assert behind[0].startswith("WARNING") and "restored from a backup" in behind[0], result.output
    assert lines_with(result.output, "PASSED", "partition 1: no corrupt records")


# ---- replica changes and their safety rules -------------------------------------------------------


def set_metadata(
    cluster: ClusterZk, partition_id: int, session_id: int, states: dict[str, ReplicaState]
) -> None:
    current = cluster.partition_metadata(partition_id)
    cluster.set_partition_metadata(partition_id, PartitionMetadata(1, session_id, states), current.version)


def test_assign_and_unassign_follow_the_safety_rules(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    a, b, c = (start_storage() for _ in range(3))
    create(cli, [a, b, c], 2, "--replicas", "2")  # partition 0: a, b; partition 1: b, c
    cluster = ClusterZk(zk_client, zk_root)
    key = str(cluster.params().cluster_key)

    def holders(partition_id: int) -> list[str]:
        return cluster.assignments().value.storages_of(partition_id)

    # Partition 0: a and b took part in the current session 3: both caught up.
    set_metadata(cluster, 0, 3, {a.address: ReplicaState(3), b.address: ReplicaState(3)})
    # Partition 1: c's session 4 closed at 17 while the current one is 5: c is behind.
    set_metadata(cluster, 1, 5, {b.address: ReplicaState(5), c.address: ReplicaState(4, 17)})
    # The listing tells a replica of the current session from one whose session closed, and from
    # one of an earlier session whose closing mark no recovery has set (for the listing only:
    # partition 0 with c in its session 2, then as it was).
    text = cli("list").output
    assert len(lines_with(text, "session 3, the current store session")) == 2, text
    assert lines_with(text, "session 4, closing high-water mark 17"), text
    assert "UNRESOLVED" not in text, text
    states = {a.address: ReplicaState(3), b.address: ReplicaState(3)}
    set_metadata(cluster, 0, 3, {**states, c.address: ReplicaState(2)})
    assert lines_with(cli("list").output, "session 2, closing high-water mark UNRESOLVED")
    set_metadata(cluster, 0, 3, states)

    result = cli("storage", "assign", c.address, "--partition", "0")
    assert "assigned partitions 0" in result.output
    assert holders(0) == sorted([a.address, b.address, c.address])
    assert 0 in node_partitions(c, key, 2)

    # One new replica at a time: c has not caught up on partition 1, so a may not join it.
    version = cluster.assignments().version
    refused = cli("storage", "assign", a.address, "--partition", "1", expect=1)
    assert "not caught up" in refused.output and c.address in refused.output, refused.output
    assert cluster.assignments().version == version
    assert 1 not in node_partitions(a, key, 2)  # the node was not touched either

    # Keep a quorum: partition 0 without a would have b (caught up) and c (new, not yet): 1 < 2.
    refused = cli("storage", "unassign", a.address, "--partition", "0", expect=1)
    assert "fewer than their quorum 2" in refused.output, refused.output
    assert a.address in holders(0)

    # --force overrides, loudly.
    forced = cli("storage", "assign", a.address, "--partition", "1", "--force")
    assert "WARNING: FORCED" in forced.stderr, forced.output
    assert a.address in holders(1) and 1 in node_partitions(a, key, 2)

    # The servers catch c up on partition 0 (a new session with every replica clean).
    set_metadata(cluster, 0, 4, {s: ReplicaState(4) for s in (a.address, b.address, c.address)})
    cli("storage", "unassign", a.address, "--partition", "0")
    assert holders(0) == sorted([b.address, c.address])
    assert 0 not in node_partitions(a, key, 2)
    cli("storage", "unassign", b.address, "--partition", "0")
    refused = cli("storage", "unassign", c.address, "--partition", "0", expect=1)
    assert "only replica" in refused.output
    assert holders(0) == [c.address]

    # A node holding replicas cannot be removed; an unknown one is reported.
    refused = cli("storage", "remove", b.address, expect=2)
    assert "still holds replicas of partitions 1" in refused.output
    unknown = cli("storage", "assign", f"127.0.0.1:{free_port()}", "--partition", "0", expect=2)
    assert "not in the cluster" in unknown.output and "waltz cluster storage add" in unknown.output
    cli("storage", "assign", c.address, "--partition", "7", expect=2)
    # An unassign from a node not in the cluster (a typo) changes nothing and says so, where it
    # said ZooKeeper was updated and the node still held the partitions.
    version = cluster.assignments().version
    stranger = f"127.0.0.1:{free_port()}"
    typo = cli("storage", "unassign", stranger, "--partition", "1", expect=2)
    assert f"storage node {stranger} is not in the cluster under {zk_root}" in typo.output, typo.output
    assert "waltz cluster list" in typo.output, typo.output
    assert "ZooKeeper is updated" not in typo.output and "still holds" not in typo.output, typo.output
    assert cluster.assignments().version == version


def test_unassign_from_a_stopped_node_updates_zookeeper_and_says_the_node_keeps_files(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    nodes = [start_storage() for _ in range(3)]
    create(cli, nodes, 1)
    nodes[2].kill()
    result = cli("storage", "unassign", nodes[2].address, "--partition", "0", expect=1)
    assert "still holds the partitions" in result.output and "rerun" in result.output
    assert ClusterZk(zk_client, zk_root).assignments().value.storages_of(0) == sorted(
        n.address for n in nodes[:2]
    )
    nodes[2].start()
    # In-process only: gRPC's global subchannel pool remembers the refused connection and fails
    # fast for about a second of backoff (a `waltz` process starts afresh), so poll.

    def unassign_succeeds() -> Result | None:
        result = cli("storage", "unassign", nodes[2].address, "--partition", "0", expect=None)
        return result if result.exit_code == 0 else None

    rerun = wait_until(
        unassign_succeeds, timeout=10, what="the restarted storage node to accept the unassign"
    )
    assert "already unassigned: 0" in rerun.output
    assert 0 not in node_partitions(nodes[2], str(ClusterZk(zk_client, zk_root).params().cluster_key), 1)
    cli("verify")


def test_storage_add_auto_assign_and_remove(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    a, b, c, d = (start_storage() for _ in range(4))
    create(cli, [a, b], 2)
    cluster = ClusterZk(zk_client, zk_root)
    key = str(cluster.params().cluster_key)
    cli("storage", "add", c.address, "--admin-port", str(c.admin_port), "--group", "1")
    cli("storage", "add", d.address, "--admin-port", str(d.admin_port), "--group", "1")
    again = cli("storage", "add", d.address, "--admin-port", str(d.admin_port), expect=2)
    assert "already in the cluster" in again.output
    listed = {n["connect_string"]: n for n in cli.json("list")["storage_nodes"]}
    assert listed[c.address] == {
        "connect_string": c.address,
        "admin_port": c.admin_port,
        "group": 1,
        "partitions": [],
    }
    assert node_partitions(c, key, 2) == {}  # initialised for the cluster, no partition yet

    # Partition 0 has a store session (a, b caught up): one new replica at a time, the group's
    # first node (by connect string) first. Partition 1 never had one: both at once.
    first, second = sorted([c, d], key=lambda n: n.address)
    set_metadata(cluster, 0, 2, {a.address: ReplicaState(2), b.address: ReplicaState(2)})
    result = cli("storage", "auto-assign", "--group", "1")
    assert f"storage {first.address}: assigned partitions 0-1" in result.output, result.output
    assert f"storage {second.address}: assigned partitions 1" in result.output
    pending = lines_with(result.output, "pending: partition 0", second.address)
    assert len(pending) == 1, result.output
    assert cluster.assignments().value.storages_of(0) == sorted([a.address, b.address, first.address])
    assert sorted(node_partitions(second, key, 2)) == [1]

    # The first new replica catches up; the rerun assigns the second.
    set_metadata(cluster, 0, 3, {s: ReplicaState(3) for s in (a.address, b.address, first.address)})
    result = cli("storage", "auto-assign", "--group", "1")
    assert f"storage {second.address}: assigned partitions 0" in result.output
    assert "pending" not in result.output
    done = cli("storage", "auto-assign", "--group", "1")
    assert "already holds every partition" in done.output
    cli("verify")

    cli("storage", "unassign", d.address, "--partition", "0-1")
    cli("storage", "remove", d.address)
    assert d.address not in cluster.connection().value.admin_ports
    assert d.address not in cluster.groups().value.groups
    assert d.address not in cluster.assignments().value.replicas
    cli("storage", "auto-assign", "--group", "5", expect=2)


def test_availability_and_max_transaction_id(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    node = start_storage()
    create(cli, [node], 2)
    key = str(ClusterZk(zk_client, zk_root).params().cluster_key)

    async def write() -> None:
        async with StorageSessionClient(node.address, key, 2, 1) as session:
            await session.append(1, [Record.create(t, ReqId(1, 2, 0, t), 0, b"y") for t in range(3)])

    run(write())
    result = cli("storage", "max-transaction-id", node.address, "--partition", "0,1")
    assert lines_with(result.output, "partition 0: -1") and lines_with(result.output, "partition 1: 2")

    cli("storage", "availability", node.address, "-p", "1", "--no-writable")
    status = node_partitions(node, key, 2)
    assert (status[1].readable, status[1].writable) == (True, False)
    assert status[0].writable
    cli("storage", "availability", node.address, "-p", "1", "--writable", "--no-readable")
    status = node_partitions(node, key, 2)
    assert (status[1].readable, status[1].writable) == (False, True)
    cli("storage", "availability", node.address, "-p", "1", expect=2)  # neither switch


def test_set_fence_puts_a_poisoned_fence_back_after_confirmation_and_is_audited(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    node = start_storage()
    create(cli, [node], 2)
    cluster = ClusterZk(zk_client, zk_root)
    key = str(cluster.params().cluster_key)
    set_metadata(cluster, 0, 3, {node.address: ReplicaState(3, None)})  # ZooKeeper: session 3
    poisoned = 3 + (1 << 32)  # a forged session ID, as far as one request may raise the fence

    async def poison() -> None:
        async with StorageSessionClient(node.address, key, 2, 3) as real:
            await real.append(0, [Record.create(t, ReqId(1, 2, 0, t), 0, b"z") for t in range(4)])
        async with StorageSessionClient(node.address, key, 2, poisoned) as forged:
            await forged.open_session(0)

    async def next_session_opens() -> bool:
        async with StorageSessionClient(node.address, key, 2, 4) as real:
            try:
                await real.open_session(0)
            except StorageRpcError as exc:
                assert exc.code == "SESSION_FENCED", exc
                return False
            return True

    run(poison())
    assert not run(next_session_opens())
    verify = cli("verify", expect=None)
    (line,) = lines_with(verify.output, "partition 0: replica sessions consistent with ZooKeeper")
    assert line.startswith("WARNING") and f"fences the partition at session {poisoned}" in line, line
    assert f"set-fence {node.address} --partition 0" in line
    # Below ZooKeeper's session ID: refused without --force, nothing asked, nothing changed.
    result = cli("storage", "set-fence", node.address, "-p", "0", "--to", "1", "--yes", expect=1)
    assert "below ZooKeeper's store session ID 3" in result.output and "--force" in result.output
    # Declined at the confirmation: nothing changed.
    result = cli("storage", "set-fence", node.address, "-p", "0", input="n\n", expect=1)
    assert f"fence {poisoned} -> 3" in result.output
    assert node_partitions(node, key, 2)[0].session_id == poisoned
    result = cli("storage", "set-fence", node.address, "-p", "0", "--reason", "forged ID", input="y\n")
    assert f"fence set {poisoned} -> 3" in result.output
    assert node_partitions(node, key, 2)[0].session_id == 3
    verify = cli("verify", expect=None)
    (line,) = lines_with(verify.output, "partition 0: replica sessions consistent with ZooKeeper")
    assert "fences the partition" not in line, line
    assert run(next_session_opens())
    assert node_partitions(node, key, 2)[0].max_transaction_id == 3
    # Session 4 was never taken in ZooKeeper: the default value is ZooKeeper's, 3.
    result = cli("storage", "set-fence", node.address, "-p", "0", "--yes")
    assert "fence set 4 -> 3" in result.output
    result = cli("storage", "set-fence", node.address, "-p", "0", "--yes")
    assert "the fence is already 3" in result.output
    # Above ZooKeeper's session ID needs --force as well; with it, it is done.
    cli("storage", "set-fence", node.address, "-p", "1", "--to", "9", "--yes", expect=1)
    cli("storage", "set-fence", node.address, "-p", "1", "--to", "9", "--yes", "--force")
    assert node_partitions(node, key, 2)[1].session_id == 9
    log_path = node.process.log_path
    assert log_path is not None
    audit = [line for line in log_path.read_text().splitlines() if "AUDIT set-fence" in line]
    assert len(audit) == 3, audit  # nothing sent when the fence already was the value
    assert " WARNING " in audit[0] and f"partition 0 fence {poisoned} -> 3" in audit[0]
    assert "'forged ID'" in audit[0] and "@" in audit[0]  # the operator's user@host
    assert "partition 0 fence 4 -> 3" in audit[1]
    assert "partition 1 fence -1 -> 9" in audit[2]


@pytest.mark.security
def test_truncate_committed_shows_what_goes_asks_and_needs_an_admin_certificate(
    cli: Cli, zk_client: KazooClient, zk_root: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``truncate-committed`` on a node with mutual TLS: an operator certificate is refused by the
    node, a declined confirmation changes nothing, and the admin's truncation is audited."""
    files = make_cluster_certificates(tmp_path / "tls")
    node = LocalStorageNode(
        tmp_path / "storage-tls",
        name="storage-tls",
        log_path=tmp_path / "storage-tls.log",
        env=files.storage_env(),
    )
    support.add_failure_logs(request.node, "storage-tls log", node.process.log_tail)

    def as_role(role: str) -> dict[str, str]:
        return {
            "WALTZ_CLUSTER_SSL_CA_FILE": str(files.ca_file),
            "WALTZ_CLUSTER_SSL_CERT_FILE": str(files.cert_file(role)),
            "WALTZ_CLUSTER_SSL_KEY_FILE": str(files.key_file(role)),
        }

    try:
        node.start()
        create(cli, [node], 2, env=as_role("admin"))
        key = str(ClusterZk(zk_client, zk_root).params().cluster_key)
        admin_tls = files.tls("admin")

        async def commit() -> None:
            async with StorageSessionClient(node.address, key, 2, 1, tls=files.tls("node")) as session:
                await session.append(0, [Record.create(t, ReqId(1, 2, 0, t), 0, b"c") for t in range(10)])
            async with StorageSessionClient(node.address, key, 2, 2, tls=files.tls("node")) as session:
                await session.set_low_water_mark(0, 9)

        async def status() -> tuple[int, int]:
            async with StorageAdminClient(node.admin_address, key, 2, tls=admin_tls) as admin:
                (partition,) = (await admin.partition_status(0)).partitions
                return partition.max_transaction_id, partition.low_water_mark

        run(commit())
        command = ("storage", "truncate-committed", node.address, "-p", "0", "--to", "4")
        refused = cli(*command, "--yes", env=as_role("operator"), expect=2)
        assert (
            "truncate_below_committed needs a certificate with the role urn:waltz:role:admin"
            in refused.output
        )
        declined = cli(*command, input="n\n", env=as_role("admin"), expect=1)
        assert (
            "truncate from transaction 9 to 4, 5 removed: 5 at or below the low-water mark, committed "
            "(low-water mark 9 -> 4)" in declined.output
        )
        assert run(status()) == (9, 9)
        done = cli(*command, "--reason", "poison at 5", input="y\n", env=as_role("admin"))
        assert "truncated from transaction 9 to 4, low-water mark 9 -> 4" in done.output
        assert run(status()) == (4, 4)
        again = cli(*command, "--yes", env=as_role("admin"))
        assert "nothing to remove" in again.output
    finally:
        node.close()
    log_path = node.process.log_path
    assert log_path is not None
    audit = [line for line in log_path.read_text().splitlines() if "AUDIT truncate-below-committed" in line]
    assert len(audit) == 1, audit
    assert "partition 0 truncated from transaction 9 to 4" in audit[0] and "CN=waltz-admin" in audit[0]
    assert "'poison at 5'" in audit[0] and "@" in audit[0]  # the operator's user@host


# ---- delete ----------------------------------------------------------------------------------------


def test_delete_asks_for_confirmation_and_can_unassign_storage(
    cli: Cli, start_storage: StartStorage, zk_client: KazooClient, zk_root: str
) -> None:
    nodes = [start_storage() for _ in range(2)]
    create(cli, nodes, 3)
    cluster = ClusterZk(zk_client, zk_root)
    key = str(cluster.params().cluster_key)

    declined = cli("delete", input="n\n", expect=1)
    assert "Delete cluster 'test' (3 partitions)" in declined.output
    assert cluster.exists()
    # A root that holds more than a cluster (a wrong --root) is never wiped.
    zk_client.create(f"{zk_root}/other-cluster/cluster", b"{}", makepath=True)
    refused = cli("delete", "--yes", expect=2)
    assert "refusing to delete" in refused.output and "other-cluster" in refused.output
    assert cluster.exists()
    zk_client.delete(f"{zk_root}/other-cluster", recursive=True)

    cli("delete", "--unassign-storage", input="y\n")
    assert not zk_client.exists(zk_root)
    for node in nodes:
        assert node_partitions(node, key, 3) == {}  # the node keeps its cluster key only

    missing = cli("list", expect=2)
    assert "no cluster under" in missing.output
    create(cli, nodes[:1], 3, expect=1)  # the old key is still on the node: refused, clearly
    cli("delete", "--yes")


# ---- configuration and connection errors --------------------------------------------------------


def test_missing_settings_and_unreachable_zookeeper_exit_with_2(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["cluster", "list"], env={"WALTZ_ZOOKEEPER_CONNECT_STRING": None})
    assert result.exit_code == 2
    assert "missing the ZooKeeper connect string" in result.output and "--zookeeper" in result.output

    nobody = f"127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["cluster", "verify", "-z", nobody, "-r", "/w", "--timeout", "0.5"])
    assert result.exit_code == 2
    assert f"no ZooKeeper server at {nobody} answered within 0.5s" in result.output

    config = tmp_path / "bad.yaml"
    config.write_text("zookeeper.connectStrin: x\n")
    result = runner.invoke(app, ["cluster", "list", "--config", str(config)])
    assert result.exit_code == 2 and "unknown keys" in result.output

    result = runner.invoke(app, ["cluster", "list", "-z", nobody, "-r", "relative/root"])
    assert result.exit_code == 2 and "absolute znode path" in result.output
    result = runner.invoke(app, ["cluster", "list", "-z", nobody, "-r", "/"])
    assert result.exit_code == 2 and "is ZooKeeper's own root" in result.output
    result = runner.invoke(
        app, ["cluster", "create", "-n", "x", "--partitions", "1", "-s", "nonsense", "-z", nobody, "-r", "/w"]
    )
    assert result.exit_code == 2 and "host:port=admin_port" in result.output


def test_the_truncation_plan_says_which_removed_transactions_are_committed_for_sure() -> None:
    """A node's low-water mark (9) follows the committed high-water mark a few seconds behind: of
    the 8 transactions a truncation to 4 removes from a replica holding 12, the 5 up to the mark are
    committed, and the 3 above it may be too (before, the plan said "5 of them committed", as if the
    3 were not)."""
    from waltz.admin.committed_truncation import ReplicaLog
    from waltz.cli.cluster_storage import _truncation_plan

    lagging = _truncation_plan(ReplicaLog("127.0.0.1:1", 0, 12, 9, 0), 4)
    assert lagging == (
        "truncate from transaction 12 to 4, 8 removed: 5 at or below the low-water mark, committed; "
        "the 3 above it may be committed too (a node's low-water mark follows the committed high-water "
        "mark a few seconds behind) (low-water mark 9 -> 4)"
    )
    above_only = _truncation_plan(ReplicaLog("127.0.0.1:1", 0, 12, 9, 0), 10)
    assert above_only.startswith(
        "truncate from transaction 12 to 10, 2 removed: 0 at or below the low-water mark"
    )
    assert "the 2 above it may be committed too" in above_only
