"""Storage configuration (YAML + environment) and TLS on the storage and admin ports."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from support.storage import NUM_PARTITIONS, run
from support.tls import make_certificates

from waltz.config import load_settings
from waltz.errors import ConfigurationError
from waltz.local.nodes import LocalStorageNode
from waltz.protocol.channels import TlsConfig
from waltz.protocol.records import Record, ReqId
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient
from waltz.services.storage.config import StorageConfig


def test_yaml_flat_and_nested_keys_and_environment_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "storage.yaml"
    config.write_text(
        "storage:\n  directory: /data/w\n  admin.port: 7001\nstorage.segment.size.threshold: 4096\n"
        "storage.insecure: true\n"
    )
    monkeypatch.setenv("WALTZ_STORAGE_ADMIN_PORT", "7002")
    settings = load_settings(StorageConfig, config)
    assert settings.directory == Path("/data/w")
    assert settings.segment_size_threshold == 4096
    assert settings.admin_port == 7002  # the environment wins over the file
    assert load_settings(StorageConfig, config, admin_port=7003).admin_port == 7003  # options win
    assert load_settings(StorageConfig, str(config)) == settings  # a path given as a string
    assert settings.inline_append_streams == 2
    monkeypatch.setenv("WALTZ_STORAGE_INLINE_APPEND_STREAMS", "1")
    assert load_settings(StorageConfig, config).inline_append_streams == 1


def test_bad_configuration_gives_clear_errors(tmp_path: Path) -> None:
    config = tmp_path / "storage.yaml"
    config.write_text("storage.directory: /d\nstorage.prot: 1\n")
    with pytest.raises(ConfigurationError, match=r"unknown keys .*storage\.prot"):
        load_settings(StorageConfig, config)
    config.write_text("storage.directory: /d\nstorage.port: seventy\n")
    with pytest.raises(ConfigurationError, match="port"):
        load_settings(StorageConfig, config)
    config.write_text("storage.directory: /d\nstorage.ssl.certFile: /c.pem\n")
    with pytest.raises(ConfigurationError, match="set together"):
        load_settings(StorageConfig, config)
    # Below the 32 MiB a client may send, a node would refuse a transaction and stall its partition.
    config.write_text("storage.directory: /d\nstorage.grpc.maxMessageBytes: 8388608\n")
    with pytest.raises(ConfigurationError, match=r"(?s)max_message_bytes.*33554432"):
        load_settings(StorageConfig, config)
    config.write_text("storage.directory: /d\nstorage.inlineAppendStreams: 0\n")
    with pytest.raises(ConfigurationError, match="inline_append_streams"):
        load_settings(StorageConfig, config)
    config.write_text(": : :")
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_settings(StorageConfig, config)


def test_cli_reports_configuration_errors_without_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "storage.yaml"
    config.write_text("storage.directory: /d\nstorage.bogus: 1\n")
    from typer.testing import CliRunner

    from waltz.cli.main import app

    result = CliRunner().invoke(app, ["storage", "start", "--config", str(config)])
    assert result.exit_code == 2
    assert "unknown keys" in result.output and "Traceback" not in result.output


def test_tls_on_both_ports_with_client_certificates(
    tmp_path: Path, start_storage: Callable[..., LocalStorageNode]
) -> None:
    files = make_certificates(tmp_path)
    node = start_storage(
        env={
            "WALTZ_STORAGE_TLS_CERT_FILE": str(files["server"]),
            "WALTZ_STORAGE_TLS_KEY_FILE": str(files["server-key"]),
            "WALTZ_STORAGE_TLS_CA_FILE": str(files["ca"]),
        }
    )
    key = str(uuid.uuid4())
    tls = TlsConfig(ca_file=files["ca"], cert_file=files["client"], key_file=files["client-key"])

    async def scenario() -> None:
        async with StorageAdminClient(node.admin_address, key, NUM_PARTITIONS, tls=tls) as admin:
            await admin.assign_partition(0, True)
        async with StorageSessionClient(node.address, key, NUM_PARTITIONS, 1, tls=tls) as s:
            await s.append(0, [Record.create(0, ReqId(1, 1, 0, 0), 0, b"secret")])
            assert (await s.record(0, 0)) is not None
        # Plaintext, and TLS without a client certificate, are both refused.
        with pytest.raises(ConnectionError):
            await StorageSessionClient(node.address, key, NUM_PARTITIONS, 1).open()
        with pytest.raises(ConnectionError):
            await StorageSessionClient(
                node.address, key, NUM_PARTITIONS, 1, tls=TlsConfig(ca_file=files["ca"])
            ).open()

    run(scenario())


def test_tls_files_that_cannot_work_are_named_at_start(tmp_path: Path) -> None:
    """A key that is not the certificate's, or a certificate file that is not there: the node says
    which setting and which file, without a traceback (gRPC alone said the port could not be bound),
    as a configuration error (exit 2) before it makes its directory (docs/operations.md,
    "Certificates")."""
    import os
    import subprocess
    import sys

    files = make_certificates(tmp_path)
    cases = {
        "cannot be used together": (files["server"], files["client-key"]),
        "no such file": (tmp_path / "absent.pem", files["server-key"]),
    }
    for expected, (cert, key) in cases.items():
        env = {
            **os.environ,
            "WALTZ_STORAGE_TLS_CERT_FILE": str(cert),
            "WALTZ_STORAGE_TLS_KEY_FILE": str(key),
            "WALTZ_STORAGE_TLS_CA_FILE": str(files["ca"]),
        }
        command = [sys.executable, "-m", "waltz", "storage", "start", "--directory", str(tmp_path / "node")]
        done = subprocess.run(
            [*command, "--host", "127.0.0.1", "--port", "0", "--admin-port", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert f"error: storage.ssl.certFile {cert}" in done.stderr and expected in done.stderr, done.stderr
        assert not (tmp_path / "node").exists()
        assert "Traceback" not in done.stderr


def test_a_misspelt_variable_of_a_setting_is_said_to_be_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``WALTZ_STORAGE_SSL_CERT_FILE`` (the key storage.ssl.certFile suggests it) sets nothing: the
    node says so and names ``WALTZ_STORAGE_TLS_CERT_FILE``, since a TLS file ignored can mean a
    node that serves plaintext. A variable far from every setting is left alone."""
    monkeypatch.setenv("WALTZ_STORAGE_SSL_CERT_FILE", str(tmp_path / "node.pem"))
    monkeypatch.setenv("WALTZ_STORAGE_WHOLLY_UNRELATED_THING", "1")
    caplog.set_level("WARNING", logger="waltz.config")
    settings = load_settings(StorageConfig, directory=tmp_path / "node", insecure=True)
    assert settings.tls_cert_file is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "WALTZ_STORAGE_SSL_CERT_FILE is no setting of StorageConfig and is ignored" in warned[0]
    assert "did you mean WALTZ_STORAGE_TLS_CERT_FILE?" in warned[0]
