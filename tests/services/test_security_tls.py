"""End to end: a whole cluster with TLS and mutual TLS on every port, probed by intruders.

One :class:`LocalCluster` whose storage nodes (storage, admin
and metrics ports) and server (client and admin services on one port, and its metrics port) require
client certificates of the cluster's CA. Every port is probed with plain text, with TLS but no
client certificate, with a client certificate of another CA, and, as the control that makes the
probes mean something, with the cluster's own client certificate. Then, over TLS: a server
configured for another cluster key cannot open store sessions on the storage nodes, the server
drops appends of a stale generation, and a storage node refuses a store session older than the real
server's. The operator commands (`waltz client check-connectivity`, `waltz server list`) reach every
node with the cluster's client certificate, and fail without it.

What the other suites already cover is not repeated here: plaintext and certificate-less clients
of one storage node (tests/services/storage/test_config_and_tls.py), store sessions without a client
certificate (tests/services/server/store/test_store_tls.py), a Waltz client without a certificate
(tests/client/test_client_tls.py), raw wrong-key and stale-session requests on a plaintext node
(tests/services/storage/test_storage_process.py), mounts of a wrong generation
(tests/services/server/test_client_protocol.py).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import support
from kazoo.client import KazooClient
from support.feed import FeedEntry, feed_entries
from support.storage import run
from support.tls import make_certificates
from typer.testing import CliRunner

from waltz.cli.main import app
from waltz.errors import StorageRpcError
from waltz.local.cluster import LocalCluster
from waltz.local.nodes import LocalServer
from waltz.local.options import ProcessOptions, SecurityOptions
from waltz.local.processes import wait_until
from waltz.metadata.values import (
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    ReplicaAssignments,
)
from waltz.metadata.zk import ClusterZk
from waltz.protocol import client_pb2, common_pb2, server_pb2, storage_pb2
from waltz.protocol.channels import TlsConfig
from waltz.protocol.records import Record, ReqId, crc32
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient

pytestmark = pytest.mark.security

#: Seconds a refused probe may take (a TLS handshake failure is reported at once).
PROBE_TIMEOUT = 10.0
SECRET = b"the payload no metrics page may show " + uuid.uuid4().hex.encode()


@dataclass(frozen=True)
class Secured:
    cluster: LocalCluster
    files: dict[str, Path]  # the cluster's CA, server and client certificates
    foreign: dict[str, Path]  # another CA with its own server and client certificates
    tls: TlsConfig  # the cluster's client certificate


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[Secured]:
    directory = tmp_path_factory.mktemp("security-tls")
    (directory / "ca").mkdir()
    (directory / "foreign").mkdir()
    files = make_certificates(directory / "ca")
    foreign = make_certificates(directory / "foreign")
    tls = TlsConfig(ca_file=files["ca"], cert_file=files["client"], key_file=files["client-key"])
    storage_env = {
        "WALTZ_STORAGE_TLS_CERT_FILE": str(files["server"]),
        "WALTZ_STORAGE_TLS_KEY_FILE": str(files["server-key"]),
        "WALTZ_STORAGE_TLS_CA_FILE": str(files["ca"]),
    }
    server_env = {
        "WALTZ_SERVER_TLS_CERT_FILE": str(files["server"]),
        "WALTZ_SERVER_TLS_KEY_FILE": str(files["server-key"]),
        "WALTZ_SERVER_TLS_CA_FILE": str(files["ca"]),
        "WALTZ_STORE_TLS_CA_FILE": str(files["ca"]),
        "WALTZ_STORE_TLS_CERT_FILE": str(files["client"]),
        "WALTZ_STORE_TLS_KEY_FILE": str(files["client-key"]),
    }
    with LocalCluster(
        storages=2,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=directory / "cluster",
        delete_root=True,
        processes=ProcessOptions(metrics=True, storage_env=storage_env, server_env=server_env),
        security=SecurityOptions(tls=tls, zookeeper_auth=False),
    ) as cluster:
        yield Secured(cluster, files, foreign, tls)


# ---- probes ---------------------------------------------------------------------------------------


def _credentials(kind: str, secured: Secured) -> grpc.ChannelCredentials | None:
    """Channel credentials of a kind of caller; None means plain text."""
    own, foreign = secured.files, secured.foreign
    if kind == "plaintext":
        return None
    if kind == "no client certificate":
        return grpc.ssl_channel_credentials(root_certificates=own["ca"].read_bytes())
    if kind == "foreign client certificate":
        # Trusts the cluster's CA (so the server is verified), presents another CA's certificate.
        return grpc.ssl_channel_credentials(
            root_certificates=own["ca"].read_bytes(),
            private_key=foreign["client-key"].read_bytes(),
            certificate_chain=foreign["client"].read_bytes(),
        )
    assert kind == "cluster client certificate"
    return grpc.ssl_channel_credentials(
        root_certificates=own["ca"].read_bytes(),
        private_key=own["client-key"].read_bytes(),
        certificate_chain=own["client"].read_bytes(),
    )


@dataclass(frozen=True)
class Port:
    """One gRPC method on one port, with a request that always gets an answer."""

    name: str
    address: str
    method: str
    streaming: bool
    request: bytes


def _ports(secured: Secured) -> list[Port]:
    cluster = secured.cluster
    key, n = cluster.cluster_key, cluster.num_partitions
    ports: list[Port] = []
    for node in cluster.storages:
        ports.append(
            Port(
                f"{node.process.name} storage port",
                node.address,
                "/waltz.storage.StorageService/Session",
                True,
                storage_pb2.StorageRequests(
                    requests=[
                        storage_pb2.StorageRequest(
                            session_id=-1,
                            seq_num=-1,
                            partition_id=-1,
                            open=storage_pb2.OpenRequest(cluster_key=key, num_partitions=n),
                        )
                    ]
                ).SerializeToString(),
            )
        )
        ports.append(
            Port(
                f"{node.process.name} admin port",
                node.admin_address,
                "/waltz.storage.StorageAdminService/Session",
                True,
                storage_pb2.AdminRequests(
                    requests=[
                        storage_pb2.AdminRequest(
                            seq_num=-1,
                            partition_id=-1,
                            open=storage_pb2.AdminOpenRequest(cluster_key=key, num_partitions=n),
                        )
                    ]
                ).SerializeToString(),
            )
        )
    for server in cluster.servers:
        ports.append(
            Port(
                f"{server.process.name} admin service",
                server.endpoint,
                "/waltz.server.ServerAdminService/Status",
                False,
                server_pb2.ServerStatusRequest().SerializeToString(),
            )
        )
        # A mount of an unknown generation is always answered (partition_ready = false).
        mount = client_pb2.MountRequest(
            req_id=common_pb2.ReqId(client_id=7001, generation=1 << 30, partition_id=0, seq_num=1),
            client_high_water_mark=-1,
            seq_num=1,
        )
        ports.append(
            Port(
                f"{server.process.name} client stream",
                server.endpoint,
                "/waltz.client.WaltzServerService/Stream",
                True,
                client_pb2.ClientMessages(
                    messages=[client_pb2.ClientMessage(mount=mount)]
                ).SerializeToString(),
            )
        )
        ports.append(
            Port(
                f"{server.process.name} transaction data",
                server.endpoint,
                "/waltz.client.WaltzServerService/GetTransactionData",
                False,
                client_pb2.TransactionDataRequest().SerializeToString(),
            )
        )
    return ports


async def _probe(port: Port, credentials: grpc.ChannelCredentials | None) -> bytes | grpc.StatusCode:
    """Send the port's request; return the first answer's bytes, or the status code of a failure."""
    channel = (
        grpc.aio.insecure_channel(port.address)
        if credentials is None
        else grpc.aio.secure_channel(port.address, credentials)
    )
    try:
        if port.streaming:
            call = channel.stream_stream(port.method)(iter([port.request]), timeout=PROBE_TIMEOUT)
            try:
                answer = await call.read()
            finally:
                call.cancel()
            assert isinstance(answer, bytes), f"{port.name}: the stream ended without an answer"
            return answer
        result = await channel.unary_unary(port.method)(port.request, timeout=PROBE_TIMEOUT)
        assert isinstance(result, bytes)
        return result
    except grpc.aio.AioRpcError as error:
        return error.code()
    finally:
        await channel.close(None)


def _check_method_paths() -> None:
    """Fail early with a clear message if a method path above names no service (typo, rename)."""
    services = {
        "StorageService": storage_pb2,
        "StorageAdminService": storage_pb2,
        "ServerAdminService": server_pb2,
        "WaltzServerService": client_pb2,
    }
    full_names = {
        f"/{module.DESCRIPTOR.services_by_name[name].full_name}/" for name, module in services.items()
    }
    for method in (
        "/waltz.storage.StorageService/Session",
        "/waltz.storage.StorageAdminService/Session",
        "/waltz.server.ServerAdminService/Status",
        "/waltz.client.WaltzServerService/Stream",
        "/waltz.client.WaltzServerService/GetTransactionData",
    ):
        assert method[: method.rindex("/") + 1] in full_names, f"{method}: no such service"


def test_every_port_refuses_plaintext_and_foreign_or_missing_client_certificates(secured: Secured) -> None:
    _check_method_paths()
    ports = _ports(secured)
    refused_kinds = ("plaintext", "no client certificate", "foreign client certificate")

    async def scenario() -> dict[tuple[str, str], bytes | grpc.StatusCode]:
        results = {}
        for port in ports:
            for kind in (*refused_kinds, "cluster client certificate"):
                results[(port.name, kind)] = await _probe(port, _credentials(kind, secured))
        return results

    results = run(scenario())
    for port in ports:
        # The control: the cluster's own certificate gets an answer, so the refusals below are
        # about the caller's credentials, not a port that answers nobody.
        answer = results[(port.name, "cluster client certificate")]
        if port.method.endswith("GetTransactionData"):
            # Answered by the service (an empty request names no transaction): any status but
            # UNAVAILABLE means the call got through TLS.
            assert answer != grpc.StatusCode.UNAVAILABLE, f"{port.name}: refused the cluster's certificate"
        else:
            assert isinstance(answer, bytes), f"{port.name}: refused the cluster's certificate ({answer})"
        for kind in refused_kinds:
            outcome = results[(port.name, kind)]
            assert outcome == grpc.StatusCode.UNAVAILABLE, (
                f"{port.name} accepted a caller with {kind}: {outcome!r}"
            )


def test_a_client_that_trusts_another_ca_refuses_the_cluster(secured: Secured) -> None:
    """Server authentication: a caller whose CA did not sign the nodes' certificates gets nothing."""
    foreign = secured.foreign
    credentials = grpc.ssl_channel_credentials(
        root_certificates=foreign["ca"].read_bytes(),
        private_key=foreign["client-key"].read_bytes(),
        certificate_chain=foreign["client"].read_bytes(),
    )
    ports = _ports(secured)

    async def probe_all() -> list[bytes | grpc.StatusCode]:
        return list(await asyncio.gather(*(_probe(port, credentials) for port in ports)))

    outcomes = run(probe_all())
    for port, outcome in zip(ports, outcomes, strict=True):
        assert outcome == grpc.StatusCode.UNAVAILABLE, f"{port.name}: {outcome!r}"


