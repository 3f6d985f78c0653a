"""The ``<root>/partitions/epochs`` znode of partition splits: its record form, each step of a split
by compare-and-set on a real ZooKeeper, the steps' refusals, a race for a barrier, and the ACL of
the role table (docs/design/splits.md "What ZooKeeper holds", "The handover";
docs/design/zookeeper.md "Compare-and-set everywhere", "Roles")."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError

from waltz.errors import ClusterNotFoundError, MetadataError, SplitStateError
from waltz.local.zookeeper import DockerZooKeeper, LocalZooKeeper
from waltz.metadata.epochs import (
    ChildProgress,
    Epoch,
    EpochState,
    ParentProgress,
    PartitionEpochs,
    PartitionEpochsZk,
)
from waltz.metadata.paths import ClusterPaths
from waltz.metadata.values import ClusterParams, ConnectionMetadata, GroupDescriptor, ReplicaAssignments
from waltz.metadata.zk import ClusterZk, Versioned
from waltz.metadata.zk_access import ClusterAccess
from waltz.metadata.zk_roles import ClusterRoles, RoleCredentials
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.metadata.zk_session import ZooKeeperAuthError, connect_zookeeper

Zk = LocalZooKeeper | DockerZooKeeper
PATH = "/r/partitions/epochs"

#: Epoch 1 (2 -> 4) complete, epoch 2 (4 -> 12) under way: every field takes a non-default value
#: somewhere.
SPLIT_TWICE = PartitionEpochs(
    2,
    (
        Epoch(
            1,
            4,
            2,
            EpochState.COMPLETE,
            {0: ParentProgress(-1, True, 0), 1: ParentProgress(40, True, 45)},
            {2: ChildProgress(True, 1), 3: ChildProgress(True, 46)},
        ),
        Epoch(
            2,
            12,
            4,
            EpochState.SEALING,
            {
                0: ParentProgress(7, True, 9),
                1: ParentProgress(50, True, None),
                2: ParentProgress(3, False, None),
                3: ParentProgress(60, True, 70),
            },
            {
                4: ChildProgress(True, 10),
                5: ChildProgress(False, None),
                6: ChildProgress(False, None),
                7: ChildProgress(True, None),
                8: ChildProgress(True, 10),
                9: ChildProgress(False, None),
                10: ChildProgress(False, None),
                11: ChildProgress(False, None),
            },
        ),
    ),
)


def create_cluster(
    zk: KazooClient, root: str, partitions: int, roles: ClusterRoles | None = None
) -> ClusterZk:
    cluster = ClusterZk(zk, root)
    cluster.create(
        ClusterParams("splitting", partitions, uuid.uuid4()),
        ReplicaAssignments({"h:1": tuple(range(partitions))}),
        GroupDescriptor({"h:1": 0}),
        ConnectionMetadata({"h:1": 2}),
        roles=roles,
    )
    return cluster


def raw(zk: KazooClient, root: str) -> tuple[bytes, int]:
    """The znode's bytes and version as ZooKeeper holds them."""
    data, stat = zk.get(ClusterPaths.of(root).epochs)
    return data, stat.version


# ---- the record form ----


def test_every_field_round_trips_and_the_znode_holds_the_documented_form() -> None:
    assert PartitionEpochs.decode(SPLIT_TWICE.encode(), PATH) == SPLIT_TWICE
    value = json.loads(SPLIT_TWICE.encode())
    assert value["format_version"] == 1 and value["initial_count"] == 2
    assert value["epochs"][0] == {
        "epoch": 1,
        "count": 4,
        "previous_count": 2,
        "state": "complete",
        "parents": {
            "0": {"high_water_mark": -1, "sealing": True, "barrier": 0},
            "1": {"high_water_mark": 40, "sealing": True, "barrier": 45},
        },
        "children": {"2": {"opened": True, "genesis": 1}, "3": {"opened": True, "genesis": 46}},
    }
    assert value["epochs"][1]["parents"]["1"] == {"high_water_mark": 50, "sealing": True, "barrier": None}
    assert value["epochs"][1]["children"]["5"] == {"opened": False, "genesis": None}


def test_the_documented_example_is_a_value_the_code_writes() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "design" / "splits.md").read_text()
    section = page.split("### The epochs znode's record form", 1)[1]
    example = section.split("```json\n", 1)[1].split("```", 1)[0]
    value = PartitionEpochs.decode(example.encode(), PATH)
    assert json.loads(value.encode()) == json.loads(example)
    assert value.unfinished is not None and value.unfinished.parents[0].barrier == 45


