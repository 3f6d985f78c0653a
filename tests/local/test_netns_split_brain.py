"""Split brain by a real cut: the owner loses ZooKeeper but keeps its clients and storage nodes.

ZooKeeper, three storage nodes and two servers each run in their own network namespace (a
:class:`~waltz.local.netns.NetworkLab` host with its own address); the test and its client run in
the root namespace. An nftables rule inside the owner's namespace drops everything between it and
ZooKeeper's host, and nothing else. The owner's session expires, the other server takes the
partition under a newer generation and fences the storage nodes; the stale owner, still reachable
by clients and still reaching the storage nodes, must commit nothing from then on, and every
acknowledged transaction must be in the log exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kazoo.client import KazooClient

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.admin.cluster_admin import ClusterAdmin, StorageSpec
from waltz.local.netns import NetworkLab, network_lab_unavailable, nft_unavailable, unused_subnet
from waltz.local.nodes import LocalServer, LocalStorageNode
from waltz.local.processes import wait_until
from waltz.local.readiness import PartitionOwner, probe_partitions
from waltz.local.zookeeper import LocalZooKeeper
from waltz.metadata.zk import ClusterPaths
from waltz.metadata.zk_session import connect_zookeeper
from waltz.protocol.records import Record, ReqId
from waltz.protocol.server_client import ServerAdminClient

ROOT = "/waltz/netns-split"
HOSTS = ("zk", "s0", "s1", "s2", "a", "b")


@pytest.fixture
def lab() -> Iterator[NetworkLab]:
    reason = network_lab_unavailable() or nft_unavailable()
    if reason is not None:
        pytest.skip(reason)
    NetworkLab.cleanup_stale()
    with NetworkLab(HOSTS, subnet=unused_subnet()) as network:
        yield network


#: Tries a TCP connection to port 9 (nothing listens): "refused" means the host answered.
_PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=1.5)
except ConnectionRefusedError:
    print("refused")
except OSError as error:
    print(type(error).__name__)
"""


def reach(prefix: list[str], address: str) -> str:
    """From a host (``prefix``) or the root namespace (``[]``): "refused" if ``address`` answers."""
    argv = [*prefix, sys.executable, "-c", _PROBE, address]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def test_lab_cuts_one_pair_isolates_a_host_and_removes_a_crashed_run(lab: NetworkLab) -> None:
    a, b = lab.command_prefix("a"), lab.command_prefix("b")
    assert reach(a, lab.address("b")) == "refused"
    assert reach([], lab.address("a")) == "refused"
    lab.cut("a", lab.address("b"))
    assert reach(a, lab.address("b")) == "TimeoutError"
    assert reach(b, lab.address("a")) == "TimeoutError"
    assert reach(a, lab.address("zk")) == "refused"  # other peers unaffected
    assert reach([], lab.address("a")) == "refused"
    lab.uncut("a")
    assert reach(a, lab.address("b")) == "refused"
    lab.isolate("b")
    assert reach([], lab.address("b")) == "TimeoutError"
    assert reach(a, lab.address("b")) == "TimeoutError"
    lab.heal("b")
    assert reach(a, lab.address("b")) == "refused"

    # A run that crashed with its lab built: cleanup_stale removes it, and keeps this live one.
    crashed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from waltz.local.netns import NetworkLab; "
            f"lab = NetworkLab(['x'], subnet='{unused_subnet()}'); lab.start(); "
            "print(lab.host('x').namespace, flush=True); os._exit(0)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert crashed in namespaces
    assert NetworkLab.cleanup_stale() >= 2  # its namespace and bridge
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert crashed not in namespaces
    assert lab.host("a").namespace in namespaces
    assert reach(a, lab.address("b")) == "refused"


def owner_of_partition(zk: KazooClient, servers: list[LocalServer]) -> PartitionOwner | None:
    owners, problems = probe_partitions(zk, ClusterPaths.of(ROOT), 1, 3, servers, None)
    return owners.get(0) if not problems else None


def read_log(endpoint: str, high_water_mark: int) -> list[Record]:
    async def read() -> list[Record]:
        records: list[Record] = []
        async with ServerAdminClient(endpoint, timeout=10) as admin:
            for _ in range(high_water_mark + 2):  # bounded: at least one record per call
                if len(records) > high_water_mark:
                    break
                records += await admin.read(0, len(records), 500)
        return records

    return asyncio.run(read())


def status_of(endpoint: str) -> str:
    """The server's own view (member and partitions), over its admin protocol."""

    async def status() -> str:
        async with ServerAdminClient(endpoint, timeout=10) as admin:
            return str(await admin.status()).replace("\n", " ")

    return asyncio.run(status())


def append_directly(endpoint: str, generation: int, data: bytes) -> str:
    """Append through the server admin protocol, bypassing the client's view of the owner."""

    async def append() -> str:
        async with ServerAdminClient(endpoint, timeout=10) as admin:
            try:
                outcome = await admin.append(0, [(ReqId(424_242, generation, 0, 1), 0, data)])
            except grpc.aio.AioRpcError as error:
                return f"refused: {error.code().name} {error.details()}"
        return f"committed as {outcome[0]}" if isinstance(outcome[0], int) else f"failed: {outcome[0]}"

    return asyncio.run(append())


