"""``waltz cluster split --to M`` on one real local cluster (docs/design/splits.md "The handover";
docs/zookeeper.md "`waltz cluster split`").

One test walks a split on a real local cluster, since each step stands on the one before: a
refused count and a dry run write nothing; the split runs to where it is built (every parent
sealed by its owner, the children waiting to be opened: exit code 3); the same command resumes it
with the same barriers; another count and an abort after sealing are refused with nothing
changed. A ZooKeeper that does not answer stops the command before anything.
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
    assert any("carry no version" in note for note in plan["notes"])
    human = waltz(cluster, "--to", "4", "--dry-run", expect=0).stdout
    assert "plan: split 2 -> 4 partitions (epoch 1), planned; nothing was written" in human
    assert "  parent 0: H(0) = -1, no barrier yet, children 2" in human
    assert znodes(cluster) == before

    # The split: every parent sealed by its owner, the children waiting to be opened.
    ran = waltz(cluster, "--to", "4", expect=3).stdout
    for line in (
        "prepared epoch 1: 2 -> 4 partitions (H(0) = -1, H(1) = -1)",
        "discovery: epoch 1, raised format",
        "parent 0: marked sealing; its owner appends the barrier",
        "parent 1: marked sealing; its owner appends the barrier",
        "child 2 (parent 0): waiting to be opened",
        "child 3 (parent 1): waiting to be opened",
        "split 2 -> 4 partitions (epoch 1): sealing",
        "not complete: children [2, 3] are waiting to be opened",
    ):
        assert line in ran, f"{line!r} not in:\n{ran}"
    epochs, discovery = znodes(cluster)
    assert epochs is not None and json.loads(discovery)["epoch"] == 1
    barriers = [p["barrier"] for p in json.loads(epochs)["epochs"][0]["parents"].values()]
    assert all(isinstance(b, int) for b in barriers), barriers

    # The same command resumes it: nothing written, the same barriers; exit code 3 again.
    state = as_json(waltz(cluster, "--to", "4", "--json", expect=3))
    assert (state["state"], state["resumed"], state["complete"]) == ("sealing", True, False)
    assert [p["barrier"] for p in state["parents"]] == barriers
    assert [(c["child"], c["state"]) for c in state["children"]] == [
        (2, "waiting to be opened"),
        (3, "waiting to be opened"),
    ]
    assert znodes(cluster) == (epochs, discovery)

    # Another count, and an abort once a parent is sealing: refused, nothing changed.
    before = znodes(cluster)
    other = waltz(cluster, "--to", "8", expect=1)
    assert "the split to epoch 1 (2 -> 4 partitions) is unfinished (sealing)" in other.output
    assert "waltz cluster split --to 4" in other.output
    aborted = waltz(cluster, "--to", "4", "--abort", expect=1)
    assert "cannot be aborted: parents [0, 1] are sealing, so it only goes forward" in aborted.output
    assert znodes(cluster) == before


def test_zookeeper_not_answering_stops_the_command_before_anything() -> None:
    where = ["--zookeeper", f"127.0.0.1:{free_port()}", "--root", "/waltz-test/nowhere", "--timeout", "1"]
    result = CliRunner().invoke(app, ["cluster", "split", "--to", "4", *where])
    assert result.exit_code == 2, result.output
    assert "no ZooKeeper server at" in result.output
