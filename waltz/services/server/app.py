"""The server process: ZooKeeper membership, the cluster manager, store partitions, gRPC ports.

Run it with ``waltz server start --config server.yaml`` or ``python -m waltz.services.server``.
Design: docs/design/server.md "What a server does", "Generations and server fencing".

The server registers as a member, takes part in the cluster manager election, and opens a
:class:`~waltz.services.server.store.store_partition.StorePartition` for every partition the assignment
places on it (closing it when the partition moves or its generation changes). When its ZooKeeper
session is lost it closes every partition at once; on SIGTERM it deletes its member znode first
so that its partitions move without waiting for the session timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException
from kazoo.retry import KazooRetry

from waltz import tracing
from waltz.errors import SplitStateError, StaleMetadataError, WaltzError
from waltz.metadata.epochs import PartitionEpochs, PartitionEpochsZk
from waltz.metadata.zk import ClusterZk, Versioned
from waltz.metadata.zk_roles import Role
from waltz.metadata.zk_session import ZooKeeperUnavailableError, connect_zookeeper
from waltz.protocol import client_pb2_grpc, server_pb2, server_pb2_grpc
from waltz.protocol.channels import bind_port, server_credentials, server_options
from waltz.protocol.records import Record, ReqId
from waltz.protocol.roles import ADMIN_ROLES, OPERATOR_ROLES, authorize
from waltz.protocol.unreadable_requests import UnreadableRequests
from waltz.services.certificate_expiry import watch_certificates
from waltz.services.exposure import is_loopback
from waltz.services.http import HealthHttpServer, server_ssl_context
from waltz.services.runtime import call_in_daemon_thread, run_until_signalled
from waltz.services.server.appends import reserved_header_refusal
from waltz.services.server.archived_reads import ArchivedReads
from waltz.services.server.client_service import WaltzServerServicer
from waltz.services.server.cluster_manager import ClusterManager, ServerMembership
from waltz.services.server.config import ServerConfig
from waltz.services.server.metrics import ServerMetrics
from waltz.services.server.server_partition import Partition
from waltz.services.server.storage_probe import check_storage_connections
from waltz.services.server.store.replica import StorageStreams
from waltz.services.server.store.store_partition import StorePartition

__all__ = ["ServerApp", "run_server"]

log = logging.getLogger(__name__)

#: Seconds a stopping server waits for ZooKeeper to delete its member znode.
UNREGISTER_TIMEOUT = 2.0
#: Seconds a stopping server waits for its cluster manager thread to leave the election.
MANAGER_STOP_TIMEOUT = 1.0
#: Seconds a stopping server waits for its ZooKeeper client to stop.
ZOOKEEPER_STOP_TIMEOUT = 2.0
#: Seconds a stopping server waits for its partitions to close (appends in flight to settle).
PARTITIONS_CLOSE_TIMEOUT = 2.0
#: Seconds between attempts to read ``partitions/epochs`` again after its watch fired and a read
#: failed (ZooKeeper away): the watch is set again by the read that succeeds.
EPOCHS_REREAD_DELAY = 1.0
#: Attempts to write a barrier's ``B(p)`` into ``partitions/epochs`` while ZooKeeper is away
#: (docs/design/splits.md "The handover", step 3), :data:`BARRIER_WRITE_DELAY` seconds apart; after
#: them the partition writes it again on the znode's next change, or its next owner does.
BARRIER_WRITE_ATTEMPTS = 20
BARRIER_WRITE_DELAY = 1.0


def reconnect_policy(session_timeout: float) -> KazooRetry:
    """kazoo's retry policy for reconnecting to ZooKeeper: forever, at most a quarter session apart.

    kazoo's default backs off up to a minute between attempts, so a server whose ZooKeeper came
    back could miss its own session and lose its partitions for nothing, and a stop could wait on
    the sleeping connection thread.

    Args:
        session_timeout: the ZooKeeper session timeout in seconds.
    """
    return KazooRetry(
        max_tries=-1, delay=0.1, backoff=2, max_jitter=0.2, max_delay=min(1.0, session_timeout / 4)
    )


class ServerApp:
    """A running server."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.store_config = config.store_config()
        self.partitions: dict[int, Partition] = {}
        self.partition_config = config.partition_config()
        self.metrics = ServerMetrics(lambda: self.partitions)
        self._locks: dict[int, asyncio.Lock] = {}
        self._desired: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._zk: KazooClient | None = None
        self._cluster: ClusterZk | None = None
        self._epochs_zk: PartitionEpochsZk | None = None
        self._epochs_lock: asyncio.Lock | None = None
        self._epochs: Versioned[PartitionEpochs] | None = None
        self._archived: ArchivedReads | None = None
        self._membership: ServerMembership | None = None
        self._manager: ClusterManager | None = None
        self._grpc: grpc.aio.Server | None = None
        self._client_service: WaltzServerServicer | None = None
        self._http: HealthHttpServer | None = None
        self._session_lost = False
        self._streams: StorageStreams | None = None
        self._stopping = False
        self.port = config.server_port
        self.cluster_key = ""
        self.num_partitions = 0

    @property
    def endpoint(self) -> str:
        """``host:port`` where clients reach this server (``server.advertisedEndpoint`` if set)."""
        return self.config.server_advertised_endpoint or f"{self.config.server_host}:{self.port}"

    @property
    def member(self) -> str:
        """The member znode name ('' before registration)."""
        return (self._membership.member if self._membership else None) or ""

    @property
    def cluster_manager(self) -> bool:
        """True while this server is the elected cluster manager."""
        return self._manager is not None and self._manager.leading

    # ---- life cycle ----

    async def start(self) -> None:
        """Connect to ZooKeeper, serve, register, and join the cluster manager election.

        Raises:
            ClusterNotFoundError: no cluster exists under the cluster root.
            ZooKeeperUnavailableError: no ZooKeeper server answered within the session timeout.
            ZooKeeperAuthError: ZooKeeper refused the credential.
            ZnodeAclError: the cluster's root or a child of it lets in anyone or an unknown identity.
            BindError: the port cannot be bound.
            StorageUnusableError: the storage nodes accept TCP connections but none a connection
                with this server's ``storage.ssl.*`` settings (the server does not register).
        """
        self._loop = asyncio.get_running_loop()
        config = self.config
        zk = await asyncio.to_thread(
            connect_zookeeper,
            config.zookeeper_connect_string,
            connect_timeout=config.zookeeper_session_timeout,
            security=config.zookeeper_security(),
            session_timeout=config.zookeeper_session_timeout,
            connection_retry=reconnect_policy(config.zookeeper_session_timeout),
        )
        self._zk = zk
        self._cluster = ClusterZk(zk, config.cluster_root, timeout=config.zookeeper_session_timeout)
        self._archived = ArchivedReads(self._cluster)
        self._epochs_zk = PartitionEpochsZk(zk, self._cluster.paths, timeout=config.zookeeper_session_timeout)
        self._epochs_lock = asyncio.Lock()
        # docs/design/zookeeper.md, "Checking the root", "Roles": a server holds the server's credential
        await asyncio.to_thread(self._cluster.check_security, Role.SERVER)
        params = await asyncio.to_thread(self._cluster.params)
        self.cluster_key = str(params.cluster_key)
        self.num_partitions = params.num_partitions
        if config.store_shared_streams:
            self._streams = StorageStreams(self.cluster_key, self.num_partitions, self.store_config)
        await self._start_grpc()
        if config.server_tracing:  # OpenTelemetry is imported only then (docs/tracing.md)
            tracing.start_server_tracing(self.endpoint)
        zk.add_listener(self._zk_state_changed)
        health_url = None
        if config.server_metrics_port is not None:
            cert, key = config.server_tls_cert_file, config.server_tls_key_file
            tls = (
                server_ssl_context(cert, key, config.server_tls_ca_file)
                if cert is not None and key is not None
                else None
            )
            self._http = HealthHttpServer(
                config.server_host, config.server_metrics_port, self.metrics.registry, self._health, tls
            )
            self._http.start()
            scheme = "https" if tls is not None else "http"
            host = config.server_host
            if host in ("", "0.0.0.0", "::"):  # bound to every address: the advertised host reaches it
                host = self.endpoint.rpartition(":")[0]
            health_url = f"{scheme}://{host}:{self._http.port}/health"
        self._membership = ServerMembership(
            zk,
            self._cluster.paths,
            self.endpoint,
            tuple(config.server_preferred_partitions),
            self._assignment_changed,
            health_url,
            config.server_name,
        )
        connection = await asyncio.to_thread(self._cluster.connection)
        await check_storage_connections(connection.value.admin_ports, self.store_config.tls)
        member = await asyncio.to_thread(self._membership.register)
        self._start_cluster_manager(zk, member)
        # The epochs, and the watch on them, before any partition is opened by a client: a parent
        # marked sealing gets its barrier from its owner with no client about (Partition.epochs_changed).
        self._reread_epochs()
        log.info(
            "server ready: %s as %s, cluster %r (%d partitions) under %s%s",
            self.endpoint,
            member,
            params.name,
            self.num_partitions,
            config.cluster_root,
            f", metrics port {self._http.port}" if self._http else "",
        )

    async def _start_grpc(self) -> None:
        config = self.config
        server = grpc.aio.server(options=server_options(), interceptors=[UnreadableRequests()])
        server_pb2_grpc.add_ServerAdminServiceServicer_to_server(ServerAdminServicer(self), server)
        self._client_service = WaltzServerServicer(lambda: self.partitions, config.lock_hash_limits())
        client_pb2_grpc.add_WaltzServerServiceServicer_to_server(self._client_service, server)
        address = f"{config.server_host}:{config.server_port}"
        credentials = server_credentials(
            config.server_tls_cert_file, config.server_tls_key_file, config.server_tls_ca_file, "server.ssl"
        )
        watch_certificates(self.metrics.registry, config.presented_certificates())
        self.port = bind_port(server, address, credentials)
        if config.server_insecure and not config.mutual_tls:
            log.warning(
                "server.insecure is set: port %d on %s serves without mutual TLS%s",
                self.port,
                config.server_host,
                ", to every user of this host"
                if is_loopback(config.server_host)
                else ", to every host that reaches this address",
            )
        if config.server_tls_ca_file is None or credentials is None:
            log.warning(
                "port %d serves %s without client certificates: no peer roles are checked, every peer may "
                'make every request (set server.ssl.caFile for mutual TLS; docs/operations.md, "Roles")',
                self.port,
                "TLS" if credentials is not None else "plaintext",
            )
        await server.start()
        self._grpc = server

    async def stop(self) -> None:
        """Leave the cluster (partitions move at once), close partitions, stop serving.

        Every step is bounded, so the process exits within
        :data:`~waltz.services.runtime.STOP_BOUND` in every ZooKeeper state
        (docs/design/server.md, "Stopping within a bound"): the server leaves the election,
        deletes its member znode when ZooKeeper answers (within ``UNREGISTER_TIMEOUT``), then
        stops its ZooKeeper client *before* closing its partitions, so that a ZooKeeper call
        still waiting (a store session's read of the replica assignment, the election's
        deletion of its znode) fails at once instead of waiting for a ZooKeeper that is gone.
        Cut off from ZooKeeper, the member znode goes when the session expires (the partitions
        move then).
        """
        self._stopping = True
        zk = self._zk
        manager, membership = self._manager, self._membership
        if manager is not None:
            await _stop_step(
                lambda: manager.stop(MANAGER_STOP_TIMEOUT),
                MANAGER_STOP_TIMEOUT + 0.5,
                "leaving the cluster manager election",
            )
        if zk is not None and zk.connected and membership is not None:
            await _stop_step(
                lambda: membership.unregister(UNREGISTER_TIMEOUT),
                UNREGISTER_TIMEOUT + 0.5,
                "deleting the member znode",
            )
        elif zk is not None and not zk.connected:
            log.warning(
                "stopping while cut off from ZooKeeper (%s): the member znode goes when the session expires",
                zk.state,
            )
        if zk is not None:
            await _stop_step(zk.stop, ZOOKEEPER_STOP_TIMEOUT, "stopping the ZooKeeper client")
        closing = asyncio.gather(*(self._set_partition(pid, None) for pid in list(self.partitions)))
        try:
            await asyncio.wait_for(closing, PARTITIONS_CLOSE_TIMEOUT)
        except TimeoutError:
            log.warning(
                "the partitions did not close within %.0fs: their appends in flight are undecided",
                PARTITIONS_CLOSE_TIMEOUT,
            )
        if self._streams is not None:
            await self._streams.close()
        if zk is not None:
            await _stop_step(zk.close, 1.0, "closing the ZooKeeper client")
        if self._client_service is not None:
            await self._client_service.end_streams(1.0)
        if self._grpc is not None:
            await self._grpc.stop(1.0)
        if self._http is not None:
            self._http.close()
        if self.config.server_tracing:
            await asyncio.to_thread(tracing.stop_server_tracing)
        log.info("server stopped")

    def _health(self) -> tuple[bool, dict[str, Any]]:
        partitions = {str(pid): p.store.writable for pid, p in sorted(self.partitions.items())}
        connected = self._zk is not None and self._zk.connected
        healthy = connected and all(partitions.values())
        return healthy, {
            "zookeeper_connected": connected,
            "member": self.member,
            "partitions_writable": partitions,
        }

    # ---- ZooKeeper events (called on kazoo threads) ----

    def _zk_state_changed(self, state: str) -> None:
        loop = self._loop
        if loop is None or self._stopping:
            return
        if state == KazooState.LOST:
            self._session_lost = True
            log.error("ZooKeeper session lost: closing every partition")
            loop.call_soon_threadsafe(self._reconcile, {})
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            log.warning("ZooKeeper session re-established: registering again")
            loop.call_soon_threadsafe(lambda: loop.create_task(self._register_again()))

    async def _register_again(self) -> None:
        if self._membership is None or self._zk is None or self._cluster is None:
            return
        self._membership.member = None
        member = await asyncio.to_thread(self._membership.register)
        if self._manager is not None:
            await asyncio.to_thread(self._manager.stop)
        self._start_cluster_manager(self._zk, member)
        self._reread_epochs()  # a new session holds no watch: set it again

    def _start_cluster_manager(self, zk: KazooClient, member: str) -> None:
        """Take part in the cluster manager election as ``member``, with this server's settings
        (docs/design/server.md "Cluster manager"): at start, and after a new ZooKeeper session."""
        assert self._cluster is not None
        self._manager = ClusterManager(
            zk,
            self._cluster.paths,
            self.num_partitions,
            member,
            reclaim_delay=self.config.server_preferred_partitions_reclaim_delay,
        )
        self._manager.start()

    # ---- the partitions' epochs (docs/design/splits.md "The handover") ----

    def _epochs_watch(self, event: object) -> None:
        """The watch on ``partitions/epochs`` fired (a kazoo thread): read it again on the loop."""
        loop = self._loop
        if loop is not None and not self._stopping:
            loop.call_soon_threadsafe(self._reread_epochs)

    def _reread_epochs(self) -> None:
        if not self._stopping:
            asyncio.get_running_loop().create_task(self._reread_epochs_until_read())

    async def _reread_epochs_until_read(self) -> None:
        """Read ``partitions/epochs`` again after a change, until a read succeeds (it sets the
        watch again) or the server stops."""
        while not self._stopping:
            try:
                await self.read_epochs()
                return
            except Exception as exc:
                log.warning("cannot read partitions/epochs after it changed (trying again): %s", exc)
            await asyncio.sleep(EPOCHS_REREAD_DELAY)

    async def read_epochs(self) -> Versioned[PartitionEpochs]:
        """Read ``partitions/epochs`` afresh (after a ZooKeeper sync, with the server's watch on it)
        and hand it to every partition (:meth:`Partition.epochs_changed`).

        Reads are one at a time, so each partition sees the znode's versions in order. A partition
        awaits this after its recovery and before its first append (docs/design/splits.md "The
        handover", step 3), and the watch keeps every partition's gate current after that.

        Raises:
            MetadataError: the znode does not decode.
            ZooKeeperUnavailableError: ZooKeeper did not answer in time.
        """
        epochs_zk, lock = self._epochs_zk, self._epochs_lock
        if epochs_zk is None or lock is None:
            raise WaltzError("the server has not started")

        def read() -> Versioned[PartitionEpochs]:
            # A sync first: what the recovery found (a barrier, say) was written after the
            # sealing mark, so a read from a lagging ZooKeeper server must not miss the mark.
            epochs_zk.zk.sync_async(epochs_zk.paths.root).get(timeout=self.config.zookeeper_session_timeout)
            return epochs_zk.read(watch=self._epochs_watch)

        async with lock:
            epochs = await asyncio.to_thread(read)
            if self._epochs is None or epochs != self._epochs:
                log.info("partitions/epochs read at version %d", epochs.version)
            self._epochs = epochs
            for partition in list(self.partitions.values()):
                partition.epochs_changed(epochs)
        return epochs

    async def write_barrier(self, epoch: int, parent: int, transaction_id: int) -> bool:
        """Write a parent's barrier ``B(p)`` into ``partitions/epochs`` once it committed
        (docs/design/splits.md "The owner's barrier", "The handover" step 3;
        ``PartitionEpochsZk.set_barrier``).

        Tried again while ZooKeeper is away or the znode keeps changing, at most
        :data:`BARRIER_WRITE_ATTEMPTS` times. A refusal (another ``B(p)`` written, the parent no
        longer sealing) is logged as an error: the log then holds a barrier the znode does not name,
        which only a bug or a hand-edited znode can cause; the server goes on. Never raises.

        Args:
            epoch: the epoch the barrier starts.
            parent: the parent partition.
            transaction_id: the barrier's transaction ID.

        Returns:
            True once ``B(p)`` holds ``transaction_id`` (written now or before), False otherwise.
        """
        epochs_zk = self._epochs_zk
        if epochs_zk is None:
            return False
        return await self._write_split_step(
            epochs_zk.set_barrier, epoch, parent, transaction_id, "B(p)", "barrier"
        )

    async def write_genesis(self, epoch: int, child: int, transaction_id: int) -> bool:
        """Write a new child's genesis ID into ``partitions/epochs`` once it committed
        (docs/design/splits.md "The handover", step 4; ``PartitionEpochsZk.set_genesis``): from
        then on the child's gate takes appends routed by the epoch. Tried again and logged as
        :meth:`write_barrier`. Never raises.

        Args:
            epoch: the epoch the genesis starts.
            child: the new child partition.
            transaction_id: the genesis's transaction ID (``B(p) + 1``).

        Returns:
            True once the znode holds ``transaction_id`` as the child's genesis, False otherwise.
        """
        epochs_zk = self._epochs_zk
        if epochs_zk is None:
            return False
        return await self._write_split_step(
            epochs_zk.set_genesis, epoch, child, transaction_id, "the genesis ID", "genesis"
        )

    async def _write_split_step(
        self,
        step: Callable[[int, int, int], object],
        epoch: int,
        partition_id: int,
        transaction_id: int,
        what: str,
        record: str,
    ) -> bool:
        """Run one compare-and-set step of ``partitions/epochs`` for a split record this owner
        committed or found, with :data:`BARRIER_WRITE_ATTEMPTS` attempts (see :meth:`write_barrier`)."""
        for attempt in range(1, BARRIER_WRITE_ATTEMPTS + 1):
            if self._stopping:
                return False
            try:
                await asyncio.to_thread(step, epoch, partition_id, transaction_id)
            except SplitStateError as exc:
                log.error(
                    "partition %d: %s of epoch %d cannot be written as %d, the %s this owner "
                    "committed or found: %s. Check partitions/epochs and the partition's log "
                    '(docs/design/splits.md, "The handover")',
                    partition_id,
                    what,
                    epoch,
                    transaction_id,
                    record,
                    exc,
                )
                return False
            except (ZooKeeperUnavailableError, StaleMetadataError, KazooException) as exc:
                log.warning(
                    "partition %d: cannot write %s = %d of epoch %d (attempt %d of %d): %s",
                    partition_id,
                    what,
                    transaction_id,
                    epoch,
                    attempt,
                    BARRIER_WRITE_ATTEMPTS,
                    exc,
                )
                await asyncio.sleep(BARRIER_WRITE_DELAY)
                continue
            log.info("partition %d: %s of epoch %d is %d", partition_id, what, epoch, transaction_id)
            return True
        log.error(
            "partition %d: gave up writing %s = %d of epoch %d after %d attempts: written again "
            "when partitions/epochs next changes, or by the partition's next owner",
            partition_id,
            what,
            transaction_id,
            epoch,
            BARRIER_WRITE_ATTEMPTS,
        )
        return False

    def _assignment_changed(self, partitions: dict[int, int]) -> None:
        if self._loop is not None and not self._session_lost:
            self._loop.call_soon_threadsafe(self._reconcile, partitions)

    # ---- partitions ----

    def _reconcile(self, desired: dict[int, int]) -> None:
        if self._stopping:
            return
        self._desired = dict(desired)
        for pid in set(self.partitions) | set(desired):
            current = self.partitions.get(pid)
            wanted = desired.get(pid)
            if current is None or current.closed or current.generation != wanted:
                asyncio.get_running_loop().create_task(self._set_partition(pid, wanted))

    async def _set_partition(self, partition_id: int, generation: int | None) -> None:
        lock = self._locks.setdefault(partition_id, asyncio.Lock())
        async with lock:
            if (
                generation is not None
                and self._desired.get(partition_id) != generation
                and not self._stopping
            ):
                return  # superseded by a newer assignment
            current = self.partitions.get(partition_id)
            if current is not None and not current.closed and current.generation == generation:
                return
            if current is not None:
                del self.partitions[partition_id]
                await current.close("the partition moved" if generation is None else "a new generation")
                log.info("partition %d closed (generation %d)", partition_id, current.generation)
            if generation is None or self._stopping or self._cluster is None:
                return
            label = str(partition_id)
            cluster = self._cluster
            committed = self.metrics.committed_records.labels(label)

            def store_factory(on_commit: Callable[[list[Record]], None]) -> StorePartition:
                def counted(records: list[Record]) -> None:
                    committed.inc(len(records))
                    on_commit(records)

                return StorePartition(
                    partition_id,
                    generation,
                    cluster,
                    self.cluster_key,
                    self.num_partitions,
                    self.store_config,
                    on_commit=counted,
                    streams=self._streams,
                )

            partition = Partition(
                partition_id,
                generation,
                store_factory,
                self.partition_config,
                observe_commits=self.metrics.commit_seconds.observe_all,
                archived=self._archived,
                read_epochs=self.read_epochs,
                write_barrier=self.write_barrier,
                write_genesis=self.write_genesis,
            )
            self.partitions[partition_id] = partition
            partition.start()
            if self._epochs is not None:
                partition.epochs_changed(self._epochs)  # a sealing parent or a new child opens at once
            log.info("partition %d opened with generation %d", partition_id, generation)