def test_the_helpers_name_the_current_epoch_its_parents_and_children() -> None:
    assert SPLIT_TWICE.current_number == 2 and SPLIT_TWICE.current_count == 12
    assert SPLIT_TWICE.unfinished is SPLIT_TWICE.epochs[1]
    assert [SPLIT_TWICE.count_of(n) for n in (0, 1, 2)] == [2, 4, 12]
    second = SPLIT_TWICE.epoch(2)
    assert second.factor == 3 and list(second.new_partitions) == list(range(4, 12))
    assert second.children_of(1) == (5, 9) and second.parent_of(9) == 1
    assert SPLIT_TWICE.epoch(1).children_of(0) == (2,) and not SPLIT_TWICE.epoch(1).unfinished
    never = PartitionEpochs(3)
    assert (never.current, never.current_number, never.current_count, never.unfinished) == (None, 0, 3, None)
    # The partitions that exist: those at creation and every child marked opened.
    assert SPLIT_TWICE.partition_ids == (0, 1, 2, 3, 4, 7, 8) and never.partition_ids == (0, 1, 2)
    with pytest.raises(SplitStateError, match="there is no epoch 3"):
        SPLIT_TWICE.epoch(3)
    with pytest.raises(SplitStateError, match="partition 4 is not a parent of epoch 2"):
        second.children_of(4)
    with pytest.raises(SplitStateError, match="partition 3 is not a new child of epoch 2"):
        second.parent_of(3)


def _edited(edit: Callable[[dict[str, Any]], None]) -> bytes:
    value = json.loads(SPLIT_TWICE.encode())
    edit(value)
    return json.dumps(value).encode()


def _set(*keys: Any, to: Any) -> Callable[[dict[str, Any]], None]:
    def edit(value: dict[str, Any]) -> None:
        for key in keys[:-1]:
            value = value[key]
        value[keys[-1]] = to

    return edit


def _drop(*keys: Any) -> Callable[[dict[str, Any]], None]:
    def edit(value: dict[str, Any]) -> None:
        for key in keys[:-1]:
            value = value[key]
        del value[keys[-1]]

    return edit


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "does not hold JSON"),
        (b"[1, 2]", "holds list, expected an object"),
        (_edited(_set("format_version", to=2)), "has format version 2; this waltz-py reads 1"),
        (_edited(_drop("format_version")), "lacks the field 'format_version'"),
        (_edited(_set("format_version", to=1.0)), "has format version 1.0; this waltz-py reads 1"),
        (_edited(_set("format_version", to=True)), "has format version True; this waltz-py reads 1"),
        (_edited(_drop("initial_count")), "lacks the field 'initial_count'"),
        (_edited(_set("initial_count", to=0)), "field 'initial_count' is 0"),
        (_edited(_set("epochs", to={})), "field 'epochs' is {}, expected list"),
        (_edited(_set("epochs", 0, to=7)), r"\(epochs\[0\]\) is 7, expected an object"),
        (_edited(_set("epochs", 1, "epoch", to=3)), r"\(epochs\[1\]\): field 'epoch' is 3, expected 2"),
        (_edited(_set("epochs", 0, "count", to=3)), "field 'count' is 3, not a whole multiple"),
        (_edited(_set("epochs", 1, "previous_count", to=2)), "field 'previous_count' is 2, expected 4"),
        (_edited(_set("epochs", 1, "state", to="sealed")), "field 'state' is 'sealed', expected one of"),
        (_edited(_set("epochs", 0, "state", to="sealing")), "field 'state' is 'sealing', but a later epoch"),
        (_edited(_set("epochs", 1, "state", to="preparing")), "'preparing' while a parent is sealing"),
        (_edited(_set("epochs", 1, "state", to="complete")), "'complete' while a child has no genesis"),
        (_edited(_drop("epochs", 1, "parents", "3")), r"field 'parents' holds partitions \[0, 1, 2\]"),
        (_edited(_set("epochs", 1, "children", "x", to={})), "field 'children' holds 'x'"),
        (
            _edited(_set("epochs", 1, "parents", "1", "barrier", to="51")),
            r"\(parent 1\): field 'barrier' is '51', expected an integer",
        ),
        (
            _edited(_set("epochs", 1, "parents", "1", "sealing", to=1)),
            r"\(parent 1\): field 'sealing' is 1, expected bool",
        ),
        (_edited(_drop("epochs", 1, "parents", "1", "barrier")), "lacks the field 'barrier'"),
        (
            _edited(_set("epochs", 1, "parents", "2", "high_water_mark", to=-2)),
            "field 'high_water_mark' is -2",
        ),
        (_edited(_set("epochs", 1, "parents", "3", "barrier", to=60)), "field 'barrier' is 60, not above"),
        (
            _edited(_set("epochs", 1, "parents", "2", "barrier", to=9)),
            "field 'barrier' is set but the parent is not sealing",
        ),
        (
            _edited(_set("epochs", 1, "children", "5", "opened", to=True)),
            r"\(child 5\): field 'opened' is true before its parent has a barrier",
        ),
        (
            _edited(_set("epochs", 1, "children", "4", "genesis", to=11)),
            r"\(child 4\): field 'genesis' is 11",
        ),
        (
            _edited(_set("epochs", 1, "children", "8", "opened", to=False)),
            r"\(child 8\): field 'genesis' is 10, expected an opened child's genesis",
        ),
    ],
)
def test_a_malformed_value_is_refused_naming_the_znode_and_the_field(data: bytes, message: str) -> None:
    with pytest.raises(MetadataError, match=message) as raised:
        PartitionEpochs.decode(data, PATH)
    assert f"znode {PATH}" in str(raised.value)


