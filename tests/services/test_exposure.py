"""A node serves only with mutual TLS, unless told on purpose, on loopback too (docs/operations.md,
"Roles"): the rule, the settings of both nodes, and a storage node and a server really started."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from waltz.local.processes import free_port
from waltz.services.exposure import is_loopback, plaintext_refusal
from waltz.services.server.config import ServerConfig
from waltz.services.storage.config import StorageConfig

pytestmark = pytest.mark.security

ZK = {"zookeeper_connect_string": "127.0.0.1:2181", "cluster_root": "/waltz/x"}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.77.0.11", False),
        ("192.168.1.5", False),
        ("db.example.com", False),
        ("", False),
    ],
)
def test_only_loopback_addresses_count_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_the_refusal_names_the_settings_that_lift_it() -> None:
    message = plaintext_refusal("storage", "WALTZ_STORAGE_", "10.0.0.5", mutual_tls=False, insecure=False)
    assert message is not None
    assert "storage.host '10.0.0.5' is not a loopback address" in message
    assert "storage.ssl.caFile" in message and "WALTZ_STORAGE_INSECURE=true" in message
    assert plaintext_refusal("storage", "WALTZ_STORAGE_", "10.0.0.5", mutual_tls=True, insecure=False) is None
    assert plaintext_refusal("storage", "WALTZ_STORAGE_", "10.0.0.5", mutual_tls=False, insecure=True) is None
    # Loopback is reachable by every local user: no exception.
    local = plaintext_refusal("server", "WALTZ_SERVER_", "127.0.0.1", mutual_tls=False, insecure=False)
    assert local is not None
    assert "server.host '127.0.0.1' is a loopback address, reachable by every user of this host" in local
    assert "delete the node's partitions" in local and "WALTZ_SERVER_INSECURE=true, --insecure" in local
    assert plaintext_refusal("server", "WALTZ_SERVER_", "::1", mutual_tls=False, insecure=True) is None


def test_storage_settings_off_loopback_need_mutual_tls_or_insecure(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=re.escape("storage.host '0.0.0.0' is not a loopback address")):
        StorageConfig(directory=tmp_path, host="0.0.0.0")
    # TLS without a CA file checks no client: still refused.
    cert, key, ca = (tmp_path / name for name in ("cert.pem", "key.pem", "ca.pem"))
    with pytest.raises(ValidationError, match="mutual TLS is not configured"):
        StorageConfig(directory=tmp_path, host="10.1.2.3", tls_cert_file=cert, tls_key_file=key)
    assert StorageConfig(directory=tmp_path, host="10.1.2.3", insecure=True).insecure
    assert StorageConfig(
        directory=tmp_path, host="10.1.2.3", tls_cert_file=cert, tls_key_file=key, tls_ca_file=ca
    ).mutual_tls
    with pytest.raises(ValidationError, match=re.escape("storage.host '127.0.0.1' is a loopback address")):
        StorageConfig(directory=tmp_path)  # loopback by default: refused all the same
    assert not StorageConfig(directory=tmp_path, insecure=True).mutual_tls


def test_server_settings_off_loopback_need_mutual_tls_or_insecure(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=re.escape("server.host '10.1.2.3' is not a loopback address")):
        ServerConfig(server_host="10.1.2.3", **ZK)
    with pytest.raises(ValidationError, match=re.escape("server.host '127.0.0.1' is a loopback address")):
        ServerConfig(**ZK)
    assert ServerConfig(server_host="10.1.2.3", server_insecure=True, **ZK).server_insecure
    cert, key, ca = (tmp_path / name for name in ("cert.pem", "key.pem", "ca.pem"))
    assert ServerConfig(
        server_host="::",
        server_advertised_endpoint="10.1.2.3:55180",
        server_tls_cert_file=cert,
        server_tls_key_file=key,
        server_tls_ca_file=ca,
        **ZK,
    ).mutual_tls


def storage_process(
    tmp_path: Path, env: dict[str, str], host: str = "0.0.0.0", *flags: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "waltz.services.storage",
            "--directory",
            str(tmp_path / "storage"),
            "--host",
            host,
            "--port",
            str(free_port()),
            "--admin-port",
            str(free_port()),
            *flags,
        ],
        env={**env, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_storage_node_on_every_address_without_tls_refuses_to_start(tmp_path: Path) -> None:
    process = storage_process(tmp_path, {})
    output, _ = process.communicate(timeout=60)
    assert process.returncode != 0
    assert "storage.host '0.0.0.0' is not a loopback address" in output
    assert "WALTZ_STORAGE_INSECURE=true" in output
    assert not (tmp_path / "storage").exists() or not any((tmp_path / "storage").iterdir())


def said_until_insecure(process: subprocess.Popen[str]) -> str:
    """What a started node printed up to its line saying it serves without mutual TLS; the node
    still runs (it is terminated after)."""
    try:
        lines: list[str] = []
        assert process.stdout is not None
        for _ in range(200):  # bounded: the start-up lines come within a few seconds
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "storage.insecure is set" in line:
                break
        said = "".join(lines)
        assert process.poll() is None, said
        return said
    finally:
        process.terminate()
        process.wait(30)


def test_a_storage_node_told_insecure_starts_and_says_so(tmp_path: Path) -> None:
    said = said_until_insecure(storage_process(tmp_path, {"WALTZ_STORAGE_INSECURE": "true"}))
    assert "storage.insecure is set: the ports on 0.0.0.0 serve without mutual TLS, to every host" in said


def test_a_storage_node_started_with_no_flags_refuses_and_starts_with_insecure(tmp_path: Path) -> None:
    process = storage_process(tmp_path, {}, "127.0.0.1")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2, output
    assert "storage.host '127.0.0.1' is a loopback address, reachable by every user" in output
    assert not (tmp_path / "storage").exists()
    said = said_until_insecure(storage_process(tmp_path, {}, "127.0.0.1", "--insecure"))
    assert "the ports on 127.0.0.1 serve without mutual TLS, to every user of this host" in said
