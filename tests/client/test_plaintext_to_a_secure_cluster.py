"""A client configured without TLS, pointed at a cluster whose servers require it (a local
cluster's default): its mount fails saying what to set, not only that no server answered
(docs/configuration.md, the client's settings)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.client.client_helpers import MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.client.connection import NO_CERTIFICATE_HINT, PLAINTEXT_HINT
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
            pytest.raises(WaltzTimeoutError, match="partitions not mounted within 7s") as caught,
        ):
            client.wait_mounted(7)
        assert f"if no server accepted a connection, {PLAINTEXT_HINT}" in str(caught.value)
        assert "WALTZ_CLIENT_TLS_CA_FILE" in PLAINTEXT_HINT
        # Each failed attempt's log line says it too; after MOUNT_WARNING_AFTER seconds, as a warning.
        assert any(PLAINTEXT_HINT in record.getMessage() for record in caplog.records), caplog.text
        warned = [
            r for r in caplog.records if r.levelno == logging.WARNING and PLAINTEXT_HINT in r.getMessage()
        ]
        assert len(warned) == 1, caplog.text  # one partition, once in 7 s
        assert "cannot mount on" in warned[0].getMessage()
        # A client with the CA but no certificate of its own is told what it lacks.
        caplog.clear()
        without_certificate = {
            k: v
            for k, v in cluster.client_settings().items()
            if k not in ("client_tls_cert_file", "client_tls_key_file")
        }
        with (
            WaltzClient(MemoryStore({0: -1}), WaltzClientConfig(**without_certificate)) as client,
            pytest.raises(WaltzTimeoutError, match="partitions not mounted within 7s") as caught,
        ):
            client.wait_mounted(7)
        assert NO_CERTIFICATE_HINT in str(caught.value)
        assert any(
            r.levelno == logging.WARNING and NO_CERTIFICATE_HINT in r.getMessage() for r in caplog.records
        ), caplog.text
        # With the TLS files the same client mounts.
        with WaltzClient(MemoryStore({0: -1}), WaltzClientConfig(**cluster.client_settings())) as client:
            client.wait_mounted(30)
