"""The role table and the role credential files (docs/design/zookeeper.md, "Roles")."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from kazoo.security import Permissions

from waltz.errors import MetadataError
from waltz.metadata.zk_roles import ROLE_DIGEST_FILES, ClusterRoles, Role, RoleCredentials, grants_for


def test_clients_never_read_the_cluster_key_nor_write_the_store() -> None:
    for relative in ("cluster", "store", "store/assignment", "store/partition/0", "archive"):
        assert Role.CLIENT not in grants_for(relative), relative
    assert grants_for("discovery")[Role.CLIENT] == Permissions.READ
    assert grants_for("server/assignment")[Role.CLIENT] == Permissions.READ
    # Clients write no znode: they take IDs by creating sequential children of client/ids.
    assert grants_for("client/id")[Role.CLIENT] == Permissions.READ
    assert grants_for("client/ids")[Role.CLIENT] == Permissions.READ | Permissions.CREATE
    assert grants_for("client/ids/id-0000000007")[Role.CLIENT] == Permissions.READ
    # Clients route by the splits' epochs: they read them and never write them.
    assert grants_for("partitions")[Role.CLIENT] == Permissions.READ
    assert grants_for("partitions/epochs")[Role.CLIENT] == Permissions.READ


def test_servers_write_partition_metadata_and_their_subtree_but_not_the_replica_assignment() -> None:
    assert grants_for("store/assignment")[Role.SERVER] == Permissions.READ
    assert grants_for("store/partition/3")[Role.SERVER] == Permissions.READ | Permissions.WRITE
    assert grants_for("server/members/member-0000000001")[Role.SERVER] == Permissions.ALL
    # A parent's owner writes its barrier, a child's owner its genesis; operators create the znode.
    assert grants_for("partitions/epochs")[Role.SERVER] == Permissions.READ | Permissions.WRITE
    assert grants_for("partitions")[Role.SERVER] == Permissions.READ
    assert all(grants_for(path)[Role.OPERATOR] == Permissions.ALL for path in ("", "cluster", "client/id"))


def test_role_credentials_are_made_once_in_owner_only_files_and_read_back(tmp_path: Path) -> None:
    directory = tmp_path / "digests"
    made = RoleCredentials.load_or_generate(directory)
    for role, name in ROLE_DIGEST_FILES.items():
        path = directory / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text().strip() == made.digest(role)
    assert RoleCredentials.load_or_generate(directory) == made
    assert "waltz" not in repr(made)  # no secret in a log line
    identities = made.identities()
    assert ClusterRoles.decode(identities.encode(), "/r/roles") == identities
    assert identities.role_of({identities.server}) is Role.SERVER
    (directory / ROLE_DIGEST_FILES[Role.CLIENT]).unlink()
    with pytest.raises(MetadataError, match="but not all of"):
        RoleCredentials.load_or_generate(directory)


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"[" * 60_000,  # nested deeper than the JSON decoder recurses
        b'{"format_version": ' + b"1" * 5_000 + b"}",  # more digits than Python reads
        b'{"client": "c:x"}',  # no format_version
        b'{"format_version": true}',
        b'{"format_version": 1.0}',
        b"[1]",
    ],
    ids=["not-json", "too-deep", "too-long", "no-version", "bool-version", "float-version", "not-an-object"],
)
def test_a_roles_znode_that_waltz_py_did_not_write_is_a_metadata_error(data: bytes) -> None:
    with pytest.raises(MetadataError, match="/r/roles"):
        ClusterRoles.decode(data, "/r/roles")
