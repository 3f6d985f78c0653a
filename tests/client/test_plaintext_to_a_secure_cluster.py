"""A client configured without TLS, pointed at a cluster whose servers require it (a local
cluster's default): its mount fails saying what to set, not only that no server answered
(docs/configuration.md, the client's settings)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.client.client_helpers import MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.client.connection import PLAINTEXT_HINT
from waltz.errors import WaltzTimeoutError
from waltz.local.cluster import LocalCluster
from waltz.local.zookeeper import LocalZooKeeper


def test_a_plaintext_client_of_a_secure_cluster_is_told_to_set_its_tls_files(
    tmp_path: Path, zookeeper: LocalZooKeeper, caplog: pytest.LogCaptureFixture
) -> None:
    with LocalCluster(
        storages=1,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,
        work_dir=tmp_path / "cluster",
        delete_root=True,
    ) as cluster:
        settings = {k: v for k, v in cluster.client_settings().items() if not k.startswith("client_tls_")}
        caplog.set_level(logging.INFO, logger="waltz.client")
        with (
            WaltzClient(MemoryStore({0: -1}), WaltzClientConfig(**settings)) as client,
            pytest.raises(WaltzTimeoutError, match="partitions not mounted within 5s") as caught,
        ):
            client.wait_mounted(5)
        assert f"if no server accepted a connection, {PLAINTEXT_HINT}" in str(caught.value)
        assert "WALTZ_CLIENT_TLS_CA_FILE" in PLAINTEXT_HINT
        # Each failed attempt's log line says it too.
        assert any(PLAINTEXT_HINT in record.getMessage() for record in caplog.records), caplog.text
        # With the TLS files the same client mounts.
        with WaltzClient(MemoryStore({0: -1}), WaltzClientConfig(**cluster.client_settings())) as client:
            client.wait_mounted(30)
