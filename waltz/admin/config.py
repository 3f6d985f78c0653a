"""Settings of the cluster tool (``waltz cluster``): a YAML file plus ``WALTZ_*`` environment variables.

Keys (YAML, flat or nested), their environment variables, and defaults:

- ``zookeeper.connectString`` (``WALTZ_ZOOKEEPER_CONNECT_STRING``, required): ZooKeeper
  ``host:port[,host:port...][/chroot]``.
- ``zookeeper.connectTimeout`` (``WALTZ_ZOOKEEPER_CONNECT_TIMEOUT``, 10): seconds to wait for it.
- ``zookeeper.sessionTimeout`` (``WALTZ_ZOOKEEPER_SESSION_TIMEOUT``, 10): session timeout, seconds.
- ``cluster.root`` (``WALTZ_CLUSTER_ROOT``, required): the cluster root znode.
- ``cluster.storageTimeout`` (``WALTZ_CLUSTER_STORAGE_TIMEOUT``, 10): seconds per storage node call.
- ``cluster.ssl.caFile``, ``cluster.ssl.certFile``, ``cluster.ssl.keyFile``
  (``WALTZ_CLUSTER_SSL_CA_FILE``, ...; unset): TLS to the storage nodes' admin ports.
- ``zookeeper.auth.digestFile``, ``zookeeper.auth.digest``, ``zookeeper.ssl.*``: the cluster's
  ZooKeeper credential and TLS (:class:`~waltz.metadata.zk_security.ZooKeeperSettings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from waltz.config import WaltzSettings
from waltz.errors import ConfigurationError
from waltz.metadata.zk_security import ZOOKEEPER_SECURITY_KEYS, ZooKeeperSettings
from waltz.protocol.channels import CLUSTER_TLS_SETTINGS, TlsConfig

__all__ = ["ClusterAdminConfig"]


class ClusterAdminConfig(WaltzSettings, ZooKeeperSettings):
    """Settings of ``waltz cluster``: where ZooKeeper and the cluster root are, and time limits."""

    model_config = SettingsConfigDict(env_prefix="WALTZ_", extra="forbid")
    ENV_GROUPS: ClassVar[tuple[str, ...]] = ("WALTZ_CLUSTER_",)

    KEYS: ClassVar[dict[str, str]] = {
        "zookeeper.connectString": "zookeeper_connect_string",
        "zookeeper.connectTimeout": "zookeeper_connect_timeout",
        "zookeeper.sessionTimeout": "zookeeper_session_timeout",
        **ZOOKEEPER_SECURITY_KEYS,
        "cluster.root": "cluster_root",
        "cluster.storageTimeout": "cluster_storage_timeout",
        "cluster.ssl.caFile": "cluster_ssl_ca_file",
        "cluster.ssl.certFile": "cluster_ssl_cert_file",
        "cluster.ssl.keyFile": "cluster_ssl_key_file",
    }

    zookeeper_connect_string: str | None = Field(
        None, description="ZooKeeper connect string, host:port[,host:port...][/chroot]."
    )
    zookeeper_connect_timeout: float = Field(10.0, gt=0, description="Seconds to wait for ZooKeeper.")
    zookeeper_session_timeout: float = Field(10.0, gt=0, description="ZooKeeper session timeout, seconds.")
    cluster_root: str | None = Field(None, description="The cluster root znode, e.g. /waltz/cluster1.")
    cluster_storage_timeout: float = Field(
        10.0, gt=0, description="Seconds for each call to a storage node's admin port."
    )
    cluster_ssl_ca_file: Path | None = Field(None, description="PEM CA bundle verifying storage nodes.")
    cluster_ssl_cert_file: Path | None = Field(None, description="PEM client certificate chain.")
    cluster_ssl_key_file: Path | None = Field(None, description="PEM private key of the client certificate.")

    @model_validator(mode="after")
    def _check(self) -> ClusterAdminConfig:
        if (self.cluster_ssl_cert_file is None) != (self.cluster_ssl_key_file is None):
            raise ValueError("cluster.ssl.certFile and cluster.ssl.keyFile must be set together")
        return self

    def require(self) -> tuple[str, str]:
        """Return ``(ZooKeeper connect string, cluster root)``.

        Raises:
            ConfigurationError: one of them is not set, saying the three ways to set it.
        """
        connect_string, root = self.zookeeper_connect_string, self.cluster_root
        if connect_string and root:
            return connect_string, root
        missing = []
        if not connect_string:
            missing.append(
                "the ZooKeeper connect string (--zookeeper, WALTZ_ZOOKEEPER_CONNECT_STRING, "
                "or zookeeper.connectString in --config)"
            )
        if not root:
            missing.append("the cluster root (--root, WALTZ_CLUSTER_ROOT, or cluster.root in --config)")
        raise ConfigurationError("missing " + " and ".join(missing))

    def tls(self) -> TlsConfig | None:
        """Client TLS files for the storage admin ports, or None for plaintext.

        Raises:
            TlsFilesError: a file is missing, not PEM, or a key that is not the certificate's
                (:meth:`~waltz.protocol.channels.TlsConfig.check_files`): checked before any node
                is tried (docs/operations.md, "Certificates").
        """
        if self.cluster_ssl_ca_file is None and self.cluster_ssl_cert_file is None:
            return None
        tls = TlsConfig(self.cluster_ssl_ca_file, self.cluster_ssl_cert_file, self.cluster_ssl_key_file)
        tls.check_files(CLUSTER_TLS_SETTINGS)
        return tls
