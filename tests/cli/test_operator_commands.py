"""``waltz client``, ``waltz server list|preferred`` and ``waltz storage list|sync-partitions``
against one real local cluster shared by the module (docs/operations.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import support
from typer.testing import CliRunner, Result

from waltz.cli.main import app
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER, ChangeSet
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions
from waltz.protocol.records import Record, ReqId
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.storage_client import StorageAdminClient


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    with LocalCluster(
        security=support.PLAINTEXT,
        storages=3,
        replicas=2,
        servers=1,
        partitions=2,
        processes=ProcessOptions(metrics=True),
        name="operator-commands",
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path_factory.mktemp("operator-commands-cluster"),
        delete_root=True,
    ) as local:
        yield local


@pytest.fixture
def healthy(request: pytest.FixtureRequest, cluster: LocalCluster) -> LocalCluster:
    return support.healed_cluster(request, cluster)


def waltz(cluster: LocalCluster, *args: str, expect: int | None = 0, input: str | None = None) -> Result:
    where = ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    result = CliRunner().invoke(app, [*args, *where], input=input)
    if expect is not None:
        assert result.exit_code == expect, f"exit code {result.exit_code}:\n{result.output}"
    return result


def waltz_json(cluster: LocalCluster, *args: str, expect: int = 0) -> Any:
    return json.loads(waltz(cluster, *args, "--json", expect=expect).stdout)


def test_validate_passes_on_a_healthy_cluster(healthy: LocalCluster) -> None:
    report = waltz_json(
        healthy, "client", "validate", "--producers", "2", "--transactions", "15", "--partition", "0"
    )
    assert report["passed"] is True and report["committed"] == 30
    first, last = report["checked"]["0"]["first"], report["checked"]["0"]["last"]
    assert last - first + 1 == 30 and report["mismatches"] == []
    marks = waltz_json(healthy, "client", "high-water-mark")["high_water_marks"]
    assert marks["0"] == last and set(marks) == {"0", "1"}


def test_validate_fails_naming_a_transaction_whose_data_is_not_its_id(healthy: LocalCluster) -> None:
    async def forge() -> list[int | str]:
        async with ServerAdminClient(healthy.owner(1), timeout=20) as client:
            return await client.append(1, [(ReqId(99, 1, 1, 0), 0, b"forged")])

    (forged,) = asyncio.run(forge())
    assert isinstance(forged, int)
    result = waltz(
        healthy, "client", "validate", "--transactions", "5", "--partition", "1", "--since", "-1", expect=1
    )
    assert f"partition 1 transaction {forged}: data b'forged' is not its transaction ID" in result.stdout
    assert "FAILED" in result.stdout
    # Only this run's transactions (the default) pass: the lock kept them serializable.
    waltz(healthy, "client", "validate", "--transactions", "5", "--partition", "1")


def test_validate_reads_back_its_older_form_and_writes_change_sets(healthy: LocalCluster) -> None:
    """A log validated by an earlier release holds header-0 transactions whose data is their ID
    in ASCII digits: they are still read back as validation transactions. This release's carry
    the number in an empty change-set's meta, which the SQL framework applies as changing nothing."""
    before = waltz_json(healthy, "client", "high-water-mark")["high_water_marks"]["0"]

    async def append_older_form() -> list[int | str]:
        async with ServerAdminClient(healthy.owner(0), timeout=20) as client:
            return await client.append(0, [(ReqId(98, 1, 0, 0), 0, str(before + 1).encode())])

    assert asyncio.run(append_older_form()) == [before + 1]
    report = waltz_json(
        healthy,
        "client",
        "validate",
        "--producers",
        "1",
        "-n",
        "3",
        "--partition",
        "0",
        "--since",
        str(before),
    )
    assert report["passed"] is True, report
    assert report["checked"]["0"] == {"first": before + 1, "last": before + 4}

    async def read_new_form() -> list[Record]:
        async with ServerAdminClient(healthy.owner(0), timeout=20) as admin:
            return await admin.read(0, before + 2, 1)

    (record,) = asyncio.run(read_new_form())
    assert record.header == CHANGE_SET_HEADER
    assert ChangeSet.decode(record.data) == ChangeSet([], meta={"waltz_validate": before + 2})


