"""Who may do what with a cluster's znodes: the root check on start, and protecting a cluster.

Design: docs/design/zookeeper.md, "Security", "Roles", "Checking the root". :class:`ClusterAccess`
reads the cluster's role identities (``<root>/roles``), checks the ACLs of the root and its
children before a process uses the cluster (:meth:`ClusterAccess.check_security`) or creates one
(:meth:`ClusterAccess.check_root`), and sets every znode's ACL (:meth:`ClusterAccess.secure`,
``waltz cluster secure``). The role table itself is :mod:`waltz.metadata.zk_roles`.
"""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.security import Permissions

from waltz.errors import ClusterNotFoundError, MetadataError
from waltz.metadata.missing_cluster import missing_cluster_message
from waltz.metadata.paths import ClusterPaths
from waltz.metadata.values import NO_PREFERRED_PARTITIONS, ClusterParams, DiscoveryParams
from waltz.metadata.zk_roles import (
    KNOWN_CHILDREN,
    ROLE_DIGEST_FILES,
    AclProblem,
    ClusterRoles,
    Role,
    ZnodeAclError,
    describe_acl,
    grants_for,
    session_identities,
)
from waltz.metadata.zk_session import ZooKeeperAuthError, auth_error, get_within, zookeeper_access

__all__ = ["ClusterAccess", "digest_user"]

log = logging.getLogger(__name__)


def digest_user(identity: str) -> str:
    """The user of a digest identity: ZooKeeper shows ``user:x`` in ACLs, hiding the hash."""
    return identity.partition(":")[0]


