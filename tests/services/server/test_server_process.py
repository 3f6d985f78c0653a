"""Servers as processes: partitions placed by the cluster manager, failover, fencing of a paused owner."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import support
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, SessionExpiredError
from support.storage import run

from tests.services.server.conftest import StoreCluster, make_store_cluster
from waltz.chaos.proxy import FaultProxy
from waltz.local.nodes import LocalServer
from waltz.local.options import DEFAULT_SERVER_ENV
from waltz.local.processes import wait_until
from waltz.metadata.assignment import read_assignment
from waltz.protocol.records import Record, ReqId
from waltz.protocol.server_client import ServerAdminClient

SESSION_TIMEOUT = 3.0


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, zk_client: KazooClient, zk_root: str
) -> Iterator[StoreCluster]:
    yield from make_store_cluster(request, tmp_path, zk_client, zk_root, partitions=1)


def _server(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    zookeeper: object,
    zk_root: str,
    name: str,
    env: dict[str, str],
) -> LocalServer:
    """A server process of the test (not started), its log shown when the test fails."""
    server = LocalServer(
        zookeeper.connect_string,  # type: ignore[attr-defined]
        zk_root,
        name=name,
        log_path=tmp_path / f"{name}.log",
        session_timeout=SESSION_TIMEOUT,
        env=env,
        insecure=True,
    )
    support.add_failure_logs(request.node, f"{name} log", server.process.log_tail)
    return server


@pytest.fixture
def start_server(
    request: pytest.FixtureRequest, tmp_path: Path, zookeeper: object, zk_root: str
) -> Iterator[Callable[[], LocalServer]]:
    servers: list[LocalServer] = []

    def start() -> LocalServer:
        server = _server(
            request, tmp_path, zookeeper, zk_root, f"server-{len(servers)}", dict(DEFAULT_SERVER_ENV)
        )
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.close()


def owner(cluster: StoreCluster, partition_id: int = 0) -> tuple[str | None, int]:
    assignment, _ = read_assignment(cluster.zk.zk, cluster.zk.paths)
    placement = assignment.placements.get(partition_id)
    return (placement.endpoint, placement.generation) if placement else (None, 0)


def payload(i: int) -> bytes:
    return f"record {i}".encode() * 10


async def append_via_owner(cluster: StoreCluster, seq: int, timeout: float = 10) -> int | None:
    """Append one transaction through the partition's current owner; None when it failed."""
    endpoint, generation = owner(cluster)
    if endpoint is None:
        return None
    async with ServerAdminClient(endpoint, timeout=timeout) as client:
        try:
            (outcome,) = await client.append(0, [(ReqId(5, generation, 0, seq), 0, payload(seq))])
        except grpc.aio.AioRpcError:
            return None
    return outcome if isinstance(outcome, int) else None


