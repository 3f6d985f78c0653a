"""The local cluster supervisor: ZooKeeper, N storage nodes and M servers as processes on loopback.

Design: docs/design/overview.md "Processes and links", "Packages and their imports": every node is
its own OS process on free loopback ports.
:class:`LocalCluster` starts them, creates the cluster through
:class:`~waltz.admin.cluster_admin.ClusterAdmin`, waits until every partition has a writable
owner, and stops everything again. ``waltz up``, the pytest plugin :mod:`waltz.testing`, tests and
benchmarks use it::

    with LocalCluster(storages=3, servers=2, partitions=4) as cluster:
        print(cluster.describe())              # how to connect: ZooKeeper, root, ports
        endpoint = cluster.owner(0)            # host:port of the server owning partition 0
        cluster.kill_server(cluster.owner_index(0))
        cluster.wait_ready()                   # another server owns it now, and can write

:class:`LocalCluster` composes the rooms of the harness: the option groups of
:mod:`waltz.local.options` (processes, security, network), the node processes
(:class:`~waltz.local.cluster_nodes.ClusterNodes`), the certificates and ZooKeeper credential
(:class:`~waltz.local.security.ClusterSecurity`) and, in namespace mode, the hosts
(:class:`~waltz.local.namespaced.NamespaceHosts`).

The work directory (a temporary directory removed at :meth:`LocalCluster.close`, or a directory
given by the caller and kept) holds::

    cluster.json          the layout (name, root, ports), to start a kept cluster again
    processes.json        the processes started (name, PID, start time): the next start on the
                          directory kills those a crashed run left running (:mod:`waltz.local.leftovers`)
    zookeeper-credentials/ the ZooKeeper credential of each role, ``<role>.digest`` holding
                          ``user:password`` (mode 0600), when ``SecurityOptions.zookeeper_auth``
                          is on (kept with the work directory, reused on resume; an earlier
                          version's work directory keeps its single ``zookeeper-digest``)
    tls/                  the CA and role certificates of a secure cluster
    zookeeper/            ZooKeeper's zoo.cfg, zookeeper.log and data (unless ZooKeeper is external)
    config/<node>.yaml    in namespace mode, each node's configuration file (``--config``)
    storage-<i>/          storage node i's directory
    logs/storage-<i>.log  each node's output
    logs/server-<j>.log

Starting again on a kept work directory resumes the same cluster: same ports, same data, same
cluster key (storage nodes only ever serve the cluster whose key is in their control file).

With ``network=NetworkOptions(mode="namespaces")`` every process runs on a host of its own: a
network namespace with its own address on a bridge (:class:`~waltz.local.netns.NetworkLab`),
ZooKeeper on port 2181, every storage node on 55280 (admin 55281), every server on 55180, as on the
hosts of a deployment (docs/deploy.md), each started with ``waltz storage start --config <file>``
or ``waltz server start --config <file>``. The supervisor, in the machine's own namespace, reaches
every host through the bridge; :meth:`LocalCluster.host` gives a host's address and network
namespace (``ip netns exec <namespace>`` runs a command there), and the network faults of ``waltz
chaos`` cut hosts apart with :attr:`LocalCluster.network_lab`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from waltz.errors import ConfigurationError, MetadataError
from waltz.local.certificates import ClusterCertificates
from waltz.local.cluster_metadata import ClusterMetadata
from waltz.local.cluster_nodes import ClusterNodes
from waltz.local.layout import LAYOUT_FILE, ClusterLayout
from waltz.local.leftovers import PROCESSES_FILE, note_processes, stop_leftovers
from waltz.local.namespaced import NamespaceHosts
from waltz.local.netns import Host, NetworkLab
from waltz.local.nodes import LocalServer, LocalStorageNode
from waltz.local.options import (
    DEFAULT_SERVER_ENV,
    Network,
    NetworkOptions,
    ProcessOptions,
    SecurityOptions,
)
from waltz.local.processes import ManagedProcess, ServiceStartError, wait_until
from waltz.local.readiness import (
    ClusterNotReadyError,
    PartitionOwner,
    PartitionProblem,
    Problem,
    not_ready_message,
    probe_partitions,
)
from waltz.local.security import ClusterSecurity
from waltz.local.zookeeper import LocalZooKeeper
from waltz.metadata.replicas import spread_replicas
from waltz.metadata.values import check_zookeeper_connect_string
from waltz.metadata.zk import ClusterPaths
from waltz.metadata.zk_roles import Role, RoleCredentials
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.private_files import hold_directory, private_directory
from waltz.protocol.channels import TlsConfig
from waltz.protocol.cluster_key import cluster_key_fingerprint

if TYPE_CHECKING:
    from waltz.admin.split_report import SplitReport
    from waltz.metadata.epochs import PartitionEpochs

__all__ = ["LocalCluster"]

log = logging.getLogger(__name__)

#: Seconds a local cluster waits for a running ZooKeeper it was given (``zookeeper=``) to answer,
#: before it starts any node: a wrong address fails in this long, not in the start timeout.
EXTERNAL_ZOOKEEPER_WAIT = 20.0


class LocalCluster:
    """ZooKeeper, storage nodes and servers as processes on loopback, and a cluster made of them.

    Nothing starts before :meth:`start` (or entering the ``with`` block), which returns once every
    partition has a writable owner. :meth:`close` stops the servers (SIGTERM), then the storage
    nodes, then ZooKeeper, and leaves no process behind, also when :meth:`start` fails.

    The methods block; call them from synchronous code, or through ``asyncio.to_thread`` from a
    coroutine (:class:`ClusterAdmin` runs an event loop of its own while creating the cluster).

    Args:
        storages: the number of storage nodes (at least 1).
        servers: the number of servers (at least 1).
        partitions: the number of partitions (at least 1).
        replicas: replicas per partition, spread round-robin (docs/design/zookeeper.md "Replica
            assignments and groups"); None means ``min(3, storages)``.
        name: the cluster's name (in ``<root>/cluster``).
        root: the cluster root znode; None means ``/waltz/<name>`` on the cluster's own ZooKeeper
            and ``/waltz-local/<name>-<8 hex digits>`` on an external one.
        work_dir: where data and logs go, kept at close (and resumed by the next start); None
            makes a temporary directory that :meth:`close` removes.
        zookeeper: the connect string of a running ZooKeeper to use instead of starting one
            (``host:port[,host:port...][/chroot]``).
        delete_root: delete the cluster's znodes from an external ZooKeeper at close; None means
            "when the work directory is temporary" (a kept one may be started again).
        processes: how the processes run: metrics, timeouts, environment and extra options
            (:class:`~waltz.local.options.ProcessOptions`); None: its defaults.
        security: mutual TLS with role certificates, ZooKeeper credentials
            (:class:`~waltz.local.options.SecurityOptions`); None: its defaults.
        network: loopback or a host of its own per process, client hosts, subnet
            (:class:`~waltz.local.options.NetworkOptions`); None: its defaults (loopback).
        keep_on_failure: keep the temporary work directory (``work_dir`` None) when
            :meth:`start` fails once a node was started, for the logs its error names
            (:attr:`failed_start_dir`); by default, and when it failed before (ZooKeeper not
            answering), it is removed.

    Raises:
        ConfigurationError: an argument is out of range, ``zookeeper`` is not a connect string,
            or namespace mode is asked for with an external ZooKeeper (the hosts cannot reach it).
    """

    def __init__(
        self,
        *,
        storages: int = 3,
        servers: int = 2,
        partitions: int = 4,
        replicas: int | None = None,
        name: str = "local",
        root: str | None = None,
        work_dir: Path | str | None = None,
        zookeeper: str | None = None,
        delete_root: bool | None = None,
        processes: ProcessOptions | None = None,
        security: SecurityOptions | None = None,
        network: NetworkOptions | None = None,
        keep_on_failure: bool = False,
    ) -> None:
        processes = processes or ProcessOptions()
        network = network or NetworkOptions()
        for what, value in (("storages", storages), ("servers", servers), ("partitions", partitions)):
            if value < 1:
                raise ConfigurationError(f"a local cluster needs at least 1 of {what}, got {value}")
        replicas = min(3, storages) if replicas is None else replicas
        if not 1 <= replicas <= storages:
            raise ConfigurationError(
                f"replicas {replicas} must be between 1 and the number of storage nodes ({storages})"
            )
        if not name:
            raise ConfigurationError("a local cluster needs a name")
        if network.mode == "namespaces" and zookeeper is not None:
            raise ConfigurationError(
                "a local cluster in network namespaces starts its own ZooKeeper on a host of its "
                "own; an external ZooKeeper is not reachable from the hosts"
            )
        if zookeeper is not None:
            try:
                check_zookeeper_connect_string(zookeeper)
            except MetadataError as exc:
                raise ConfigurationError(f"the running ZooKeeper to use: {exc}") from None
        self._root_given = root is not None
        if root is None:
            root = f"/waltz/{name}" if zookeeper is None else f"/waltz-local/{name}-{uuid.uuid4().hex[:8]}"
        try:
            self._paths = ClusterPaths.of(root)
        except MetadataError as exc:
            raise ConfigurationError(str(exc)) from None
        self._num_storages = storages
        self._num_servers = servers
        self._partitions = partitions
        self._replicas = replicas
        self._name = name
        self._external_zookeeper = zookeeper
        self._processes = processes
        self._security = ClusterSecurity(security or SecurityOptions())
        self._nodes = ClusterNodes(storages=storages, servers=servers, zookeeper=zookeeper, options=processes)
        self._network = network
        self._hosts = (
            NamespaceHosts(
                storages=storages, servers=servers, client_hosts=network.client_hosts, subnet=network.subnet
            )
            if network.mode == "namespaces"
            else None
        )
        self._keep = work_dir is not None
        self._metadata = ClusterMetadata(
            delete_root=zookeeper is not None and (not self._keep if delete_root is None else delete_root)
        )
        self._work_dir = Path(work_dir).resolve() if work_dir is not None else None
        self._work_dir_fd: int | None = None  # holds the work directory's flock while started
        self._kept_layout: ClusterLayout | None = None  # the kept cluster's, once prepared
        self._cluster_key: str | None = None
        self._state = "new"
        self.startup_seconds: float | None = None
        """Seconds :meth:`start` took, from launching the first process until every partition was writable."""
        self._keep_on_failure = keep_on_failure
        self._launched = False  # a node's process was started: its log is worth keeping
        self.failed_start_dir: Path | None = None
        """The temporary work directory kept after :meth:`start` failed (``keep_on_failure``), else None."""

    # --- what the cluster is ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The cluster's name."""
        return self._name

    @property
    def root(self) -> str:
        """The cluster root znode, e.g. ``/waltz/local``."""
        return self._paths.root

    @property
    def num_partitions(self) -> int:
        """The number of partitions."""
        return self._partitions

    @property
    def replicas(self) -> int:
        """Replicas per partition."""
        return self._replicas

    @property
    def work_dir(self) -> Path:
        """The work directory (data and logs).

        Raises:
            RuntimeError: the cluster uses a temporary directory and has not been started.
        """
        if self._work_dir is None:
            raise RuntimeError("the local cluster has no work directory before start()")
        return self._work_dir

    @property
    def network(self) -> Network:
        """Where the processes run: ``"loopback"`` or ``"namespaces"``."""
        return self._network.mode

    @property
    def network_lab(self) -> NetworkLab | None:
        """The hosts of namespace mode (to cut or isolate them), or None on loopback or before start."""
        return self._hosts.lab if self._hosts is not None else None

    def host(self, name: str) -> Host:
        """A host of namespace mode: ``zookeeper``, ``storage-<i>``, ``server-<j>`` or ``client-<k>``.

        Its ``address`` is the host's IPv4 address and its ``namespace`` the network namespace a
        process joins to run there (``ip netns exec <namespace> ...``).

        Raises:
            RuntimeError: the cluster is not in namespace mode, or not started.
            KeyError: no such host.
        """
        if self._hosts is None or self._hosts.lab is None:
            raise RuntimeError(
                f"local cluster {self._name!r} has no hosts: it runs on {self.network}"
                + ("" if self.network == "loopback" else " and is not started")
            )
        return self._hosts.host(name)

    @property
    def zookeeper(self) -> LocalZooKeeper | None:
        """The cluster's own ZooKeeper (to kill or pause it), or None when it is external."""
        return self._nodes.zookeeper

    @property
    def zookeeper_connect_string(self) -> str:
        """The ZooKeeper connect string, e.g. ``127.0.0.1:40123``.

        Raises:
            RuntimeError: the cluster's own ZooKeeper has not been started.
        """
        return self._nodes.zookeeper_connect_string

    @property
    def storages(self) -> tuple[LocalStorageNode, ...]:
        """The storage nodes, ``storage-0`` first (empty before :meth:`start`)."""
        return self._nodes.storages

    @property
    def servers(self) -> tuple[LocalServer, ...]:
        """The servers, ``server-0`` first (empty before :meth:`start`)."""
        return self._nodes.servers

    @property
    def server_endpoints(self) -> list[str]:
        """``host:port`` of every server, in index order."""
        return [s.endpoint for s in self._nodes.servers]

    @property
    def cluster_key(self) -> str:
        """The cluster key (a UUID string) every storage node of the cluster holds.

        Raises:
            RuntimeError: the cluster has not been created yet.
        """
        if self._cluster_key is None:
            raise RuntimeError("the local cluster has no cluster key before start()")
        return self._cluster_key

    @property
    def certificates(self) -> ClusterCertificates | None:
        """The CA and role certificates of a secure cluster (made at :meth:`start`), else None."""
        return self._security.certificates

    @property
    def admin_tls(self) -> TlsConfig | None:
        """The client TLS files the cluster's supervisor uses on its nodes' ports (the ``admin``
        certificate of a secure cluster, or the caller's ``SecurityOptions.tls``), or None for a
        plaintext cluster: for admin clients of the nodes (``ServerAdminClient``,
        ``StorageAdminClient``)."""
        return self._security.tls

    @property
    def zookeeper_security(self) -> ZooKeeperSecurity:
        """The security of the cluster's ZooKeeper sessions (its credential once :meth:`start` ran)."""
        return self._security.zookeeper_security

    @property
    def zookeeper_digest_file(self) -> Path | None:
        """The file holding the operators' ZooKeeper credential, or None without one."""
        return self._security.digest_file(self._work_dir)

    @property
    def zookeeper_role_credentials(self) -> RoleCredentials | None:
        """The ZooKeeper credential of each role (docs/design/zookeeper.md, "Roles"), or None
        (no credential, or the single credential of a caller or of an earlier version's work
        directory)."""
        return self._security.role_credentials

    def zookeeper_settings(self, role: Role | str = Role.OPERATOR) -> dict[str, Any]:
        """Settings fields (``WaltzClientConfig``, ``ClusterAdminConfig``) that reach this cluster.

        The connect string, the root and, when set, the role's credential file and ZooKeeper TLS
        files. The operator's credential (the default) may do everything; an application's client
        takes the client's, which cannot read the cluster key::

            WaltzClientConfig(**cluster.zookeeper_settings("client"), client_max_concurrent_transactions=8)

        Args:
            role: a :class:`~waltz.metadata.zk_roles.Role` or its name (``"server"``,
                ``"operator"``, ``"client"``).

        Raises:
            ValueError: no such role.
        """
        return {
            "zookeeper_connect_string": self.zookeeper_connect_string,
            "cluster_root": self.root,
            **self._security.zookeeper_settings(self._work_dir, _role(role)),
        }

    def zookeeper_env(self, role: Role | str = Role.OPERATOR) -> dict[str, str]:
        """The ``WALTZ_ZOOKEEPER_*`` variables giving a process a role's credential and TLS files
        (``role`` as for :meth:`zookeeper_settings`).

        Only those: not the connect string nor the root, which a process also needs (settings
        built from these alone fail: ``zookeeper_connect_string not set``). Give an
        application's process :meth:`client_env`, an operator's :meth:`admin_env`: each holds
        everything.

        Raises:
            ValueError: no such role.
        """
        return self._security.zookeeper_env(self._work_dir, _role(role))

    def client_settings(self, certificate: str = "client") -> dict[str, Any]:
        """``WaltzClientConfig`` fields that reach this cluster as an application does.

        The connect string, the root, the client role's ZooKeeper credential (which cannot read
        the cluster key; the operators' with the ``operator`` or ``admin`` certificate, whose
        tools read the storage nodes' assignments) and, in a secure cluster, client TLS presenting
        ``certificate`` (a role certificate of :attr:`certificates`: ``client`` for applications;
        docs/design/overview.md, "Roles")::

            WaltzClientConfig(**cluster.client_settings(), client_max_concurrent_transactions=8)

        Args:
            certificate: the role certificate the client presents (``client``, ``operator``,
                ``admin``, ``node``); unused in a cluster without certificates.

        Raises:
            KeyError: no such certificate in this cluster's certificates.
        """
        return self._settings_with_tls(_zookeeper_role(certificate), "client_tls", certificate)

    def client_env(self, certificate: str = "client") -> dict[str, str]:
        """The environment giving a process (``waltz client ...``, an application) what
        :meth:`client_settings` holds: ``WALTZ_ZOOKEEPER_CONNECT_STRING``, ``WALTZ_CLUSTER_ROOT``,
        the client role's ``WALTZ_ZOOKEEPER_*`` and, in a secure cluster, ``WALTZ_CLIENT_TLS_*``."""
        return _as_env(self.client_settings(certificate))

    def admin_settings(self, certificate: str = "operator") -> dict[str, Any]:
        """``ClusterAdminConfig`` fields of an operator (the default) or admin: the operators'
        ZooKeeper credential and, in a secure cluster, the storage admin ports' TLS presenting
        ``certificate`` (``operator`` reads, ``admin`` changes; docs/design/overview.md, "Roles").

        Raises:
            KeyError: no such certificate in this cluster's certificates.
        """
        return self._settings_with_tls(Role.OPERATOR, "cluster_ssl", certificate)

    def admin_env(self, certificate: str = "operator") -> dict[str, str]:
        """The environment of :meth:`admin_settings` for the ``waltz`` command
        (``WALTZ_ZOOKEEPER_*``, ``WALTZ_CLUSTER_ROOT`` and ``WALTZ_CLUSTER_SSL_*``)."""
        return _as_env(self.admin_settings(certificate))

    def _settings_with_tls(self, role: Role, prefix: str, certificate: str) -> dict[str, Any]:
        """:meth:`zookeeper_settings` of ``role``, and in a secure cluster the TLS files presenting
        ``certificate`` as the settings fields ``<prefix>_ca_file``, ``_cert_file``, ``_key_file``."""
        settings: dict[str, Any] = self.zookeeper_settings(role)
        files = self._security.certificates
        if files is not None:
            tls = files.tls(certificate)
            settings |= {
                f"{prefix}_ca_file": tls.ca_file,
                f"{prefix}_cert_file": tls.cert_file,
                f"{prefix}_key_file": tls.key_file,
            }
        return settings

    def pids(self) -> dict[str, int]:
        """Process name (``zookeeper``, ``storage-0``, ``server-1``...) -> PID, for running processes."""
        return self._nodes.pids()

    def log_paths(self) -> dict[str, Path]:
        """Process name (as in :meth:`pids`) -> its log file, for every process this cluster
        started whose output is kept (an external ZooKeeper has none here)."""
        return self._nodes.log_paths()

    # --- life cycle -------------------------------------------------------------------------------

    def _connect_metadata(self, timeout: float) -> None:
        """Open the cluster's ZooKeeper session, within ``timeout`` seconds.

        Raises:
            ZooKeeperUnavailableError: ZooKeeper did not answer in time.
        """
        self._metadata.connect(
            self.zookeeper_connect_string,
            self._paths,
            timeout=timeout,
            security=self._security.zookeeper_security,
        )

    def prepare(self) -> None:
        """Take the work directory and check what it holds, before anything starts: what
        :meth:`start` does first, and does itself when this was not called. A caller that says
        what it starts (``waltz up``) calls it before saying so, so that a directory another
        cluster runs on, or one that holds a different cluster, is refused first
        (docs/local-cluster.md, "`waltz up`").

        Makes the temporary work directory (``work_dir`` None), takes the directory's lock, stops
        the processes a crashed run on it left running, and checks a kept cluster's layout and
        credentials against the arguments. On failure the cluster is closed: the lock is released
        and a temporary directory removed.

        Raises:
            RuntimeError: the cluster was prepared or started before.
            ConfigurationError: another local cluster runs on the work directory, or it holds a
                different cluster (or one made without the credentials asked for).
        """
        if self._state != "new":
            raise RuntimeError(f"a LocalCluster starts once (this one is {self._state}); create a new one")
        self._state = "preparing"
        try:
            if self._work_dir is None:
                self._work_dir = Path(tempfile.mkdtemp(prefix="waltz-local-")).resolve()
            private_directory(self._work_dir)
            self._security.check_own(self._work_dir)
            self._hold_work_dir()
            stop_leftovers(self._work_dir)
            self._kept_layout = self._load_layout()
            if self._kept_layout is not None:
                self._security.check_resumable(self._work_dir)
        except BaseException:
            self.close()
            raise
        self._state = "prepared"

    def start(self) -> None:
        """Start ZooKeeper, the storage nodes and the servers, create the cluster, wait until ready.

        Storage nodes start while ZooKeeper does; on a kept work directory that holds a cluster
        already (``cluster.json``), the same ports are used and the cluster is not created again,
        and the processes an earlier run on it left running (its ``processes.json``; a run
        killed on a system where its nodes do not die with it) are killed first, as namespace
        mode does with a crashed run's namespaces (docs/local-cluster.md, "`waltz up`").

        Raises:
            RuntimeError: the cluster was started before (a LocalCluster starts once).
            ConfigurationError: another local cluster runs on the work directory, it holds a
                different cluster (:meth:`prepare`), or a cluster exists under the root already.
            ServiceStartError: another process listens on a port of the kept cluster's nodes; a
                process exited or did not open its ports, or a storage node refused the cluster;
                or a process it started had exited by the time the cluster was ready (other
                processes answer on its ports); the message ends with the tail of its log.
            ClusterNotReadyError: not every partition had a writable owner within
                ``start_timeout`` seconds.
        """
        if self._state == "new":
            self.prepare()
        if self._state != "prepared":
            raise RuntimeError(f"a LocalCluster starts once (this one is {self._state}); create a new one")
        self._state = "starting"
        started = time.monotonic()
        deadline = started + self._processes.start_timeout

        def remaining() -> float:
            return max(0.5, deadline - time.monotonic())

        layout = self._kept_layout
        work_dir = self.work_dir  # made by prepare()
        try:
            if self._hosts is not None:
                self._hosts.start(layout.subnet if layout is not None else None)
            self._security.start(work_dir, self._hosts.addresses() if self._hosts is not None else [])
            external = self._nodes.zookeeper_is_external
            if external:
                # A ZooKeeper of the caller's is asked first, and briefly: a wrong address fails
                # at once, not after every node started and the whole start timeout ran out.
                self._connect_metadata(min(remaining(), EXTERNAL_ZOOKEEPER_WAIT))
            self._nodes.build(
                work_dir,
                self.root,
                layout,
                self._hosts,
                storage_env=self._security.storage_env(self._processes.storage_env),
                server_env=self._security.server_env(
                    {**DEFAULT_SERVER_ENV, **self._processes.server_env}, work_dir
                ),
            )
            if layout is not None:
                self._check_ports_free()
            self._launched = True
            for node in self._nodes.storages:
                node.launch()
            if self._nodes.zookeeper is not None:
                self._nodes.zookeeper.start()
            self._note_processes()
            for node in self._nodes.storages:
                node.wait_started(remaining())
            if not external:
                self._connect_metadata(remaining())
            if self._nodes.zookeeper is not None and self._security.role_credentials is not None:
                self._metadata.close_above_root(self._security.role_credentials)
            self._cluster_key = self._metadata.create(
                self._name,
                self._partitions,
                self._replicas,
                {self._connect_string(n): n for n in self._nodes.storages},
                tls=self._security.tls,
                resuming=layout is not None,
                credentials=self._security.role_credentials,
            )
            if self._keep:
                self._layout().save(self.work_dir / LAYOUT_FILE)
            for server in self._nodes.servers:
                server.launch()
            self._note_processes()
            for server in self._nodes.servers:
                server.wait_started(remaining())
            self.wait_ready(remaining())
            self._check_none_exited()
        except BaseException as exc:
            if (
                self._keep_on_failure
                and self._launched  # else it holds certificates and credentials only, no log
                and not self._keep
                and not isinstance(exc, KeyboardInterrupt | SystemExit)
            ):
                self.failed_start_dir = self._work_dir  # its logs are what the error points to
            self.close()
            raise
        self._state = "running"
        self.startup_seconds = time.monotonic() - started
        log.info(
            "local cluster %r ready in %.1fs: %d storage nodes, %d servers, %d partitions under %s on %s",
            self._name,
            self.startup_seconds,
            len(self._nodes.storages),
            len(self._nodes.servers),
            self._partitions,
            self.root,
            self.zookeeper_connect_string,
        )

    def close(self) -> None:
        """Stop the servers (SIGTERM), then the storage nodes, then ZooKeeper. Idempotent.

        Processes that do not exit in time are killed; whatever happens, no process is left
        running. A temporary work directory is removed (a given one is kept), and the cluster's
        znodes are deleted from an external ZooKeeper as ``delete_root`` says.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        try:
            self._nodes.stop()
            self._metadata.close()
            if self._nodes.zookeeper is not None and self._keep:
                self._nodes.zookeeper.stop()
        finally:
            self._nodes.close()
            if self._hosts is not None:
                self._hosts.close()
            if not self._keep and self._work_dir is not None and self.failed_start_dir is None:
                shutil.rmtree(self._work_dir, ignore_errors=True)
            elif self._work_dir is not None and self._work_dir_fd is not None:
                (self._work_dir / PROCESSES_FILE).unlink(missing_ok=True)  # none runs any more
            if self._work_dir_fd is not None:
                os.close(self._work_dir_fd)  # closing the descriptor releases the flock
                self._work_dir_fd = None
        log.info("local cluster %r closed", self._name)

    def _note_processes(self) -> None:
        """Note the processes that run in the work directory (while this cluster holds it)."""
        if self._work_dir is not None and self._work_dir_fd is not None:
            note_processes(self._work_dir, self._nodes.processes())

    def _check_ports_free(self) -> None:
        """Fail before launching anything when another process listens on a port the kept
        cluster's nodes use again: its answers would pass for theirs.

        Raises:
            ServiceStartError: one does; it names each node and port.
        """
        busy = self._nodes.ports_in_use()
        if busy:
            raise ServiceStartError(
                f"the cluster kept in {self.work_dir} uses its ports again, and other processes listen "
                f"on {', '.join(busy)} (nodes a crashed run left running, say: `ss -ltnp 'sport = :PORT'` "
                "names the process on a port): stop them and start again, or use another work directory"
            )

    def _check_none_exited(self) -> None:
        """Fail when a process this start launched has exited although the cluster answers.

        Raises:
            ServiceStartError: one has; it names each one and its log's last lines.
        """
        exited: list[ManagedProcess] = [p for p in self._nodes.processes() if not p.is_running()]
        if not exited:
            return
        names = ", ".join(f"{p.name} (exit code {p.returncode})" for p in exited)
        first = exited[0]
        raise ServiceStartError(
            f"the cluster answered, but {names} of this start exited: other processes answer on "
            "their ports (nodes a crashed run left running, say: `ss -ltnp` names the process on "
            f"a port); stop them and start again. The log of {first.name} ({first.log_path}) "
            f"ends with:\n{first.log_tail()}"
        )

    def _hold_work_dir(self) -> None:
        """Take the work directory for this cluster alone: an exclusive ``flock`` on it, held until
        :meth:`close` or the process's end, and not inherited by the processes it starts
        (docs/local-cluster.md, "`waltz up`").

        Raises:
            ConfigurationError: another local cluster (``waltz up``, ``waltz demo`` or a
                ``LocalCluster``) runs on the directory.
        """
        fd = hold_directory(self.work_dir)
        if fd is None:
            raise ConfigurationError(
                f"work directory {self.work_dir} is in use by a local cluster that runs now (`waltz up`, "
                "`waltz demo` or a LocalCluster of another process): use that cluster (its `export` "
                "lines), stop it first (Ctrl-C where it runs), or give another work directory"
            )
        self._work_dir_fd = fd

    def __enter__(self) -> Self:
        if self._state in ("new", "prepared"):
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def replica_digests(
        self,
        high_water_marks: Mapping[int, int],
        timeout: float = 60.0,
        first_ids: Mapping[int, int] | None = None,
    ) -> dict[int, set[int]]:
        """Per partition, the digests of every storage node's records ``first..mark`` (one: identical).

        ``first_ids`` gives each partition's first transaction to read (default 0, or for a new
        partition of a split its genesis, ``B(p) + 1``, where its log starts).

        See :func:`waltz.admin.replica_digests.replica_digests` (admin ports only).

        Raises:
            TimeoutError: a replica lacked records up to the mark for ``timeout`` seconds.
        """
        from waltz.admin.replica_digests import replica_digests

        if first_ids is None:
            first_ids = self.partition_epochs(timeout).first_transaction_ids
        return replica_digests(
            [node.admin_address for node in self._nodes.storages],
            str(self.cluster_key),
            self.num_partitions,
            high_water_marks,
            timeout=timeout,
            tls=self._security.tls,
            first_ids=first_ids,
        )

    # --- partition splits ---------------------------------------------------------------------------

    def partition_epochs(self, timeout: float = 30.0) -> PartitionEpochs:
        """The cluster's partition epochs as ZooKeeper holds them now: the partitions that exist
        (``partition_ids``), each new child's first transaction ID (``first_transaction_ids``), a
        split under way (docs/design/splits.md "What ZooKeeper holds").

        Raises:
            ZooKeeperUnavailableError: ZooKeeper did not answer within ``timeout`` seconds.
        """
        from waltz.metadata.epochs import PartitionEpochsZk

        metadata = self._metadata
        return PartitionEpochsZk(metadata.client, metadata.paths, timeout=timeout).read().value

    def split(
        self, to: int, *, wait: float = 120.0, progress: Callable[[str], None] | None = None
    ) -> SplitReport:
        """Split the log to ``to`` partitions as its admin would, ``waltz cluster split --to``
        (docs/design/splits.md "The handover"): from wherever a split to ``to`` stands, over a
        ZooKeeper session of its own with the admin's credential and certificate.

        Args:
            to: the new count, a multiple of the current one.
            wait: seconds the run waits, in all, for the parents' owners to write their barriers.
            progress: receives one line per step taken.

        Returns:
            Where the split stands: complete, or why not (run it again to resume it).

        Raises:
            SplitStateError: ``to`` is no split of the current count, or another split runs.
            ZooKeeperUnavailableError: ZooKeeper went away; the split stands where it stopped.
        """
        from waltz.admin.cluster_admin import ClusterAdmin
        from waltz.admin.config import ClusterAdminConfig
        from waltz.admin.split_run import SplitRun

        settings = ClusterAdminConfig(**self.admin_settings("admin"))
        connect_string, root = settings.require()
        with ClusterAdmin.connect(
            connect_string,
            root,
            connect_timeout=30,
            tls=settings.tls(),
            security=settings.zookeeper_security(),
        ) as admin:
            return SplitRun(admin.cluster, tls=admin.tls, wait=wait, progress=progress).run(to)

    # --- readiness and owners ---------------------------------------------------------------------

    def wait_ready(self, timeout: float | None = None) -> dict[int, PartitionOwner]:
        """Wait until every partition has an owner that reports it writable under its generation,
        and the owners are the ones the cluster manager keeps.

        The owners come from the assignment in ZooKeeper; each one's ``Status`` (server admin
        protocol) must list the partition as writable with the assigned generation. Every server
        of the cluster that runs and is not paused must have joined, and no partition may be
        waiting to move to a server's share: once this returns, :meth:`owner` names the server
        that holds the partition until a fault or an operator moves it.

        Args:
            timeout: seconds to wait; None means ``start_timeout``.

        Returns:
            Partition ID -> its writable owner.

        Raises:
            ClusterNotReadyError: not ready in time; the message says, for each partition, what was
                missing, and ends with the state of the processes and the tail of relevant logs.
        """
        timeout = self._processes.start_timeout if timeout is None else timeout
        problems: list[PartitionProblem] = []

        def ready() -> dict[int, PartitionOwner] | None:
            try:
                owners, found = probe_partitions(
                    self._metadata.client,
                    self._paths,
                    self._partitions,
                    self._replicas,
                    self._nodes.servers,
                    self._security.tls,
                    active=self._nodes.active_servers(),
                )
            except Exception as exc:  # ZooKeeper unreachable, say: report it, and keep trying
                owners, found = {}, [PartitionProblem(Problem.ZOOKEEPER_UNREADABLE, detail=repr(exc))]
            problems[:] = found
            return owners if not found else None

        try:
            return wait_until(
                ready,
                timeout=timeout,
                what=f"a writable owner of every partition of {self.root}",
                interval=0.1,
            )
        except TimeoutError as exc:
            title = f"local cluster {self._name!r} under {self.root}: not ready after {timeout:g}s:"
            nodes = self._nodes
            message = not_ready_message(title, problems, nodes.servers, nodes.storages, nodes.zookeeper)
            raise ClusterNotReadyError(message) from exc

    def owner(self, partition_id: int) -> str:
        """``host:port`` of the server the assignment places ``partition_id`` on right now.

        Right after a failure the owner may not be writable yet: call :meth:`wait_ready` first.

        Raises:
            ValueError: no such partition (below 0, or above the count at creation and placed by
                no split).
            ClusterNotReadyError: no server owns the partition right now.
        """
        if partition_id < 0:
            raise ValueError(f"partition {partition_id} does not exist (0..{self._partitions - 1})")
        endpoint = self._metadata.owner(partition_id)
        if endpoint is None and partition_id >= self._partitions:
            raise ValueError(
                f"partition {partition_id} does not exist (0..{self._partitions - 1} at creation, and "
                "no split placed it)"
            )
        if endpoint is None:
            raise ClusterNotReadyError(
                f"partition {partition_id} of {self.root} has no owner right now (no live server, or "
                "the cluster manager has not placed it yet): call wait_ready() first"
            )
        return endpoint

    def owned_partitions(self) -> dict[str, list[int]]:
        """The partitions each server owns right now, by endpoint (one read of the assignment);
        empty when ZooKeeper cannot tell."""
        return self._metadata.owned_partitions()

    def owner_index(self, partition_id: int) -> int:
        """The index in :attr:`servers` of the owner of ``partition_id`` (for :meth:`kill_server`).

        Raises:
            ValueError: no such partition.
            ClusterNotReadyError: no server of this cluster owns the partition right now.
        """
        endpoint = self.owner(partition_id)
        for index, server in enumerate(self._nodes.servers):
            if server.endpoint == endpoint:
                return index
        raise ClusterNotReadyError(
            f"partition {partition_id} is owned by {endpoint}, not a server of this cluster"
        )

    # --- faults -----------------------------------------------------------------------------------

    def kill_server(self, index: int) -> None:
        """Kill server ``index`` with SIGKILL (a crash); its partitions move after the session timeout."""
        self._nodes.server(index).kill()

    def stop_server(self, index: int) -> int | None:
        """Stop server ``index`` gracefully (SIGTERM; its partitions move at once); its exit code."""
        return self._nodes.server(index).stop()

    def restart_server(self, index: int) -> None:
        """Kill server ``index`` if it runs and start it again on the same port (waits for the port)."""
        self._nodes.restart("server", index)
        self._note_processes()

    def pause_server(self, index: int) -> None:
        """Freeze server ``index`` (SIGSTOP), e.g. to test fencing of a paused owner."""
        self._nodes.pause("server", index)

    def resume_server(self, index: int) -> None:
        """Thaw server ``index`` (SIGCONT)."""
        self._nodes.resume("server", index)

    def kill_storage(self, index: int) -> None:
        """Kill storage node ``index`` with SIGKILL (a crash)."""
        self._nodes.storage(index).kill()

    def stop_storage(self, index: int) -> int | None:
        """Stop storage node ``index`` gracefully (SIGTERM); its exit code."""
        return self._nodes.storage(index).stop()

    def restart_storage(self, index: int) -> None:
        """Kill storage node ``index`` if it runs and start it again (same directory and ports)."""
        self._nodes.restart("storage", index)
        self._note_processes()

    def pause_storage(self, index: int) -> None:
        """Freeze storage node ``index`` (SIGSTOP)."""
        self._nodes.pause("storage", index)

    def resume_storage(self, index: int) -> None:
        """Thaw storage node ``index`` (SIGCONT)."""
        self._nodes.resume("storage", index)

    def heal(self, timeout: float | None = None) -> dict[int, PartitionOwner]:
        """Undo faults: resume paused processes, restart stopped ones, then :meth:`wait_ready`.

        In namespace mode every host's link comes up again and its cuts are removed first.

        Args:
            timeout: seconds :meth:`wait_ready` may take; None means ``start_timeout``.

        Returns:
            Partition ID -> its writable owner.

        Raises:
            ServiceStartError: a process did not start again.
            ClusterNotReadyError: as :meth:`wait_ready`.
        """
        if self._hosts is not None:
            self._hosts.heal()
        self._nodes.heal()
        self._note_processes()
        return self.wait_ready(timeout)

    # --- description ------------------------------------------------------------------------------

    def metrics_urls(self) -> dict[str, str]:
        """The ``/metrics`` URL of each server and storage node that serves metrics, by process
        name (``server-0``, ``storage-0``, ...); ``https`` when the nodes use TLS."""
        return self._nodes.metrics_urls(self._security.http_scheme)

    def describe(self) -> str:
        """How to reach the cluster: ZooKeeper, root, servers, storage and admin ports, metrics, logs.

        Returns:
            Several lines of text, for people (``waltz up`` prints it).
        """
        lines = [
            f"Waltz local cluster {self._name!r}: partitions {self._partitions}, "
            f"replicas per partition {self._replicas}, cluster key "
            + (cluster_key_fingerprint(self._cluster_key) if self._cluster_key else "(not created)"),
        ]
        lines += self._nodes.describe_zookeeper()
        lines.append(f"  cluster root   {self.root}")
        if self._hosts is not None:
            lines += self._hosts.describe_lines()
        placement = self._metadata.replica_placement()
        if placement is None:  # not created yet, or ZooKeeper down: the planned placement
            storages = [self._connect_string(n) for n in self._nodes.storages]
            placement = spread_replicas(storages, self._partitions, self._replicas)
        lines += self._nodes.describe_nodes(
            self.metrics_urls(),
            self.owned_partitions(),
            lambda node: placement.get(self._connect_string(node), ()),
        )
        if self._work_dir is not None:
            kept = "kept" if self._keep else "removed at stop"
            lines.append(f"  work dir       {self._work_dir} ({kept}); logs in {self._work_dir / 'logs'}")
        running = self._state in ("starting", "running")
        exports = (
            f"WALTZ_ZOOKEEPER_CONNECT_STRING={self.zookeeper_connect_string} WALTZ_CLUSTER_ROOT={self.root}"
            if running
            else ""
        )
        lines += self._security.describe_lines(exports, self._work_dir, running=running)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"LocalCluster({self._name!r}, root={self.root!r}, storages={self._num_storages}, "
            f"servers={self._num_servers}, partitions={self._partitions}, {self._state})"
        )

    # --- internals --------------------------------------------------------------------------------

    def _connect_string(self, node: LocalStorageNode) -> str:
        """The connect string of a storage node in ZooKeeper (its address, or as the caller chose)."""
        connect_string_of = self._network.storage_connect_string_of
        return node.address if connect_string_of is None else connect_string_of(node)

    def _load_layout(self) -> ClusterLayout | None:
        """The layout of the cluster a kept work directory holds, checked against the arguments."""
        path = self.work_dir / LAYOUT_FILE
        if not self._keep or not path.exists():
            return None
        layout = ClusterLayout.load(path)
        if not self._root_given:  # a generated root (external ZooKeeper) is the saved one
            self._paths = ClusterPaths.of(layout.root)
        different = layout.differences(
            name=self._name,
            root=self.root,
            partitions=self._partitions,
            replicas=self._replicas,
            storages=self._num_storages,
            external_zookeeper=self._external_zookeeper,
            network=self.network,
        )
        if different:
            raise ConfigurationError(
                f"work directory {self.work_dir} holds another local cluster: {', '.join(different)}; "
                "start it with the same settings, or use another (or an empty) work directory"
            )
        log.info("resuming the local cluster kept in %s", self.work_dir)
        return layout

    def _layout(self) -> ClusterLayout:
        storages, servers = self._nodes.layout_ports()
        return ClusterLayout(
            name=self._name,
            root=self.root,
            partitions=self._partitions,
            replicas=self._replicas,
            external_zookeeper=self._external_zookeeper,
            zookeeper_port=self._nodes.zookeeper.port if self._nodes.zookeeper is not None else None,
            storages=storages,
            servers=servers,
            network=self.network,
            subnet=self._hosts.subnet if self._hosts is not None else None,
        )


def _zookeeper_role(certificate: str) -> Role:
    """The ZooKeeper credential that goes with a role certificate: the operators' for the
    ``operator`` and ``admin`` certificates, the clients' for the others."""
    return Role.OPERATOR if certificate in ("operator", "admin") else Role.CLIENT


def _as_env(settings: dict[str, Any]) -> dict[str, str]:
    """Settings fields as the ``WALTZ_*`` variables the settings classes read (``env_prefix``
    ``WALTZ_``: ``cluster_root`` is ``WALTZ_CLUSTER_ROOT``)."""
    return {f"WALTZ_{name.upper()}": str(value) for name, value in settings.items()}


def _role(role: Role | str) -> Role:
    """``role`` as a :class:`Role`, given as one or by its name.

    Raises:
        ValueError: no role has that name.
    """
    if isinstance(role, Role):
        return role
    try:
        return Role(role)
    except ValueError:
        names = ", ".join(repr(r.value) for r in Role)
        raise ValueError(f"no ZooKeeper role {role!r}: the roles are {names}") from None
