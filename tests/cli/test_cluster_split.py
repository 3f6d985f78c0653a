"""``waltz cluster split --to M`` on one real local cluster (docs/design/splits.md "The handover";
docs/zookeeper.md "`waltz cluster split`").

One test walks a split on a real local cluster, since each step stands on the one before: a
refused count and a dry run write nothing; the split runs to its end (every parent sealed by its
owner, every child opened and started by its owner's genesis: exit code 0); the same command then
changes nothing; a count that is not a multiple of the new one and an abort of the complete split
are refused with nothing changed. A ZooKeeper that does not answer stops the command before
anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from typer.testing import CliRunner, Result

from tests.services.server.test_epoch_refusals import start_cluster
from waltz.cli.main import app
from waltz.local.cluster import LocalCluster
from waltz.local.processes import free_port
from waltz.metadata.paths import ClusterPaths
from waltz.metadata.values import ArchiveSummary
from waltz.metadata.zk import ClusterZk

#: ``partitions/epochs`` (None: absent) and ``discovery``, as bytes.
Znodes = tuple[bytes | None, bytes]


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    with start_cluster(tmp_path_factory.mktemp("cluster-split"), zookeeper) as local:
        local.wait_ready(60)
        yield local


def waltz(cluster: LocalCluster, *args: str, expect: int) -> Result:
    where = ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    result = CliRunner().invoke(app, ["cluster", "split", *args, *where])
    assert result.exit_code == expect, f"exit code {result.exit_code}:\n{result.output}"
    return result


def znodes(cluster: LocalCluster) -> Znodes:
    paths = ClusterPaths.of(cluster.root)
    zk = KazooClient(hosts=cluster.zookeeper_connect_string)
    zk.start(30)
    try:
        try:
            epochs: bytes | None = zk.get(paths.epochs)[0]
        except NoNodeError:
            epochs = None
        return epochs, zk.get(paths.discovery)[0]
    finally:
        zk.stop()
        zk.close()


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


def test_a_split_is_planned_run_resumed_and_refused_what_it_cannot_do(cluster: LocalCluster) -> None:
    # A count that is not a whole multiple of at least 2: refused, nothing written.
    before = znodes(cluster)
    for count in ("3", "2"):
        refused = waltz(cluster, "--to", count, expect=1)
        assert f"a split goes from 2 partitions to a whole multiple of at least 2 of it, not {count}" in (
            refused.output
        )
    assert znodes(cluster) == before and before[0] is None

    # On an archived cluster the command warns that the archive does not follow a split.
    assert "archive" not in waltz(cluster, "--to", "4", "--dry-run", expect=0).stderr
    zk = KazooClient(hosts=cluster.zookeeper_connect_string)
    zk.start(30)
    try:
        archived = ClusterZk(zk, cluster.root)
        archived.set_archive_summary(ArchiveSummary(str(cluster.work_dir / "archive")), -1)
        warned = waltz(cluster, "--to", "4", "--dry-run", expect=0)
        assert "warning: this cluster is archived, and the archive does not follow a split" in warned.stderr
        zk.delete(ClusterPaths.of(cluster.root).archive)
    finally:
        zk.stop()
        zk.close()

    # The dry run: the plan, nothing written.
    plan = as_json(waltz(cluster, "--to", "4", "--dry-run", "--json", expect=0))
    assert (plan["state"], plan["dry_run"], plan["epoch"], plan["count"], plan["previous_count"]) == (
        "planned",
        True,
        1,
        4,
        2,
    )
    assert [(p["parent"], p["high_water_mark"], p["children"]) for p in plan["parents"]] == [
        (0, -1, [2]),
        (1, -1, [3]),
    ]
    assert all(p["owner"] for p in plan["parents"])
    human = waltz(cluster, "--to", "4", "--dry-run", expect=0).stdout
    assert "plan: split 2 -> 4 partitions (epoch 1), planned; nothing was written" in human
    assert "  parent 0: H(0) = -1, no barrier yet, children 2" in human
    assert znodes(cluster) == before

    # The split: every parent sealed by its owner, every child opened and given its genesis.
    ran = waltz(cluster, "--to", "4", expect=0).stdout
    for line in (
        "prepared epoch 1: 2 -> 4 partitions (H(0) = -1, H(1) = -1)",
        "discovery: epoch 1, raised format",
        "parent 0: marked sealing; its owner appends the barrier",
        "parent 1: marked sealing; its owner appends the barrier",
        "child 2 (parent 0): opened, its log starting at",
        "child 3 (parent 1): open (genesis at",
        "split 2 -> 4 partitions (epoch 1): complete",
        "the split is complete: 4 partitions",
    ):
        assert line in ran, f"{line!r} not in:\n{ran}"
    # A parent whose barrier is in is sealed, not still sealing.
    assert "  parent 0: H(0) = -1, sealed, barrier " in ran, ran
    assert ", sealing," not in ran, ran
    epochs, discovery = znodes(cluster)
    assert epochs is not None and json.loads(discovery)["epoch"] == 1
    (epoch,) = json.loads(epochs)["epochs"]
    barriers = [p["barrier"] for p in epoch["parents"].values()]
    assert all(isinstance(b, int) for b in barriers), barriers
    geneses = [c["genesis"] for c in epoch["children"].values()]
    assert geneses == [b + 1 for b in barriers]
    where = ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    listed = CliRunner().invoke(app, ["cluster", "list", *where])
    assert "  partitions:  4 (2 at creation, the others opened by splits)" in listed.stdout, listed.output
    listed_json = json.loads(CliRunner().invoke(app, ["cluster", "list", "--json", *where]).stdout)
    assert (listed_json["num_partitions"], listed_json["partition_count"]) == (2, 4)

    # The same command again: the split is complete, nothing written.
    state = as_json(waltz(cluster, "--to", "4", "--json", expect=0))
    assert (state["state"], state["resumed"], state["complete"]) == ("complete", True, True)
    assert [p["barrier"] for p in state["parents"]] == barriers
    assert [(c["child"], c["state"], c["genesis"]) for c in state["children"]] == [
        (2, "open", geneses[0]),
        (3, "open", geneses[1]),
    ]
    assert znodes(cluster) == (epochs, discovery)

    # A count that is not a multiple of the new one, and an abort of the complete split: refused.
    before = znodes(cluster)
    other = waltz(cluster, "--to", "6", expect=1)
    assert "a split goes from 4 partitions to a whole multiple of at least 2 of it, not 6" in other.output
    aborted = waltz(cluster, "--to", "4", "--abort", expect=1)
    assert "is complete: it cannot be aborted" in aborted.output
    assert znodes(cluster) == before


def test_zookeeper_not_answering_stops_the_command_before_anything() -> None:
    where = ["--zookeeper", f"127.0.0.1:{free_port()}", "--root", "/waltz-test/nowhere", "--timeout", "1"]
    result = CliRunner().invoke(app, ["cluster", "split", "--to", "4", *where])
    assert result.exit_code == 2, result.output
    assert "no ZooKeeper server at" in result.output
