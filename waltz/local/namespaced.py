"""The hosts of a local cluster in namespace mode: every process on a host of its own.

Design: docs/design/overview.md, "Processes and links": in a deployment each node runs on its own
host, and a network partition cuts hosts apart. :class:`NamespaceHosts` gives a local cluster such
hosts: a :class:`~waltz.local.netns.NetworkLab` with one network namespace per process
(``zookeeper``, ``storage-<i>``, ``server-<j>``) and ``client-<k>`` hosts for client processes,
each with its own address on a bridge and a deployment's ports (:data:`NAMESPACE_PORTS`). The
supervisor, in the machine's own namespace, reaches every host through the bridge.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from waltz.errors import ConfigurationError
from waltz.local.netns import (
    Host,
    NetworkLab,
    NetworkLabError,
    SubnetTakenError,
    network_lab_unavailable,
    unused_subnet,
)

__all__ = ["NAMESPACE_PORTS", "NamespaceHosts", "Placement"]

#: Where namespace mode looks for a free /24 (the lower half of 10.77.0.0/16 is left to labs
#: with fixed addresses, such as the deployment guide's test on 10.77.0.0/24).
_LOCAL_SUBNETS = "10.77.128.0/17"
#: How many free subnets namespace mode tries when another lab takes the one it chose.
_SUBNET_ATTEMPTS = 3

#: The ports every host uses in namespace mode: a deployment's defaults (docs/configuration.md).
NAMESPACE_PORTS: Mapping[str, int] = {
    "zookeeper": 2181,
    "storage": 55280,
    "storage_admin": 55281,
    "storage_metrics": 55282,
    "server": 55180,
    "server_metrics": 55181,
}


class Placement(TypedDict, total=False):
    """The options placing a storage node or server on its host in namespace mode.

    They are keyword arguments of :class:`~waltz.local.nodes.LocalStorageNode` and
    :class:`~waltz.local.nodes.LocalServer`; on loopback there are none.
    """

    host: str
    command_prefix: list[str]
    config_file: Path


class NamespaceHosts:
    """The hosts of a local cluster in network namespaces, built at :meth:`start`, removed at
    :meth:`close` (docs/design/overview.md, "Processes and links").

    Args:
        storages: the number of storage nodes (hosts ``storage-0``...).
        servers: the number of servers (hosts ``server-0``...).
        client_hosts: how many hosts ``client-0``... to make for client processes.
        subnet: the hosts' IPv4 network; None takes the first ``/24`` of ``10.77.128.0/17`` no
            address or route of the machine uses.
    """

    def __init__(self, *, storages: int, servers: int, client_hosts: int, subnet: str | None) -> None:
        self._names = [
            "zookeeper",
            *(f"storage-{i}" for i in range(storages)),
            *(f"server-{j}" for j in range(servers)),
            *(f"client-{k}" for k in range(client_hosts)),
        ]
        self._subnet = subnet
        self._lab: NetworkLab | None = None

    @property
    def lab(self) -> NetworkLab | None:
        """The network lab of the hosts (to cut or isolate them), or None before :meth:`start`."""
        return self._lab

    @property
    def subnet(self) -> str | None:
        """The hosts' network once started (the one asked for, or the one chosen), else None."""
        return self._subnet if self._lab is not None else None

    def start(self, kept_subnet: str | None) -> None:
        """Build the network namespaces (a kept cluster gets its subnet back).

        Args:
            kept_subnet: the subnet a kept work directory's cluster runs on, or None.

        Raises:
            ConfigurationError: namespaces are not possible here (not root, no ``ip``), or the
                kept subnet is not the one asked for.
            SubnetTakenError: another lab (or a network of the machine) holds the kept subnet,
                or the subnet given.
            NetworkLabError: the lab could not be built.
        """
        reason = network_lab_unavailable()
        if reason is not None:
            raise ConfigurationError(f"cannot run a local cluster in network namespaces: {reason}")
        NetworkLab.cleanup_stale()
        kept = kept_subnet or None
        if kept is not None and self._subnet is not None and kept != self._subnet:
            raise ConfigurationError(
                f"the work directory's cluster runs on {kept} (its storage nodes' addresses are in "
                f"ZooKeeper), not on the subnet asked for, {self._subnet}"
            )
        given = kept or self._subnet
        for attempt in range(_SUBNET_ATTEMPTS):  # another lab may take a free subnet meanwhile
            self._subnet = given or unused_subnet(_LOCAL_SUBNETS)
            self._lab = NetworkLab(self._names, subnet=self._subnet)
            try:
                self._lab.start()
                return
            except SubnetTakenError as exc:
                self._lab = None
                if kept is not None:  # the kept cluster's addresses are in ZooKeeper: no other will do
                    raise SubnetTakenError(
                        f"the work directory's cluster runs on {kept} (its storage nodes' addresses are "
                        f"in ZooKeeper), and {exc.taken} of {exc.device} on this machine overlaps it now: "
                        "stop the other lab that holds it (another `waltz up --network namespaces`, or a "
                        "`waltz chaos --network namespaces` run), or use another work directory",
                        taken=exc.taken,
                        device=exc.device,
                    ) from exc
                if given is not None or attempt + 1 == _SUBNET_ATTEMPTS:
                    raise
            except NetworkLabError:
                self._lab = None
                if given is not None or attempt + 1 == _SUBNET_ATTEMPTS:
                    raise

    def host(self, name: str) -> Host:
        """The host called ``name``.

        Raises:
            RuntimeError: the hosts are not built.
            KeyError: no such host.
        """
        return self._started().host(name)

    def placement(self, name: str, config_dir: Path) -> Placement:
        """Where the process of host ``name`` runs: inside its host, started from a config file.

        Args:
            name: ``storage-<i>`` or ``server-<j>``.
            config_dir: the directory of the nodes' configuration files (``<name>.yaml``).
        """
        lab = self._started()
        return {
            "host": lab.address(name),
            "command_prefix": lab.command_prefix(name),
            "config_file": config_dir / f"{name}.yaml",
        }

    def addresses(self) -> list[str]:
        """Every host's address and the bridge's, for the names of a secure cluster's certificates."""
        lab = self._started()
        return [h.address for h in lab.hosts.values()] + [lab.bridge_address]

    def heal(self) -> None:
        """Bring every host's link up again and remove every cut (nothing to do before start)."""
        if self._lab is None:
            return
        for name in self._lab.hosts:
            self._lab.heal(name)
            self._lab.uncut(name)

    def describe_lines(self) -> list[str]:
        """The hosts, for people: the bridge, then each host's address and namespace."""
        if self._lab is None:
            return []
        lines = [
            f"  hosts          network namespaces on {self._subnet}, this machine at "
            f"{self._lab.bridge_address}; run a command on one with `ip netns exec <namespace> ...`:"
        ]
        lines += [f"    {h.name:<10} {h.address:<15} {h.namespace}" for h in self._lab.hosts.values()]
        return lines

    def close(self) -> None:
        """Remove every namespace and link (the processes inside must be stopped first). Idempotent."""
        if self._lab is not None:
            self._lab.close()

    def _started(self) -> NetworkLab:
        if self._lab is None:
            raise RuntimeError("the hosts of the local cluster are not built: start the cluster first")
        return self._lab

    def __repr__(self) -> str:
        return f"NamespaceHosts({self._names}, subnet={self._subnet})"
