"""The operator's split, the five steps of the handover, on real clusters (docs/design/splits.md
"The handover", "What ZooKeeper holds").

Real storage and server processes and a real ZooKeeper: :class:`SplitRun` checks, prepares the
epoch with each parent's committed high-water mark, raises ``discovery``'s format and marks the
parents sealing; the parents' owners append their barriers and write ``B(p)`` by themselves; the
run opens each child on its parent's storage nodes, and the child's owner appends its genesis and
writes its ID, which completes the split. A
ZooKeeper cut through a TCP proxy stops a run half-way, and the same run resumes it; an abort
works only before the first parent is sealing. A cluster with ZooKeeper credentials per role
refuses every caller but the operators', and a certificate without the admin role, before
anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from kazoo.exceptions import NoNodeError
from support.storage import run as run_async
from typer.testing import CliRunner

from tests.client.client_helpers import Append, MemoryStore
from tests.services.server.test_epoch_refusals import start_cluster
from tests.services.server.test_split_barrier import records_above, split_records
from waltz import WaltzClient, WaltzClientConfig
from waltz.admin.cluster_admin import ClusterAdmin
from waltz.admin.split_report import OPEN, SplitPhase
from waltz.admin.split_run import SplitNotAuthorisedError, SplitRun, check_authority
from waltz.chaos.proxy import FaultProxy
from waltz.cli.main import app
from waltz.committed.plan import plan_live_on
from waltz.errors import ConfigurationError, SplitStateError
from waltz.local.certificates import make_cluster_certificates
from waltz.local.cluster import LocalCluster
from waltz.local.nodes import LocalStorageNode
from waltz.local.options import ProcessOptions, SecurityOptions
from waltz.local.processes import wait_until
from waltz.metadata.assignment import MEMBER_PREFIX, PARTITION_EPOCHS_FEATURE, Member, read_members
from waltz.metadata.epochs import EpochState, PartitionEpochs, PartitionEpochsZk
from waltz.metadata.values import DiscoveryParams
from waltz.metadata.zk_roles import Role
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.metadata.zk_session import ZooKeeperUnavailableError
from waltz.spark.rebuild import LogSource

#: What the split's znodes held: ``partitions/epochs`` (None: absent) and ``discovery``'s bytes.
Snapshot = tuple[bytes | None, bytes]


def connect(
    cluster: LocalCluster, role: Role | None = None, connect_string: str | None = None
) -> ClusterAdmin:
    """An admin session on ``cluster`` (through ``connect_string`` when given), holding ``role``'s
    ZooKeeper credential when given."""
    security = None
    if role is not None:
        digest_file = cluster.zookeeper_settings(role)["zookeeper_auth_digest_file"]
        security = ZooKeeperSecurity(digest=ZooKeeperSecurity.read_digest_file(digest_file))
    return ClusterAdmin.connect(
        connect_string or cluster.zookeeper_connect_string,
        cluster.root,
        connect_timeout=10,
        session_timeout=4,
        security=security,
    )


def snapshot(admin: ClusterAdmin) -> Snapshot:
    zk, paths = admin.cluster.zk, admin.cluster.paths
    try:
        epochs: bytes | None = zk.get(paths.epochs)[0]
    except NoNodeError:
        epochs = None
    return epochs, zk.get(paths.discovery)[0]


def epochs_of(admin: ClusterAdmin) -> PartitionEpochs:
    return PartitionEpochsZk(admin.cluster.zk, admin.cluster.paths, timeout=10).read().value


def append(cluster: LocalCluster, partition: int, data: bytes, **settings: object) -> int:
    """Append ``data`` to ``partition`` through a real client; its transaction ID."""
    config = WaltzClientConfig(**cluster.zookeeper_settings(), **settings)  # type: ignore[arg-type]
    with WaltzClient(MemoryStore({0: -1, 1: -1}), config) as client:
        transaction_id = client.submit(Append(partition, data)).result(60).transaction_id
    assert transaction_id is not None
    return transaction_id


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """A 2-partition cluster (no ZooKeeper credential) with one record in partition 0."""
    with start_cluster(tmp_path_factory.mktemp("split-run"), zookeeper) as local:
        local.wait_ready(60)
        assert append(local, 0, b"before the split") == 0
        yield local


def test_a_split_cut_from_zookeeper_resumes_and_aborts_only_before_a_parent_is_sealing(
    cluster: LocalCluster,
) -> None:
    zk_host, _, zk_port = cluster.zookeeper_connect_string.rpartition(":")
    with connect(cluster) as admin, FaultProxy(lambda: (zk_host, int(zk_port)), name="zookeeper") as proxy:
        untouched = snapshot(admin)
        assert untouched[0] is None

        # The dry run: the plan, with H(p) read from the storage node; nothing written.
        plan = SplitRun(admin.cluster).plan(4)
        assert (plan.state, plan.dry_run, plan.epoch, plan.count, plan.previous_count) == (
            SplitPhase.PLANNED,
            True,
            1,
            4,
            2,
        )
        assert [(p.parent, p.high_water_mark, p.children) for p in plan.parents] == [
            (0, 0, (2,)),
            (1, -1, (3,)),
        ]
        assert [c.child for c in plan.children] == [2, 3]
        assert snapshot(admin) == untouched

        # A live server of a release before splits (its member znode names no feature) would
        # take appends the split must refuse: refused, naming it, nothing written.
        older = admin.cluster.zk.create(
            f"{admin.cluster.paths.members}/{MEMBER_PREFIX}",
            Member("", "127.0.0.1:1", server_name="old-server").encode(),
            ephemeral=True,
            sequence=True,
        )
        try:
            with pytest.raises(SplitStateError, match=r"server\(s\) old-server predate partition splits"):
                SplitRun(admin.cluster).run(4)
            assert snapshot(admin) == untouched
        finally:
            admin.cluster.zk.delete(older)
        # The cluster manager may have placed a partition on the stand-in while it was a member:
        # the split needs every parent owned by a live server again.
        cluster.wait_ready(60)
        members = read_members(admin.cluster.zk, admin.cluster.paths)
        assert members and all(PARTITION_EPOCHS_FEATURE in m.features for m in members)

        # ZooKeeper cut once discovery is raised: the split stands prepared.
        def cut_after(prefix: str) -> list[str]:
            lines: list[str] = []

            def progress(line: str) -> None:
                lines.append(line)
                if line.startswith(prefix):
                    proxy.block()

            with (
                connect(cluster, connect_string=proxy.address) as cut,
                pytest.raises(ZooKeeperUnavailableError),
            ):
                SplitRun(cut.cluster, wait=30, progress=progress).run(4)
            proxy.unblock()
            return lines

        lines = cut_after("discovery:")
        assert lines[0] == "prepared epoch 1: 2 -> 4 partitions (H(0) = 0, H(1) = -1)"
        prepared = epochs_of(admin).epoch(1)
        assert prepared.state is EpochState.PREPARING
        assert {p: progress.high_water_mark for p, progress in prepared.parents.items()} == {0: 0, 1: -1}
        discovery = DiscoveryParams.decode(untouched[1], "discovery")
        assert discovery.epoch == 0 and json.loads(untouched[1])["format_version"] == 1
        raised = snapshot(admin)[1]
        assert DiscoveryParams.decode(raised, "discovery") == replace(discovery, epoch=1)
        # Clients that predate splits read format 1 only: the raised format makes them refuse.
        assert json.loads(raised)["format_version"] == 2

        # Before any parent is sealing, the split can be rolled back, discovery to its bytes of before.
        aborted = SplitRun(admin.cluster).abort(4)
        assert aborted.state is SplitPhase.ABORTED
        assert epochs_of(admin).epochs == () and snapshot(admin)[1] == untouched[1]
        assert SplitRun(admin.cluster).abort(4).state is SplitPhase.ABORTED  # again: nothing to do

        # Cut again once parent 0 is marked sealing: from then on, only forward.
        lines = cut_after("parent 0: marked sealing")
        sealing = epochs_of(admin).epoch(1)
        assert sealing.state is EpochState.SEALING and sealing.parents[0].sealing
        assert not sealing.parents[1].sealing
        before = snapshot(admin)
        with pytest.raises(SplitStateError, match=r"parents \[0\] are sealing, so it only goes forward"):
            SplitRun(admin.cluster).abort(4)
        assert snapshot(admin) == before

        # Another count is refused, naming the split under way; nothing written. With a parent
        # sealing, the refusal offers no abort (it would be refused): only the way forward.
        with pytest.raises(
            SplitStateError, match=r"the split to epoch 1 \(2 -> 4 partitions\) is unfinished"
        ) as other:
            SplitRun(admin.cluster).run(8)
        assert "--abort" not in str(other.value) and "only goes forward" in str(other.value)
        assert snapshot(admin) == before

        # The same command resumes: every parent sealed by its owner, every child opened and
        # started by its owner's genesis, the split complete.
        lines = []
        report = SplitRun(admin.cluster, wait=60, progress=lines.append).run(4)
        assert report.resumed and report.state is SplitPhase.COMPLETE and report.complete
        barriers = {p.parent: p.barrier for p in report.parents}
        assert barriers[0] is not None and barriers[0] > 0 and barriers[1] is not None and barriers[1] >= 0
        assert [(c.child, c.state, c.genesis) for c in report.children] == [
            (2, OPEN, barriers[0] + 1),
            (3, OPEN, barriers[1] + 1),
        ]
        assert any(line.startswith("child 2 (parent 0): opened, its log starting at") for line in lines)
        assert epochs_of(admin).epoch(1).parents[0].high_water_mark == 0  # H(p) as first written
        assert epochs_of(admin).epoch(1).state is EpochState.COMPLETE

        # Once more: nothing changes; each parent's log holds one barrier, each child's one genesis.
        again = SplitRun(admin.cluster, wait=60).run(4)
        assert again.complete and {p.parent: p.barrier for p in again.parents} == barriers
        for parent, barrier in barriers.items():
            records = run_async(records_above(cluster, parent, -1))
            assert [r.transaction_id for r in split_records(records)] == [barrier]
            child_records = run_async(records_above(cluster, parent + 2, barrier))
            assert [r.transaction_id for r in split_records(child_records)] == [barrier + 1]

        # Every committed reader (Spark's source, the rebuild) reads the children too, and a cut
        # that reads a child past its genesis with its parent below the barrier is refused.
        plans = plan_live_on(admin.cluster)
        assert [(p.partition_id, p.high_water_mark, p.first_transaction_id) for p in plans] == [
            (0, barriers[0], 0),
            (1, barriers[1], 0),
            (2, barriers[0] + 1, barriers[0] + 1),  # a child's log starts at its genesis
            (3, barriers[1] + 1, barriers[1] + 1),
        ]
        value = LogSource(
            zookeeper=cluster.zookeeper_connect_string, cluster_root=cluster.root
        ).partition_epochs()
        assert value == epochs_of(admin)
        assert value.cut_problems({p.partition_id: p.high_water_mark for p in plans}) == []
        assert value.cut_problems({0: -1, 1: -1}) == []  # the children not read: a cut before the split
        (problem,) = value.cut_problems({0: barriers[0] - 1, 1: barriers[1], 2: barriers[0] + 1, 3: -1})
        assert problem.startswith(f"partition 2 is read up to {barriers[0] + 1}, beyond its genesis")

        # The replica commands take the children: read their marks, and give a child a replica
        # on a node added after the split (it holds the count at creation: it is grown first).
        (storage,) = cluster.storages
        marks = admin.storage.max_transaction_ids(storage.address, [2, 3])
        assert marks == {2: barriers[0] + 1, 3: barriers[1] + 1}
        with pytest.raises(ConfigurationError, match=r"partition 4 does not exist: .* by a split, 2, 3"):
            admin.storage.max_transaction_ids(storage.address, [4])
        directory = cluster.work_dir / "storage-added"
        with LocalStorageNode(directory, name="storage-added", insecure=True) as added:
            admin.storage.add(added.address, added.admin_port)
            assigned = admin.storage.assign(added.address, [3], force=True)
            assert assigned.changed == (3,)
            # Created empty, it is caught up from its peers: its log starts at the child's start
            # (a reset start, which a replica holding nothing may take), then copies the genesis.
            wait_until(
                lambda: admin.storage.max_transaction_ids(added.address, [3]) == {3: barriers[1] + 1},
                timeout=60,
                what="the added replica of child 3 to catch up to its genesis",
                interval=0.5,
            )
            admin.storage.unassign(added.address, [3], force=True, delete_storage_files=True)
            admin.storage.remove(added.address)


# ---- a cluster with ZooKeeper credentials per role ----


@pytest.fixture(scope="module")
def with_roles(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """A 2-partition cluster whose znodes have the ACL of each role (docs/design/zookeeper.md, "Roles")."""
    with LocalCluster(
        storages=1,
        servers=1,
        partitions=2,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path_factory.mktemp("split-run-roles"),
        delete_root=True,
        security=SecurityOptions(secure=False, zookeeper_auth=True),
        # A paused server keeps its member znode: its session outlasts the pause.
        processes=ProcessOptions(session_timeout=30.0),
    ) as local:
        local.wait_ready(60)
        yield local


def test_only_the_operators_with_an_admin_certificate_may_split_and_every_parent_needs_an_owner(
    with_roles: LocalCluster, tmp_path: Path
) -> None:
    certificates = make_cluster_certificates(tmp_path / "certificates")
    with connect(with_roles, Role.OPERATOR) as operator:
        untouched = snapshot(operator)
        for role in (Role.CLIENT, Role.SERVER):
            refusal = f"this session holds the {role.value}s'"
            with connect(with_roles, role) as caller, pytest.raises(SplitNotAuthorisedError, match=refusal):
                SplitRun(caller.cluster).run(4)
            assert snapshot(operator) == untouched
        # The command says the same, exit code 1.
        where = ["--zookeeper", with_roles.zookeeper_connect_string, "--root", with_roles.root]
        refused = CliRunner().invoke(
            app, ["cluster", "split", "--to", "4", *where], env=with_roles.zookeeper_env(Role.CLIENT)
        )
        assert refused.exit_code == 1, refused.output
        assert "needs the operators' ZooKeeper credential" in refused.output
        # The operators' credential with a certificate of the operator role: refused too.
        with pytest.raises(SplitNotAuthorisedError, match="urn:waltz:role:admin"):
            SplitRun(operator.cluster, tls=certificates.tls("operator")).run(4)
        # Planning it (the dry run's step 1) is not refused: the plan's notes say what a run needs.
        check = SplitRun(operator.cluster, tls=certificates.tls("operator")).check(4, planning=True)
        assert any("urn:waltz:role:admin" in note for note in check.notes), check.notes
        # Nor is an abort's dry run, which writes nothing either.
        planned = SplitRun(operator.cluster, tls=certificates.tls("operator")).abort(4, dry_run=True)
        assert any("urn:waltz:role:admin" in note for note in planned.notes), planned.notes
        with pytest.raises(SplitNotAuthorisedError, match="urn:waltz:role:admin"):
            SplitRun(operator.cluster, tls=certificates.tls("operator")).abort(4)
        assert snapshot(operator) == untouched
        assert check_authority(operator.cluster, certificates.tls("admin")) == ()
        assert snapshot(operator) == untouched

        # A parent without a live owner could never get its barrier: refused before anything.
        with_roles.stop_server(0)
        try:
            with pytest.raises(SplitStateError, match=r"partitions \[0, 1\] have no owner"):
                SplitRun(operator.cluster).run(4)
            assert snapshot(operator) == untouched
        finally:
            with_roles.restart_server(0)
        with_roles.wait_ready(60)

        # The operators split. The owner is paused: the wait runs out with parent 0 marked sealing
        # and no barrier, and the split stays there.
        with_roles.pause_server(0)
        try:
            stopped = SplitRun(operator.cluster, wait=1).run(4)
        finally:
            with_roles.resume_server(0)
        assert stopped.state is SplitPhase.SEALING and not stopped.complete
        assert [(p.sealing, p.barrier) for p in stopped.parents] == [(True, None), (False, None)]
        assert stopped.waiting is not None and "parents [0, 1] have no barrier yet" in stopped.waiting
        assert epochs_of(operator).epoch(1).parents[1].sealing is False

        # The same run again: the servers, with their role's credential, write B(p) and the
        # children's geneses.
        report = SplitRun(operator.cluster, tls=operator.tls, wait=60).run(4)
        assert report.resumed and report.state is SplitPhase.COMPLETE
        assert all(p.barrier is not None for p in report.parents), report
        assert [c.state for c in report.children] == [OPEN] * 2
        # Clients read the epochs and discovery.
        with connect(with_roles, Role.CLIENT) as client:
            assert epochs_of(client).epoch(1).parents[0].barrier == report.parents[0].barrier
            discovery = client.cluster.zk.get(client.cluster.paths.discovery)[0]
            assert DiscoveryParams.decode(discovery, "discovery").epoch == 1
