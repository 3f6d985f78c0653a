"""ZooKeeper identities per role: servers, operators and clients, each with a digest credential.

A cluster created with role credentials (``waltz cluster create --digest-dir``, or a local cluster
with ``zookeeper_auth``) gives each znode an ACL per role (docs/design/zookeeper.md, "Security",
"Roles"): operators hold every right everywhere, servers write what they own (their members,
the election, the partition assignment, the partition metadata, a split's barriers and geneses in
``partitions/epochs``), and clients read only what discovery and routing need (``discovery``,
``server/assignment``, ``partitions/epochs``) and take an ID by creating a sequential znode under
``client/ids``, which they can neither rewrite nor delete. No role but
the operators and the servers can read ``cluster``, which holds the cluster key.

The identities (``user:base64(sha1(user:password))``, as ZooKeeper's digest scheme shows them in
every ACL) are kept in ``<root>/roles``, so that a server creating a znode knows whom to grant
what. :class:`RoleCredentials` holds the three secrets (one ``user:password`` file per role,
mode 0600); :class:`ClusterRoles` the public identities and the ACL table.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from kazoo.client import KazooClient
from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from waltz.errors import MetadataError
from waltz.metadata.values import _load
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.private_files import private_directory

__all__ = [
    "KNOWN_CHILDREN",
    "RIGHTS",
    "ROLE_DIGEST_FILES",
    "TABLE_ZNODES",
    "AclProblem",
    "ClusterRoles",
    "Role",
    "RoleCredentials",
    "ZnodeAclError",
    "describe_acl",
    "digest_identity",
    "grants_for",
    "rights_letters",
    "session_identities",
]

_FORMAT_VERSION = 1
_ALL = Permissions.ALL
_READ = Permissions.READ
_READ_WRITE = Permissions.READ | Permissions.WRITE


class Role(enum.Enum):
    """Who opens a ZooKeeper session for the cluster."""

    SERVER = "server"
    """Waltz servers."""
    OPERATOR = "operator"
    """``waltz cluster`` and the other admin tools, the archiver, the console, the local harness."""
    CLIENT = "client"
    """Applications' Waltz clients."""


#: The digest file of each role in the directory ``waltz cluster create --digest-dir`` fills.
ROLE_DIGEST_FILES: dict[Role, str] = {role: f"{role.value}.digest" for role in Role}


class ZnodeAclError(MetadataError):
    """A znode of the cluster is open to anyone or to an identity that is none of the cluster's:
    the cluster may have been squatted (docs/design/zookeeper.md, "Checking the root")."""


@dataclass(frozen=True, slots=True)
class AclProblem:
    """A znode whose ACL lets in someone the cluster does not know.

    Attributes:
        path: the znode.
        detail: the offending ACL entries and why they are a problem.
    """

    path: str
    detail: str


#: Each permission bit and its ``zkCli.sh`` letter, in ``cdrwa`` order.
RIGHTS: tuple[tuple[int, str], ...] = (
    (Permissions.CREATE, "c"),
    (Permissions.DELETE, "d"),
    (Permissions.READ, "r"),
    (Permissions.WRITE, "w"),
    (Permissions.ADMIN, "a"),
)


def rights_letters(perms: int) -> str:
    """Permission bits as ``zkCli.sh`` letters, in ``cdrwa`` order (empty for none)."""
    return "".join(letter for bit, letter in RIGHTS if perms & bit)


def describe_acl(entry: ACL) -> str:
    """An ACL entry as ``zkCli.sh getAcl`` shows it: ``scheme:id:cdrwa``."""
    return f"{entry.id.scheme}:{entry.id.id}:{rights_letters(entry.perms)}"


def digest_identity(digest: str) -> str:
    """The identity ZooKeeper shows for a ``user:password`` credential: ``user:<base64 sha1>``."""
    user, _, password = digest.partition(":")
    return make_digest_acl_credential(user, password)  # type: ignore[no-any-return]


def session_identities(zk: KazooClient) -> set[str]:
    """The digest identities a kazoo session authenticated with (empty without a credential)."""
    return {digest_identity(credential) for scheme, credential in zk.auth_data if scheme == "digest"}