class ClusterAccess:
    """The ACLs of one cluster's znodes, through a session.

    Args:
        zk: a started kazoo client (the caller owns it).
        paths: the cluster's znodes.
        timeout: seconds a read waits for ZooKeeper's answer; None waits as long as kazoo does.
    """

    def __init__(self, zk: KazooClient, paths: ClusterPaths, *, timeout: float | None = None) -> None:
        self.zk = zk
        self.paths = paths
        self.timeout = timeout

    def _get(self, path: str) -> tuple[bytes, ZnodeStat]:
        return get_within(self.zk, path, self.timeout)

    def check_root(self, roles: ClusterRoles | None = None) -> None:
        """Before creating a cluster: refuse a root that holds znodes and lets in anyone or an
        identity that is not the session's, nor one of ``roles`` (a squatter's root,
        docs/design/zookeeper.md, "Checking the root"). A session without a credential makes an
        open cluster and checks nothing.

        Raises:
            ZnodeAclError: the root or a child lets in anyone or an unknown identity (also when
                the root holds no cluster but znodes no cluster makes: the message then says to
                choose a root of its own, never to delete this one).
        """
        own = session_identities(self.zk)
        if own:
            if roles is None:
                roles = self._own_roles(own)
            known = roles.all() if roles is not None else own
            problems = self.acl_problems(known)
            unknown = self.unknown_children()
            if problems and unknown and self.zk.exists(self.paths.cluster) is None:
                raise ZnodeAclError(
                    f"refusing creating a cluster under {self.paths.root}: it holds {', '.join(unknown)}, "
                    "which no cluster makes, with ACLs that are not this session's (other clusters' roots, "
                    "or another application's znodes): give the cluster a root of its own, such as "
                    f"{self.paths.root}/<name>; nothing was changed"
                )
            self._refuse(problems, "creating the cluster")

    def _own_roles(self, own: set[str]) -> ClusterRoles | None:
        """The identities of ``<root>/roles`` when the session is one of them: a cluster made with
        roles exists under the root, and a second ``create`` is told so ("already exists")
        rather than taking the cluster's own server and client identities for a squatter's."""
        try:
            roles = self.roles()
        except (ZooKeeperAuthError, MetadataError):
            return None
        return roles if roles is not None and roles.role_of(own) is not None else None

    def roles(self) -> ClusterRoles | None:
        """The identities of ``<root>/roles``, or None (a cluster made with a single credential).

        Raises:
            ZooKeeperAuthError: the session may not read it.
            MetadataError: the znode does not decode.
        """
        try:
            with zookeeper_access(self.zk, f"reading {self.paths.roles}"):
                data, _ = self._get(self.paths.roles)
        except NoNodeError:
            return None
        return ClusterRoles.decode(data, self.paths.roles)

    def acl_problems(
        self, known: set[str] | None, *, role: Role | None = None, empty_root_ok: bool = True
    ) -> list[AclProblem]:
        """The root and its children whose ACL lets in anyone, or (``known`` given) an identity
        that is not one of ``known`` (docs/design/zookeeper.md, "Checking the root").

        Args:
            known: the digest identities (``user:hash``) the cluster's ACLs may name; None: only
                entries open to anyone are problems. ZooKeeper shows a digest entry as
                ``user:x``, so entries compare by user; a squatter's entry naming a known user
                with another password still cannot let in the real credential, whose hash it
                cannot see, so the session's read of such a znode fails (a problem when its role
                may read it).
            role: the session's role in a cluster made with roles: a znode it may not read (nor
                see the ACL of: ZooKeeper shows an ACL only to READ or ADMIN) is a problem only
                when its role table grants the role READ. None: every znode must be visible
                (a single credential's session), or none need be (``known`` None).
            empty_root_ok: a root holding nothing is no problem (creating a cluster takes it over).

        Returns:
            One problem per offending znode; empty when the root does not exist.
        """
        try:
            children = sorted(self.zk.get_children(self.paths.root))
        except NoNodeError:
            return []
        except NoAuthError:
            children = []  # listing refused: the root itself is checked below
        if not children and empty_root_ok:
            return []
        problems = []
        for path in [self.paths.root, *(f"{self.paths.root}/{child}" for child in children)]:
            try:
                acls, _ = self.zk.get_acls(path)
            except NoNodeError:
                continue
            except NoAuthError:
                relative = self.paths.relative(path)
                readable = role is None or bool(grants_for(relative).get(role, 0) & Permissions.READ)
                if known is not None and readable:
                    problems.append(AclProblem(path, "refuses this session although its role may read it"))
                continue
            bad = [
                entry
                for entry in acls
                if entry.id.scheme != "digest"
                or (known is not None and digest_user(entry.id.id) not in {digest_user(k) for k in known})
            ]
            if bad:
                why = (
                    "open to anyone"
                    if any(entry.id.scheme == "world" for entry in bad)
                    else "granted to an identity that is none of the cluster's"
                )
                problems.append(AclProblem(path, f"{why}: {', '.join(describe_acl(entry) for entry in bad)}"))
        return problems

    def unknown_children(self) -> list[str]:
        """The root's children that no cluster of this version makes (a squatter's, or a wrong root)."""
        try:
            return sorted(set(self.zk.get_children(self.paths.root)) - KNOWN_CHILDREN)
        except NoNodeError:
            return []

    def check_root_creatable(self) -> None:
        """Before writing anything else for a new cluster (a restore's storage nodes): refuse when
        the ACLs show this session may not create the root (docs/design/zookeeper.md, "Security").

        The znode checked is the root when it exists (its children are created), else its nearest
        existing parent (the root, or a missing parent, is created in it). The session may create
        there when an entry grants ``CREATE`` to anyone or to one of its digest identities; an
        entry of another scheme (``ip``, ``x509``, ``sasl``) is left to ZooKeeper to judge, so the
        create itself may still be refused. Reads only.

        Raises:
            ZooKeeperAuthError: no entry lets this session create there (the message names the
                znode and the setting of the credential).
        """
        own = session_identities(self.zk)
        path = self.paths.root
        with zookeeper_access(self.zk, f"reading {path} and its parents"):
            while path and self.zk.exists(path) is None:
                path = path.rsplit("/", 1)[0]
            acl, _ = self.zk.get_acls(path or "/")
        for entry in acl:
            if not entry.perms & Permissions.CREATE:
                continue
            scheme = entry.id.scheme
            if scheme == "world" or scheme not in ("digest", "auth") or entry.id.id in own:
                return
        raise auth_error(
            self.zk, f"creating {self.paths.root} (the ACL of {path or '/'} grants no CREATE to this session)"
        )

    def check_security(self, expected: Role | None = None) -> ClusterRoles | None:
        """Check the root's and its children's ACLs before using the cluster; adopt the role's ACL.

        Every server, admin tool and client calls this on start (docs/design/zookeeper.md,
        "Checking the root"). A session without a credential only logs a warning when the
        cluster is open (a cluster made without credentials is open by choice). A session with
        one refuses a root or child znode open to anyone or to an identity that is none of the
        cluster's (``<root>/roles``, or the session's own in a cluster made with one credential).
        In a cluster made with roles, the session's default ACL becomes its role's, so that the
        znodes it creates get the role table's ACL; so a process that runs as one role (a
        server) passes it as ``expected`` and is refused with another role's credential (a
        server holding the operator's would create the election and the assignment with the
        operators' ACL, and the servers started with their own credential could not use them).

        Args:
            expected: the role the session must hold in a cluster made with roles (None: any).

        Returns:
            The cluster's role identities, or None (no credential, no cluster, or a cluster made
            with a single credential).

        Raises:
            ZnodeAclError: a root or child znode lets in anyone or an unknown identity.
            ZooKeeperAuthError: the session's credential is none of the cluster's, or another
                role's than ``expected``.
            ClusterNotFoundError: the root holds no cluster and its znodes are not the session's
                (a wrong root, such as the parent of several clusters: the error names them).
        """
        own = session_identities(self.zk)
        if not own:
            open_znodes = self.acl_problems(None)
            if open_znodes:
                log.warning(
                    "the ZooKeeper session has no credential and the cluster under %s is open to "
                    "anyone (%s): anyone reaching ZooKeeper can read its cluster key and rewrite its "
                    'metadata; see docs/deploy.md, "ZooKeeper credentials"',
                    self.paths.root,
                    open_znodes[0].detail,
                )
            return None
        roles = self.roles()
        role: Role | None = None
        if roles is None:
            if self.zk.exists(self.paths.cluster) is not None:
                with zookeeper_access(self.zk, f"reading {self.paths.cluster}"):
                    self._get(self.paths.cluster)  # a wrong credential shows as NoAuth here
            known = own
        else:
            role = roles.role_of(own)
            if role is None:
                what = f"the session's credential: it is none of the roles in {self.paths.roles}"
                raise auth_error(self.zk, what)
            if expected is not None and role is not expected:
                raise ZooKeeperAuthError(
                    f"this process runs as the {expected.value} role but its ZooKeeper credential is the "
                    f"{role.value}'s ({self.paths.roles}): the znodes it makes would get the {role.value}s' "
                    f"ACL, which other {expected.value}s cannot use; give it the {expected.value}'s digest "
                    f"file ({ROLE_DIGEST_FILES[expected]} of the cluster's --digest-dir) in "
                    "zookeeper.auth.digestFile or WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE"
                )
            known = roles.all()
        problems = self.acl_problems(known, role=role)
        if problems and self.zk.exists(self.paths.cluster) is None:
            # Not a cluster's root (a typo, or the parent of several clusters): say so, never
            # "delete the root", which would wipe whatever is there.
            raise ClusterNotFoundError(missing_cluster_message(self.zk, self.paths))
        self._refuse(problems, "using the cluster")
        if roles is not None and role is not None:
            self.zk.default_acl = roles.default_acl(role)
        return roles

    def _refuse(self, problems: list[AclProblem], doing: str) -> None:
        if not problems:
            return
        lines = "\n".join(f"  {problem.path}: {problem.detail}" for problem in problems)
        raise ZnodeAclError(
            f"refusing {doing} under {self.paths.root}: its znodes let in someone the cluster does "
            f"not know, so their values (the cluster key, the partition count) may be anyone's:\n"
            f"{lines}\n"
            "If nobody else should have made them, treat the cluster's metadata as tampered with: "
            "delete the root (zkCli.sh deleteall), create the cluster again with a credential "
            "(waltz cluster create --digest-dir), and give every storage node a fresh directory. "
            "A cluster made without a credential on purpose is protected with `waltz cluster secure`."
        )

    def secure(self, roles: ClusterRoles | None = None) -> int:
        """Give every znode of the cluster its ACL (an existing cluster made without one, or with a
        single credential, moving to per-role credentials).

        Walks the root and everything below it, ephemeral member znodes included, setting the ACL
        of the session's digest credential, or with ``roles`` the ACL of the role table
        (docs/design/zookeeper.md, "Security"); with ``roles`` it also writes ``<root>/roles``,
        ``<root>/discovery``, the ``client/id`` counter and ``client/ids`` (clients' IDs follow
        the counter's last) when missing. A cluster made with
        roles keeps its role table when ``roles`` is not given. Idempotent; znodes deleted during
        the walk are skipped.

        Returns:
            The number of znodes whose ACL was set.

        Raises:
            MetadataError: the session has no digest credential (nothing to apply), or does not
                hold the operator's credential of ``roles``.
            ClusterNotFoundError: no cluster exists under the root.
            ZooKeeperAuthError: a znode is protected by another credential.
        """
        default = self.zk.default_acl
        if roles is None and session_identities(self.zk):
            roles = self.roles()  # a cluster made with roles keeps them
        if roles is None and not default:
            raise MetadataError(
                "no digest credential is configured: set the one the cluster should be protected "
                "with (zookeeper.auth.digestFile or WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE), then run this again"
            )
        if roles is not None and roles.operator not in session_identities(self.zk):
            raise MetadataError("securing a cluster with role credentials needs the operator's credential")
        if self.zk.exists(self.paths.cluster) is None:
            raise ClusterNotFoundError(missing_cluster_message(self.zk, self.paths))
        count = 0
        pending = [self.paths.root]
        with zookeeper_access(self.zk, f"setting the ACLs under {self.paths.root}"):
            if roles is not None:
                self._add_role_znodes(roles)
            while pending:
                path = pending.pop()
                acl = roles.acl_for(self.paths.relative(path)) if roles is not None else default
                try:
                    children = self.zk.get_children(path)
                    self.zk.set_acls(path, acl)
                except NoNodeError:
                    continue
                count += 1
                pending.extend(f"{path}/{child}" for child in children)
        if roles is not None:
            self.zk.default_acl = roles.default_acl(Role.OPERATOR)
        log.info("set the ACL of %d znodes under %s", count, self.paths.root)
        return count

    def _counted_client_ids(self) -> int:
        """The last client ID the ``client/id`` counter handed out (0: none): the IDs taken under
        ``client/ids`` come after it."""
        try:
            data, _ = self._get(self.paths.client_id)
        except NoNodeError:
            return 0
        text = data.decode("ascii", "replace").strip()
        if not text:
            return 0
        try:
            return int(text)
        except ValueError:
            raise MetadataError(
                f"{self.paths.client_id} holds {text!r}, not a client ID counter: set it to the last "
                "client ID handed out before securing the cluster"
            ) from None

    def _add_role_znodes(self, roles: ClusterRoles) -> None:
        """Write ``roles`` and ``discovery``, and make the znodes clients need, where missing."""
        data, _ = self._get(self.paths.cluster)
        params = ClusterParams.decode(data, self.paths.cluster)
        for path, data in (
            (self.paths.roles, roles.encode()),
            (self.paths.discovery, DiscoveryParams.of(params).encode()),
            (self.paths.server, b""),
            (self.paths.members, b""),
            (self.paths.server_preferred, NO_PREFERRED_PARTITIONS),
            (self.paths.client, b""),
            (self.paths.client_id, b""),
            (self.paths.client_ids, str(self._counted_client_ids()).encode()),
        ):
            try:
                self.zk.create(path, data, acl=roles.acl_for(self.paths.relative(path)))
            except NodeExistsError:
                if path == self.paths.roles:
                    self.zk.set(path, data)
