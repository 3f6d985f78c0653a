"""The node processes of a local cluster: its ZooKeeper, storage nodes and servers, by index.

Design: docs/design/overview.md, "Processes and links": every node is an OS process of its own.
:class:`ClusterNodes` builds a local cluster's processes (on free loopback ports, the ports a kept
work directory recorded, or a deployment's ports on the hosts of namespace mode), and acts on
them one at a time, as a fault does (kill, stop, pause, resume, restart), or all at once: undo
every fault, stop the servers then the storage nodes, close everything.
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from waltz.local.layout import ClusterLayout
from waltz.local.namespaced import NAMESPACE_PORTS, NamespaceHosts, Placement
from waltz.local.nodes import LocalServer, LocalStorageNode
from waltz.local.options import ProcessOptions
from waltz.local.processes import ManagedProcess
from waltz.local.zookeeper import LocalZooKeeper

__all__ = ["ClusterNodes", "NodeKind"]

log = logging.getLogger(__name__)

#: The kinds of node a fault acts on by index.
NodeKind = Literal["server", "storage"]


class ClusterNodes:
    """The ZooKeeper (unless external), storage nodes and servers of one local cluster.

    Nothing exists before :meth:`build`; nothing runs before the caller launches it.

    Args:
        storages: the number of storage nodes.
        servers: the number of servers.
        zookeeper: the connect string of a running ZooKeeper, or None to run one.
        options: metrics, timeouts and extra options of the processes (their environment is
            given to :meth:`build`, with the cluster's security settings in it).
    """

    def __init__(
        self, *, storages: int, servers: int, zookeeper: str | None, options: ProcessOptions
    ) -> None:
        self._num_storages = storages
        self._num_servers = servers
        self._external_zookeeper = zookeeper
        self._options = options
        self._zookeeper: LocalZooKeeper | None = None
        self._storages: list[LocalStorageNode] = []
        self._servers: list[LocalServer] = []
        self._paused: set[tuple[NodeKind, int]] = set()

    @property
    def zookeeper_is_external(self) -> bool:
        """Whether the cluster uses a running ZooKeeper of the caller's rather than its own."""
        return self._external_zookeeper is not None

    @property
    def zookeeper(self) -> LocalZooKeeper | None:
        """The cluster's own ZooKeeper, or None when it is external (or not built yet)."""
        return self._zookeeper

    @property
    def zookeeper_connect_string(self) -> str:
        """The ZooKeeper connect string, e.g. ``127.0.0.1:40123``.

        Raises:
            RuntimeError: the cluster's own ZooKeeper is not built yet.
        """
        if self._external_zookeeper is not None:
            return self._external_zookeeper
        if self._zookeeper is None:
            raise RuntimeError("the local cluster's ZooKeeper is not started yet")
        return self._zookeeper.connect_string

    @property
    def tick_time_ms(self) -> int:
        """``tickTime`` of the cluster's own ZooKeeper."""
        return self._options.tick_time_ms

    @property
    def storages(self) -> tuple[LocalStorageNode, ...]:
        """The storage nodes, ``storage-0`` first (empty before :meth:`build`)."""
        return tuple(self._storages)

    @property
    def servers(self) -> tuple[LocalServer, ...]:
        """The servers, ``server-0`` first (empty before :meth:`build`)."""
        return tuple(self._servers)

    def active_servers(self) -> tuple[LocalServer, ...]:
        """The servers that run and are not paused: each should be a member of the cluster."""
        return tuple(
            server
            for index, server in enumerate(self._servers)
            if ("server", index) not in self._paused and server.process.is_running()
        )

    def metrics_urls(self, scheme: str) -> dict[str, str]:
        """The ``/metrics`` URL of each server and storage node that serves metrics, by process name.

        Args:
            scheme: ``http``, or ``https`` when the nodes serve TLS.
        """
        nodes = [(s.process.name, s.host, s.metrics_port) for s in self._servers] + [
            (n.process.name, n.host, n.metrics_port) for n in self._storages
        ]
        return {name: f"{scheme}://{host}:{port}/metrics" for name, host, port in nodes if port}

    def describe_zookeeper(self) -> list[str]:
        """ZooKeeper's line of the cluster's description: the external one, or the cluster's own."""
        if self._external_zookeeper is not None:
            return [f"  ZooKeeper      {self._external_zookeeper} (external)"]
        if self._zookeeper is None:
            return []
        return [
            f"  ZooKeeper      {self._zookeeper.connect_string} (tickTime {self._options.tick_time_ms} ms, "
            f"pid {self._zookeeper.process.pid}, log {self._zookeeper.log_path})"
        ]

    def describe_nodes(
        self,
        urls: Mapping[str, str],
        owned: Mapping[str, Sequence[int]],
        replicas: Callable[[LocalStorageNode], Sequence[int]],
    ) -> list[str]:
        """The servers' and storage nodes' lines of the cluster's description.

        Args:
            urls: the metrics URL of each process, by name (:meth:`metrics_urls`).
            owned: the partitions each server owns, by endpoint.
            replicas: the partitions whose replicas a storage node holds.
        """
        lines = ["  servers (ServerAdminClient connects here; Waltz clients find them through ZooKeeper):"]
        for server in self._servers:
            url = urls.get(server.process.name)
            metrics = f"  metrics {url}" if url else ""
            parts = owned.get(server.endpoint)
            owns = f"  owns {_ids(parts)}" if parts else ""
            lines.append(
                f"    {server.process.name:<10} {server.endpoint}{metrics}  {_pid(server.process)}{owns}"
            )
        lines.append("  storage nodes (storage port, admin port):")
        for node in self._storages:
            url = urls.get(node.process.name)
            metrics = f"  metrics {url}" if url else ""
            lines.append(
                f"    {node.process.name:<10} {node.address}  admin {node.admin_address}{metrics}  "
                f"{_pid(node.process)}  replicas {_ids(replicas(node))}"
            )
        return lines

    def processes(self) -> list[ManagedProcess]:
        """Every process: ZooKeeper (when it is the cluster's own), storage nodes, servers."""
        processes = [n.process for n in self._storages] + [s.process for s in self._servers]
        return ([self._zookeeper.process] if self._zookeeper is not None else []) + processes

    def pids(self) -> dict[str, int]:
        """Process name (``zookeeper``, ``storage-0``, ``server-1``...) -> PID, for running processes."""
        return {p.name: p.pid for p in self.processes() if p.is_running() and p.pid is not None}

    def log_paths(self) -> dict[str, Path]:
        """Process name -> its log file, for every process whose output is kept."""
        return {p.name: p.log_path for p in self.processes() if p.log_path is not None}

    def build(
        self,
        work_dir: Path,
        root: str,
        layout: ClusterLayout | None,
        hosts: NamespaceHosts | None,
        *,
        storage_env: Mapping[str, str],
        server_env: Mapping[str, str],
    ) -> None:
        """Create (not start) the ZooKeeper, storage node and server objects.

        Args:
            work_dir: the cluster's work directory (``storage-<i>/``, ``logs/``, ``zookeeper/``).
            root: the cluster root znode the servers serve.
            layout: the layout of a kept work directory (its ports are used again), or None.
            hosts: the hosts of namespace mode (every node on its host, with a deployment's
                ports), or None on loopback.
            storage_env: the storage nodes' environment.
            server_env: the servers' environment.
        """
        logs = work_dir / "logs"
        lab = hosts.lab if hosts is not None else None

        def placement(name: str) -> Placement:
            return hosts.placement(name, work_dir / "config") if hosts is not None else {}

        if self._external_zookeeper is None:
            self._zookeeper = LocalZooKeeper(
                data_dir=work_dir / "zookeeper",
                port=NAMESPACE_PORTS["zookeeper"] if lab else (layout.zookeeper_port if layout else None),
                tick_time_ms=self._options.tick_time_ms,
                # The cluster's whole start budget: a JVM on a loaded machine may take long.
                startup_timeout=self._options.start_timeout,
                host=lab.address("zookeeper") if lab else None,
                command_prefix=lab.command_prefix("zookeeper") if lab else (),
            )
        for i in range(self._num_storages):
            ports = layout.storages[i] if layout else {}
            if lab is not None:
                ports = {
                    "port": NAMESPACE_PORTS["storage"],
                    "admin_port": NAMESPACE_PORTS["storage_admin"],
                    "metrics_port": NAMESPACE_PORTS["storage_metrics"],
                }
            self._storages.append(
                LocalStorageNode(
                    work_dir / f"storage-{i}",
                    name=f"storage-{i}",
                    log_path=logs / f"storage-{i}.log",
                    port=ports.get("port"),
                    admin_port=ports.get("admin_port"),
                    metrics=self._options.metrics,
                    metrics_port=ports.get("metrics_port"),
                    extra_args=list(self._options.storage_args),
                    env=storage_env,
                    **placement(f"storage-{i}"),
                )
            )
        for j in range(self._num_servers):
            ports = layout.servers[j] if layout and j < len(layout.servers) else {}
            if lab is not None:
                ports = {"port": NAMESPACE_PORTS["server"], "metrics_port": NAMESPACE_PORTS["server_metrics"]}
            self._servers.append(
                LocalServer(
                    self.zookeeper_connect_string,
                    root,
                    name=f"server-{j}",
                    log_path=logs / f"server-{j}.log",
                    port=ports.get("port"),
                    metrics=self._options.metrics,
                    metrics_port=ports.get("metrics_port"),
                    session_timeout=self._options.session_timeout,
                    extra_args=self._server_args(j),
                    env=server_env,
                    inherit_zookeeper_security=False,  # server_env holds the cluster's own
                    **placement(f"server-{j}"),
                )
            )

    def _server_args(self, index: int) -> list[str]:
        """The extra ``waltz server start`` options of server ``index``: every server's, then its own."""
        args_of = self._options.server_args_of
        return [*self._options.server_args, *(args_of(index) if args_of is not None else ())]

    def layout_ports(self) -> tuple[list[dict[str, int | None]], list[dict[str, int | None]]]:
        """The ports of every storage node and server, as the layout file keeps them."""
        storages = [
            {"port": n.port, "admin_port": n.admin_port, "metrics_port": n.metrics_port}
            for n in self._storages
        ]
        servers = [{"port": s.port, "metrics_port": s.metrics_port} for s in self._servers]
        return storages, servers

    def ports_in_use(self) -> list[str]:
        """The ports of the built nodes on this machine's loopback that another process listens
        on now, each as ``<node> port <port>`` (none in namespace mode: each host is new)."""
        ports: list[tuple[str, str, int | None]] = []
        if self._zookeeper is not None:
            ports.append(("zookeeper", self._zookeeper.host, self._zookeeper.port))
        for node in self._storages:
            name = node.process.name
            ports += [(name, node.host, p) for p in (node.port, node.admin_port, node.metrics_port)]
        for server in self._servers:
            ports += [(server.process.name, server.host, p) for p in (server.port, server.metrics_port)]
        return [
            f"{name} port {port}"
            for name, host, port in ports
            if port is not None and host.startswith("127.") and _listened_on(host, port)
        ]

    # --- one node at a time -------------------------------------------------------------------------

    def server(self, index: int) -> LocalServer:
        """Server ``index``.

        Raises:
            IndexError: no such server.
        """
        if not 0 <= index < len(self._servers):
            raise IndexError(
                f"no server {index}: the cluster has {len(self._servers)} (0..{len(self._servers) - 1})"
            )
        return self._servers[index]

    def storage(self, index: int) -> LocalStorageNode:
        """Storage node ``index``.

        Raises:
            IndexError: no such storage node.
        """
        if not 0 <= index < len(self._storages):
            raise IndexError(
                f"no storage node {index}: the cluster has {len(self._storages)} "
                f"(0..{len(self._storages) - 1})"
            )
        return self._storages[index]

    def node(self, kind: NodeKind, index: int) -> LocalServer | LocalStorageNode:
        """Server or storage node ``index``.

        Raises:
            IndexError: no such node.
        """
        return self.server(index) if kind == "server" else self.storage(index)

    def restart(self, kind: NodeKind, index: int) -> None:
        """Kill a node if it runs and start it again on the same ports (waits for the ports)."""
        self._paused.discard((kind, index))
        self.node(kind, index).restart()

    def pause(self, kind: NodeKind, index: int) -> None:
        """Freeze a node (SIGSTOP); :meth:`heal` thaws it."""
        self.node(kind, index).pause()
        self._paused.add((kind, index))

    def resume(self, kind: NodeKind, index: int) -> None:
        """Thaw a node (SIGCONT)."""
        self.node(kind, index).resume()
        self._paused.discard((kind, index))

    # --- all at once ----------------------------------------------------------------------------------

    def heal(self) -> None:
        """Resume paused processes and start stopped ones: ZooKeeper, storage nodes, servers.

        Raises:
            ServiceStartError: a process did not start again.
        """
        for kind, index in sorted(self._paused):
            self.node(kind, index).resume()
        self._paused.clear()
        if self._zookeeper is not None:
            if self._zookeeper.is_running():
                self._zookeeper.resume()  # in case it was paused through the zookeeper property
            else:
                self._zookeeper.start()
        for node in self._storages:
            if not node.process.is_running():
                node.start()
        for server in self._servers:
            if not server.process.is_running():
                server.start()

    def stop(self) -> None:
        """Stop the servers (SIGTERM), then the storage nodes; each is killed if it does not exit."""
        _stop_all(self._servers, timeout=15.0)
        _stop_all(self._storages, timeout=10.0)

    def close(self) -> None:
        """Close every node and the cluster's own ZooKeeper: no process is left running. Idempotent."""
        for server in self._servers:
            server.close()
        for node in self._storages:
            node.close()
        if self._zookeeper is not None:
            self._zookeeper.close()


def _listened_on(host: str, port: int) -> bool:
    """Whether a process listens on ``host:port`` (binding it as a server would fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed socket's TIME_WAIT is no one
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def _pid(process: ManagedProcess) -> str:
    return f"pid {process.pid}" if process.is_running() else "NOT RUNNING"


def _ids(ids: Sequence[int] | None) -> str:
    return ", ".join(str(i) for i in ids) if ids else "none"


def _stop_all(nodes: Sequence[LocalServer | LocalStorageNode], timeout: float) -> None:
    """SIGTERM every node at once and wait for each (killing it after ``timeout`` seconds)."""
    running = [n for n in nodes if n.process.is_running()]
    if not running:
        return
    with concurrent.futures.ThreadPoolExecutor(len(running), thread_name_prefix="local-cluster-stop") as pool:
        futures = {pool.submit(n.stop, timeout): n for n in running}
        for future in concurrent.futures.as_completed(futures):
            try:
                future.result()
            except Exception:
                log.exception("could not stop %s; it will be killed", futures[future].process.name)
