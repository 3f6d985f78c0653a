"""A directory another local user could fill or swap is refused before anything in it is trusted
(docs/design/storage.md, "File modes").

Another user who owns a local cluster's work directory, or can write to it or to one of its
parents, could put certificates, keys and ZooKeeper credentials there before the operator starts
the cluster: the cluster would then run on keys that user holds, and the user could erase it. A
storage node's directory is the same for the node's data. The tests run as root, which may give a
file to any user ID: ``nobody`` (65534) stands for the other user.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from waltz.errors import ConfigurationError
from waltz.local.cluster import LocalCluster
from waltz.private_files import replaceable_by_others
from waltz.services.storage.node import StorageNode

pytestmark = pytest.mark.security

#: The user ID of ``nobody``: a user other than the one running the tests.
OTHER_USER = 65534


@pytest.fixture(autouse=True)
def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")


def _planted(tmp_path: Path) -> Path:
    """A work directory as another user would leave it for the operator: its own, open to all,
    with a certificate directory and a credential file in it."""
    work_dir = tmp_path / "planted"
    (work_dir / "tls").mkdir(parents=True)
    (work_dir / "tls" / "ca.pem").write_text("a CA the other user made\n")
    (work_dir / "zookeeper-credentials").mkdir()
    (work_dir / "zookeeper-credentials" / "operator.digest").write_text("waltz-operator:known\n")
    for path in (work_dir, work_dir / "tls", work_dir / "tls" / "ca.pem"):
        os.chown(path, OTHER_USER, OTHER_USER)
    os.chmod(work_dir, 0o777)
    return work_dir


def test_an_own_directory_under_a_sticky_shared_parent_is_accepted(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # as /tmp
    own = shared / "mine"
    (own / "tls").mkdir(parents=True)
    (own / "tls" / "key.pem").write_text("key")
    (own / "link").symlink_to(own / "tls")
    assert replaceable_by_others(own, within=("tls",)) is None


def test_each_way_another_user_could_replace_the_contents_is_named(tmp_path: Path) -> None:
    # Open to all.
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    assert replaceable_by_others(open_dir) == f"{open_dir} may be written by other users (mode 777)"
    # Another user's.
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER_USER, OTHER_USER)
    reason = replaceable_by_others(theirs)
    assert reason is not None and f"{theirs} belongs to user {OTHER_USER}" in reason
    # A parent another user may write without the sticky bit: they could rename ours away.
    parent = tmp_path / "parent"
    (parent / "ours").mkdir(parents=True)
    os.chmod(parent, 0o777)
    assert replaceable_by_others(parent / "ours") == f"{parent} may be written by other users (mode 777)"
    # A file another user put deep in a checked subdirectory, and one not checked that deep.
    deep = tmp_path / "deep"
    (deep / "tls" / "inner").mkdir(parents=True)
    (deep / "tls" / "inner" / "node.pem").write_text("cert")
    os.chown(deep / "tls" / "inner" / "node.pem", OTHER_USER, OTHER_USER)
    reason = replaceable_by_others(deep, within=("tls",))
    assert reason is not None and "node.pem belongs to user" in reason
    assert replaceable_by_others(deep) is None
    # A link on the way that another user owns: they could point it at another directory.
    mine = tmp_path / "mine"
    mine.mkdir()
    shared = tmp_path / "sticky"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "their-link").symlink_to(mine)
    os.chown(shared / "their-link", OTHER_USER, OTHER_USER, follow_symlinks=False)
    reason = replaceable_by_others(shared / "their-link")
    assert reason == f"{shared / 'their-link'} is a link that user {OTHER_USER} may point elsewhere"
    (shared / "my-link").symlink_to(mine)
    assert replaceable_by_others(shared / "my-link") is None
    # A link another user made in it counts as theirs, whatever it points to.
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "tls").symlink_to(tmp_path)
    os.chown(linked / "tls", OTHER_USER, OTHER_USER, follow_symlinks=False)
    reason = replaceable_by_others(linked)
    assert reason is not None and f"{linked / 'tls'} belongs to user" in reason


def test_a_local_cluster_refuses_a_work_directory_another_user_prepared(tmp_path: Path) -> None:
    work_dir = _planted(tmp_path)
    before = sorted(str(p.relative_to(work_dir)) for p in work_dir.rglob("*"))
    with pytest.raises(ConfigurationError) as refused:
        LocalCluster(work_dir=work_dir).start()
    message = str(refused.value)
    assert f"the work directory {work_dir} is not safe to use" in message
    assert f"{work_dir} belongs to user {OTHER_USER}" in message
    assert "certificates, keys and ZooKeeper credentials" in message
    # Nothing was started from it, made in it or used from it.
    assert sorted(str(p.relative_to(work_dir)) for p in work_dir.rglob("*")) == before


def test_a_local_cluster_refuses_a_kept_directory_with_another_user_s_certificate(tmp_path: Path) -> None:
    work_dir = tmp_path / "kept"
    (work_dir / "tls").mkdir(parents=True, mode=0o700)
    os.chmod(work_dir, 0o700)
    (work_dir / "tls" / "ca.pem").write_text("swapped in")
    os.chown(work_dir / "tls" / "ca.pem", OTHER_USER, OTHER_USER)
    with pytest.raises(ConfigurationError, match=r"ca\.pem belongs to user 65534"):
        LocalCluster(work_dir=work_dir).start()


def test_a_storage_node_refuses_a_directory_another_user_may_write(tmp_path: Path) -> None:
    directory = tmp_path / "storage"
    directory.mkdir()
    os.chmod(directory, 0o777)
    with pytest.raises(ConfigurationError, match=r"not safe to serve from: .* may be written by other users"):
        StorageNode(directory).start()
    os.chmod(directory, 0o700)
    os.chown(directory, OTHER_USER, OTHER_USER)
    with pytest.raises(ConfigurationError, match=f"belongs to user {OTHER_USER}"):
        StorageNode(directory).start()
    os.chown(directory, os.geteuid(), os.getegid())
    with StorageNode(directory) as node:  # its user's own: served
        node.admin_open("9f3c2f9e-6b8f-4f0e-8d5c-0c1b8b0f1e2a", 1)