async def _stop_step(step: Callable[[], object], timeout: float, what: str) -> None:
    """One bounded step of a stop, on a daemon thread: a failure is logged and the stop goes on
    (docs/design/server.md, "Stopping within a bound")."""
    try:
        await call_in_daemon_thread(step, timeout, what)
    except Exception:
        log.exception("%s failed; stopping anyway", what)


class ServerAdminServicer(server_pb2_grpc.ServerAdminServiceServicer):
    """Status of the server's partitions, and store-level appends and reads.

    See docs/design/server.md "What a server does".
    """

    def __init__(self, app: ServerApp) -> None:
        self._app = app

    async def Status(  # noqa: N802 - gRPC method name
        self, request: server_pb2.ServerStatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> server_pb2.ServerStatusResponse:
        await authorize(context, OPERATOR_ROLES, "the server admin service")
        app = self._app
        member = app.member
        return server_pb2.ServerStatusResponse(
            member=member,
            server_id=int(member.removeprefix("member-")) if member else -1,
            endpoint=app.endpoint,
            cluster_manager=app.cluster_manager,
            partitions=[
                server_pb2.PartitionState(
                    partition_id=pid,
                    generation=p.generation,
                    high_water_mark=p.store.high_water_mark,
                    writable=p.store.writable,
                    replicas_in_session=p.store.replicas_in_session,
                    sessions_started=p.store.sessions_started,
                    mounted_clients=p.mounted_clients,
                    client_states=p.client_states,
                )
                for pid, p in sorted(app.partitions.items())
            ],
        )

    async def _partition(self, partition_id: int, context: grpc.aio.ServicerContext[Any, Any]) -> Partition:
        partition = self._app.partitions.get(partition_id)
        if partition is None or partition.closed:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"partition {partition_id} is not on this server ({self._app.endpoint}); "
                "read server/assignment to find its server",
            )
            raise AssertionError("unreachable")  # abort raises
        return partition

    async def AppendRecords(  # noqa: N802 - gRPC method name
        self, request: server_pb2.AppendRecordsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> server_pb2.AppendRecordsResponse:
        await authorize(context, ADMIN_ROLES, "an admin append")
        if not self._app.config.server_admin_appends:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "admin appends (no lock checks, caller-chosen ReqIds) are off on this server; an "
                "operator turns them on with server.adminAppends (WALTZ_SERVER_ADMIN_APPENDS=true)",
            )
            raise AssertionError("unreachable")  # abort raises
        partition = await self._partition(request.partition_id, context)
        target = request.partition_id
        strays = [t.req_id.partition_id for t in request.transactions if t.req_id.partition_id != target]
        if strays:
            # A record's ReqId names the partition it is in (the store sends it in columns
            # without one: storage.proto RecordColumns).
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(strays)} transaction(s) carry a ReqId of partition {strays[0]}, "
                f"not of partition {request.partition_id} they are appended to",
            )
            raise AssertionError("unreachable")  # abort raises
        reserved = [
            (index, refusal)
            for index, t in enumerate(request.transactions)
            if (refusal := reserved_header_refusal(t.header)) is not None
        ]
        if reserved:
            # Split records are the owners' (docs/design/splits.md "Why no update is lost"): an
            # operator's append without locks must not forge a barrier or a genesis either.
            index, refusal = reserved[0]
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(reserved)} transaction(s) of this admin append are refused, the first at "
                f"index {index}: {refusal}; nothing was appended",
            )
            raise AssertionError("unreachable")  # abort raises
        started = time.perf_counter()
        futures = [
            partition.store.submit(ReqId.from_proto(t.req_id), t.header, t.data) for t in request.transactions
        ]
        results = await asyncio.gather(*futures, return_exceptions=True)
        self._app.metrics.commit_seconds.observe(time.perf_counter() - started)
        outcomes = []
        failed = 0
        for result in results:
            if isinstance(result, BaseException):
                failed += 1
                outcomes.append(
                    server_pb2.AppendOutcome(transaction_id=-1, error=f"{type(result).__name__}: {result}")
                )
            else:
                outcomes.append(server_pb2.AppendOutcome(transaction_id=result))
        if failed:
            self._app.metrics.failed_appends.labels(str(request.partition_id)).inc(failed)
        return server_pb2.AppendRecordsResponse(outcomes=outcomes)

    async def ReadRecords(  # noqa: N802 - gRPC method name
        self, request: server_pb2.ReadRecordsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> server_pb2.ReadRecordsResponse:
        await authorize(context, OPERATOR_ROLES, "the server admin service")
        partition = await self._partition(request.partition_id, context)
        try:
            records = await partition.read_records(request.transaction_id, max(1, request.max_records))
        except (WaltzError, TimeoutError) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"partition {request.partition_id}: {exc}")
            raise AssertionError("unreachable") from exc
        return server_pb2.ReadRecordsResponse(
            records=[r.to_proto() for r in records],
            high_water_mark=partition.high_water_mark,
        )


def run_server(config: ServerConfig) -> None:
    """Run a server until SIGTERM or SIGINT."""
    run_until_signalled(ServerApp(config))
