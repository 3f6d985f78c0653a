"""Hosts with their own addresses on one machine: network namespaces joined by a Linux bridge.

A :class:`NetworkLab` makes a bridge and N named hosts; each host is a network namespace with
loopback up and one veth into the bridge, addressed in a private range (``10.77.0.0/24`` by
default). The root namespace gets an address on the bridge too, so the process that built the lab
reaches every host. A process runs inside a host when started with :meth:`NetworkLab.command_prefix`
(``ip netns exec <namespace>``) before its argv.

Faults are real cuts, not a user-space proxy: :meth:`NetworkLab.isolate` takes a host's link down
(it loses every peer at once) and :meth:`NetworkLab.cut` drops one peer's traffic with an nftables
rule inside the host's namespace (the host loses that peer only, one way or both). This is what a
partition between hosts of a deployment looks like (docs/design/overview.md "Processes and links").

Every name the lab creates carries :data:`NAME_PREFIX` and a run ID, so :meth:`NetworkLab.close` and
:meth:`NetworkLab.cleanup_stale` remove everything, also what a crashed run left behind. Needs root
and iproute2 (``ip``); cuts need the ``nft`` command (Debian package ``nftables``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from waltz.errors import ConfigurationError, WaltzError

__all__ = [
    "NAME_PREFIX",
    "STATE_DIR",
    "Direction",
    "Host",
    "NetworkLab",
    "NetworkLabError",
    "SubnetTakenError",
    "enter_namespace",
    "network_lab_unavailable",
    "nft_unavailable",
    "unused_subnet",
]

_LOG = logging.getLogger(__name__)

#: The prefix of every namespace and link a lab creates (interface names are at most 15 bytes).
NAME_PREFIX = "wzlab"

#: Where a lab notes the PID of the process that built it (``<prefix>.pid``), so that
#: :meth:`NetworkLab.cleanup_stale` leaves the labs of live processes alone.
STATE_DIR = Path("/run/waltz-netlab")

#: The nftables table a cut lives in (one per namespace, so its name need not be unique).
_NFT_TABLE = "waltz_lab"

Direction = Literal["both", "in", "out"]


class NetworkLabError(WaltzError):
    """An ``ip`` or ``nft`` command failed while building, cutting or removing a lab.

    The message names the command and ends with its error output.
    """


class SubnetTakenError(NetworkLabError):
    """The subnet of a lab overlaps a network of the machine (another lab's, say).

    Attributes:
        taken: the network of the machine it overlaps, e.g. ``10.77.128.0/24``.
        device: the device that network is on (a bridge of another lab: ``wzlab<run>-br``).
    """

    def __init__(self, message: str, *, taken: str, device: str) -> None:
        super().__init__(message)
        self.taken = taken
        self.device = device


@dataclass(frozen=True)
class Host:
    """One host of a lab.

    Attributes:
        name: the name the caller gave (``"zk"``, ``"s0"``).
        namespace: the network namespace (``wzlab<run>-<index>``).
        address: the host's IPv4 address on the bridge.
        link: the veth end in the root namespace, attached to the bridge.
    """

    name: str
    namespace: str
    address: str
    link: str


def network_lab_unavailable() -> str | None:
    """Why a :class:`NetworkLab` cannot be built here, or ``None`` when it can.

    Returns:
        A sentence naming what is missing (root, the ``ip`` command), or ``None``.
    """
    if os.geteuid() != 0:
        return "network namespaces need root (run as root or with CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "the ip command is missing (Debian: apt-get install -y iproute2)"
    return None


def nft_unavailable() -> str | None:
    """Why :meth:`NetworkLab.cut` cannot work here, or ``None`` when the ``nft`` command exists."""
    if shutil.which("nft") is None:
        return "the nft command is missing (Debian: apt-get install -y nftables)"
    return None


#: ``CLONE_NEWNET`` of ``<sched.h>``: the network namespace kind for ``setns(2)``.
_CLONE_NEWNET = 0x40000000


def enter_namespace(namespace: str) -> None:
    """Move this process into a host's network namespace (``setns(2)``), as ``ip netns exec`` does.

    Call it first thing in a process of its own, before any thread or socket exists: threads
    started afterwards inherit the namespace; sockets opened before keep the old one. Pipes and
    files are unaffected (a ``multiprocessing`` child still talks to its parent).

    Args:
        namespace: a name ``ip netns list`` shows (:attr:`Host.namespace`).

    Raises:
        NetworkLabError: the namespace does not exist, or the kernel refused (not root).
    """
    path = f"/run/netns/{namespace}"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise NetworkLabError(f"cannot open network namespace {namespace} ({path}): {exc}") from exc
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise NetworkLabError(f"setns({namespace}) failed: {os.strerror(errno)}")
    finally:
        os.close(fd)


def _networks_in_use() -> list[tuple[ipaddress.IPv4Network, str]]:
    """The IPv4 networks of this namespace's addresses and routes, each with its device."""
    used: list[tuple[ipaddress.IPv4Network, str]] = []
    for interface in json.loads(_run(["ip", "-j", "-4", "addr", "show"], check=False).stdout or "[]"):
        device = str(interface.get("ifname", "?"))
        for address in interface.get("addr_info", []):
            with contextlib.suppress(KeyError, ValueError):
                network = ipaddress.IPv4Interface(f"{address['local']}/{address['prefixlen']}").network
                used.append((network, device))
    for route in json.loads(_run(["ip", "-j", "-4", "route", "show"], check=False).stdout or "[]"):
        destination = str(route.get("dst", "default"))
        if destination == "default":
            continue
        with contextlib.suppress(ValueError):  # blackhole, prohibit and the like carry a dst too
            used.append((ipaddress.IPv4Network(destination, strict=False), str(route.get("dev", "?"))))
    return used


def unused_subnet(within: str = "10.77.128.0/17", prefixlen: int = 24) -> str:
    """The first ``/prefixlen`` network of ``within`` that no address or route of this machine's
    root namespace overlaps (a running lab's bridge address counts), for a lab of its own. By
    default from the upper half of ``10.77.0.0/16``: the lower half is left to labs with fixed
    addresses (``10.77.0.0/24``, the deployment guide's), which a lab that takes any free network
    must never hold.

    Two processes choosing at the same instant may pick the same one: :meth:`NetworkLab.start`
    then refuses the second (the check and the bridge's address happen under one lock), and the
    caller chooses again.

    Raises:
        ConfigurationError: every such network is in use.
    """
    used = [network for network, _ in _networks_in_use()]
    for candidate in ipaddress.IPv4Network(within).subnets(new_prefix=prefixlen):
        if not any(candidate.overlaps(network) for network in used):
            return str(candidate)
    raise ConfigurationError(f"every /{prefixlen} network of {within} is in use on this machine")


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    """Held while a lab checks that its subnet is free and gives its bridge the address."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "subnets.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=30)
    if check and result.returncode != 0:
        raise NetworkLabError(
            f"{' '.join(argv)} failed with exit code {result.returncode}: {result.stderr.strip()}"
        )
    return result


class NetworkLab:
    """A bridge and named hosts in network namespaces, removed again at close.

    Args:
        hosts: the hosts' names, in order; the i-th gets the (i+2)-th address of ``subnet``
            unless ``addresses`` names one for it.
        subnet: a private IPv4 network with room for the bridge and every host.
        run_id: the run ID in every created name (a few random hex digits when ``None``).
        addresses: chosen IPv4 addresses of some hosts by name (e.g. ``{"waltz-1": "10.77.0.11"}``),
            inside ``subnet``; the bridge keeps the first address.

    Raises:
        ConfigurationError: not root, or ``ip`` is missing (see :func:`network_lab_unavailable`),
            or the subnet is too small, or a name repeats, or a chosen address is outside the
            subnet, is the bridge's or another host's, or names an unknown host.
        NetworkLabError: an ``ip`` command failed while building (what was built is removed).

    Design: docs/design/overview.md, "Processes and links".
    """

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        subnet: str = "10.77.0.0/24",
        run_id: str | None = None,
        addresses: Mapping[str, str] | None = None,
    ) -> None:
        reason = network_lab_unavailable()
        if reason is not None:
            raise ConfigurationError(f"cannot build a network lab: {reason}")
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ConfigurationError(f"host names must be distinct and not empty, got {list(hosts)}")
        network = ipaddress.IPv4Network(subnet)
        if network.num_addresses < len(hosts) + 3:
            raise ConfigurationError(f"subnet {subnet} has no room for {len(hosts)} hosts and a bridge")
        self._run_id = run_id or secrets.token_hex(3)
        self._prefix = f"{NAME_PREFIX}{self._run_id}"
        self._network = network
        self._prefixlen = network.prefixlen
        self.bridge = f"{self._prefix}-br"
        self.bridge_address = str(network.network_address + 1)
        chosen = _chosen_addresses(network, hosts, addresses or {})
        self._hosts = {
            name: Host(
                name=name,
                namespace=f"{self._prefix}-{index}",
                address=chosen.get(name, str(network.network_address + 2 + index)),
                link=f"{self._prefix}-{index}",
            )
            for index, name in enumerate(hosts)
        }
        taken = [host.address for host in self._hosts.values()]
        if len(set(taken)) != len(taken):
            raise ConfigurationError(f"two hosts would share an address: {taken}")
        self._built = False

    @property
    def run_id(self) -> str:
        """The run ID in every name this lab creates."""
        return self._run_id

    @property
    def hosts(self) -> dict[str, Host]:
        """The hosts by name."""
        return dict(self._hosts)

    def host(self, name: str) -> Host:
        """The host called ``name``.

        Raises:
            KeyError: no such host.
        """
        return self._hosts[name]

    def address(self, name: str) -> str:
        """The IPv4 address of host ``name``."""
        return self._hosts[name].address

    def command_prefix(self, name: str) -> list[str]:
        """The argv prefix that runs a command inside host ``name`` (``ip netns exec <ns>``)."""
        return ["ip", "netns", "exec", self._hosts[name].namespace]

    # --- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the bridge, the namespaces and their links, and bring everything up.

        Raises:
            SubnetTakenError: the subnet overlaps a network of the machine (another lab's).
            NetworkLabError: an ``ip`` command failed; everything created is removed again.
        """
        if self._built:
            raise RuntimeError(f"network lab {self._prefix} is already built")
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        try:  # the note is this lab's claim on its names: another live lab's is never touched
            with open(STATE_DIR / f"{self._prefix}.pid", "x") as note:
                note.write(f"{os.getpid()}\n")
        except FileExistsError:
            raise NetworkLabError(
                f"network lab names {self._prefix}-* belong to another lab (run ID {self._run_id}): "
                "use another run_id"
            ) from None
        self._built = True
        try:
            with _subnet_lock():
                taken = [(n, d) for n, d in _networks_in_use() if n.overlaps(self._network)]
                if taken:
                    network, device = taken[0]
                    raise SubnetTakenError(
                        f"subnet {self._network} overlaps {network} of {device} on this machine (another "
                        "lab, or a network of the machine): give the lab another subnet",
                        taken=str(network),
                        device=device,
                    )
                _run(["ip", "link", "add", self.bridge, "type", "bridge"])
                _run(["ip", "addr", "add", f"{self.bridge_address}/{self._prefixlen}", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            for host in self._hosts.values():
                peer = f"{host.link}p"
                _run(["ip", "netns", "add", host.namespace])
                _run(["ip", "link", "add", host.link, "type", "veth", "peer", "name", peer])
                _run(["ip", "link", "set", peer, "netns", host.namespace])
                _run(["ip", "link", "set", host.link, "master", self.bridge])
                _run(["ip", "link", "set", host.link, "up"])
                inside = ["ip", "-n", host.namespace]
                _run([*inside, "link", "set", "lo", "up"])
                _run([*inside, "link", "set", peer, "name", "eth0"])
                _run([*inside, "addr", "add", f"{host.address}/{self._prefixlen}", "dev", "eth0"])
                _run([*inside, "link", "set", "eth0", "up"])
        except BaseException:
            self.close()
            raise
        _LOG.info(
            "network lab %s: %s",
            self._prefix,
            ", ".join(f"{h.name}={h.address}" for h in self._hosts.values()),
        )

    def close(self) -> None:
        """Remove every namespace and link of this lab (processes inside should be stopped first).

        Idempotent; errors are logged, not raised, so a failing test still cleans up.
        """
        if not self._built:
            return
        self._built = False
        _remove_prefixed(self._prefix)
        (STATE_DIR / f"{self._prefix}.pid").unlink(missing_ok=True)

    @staticmethod
    def cleanup_stale() -> int:
        """Remove the namespaces and links (``wzlab*``) of labs whose builder no longer runs.

        A lab whose builder process is still alive (its PID noted in :data:`STATE_DIR`) is left
        alone; one without a note, or whose builder is gone (a crashed run), is removed.

        Returns:
            The number of namespaces and links removed.
        """
        removed = 0
        for prefix in sorted(_lab_prefixes()):  # NAME_PREFIX + run ID
            if _builder_alive(prefix):
                continue
            removed += _remove_prefixed(prefix)
            (STATE_DIR / f"{prefix}.pid").unlink(missing_ok=True)
        return removed

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- faults -----------------------------------------------------------------------------------

    def isolate(self, name: str) -> None:
        """Take host ``name``'s link down: it loses every peer (and the root namespace) at once."""
        _run(["ip", "link", "set", self._hosts[name].link, "down"])

    def heal(self, name: str) -> None:
        """Bring host ``name``'s link up again (undoes :meth:`isolate`)."""
        _run(["ip", "link", "set", self._hosts[name].link, "up"])

    def cut(self, name: str, peer_address: str, *, direction: Direction = "both") -> None:
        """Drop the traffic between host ``name`` and ``peer_address`` inside ``name``'s namespace.

        Packets are dropped silently (no reset), as a failed switch port would: connections hang
        until their timeouts. Other peers are unaffected.

        Args:
            name: the host whose namespace gets the rule.
            peer_address: the IPv4 address to cut from.
            direction: ``"out"`` drops what ``name`` sends to the peer, ``"in"`` what it receives
                from the peer, ``"both"`` both.

        Raises:
            ConfigurationError: the ``nft`` command is missing.
            NetworkLabError: the kernel refused the rule.
        """
        reason = nft_unavailable()
        if reason is not None:
            raise ConfigurationError(f"cannot cut {name} from {peer_address}: {reason}")
        nft = [*self.command_prefix(name), "nft"]
        _run([*nft, "add", "table", "inet", _NFT_TABLE])
        for hook in ("input", "output"):
            chain_spec = ["{", "type", "filter", "hook", hook, "priority", "0", ";", "}"]
            _run([*nft, "add", "chain", "inet", _NFT_TABLE, hook, *chain_spec])
        if direction in ("both", "out"):
            _run([*nft, "add", "rule", "inet", _NFT_TABLE, "output", "ip", "daddr", peer_address, "drop"])
        if direction in ("both", "in"):
            _run([*nft, "add", "rule", "inet", _NFT_TABLE, "input", "ip", "saddr", peer_address, "drop"])

    def uncut(self, name: str) -> None:
        """Remove every cut inside host ``name``'s namespace (undoes :meth:`cut`; nothing to do
        when it has none, or when ``nft`` is missing and so no cut can exist).

        Raises:
            NetworkLabError: ``nft`` failed to remove the host's rules.
        """
        if nft_unavailable() is not None:
            return
        argv = [*self.command_prefix(name), "nft", "delete", "table", "inet", _NFT_TABLE]
        result = _run(argv, check=False)
        if result.returncode != 0 and "No such file or directory" not in result.stderr:
            raise NetworkLabError(f"{' '.join(argv)} failed: {result.stderr.strip()}")

    def __repr__(self) -> str:
        return f"NetworkLab({self._prefix}, bridge={self.bridge_address}, hosts={list(self._hosts)})"


def _chosen_addresses(
    network: ipaddress.IPv4Network, hosts: Sequence[str], addresses: Mapping[str, str]
) -> dict[str, str]:
    """Check the chosen addresses of :class:`NetworkLab` hosts; returns them by host name."""
    unknown = sorted(set(addresses) - set(hosts))
    if unknown:
        raise ConfigurationError(f"addresses name hosts that are not in the lab: {unknown}")
    bridge = network.network_address + 1
    for name, address in addresses.items():
        parsed = ipaddress.IPv4Address(address)
        if parsed not in network or parsed in (network.network_address, network.broadcast_address, bridge):
            raise ConfigurationError(
                f"address {address} of host {name} must be a host address of {network} other than "
                f"the bridge's {bridge}"
            )
    return dict(addresses)


def _namespaces() -> list[str]:
    lines = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    return [line.split(" ")[0].strip() for line in lines if line.strip()]


def _links() -> list[str]:
    links = []
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.split("\n"):
        parts = line.split(":")
        if len(parts) >= 2:
            links.append(parts[1].strip().split("@")[0])
    return links


def _lab_prefixes() -> set[str]:
    """The ``wzlab<run ID>`` prefixes of every lab namespace and link present."""
    return {name.split("-")[0] for name in [*_namespaces(), *_links()] if name.startswith(NAME_PREFIX)}


def _builder_alive(prefix: str) -> bool:
    try:
        pid = int((STATE_DIR / f"{prefix}.pid").read_text().strip())
    except (OSError, ValueError):
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_prefixed(prefix: str) -> int:
    removed = 0
    for namespace in _namespaces():
        if namespace.startswith(f"{prefix}-"):
            # A crashed run's processes would go on without a network, holding their files.
            for pid in _run(["ip", "netns", "pids", namespace], check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
                    _LOG.warning("killed process %s left in network namespace %s", pid, namespace)
            result = _run(["ip", "netns", "delete", namespace], check=False)
            if result.returncode == 0:
                removed += 1
            else:
                _LOG.warning("could not delete namespace %s: %s", namespace, result.stderr.strip())
    for link in _links():
        if link.startswith(f"{prefix}-"):
            result = _run(["ip", "link", "delete", link], check=False)
            if result.returncode == 0:
                removed += 1
    return removed