@dataclass(frozen=True, slots=True)
class RoleCredentials:
    """The ``user:password`` credential of each role (secrets: never logged, files mode 0600).

    Args:
        server: the servers' credential.
        operator: the operators' credential.
        client: the clients' credential.
    """

    server: str
    operator: str
    client: str

    def __repr__(self) -> str:
        return "RoleCredentials(<secret>)"

    def __post_init__(self) -> None:
        for role in Role:
            ZooKeeperSecurity(digest=self.digest(role))  # validates user:password
        users = {self.digest(role).partition(":")[0] for role in Role}
        if len(users) != len(Role):
            raise MetadataError("the server, operator and client credentials need three distinct users")

    @classmethod
    def generate(cls) -> Self:
        """New credentials, users ``waltz-server``, ``waltz-operator``, ``waltz-client``, each
        with a random 192-bit password."""
        made = {role: ZooKeeperSecurity.generate(f"waltz-{role.value}").digest for role in Role}
        return cls(**{role.value: str(made[role]) for role in Role})

    @classmethod
    def load_or_generate(cls, directory: Path) -> Self:
        """The credentials of :data:`ROLE_DIGEST_FILES` in ``directory``, made (mode 0600) when absent.

        Raises:
            MetadataError: some of the three files exist and some do not.
            ConfigurationError: a file cannot be read or holds no ``user:password``.
            OSError: the directory cannot be written.
        """
        files = {role: directory / name for role, name in ROLE_DIGEST_FILES.items()}
        present = [role for role, path in files.items() if path.exists()]
        if present and len(present) != len(files):
            raise MetadataError(
                f"{directory} holds the digest files of {', '.join(r.value for r in present)} but not "
                f"all of {', '.join(ROLE_DIGEST_FILES.values())}: restore them, or use an empty directory"
            )
        if present:
            return cls(**{role.value: ZooKeeperSecurity.read_digest_file(files[role]) for role in Role})
        credentials = cls.generate()
        private_directory(directory)
        for role, path in files.items():
            ZooKeeperSecurity(digest=credentials.digest(role)).write_digest_file(path)
        return credentials

    def digest(self, role: Role) -> str:
        """The ``user:password`` of a role."""
        return str(getattr(self, role.value))

    def identities(self) -> ClusterRoles:
        """The public identities of the three credentials."""
        return ClusterRoles(**{role.value: digest_identity(self.digest(role)) for role in Role})