def _https_context(secured: Secured, kind: str) -> ssl.SSLContext | None:
    """A client TLS context of a kind of caller (as :func:`_credentials`); None means plain HTTP."""
    own, foreign = secured.files, secured.foreign
    if kind == "plaintext":
        return None
    context = ssl.create_default_context(cafile=str(own["ca"]))
    if kind == "foreign client certificate":
        context.load_cert_chain(foreign["client"], foreign["client-key"])
    elif kind == "cluster client certificate":
        context.load_cert_chain(own["client"], own["client-key"])
    return context


def _get(url: str, context: ssl.SSLContext | None) -> bytes | str:
    """The body, or what refused the request (its exception's type name)."""
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as exc:
        return bytes(exc.read()) if exc.code == 503 else type(exc).__name__
    except (urllib.error.URLError, OSError) as exc:
        return type(exc).__name__


def test_metrics_ports_are_https_with_client_certificates_and_carry_no_data(secured: Secured) -> None:
    """The metrics ports use the node's TLS files: plain HTTP, no certificate and another CA's
    certificate are refused; the cluster's client certificate reads /metrics and /health, which
    never carry transaction data."""
    cluster = secured.cluster
    owner = cluster.wait_ready(60)[0]

    async def append() -> list[int | str]:
        async with ServerAdminClient(owner.endpoint, tls=secured.tls, timeout=30) as admin:
            return await admin.append(0, [(ReqId(7002, owner.generation, 0, 1), 0, SECRET)])

    (outcome,) = run(append())
    assert isinstance(outcome, int) and outcome >= 0, outcome
    metrics_ports = [n.metrics_port for n in cluster.storages] + [s.metrics_port for s in cluster.servers]
    assert all(metrics_ports), metrics_ports
    for port in metrics_ports:
        plain = _get(f"http://127.0.0.1:{port}/metrics", None)
        assert not isinstance(plain, bytes) or not plain.startswith(b"#"), f"port {port} answered plain HTTP"
        for kind in ("no client certificate", "foreign client certificate"):
            refused = _get(f"https://127.0.0.1:{port}/metrics", _https_context(secured, kind))
            assert isinstance(refused, str), f"port {port} answered a caller with {kind}"
        context = _https_context(secured, "cluster client certificate")
        for path in ("/metrics", "/health"):
            body = _get(f"https://127.0.0.1:{port}{path}", context)
            assert isinstance(body, bytes) and body, f"port {port}{path}: {body!r}"
            assert SECRET not in body and SECRET.hex().encode() not in body, f"port {port}{path}"
        assert b"waltz_" in _get(f"https://127.0.0.1:{port}/metrics", context)  # type: ignore[operator]


