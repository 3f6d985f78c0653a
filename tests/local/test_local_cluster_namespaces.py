"""A local cluster in network namespaces: every process on a host of its own, as in a deployment.

ZooKeeper, three storage nodes and two servers each run in a network namespace with their own
address and a deployment's ports, started with ``waltz storage|server start --config <file>``; a
client process joins a client host of its own and commits through them, and cannot reach what
listens on the machine's own loopback (it really is elsewhere). Closing removes every namespace;
starting the kept work directory again gives the same addresses and the same log.
Needs root and iproute2; skips saying which is missing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from waltz.errors import ConfigurationError
from waltz.local.cluster import LocalCluster
from waltz.local.namespaced import NAMESPACE_PORTS
from waltz.local.netns import network_lab_unavailable
from waltz.local.options import NetworkOptions, SecurityOptions

#: Joins a client host, tries the machine's own loopback, then commits 5 transactions.
_CLIENT = """
import socket, sys
from waltz.local.netns import enter_namespace
namespace, loopback_port = sys.argv[1:3]
enter_namespace(namespace)
try:
    socket.create_connection(("127.0.0.1", int(loopback_port)), timeout=2).close()
    print("loopback: reached")
except OSError as error:
    print("loopback:", type(error).__name__)
from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
config = WaltzClientConfig()  # WALTZ_*: the client's certificate and ZooKeeper credential
with WaltzClient(MemoryStore({0: -1, 1: -1}), config) as client:
    ids = [client.submit(Append(0, b"from a client host %d" % i)).result(60).transaction_id for i in range(5)]
    print("committed:", ids)
"""


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_namespace_mode_refuses_what_it_cannot_reach() -> None:
    with pytest.raises(ConfigurationError, match="external ZooKeeper is not reachable"):
        LocalCluster(network=NetworkOptions(mode="namespaces"), zookeeper="127.0.0.1:2181")
    with pytest.raises(ConfigurationError, match="hosts of namespace mode"):
        NetworkOptions(client_hosts=2)
    with pytest.raises(ConfigurationError, match="'loopback' or 'namespaces'"):
        NetworkOptions(mode="docker")  # type: ignore[arg-type]


def test_cluster_on_hosts_of_its_own_serves_a_client_host_and_resumes(tmp_path: Path) -> None:
    reason = network_lab_unavailable()
    if reason is not None:
        pytest.skip(reason)
    work_dir = tmp_path / "cluster"
    security = SecurityOptions()  # the default: mutual TLS, ZooKeeper credentials per role
    network = NetworkOptions(mode="namespaces", client_hosts=1)
    listener = socket.create_server(("127.0.0.1", 0))  # on the machine's own loopback only
    with listener:
        cluster = LocalCluster(partitions=2, work_dir=work_dir, security=security, network=network)
        with cluster:
            lab = cluster.network_lab
            assert lab is not None
            hosts = {name: host.address for name, host in lab.hosts.items()}
            assert len(set(hosts.values())) == 7 and "client-0" in hosts
            storage = cluster.storages[1]
            assert storage.address == f"{hosts['storage-1']}:{NAMESPACE_PORTS['storage']}"
            assert cluster.servers[0].endpoint == f"{hosts['server-0']}:{NAMESPACE_PORTS['server']}"
            assert cluster.zookeeper_connect_string == f"{hosts['zookeeper']}:2181"
            # Started as a deployment starts it: from a configuration file naming its host.
            assert storage.config_file is not None
            assert storage.process.args[-4:] == ("storage", "start", "--config", str(storage.config_file))
            settings = yaml.safe_load(storage.config_file.read_text())
            assert settings["storage.host"] == hosts["storage-1"]
            assert settings["storage.port"] == NAMESPACE_PORTS["storage"]
            assert "network namespaces on" in cluster.describe()

            client = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _CLIENT,
                    cluster.host("client-0").namespace,
                    str(listener.getsockname()[1]),
                ],
                env={**os.environ, **cluster.client_env()},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert client.returncode == 0, client.stderr[-3000:]
            assert "loopback: ConnectionRefusedError" in client.stdout, client.stdout
            assert "committed: [0, 1, 2, 3, 4]" in client.stdout, client.stdout
            # heal() undoes cuts and isolation too (a test that failed between cut and uncut).
            lab.cut("server-0", hosts["zookeeper"])
            lab.isolate("storage-0")
            cluster.heal()
            tables = subprocess.run(
                [*lab.command_prefix("server-0"), "nft", "list", "tables"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            assert "waltz_lab" not in tables
            link = subprocess.run(
                ["ip", "-o", "link", "show", lab.host("storage-0").link],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert "state DOWN" not in link and ",UP" in link, link
            namespace = lab.host("zookeeper").namespace
            assert namespace in _namespaces()
        assert namespace not in _namespaces()  # close removed every host

        again = LocalCluster(partitions=2, work_dir=work_dir, security=security, network=network)
        with again:
            assert again.network_lab is not None
            assert {n: h.address for n, h in again.network_lab.hosts.items()} == hosts
            assert again.wait_ready()[0].high_water_mark == 4