async def wait_writable_owner(
    cluster: StoreCluster, exclude: str | None = None, timeout: float = 30.0
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            endpoint, _ = owner(cluster)
        except (ConnectionLoss, SessionExpiredError):
            # The test's own ZooKeeper session was lost while ZooKeeper was down (a test that
            # stops and starts it): kazoo opens a new one; read again.
            await asyncio.sleep(0.1)
            continue
        if endpoint is not None and endpoint != exclude:
            try:
                async with ServerAdminClient(endpoint, timeout=2) as client:
                    status = await client.status()
                if any(p.partition_id == 0 and p.writable for p in status.partitions):
                    return endpoint
            except grpc.aio.AioRpcError:
                pass
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no writable owner of partition 0 (other than {exclude}) within {timeout}s")


async def log_of(cluster: StoreCluster) -> list[Record]:
    endpoint = await wait_writable_owner(cluster)
    async with ServerAdminClient(endpoint) as client:
        records: list[Record] = []
        while True:
            page = await client.read(0, len(records), 1000)
            if not page:
                return records
            records.extend(page)


def check(records: list[Record], acknowledged: dict[int, int]) -> None:
    assert [r.transaction_id for r in records] == list(range(len(records)))
    seqs = [r.req_id.seq_num for r in records]
    assert len(seqs) == len(set(seqs)), "a transaction is in the log twice"
    for seq, txn in acknowledged.items():
        assert records[txn].req_id.seq_num == seq and records[txn].data == payload(seq)


def test_kill_9_of_the_owner_moves_the_partition(
    cluster: StoreCluster, start_server: Callable[[], LocalServer]
) -> None:
    servers = [start_server(), start_server()]

    async def scenario() -> None:
        first = await wait_writable_owner(cluster)
        _, generation = owner(cluster)
        acknowledged: dict[int, int] = {}
        for seq in range(50):
            txn = await append_via_owner(cluster, seq)
            assert txn is not None
            acknowledged[seq] = txn
        victim = next(s for s in servers if s.endpoint == first)
        killed_at = time.monotonic()
        victim.kill()
        second = await wait_writable_owner(cluster, exclude=first, timeout=30)
        _, new_generation = owner(cluster)
        assert new_generation > generation
        seq = 50
        for _ in range(200):  # the first appends after the move may race the recovery
            txn = await append_via_owner(cluster, seq)
            if txn is not None:
                acknowledged[seq] = txn
                break
            seq += 1
            await asyncio.sleep(0.05)
        failover = time.monotonic() - killed_at
        print(f"failover: kill -9 of {first} to first commit on {second}: {failover:.2f}s")
        for seq in range(1000, 1050):
            txn = await append_via_owner(cluster, seq)
            assert txn is not None
            acknowledged[seq] = txn
        check(await log_of(cluster), acknowledged)

    run(scenario())


def test_sigterm_moves_partitions_without_waiting_for_the_session_timeout(
    cluster: StoreCluster, start_server: Callable[[], LocalServer]
) -> None:
    servers = [start_server(), start_server()]

    async def scenario() -> None:
        first = await wait_writable_owner(cluster)
        assert await append_via_owner(cluster, 0) == 0
        # A ReqId of another partition is refused (nothing appended: the next append is 1).
        _, generation = owner(cluster)
        async with ServerAdminClient(first, timeout=10) as client:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.append(0, [(ReqId(5, generation, 3, 77), 0, payload(77))])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "partition 3" in (refused.value.details() or "")
        victim = next(s for s in servers if s.endpoint == first)
        started = time.monotonic()
        assert victim.stop() == 0
        await wait_writable_owner(cluster, exclude=first, timeout=30)
        moved_after = time.monotonic() - started
        assert moved_after < SESSION_TIMEOUT * 3
        assert await append_via_owner(cluster, 1) == 1

    run(scenario())


def test_a_paused_owner_writes_nothing_after_it_wakes_up(
    cluster: StoreCluster, start_server: Callable[[], LocalServer]
) -> None:
    servers = [start_server(), start_server()]

    async def scenario() -> None:
        first = await wait_writable_owner(cluster)
        acknowledged = {0: await append_via_owner(cluster, 0)}
        assert acknowledged[0] == 0
        victim = next(s for s in servers if s.endpoint == first)
        async with ServerAdminClient(first, timeout=5) as client:
            before = (await client.status()).member
        victim.pause()
        try:
            await wait_writable_owner(cluster, exclude=first, timeout=SESSION_TIMEOUT * 10)
            for seq in range(1, 20):
                txn = await append_via_owner(cluster, seq)
                assert txn is not None
                acknowledged[seq] = txn
        finally:
            victim.resume()
        # Straight after waking up, the old owner still believes it owns the partition: its
        # appends must not be committed (its store session is fenced by the new owner's).
        async with ServerAdminClient(first, timeout=20) as client:
            try:
                outcomes = await client.append(0, [(ReqId(5, 1, 0, 9999), 0, payload(9999))])
            except grpc.aio.AioRpcError as exc:
                assert exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE)
            else:
                assert isinstance(outcomes[0], str), f"the paused owner committed {outcomes}"
        # Its ZooKeeper session expired while it slept: it closed its partitions and registered
        # again as a new member, which the cluster manager may give partitions to later.
        async with ServerAdminClient(first, timeout=5) as client:

            async def registered_again() -> str:
                for _ in range(300):
                    status = await client.status()
                    if (
                        status.member
                        and status.member != before
                        and not any(p.partition_id == 0 and p.generation <= 1 for p in status.partitions)
                    ):
                        return status.member
                    await asyncio.sleep(0.1)
                raise AssertionError(f"the woken server did not register again (still {before})")

            assert (await registered_again()) != before
        assert victim.process.is_running()
        records = await log_of(cluster)
        check(records, {k: v for k, v in acknowledged.items() if v is not None})
        assert 9999 not in [r.req_id.seq_num for r in records]

    run(scenario())


