"""The control file: creation, alternating partition-info structs, torn structs, fences, growing to a
higher partition count."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest

from waltz.errors import CorruptDataError
from waltz.services.storage import format as fmt
from waltz.services.storage.control_file import ControlFile


def struct_offset(partition_id: int, slot: int) -> int:
    return (
        fmt.HEADER_SIZE + partition_id * fmt.PARTITION_INFO_SIZE + 4 + slot * fmt.PARTITION_INFO_STRUCT_SIZE
    )


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_create_and_reopen(tmp_path: Path) -> None:
    key = uuid.uuid4()
    with ControlFile.create(tmp_path, key, 3) as control:
        assert control.cluster_key == key
        assert control.num_partitions == 3
        assert control.partition_info(2) == fmt.PartitionInfo(-1, -1, -1)
        assert control.fence(2) == -1
    path = ControlFile.path_in(tmp_path)
    assert path.stat().st_size == fmt.HEADER_SIZE + 3 * fmt.PARTITION_INFO_SIZE + 3 * 2 * fmt.FENCE_SLOT_SIZE
    with ControlFile.open(tmp_path) as control:
        assert control.cluster_key == key
        assert control.header.version == fmt.FORMAT_VERSION
    with pytest.raises(FileExistsError):
        ControlFile.create(tmp_path, key, 3)


def test_updates_alternate_and_survive_reopen(tmp_path: Path) -> None:
    with ControlFile.create(tmp_path, uuid.uuid4(), 2) as control:
        control.set_partition_info(1, fmt.PartitionInfo(5, 10, 9))
        control.set_partition_info(1, fmt.PartitionInfo(6, 20, 20))
    raw = ControlFile.path_in(tmp_path).read_bytes()
    # The two updates went to different structs.
    structs = {
        fmt.decode_partition_info_struct(1, raw[struct_offset(1, i) : struct_offset(1, i) + 28])
        for i in (0, 1)
    }
    assert structs == {fmt.PartitionInfo(5, 10, 9), fmt.PartitionInfo(6, 20, 20)}
    with ControlFile.open(tmp_path) as control:
        assert control.partition_info(1) == fmt.PartitionInfo(6, 20, 20)
        assert control.partition_info(0) == fmt.PartitionInfo(-1, -1, -1)
        assert control.fence(1) == 6


def test_torn_struct_falls_back_to_the_other(tmp_path: Path) -> None:
    with ControlFile.create(tmp_path, uuid.uuid4(), 1) as control:
        control.set_partition_info(0, fmt.PartitionInfo(5, 10, 9))
        control.set_partition_info(0, fmt.PartitionInfo(6, 20, 20))
        newest_slot = 1 - 1  # first update went to slot 1, the second to slot 0
    path = ControlFile.path_in(tmp_path)
    flip(path, struct_offset(0, newest_slot) + 3)
    with ControlFile.open(tmp_path) as control:
        # Rolled back to the older struct.
        assert control.partition_info(0) == fmt.PartitionInfo(5, 10, 9)
        # The next write goes into the torn slot and wins on the next open.
        control.set_partition_info(0, fmt.PartitionInfo(7, 30, 30))
    with ControlFile.open(tmp_path) as control:
        assert control.partition_info(0) == fmt.PartitionInfo(7, 30, 30)


def test_both_structs_corrupt_fails_that_partition_only(tmp_path: Path) -> None:
    with ControlFile.create(tmp_path, uuid.uuid4(), 2):
        pass
    path = ControlFile.path_in(tmp_path)
    flip(path, struct_offset(1, 0) + 1)
    flip(path, struct_offset(1, 1) + 1)
    with ControlFile.open(tmp_path) as control:
        assert control.partition_info(0) == fmt.PartitionInfo(-1, -1, -1)
        with pytest.raises(CorruptDataError, match="both partition-info structs"):
            control.partition_info(1)


def test_fence_is_persisted_and_survives_a_torn_slot(tmp_path: Path) -> None:
    with ControlFile.create(tmp_path, uuid.uuid4(), 1) as control:
        control.set_fence(0, 3)
        control.set_fence(0, 4)
        with pytest.raises(ValueError, match="not above"):
            control.set_fence(0, 4)
    with ControlFile.open(tmp_path) as control:
        assert control.fence(0) == 4
        # Last session info is unchanged by fencing.
        assert control.partition_info(0).session_id == -1
    fence_start = fmt.HEADER_SIZE + fmt.PARTITION_INFO_SIZE
    path = ControlFile.path_in(tmp_path)
    raw = path.read_bytes()
    slots = [fmt.decode_fence_slot(0, raw[fence_start + i * 12 : fence_start + i * 12 + 12]) for i in (0, 1)]
    newest = slots.index(4)
    flip(path, fence_start + newest * 12 + 2)
    with ControlFile.open(tmp_path) as control:
        assert control.fence(0) == 3  # the torn write was never acknowledged: fall back


def test_reset_fence_lowers_both_slots_and_the_partition_info_durably(tmp_path: Path) -> None:
    """The operator's set-fence: the highest valid slot wins on load, so both slots (and both
    partition-info structs, when their session is above the new fence) are rewritten."""
    with ControlFile.create(tmp_path, uuid.uuid4(), 2) as control:
        control.set_fence(0, 7)
        control.set_partition_info(0, fmt.PartitionInfo(7, 40, 38))
        control.set_fence(0, 2**62)
        control.set_partition_info(0, fmt.PartitionInfo(2**62, 50, 41))
        reset = control.reset_fence(0, 9)
        assert (reset.previous_fence, reset.fence) == (2**62, 9)
        assert (reset.previous_last_session_id, reset.last_session_id) == (2**62, 9)
        with pytest.raises(ValueError, match="at least -1"):
            control.reset_fence(0, -2)
    with ControlFile.open(tmp_path) as control:
        assert control.fence(0) == 9
        assert control.partition_info(0) == fmt.PartitionInfo(9, 50, 41)
        assert control.fence(1) == -1  # other partitions untouched
        control.set_fence(0, 10)  # writers raise it again from there
        reset = control.reset_fence(0, 12)  # raising works too; the info stays below it
        assert (reset.previous_fence, reset.fence, reset.last_session_id) == (10, 12, 9)
    with ControlFile.open(tmp_path) as control:
        assert (control.fence(0), control.partition_info(0).session_id) == (12, 9)


def test_lowering_the_low_water_mark_rewrites_both_structs_and_a_half_done_one_keeps_the_old(
    tmp_path: Path,
) -> None:
    """The operator's truncation below the committed transactions: the highest struct wins on load,
    so both are rewritten with the lower marks and the same session; a crash after the first write
    leaves the old marks in force (docs/format.md, "Which struct is current, and how updates are written")."""
    with ControlFile.create(tmp_path, uuid.uuid4(), 2) as control:
        control.set_partition_info(0, fmt.PartitionInfo(5, 30, 30))
        control.set_partition_info(0, fmt.PartitionInfo(6, 40, 38))
        assert control.lower_low_water_mark(0, 50) == fmt.PartitionInfo(6, 40, 38)  # not lower: kept
        assert control.lower_low_water_mark(0, 12) == fmt.PartitionInfo(6, 12, 12)
        with pytest.raises(ValueError, match="cannot be -2"):
            control.lower_low_water_mark(0, -2)
    with ControlFile.open(tmp_path) as control:
        assert control.partition_info(0) == fmt.PartitionInfo(6, 12, 12)
        assert control.partition_info(1) == fmt.PartitionInfo(-1, -1, -1)
    # Half done: only the struct that was not current holds the lower marks.
    (tmp_path / "half").mkdir()
    with ControlFile.create(tmp_path / "half", uuid.uuid4(), 1) as control:
        control.set_partition_info(0, fmt.PartitionInfo(6, 40, 38))  # slot 1 current
    half = ControlFile.path_in(tmp_path / "half")
    data = bytearray(half.read_bytes())
    lowered = fmt.encode_partition_info_struct(0, fmt.PartitionInfo(6, 12, 12))
    data[struct_offset(0, 0) : struct_offset(0, 0) + len(lowered)] = lowered
    half.write_bytes(bytes(data))
    with ControlFile.open(tmp_path / "half") as control:
        assert control.partition_info(0) == fmt.PartitionInfo(6, 40, 38)


def test_truncated_or_garbage_file_is_refused(tmp_path: Path) -> None:
    with ControlFile.create(tmp_path, uuid.uuid4(), 4):
        pass
    path = ControlFile.path_in(tmp_path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CorruptDataError, match="4 partitions need"):
        ControlFile.open(tmp_path)
    path.write_bytes(b"\x00" * 10)
    with pytest.raises(CorruptDataError, match="expected 128"):
        ControlFile.open(tmp_path)


def test_growing_keeps_every_partition_byte_for_byte_and_adds_new_ones(tmp_path: Path) -> None:
    key = uuid.uuid4()
    path = ControlFile.path_in(tmp_path)
    with ControlFile.create(tmp_path, key, 2) as control:
        control.set_partition_info(0, fmt.PartitionInfo(5, 10, 9))
        control.set_partition_info(1, fmt.PartitionInfo(3, 4, 4))
        control.set_fence(1, 8)
        before = path.read_bytes()
        assert control.grow(4) is True
        assert control.num_partitions == 4
        # What each partition held is the same; the new ones are as a new node's.
        assert control.partition_info(0) == fmt.PartitionInfo(5, 10, 9)
        assert (control.partition_info(1), control.fence(1)) == (fmt.PartitionInfo(3, 4, 4), 8)
        for pid in (2, 3):
            assert (control.partition_info(pid), control.fence(pid)) == (fmt.PartitionInfo(-1, -1, -1), -1)
        # Writes after the growth go to the new file, at the new layout's offsets.
        control.set_partition_info(3, fmt.PartitionInfo(9, 46, 46))
        control.set_fence(1, 11)
        control.set_fence(2, 12)
        assert control.grow(4) is False
        with pytest.raises(ValueError, match="cannot become 3"):
            control.grow(3)
    after = path.read_bytes()
    assert (len(before), len(after)) == (fmt.control_file_size(2), fmt.control_file_size(4))
    # Partitions 0 and 1's entries (their structs), untouched since, are the same bytes.
    entries = slice(fmt.HEADER_SIZE, fmt.HEADER_SIZE + 2 * fmt.PARTITION_INFO_SIZE)
    assert after[entries] == before[entries]
    old_header = fmt.ControlFileHeader.decode(before, str(path))
    assert fmt.ControlFileHeader.decode(after, str(path)) == dataclasses.replace(old_header, num_partitions=4)
    with ControlFile.open(tmp_path) as control:
        assert (control.cluster_key, control.num_partitions) == (key, 4)
        assert control.partition_info(0) == fmt.PartitionInfo(5, 10, 9)
        assert (control.partition_info(1), control.fence(1)) == (fmt.PartitionInfo(3, 4, 4), 11)
        assert (control.partition_info(2), control.fence(2)) == (fmt.PartitionInfo(-1, -1, -1), 12)
        assert (control.partition_info(3), control.fence(3)) == (fmt.PartitionInfo(9, 46, 46), 9)
    assert not path.with_suffix(".ctl.tmp").exists()