# ---- the steps on a real ZooKeeper ----


def test_a_split_runs_every_step_by_compare_and_set(zk_client: KazooClient, zk_root: str) -> None:
    epochs = PartitionEpochsZk(zk_client, ClusterPaths.of(zk_root))
    with pytest.raises(ClusterNotFoundError):
        epochs.read()
    create_cluster(zk_client, zk_root, 2)
    assert epochs.read() == Versioned(PartitionEpochs(2), -1)
    prepared = epochs.prepare(4, {0: 10, 1: -1})
    assert prepared.version == 0 and raw(zk_client, zk_root) == (prepared.value.encode(), 0)
    assert prepared.value.epochs == (
        Epoch(
            1,
            4,
            2,
            EpochState.PREPARING,
            {0: ParentProgress(10), 1: ParentProgress(-1)},
            {2: ChildProgress(), 3: ChildProgress()},
        ),
    )
    sealing = epochs.mark_sealing(1, 0).value.epoch(1)
    assert (
        sealing.state is EpochState.SEALING and sealing.parents[0].sealing and not sealing.parents[1].sealing
    )
    assert epochs.set_barrier(1, 0, 11).value.epoch(1).parents[0] == ParentProgress(10, True, 11)
    assert epochs.mark_opened(1, 2).value.epoch(1).children[2] == ChildProgress(True, None)
    assert epochs.set_genesis(1, 2, 12).value.epoch(1).children[2] == ChildProgress(True, 12)
    epochs.mark_sealing(1, 1)
    epochs.set_barrier(1, 1, 0)
    epochs.mark_opened(1, 3)
    epochs.set_genesis(1, 3, 1)
    done = epochs.complete(1)
    assert done.value.epoch(1).state is EpochState.COMPLETE and done.value.unfinished is None
    assert done.version == 9 and epochs.read() == done
    # The next split starts from the new count.
    again = epochs.prepare(12, {p: p for p in range(4)})
    assert again.value.current_number == 2 and again.value.epoch(2).previous_count == 4
    assert again.value.epoch(2).children_of(3) == (7, 11)
    assert PartitionEpochs.decode(raw(zk_client, zk_root)[0], "x") == again.value


def test_each_step_called_again_leaves_the_znode_as_it_was(zk_client: KazooClient, zk_root: str) -> None:
    create_cluster(zk_client, zk_root, 2)
    epochs = PartitionEpochsZk(zk_client, ClusterPaths.of(zk_root))
    steps: list[Callable[[], Versioned[PartitionEpochs]]] = [
        lambda: epochs.prepare(4, {0: 5, 1: 6}),
        lambda: epochs.mark_sealing(1, 0),
        lambda: epochs.set_barrier(1, 0, 8),
        lambda: epochs.mark_opened(1, 2),
        lambda: epochs.set_genesis(1, 2, 9),
        lambda: epochs.mark_sealing(1, 1),
        lambda: epochs.set_barrier(1, 1, 7),
        lambda: epochs.mark_opened(1, 3),
        lambda: epochs.set_genesis(1, 3, 8),
        lambda: epochs.complete(1),
    ]
    for number, step in enumerate(steps):
        first = step()
        written = raw(zk_client, zk_root)
        assert written == (first.value.encode(), number), number
        assert step() == first and raw(zk_client, zk_root) == written, number
    # A resumed split finds its epoch, complete, whatever high-water marks it passes now.
    assert epochs.prepare(4, {0: 100, 1: 100}) == first and raw(zk_client, zk_root) == written
    for step in steps[1:]:
        assert step() == first
    assert raw(zk_client, zk_root) == written