def test_operator_commands_reach_every_node_over_tls(secured: Secured) -> None:
    """``waltz client check-connectivity`` and ``waltz server list`` with the cluster's client
    certificate: every node answers, ``/health`` over HTTPS; without TLS every node fails."""
    cluster, files = secured.cluster, secured.files
    where = ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    ssl_options = [
        *("--ssl-ca-file", str(files["ca"])),
        *("--ssl-cert-file", str(files["client"])),
        *("--ssl-key-file", str(files["client-key"])),
    ]
    runner = CliRunner()
    result = runner.invoke(app, ["client", "check-connectivity", "--json", *ssl_options, *where])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["nodes"]) == 1 + 2 * 2
    plain = runner.invoke(app, ["client", "check-connectivity", "--timeout", "3", *where])
    assert plain.exit_code == 1, plain.output
    failed = {line.split()[1] for line in plain.stdout.splitlines() if line.startswith("FAILED")}
    assert failed == {"server", "storage-admin"}, plain.stdout  # the storage port's TCP probe passes
    # Each failure says what the missing TLS settings may have to do with it.
    hinted = [line for line in plain.stdout.splitlines() if line.startswith("FAILED")]
    assert all("this connection had none: set client.ssl.caFile" in line for line in hinted), plain.stdout
    assert all("WALTZ_CLIENT_TLS_CA_FILE" in line for line in hinted), plain.stdout
    env = {
        "WALTZ_CLUSTER_SSL_CA_FILE": str(files["ca"]),
        "WALTZ_CLUSTER_SSL_CERT_FILE": str(files["client"]),
        "WALTZ_CLUSTER_SSL_KEY_FILE": str(files["client-key"]),
    }
    listing = runner.invoke(app, ["server", "list", "--json", *where], env=env)
    assert listing.exit_code == 0, listing.output
    (server,) = json.loads(listing.stdout)["servers"]
    assert server["status_error"] is None and server["health"] == "healthy", server
    unlisted = runner.invoke(app, ["server", "list", "--json", *where], env=dict.fromkeys(env))
    (server,) = json.loads(unlisted.stdout)["servers"]
    assert "set cluster.ssl.caFile, certFile and keyFile" in server["status_error"], server
    assert "WALTZ_CLUSTER_SSL_CA_FILE" in server["status_error"], server


