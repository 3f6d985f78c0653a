"""ZooKeeper security of a cluster: digest authentication, creator-only ACLs, optional TLS.

Every kazoo session opened for a cluster (servers, ``waltz cluster``, clients, the local harness)
is made by :func:`waltz.metadata.zk_session.make_kazoo_client` from a :class:`ZooKeeperSecurity`.
With a digest credential the session authenticates (``auth_data``) and
every znode it creates gets an ACL granting all rights to that credential alone (``default_acl``);
in a cluster made with credentials per role, :meth:`waltz.metadata.zk.ClusterZk.check_security`
replaces that default with the session's role's ACL (:mod:`waltz.metadata.zk_roles`). With a CA
file the session speaks TLS to ZooKeeper's secure client port.

The settings (``zookeeper.auth.*`` and ``zookeeper.ssl.*``, from the YAML file or the
environment) are shared by every settings class through :class:`ZooKeeperSettings`; see
``docs/configuration.md``. Design: docs/design/zookeeper.md, "Security".
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from kazoo.security import ACL, make_digest_acl
from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from waltz.errors import ConfigurationError
from waltz.private_files import write_private

__all__ = [
    "DIGEST_SETTINGS_HINT",
    "ZOOKEEPER_SECURITY_KEYS",
    "ZooKeeperSecurity",
    "ZooKeeperSettings",
    "security_from_environment",
]

#: Where a digest credential is configured, for error messages.
DIGEST_SETTINGS_HINT = (
    "zookeeper.auth.digestFile or zookeeper.auth.digest in the configuration file, or "
    "WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE or WALTZ_ZOOKEEPER_AUTH_DIGEST in the environment"
)

#: The dotted configuration keys of :class:`ZooKeeperSettings` and their field names.
ZOOKEEPER_SECURITY_KEYS: dict[str, str] = {
    "zookeeper.auth.digest": "zookeeper_auth_digest",
    "zookeeper.auth.digestFile": "zookeeper_auth_digest_file",
    "zookeeper.ssl.caFile": "zookeeper_ssl_ca_file",
    "zookeeper.ssl.certFile": "zookeeper_ssl_cert_file",
    "zookeeper.ssl.keyFile": "zookeeper_ssl_key_file",
}


@dataclass(frozen=True, slots=True)
class ZooKeeperSecurity:
    """How a kazoo session of a cluster authenticates, protects what it creates, and connects.

    Args:
        digest: ``user:password`` of ZooKeeper's digest scheme, or None for no authentication
            (znodes are then created open to everyone, as ZooKeeper does by default).
        ca_file: PEM CA bundle verifying ZooKeeper's certificate; set, the session uses TLS.
        cert_file: PEM client certificate (ZooKeeper's secure port asks for one by default).
        key_file: PEM private key of ``cert_file``.

    Raises:
        ConfigurationError: the digest is not ``user:password``, or the TLS files do not fit
            together (certificate without key, or a certificate without a CA file).
    """

    digest: str | None = field(default=None, repr=False)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if self.digest is not None:
            user, colon, password = self.digest.partition(":")
            if not colon or not user or not password or any(c.isspace() for c in user):
                raise ConfigurationError(
                    "the ZooKeeper digest credential must be user:password with a non-empty user "
                    f"(no spaces) and password; check {DIGEST_SETTINGS_HINT}"
                )
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigurationError("zookeeper.ssl.certFile and zookeeper.ssl.keyFile must be set together")
        if self.cert_file is not None and self.ca_file is None:
            raise ConfigurationError(
                "zookeeper.ssl.certFile needs zookeeper.ssl.caFile "
                "(TLS to ZooKeeper is on when the CA is set)"
            )

    @classmethod
    def generate(cls, user: str = "waltz") -> Self:
        """A new digest credential with a random 192-bit password (for a local cluster)."""
        return cls(digest=f"{user}:{secrets.token_urlsafe(24)}")

    @classmethod
    def read_digest_file(cls, path: Path) -> str:
        """The ``user:password`` held by a file (surrounding whitespace ignored).

        Raises:
            ConfigurationError: the file cannot be read.
        """
        try:
            return path.read_text(encoding="utf-8").strip()
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read the ZooKeeper digest file {path}: {exc}") from exc

    def write_digest_file(self, path: Path) -> None:
        """Write the digest credential to ``path``, readable by its owner only (mode 0600).

        Raises:
            ValueError: this security has no digest credential.
        """
        if self.digest is None:
            raise ValueError("no digest credential to write")
        write_private(path, self.digest + "\n")  # narrowed before the secret is written

    @property
    def user(self) -> str | None:
        """The digest user, or None without authentication."""
        return self.digest.partition(":")[0] if self.digest is not None else None

    @property
    def tls(self) -> bool:
        """Whether the session speaks TLS to ZooKeeper."""
        return self.ca_file is not None

    def acl(self) -> list[ACL] | None:
        """The ACL every znode of the cluster gets: all rights to the digest credential alone.

        Returns:
            One ``digest`` ACL entry, or None without a credential (ZooKeeper's open ACL).
        """
        if self.digest is None:
            return None
        user, _, password = self.digest.partition(":")
        return [make_digest_acl(user, password, all=True)]

    def kazoo_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`kazoo.client.KazooClient` for this security.

        ``auth_data`` and ``default_acl`` for the credential; ``use_ssl``, ``ca``, ``certfile`` and
        ``keyfile`` for TLS (kazoo verifies ZooKeeper's certificate chain against the CA file and
        does not check its host name).
        """
        options: dict[str, Any] = {}
        if self.digest is not None:
            options["auth_data"] = [("digest", self.digest)]
            options["default_acl"] = self.acl()
        if self.ca_file is not None:
            options.update(use_ssl=True, verify_certs=True, ca=str(self.ca_file))
            if self.cert_file is not None and self.key_file is not None:
                options.update(certfile=str(self.cert_file), keyfile=str(self.key_file))
        return options

    def describe(self) -> str:
        """A line for people: the user and TLS, never the password."""
        auth = f"digest user {self.user!r}" if self.user is not None else "no authentication"
        return f"{auth}, {'TLS' if self.tls else 'plaintext'}"


class ZooKeeperSettings(BaseSettings):
    """The ``zookeeper.auth.*`` and ``zookeeper.ssl.*`` settings every ZooKeeper user shares.

    A mixin of the settings classes (``class ServerConfig(WaltzSettings, ZooKeeperSettings)``,
    :class:`waltz.config.WaltzSettings` first, so that its file source applies), each adding
    :data:`ZOOKEEPER_SECURITY_KEYS` to its ``KEYS``. The digest credential comes
    from ``zookeeper.auth.digestFile`` (a file holding ``user:password``, better kept out of the
    configuration file) or ``zookeeper.auth.digest``; setting both is an error.
    """

    zookeeper_auth_digest: SecretStr | None = Field(
        default=None,
        description="ZooKeeper digest credential user:password (prefer zookeeper.auth.digestFile).",
    )
    zookeeper_auth_digest_file: Path | None = Field(
        default=None, description="File holding the ZooKeeper digest credential user:password."
    )
    zookeeper_ssl_ca_file: Path | None = Field(
        default=None, description="PEM CA bundle verifying ZooKeeper; set, the session uses TLS."
    )
    zookeeper_ssl_cert_file: Path | None = Field(
        default=None, description="PEM client certificate for ZooKeeper."
    )
    zookeeper_ssl_key_file: Path | None = Field(
        default=None, description="PEM private key of the certificate."
    )

    @model_validator(mode="after")
    def _check_zookeeper_security(self) -> Self:
        if self.zookeeper_auth_digest is not None and self.zookeeper_auth_digest_file is not None:
            raise ValueError("set zookeeper.auth.digest or zookeeper.auth.digestFile, not both")
        if (self.zookeeper_ssl_cert_file is None) != (self.zookeeper_ssl_key_file is None):
            raise ValueError("zookeeper.ssl.certFile and zookeeper.ssl.keyFile must be set together")
        return self

    def zookeeper_security(self) -> ZooKeeperSecurity:
        """The security of this configuration's ZooKeeper sessions.

        Raises:
            ConfigurationError: the digest file cannot be read, or a value is malformed.
        """
        digest = None
        if self.zookeeper_auth_digest is not None:
            digest = self.zookeeper_auth_digest.get_secret_value()
        elif self.zookeeper_auth_digest_file is not None:
            digest = ZooKeeperSecurity.read_digest_file(self.zookeeper_auth_digest_file)
        return ZooKeeperSecurity(
            digest=digest,
            ca_file=self.zookeeper_ssl_ca_file,
            cert_file=self.zookeeper_ssl_cert_file,
            key_file=self.zookeeper_ssl_key_file,
        )


class _ZooKeeperEnvironment(ZooKeeperSettings):
    model_config = SettingsConfigDict(env_prefix="WALTZ_", extra="ignore")


def security_from_environment() -> ZooKeeperSecurity:
    """The ZooKeeper security the ``WALTZ_ZOOKEEPER_AUTH_*`` and ``WALTZ_ZOOKEEPER_SSL_*``
    variables give (for readers with no settings object of their own, such as the Spark source).

    Raises:
        ConfigurationError: a value is malformed, or the digest file cannot be read.
    """
    from pydantic import ValidationError

    try:
        settings = _ZooKeeperEnvironment()
    except ValidationError as exc:
        raise ConfigurationError(f"invalid WALTZ_ZOOKEEPER_* environment:\n{exc}") from exc
    return settings.zookeeper_security()


#: The settings fields naming ZooKeeper security files (a credential file, TLS files).
ZOOKEEPER_SECURITY_FILE_FIELDS = (
    "zookeeper_auth_digest_file",
    "zookeeper_ssl_ca_file",
    "zookeeper_ssl_cert_file",
    "zookeeper_ssl_key_file",
)


def security_from_files(files: Mapping[str, str | Path]) -> ZooKeeperSecurity:
    """The ZooKeeper security of the files ``files`` names by settings field
    (:data:`ZOOKEEPER_SECURITY_FILE_FIELDS`), the ``WALTZ_ZOOKEEPER_*`` variables giving the rest
    (for readers whose settings travel as strings, such as the Spark source's options).

    Raises:
        ConfigurationError: an unknown field, a malformed value, or an unreadable digest file.
    """
    from pydantic import ValidationError

    unknown = sorted(set(files) - set(ZOOKEEPER_SECURITY_FILE_FIELDS))
    if unknown:
        raise ConfigurationError(
            f"unknown ZooKeeper security files {unknown}; expected {list(ZOOKEEPER_SECURITY_FILE_FIELDS)}"
        )
    try:
        given: dict[str, Any] = {k: Path(v) for k, v in files.items() if v}
        settings = _ZooKeeperEnvironment(**given)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid ZooKeeper security files:\n{exc}") from exc
    return settings.zookeeper_security()


def security_files_from_environment() -> dict[str, Path]:
    """The ZooKeeper security files the ``WALTZ_ZOOKEEPER_*`` variables name, by settings field
    (:data:`ZOOKEEPER_SECURITY_FILE_FIELDS`), for handing on to processes that do not share this
    one's environment (Spark's Python workers).

    Raises:
        ConfigurationError: a value is malformed.
    """
    from pydantic import ValidationError

    try:
        settings = _ZooKeeperEnvironment()
    except ValidationError as exc:
        raise ConfigurationError(f"invalid WALTZ_ZOOKEEPER_* environment:\n{exc}") from exc
    files = {name: getattr(settings, name) for name in ZOOKEEPER_SECURITY_FILE_FIELDS}
    return {name: path for name, path in files.items() if path is not None}
