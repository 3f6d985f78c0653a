"""The admin role a tool's certificate must name before the tool changes the cluster.

Design: docs/design/overview.md "Roles". Operators and admins hold the same ZooKeeper credential
(the operators'), so ZooKeeper cannot tell them apart: only the certificate a tool presents to the
nodes over mutual TLS says which role its holder has. A tool that changes the cluster in
ZooKeeper as well as on the nodes checks that certificate itself, before its first write, rather
than leaving the refusal to a node it reaches after ZooKeeper has changed.
"""

from __future__ import annotations

from waltz.errors import WaltzError
from waltz.protocol.channels import TlsConfig
from waltz.protocol.roles import Role, role_uri, roles_of_certificate

__all__ = ["AdminRoleRequiredError", "missing_admin_role", "require_admin_role"]


class AdminRoleRequiredError(WaltzError, PermissionError):
    """The caller's certificate does not name the admin role that a change needs; nothing was
    written (docs/design/overview.md "Roles")."""


def missing_admin_role(tls: TlsConfig | None) -> str | None:
    """What the caller's certificate lacks to change the cluster, or None when nothing does.

    Args:
        tls: the caller's TLS files for the nodes' admin ports (``cluster.ssl.*``), or None.

    Returns:
        None when ``tls`` presents no certificate (the nodes then have no client certificates to
        check, and let the change through as they do) or one naming the admin role; else the
        words "a certificate with the role urn:waltz:role:admin (cluster.ssl.certFile FILE; this
        certificate's roles: ROLES)" for the caller's message.

    Raises:
        OSError, ValueError: the certificate file cannot be read, or is not PEM.
    """
    if tls is None or tls.cert_file is None:
        return None
    held = roles_of_certificate(tls.cert_file.read_bytes())
    if Role.ADMIN in held:
        return None
    names = ", ".join(sorted(role.value for role in held)) or "none"
    return (
        f"a certificate with the role {role_uri(Role.ADMIN)} "
        f"(cluster.ssl.certFile {tls.cert_file}; this certificate's roles: {names})"
    )


def require_admin_role(tls: TlsConfig | None, action: str) -> None:
    """Refuse ``action`` before anything is written when the certificate lacks the admin role.

    Args:
        tls: as :func:`missing_admin_role`.
        action: what is refused, for the message ("unassigning a replica").

    Raises:
        AdminRoleRequiredError: the certificate does not name the admin role.
        OSError, ValueError: the certificate file cannot be read, or is not PEM.
    """
    needed = missing_admin_role(tls)
    if needed is not None:
        raise AdminRoleRequiredError(f"{action} needs {needed}. Nothing was written")