def test_a_server_of_another_cluster_key_cannot_open_store_sessions(
    request: pytest.FixtureRequest, secured: Secured, zk_client: KazooClient, zk_root: str, tmp_path: Path
) -> None:
    """A real server, with a valid client certificate but another cluster's key, writes nothing."""
    cluster, files = secured.cluster, secured.files
    before = {node.address: _max_transaction_id(node.admin_address, secured) for node in cluster.storages}
    rogue = ClusterZk(zk_client, zk_root)
    rogue.create(
        ClusterParams("rogue", cluster.num_partitions, uuid.uuid4()),
        ReplicaAssignments({n.address: (0,) for n in cluster.storages}),
        GroupDescriptor({n.address: 0 for n in cluster.storages}),
        ConnectionMetadata({n.address: n.admin_port for n in cluster.storages}),
    )
    env = {
        "WALTZ_SERVER_TLS_CERT_FILE": str(files["server"]),
        "WALTZ_SERVER_TLS_KEY_FILE": str(files["server-key"]),
        "WALTZ_SERVER_TLS_CA_FILE": str(files["ca"]),
        "WALTZ_STORE_TLS_CA_FILE": str(files["ca"]),
        "WALTZ_STORE_TLS_CERT_FILE": str(files["client"]),
        "WALTZ_STORE_TLS_KEY_FILE": str(files["client-key"]),
        "WALTZ_STORE_RETRY_INTERVAL": "0.2",
        "WALTZ_STORE_CONNECT_TIMEOUT": "2",
    }
    server = LocalServer(
        cluster.zookeeper_connect_string,
        zk_root,
        name="rogue-server",
        log_path=tmp_path / "rogue-server.log",
        session_timeout=4.0,
        env=env,
    )
    support.add_failure_logs(request.node, "rogue server log", server.process.log_tail)
    with server:
        log_path = tmp_path / "rogue-server.log"
        wait_until(
            lambda: log_path.read_text().count("CLUSTER_KEY_MISMATCH") >= 2,
            timeout=60,
            what="the rogue server to report that the storage nodes refused its cluster key",
        )

        async def status() -> server_pb2.ServerStatusResponse:
            async with ServerAdminClient(server.endpoint, tls=secured.tls, timeout=10) as admin:
                return await admin.status()

        states = {p.partition_id: p for p in run(status()).partitions}
        assert 0 in states, "the rogue server never opened its partition"
        assert not states[0].writable and not states[0].replicas_in_session, states[0]
    after = {node.address: _max_transaction_id(node.admin_address, secured) for node in cluster.storages}
    assert after == before
    # The real cluster is unharmed.
    assert cluster.wait_ready(60)[0].endpoint == cluster.servers[0].endpoint


