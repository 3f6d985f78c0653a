"""The TLS files of ``waltz cluster`` (``cluster.ssl.*``) and of the client (``client.ssl.*``) are
checked before anything is contacted (docs/operations.md, "Certificates"): a missing file, a CA
file that is not PEM, or a key that is not the certificate's is one ``error:`` line naming the
setting and the file, exit 2, where the tools reported every node unreachable or waited for a
handshake that could not succeed.

ZooKeeper is a closed port: a tool that got past its TLS files would fail on it instead.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from waltz.local.certificates import ClusterCertificates, make_cluster_certificates


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterCertificates]:
    yield make_cluster_certificates(tmp_path_factory.mktemp("tls"))


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        return int(closed.getsockname()[1])


def _waltz(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WALTZ_")}
    return subprocess.run(
        [sys.executable, "-m", "waltz", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            **clean,
            "WALTZ_ZOOKEEPER_CONNECT_STRING": f"127.0.0.1:{_closed_port()}",
            "WALTZ_CLUSTER_ROOT": "/waltz/x",
            "WALTZ_ZOOKEEPER_CONNECT_TIMEOUT": "2",
            "WALTZ_ZOOKEEPER_SESSION_TIMEOUT": "2",
            **env,
        },
    )


def test_a_missing_cluster_ca_file_is_named(tmp_path: Path) -> None:
    done = _waltz("cluster", "verify", env={"WALTZ_CLUSTER_SSL_CA_FILE": str(tmp_path / "nonexistent.pem")})
    assert done.returncode == 2, done.stderr
    assert (
        f"error: cluster.ssl.caFile (WALTZ_CLUSTER_SSL_CA_FILE) {tmp_path / 'nonexistent.pem'}: no such file"
        in done.stderr
    )


def test_a_cluster_ca_file_that_is_not_pem_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    done = _waltz("cluster", "verify", env={"WALTZ_CLUSTER_SSL_CA_FILE": str(junk)})
    assert done.returncode == 2, done.stderr
    assert f"cluster.ssl.caFile (WALTZ_CLUSTER_SSL_CA_FILE) {junk} is not a PEM CA bundle" in done.stderr


def test_a_cluster_key_of_another_certificate_is_named(certificates: ClusterCertificates) -> None:
    done = _waltz(
        "cluster",
        "verify",
        env={
            "WALTZ_CLUSTER_SSL_CA_FILE": str(certificates.ca_file),
            "WALTZ_CLUSTER_SSL_CERT_FILE": str(certificates.cert_file("operator")),
            "WALTZ_CLUSTER_SSL_KEY_FILE": str(certificates.key_file("client")),
        },
    )
    assert done.returncode == 2, done.stderr
    assert (
        f"cluster.ssl.certFile {certificates.cert_file('operator')} and cluster.ssl.keyFile "
        f"{certificates.key_file('client')} cannot be used together"
    ) in done.stderr


def test_a_client_key_of_another_certificate_is_named(certificates: ClusterCertificates) -> None:
    done = _waltz(
        "client",
        "high-water-mark",
        env={
            "WALTZ_CLIENT_TLS_CA_FILE": str(certificates.ca_file),
            "WALTZ_CLIENT_TLS_CERT_FILE": str(certificates.cert_file("client")),
            "WALTZ_CLIENT_TLS_KEY_FILE": str(certificates.key_file("operator")),
        },
    )
    assert done.returncode == 2, done.stderr
    assert (
        f"client.ssl.certFile {certificates.cert_file('client')} and client.ssl.keyFile "
        f"{certificates.key_file('operator')} cannot be used together"
    ) in done.stderr
    assert "WALTZ_CLIENT_TLS_CERT_FILE, WALTZ_CLIENT_TLS_KEY_FILE" in done.stderr


def test_a_console_tls_file_that_cannot_work_is_named_before_zookeeper(
    tmp_path: Path, certificates: ClusterCertificates
) -> None:
    """docs/console.md: the console's HTTPS files (``console.ssl.*``) are checked as a node's."""
    absent = tmp_path / "absent.pem"
    done = _waltz(
        "console",
        env={
            "WALTZ_CONSOLE_SSL_CERT_FILE": str(absent),
            "WALTZ_CONSOLE_SSL_KEY_FILE": str(certificates.key_file("node")),
        },
    )
    assert done.returncode == 2, done.stderr
    assert f"error: console.ssl.certFile {absent}: no such file" in done.stderr
    done = _waltz(
        "console",
        env={
            "WALTZ_CONSOLE_SSL_CERT_FILE": str(certificates.cert_file("node")),
            "WALTZ_CONSOLE_SSL_KEY_FILE": str(certificates.key_file("client")),
        },
    )
    assert done.returncode == 2, done.stderr
    assert (
        f"error: console.ssl.certFile {certificates.cert_file('node')} and console.ssl.keyFile" in done.stderr
    )
