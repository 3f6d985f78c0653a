"""The option groups of a local cluster: how its processes run, how it is secured, where it runs.

:class:`~waltz.local.cluster.LocalCluster` takes what most callers set as plain keywords (the
numbers of storage nodes, servers and partitions, the replicas, the name, the root, the work
directory, an external ZooKeeper) and the rest in three frozen groups, each with defaults that
make a secure cluster on loopback (mutual TLS with role certificates made for it, a ZooKeeper
credential per role)::

    LocalCluster(
        storages=3,
        servers=2,
        partitions=4,
        processes=ProcessOptions(metrics=True, session_timeout=2.0),
        network=NetworkOptions(mode="namespaces", client_hosts=1),
    )

A run that measures the protocol alone, or a test of plaintext itself, says so:
``security=SecurityOptions.plaintext()``.

A group is a value: build one once and hand it to several clusters, or change one field with
:func:`dataclasses.replace`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from waltz.errors import ConfigurationError

if TYPE_CHECKING:
    from waltz.local.nodes import LocalStorageNode
    from waltz.metadata.zk_security import ZooKeeperSecurity
    from waltz.protocol.channels import TlsConfig

__all__ = ["DEFAULT_SERVER_ENV", "Network", "NetworkOptions", "ProcessOptions", "SecurityOptions"]

#: Environment of the server processes unless overridden: retry storage nodes quickly, so that a
#: partition is writable again soon after a storage node or a server comes back.
DEFAULT_SERVER_ENV: Mapping[str, str] = MappingProxyType(
    {
        "WALTZ_STORE_RETRY_INTERVAL": "0.2",
        "WALTZ_STORE_CONNECT_TIMEOUT": "2",
        # A harness for development, tests and benchmarks: their tools append through the admin
        # protocol (a deployment leaves it off, the server's default).
        "WALTZ_SERVER_ADMIN_APPENDS": "true",
    }
)

#: Where the processes of a local cluster run: all on loopback, or each on a host of its own.
Network = Literal["loopback", "namespaces"]


@dataclass(frozen=True, slots=True)
class ProcessOptions:
    """How a local cluster runs its processes: environment, extra options, timeouts, metrics.

    Every node is an OS process of its own, started with the command a user would run
    (docs/design/overview.md, "Processes and links").

    Attributes:
        metrics: serve ``/metrics`` and ``/health`` on every storage node and server.
        session_timeout: the servers' ZooKeeper session timeout in seconds; a server killed with
            SIGKILL loses its partitions after about this long.
        tick_time_ms: ``tickTime`` of the cluster's own ZooKeeper; sessions may last 2 to 20 ticks.
        start_timeout: seconds :meth:`~waltz.local.cluster.LocalCluster.start` may take in all
            (and the default of :meth:`~waltz.local.cluster.LocalCluster.wait_ready`).
        server_env: environment variables for the servers (``WALTZ_*`` settings, see
            ``docs/configuration.md``), over :data:`DEFAULT_SERVER_ENV`.
        storage_env: environment variables for the storage nodes (``WALTZ_STORAGE_*`` settings).
        server_args: more ``waltz server start`` options for every server.
        storage_args: more ``waltz storage start`` options for every storage node.
        server_args_of: more ``waltz server start`` options for server ``j`` alone (after
            ``server_args``), e.g. ``--advertised-endpoint`` of a fault proxy in front of it.
    """

    metrics: bool = False
    session_timeout: float = 4.0
    tick_time_ms: int = 500
    start_timeout: float = 60.0
    server_env: Mapping[str, str] = field(default_factory=dict)
    storage_env: Mapping[str, str] = field(default_factory=dict)
    server_args: Sequence[str] = ()
    storage_args: Sequence[str] = ()
    server_args_of: Callable[[int], Sequence[str]] | None = None

    def __post_init__(self) -> None:
        # Copies the caller cannot change afterwards: the group is a value.
        object.__setattr__(self, "server_env", MappingProxyType(dict(self.server_env)))
        object.__setattr__(self, "storage_env", MappingProxyType(dict(self.storage_env)))
        object.__setattr__(self, "server_args", tuple(self.server_args))
        object.__setattr__(self, "storage_args", tuple(self.storage_args))


@dataclass(frozen=True, slots=True)
class SecurityOptions:
    """How a local cluster is secured: mutual TLS with role certificates, ZooKeeper credentials.

    The defaults make a secure cluster: certificates made for it, mutual TLS with role checks on
    every port, and a ZooKeeper credential per role (docs/design/overview.md, "Roles";
    docs/design/zookeeper.md, "Security"). :meth:`plaintext` is the explicit opt-out, for runs
    that measure the protocol without TLS or that test plaintext itself.

    Attributes:
        secure: a secured cluster: a CA and role certificates are made in ``<work dir>/tls``
            (:mod:`waltz.local.certificates`), every port of every node serves mutual TLS and
            checks roles, and the supervisor uses the ``admin`` certificate
            (:meth:`~waltz.local.cluster.LocalCluster.client_settings` gives an application's
            settings, :attr:`~waltz.local.cluster.LocalCluster.certificates` the files). Not with
            ``tls``, nor with TLS files in the processes' ``storage_env``/``server_env``. None
            (the default) means True, or False when ``tls`` is given (nodes the caller secures).
        zookeeper_auth: protect the cluster's znodes with a credential per role made for this
            cluster (``zookeeper-roles/`` in the work directory), the servers' given to them as
            ``WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE``; clients and tools then need theirs
            (:meth:`~waltz.local.cluster.LocalCluster.zookeeper_settings`). On by default.
        zookeeper_security: ZooKeeper TLS files (and a credential) for the supervisor and the
            servers, e.g. for an external ZooKeeper's secure port; with ``zookeeper_auth`` and no
            credential in it, one is made.
        tls: client TLS files the supervisor itself uses for the storage admin ports (creating
            the cluster) and the server ports (status probes), when the caller makes the nodes
            serve TLS (through the processes' ``storage_env`` and ``server_env``); None with
            ``secure`` off: plaintext.

    Raises:
        ConfigurationError: both ``secure`` and ``tls`` are given.
    """

    secure: bool | None = None
    zookeeper_auth: bool = True
    zookeeper_security: ZooKeeperSecurity | None = None
    tls: TlsConfig | None = None

    def __post_init__(self) -> None:
        if self.secure and self.tls is not None:
            raise ConfigurationError(
                "a secure local cluster makes its own certificates: give SecurityOptions secure=True "
                "or tls (with secure=False), not both"
            )
        if self.secure is None:
            object.__setattr__(self, "secure", self.tls is None)

    @classmethod
    def plaintext(cls) -> SecurityOptions:
        """The explicit opt-out: no TLS, no roles, no ZooKeeper credential (anyone who reaches
        the ports or ZooKeeper may act on the cluster; for speed runs and tests of plaintext)."""
        return cls(secure=False, zookeeper_auth=False)


@dataclass(frozen=True, slots=True)
class NetworkOptions:
    """Where the processes of a local cluster run, and how they reach each other.

    In namespace mode every process runs on a host of its own, as on the hosts of a deployment
    (docs/design/overview.md, "Processes and links").

    Attributes:
        mode: ``"loopback"`` (every process on 127.0.0.1, free ports) or ``"namespaces"`` (every
            process on a host of its own, a network namespace with its own address and a
            deployment's ports, started from a configuration file; needs root, iproute2, and for
            cuts nftables; not with an external ZooKeeper). Hosts are named ``zookeeper``,
            ``storage-<i>``, ``server-<j>`` and ``client-<k>``
            (:meth:`~waltz.local.cluster.LocalCluster.host`).
        client_hosts: in namespace mode, how many hosts ``client-0``... to make for client
            processes (they join one with the host's ``namespace``).
        subnet: in namespace mode, the hosts' IPv4 network (a ``/24`` is plenty); None takes the
            first ``/24`` of ``10.77.128.0/17`` no address or route of the machine uses (a kept
            work directory keeps its own, and refuses to start when another lab holds it).
        storage_connect_string_of: the connect string registered in ZooKeeper for a storage node
            (what servers dial), e.g. a fault proxy in front of it; None means its own address.
            Its admin port stays the node's own (``StorageSpec.admin_address``).

    Raises:
        ConfigurationError: ``mode`` is neither, or client hosts are asked for on loopback.
    """

    mode: Network = "loopback"
    client_hosts: int = 0
    subnet: str | None = None
    storage_connect_string_of: Callable[[LocalStorageNode], str] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("loopback", "namespaces"):
            raise ConfigurationError(f"network mode must be 'loopback' or 'namespaces', got {self.mode!r}")
        if self.client_hosts < 0 or (self.client_hosts and self.mode != "namespaces"):
            raise ConfigurationError(
                f"client_hosts ({self.client_hosts}) are hosts of namespace mode: give "
                "NetworkOptions(mode='namespaces', ...)"
            )