def _max_transaction_id(admin_address: str, secured: Secured) -> int:
    cluster = secured.cluster

    async def read() -> int:
        async with StorageAdminClient(
            admin_address, cluster.cluster_key, cluster.num_partitions, tls=secured.tls
        ) as admin:
            return await admin.max_transaction_id(0)

    return run(read())


class _TlsRawClient:
    """A client stream of raw protocol messages over mutual TLS."""

    def __init__(self, endpoint: str, tls: TlsConfig, client_id: int) -> None:
        self.channel = grpc.aio.secure_channel(endpoint, tls.credentials())
        self.client_id = client_id
        self.seq = 0
        self.outgoing: asyncio.Queue[client_pb2.ClientMessage | None] = asyncio.Queue()
        self.call = self.channel.stream_stream(
            "/waltz.client.WaltzServerService/Stream",
            request_serializer=client_pb2.ClientMessages.SerializeToString,
            response_deserializer=client_pb2.ServerMessages.FromString,
        )(self._requests())
        self.received: list[client_pb2.ServerMessage] = []
        self.feed: list[FeedEntry] = []  # every feed entry received, in order
        self._feed_read = 0  # how many of them next_feed returned

    async def _requests(self):  # type: ignore[no-untyped-def]
        while (message := await self.outgoing.get()) is not None:
            yield client_pb2.ClientMessages(messages=[message])

    def req_id(self, generation: int) -> common_pb2.ReqId:
        self.seq += 1
        return common_pb2.ReqId(
            client_id=self.client_id, generation=generation, partition_id=0, seq_num=self.seq
        )

    def send(self, **body: object) -> None:
        self.outgoing.put_nowait(client_pb2.ClientMessage(**body))  # type: ignore[arg-type]

    async def _read_batch(self) -> list[client_pb2.ServerMessage]:
        batch = await self.call.read()
        assert batch is not grpc.aio.EOF, "the server closed the stream"
        for message in batch.messages:
            self.received.append(message)
            if message.WhichOneof("body") == "feed_entries":
                self.feed += feed_entries(message.feed_entries)
        return list(batch.messages)

    async def next(self, kind: str, timeout: float = 20) -> client_pb2.ServerMessage:
        async with asyncio.timeout(timeout):
            while True:
                for message in await self._read_batch():
                    if message.WhichOneof("body") == kind:
                        return message

    async def next_feed(self, timeout: float = 20) -> FeedEntry:
        """The next feed entry not returned yet (reading more of the stream when needed)."""
        async with asyncio.timeout(timeout):
            while self._feed_read >= len(self.feed):
                await self._read_batch()
        self._feed_read += 1
        return self.feed[self._feed_read - 1]

    async def close(self) -> None:
        self.outgoing.put_nowait(None)
        self.call.cancel()
        await self.channel.close(None)