def test_abort_deletes_the_epoch_only_while_no_parent_is_sealing(
    zk_client: KazooClient, zk_root: str
) -> None:
    create_cluster(zk_client, zk_root, 3)
    epochs = PartitionEpochsZk(zk_client, ClusterPaths.of(zk_root))
    epochs.prepare(6, {0: 1, 1: 2, 2: 3})
    aborted = epochs.abort(1)
    assert aborted.value == PartitionEpochs(3) and aborted.version == 1
    assert epochs.abort(1) == aborted and raw(zk_client, zk_root) == (PartitionEpochs(3).encode(), 1)
    # Another count may be prepared once the first is aborted, and is the one held.
    assert epochs.prepare(9, {0: 4, 1: 5, 2: 6}).value.epoch(1).count == 9
    epochs.mark_sealing(1, 2)
    before = raw(zk_client, zk_root)
    with pytest.raises(SplitStateError, match=r"parents \[2\] are sealing"):
        epochs.abort(1)
    assert raw(zk_client, zk_root) == before


@pytest.mark.parametrize(
    ("steps", "refused", "message"),
    [
        ((), lambda e: e.prepare(5, {0: 1, 1: 1}), "whole multiple of at least 2 of it, not 5"),
        ((), lambda e: e.prepare(2, {0: 1, 1: 1}), "whole multiple of at least 2 of it, not 2"),
        ((), lambda e: e.prepare(1, {0: 1, 1: 1}), "whole multiple of at least 2 of it, not 1"),
        ((), lambda e: e.prepare(4, {0: 1}), r"missing \[1\], not parents \[\]"),
        ((), lambda e: e.prepare(4, {0: 1, 1: 1, 2: 1}), r"missing \[\], not parents \[2\]"),
        ((), lambda e: e.prepare(4, {0: 1, 1: -2}), "high-water mark of parent 1 is -2"),
        ((), lambda e: e.mark_sealing(1, 0), "there is no epoch 1"),
        (("prepare",), lambda e: e.prepare(6, {0: 1, 1: 1}), "split to epoch 1 .4 partitions. is unfinished"),
        (("prepare",), lambda e: e.mark_sealing(1, 2), "partition 2 is not a parent of epoch 1"),
        (("prepare",), lambda e: e.set_barrier(1, 0, 20), "parent 0 is not sealing"),
        (
            ("prepare", "seal"),
            lambda e: e.set_barrier(1, 0, 10),
            "barrier 10 is not above its high-water mark 10",
        ),
        (("prepare", "seal", "barrier"), lambda e: e.set_barrier(1, 0, 21), "barrier is 20, not 21"),
        (("prepare", "seal"), lambda e: e.mark_opened(1, 2), "child 2 opens after its parent 0's barrier"),
        (("prepare", "seal"), lambda e: e.set_genesis(1, 2, 21), "parent 0's barrier, which is not known"),
        (("prepare", "seal", "barrier"), lambda e: e.set_genesis(1, 2, 21), "child 2 is not opened"),
        (("prepare", "seal", "barrier"), lambda e: e.mark_opened(1, 1), "1 is not a new child of epoch 1"),
        (
            ("prepare", "seal", "barrier", "open"),
            lambda e: e.set_genesis(1, 2, 22),
            "genesis is at 21, its parent 0's barrier plus one, not 22",
        ),
        (
            ("prepare", "seal", "barrier", "open"),
            lambda e: e.complete(1),
            r"children \[2, 3\] have no genesis",
        ),
        (("prepare", "seal", "barrier", "open", "genesis"), lambda e: e.complete(1), r"children \[3\]"),
        (("prepare", "seal"), lambda e: e.abort(1), "cannot be aborted"),
    ],
)
def test_a_refused_step_names_why_and_leaves_the_znode(
    zk_client: KazooClient,
    zk_root: str,
    steps: tuple[str, ...],
    refused: Callable[[PartitionEpochsZk], object],
    message: str,
) -> None:
    create_cluster(zk_client, zk_root, 2)
    epochs = PartitionEpochsZk(zk_client, ClusterPaths.of(zk_root))
    made = {
        "prepare": lambda: epochs.prepare(4, {0: 10, 1: 10}),
        "seal": lambda: epochs.mark_sealing(1, 0),
        "barrier": lambda: epochs.set_barrier(1, 0, 20),
        "open": lambda: epochs.mark_opened(1, 2),
        "genesis": lambda: epochs.set_genesis(1, 2, 21),
    }
    for step in steps:
        made[step]()
    before = epochs.read()
    with pytest.raises(SplitStateError, match=message):
        refused(epochs)
    assert epochs.read() == before
    if steps:
        assert raw(zk_client, zk_root) == (before.value.encode(), before.version)