def test_owner_cut_from_zookeeper_only_is_fenced_and_the_log_stays_exact(
    lab: NetworkLab, tmp_path: Path
) -> None:
    with contextlib.ExitStack() as stack:
        zookeeper = stack.enter_context(
            LocalZooKeeper(
                data_dir=tmp_path / "zk",
                port=2181,
                tick_time_ms=500,
                host=lab.address("zk"),
                command_prefix=lab.command_prefix("zk"),
            )
        )
        storages = [
            LocalStorageNode(
                tmp_path / f"storage-{i}",
                name=f"storage-{i}",
                log_path=tmp_path / f"storage-{i}.log",
                host=lab.address(f"s{i}"),
                command_prefix=lab.command_prefix(f"s{i}"),
                env={"WALTZ_STORAGE_INSECURE": "true"},  # plaintext off loopback, on purpose
            )
            for i in range(3)
        ]
        for node in storages:
            stack.callback(node.close)
            node.start()
        zk = connect_zookeeper(zookeeper.connect_string, connect_timeout=30, session_timeout=10)
        stack.callback(zk.close)
        stack.callback(zk.stop)
        created = ClusterAdmin(zk, ROOT).create(
            "netns", 1, [StorageSpec(n.address, n.admin_port) for n in storages], 3
        )
        assert all(s.error is None for s in created.storage), created
        servers = {
            host: LocalServer(
                zookeeper.connect_string,
                ROOT,
                name=f"server-{host}",
                log_path=tmp_path / f"server-{host}.log",
                session_timeout=4.0,
                # The test appends past the client; plaintext off loopback, on purpose.
                env={"WALTZ_SERVER_ADMIN_APPENDS": "true", "WALTZ_SERVER_INSECURE": "true"},
                host=lab.address(host),
                command_prefix=lab.command_prefix(host),
            )
            for host in ("a", "b")
        }
        for server in servers.values():
            stack.callback(server.close)
            server.start()
        everyone = list(servers.values())
        first = wait_until(lambda: owner_of_partition(zk, everyone), timeout=60, what="an owner")
        stale_host = next(h for h, s in servers.items() if s.endpoint == first.endpoint)
        new_host = "b" if stale_host == "a" else "a"

        store = MemoryStore({0: -1})
        config = WaltzClientConfig(
            zookeeper_connect_string=zookeeper.connect_string,
            cluster_root=ROOT,
            zookeeper_session_timeout=10.0,
        )
        acknowledged: dict[bytes, int] = {}
        failures: list[str] = []
        stop = threading.Event()
        with WaltzClient(store, config) as client:
            for i in range(20):
                context = Append(0, b"before %d" % i)
                transaction_id = client.submit(context).result(30).transaction_id
                assert transaction_id is not None
                acknowledged[context.data] = transaction_id

            def keep_writing() -> None:
                for i in range(50_000):  # bounded; stopped by the event long before
                    if stop.is_set():
                        return
                    context = Append(0, b"during %d" % i)
                    try:
                        transaction_id = client.submit(context).result(60).transaction_id
                    except Exception as error:  # an expired transaction: not acknowledged
                        failures.append(repr(error))
                        continue
                    if transaction_id is not None:
                        acknowledged[context.data] = transaction_id

            writer = threading.Thread(target=keep_writing, name="netns-writer")
            writer.start()
            try:
                # Cut the owner from ZooKeeper only: its clients and storage nodes still reach it.
                lab.cut(stale_host, lab.address("zk"))

                def taken_over() -> PartitionOwner | None:
                    owner = owner_of_partition(zk, everyone)
                    if owner is None or owner.endpoint != servers[new_host].endpoint:
                        return None
                    return owner if owner.generation > first.generation else None

                second = wait_until(
                    taken_over,
                    timeout=90,
                    what=f"server {new_host} to own the partition under a newer generation",
                )
                # The stale owner is still reachable: whatever it does with an append, nothing commits.
                # (It may still report itself the writable owner under the old generation: its
                # view of ZooKeeper is stale, and only the storage nodes' fence stops it.)
                stale_view = status_of(servers[stale_host].endpoint)
                stale_answer = append_directly(
                    servers[stale_host].endpoint, first.generation, b"stale owner after takeover"
                )
                assert not stale_answer.startswith("committed"), f"{stale_answer}; its view: {stale_view}"
                after_takeover = len(acknowledged)
                wait_until(
                    lambda: len(acknowledged) >= after_takeover + 20,
                    timeout=60,
                    what=f"20 more acknowledged transactions (failures so far: {failures[-3:]})",
                )
            finally:
                stop.set()
                writer.join(120)
            client.flush(60)
            high_water_mark = client.get_high_water_mark(0)

        lab.uncut(stale_host)
        records = read_log(servers[new_host].endpoint, high_water_mark)
        assert [r.transaction_id for r in records] == list(range(high_water_mark + 1))
        by_data: dict[bytes, list[int]] = {}
        for record in records:
            by_data.setdefault(record.data, []).append(record.transaction_id)
        assert all(len(ids) == 1 for ids in by_data.values()), "a transaction is in the log twice"
        assert b"stale owner after takeover" not in by_data, stale_answer
        for data, transaction_id in acknowledged.items():
            assert by_data.get(data) == [transaction_id], f"{data!r} acknowledged as {transaction_id}"
        generations = [r.req_id.generation for r in records]
        assert generations == sorted(generations), "an older generation wrote after a newer one"
        assert second.generation in generations
        assert not [
            r.transaction_id
            for r in records
            if r.transaction_id > second.high_water_mark and r.req_id.generation < second.generation
        ], "the stale owner committed after the new owner took over"
