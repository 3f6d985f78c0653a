"""Run-time preferred partitions in ``<root>/server/preferred`` (docs/zookeeper.md)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from waltz.errors import MetadataError
from waltz.metadata.preferred import PreferredPartitions, preferred_path, read_preferred, update_preferred
from waltz.metadata.zk import ClusterPaths


def test_an_entry_replaces_the_configured_preferences(zk_client: KazooClient, zk_root: str) -> None:
    paths = ClusterPaths.of(zk_root)
    assert read_preferred(zk_client, paths) == (PreferredPartitions(), -1)
    # The first change starts from the configured list and creates the znode.
    assert update_preferred(zk_client, paths, "h:1", (3, 0), add=[5]) == ((0, 3), (0, 3, 5))
    # Later changes start from the entry, whatever the configured list says.
    assert update_preferred(zk_client, paths, "h:1", (7,), remove=[0, 3, 5]) == ((0, 3, 5), ())
    preferred, version = read_preferred(zk_client, paths)
    assert version == 1
    assert preferred.of("h:1", (7,)) == ()  # an empty entry still replaces
    assert preferred.of("h:2", (2, 1)) == (1, 2)  # no entry: the configured ones


def test_a_malformed_znode_names_itself(zk_client: KazooClient, zk_root: str) -> None:
    paths = ClusterPaths.of(zk_root)
    zk_client.create(
        preferred_path(paths), b'{"format_version": 1, "servers": {"h:1": [true]}}', makepath=True
    )
    with pytest.raises(MetadataError, match=preferred_path(paths)):
        read_preferred(zk_client, paths)
