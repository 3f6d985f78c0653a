"""A certificate authority and role certificates for a secured local cluster (docs/design/overview.md,
"Roles").

:func:`make_cluster_certificates` writes a CA and one certificate per kind of peer, each naming its
roles as ``urn:waltz:role:<role>`` subject alternative names (:mod:`waltz.protocol.roles`):

- ``node``: the servers' and storage nodes' own certificate (TLS server and client use, role
  ``server``: a server presents it to storage nodes for its store sessions);
- ``client``: applications (role ``client``);
- ``operator``: read-only operator tools (role ``operator``);
- ``admin``: operator tools that change the log, and the local cluster's own supervisor (role
  ``admin``).

Every certificate names 127.0.0.1 and localhost (and the extra addresses given), every key is EC
P-256, and they are valid for ``days`` days. They are for local and test clusters: a deployment
issues its certificates from its own CA with the same role names (docs/operations.md, "Roles").
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from waltz.private_files import private_directory, write_private
from waltz.protocol.channels import TlsConfig
from waltz.protocol.roles import Role, role_uri

__all__ = ["CERTIFICATE_ROLES", "ClusterCertificates", "make_cluster_certificates"]

#: The certificates made, by name, with their roles.
CERTIFICATE_ROLES: dict[str, tuple[Role, ...]] = {
    "node": (Role.SERVER,),
    "client": (Role.CLIENT,),
    "operator": (Role.OPERATOR,),
    "admin": (Role.ADMIN,),
}


@dataclass(frozen=True, slots=True)
class ClusterCertificates:
    """The PEM files of :func:`make_cluster_certificates` (``<name>.pem`` and ``<name>-key.pem``)."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    def cert_file(self, name: str) -> Path:
        """The certificate ``name`` (one of :data:`CERTIFICATE_ROLES`)."""
        return self.directory / f"{name}.pem"

    def key_file(self, name: str) -> Path:
        return self.directory / f"{name}-key.pem"

    def tls(self, name: str) -> TlsConfig:
        """Client TLS files presenting the certificate ``name`` and trusting the cluster's CA."""
        return TlsConfig(self.ca_file, self.cert_file(name), self.key_file(name))

    def storage_env(self) -> dict[str, str]:
        """``WALTZ_STORAGE_TLS_*`` settings: mutual TLS on every port of a storage node."""
        return {
            "WALTZ_STORAGE_TLS_CERT_FILE": str(self.cert_file("node")),
            "WALTZ_STORAGE_TLS_KEY_FILE": str(self.key_file("node")),
            "WALTZ_STORAGE_TLS_CA_FILE": str(self.ca_file),
        }

    def server_env(self) -> dict[str, str]:
        """``WALTZ_SERVER_TLS_*`` and ``WALTZ_STORE_TLS_*`` settings: mutual TLS on the server's
        ports, and the node certificate (role ``server``) for its store sessions."""
        return {
            "WALTZ_SERVER_TLS_CERT_FILE": str(self.cert_file("node")),
            "WALTZ_SERVER_TLS_KEY_FILE": str(self.key_file("node")),
            "WALTZ_SERVER_TLS_CA_FILE": str(self.ca_file),
            "WALTZ_STORE_TLS_CA_FILE": str(self.ca_file),
            "WALTZ_STORE_TLS_CERT_FILE": str(self.cert_file("node")),
            "WALTZ_STORE_TLS_KEY_FILE": str(self.key_file("node")),
        }

    def client_env(self, name: str = "client") -> dict[str, str]:
        """``WALTZ_CLIENT_TLS_*`` settings (``client.ssl.*``) of a client presenting the
        certificate ``name``."""
        return {
            "WALTZ_CLIENT_TLS_CA_FILE": str(self.ca_file),
            "WALTZ_CLIENT_TLS_CERT_FILE": str(self.cert_file(name)),
            "WALTZ_CLIENT_TLS_KEY_FILE": str(self.key_file(name)),
        }


#: A kept set of certificates is made again when one expires within this many seconds.
RENEW_BEFORE = 24 * 3600.0


def _usable(files: ClusterCertificates) -> bool:
    """Whether every file is there and no certificate expires within :data:`RENEW_BEFORE`."""
    from cryptography import x509

    names = ["ca", *CERTIFICATE_ROLES]
    paths = [files.directory / f"{name}.pem" for name in names]
    keys = [files.directory / f"{name}-key.pem" for name in names]
    if not all(path.exists() for path in [*paths, *keys]):
        return False
    horizon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=RENEW_BEFORE)
    try:
        return all(
            x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc > horizon for path in paths
        )
    except ValueError:
        return False


def make_cluster_certificates(
    directory: Path, *, days: int = 30, addresses: Iterable[str] = ()
) -> ClusterCertificates:
    """Write a CA and the role certificates of :data:`CERTIFICATE_ROLES` into ``directory``.

    Files that exist already are kept (a kept work directory restarts with the same CA), unless one
    is missing, unreadable or expires within a day: then all are made again.

    Args:
        directory: created ``0700`` if missing; every file is written ``0600`` (the certificates
            too: nothing of a local cluster's work directory is readable by other users).
        days: validity of the CA and the certificates.
        addresses: more IP addresses or DNS names for the certificates, besides 127.0.0.1 and
            localhost.

    Returns:
        The files.

    Raises:
        OSError: the directory cannot be written.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    files = ClusterCertificates(directory)
    if _usable(files):
        return files
    private_directory(directory)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
        write_private(
            path,
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )

    now = datetime.datetime.now(datetime.UTC)
    valid_from, valid_until = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("waltz-local-ca"))
        .issuer_name(name("waltz-local-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    hosts: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    for address in addresses:
        try:
            hosts.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            hosts.append(x509.DNSName(address))
    usages = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    for cert_name, roles in CERTIFICATE_ROLES.items():
        key = ec.generate_private_key(ec.SECP256R1())
        names = x509.SubjectAlternativeName(
            [*hosts, *(x509.UniformResourceIdentifier(role_uri(role)) for role in roles)]
        )
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name(f"waltz-{cert_name}"))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid_from)
            .not_valid_after(valid_until)
            .add_extension(names, critical=False)
            .add_extension(usages, critical=False)
            .add_extension(authority, critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        write_private(files.cert_file(cert_name), certificate.public_bytes(serialization.Encoding.PEM))
        write_key(files.key_file(cert_name), key)
    write_private(files.ca_file, ca.public_bytes(serialization.Encoding.PEM))
    write_key(directory / "ca-key.pem", ca_key)
    return files