# ---- two writers ----


class SlowReader(PartitionEpochsZk):
    """A writer that, after its first read, lets ``meanwhile`` run before it writes: the other
    writer's compare-and-set lands between this one's read and its write."""

    def __init__(self, zk: KazooClient, paths: ClusterPaths, meanwhile: Callable[[], object]) -> None:
        super().__init__(zk, paths)
        self.meanwhile: Callable[[], object] | None = meanwhile
        self.reads = 0

    def read(self, watch: Callable[..., None] | None = None) -> Versioned[PartitionEpochs]:
        value = super().read(watch)
        self.reads += 1
        if self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()
        return value


@pytest.fixture
def second_session(zookeeper: Zk, zk_root: str) -> Iterator[KazooClient]:
    client = connect_zookeeper(zookeeper.connect_string)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def test_a_writer_that_lost_the_race_for_a_barrier_reads_again_and_is_refused(
    zk_client: KazooClient, second_session: KazooClient, zk_root: str
) -> None:
    paths = ClusterPaths.of(zk_root)
    create_cluster(zk_client, zk_root, 2)
    first = PartitionEpochsZk(zk_client, paths)
    first.prepare(4, {0: 10, 1: 10})
    first.mark_sealing(1, 0)
    late = SlowReader(second_session, paths, lambda: first.set_barrier(1, 0, 11))
    with pytest.raises(SplitStateError, match="barrier is 11, not 12"):
        late.set_barrier(1, 0, 12)
    assert late.reads == 2  # its write met the version the other writer moved, and it read again
    assert first.read().value.epoch(1).parents[0].barrier == 11
    # Writing the same barrier after losing the race is no error: the barrier is the one found.
    same = SlowReader(second_session, paths, lambda: first.set_barrier(1, 1, 30))
    first.mark_sealing(1, 1)
    assert same.set_barrier(1, 1, 30).value.epoch(1).parents[1].barrier == 30 and same.reads == 2


