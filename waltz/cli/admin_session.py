"""The connection every command over the admin tools opens: ``waltz cluster``, ``waltz server``
and ``waltz storage``.

:func:`connected_admin` loads the settings (``--config``, ``WALTZ_*`` variables, the options),
connects a :class:`~waltz.admin.cluster_admin.ClusterAdmin` and turns its errors into messages and
the exit codes the commands document: 1 a safety rule or a storage node refused; 2 the command
could not run (configuration, ZooKeeper, no cluster under the root).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kazoo.exceptions import KazooException

from waltz.admin.admin_role import AdminRoleRequiredError
from waltz.admin.cluster_admin import ClusterAdmin
from waltz.admin.config import ClusterAdminConfig
from waltz.cli.output import fail
from waltz.config import load_settings
from waltz.errors import ExpiredCertificateError, StorageRpcError, WaltzError
from waltz.metadata.replicas import ReplicaChangeRefusedError
from waltz.protocol.certificates import refuse_expired_certificates as refuse_expired

__all__ = ["connected_admin"]


def refuse_expired_certificates(files: Mapping[str, Path | None], peers: str, holder: str) -> None:
    """Exit 2 before connecting when a certificate a command presents has expired, naming the
    setting, the file and the date (its peers would close the connection, saying nothing of it).

    Args:
        files: the setting (``cluster.ssl.certFile``) -> its PEM file, or None.
        peers: who refuses it, for the message (``the nodes and ZooKeeper``).
        holder: who should get a current one (``this tool``).
    """
    try:
        refuse_expired(files, peers=peers, holder=holder)
    except ExpiredCertificateError as exc:
        raise fail(str(exc), 2) from exc


@contextmanager
def connected_admin(
    config: Path | None,
    zookeeper: str | None,
    root: str | None,
    timeout: float | None,
    *,
    check_acls: bool = True,
) -> Iterator[ClusterAdmin]:
    """Load the settings, connect to ZooKeeper, and turn errors into messages and exit codes.

    Args:
        config: a YAML file with ``zookeeper.*`` and ``cluster.*`` keys, or None.
        zookeeper: the ZooKeeper connect string, over the file's and the environment's.
        root: the cluster root znode, over the file's and the environment's.
        timeout: seconds to wait for ZooKeeper and for each node, or None for the settings'.
        check_acls: refuse a cluster whose root or a child lets in anyone or an unknown
            identity (docs/design/zookeeper.md, "Checking the root"); False for the commands
            that inspect or repair one (``verify``, ``secure``, ``delete``).

    Yields:
        The connected cluster admin, closed when the block ends.

    Raises:
        typer.Exit: 1 when a replica change safety rule, a storage node or the certificate's role
            (:class:`~waltz.admin.admin_role.AdminRoleRequiredError`) refused; 2 when the
            settings are incomplete, ZooKeeper failed, or another Waltz error stopped the command
            (the message is printed first).
    """
    try:
        settings = load_settings(
            ClusterAdminConfig,
            config,
            zookeeper_connect_string=zookeeper,
            cluster_root=root,
            zookeeper_connect_timeout=timeout,
            cluster_storage_timeout=timeout,
        )
        connect_string, cluster_root = settings.require()
        refuse_expired_certificates(
            {
                "cluster.ssl.certFile": settings.cluster_ssl_cert_file,
                "zookeeper.ssl.certFile": settings.zookeeper_ssl_cert_file,
            },
            "the nodes and ZooKeeper",
            "this tool",
        )
        admin = ClusterAdmin.connect(
            connect_string,
            cluster_root,
            connect_timeout=settings.zookeeper_connect_timeout,
            session_timeout=settings.zookeeper_session_timeout,
            storage_timeout=settings.cluster_storage_timeout,
            tls=settings.tls(),
            security=settings.zookeeper_security(),
            check_acls=check_acls,
        )
    except WaltzError as exc:
        raise fail(str(exc), 2) from exc
    try:
        with admin:
            yield admin
    except (ReplicaChangeRefusedError, StorageRpcError, AdminRoleRequiredError) as exc:
        raise fail(str(exc), 1) from exc
    except WaltzError as exc:
        raise fail(str(exc), 2) from exc
    except KazooException as exc:
        raise fail(f"ZooKeeper failed the request: {exc!r}", 2) from exc
