"""Where :meth:`StorageNode.run` runs a partition's work: its I/O thread, or the event loop for an
append while few sources append (store session streams, or partitions by default;
``storage.inlineAppends``, ``storage.inlineAppendStreams``); work of a partition stays in order
either way."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from waltz.services.storage.node import (
    DEFAULT_INLINE_APPEND_STREAMS,
    INLINE_MAX_BYTES,
    INLINE_QUIET_SECONDS,
    StorageNode,
)


def _open_node(
    path: Path, partitions: int, inline_append_streams: int = DEFAULT_INLINE_APPEND_STREAMS
) -> StorageNode:
    node = StorageNode(path, inline_appends=True, inline_append_streams=inline_append_streams)
    node.start()
    node.admin_open(str(uuid.uuid4()), partitions)
    for partition in range(partitions):
        node.set_assignment(partition, True)
    return node


@pytest.fixture
def node(tmp_path: Path) -> Iterator[StorageNode]:
    """A node with partitions 0 and 1 whose appends run on the loop only for one source at a time."""
    node = _open_node(tmp_path / "storage", 2, inline_append_streams=1)
    try:
        yield node
    finally:
        node.close()


def _thread_name() -> str:
    return threading.current_thread().name


def test_an_append_of_the_only_writing_partition_runs_on_the_loop(node: StorageNode) -> None:
    async def scenario() -> tuple[str, str, str]:
        loop_thread = _thread_name()
        append = await node.run(0, _thread_name, append_bytes=100)
        other = await node.run(0, _thread_name)  # not an append: always the I/O thread
        return loop_thread, append, other

    loop_thread, append, other = asyncio.run(scenario())
    assert append == loop_thread
    assert other.startswith("partition-0")
    assert node.inline_runs == 1


def test_a_large_append_goes_to_the_io_thread(node: StorageNode) -> None:
    """Writing and flushing many bytes would hold up the node's other streams: not on the loop."""

    async def scenario() -> tuple[str, str]:
        large = await node.run(0, _thread_name, append_bytes=INLINE_MAX_BYTES + 1)
        small = await node.run(0, _thread_name, append_bytes=INLINE_MAX_BYTES)
        return large, small

    large, small = asyncio.run(scenario())
    assert large.startswith("partition-0")
    assert not small.startswith("partition-")
    assert node.inline_runs == 1


def test_appends_go_to_the_io_thread_while_another_partition_appends(node: StorageNode) -> None:
    async def scenario() -> list[str]:
        names = [await node.run(1, _thread_name, append_bytes=100)]  # partition 1 alone: inline
        names.append(await node.run(0, _thread_name, append_bytes=100))  # 1 appended just now
        names.append(await node.run(1, _thread_name, append_bytes=100))  # and 0 too
        return names

    first, second, third = asyncio.run(scenario())
    assert not first.startswith("partition-")
    assert second.startswith("partition-0")
    assert third.startswith("partition-1")
    assert node.inline_runs == 1


def test_appends_run_inline_again_once_the_other_partition_is_quiet(node: StorageNode) -> None:
    async def scenario() -> tuple[str, str]:
        await node.run(1, _thread_name, append_bytes=100)
        busy = await node.run(0, _thread_name, append_bytes=100)
        await asyncio.sleep(INLINE_QUIET_SECONDS * 1.5)
        return busy, await node.run(0, _thread_name, append_bytes=100)

    busy, quiet = asyncio.run(scenario())
    assert busy.startswith("partition-0")
    assert not quiet.startswith("partition-")


def test_appends_of_several_partitions_from_one_stream_run_on_the_loop(node: StorageNode) -> None:
    """A server's shared stream carries every partition: its appends run inline one after another;
    a second stream appending at the same time sends both streams' appends to the I/O threads."""
    shared, other = object(), object()

    async def scenario() -> list[str]:
        names = [await node.run(0, _thread_name, append_bytes=100, source=shared)]
        names.append(await node.run(1, _thread_name, append_bytes=100, source=shared))
        names.append(await node.run(0, _thread_name, append_bytes=100, source=other))  # 2 streams
        names.append(await node.run(1, _thread_name, append_bytes=100, source=shared))
        return names

    first, second, third, fourth = asyncio.run(scenario())
    assert not first.startswith("partition-") and not second.startswith("partition-")
    assert third.startswith("partition-0") and fourth.startswith("partition-1")
    assert node.inline_runs == 2


