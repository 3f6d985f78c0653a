"""Test certificates made with the `cryptography` package: a CA, a server and a client certificate.

The certificates name 127.0.0.1 and localhost; every key is EC P-256 and every certificate is
valid for two days. The client certificate holds every role (``urn:waltz:role:*``), so that one
certificate reaches every port, as the tests of TLS itself need; the server certificate holds the
``server`` role. The tests of the roles use a secure ``LocalCluster`` (waltz/local/certificates.py).
``make_certificates(directory)`` writes PEM files and returns their paths by name (``ca``,
``ca-key``, ``server``, ``server-key``, ``client``, ``client-key``).
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from waltz.protocol.roles import Role, role_uri


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def make_certificates(directory: Path) -> dict[str, Path]:
    files = {
        name: directory / f"{name}.pem"
        for name in ("ca", "ca-key", "server", "server-key", "client", "client-key")
    }
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("waltz-test-ca"))
        .issuer_name(_name("waltz-test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(files["ca-key"], ca_key)
    hosts = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    for name, usage, roles in (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH, (Role.SERVER,)),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH, tuple(Role)),
    ):
        names = x509.SubjectAlternativeName(
            [*hosts, *(x509.UniformResourceIdentifier(role_uri(role)) for role in roles)]
        )
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(names, critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        files[name].write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(files[f"{name}-key"], key)
    return files