def test_verify_health_and_metrics_with_servers(
    cluster: StoreCluster, tmp_path: Path, zookeeper: object, zk_root: str, request: pytest.FixtureRequest
) -> None:
    import json
    import urllib.error
    import urllib.request

    from waltz.admin.cluster_admin import ClusterAdmin

    server = LocalServer(
        zookeeper.connect_string,  # type: ignore[attr-defined]
        zk_root,
        name="server-metrics",
        log_path=tmp_path / "server-metrics.log",
        metrics=True,
        session_timeout=SESSION_TIMEOUT,
        env=dict(DEFAULT_SERVER_ENV),
        insecure=True,
    )
    support.add_failure_logs(request.node, "server log", server.process.log_tail)
    with server:
        run(wait_writable_owner(cluster))
        assert run(append_via_owner(cluster, 0)) == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/health", timeout=5) as response:
            health = json.load(response)
        assert health["healthy"] is True and health["partitions_writable"] == {"0": True}
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        assert 'waltz_server_partition_high_water_mark{partition="0"} 0.0' in text
        assert 'waltz_server_committed_records_total{partition="0"} 1.0' in text
        assert "process_cpu_seconds_total" in text  # what `waltz perf --local` reads per node
        with ClusterAdmin.connect(
            zookeeper.connect_string,  # type: ignore[attr-defined]
            zk_root,
        ) as admin:
            report = admin.verify()
        names = {c.name: c.status.value for c in report.checks}
        assert report.passed, [c for c in report.checks if c.status.value != "PASSED"]
        assert names["partition 0: writable"] == "PASSED"
        assert names["partition 0: exactly one server serves it"] == "PASSED"
        # Two storage nodes down: the partition cannot write, /health says so.
        cluster.storages[1].kill()
        cluster.storages[2].kill()
        assert run(append_via_owner(cluster, 1, timeout=3)) is None, "committed without a quorum"

        def unhealthy() -> bool:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/health", timeout=5)
            except urllib.error.HTTPError as exc:
                return exc.code == 503
            return False

        wait_until(unhealthy, timeout=30, what="/health to report the partition unwritable")


def test_kill_9_of_a_storage_node_under_server_processes(tmp_path: Path, zookeeper: object) -> None:
    from waltz.local.cluster import LocalCluster
    from waltz.protocol.storage_client import StorageAdminClient

    with LocalCluster(
        security=support.PLAINTEXT,
        storages=3,
        servers=2,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path / "cluster",
        delete_root=True,
    ) as local:

        async def scenario() -> None:
            endpoint = local.owner(0)
            acknowledged: dict[int, int] = {}
            async with ServerAdminClient(endpoint, timeout=20) as client:

                async def append_batch(first: int) -> None:
                    batch = [(ReqId(7, 1, 0, seq), 0, payload(seq)) for seq in range(first, first + 50)]
                    for seq, outcome in zip(
                        range(first, first + 50), await client.append(0, batch), strict=True
                    ):
                        if isinstance(outcome, int):
                            acknowledged[seq] = outcome

                for first in range(0, 500, 50):
                    await append_batch(first)
                victim = local.storages[2]
                victim.kill()
                for first in range(500, 1000, 50):
                    await append_batch(first)
                assert len(acknowledged) >= 950, "appends did not continue with one storage node down"
                await asyncio.to_thread(victim.start)
                for _ in range(300):
                    status = await client.status()
                    if victim.address in status.partitions[0].replicas_in_session:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError("the restarted storage node did not rejoin the store session")
                await append_batch(1000)
                high_water_mark = (await client.status()).partitions[0].high_water_mark
            replicas = []
            for node in local.storages:
                async with StorageAdminClient(node.admin_address, str(local.cluster_key), 1) as admin:
                    records: list[Record] = []
                    while len(records) <= high_water_mark:
                        page = await admin.records(0, len(records), 1000)
                        assert page, f"{node.address} lacks records after {len(records) - 1}"
                        records.extend(page)
                    replicas.append(records[: high_water_mark + 1])
            assert replicas[0] == replicas[1] == replicas[2]
            check(replicas[0], acknowledged)

        run(scenario())


def test_sigterm_while_zookeeper_is_unreachable_still_stops_the_server(
    cluster: StoreCluster, tmp_path: Path, zookeeper: object, zk_root: str, request: pytest.FixtureRequest
) -> None:
    """A server told to stop while its ZooKeeper is cut off exits on its own, with code 0.

    It cannot delete its member znode then (the ephemeral node goes with the session) and must not
    wait for ZooKeeper to come back to close its partitions and exit.
    """
    host, port = zookeeper.connect_string.split(",")[0].rsplit(":", 1)  # type: ignore[attr-defined]
    with FaultProxy(lambda: (host, int(port)), name="zookeeper") as proxy:
        server = LocalServer(
            proxy.address,
            zk_root,
            name="server-cut-off",
            log_path=tmp_path / "server-cut-off.log",
            session_timeout=SESSION_TIMEOUT,
            env=dict(DEFAULT_SERVER_ENV),
            insecure=True,
        )
        support.add_failure_logs(request.node, "server log", server.process.log_tail)
        server.start()
        try:
            run(wait_writable_owner(cluster))
            assert run(append_via_owner(cluster, 0)) == 0
            proxy.block()
            # The server's ZooKeeper client has seen its connection go and tries to reconnect.
            wait_until(lambda: proxy.refused > 0, timeout=30, what="the server to try to reconnect")
            # More than the session timeout: the server may have been told nothing of its session.
            code = server.stop(timeout=40)
            assert code == 0, f"the server did not exit by itself after SIGTERM (exit code {code})"
            assert "server stopped" in server.process.log_tail()
        finally:
            server.close()


