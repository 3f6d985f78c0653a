"""A client configured without TLS, pointed at a cluster whose servers require it (a local
cluster's default): its mount fails saying what to set, not only that no server answered
(docs/configuration.md, the client's settings). A client whose certificate has expired is refused
before it connects, and one whose certificate expires while it runs says so when its reconnects
fail (docs/operations.md, "Certificates")."""

from __future__ import annotations

import datetime
import logging
import shutil
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from tests.client.client_helpers import MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.client.connection import NO_CERTIFICATE_HINT, PLAINTEXT_HINT
from waltz.errors import ConfigurationError, ExpiredCertificateError, WaltzTimeoutError
from waltz.local.certificates import ClusterCertificates, make_cluster_certificates
from waltz.local.cluster import LocalCluster
from waltz.local.zookeeper import LocalZooKeeper
from waltz.protocol.certificates import refuse_unreadable_tls_files


def _expired_copy(certificates: ClusterCertificates, name: str, path: Path) -> None:
    """Write to ``path`` the role certificate ``name`` signed again by the cluster's CA, alike but
    for its dates: it expired yesterday. Only its dates make a server refuse it."""
    current = x509.load_pem_x509_certificate(certificates.cert_file(name).read_bytes())
    ca_key = serialization.load_pem_private_key((certificates.directory / "ca-key.pem").read_bytes(), None)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(current.subject)
        .issuer_name(current.issuer)
        .public_key(current.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=30))
        .not_valid_after(now - datetime.timedelta(days=1))
    )
    for extension in current.extensions:
        builder = builder.add_extension(extension.value, critical=extension.critical)
    path.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))  # type: ignore[arg-type]


def test_a_client_with_an_expired_certificate_is_refused_before_it_connects(tmp_path: Path) -> None:
    certificates = make_cluster_certificates(tmp_path / "certificates")
    expired = tmp_path / "expired.pem"
    _expired_copy(certificates, "client", expired)
    for setting, fields in (
        ("client.ssl.certFile", {"client_tls_cert_file": expired}),
        ("zookeeper.ssl.certFile", {"zookeeper_ssl_cert_file": expired}),
    ):
        with pytest.raises(ExpiredCertificateError) as refused:
            WaltzClient(MemoryStore({0: -1}), _unreachable_client_config(certificates, fields))
        assert f"{setting} {expired} expired on" in str(refused.value)
        assert "the servers and ZooKeeper refuse an expired certificate" in str(refused.value)


def _unreachable_client_config(
    certificates: ClusterCertificates, fields: dict[str, Path]
) -> WaltzClientConfig:
    """A client configuration with every TLS file of the cluster's client role but ``fields``,
    whose ZooKeeper is never reached (port 9): a refusal must come before any connection."""
    return WaltzClientConfig(
        zookeeper_connect_string="127.0.0.1:9",
        cluster_root="/waltz/none",
        zookeeper_session_timeout=2,
        **{
            "client_tls_ca_file": certificates.ca_file,
            "client_tls_cert_file": certificates.cert_file("client"),
            "client_tls_key_file": certificates.key_file("client"),
            "zookeeper_ssl_ca_file": certificates.ca_file,
            "zookeeper_ssl_cert_file": certificates.cert_file("client"),
            "zookeeper_ssl_key_file": certificates.key_file("client"),
            **fields,
        },
    )


def test_a_client_whose_tls_files_cannot_be_used_is_refused_before_it_connects(tmp_path: Path) -> None:
    """A mistyped path, or a key given where the CA belongs, fails at construction naming the
    setting and the file, not as connections retried until a submission times out."""
    certificates = make_cluster_certificates(tmp_path / "certificates")
    missing = tmp_path / "nope.pem"
    for fields, said in (
        (
            {"client_tls_cert_file": missing},
            f"client.ssl.certFile (WALTZ_CLIENT_TLS_CERT_FILE) {missing} cannot be read (No such file",
        ),
        ({"client_tls_ca_file": certificates.key_file("client")}, "client.ssl.caFile"),
        (
            {"zookeeper_ssl_key_file": missing},
            f"zookeeper.ssl.keyFile (WALTZ_ZOOKEEPER_SSL_KEY_FILE) {missing} cannot be read",
        ),
    ):
        with pytest.raises(ConfigurationError) as refused:
            WaltzClient(MemoryStore({0: -1}), _unreachable_client_config(certificates, fields))
        assert type(refused.value) is ConfigurationError
        assert said in str(refused.value) and "fix the client's TLS settings" in str(refused.value)
    # The ZooKeeper credential file too, named by its setting and variable.
    with pytest.raises(ConfigurationError) as refused:
        WaltzClient(
            MemoryStore({0: -1}),
            _unreachable_client_config(certificates, {"zookeeper_auth_digest_file": missing}),
        )
    assert (
        f"zookeeper.auth.digestFile (WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE) {missing} cannot be read (No such file"
        in (str(refused.value))
    )
    # What a deployment gives is accepted: a CA bundle of several certificates, a path as text.
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(certificates.cert_file("client").read_bytes() + certificates.ca_file.read_bytes())
    refuse_unreadable_tls_files(
        {"client.ssl.caFile": bundle, "client.ssl.keyFile": str(certificates.key_file("client"))},  # type: ignore[dict-item]
        holder="the client",
    )
    with pytest.raises(ConfigurationError, match="holds no PEM certificate"):
        WaltzClient(
            MemoryStore({0: -1}),
            _unreachable_client_config(certificates, {"client_tls_ca_file": certificates.key_file("client")}),
        )


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
        # With the TLS files the same client mounts; when its certificate expires while it runs
        # (its file replaced by one the CA signed alike but for the dates), the reconnects after
        # its server restarts fail saying so.
        assert cluster.certificates is not None
        certificate = tmp_path / "client.pem"
        shutil.copyfile(cluster.certificates.cert_file("client"), certificate)
        settings = {**cluster.client_settings(), "client_tls_cert_file": certificate}
        with WaltzClient(MemoryStore({0: -1}), WaltzClientConfig(**settings)) as client:
            client.wait_mounted(30)
            caplog.clear()
            _expired_copy(cluster.certificates, "client", certificate)
            cluster.restart_server(0)
            said = f"client.ssl.certFile {certificate} expired on"
            deadline = time.monotonic() + 30
            while not any(said in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert any(said in r.getMessage() for r in caplog.records), caplog.text
            with pytest.raises(WaltzTimeoutError, match="partitions not mounted within 3s") as caught:
                client.wait_mounted(3)
            assert said in str(caught.value) and "a server refuses an expired certificate" in str(
                caught.value
            )
