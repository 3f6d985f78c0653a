"""Fuzzing a storage node's files as its start-up and ``waltz disk verify`` read them.

A real partition (control file, several segments with their index files) is written by the
storage code, one of its files is damaged (bytes overwritten, the end cut off, garbage appended),
and then the storage node's own reading path opens it: :meth:`ControlFile.open`,
:meth:`StoragePartition.open` (start-up recovery) and :meth:`StoragePartition.read_records`, and
``waltz disk verify`` (:func:`verify_partition`).

Properties: the only error is ``CorruptDataError`` naming a file of the storage directory; every
record a read returns is one that was written (damage is never served); ``waltz disk verify``
never raises, and reports an ERROR whenever start-up refuses the partition.
"""

from __future__ import annotations

import tempfile
import tracemalloc
import uuid
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from support.fuzz_settings import fuzz_settings

from waltz.errors import CorruptDataError
from waltz.protocol.records import Record, ReqId
from waltz.services.storage import format as fmt
from waltz.services.storage.control_file import ControlFile
from waltz.services.storage.inspect import verify_partition, verify_storage
from waltz.services.storage.inspect.report import Severity
from waltz.services.storage.storage_partition import StoragePartition

pytestmark = pytest.mark.fuzz

KEY = uuid.UUID("01234567-89ab-cdef-0123-456789abcdef")
#: Small segments and checkpoints, so that a few records make several segments and checkpoints.
SEGMENT_THRESHOLD = 400
CHECKPOINT_INTERVAL = 3


def write_partition(directory: Path, batches: list[list[bytes]]) -> list[Record]:
    """Create a storage directory with partition 0 holding the batches; return the records."""
    records: list[Record] = []
    with ControlFile.create(directory, KEY, 1) as control:
        partition = StoragePartition.create(
            directory / "0",
            0,
            control,
            segment_size_threshold=SEGMENT_THRESHOLD,
            checkpoint_interval=CHECKPOINT_INTERVAL,
        )
        try:
            for batch in batches:
                new = [
                    Record.create(len(records) + i, ReqId(1, 1, 0, len(records) + i), i, data)
                    for i, data in enumerate(batch)
                ]
                partition.append(new)
                records.extend(new)
        finally:
            partition.close()
    return records


def damage(path: Path, edits: list[tuple[int, int]], cut: int | None, garbage: bytes) -> None:
    data = bytearray(path.read_bytes())
    for position, value in edits:
        if data:
            data[position % len(data)] = value
    if cut is not None and data:
        del data[cut % len(data) :]
    path.write_bytes(bytes(data) + garbage)


def read_back(directory: Path) -> list[Record]:
    """Open the storage directory as a node does and read partition 0 from the start."""
    with ControlFile.open(directory) as control:
        control.partition_info(0)
        control.fence(0)
        partition = StoragePartition(
            directory / "0",
            0,
            control,
            segment_size_threshold=SEGMENT_THRESHOLD,
            checkpoint_interval=CHECKPOINT_INTERVAL,
        )
        partition.open()
        try:
            out: list[Record] = []
            while batch := partition.read_records(len(out), 4, max_bytes=200):
                out.extend(batch)
                assert len(out) <= partition.max_transaction_id + 1
            return out
        finally:
            partition.close()


BATCHES = st.lists(st.lists(st.binary(max_size=90), min_size=1, max_size=4), max_size=5)
EDITS = st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=3)


@fuzz_settings(0.3, io=True)
@given(
    BATCHES,
    st.integers(0, 2**16),  # which file to damage
    EDITS,
    st.none() | st.integers(0, 2**16),
    st.binary(max_size=48),
)
def test_damaged_storage_files(
    batches: list[list[bytes]], which: int, edits: list[tuple[int, int]], cut: int | None, garbage: bytes
) -> None:
    with tempfile.TemporaryDirectory(prefix="waltz-fuzz-") as name:
        directory = Path(name)
        written = write_partition(directory, batches)
        files = [*sorted((directory / "0").iterdir()), ControlFile.path_in(directory)]
        target = files[which % len(files)]
        damage(target, edits, cut, garbage)

        report = verify_partition(
            directory / "0", 0, cluster_key=KEY, checkpoint_interval=CHECKPOINT_INTERVAL
        )
        errors = [p for p in report.problems if p.severity is Severity.ERROR]
        try:
            verify_storage(directory, checkpoint_interval=CHECKPOINT_INTERVAL)
        except CorruptDataError as error:  # only a control file that does not decode
            assert target.suffix == ".ctl" and error.path == str(ControlFile.path_in(directory)), error
        try:
            records = read_back(directory)
        except CorruptDataError as error:
            event(f"{target.suffix}: CorruptDataError")
            named = Path(error.path)
            assert named == directory or directory in named.parents, f"{error} names no storage file"
            assert str(named) in str(error)
            if target.suffix in (fmt.SEGMENT_SUFFIX, fmt.INDEX_SUFFIX) and "partition-info" not in str(error):
                # Start-up refused the partition or a read failed on damage: verify saw it too.
                assert errors or report.problems, (
                    f"start-up/read failed ({error}) but waltz disk verify found nothing"
                )
            return
        event(f"{target.suffix}: read {'all' if len(records) == len(written) else 'a prefix'}")
        # Whatever is read back was written: damage is cut off or refused, never served.
        assert records == written[: len(records)], f"damaged {target.name}: served a record not written"


@fuzz_settings(0.3, io=True)
@given(st.integers(fmt.MAX_DATA_LENGTH // 2, 2**31 - 1), st.binary(min_size=0, max_size=64))
def test_a_huge_length_in_the_last_record_allocates_nothing(length: int, tail: bytes) -> None:
    """Start-up recovery reads a record announcing up to 2 GiB in a small file without allocating it."""
    with tempfile.TemporaryDirectory(prefix="waltz-fuzz-") as name:
        directory = Path(name)
        written = write_partition(directory, [[b"a", b"b"]])
        segment = directory / "0" / fmt.segment_file_name(0, fmt.SEGMENT_SUFFIX)
        head = fmt.encode_record(Record.create(2, ReqId(1, 1, 0, 2), 0, b""))[: fmt.RECORD_HEADER_SIZE]
        forged = head[:28] + length.to_bytes(4, "big") + head[32:]
        with segment.open("ab") as f:
            f.write(forged + tail)
        tracemalloc.start()
        try:
            try:
                records = read_back(directory)
            except CorruptDataError:
                records = None
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 16 << 20, f"recovery allocated {peak} bytes for a {len(tail) + 36}-byte tail"
        if length <= fmt.MAX_DATA_LENGTH:
            # An incomplete last record is a torn tail: cut, the two records before it survive.
            assert records == written