def test_by_default_appends_of_up_to_two_streams_run_on_the_loop(tmp_path: Path) -> None:
    """One stream per server: 2 servers appending at once still append on the loop; a third
    stream sends every stream's appends to the I/O threads until the others are quiet again."""
    assert DEFAULT_INLINE_APPEND_STREAMS == 2
    node = _open_node(tmp_path / "storage", 3)
    streams = [object() for _ in range(3)]

    async def append(i: int) -> str:
        return await node.run(i, _thread_name, append_bytes=100, source=streams[i])

    async def scenario() -> tuple[list[str], list[str], str]:
        two = [await append(i) for i in range(2)]
        three = [await append(i) for i in (2, 0, 1)]  # the third stream, then the two again
        await asyncio.sleep(INLINE_QUIET_SECONDS * 1.5)
        return two, three, await append(2)

    try:
        two, three, quiet = asyncio.run(scenario())
    finally:
        node.close()
    assert not any(name.startswith("partition-") for name in two)
    assert [name.split("_")[0] for name in three] == [f"partition-{i}" for i in (2, 0, 1)]
    assert not quiet.startswith("partition-")
    assert node.inline_runs == 3


def test_inline_append_streams_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="inline_append_streams must be at least 1"):
        StorageNode(tmp_path / "storage", inline_appends=True, inline_append_streams=0)


def test_an_append_waits_behind_work_queued_on_the_partition_thread(node: StorageNode) -> None:
    """Order within a partition: an append never overtakes earlier work still on the I/O thread."""
    order: list[str] = []
    release = threading.Event()

    def slow() -> str:
        assert release.wait(10)
        order.append("slow")
        return _thread_name()

    def append() -> str:
        order.append("append")
        return _thread_name()

    async def scenario() -> tuple[str, str]:
        first = asyncio.ensure_future(node.run(0, slow))
        await asyncio.sleep(0)  # the slow work is on the partition's thread now
        second = asyncio.ensure_future(node.run(0, append, append_bytes=100))
        await asyncio.sleep(0.05)
        assert order == []  # the append did not run ahead on the loop
        release.set()
        return await first, await second

    slow_thread, append_thread = asyncio.run(scenario())
    assert order == ["slow", "append"]
    assert slow_thread.startswith("partition-0") and append_thread.startswith("partition-0")
    assert node.inline_runs == 0


def test_no_inline_append_while_the_node_lock_is_held(node: StorageNode) -> None:
    """An assignment change (or a close) holds the node lock: an append then takes the I/O thread."""
    held = threading.Event()
    done = threading.Event()

    def hold_lock() -> None:
        with node._lock:
            held.set()
            done.wait(10)

    asyncio.run(node.run(0, _thread_name))  # the partition's thread exists (made under the lock)
    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert held.wait(10)
        name = asyncio.run(node.run(0, _thread_name, append_bytes=100))
    finally:
        done.set()
        holder.join(10)
    assert name.startswith("partition-0")
    assert node.inline_runs == 0


def test_inline_appends_off_keeps_every_append_on_the_io_thread(tmp_path: Path) -> None:
    with StorageNode(tmp_path / "storage") as node:
        node.admin_open(str(uuid.uuid4()), 1)
        node.set_assignment(0, True)
        name = asyncio.run(node.run(0, _thread_name, append_bytes=100))
    assert name.startswith("partition-0")
    assert node.inline_runs == 0


