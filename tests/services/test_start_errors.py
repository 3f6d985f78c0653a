"""A node that cannot start says why in one ``error:`` line and exits 1, not with a traceback.

The two mistakes of a first deployment: an address that is not the host's own (or a port another
process holds), and a ZooKeeper that is not there.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from waltz.local.certificates import make_cluster_certificates


def _start(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "waltz", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        # Plaintext on purpose: these are start errors, not the refusal to serve without TLS.
        env={**os.environ, "WALTZ_STORAGE_INSECURE": "true", "WALTZ_SERVER_INSECURE": "true", **(env or {})},
    )


def test_a_storage_node_whose_port_is_taken_says_so(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = _start("storage", "start", "--directory", str(tmp_path / "s"), "--port", str(port))
    assert done.returncode == 1, done.stderr
    assert f"error: cannot listen on 127.0.0.1:{port}: another process may use the port" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_storage_node_on_an_address_of_another_host_says_so(tmp_path: Path) -> None:
    done = _start(
        "storage",
        "start",
        "--directory",
        str(tmp_path / "s"),
        "--host",
        "198.51.100.7",
        "--port",
        "0",
    )
    assert done.returncode == 1, done.stderr
    assert "198.51.100.7 is not an address of this host" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_server_without_zookeeper_says_so() -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    done = _start(
        "server", "start", "--zookeeper", f"127.0.0.1:{port}", "--root", "/waltz/x", "--session-timeout", "2"
    )
    assert done.returncode == 1, done.stderr
    assert f"error: no ZooKeeper server at 127.0.0.1:{port} answered within 2s" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_storage_node_whose_metrics_port_is_taken_says_so(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = _start(
            "storage",
            "start",
            "--directory",
            str(tmp_path / "s"),
            "--port",
            "0",
            "--admin-port",
            "0",
            "--metrics-port",
            str(port),
        )
    assert done.returncode == 1, done.stderr
    assert f"error: cannot listen on 127.0.0.1:{port} for /metrics" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_storage_directory_that_cannot_be_made_says_so(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory")
    done = _start("storage", "start", "--directory", str(tmp_path / "afile" / "data"), "--port", "0")
    assert done.returncode == 1, done.stderr
    assert f"error: storage.directory {tmp_path / 'afile' / 'data'}:" in done.stderr
    assert "Traceback" not in done.stderr


def _closed_zookeeper() -> str:
    """A connect string no ZooKeeper answers at: a server that got past its settings would
    wait for it and exit 1, so exit 2 shows the settings refused it first."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        return f"127.0.0.1:{closed.getsockname()[1]}"


def test_an_advertised_endpoint_that_is_not_host_port_is_refused_before_zookeeper() -> None:
    # docs/configuration.md, "Server (`waltz server start`)": server.advertisedEndpoint is the
    # host:port clients use.
    for endpoint in ("nonsense", "host:0", "host:65536", ":55180", "0.0.0.0:55180"):
        done = _start(
            "server", "start", "--zookeeper", _closed_zookeeper(), "--root", "/waltz/x",
            "--session-timeout", "2", "--advertised-endpoint", endpoint,
        )  # fmt: skip
        assert done.returncode == 2, (endpoint, done.stderr)
        assert f"server.advertisedEndpoint {endpoint!r}" in done.stderr
        assert "ZooKeeper" not in done.stderr and "Traceback" not in done.stderr


def test_a_server_on_every_address_needs_an_advertised_endpoint() -> None:
    for host in ("0.0.0.0", "::"):
        done = _start(
            "server", "start", "--zookeeper", _closed_zookeeper(), "--root", "/waltz/x",
            "--session-timeout", "2", "--host", host, "--port", "0",
        )  # fmt: skip
        assert done.returncode == 2, (host, done.stderr)
        assert f"server.host {host!r} binds every address" in done.stderr
        assert "set server.advertisedEndpoint (WALTZ_SERVER_ADVERTISED_ENDPOINT" in done.stderr
        assert "Traceback" not in done.stderr


def test_a_server_tls_file_that_cannot_work_is_a_configuration_error_before_zookeeper(tmp_path: Path) -> None:
    """docs/operations.md, "Certificates": the server's own files (``server.ssl.*``) and those it
    presents to the storage nodes (``storage.ssl.*``) are checked before ZooKeeper is contacted."""
    files = make_cluster_certificates(tmp_path / "tls")
    absent = tmp_path / "absent.pem"
    cases = {
        f"server.ssl.certFile {absent}: no such file": {
            "WALTZ_SERVER_TLS_CERT_FILE": str(absent),
            "WALTZ_SERVER_TLS_KEY_FILE": str(files.key_file("node")),
        },
        "storage.ssl.certFile": {
            "WALTZ_STORE_TLS_CA_FILE": str(files.ca_file),
            "WALTZ_STORE_TLS_CERT_FILE": str(files.cert_file("node")),
            "WALTZ_STORE_TLS_KEY_FILE": str(files.key_file("client")),
        },
    }
    for expected, env in cases.items():
        done = _start(
            "server", "start", "--zookeeper", _closed_zookeeper(), "--root", "/waltz/x",
            "--session-timeout", "2", env=env,
        )  # fmt: skip
        assert done.returncode == 2, (expected, done.stderr)
        assert f"error: {expected}" in done.stderr
        assert "ZooKeeper" not in done.stderr and "Traceback" not in done.stderr


def test_a_storage_node_whose_control_file_is_damaged_says_so(tmp_path: Path) -> None:
    """A truncated control file, or one of an unknown format version, is one ``error:`` line
    naming the file, not a traceback."""
    import uuid

    from waltz.services.storage.control_file import ControlFile

    for damage in ("truncated", "version"):
        directory = tmp_path / damage
        directory.mkdir(mode=0o700)
        ControlFile.create(directory, uuid.uuid4(), 1).close()
        path = ControlFile.path_in(directory)
        data = path.read_bytes()
        damaged = data[:-10] if damage == "truncated" else (9).to_bytes(4, "big") + data[4:]
        path.write_bytes(damaged)
        done = _start(
            "storage", "start", "--directory", str(directory), "--port", "0", "--admin-port", "0",
            "--metrics-port", "0",
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert str(path) in line
        assert "restore that file from a backup of this node" in line
        assert path.read_bytes() == damaged  # left as it was found
