"""The client over mutual TLS: a server that requires client certificates (made with `cryptography`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.tls import make_certificates

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.errors import WaltzTimeoutError
from waltz.local.cluster import LocalCluster
from waltz.local.nodes import LocalServer
from waltz.local.options import SecurityOptions


@pytest.fixture(scope="module")
def tls_cluster(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: object
) -> Iterator[tuple[LocalCluster, dict[str, Path]]]:
    """A one-partition cluster whose only running server requires mutual TLS."""
    directory = tmp_path_factory.mktemp("client-tls")
    files = make_certificates(directory)
    with LocalCluster(
        storages=1,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=directory / "cluster",
        delete_root=True,
        security=SecurityOptions.plaintext(),  # the one TLS server here is secured by hand
    ) as cluster:
        env = {
            "WALTZ_SERVER_TLS_CERT_FILE": str(files["server"]),
            "WALTZ_SERVER_TLS_KEY_FILE": str(files["server-key"]),
            "WALTZ_SERVER_TLS_CA_FILE": str(files["ca"]),
            "WALTZ_STORE_RETRY_INTERVAL": "0.2",
        }
        with LocalServer(
            cluster.zookeeper_connect_string,
            cluster.root,
            name="tls-server",
            log_path=directory / "tls-server.log",
            session_timeout=4.0,
            env=env,
        ):
            cluster.stop_server(0)  # its partition moves to the TLS server at once
            yield cluster, files


def config(cluster: LocalCluster, **tls: Path) -> WaltzClientConfig:
    return WaltzClientConfig(**cluster.client_settings(), **tls)


def test_mutual_tls(tls_cluster: tuple[LocalCluster, dict[str, Path]]) -> None:
    cluster, files = tls_cluster
    store = MemoryStore({0: -1})
    tls = {
        "client_tls_ca_file": files["ca"],
        "client_tls_cert_file": files["client"],
        "client_tls_key_file": files["client-key"],
    }
    with WaltzClient(store, config(cluster, **tls)) as client:
        transaction_id = client.submit(Append(0, b"over TLS")).result(60).transaction_id
        assert transaction_id is not None
        assert client.wait_applied(0, transaction_id, 30)
    assert [a.data for a in store.applied[0]][-1] == b"over TLS"


def test_a_client_without_a_certificate_is_refused(tls_cluster: tuple[LocalCluster, dict[str, Path]]) -> None:
    cluster, files = tls_cluster
    refused = config(cluster, client_tls_ca_file=files["ca"])
    with (
        WaltzClient(MemoryStore({0: -1}), refused) as client,
        pytest.raises(WaltzTimeoutError, match="not mounted"),
    ):
        client.wait_mounted(3)