@pytest.mark.security
def test_admin_appends_are_refused_unless_an_operator_turned_them_on(
    cluster: StoreCluster, tmp_path: Path, zookeeper: object, zk_root: str, request: pytest.FixtureRequest
) -> None:
    """AppendRecords writes with caller-chosen ReqIds and no lock checks: a server refuses it by
    default (a deployment's), while status and reads still answer."""
    env = {k: v for k, v in DEFAULT_SERVER_ENV.items() if k != "WALTZ_SERVER_ADMIN_APPENDS"}
    server = _server(request, tmp_path, zookeeper, zk_root, "server-defaults", env)
    with server:
        endpoint = run(wait_writable_owner(cluster))

        async def scenario() -> None:
            async with ServerAdminClient(endpoint, timeout=10) as client:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await client.append(0, [(ReqId(5, owner(cluster)[1], 0, 1), 0, payload(1))])
                assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
                assert "server.adminAppends" in (info.value.details() or "")
                assert any(p.partition_id == 0 for p in (await client.status()).partitions)
                assert await client.read(0, 0, 10) == []

        run(scenario())


@pytest.mark.security
def test_an_admin_append_never_writes_a_split_record(
    cluster: StoreCluster, start_server: Callable[[], LocalServer]
) -> None:
    """Admin appends skip the lock checks, not the owners' hold on split records
    (docs/design/splits.md "Why no update is lost"): a request with one transaction under the split
    header is refused whole, and nothing of it is appended."""
    from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitBarrier

    start_server()
    endpoint = run(wait_writable_owner(cluster))
    generation = owner(cluster)[1]
    forged = SplitBarrier(epoch=1, count=2, previous_count=1, parent=0).encode()

    async def scenario() -> None:
        async with ServerAdminClient(endpoint, timeout=10) as client:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await client.append(
                    0,
                    [
                        (ReqId(5, generation, 0, 1), 0, payload(1)),
                        (ReqId(5, generation, 0, 2), SPLIT_RECORD_HEADER, forged),
                    ],
                )
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            details = info.value.details() or ""
            assert "index 1" in details and "split" in details and "nothing was appended" in details
            assert await client.read(0, 0, 10) == []
            (outcome,) = await client.append(0, [(ReqId(5, generation, 0, 3), 0, payload(3))])
            assert outcome == 0, "the refusal appended something"

    run(scenario())


def test_a_server_whose_storage_tls_does_not_match_the_nodes_does_not_join(
    cluster: StoreCluster,
    tmp_path: Path,
    zookeeper: object,
    zk_root: str,
    zk_client: KazooClient,
    request: pytest.FixtureRequest,
) -> None:
    """Storage nodes that accept TCP but complete no connection with the server's storage.ssl.*
    settings (here TLS against plaintext nodes): the server refuses to start, naming the settings,
    and never registers, so no partition is given to it (docs/design/server.md "What a server does")."""
    from support.tls import make_certificates

    (tmp_path / "tls").mkdir()
    files = make_certificates(tmp_path / "tls")
    env = {
        **DEFAULT_SERVER_ENV,
        "WALTZ_STORE_TLS_CA_FILE": str(files["ca"]),
        "WALTZ_STORE_TLS_CERT_FILE": str(files["client"]),
        "WALTZ_STORE_TLS_KEY_FILE": str(files["client-key"]),
    }
    members = f"{zk_root}/server/members"
    members_before = zk_client.get_children(members) if zk_client.exists(members) else []
    server = _server(request, tmp_path, zookeeper, zk_root, "server-mismatched", env)
    server.process.start()
    try:
        assert server.process.wait(60) == 1
    finally:
        server.close()
    text = (tmp_path / "server-mismatched.log").read_text()
    assert "accept TCP connections but none completed a connection" in text, text[-3000:]
    assert "check storage.ssl.caFile" in text and "Traceback" not in text
    assert (zk_client.get_children(members) if zk_client.exists(members) else []) == members_before