def test_an_inline_append_raises_what_its_work_raises(node: StorageNode) -> None:
    def fail() -> None:
        raise ValueError("bad records")

    with pytest.raises(ValueError, match="bad records"):
        asyncio.run(node.run(0, fail, append_bytes=100))
    assert node.inline_runs == 1
    # The lock was released: the node still changes its assignment.
    node.set_assignment(1, False)
    assert node.assigned_partitions() == [0]


@pytest.mark.security
def test_an_admin_open_with_an_absurd_partition_count_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    from waltz.errors import ClusterKeyMismatchError
    from waltz.protocol.records import MAX_PARTITIONS
    from waltz.services.storage import format as fmt

    node = StorageNode(tmp_path / "node")
    node.start()
    try:
        for count in (0, MAX_PARTITIONS + 1, 2**31 - 1):
            with pytest.raises(ClusterKeyMismatchError, match=rf"cannot initialise with {count} partitions"):
                node.admin_open(str(uuid.uuid4()), count)
        assert not (tmp_path / "node" / fmt.CONTROL_FILE_NAME).exists()  # no control file was made
        node.admin_open(str(uuid.uuid4()), MAX_PARTITIONS)  # the limit itself is accepted
    finally:
        node.close()


def test_an_unassigned_partition_with_kept_files_stays_unassigned_after_a_restart(tmp_path: Path) -> None:
    """Unassigning keeps the files but marks them, so that the next start does not open the
    partition again (it is another node's now); assigning it again takes the files back."""
    from waltz.services.storage import format as fmt

    path = tmp_path / "storage"
    node = _open_node(path, 2)
    node.set_assignment(0, False)
    assert node.assigned_partitions() == [1]
    node.close()
    assert (path / "0" / fmt.UNASSIGNED_MARKER).exists()
    # An offline reader (waltz rebuild --storage-dir, the Spark source) passes over them too.
    from waltz.committed.plan import plan_offline

    assert [plan.partition_id for plan in plan_offline([str(path)], replicas=1)] == [1]
    restarted = StorageNode(path)
    restarted.start()
    try:
        assert restarted.assigned_partitions() == [1]
        restarted.set_assignment(0, True)
        assert restarted.assigned_partitions() == [0, 1]
        assert not (path / "0" / fmt.UNASSIGNED_MARKER).exists()
    finally:
        restarted.close()
    again = StorageNode(path)
    again.start()
    try:
        assert again.assigned_partitions() == [0, 1]
        again.set_assignment(1, False, delete_files=True)  # deleted: nothing left to mark
        assert not (path / "1").exists()
    finally:
        again.close()


def test_one_directory_serves_one_node(tmp_path: Path) -> None:
    """A second node on the same files would count as another replica of the same partitions."""
    from waltz.errors import ConfigurationError

    path = tmp_path / "storage"
    first = _open_node(path, 2)
    try:
        with pytest.raises(ConfigurationError, match="is in use by another storage node"):
            StorageNode(path).start()
    finally:
        first.close()
    with StorageNode(path) as second:  # the first one let it go
        assert second.assigned_partitions() == [0, 1]


def test_an_admin_open_does_not_create_a_control_file_over_partition_data(tmp_path: Path) -> None:
    """Partition data that appears without a control file after the node started (a restore of
    the partition directories alone) is refused by the initialising admin open too: a fresh
    control file would reset its fences and committed floor."""
    import shutil

    from waltz.errors import ConfigurationError
    from waltz.services.storage.control_file import ControlFile

    source = tmp_path / "source"
    _open_node(source, 1).close()
    path = tmp_path / "storage"
    with StorageNode(path) as node:
        shutil.copytree(source / "0", path / "0")
        files = {child.name: child.read_bytes() for child in (path / "0").iterdir()}
        with pytest.raises(ConfigurationError, match="holds partition data but no control file"):
            node.admin_open(str(uuid.uuid4()), 1)
        assert not ControlFile.path_in(path).exists()
        assert {child.name: child.read_bytes() for child in (path / "0").iterdir()} == files
    with pytest.raises(ConfigurationError, match=r"move the partition directories away to start empty"):
        StorageNode(path).start()
