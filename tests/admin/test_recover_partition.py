"""``waltz cluster storage recover-partition`` against a real local cluster whose source node is
frozen (SIGSTOP): its ``--timeout`` bounds the opening of its streams, as it bounds each request
(docs/design/storage.md "Admin port"; ``waltz/admin/recover.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from waltz.admin.cluster_admin import ClusterAdmin
from waltz.admin.config import ClusterAdminConfig
from waltz.cli.main import app
from waltz.local.cluster import LocalCluster


@pytest.fixture
def cluster(zookeeper: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """3 storage nodes, partition 0 on 2 of them, and its server stopped: no store session makes
    the third replica, assigned below, a caught-up one (recover-partition refuses those)."""
    with LocalCluster(
        storages=3,
        servers=1,
        partitions=1,
        replicas=2,
        name="recover-timeout",
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path_factory.mktemp("recover-timeout"),
        delete_root=True,
    ) as started:
        started.wait_ready(60)
        started.stop_server(0)
        yield started


def holders(cluster: LocalCluster) -> list[str]:
    """The storage nodes ``store/assignment`` gives partition 0."""
    config = ClusterAdminConfig(**cluster.admin_settings("admin"))
    with ClusterAdmin.connect(
        cluster.zookeeper_connect_string,
        cluster.root,
        tls=config.tls(),
        security=config.zookeeper_security(),
    ) as admin:
        return admin.cluster.assignments().value.storages_of(0)


def test_recover_partition_gives_up_on_a_frozen_source_within_its_timeout(cluster: LocalCluster) -> None:
    """Before, the opens were outside the timeout: a frozen source held the command for about
    20 s with --timeout 2, and it then said nothing of which node did not answer."""
    runner = CliRunner()
    as_admin = cluster.admin_env("admin")
    held = holders(cluster)
    [newcomer] = [node for node in cluster.storages if node.address not in held]
    source_index = next(i for i, node in enumerate(cluster.storages) if node.address == held[0])
    source = cluster.storages[source_index]
    assigned = runner.invoke(
        app, ["cluster", "storage", "assign", newcomer.address, "--partition", "0"], env=as_admin
    )
    assert assigned.exit_code == 0, assigned.output

    cluster.pause_storage(source_index)
    try:
        started = time.monotonic()
        result = runner.invoke(
            app,
            [
                "cluster",
                "storage",
                "recover-partition",
                "--source",
                source.address,
                "--destination",
                newcomer.address,
                "--partition",
                "0",
                "--timeout",
                "2",
            ],
            env=as_admin,
        )
        seconds = time.monotonic() - started
    finally:
        cluster.resume_storage(source_index)

    assert result.exit_code == 2, result.output
    assert seconds < 8, f"took {seconds:.1f}s with --timeout 2: {result.output}"
    assert f"partition 0: a storage node did not answer: storage node {source.admin_address}" in result.output
    assert "within 2s" in result.output, result.output
