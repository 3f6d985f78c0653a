"""Certificate expiry (docs/operations.md, "Certificates"): a node's gauge and start-up log line,
and a tool that refuses to start with an expired certificate of its own."""

from __future__ import annotations

import datetime
import logging
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry
from support.tls import make_certificates
from typer.testing import CliRunner

from waltz.cli.main import app
from waltz.protocol.certificates import certificate_not_after
from waltz.services.certificate_expiry import watch_certificates


def test_the_gauge_and_the_log_line_follow_the_days_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = make_certificates(tmp_path)  # valid for two days
    expiry = certificate_not_after(files["server"])
    caplog.set_level(logging.INFO, logger="waltz.services.certificate_expiry")
    for now, level, words in (
        (expiry - datetime.timedelta(days=60), logging.INFO, "expires on"),
        (expiry - datetime.timedelta(days=3), logging.WARNING, "in 3 day(s): make its replacement"),
        (expiry + datetime.timedelta(hours=1), logging.ERROR, "EXPIRED on"),
    ):
        caplog.clear()
        registry = CollectorRegistry()
        found = watch_certificates(registry, {"server": files["server"], "storage client": None}, now=now)
        assert found == {"server": expiry}
        value = registry.get_sample_value(
            "waltz_tls_certificate_expiry_timestamp_seconds", {"certificate": "server"}
        )
        assert value == expiry.timestamp()
        (record,) = caplog.records
        assert record.levelno == level and words in record.getMessage(), record.getMessage()


def _expired_certificate(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "expired-operator")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=400))
        .not_valid_after(now - datetime.timedelta(days=35))
        .sign(key, hashes.SHA256())
    )
    cert, key_file = directory / "expired.pem", directory / "expired-key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert, key_file


@pytest.mark.parametrize(
    ("command", "variables", "setting"),
    [
        (["cluster", "list"], "WALTZ_CLUSTER_SSL", "cluster.ssl.certFile"),
        (["client", "high-water-mark"], "WALTZ_CLIENT_TLS", "client.ssl.certFile"),
        (["client", "check-connectivity"], "WALTZ_CLIENT_TLS", "client.ssl.certFile"),
    ],
)
def test_a_command_with_an_expired_certificate_says_so_before_connecting(
    tmp_path: Path, command: list[str], variables: str, setting: str
) -> None:
    cert, key = _expired_certificate(tmp_path)
    env = {
        "WALTZ_ZOOKEEPER_CONNECT_STRING": "127.0.0.1:9",  # never reached
        "WALTZ_CLUSTER_ROOT": "/waltz/none",
        f"{variables}_CA_FILE": str(cert),
        f"{variables}_CERT_FILE": str(cert),
        f"{variables}_KEY_FILE": str(key),
        "COLUMNS": "300",
    }
    result = CliRunner().invoke(app, command, env=env)
    assert result.exit_code == 2, result.output
    assert f"{setting} {cert} expired on" in result.output
    assert "no ZooKeeper server" not in result.output


def test_a_server_watches_every_certificate_it_presents_zookeeper_s_included(tmp_path: Path) -> None:
    from waltz.services.server.config import ServerConfig

    files = make_certificates(tmp_path)
    config = ServerConfig(
        zookeeper_connect_string="127.0.0.1:2181",
        cluster_root="/w",
        zookeeper_ssl_ca_file=files["ca"],
        zookeeper_ssl_cert_file=files["server"],
        zookeeper_ssl_key_file=files["server-key"],
        server_insecure=True,  # its own port's certificates are not the point here
    )
    registry = CollectorRegistry()
    found = watch_certificates(registry, config.presented_certificates())
    assert set(found) == {"zookeeper client"}
    assert (
        registry.get_sample_value(
            "waltz_tls_certificate_expiry_timestamp_seconds", {"certificate": "zookeeper client"}
        )
        == certificate_not_after(files["server"]).timestamp()
    )