def test_server_list_shows_partitions_generations_and_health(healthy: LocalCluster) -> None:
    (server,) = waltz_json(healthy, "server", "list")["servers"]
    assert server["endpoint"] == healthy.servers[0].endpoint
    assert server["name"] == "server-0", "the name waltz up and LocalCluster give it"
    assert server["cluster_manager"] is True and server["health"] == "healthy"
    assert [p["partition_id"] for p in server["partitions"]] == [0, 1]
    assert all(p["writable"] and p["generation"] >= 1 for p in server["partitions"])
    text = waltz(healthy, "server", "list").stdout
    assert (
        text.startswith(
            f"server-0: {server['endpoint']}, {server['member']} (server ID {server['server_id']})"
        )
        and ", cluster manager, health: healthy" in text
        and "partition 1: generation" in text
    )
    added = waltz(healthy, "server", "preferred", "add", "server-0", "--partition", "1")
    assert "note:" not in added.output, added.output
    (server,) = waltz_json(healthy, "server", "list")["servers"]
    assert server["preferred_partitions"] == [1] and server["configured_preferred_partitions"] == []
    result = waltz(healthy, "server", "preferred", "add", "member-9999", "-p", "0", expect=2)
    assert "no live server is 'member-9999'" in result.output
    # An endpoint no live server has is kept for when one joins, and said so.
    absent = waltz(healthy, "server", "preferred", "add", "127.0.0.1:1", "-p", "0")
    assert "note: no live server has the endpoint 127.0.0.1:1 now" in absent.output, absent.output
    waltz(healthy, "server", "preferred", "remove", "127.0.0.1:1", "-p", "0")


def test_storage_list_and_sync_partitions(healthy: LocalCluster) -> None:
    nodes = {n["storage"]: n for n in waltz_json(healthy, "storage", "list")["storage_nodes"]}
    assert set(nodes) == {s.address for s in healthy.storages}
    for node in nodes.values():
        assert [p["partition_id"] for p in node["partitions"]] == node["assigned"]
        assert node["missing"] == []
        for p in node["partitions"]:  # nothing archived, nothing deleted
            assert (p["local_start"], p["archived_through"], p["retention_policy"]) == (0, -1, "never")
    text = waltz(healthy, "storage", "list").stdout
    assert ", local start 0, archived through -1" in text, text
    # A node holding a partition ZooKeeper does not assign it: sync-partitions removes it.
    storage, node = next((s, n) for s, n in nodes.items() if len(n["assigned"]) < 2)
    extra = next(p for p in (0, 1) if p not in node["assigned"])
    admin_address = node["admin_address"]

    async def create_extra() -> None:
        async with StorageAdminClient(admin_address, healthy.cluster_key, 2) as admin:
            await admin.assign_partition(extra, True)

    asyncio.run(create_extra())
    listed = waltz_json(healthy, "storage", "list", storage)["storage_nodes"][0]
    assert any(p["partition_id"] == extra and not p["assigned_in_zookeeper"] for p in listed["partitions"])
    dry = waltz(healthy, "storage", "sync-partitions", storage)
    assert f"remove partitions {extra}" in dry.stdout and "dry run: nothing changed" in dry.stdout
    waltz(healthy, "storage", "sync-partitions", storage, "--apply", input="n\n", expect=1)
    assert extra in {
        p["partition_id"]
        for p in waltz_json(healthy, "storage", "list", storage)["storage_nodes"][0]["partitions"]
    }
    waltz(healthy, "storage", "sync-partitions", storage, "--apply", "--yes")
    listed = waltz_json(healthy, "storage", "list", storage)["storage_nodes"][0]
    assert [p["partition_id"] for p in listed["partitions"]] == listed["assigned"]
    assert "in line with ZooKeeper" in waltz(healthy, "storage", "sync-partitions", storage).stdout


def test_check_connectivity_reports_a_stopped_storage_node(healthy: LocalCluster) -> None:
    report = waltz_json(healthy, "client", "check-connectivity")
    assert report["ok"] is True
    assert {n["kind"] for n in report["nodes"]} == {"server", "storage", "storage-admin"}
    assert len(report["nodes"]) == 1 + 2 * 3
    stopped = healthy.storages[2]
    healthy.kill_storage(2)
    try:
        result = waltz(healthy, "client", "check-connectivity", "--timeout", "2", expect=1)
        failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
        assert failed and all(stopped.address in line for line in failed), result.stdout
        assert f"OK      storage       {healthy.storages[0].address}" in result.stdout
        listing = waltz(healthy, "storage", "list", "--timeout", "2", expect=1)
        assert f"{stopped.address}: ERROR:" in listing.stdout
    finally:
        healthy.restart_storage(2)


def test_an_unreachable_zookeeper_is_a_clear_error() -> None:
    result = CliRunner().invoke(
        app, ["server", "list", "--zookeeper", "127.0.0.1:1", "--root", "/nowhere", "--timeout", "1"]
    )
    assert result.exit_code == 2 and "no ZooKeeper server at 127.0.0.1:1" in result.output


@pytest.mark.slow
def test_validate_local_starts_its_own_cluster() -> None:
    result = CliRunner().invoke(app, ["client", "validate", "--local", "--transactions", "10", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["passed"] is True


def test_a_server_is_headed_by_its_name_and_endpoint_or_by_its_endpoint_alone() -> None:
    from waltz.admin.servers import ServerInfo

    def info(name: str) -> ServerInfo:
        return ServerInfo(
            "member-0000000001", 1, "10.0.0.5:55290", (), (), {}, None, {}, None, None, name=name
        )

    assert info("server-a").heading == "server-a: 10.0.0.5:55290"
    assert info("10.0.0.5:55290").heading == "10.0.0.5:55290"  # unnamed: the listing names it by endpoint
    assert info("").heading == "10.0.0.5:55290"