def test_two_sessions_setting_barriers_at_once_leave_one_winner_per_parent(
    zk_client: KazooClient, second_session: KazooClient, zk_root: str
) -> None:
    parents = 12
    paths = ClusterPaths.of(zk_root)
    create_cluster(zk_client, zk_root, parents)
    writers = [PartitionEpochsZk(zk_client, paths), PartitionEpochsZk(second_session, paths)]
    writers[0].prepare(2 * parents, dict.fromkeys(range(parents), 100))
    for parent in range(parents):
        writers[1].mark_sealing(1, parent)
    start = threading.Barrier(2, timeout=30)
    outcomes: dict[int, list[tuple[int, str]]] = {0: [], 1: []}

    def race(index: int) -> None:
        for parent in range(parents):
            start.wait()
            try:
                writers[index].set_barrier(1, parent, 200 + index)
                outcomes[index].append((parent, "won"))
            except SplitStateError as error:
                outcomes[index].append((parent, str(error)))

    threads = [threading.Thread(target=race, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    epoch = writers[0].read().value.epoch(1)
    for parent in range(parents):
        results = {index: dict(outcomes[index])[parent] for index in range(2)}
        winners = [index for index, result in results.items() if result == "won"]
        assert len(winners) == 1, results
        loser = 1 - winners[0]
        assert f"barrier is {200 + winners[0]}, not {200 + loser}" in results[loser]
        assert epoch.parents[parent].barrier == 200 + winners[0]


# ---- ACLs ----


@pytest.fixture
def credentials(zookeeper: Zk, zk_root: str) -> Iterator[RoleCredentials]:
    """Role credentials; the root is deleted at the end with the operator's."""
    made = RoleCredentials.generate()
    yield made
    cleaner = KazooClient(
        hosts=zookeeper.connect_string, auth_data=[("digest", made.operator), ("digest", "single:s3cret")]
    )
    cleaner.start(timeout=10)
    try:
        with contextlib.suppress(NoNodeError):
            cleaner.delete(zk_root, recursive=True)
    finally:
        cleaner.stop()
        cleaner.close()


@contextlib.contextmanager
def session(zookeeper: Zk, *digests: str) -> Iterator[KazooClient]:
    client = connect_zookeeper(zookeeper.connect_string, security=ZooKeeperSecurity(digests[0]))
    for digest in digests[1:]:
        client.add_auth("digest", digest)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def test_servers_and_operators_write_the_epochs_and_clients_only_read_them(
    zookeeper: Zk, zk_root: str, credentials: RoleCredentials
) -> None:
    paths = ClusterPaths.of(zk_root)
    roles = credentials.identities()
    with (
        session(zookeeper, credentials.operator) as operator,
        session(zookeeper, credentials.server) as server,
        session(zookeeper, credentials.client) as client,
    ):
        create_cluster(operator, zk_root, 2, roles)
        with pytest.raises(ZooKeeperAuthError):
            PartitionEpochsZk(server, paths).prepare(4, {0: 1, 1: 1})  # only operators start a split
        assert client.exists(paths.partitions_parent) is None
        PartitionEpochsZk(operator, paths).prepare(4, {0: 1, 1: 1})
        for path in (paths.partitions_parent, paths.epochs):
            assert set(operator.get_acls(path)[0]) == set(roles.acl_for(paths.relative(path)))
        PartitionEpochsZk(operator, paths).mark_sealing(1, 0)
        PartitionEpochsZk(server, paths).set_barrier(1, 0, 2)  # a parent's owner writes its barrier
        readers = PartitionEpochsZk(client, paths)
        assert readers.read().value.epoch(1).parents[0].barrier == 2
        before = raw(operator, zk_root)
        with pytest.raises(ZooKeeperAuthError):
            readers.mark_sealing(1, 1)
        with pytest.raises(NoAuthError):
            client.set(paths.epochs, b"{}", version=before[1])
        with pytest.raises(NoAuthError):
            client.delete(paths.epochs)
        assert raw(operator, zk_root) == before
        assert ClusterZk(operator, zk_root).access.unknown_children() == []  # verify knows them
        # The root check of every role still passes with the new znodes.
        for who in (operator, server, client):
            assert ClusterZk(who, zk_root).check_security() == roles


def test_secure_gives_the_epochs_the_role_tables_acl(
    zookeeper: Zk, zk_root: str, credentials: RoleCredentials
) -> None:
    paths = ClusterPaths.of(zk_root)
    roles = credentials.identities()
    with session(zookeeper, "single:s3cret") as single:
        create_cluster(single, zk_root, 2)
        PartitionEpochsZk(single, paths).prepare(4, {0: 1, 1: 1})
        assert single.get_acls(paths.epochs)[0] == ZooKeeperSecurity("single:s3cret").acl()
        single.add_auth("digest", credentials.operator)
        ClusterAccess(single, paths).secure(roles)
        for path in (paths.partitions_parent, paths.epochs):
            assert set(single.get_acls(path)[0]) == set(roles.acl_for(paths.relative(path)))
    with session(zookeeper, credentials.client) as client:
        assert PartitionEpochsZk(client, paths).read().value.epoch(1).count == 4


def test_a_cut_reading_a_child_past_its_genesis_needs_its_parent_at_its_barrier() -> None:
    """docs/design/splits.md "Spark across a split": a child read beyond its genesis needs its
    parent read at least to B(p); a child read only to its barrier (nothing of it) needs nothing."""
    value = (
        PartitionEpochs(2)
        .prepare(4, {0: 5, 1: 3})
        .mark_sealing(1, 0)
        .set_barrier(1, 0, 9)
        .mark_sealing(1, 1)
        .set_barrier(1, 1, 7)
        .mark_opened(1, 2)
        .set_genesis(1, 2, 10)
    )
    assert value.cut_problems({0: 9, 1: 7, 2: 10, 3: 8}) == []
    assert value.cut_problems({0: 3, 1: 3, 2: 9, 3: 7}) == []  # the children's logs not read
    assert value.cut_problems({0: 9, 1: 6}) == []  # child 3 not read at all
    problems = value.cut_problems({0: 8, 1: 6, 2: 10, 3: 8})
    assert problems == [
        "partition 2 is read up to 10, beyond its genesis at 10, but its parent 0 only up to 8, "
        "below its barrier 9",
        "partition 3 is read up to 8, beyond its genesis at 8, but its parent 1 only up to 6, "
        "below its barrier 7",
    ]
