"""The CA and role certificates of a secure local cluster (waltz/local/certificates.py)."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

from waltz.local.certificates import CERTIFICATE_ROLES, make_cluster_certificates
from waltz.protocol.roles import Role, roles_of_certificate


def test_each_certificate_names_its_roles_and_passes_strict_x509_verification(tmp_path: Path) -> None:
    files = make_cluster_certificates(tmp_path)
    for name, roles in CERTIFICATE_ROLES.items():
        assert roles_of_certificate(files.cert_file(name).read_bytes()) == frozenset(roles)
        assert files.key_file(name).stat().st_mode & 0o077 == 0  # private keys: owner only
    assert roles_of_certificate(files.ca_file.read_bytes()) == frozenset()

    # What Python 3.13 verifies by default (key identifiers, the CA's key usage).
    client = ssl.create_default_context(cafile=str(files.ca_file))
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files.cert_file("node"), files.key_file("node"))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            connection, _ = listener.accept()
            with server.wrap_socket(connection, server_side=True):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.version() is not None
        thread.join(10)


def test_kept_certificates_are_reused_and_made_again_when_a_file_is_missing(tmp_path: Path) -> None:
    files = make_cluster_certificates(tmp_path)
    node = files.cert_file("node").read_bytes()
    assert make_cluster_certificates(tmp_path).cert_file("node").read_bytes() == node
    files.key_file("client").unlink()
    again = make_cluster_certificates(tmp_path)
    assert again.key_file("client").exists()
    assert again.cert_file("node").read_bytes() != node
    assert Role.SERVER in roles_of_certificate(again.cert_file("node").read_bytes())


def test_keys_made_again_over_readable_files_are_made_owner_only(tmp_path: Path) -> None:
    files = make_cluster_certificates(tmp_path)
    for name in ("ca", "node", "client"):
        files.key_file(name).chmod(0o644)  # say, copied with a loose umask
    files.cert_file("node").unlink()  # made again: every key is written over its old file
    again = make_cluster_certificates(tmp_path)
    for name in ("ca", "node", "client"):
        mode = again.key_file(name).stat().st_mode & 0o777
        assert mode == 0o600, f"{name} key is {oct(mode)} after it was written again"