def test_server_drops_appends_of_a_stale_generation_and_storage_refuses_a_stale_session(
    secured: Secured,
) -> None:
    cluster = secured.cluster
    owner = cluster.wait_ready(60)[0]
    generation = owner.generation

    async def scenario() -> None:
        client = _TlsRawClient(owner.endpoint, secured.tls, 7003)
        try:
            client.send(
                mount=client_pb2.MountRequest(
                    req_id=client.req_id(generation), client_high_water_mark=-1, seq_num=1
                )
            )
            assert (await client.next("mount")).mount.partition_ready
            client.send(high_water_mark=client_pb2.HighWaterMarkRequest(req_id=client.req_id(generation)))
            start = (await client.next("high_water_mark")).high_water_mark.transaction_id
            # Appends of an older (and of a newer) generation than the owner's are dropped ...
            stale_ids = []
            for stale in (generation - 1, generation + 1):
                req_id = client.req_id(stale)
                stale_ids.append(req_id)
                data = b"stale generation %d" % stale
                client.send(
                    append=client_pb2.AppendRequest(
                        req_id=req_id, client_high_water_mark=start, header=1, data=data, checksum=crc32(data)
                    )
                )
            # ... so the next append of the right generation gets the next transaction ID.
            good = client.req_id(generation)
            client.send(
                append=client_pb2.AppendRequest(
                    req_id=good, client_high_water_mark=start, header=1, data=b"good", checksum=crc32(b"good")
                )
            )
            while (feed := await client.next_feed()).req_id != good:
                assert feed.req_id not in stale_ids, f"a stale-generation append was committed: {feed}"
            assert feed.transaction_id == start + 1
            assert not [entry for entry in client.feed if entry.req_id in stale_ids]
        finally:
            await client.close()
        async with ServerAdminClient(owner.endpoint, tls=secured.tls, timeout=30) as admin:
            records = await admin.read(0, start + 1, 10)
        assert [r.data for r in records] == [b"good"]

        # The storage nodes refuse a store session older than the owner's (over TLS as well).
        node = cluster.storages[0]
        key, n = cluster.cluster_key, cluster.num_partitions
        async with StorageAdminClient(node.admin_address, key, n, tls=secured.tls) as storage_admin:
            current_session, _ = await storage_admin.last_session_info(0)
            max_id = await storage_admin.max_transaction_id(0)
        assert current_session >= 0
        stale_session = current_session - 1
        # Below the first session (0) there is no older session, only an invalid ID.
        expected = "SESSION_FENCED" if stale_session >= 0 else "INVALID_REQUEST"
        async with StorageSessionClient(node.address, key, n, stale_session, tls=secured.tls) as old:
            with pytest.raises(StorageRpcError) as refused:
                await old.append(0, [Record.create(max_id + 1, ReqId(7003, generation, 0, 99), 0, b"late")])
            assert refused.value.code == expected, refused.value
            if stale_session >= 0:
                assert f"store session {stale_session} is fenced" in refused.value.remote_message
            with pytest.raises(StorageRpcError, match=expected):
                await old.truncate(0, -1)
        async with StorageAdminClient(node.admin_address, key, n, tls=secured.tls) as storage_admin:
            assert await storage_admin.max_transaction_id(0) == max_id

    run(scenario())