@dataclass(frozen=True, slots=True)
class ClusterRoles:
    """The digest identity (``user:<base64 sha1>``) of each role, as kept in ``<root>/roles``."""

    server: str
    operator: str
    client: str

    def encode(self) -> bytes:
        """The ``<root>/roles`` znode's JSON."""
        value = {"format_version": _FORMAT_VERSION, **{role.value: self.identity(role) for role in Role}}
        return json.dumps(value, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        """Read ``<root>/roles``.

        Raises:
            MetadataError: not the JSON of :meth:`encode`.
        """
        value = _load(data, path, (_FORMAT_VERSION,))
        identities = {role.value: value.get(role.value) for role in Role}
        if not all(isinstance(v, str) and ":" in v for v in identities.values()):
            raise MetadataError(f"znode {path}: every role needs a digest identity user:hash")
        return cls(**identities)  # type: ignore[arg-type]

    def identity(self, role: Role) -> str:
        """The digest identity of a role."""
        return str(getattr(self, role.value))

    def all(self) -> set[str]:
        """The three identities."""
        return {self.identity(role) for role in Role}

    def role_of(self, identities: Iterable[str]) -> Role | None:
        """The role of the first of ``identities`` that is one of the cluster's (operator first)."""
        held = set(identities)
        for role in (Role.OPERATOR, Role.SERVER, Role.CLIENT):
            if self.identity(role) in held:
                return role
        return None

    def acl(self, grants: Mapping[Role, int]) -> list[ACL]:
        """One digest ACL entry per role granted something."""
        return [ACL(perms, Id("digest", self.identity(role))) for role, perms in grants.items()]

    def acl_for(self, relative: str) -> list[ACL]:
        """The ACL of a znode of the cluster.

        Args:
            relative: the znode's path below the root, without a leading slash (``""`` for the
                root, ``"cluster"``, ``"store/partition/3"``...).
        """
        return self.acl(grants_for(relative))

    def default_acl(self, role: Role) -> list[ACL]:
        """The ACL of the znodes a session of ``role`` creates at run time (kazoo's ``default_acl``)."""
        return self.acl(_DEFAULT_GRANTS[role])


_OPERATED: dict[Role, int] = {Role.OPERATOR: _ALL, Role.SERVER: _READ}
_SERVED: dict[Role, int] = {Role.SERVER: _ALL, Role.OPERATOR: _ALL, Role.CLIENT: _READ}

#: Each known znode below the root (``""`` is the root) and what each role may do with it.
_GRANTS: dict[str, dict[Role, int]] = {
    "": {Role.OPERATOR: _ALL, Role.SERVER: _READ, Role.CLIENT: _READ},
    "cluster": _OPERATED,  # the cluster key: never the clients
    "discovery": {Role.OPERATOR: _ALL, Role.SERVER: _READ, Role.CLIENT: _READ},
    "roles": {Role.OPERATOR: _ALL, Role.SERVER: _READ, Role.CLIENT: _READ},
    "store": _OPERATED,
    "store/assignment": _OPERATED,
    "store/group": _OPERATED,
    "store/connection": _OPERATED,
    "store/partition": _OPERATED,
    # Servers create their members, the election and the assignment below it, but may neither
    # delete its children nor change its ACL: they could otherwise delete and re-create
    # ``server/preferred``, which only operators write (``create`` and ``secure`` make it).
    "server": {Role.OPERATOR: _ALL, Role.SERVER: _READ | Permissions.CREATE, Role.CLIENT: _READ},
    "server/preferred": _OPERATED,
    "client": {Role.OPERATOR: _ALL, Role.CLIENT: _READ},
    # Clients only read the counter: one that could write it could hand out IDs again.
    "client/id": {Role.OPERATOR: _ALL, Role.CLIENT: _READ},
    # A client takes its ID by creating a sequential child: it may create, never write or delete.
    "client/ids": {Role.OPERATOR: _ALL, Role.CLIENT: _READ | Permissions.CREATE},
    "archive": _OPERATED,
    # The splits' epochs: operators prepare, seal and complete a split, a parent's owner writes its
    # barrier and a child's owner its genesis; clients route by them (docs/design/splits.md).
    "partitions": {Role.OPERATOR: _ALL, Role.SERVER: _READ, Role.CLIENT: _READ},
    "partitions/epochs": {Role.OPERATOR: _ALL, Role.SERVER: _READ_WRITE, Role.CLIENT: _READ},
}

_DEFAULT_GRANTS: dict[Role, dict[Role, int]] = {
    Role.SERVER: _SERVED,  # members, the election's znodes, the partition assignment
    Role.OPERATOR: _OPERATED,  # the archive's summary, the run-time preferred partitions
    Role.CLIENT: {Role.CLIENT: _ALL, Role.OPERATOR: _ALL},  # nothing, in a cluster made with roles
}

#: The znodes a cluster may hold directly under its root; anything else is flagged by verify.
KNOWN_CHILDREN = frozenset(p for p in _GRANTS if p and "/" not in p)

#: Every znode of the role table by its path below the root (``""``: the root), in table order.
TABLE_ZNODES: tuple[str, ...] = tuple(_GRANTS)


def grants_for(relative: str) -> dict[Role, int]:
    """What each role may do with the znode ``relative`` below the root (see :func:`ClusterRoles.acl_for`)."""
    if relative in _GRANTS:
        return _GRANTS[relative]
    if relative.startswith("store/partition/"):
        return {Role.OPERATOR: _ALL, Role.SERVER: _READ_WRITE}  # store sessions, recoveries
    if relative.startswith("server/"):
        return _SERVED
    if relative.startswith("client/ids/"):
        return {Role.OPERATOR: _ALL, Role.CLIENT: _READ}  # a client's ID znode, made by the client
    return _OPERATED
