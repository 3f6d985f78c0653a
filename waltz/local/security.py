"""The security of a local cluster: role certificates, the ZooKeeper credential, the TLS wiring.

Design: docs/design/overview.md, "Roles" (mutual TLS, a role per certificate) and
docs/design/zookeeper.md, "Security" (a digest credential protecting the cluster's znodes).
:class:`ClusterSecurity` makes what a local cluster asks for at start: the CA and role
certificates of a secure cluster (:mod:`waltz.local.certificates`) and the cluster's ZooKeeper
credential (kept in :data:`DIGEST_FILE` in the work directory, and reused when a kept work
directory starts again). It gives the storage nodes and the servers the environment that serves
and uses them, the supervisor its client TLS files, and clients the settings that reach the
cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from waltz.errors import ConfigurationError
from waltz.local.certificates import ClusterCertificates, make_cluster_certificates
from waltz.local.options import SecurityOptions
from waltz.metadata.zk_roles import ROLE_DIGEST_FILES, Role, RoleCredentials
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.private_files import replaceable_by_others
from waltz.protocol.channels import TlsConfig

__all__ = ["CERTIFICATES_DIR", "DIGEST_FILE", "LEGACY_DIGEST_FILE", "ROLE_DIGEST_DIR", "ClusterSecurity"]

#: The directory of a secure cluster's CA and role certificates in the work directory.
CERTIFICATES_DIR = "tls"

#: The directory of the ZooKeeper credential files per role in the work directory.
ROLE_DIGEST_DIR = "zookeeper-credentials"

#: The operator's ZooKeeper credential file (the supervisor's and the tools'), in the work directory.
DIGEST_FILE = f"{ROLE_DIGEST_DIR}/{ROLE_DIGEST_FILES[Role.OPERATOR]}"

#: The single credential file of a cluster made by an earlier version, or given by the caller.
LEGACY_DIGEST_FILE = "zookeeper-digest"

#: The settings field of each ZooKeeper security file, and its ``WALTZ_*`` environment variable.
_ZOOKEEPER_VARIABLES = {
    "zookeeper_auth_digest_file": "WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE",
    "zookeeper_ssl_ca_file": "WALTZ_ZOOKEEPER_SSL_CA_FILE",
    "zookeeper_ssl_cert_file": "WALTZ_ZOOKEEPER_SSL_CERT_FILE",
    "zookeeper_ssl_key_file": "WALTZ_ZOOKEEPER_SSL_KEY_FILE",
}


class ClusterSecurity:
    """The certificates, ZooKeeper credential and TLS files of one local cluster.

    Args:
        options: what the cluster asks for: mutual TLS with certificates made for it, or client
            TLS files for nodes secured by the caller; a ZooKeeper credential; ZooKeeper TLS.
    """

    def __init__(self, options: SecurityOptions) -> None:
        self._options = options
        self._tls = options.tls
        self._zookeeper_security = options.zookeeper_security or ZooKeeperSecurity()
        self._certificates: ClusterCertificates | None = None
        self._roles: RoleCredentials | None = None

    @property
    def certificates(self) -> ClusterCertificates | None:
        """The CA and role certificates of a secure cluster (made at :meth:`start`), else None."""
        return self._certificates

    @property
    def tls(self) -> TlsConfig | None:
        """The supervisor's client TLS files for the nodes' ports, or None for plaintext."""
        return self._tls

    @property
    def http_scheme(self) -> str:
        """``https`` when the nodes serve TLS (their metrics ports too), else ``http``."""
        return "https" if self._tls is not None else "http"

    @property
    def zookeeper_security(self) -> ZooKeeperSecurity:
        """The security of the cluster's ZooKeeper sessions (its credential once :meth:`start` ran)."""
        return self._zookeeper_security

    @property
    def role_credentials(self) -> RoleCredentials | None:
        """The credential of each role (made at :meth:`start`), or None (no or a single credential)."""
        return self._roles

    def start(self, work_dir: Path, addresses: Sequence[str]) -> None:
        """Make (or, in a kept work directory, reuse) the certificates and the ZooKeeper credential.

        Args:
            work_dir: the cluster's work directory (``tls/`` and :data:`DIGEST_FILE` go there).
            addresses: more addresses the certificates name besides 127.0.0.1 and localhost
                (the hosts of namespace mode).

        Raises:
            OSError: the work directory cannot be written.
            ConfigurationError: a kept credential file is unreadable.
        """
        if self._options.secure:
            certificates = make_cluster_certificates(work_dir / CERTIFICATES_DIR, addresses=addresses)
            self._certificates = certificates
            self._tls = certificates.tls("admin")  # the supervisor acts as ``admin``
        if self._options.zookeeper_auth and self._zookeeper_security.digest is None:
            legacy = work_dir / LEGACY_DIGEST_FILE
            if legacy.exists() and not (work_dir / ROLE_DIGEST_DIR).exists():
                digest = ZooKeeperSecurity.read_digest_file(legacy)
            else:
                self._roles = RoleCredentials.load_or_generate(work_dir / ROLE_DIGEST_DIR)
                digest = self._roles.operator
            self._zookeeper_security = dataclasses.replace(self._zookeeper_security, digest=digest)
        if self._zookeeper_security.digest is not None and self._roles is None:
            self._zookeeper_security.write_digest_file(work_dir / LEGACY_DIGEST_FILE)

    @staticmethod
    def check_own(work_dir: Path) -> None:
        """Refuse a work directory another user could have filled or could swap: its certificates,
        keys and ZooKeeper credentials would then be ones that user holds (docs/design/storage.md,
        "File modes").

        Raises:
            ConfigurationError: the directory, an entry in it, anything under ``tls/`` or
                ``zookeeper-credentials/``, or one of its parents is not this user's own
                (:func:`waltz.private_files.replaceable_by_others` says which and why).
        """
        reason = replaceable_by_others(work_dir, within=(CERTIFICATES_DIR, ROLE_DIGEST_DIR))
        if reason is None:
            return
        raise ConfigurationError(
            f"the work directory {work_dir} is not safe to use: {reason}. Another user could have "
            "put the cluster's certificates, keys and ZooKeeper credentials there, or could "
            "replace them. Use a directory of your own that only you can write (a new one, e.g. "
            "under your home directory), or fix the owner and mode (chown, chmod go-w)"
        )

    def check_resumable(self, work_dir: Path) -> None:
        """Refuse to resume a kept cluster made without a ZooKeeper credential with one: its znodes
        are open, and the servers would refuse them (docs/design/zookeeper.md, "Security").

        Raises:
            ConfigurationError: ``zookeeper_auth`` is asked for, no credential is given, and the
                work directory holds none (the cluster was made plaintext).
        """
        if not self._options.zookeeper_auth or self._zookeeper_security.digest is not None:
            return
        if (work_dir / ROLE_DIGEST_DIR).exists() or (work_dir / LEGACY_DIGEST_FILE).exists():
            return
        raise ConfigurationError(
            f"the local cluster kept in {work_dir} was made without ZooKeeper credentials (open "
            "znodes), and this start asks for them: start it as it was made (waltz up --insecure "
            "--no-zookeeper-auth, SecurityOptions.plaintext()), or use a new work directory"
        )

    def digest_file(self, work_dir: Path | None, role: Role = Role.OPERATOR) -> Path | None:
        """The file holding a role's ZooKeeper credential (the single credential of a cluster
        made with one, whatever the role), or None without one."""
        if self._zookeeper_security.digest is None or work_dir is None:
            return None
        if self._roles is None:
            return work_dir / LEGACY_DIGEST_FILE
        return work_dir / ROLE_DIGEST_DIR / ROLE_DIGEST_FILES[role]

    def zookeeper_settings(self, work_dir: Path | None, role: Role = Role.OPERATOR) -> dict[str, Path]:
        """The settings fields of a role's credential file and the ZooKeeper TLS files that are set."""
        security = self._zookeeper_security
        settings = {
            "zookeeper_auth_digest_file": self.digest_file(work_dir, role),
            "zookeeper_ssl_ca_file": security.ca_file,
            "zookeeper_ssl_cert_file": security.cert_file,
            "zookeeper_ssl_key_file": security.key_file,
        }
        return {k: v for k, v in settings.items() if v is not None}

    def zookeeper_env(self, work_dir: Path | None, role: Role = Role.OPERATOR) -> dict[str, str]:
        """The ``WALTZ_ZOOKEEPER_*`` variables giving a process a role's credential and TLS files."""
        settings = self.zookeeper_settings(work_dir, role)
        return {env: str(settings[field]) for field, env in _ZOOKEEPER_VARIABLES.items() if field in settings}

    def describe_lines(self, exports: str, work_dir: Path | None, *, running: bool) -> list[str]:
        """The security lines of the cluster's description: the certificates, and, while the
        cluster runs, the variables that reach it with the waltz command and from applications.

        Args:
            exports: the variables naming the cluster (``WALTZ_ZOOKEEPER_CONNECT_STRING=...
                WALTZ_CLUSTER_ROOT=...``); the ZooKeeper credential's and TLS files' follow.
            work_dir: the work directory (where the credential file is), or None.
            running: whether the cluster is starting or running (else only the certificates).
        """
        files = self._certificates
        lines = []
        if files is not None:
            lines.append(
                f"  mutual TLS     CA {files.ca_file}; role certificates node, client, operator, admin "
                f"in {files.directory} (<role>.pem, <role>-key.pem)"
            )
        if not running:
            return lines
        lines += [
            "  inspect it with the waltz command, and run clients, from a shell with:",
            f"    export {exports}"
            + "".join(f" {name}={value}" for name, value in self.zookeeper_env(work_dir).items()),
        ]
        if files is not None:
            lines.append(
                f"    export WALTZ_CLUSTER_SSL_CA_FILE={files.ca_file} "
                f"WALTZ_CLUSTER_SSL_CERT_FILE={files.cert_file('operator')} "
                f"WALTZ_CLUSTER_SSL_KEY_FILE={files.key_file('operator')}"
            )
            client = " ".join(f"{k}={v}" for k, v in files.client_env().items())
            lines.append(f"    export {client}")
        # Not `waltz client validate`: its test transactions would go into the applications' log.
        waltz = _waltz_command()
        lines.append(f"    {waltz} cluster list; {waltz} cluster verify; {waltz} client check-connectivity")
        if self._roles is not None:
            lines.append(
                "  applications take the client role's ZooKeeper credential (it cannot read the "
                "cluster key); in an application's shell, after the lines above: export "
                f"WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE={self.digest_file(work_dir, Role.CLIENT)}"
            )
        return lines

    def server_env(self, env: Mapping[str, str], work_dir: Path) -> dict[str, str]:
        """The servers' environment: the ZooKeeper variables, then ``env``, then the TLS files of a
        secure cluster (mutual TLS on their ports, the node certificate for store sessions).

        A plaintext cluster's servers are told that they serve without mutual TLS on purpose
        (``WALTZ_SERVER_INSECURE``), which a node otherwise refuses (docs/operations.md, "Roles").
        """
        certificates = self._certificates.server_env() if self._certificates is not None else {}
        insecure = {} if certificates else {"WALTZ_SERVER_INSECURE": "true"}
        return {**self.zookeeper_env(work_dir, Role.SERVER), **insecure, **env, **certificates}

    def storage_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The storage nodes' environment: ``env``, then the TLS files of a secure cluster
        (``WALTZ_STORAGE_INSECURE`` on a plaintext cluster, as for :meth:`server_env`)."""
        certificates = self._certificates.storage_env() if self._certificates is not None else {}
        insecure = {} if certificates else {"WALTZ_STORAGE_INSECURE": "true"}
        return {**insecure, **env, **certificates}


def _waltz_command() -> str:
    """How a shell runs this installation's ``waltz`` command: ``waltz`` when the PATH finds the
    script beside this interpreter, else that script's path (``.../.venv/bin/waltz``: a virtual
    environment not activated, or another installation's ``waltz`` first on the PATH)."""
    beside = Path(sys.executable).parent / "waltz"
    found = shutil.which("waltz")
    if not beside.exists():
        return "waltz"
    if found is not None:
        with contextlib.suppress(OSError):
            if os.path.samefile(found, beside):
                return "waltz"
    return str(beside)
