"""The cluster the server's raw-stream tests run on: plaintext (a raw stream has no certificate),
one server and one partition, on the test run's ZooKeeper."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pytest
import support

from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions


@contextmanager
def raw_stream_cluster(
    tmp_path_factory: pytest.TempPathFactory,
    zookeeper: object,
    name: str,
    *,
    storages: int = 1,
    server_env: Mapping[str, str] | None = None,
) -> Iterator[LocalCluster]:
    """A started plaintext cluster of one server and one partition, stopped (its root deleted)
    on exit.

    Args:
        tmp_path_factory: pytest's, for its work directory.
        zookeeper: the run's ZooKeeper fixture (its ``connect_string``).
        name: its work directory's name.
        storages: its storage nodes.
        server_env: settings of its server, as ``WALTZ_SERVER_*`` variables.
    """
    options = {} if server_env is None else {"processes": ProcessOptions(server_env=dict(server_env))}
    with LocalCluster(
        security=support.PLAINTEXT,
        storages=storages,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path_factory.mktemp(name),
        delete_root=True,
        **options,  # type: ignore[arg-type]
    ) as local:
        yield local
