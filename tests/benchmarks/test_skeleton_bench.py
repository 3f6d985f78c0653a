"""The log skeleton of the peer benchmarks (benchmarks/peers/bench_skeleton.py): it must do the work
it claims (every committed transaction on every storage node, the lock rule kept) for its figure
to bound waltz-py's."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from types import ModuleType

import pytest

from benchmarks.peers import bench_skeleton
from waltz.perf.loadgen import LoadSpec
from waltz.protocol.records import Record, ReqId
from waltz.services.storage.format import encode_record


@pytest.fixture
def skeleton() -> ModuleType:
    """The skeleton's module (its spawned processes import it by its package name too)."""
    return bench_skeleton


@pytest.mark.parametrize(
    ("store_protobuf", "client_futures", "client_protobuf", "client_threads"),
    [
        (False, False, False, False),
        (True, False, False, False),
        (False, True, False, False),
        (False, False, True, False),
        (False, False, False, True),
    ],
    ids=["raw", "store-protobuf", "futures", "client-protobuf", "threads"],
)
def test_a_run_commits_every_transaction_once_on_every_storage_node_with_lock_failures_retried(
    skeleton: ModuleType,
    store_protobuf: bool,
    client_futures: bool,
    client_protobuf: bool,
    client_threads: bool,
) -> None:
    # 5 locks and 50 in flight: conflicts are certain, so the lock check and the retries run. The
    # run itself compares the storage files with what was committed (verify_replicas).
    spec = LoadSpec(400, payload_size=200, lock_pool_size=5, max_in_flight=50, timeout=60)
    row = skeleton.run(
        spec,
        store_protobuf=store_protobuf,
        client_futures=client_futures,
        client_protobuf=client_protobuf,
        client_threads=client_threads,
    )
    assert row["system"] == "machine: Python log skeleton"
    assert ("storage messages" in row["config"]) == store_protobuf
    assert ("a Future per transaction" in row["config"]) == client_futures
    assert ("client messages and feed entries" in row["config"]) == client_protobuf
    assert ("an apply thread and a completion thread" in row["config"]) == client_threads
    assert (row["transactions"], row["failed"]) == (400, 0)
    assert row["retries"] > 0
    assert row["latency_ms"]["count"] == 400
    assert set(row["cpu_us_per_transaction"]) == {"client", "server", "storage-0", "storage-1", "storage-2"}
    assert "1 client message(s) in flight" in row["settings"]


def _record(transaction_id: int, lock: int, mark: int, payload: bytes, crc: int | None = None) -> bytes:
    return (
        struct.pack(
            ">qiqII", transaction_id, lock, mark, len(payload), zlib.crc32(payload) if crc is None else crc
        )
        + payload
    )


def _waltz(transaction_id: int, lock: int, mark: int, payload: bytes) -> bytes:
    """A record in waltz-py's on-disk format, as the skeleton's ``store_protobuf`` writes it."""
    record = Record.create(transaction_id, ReqId(1, 1, 0, mark), lock, payload)
    return encode_record(record)


def _batch(first: int, *records: bytes) -> bytes:
    return struct.pack(">qI", first, len(records)) + b"".join(records)


def _files(tmp_path: Path, *contents: bytes) -> list[Path]:
    paths = []
    for i, content in enumerate(contents):
        path = tmp_path / f"storage-{i}.log"
        path.write_bytes(content)
        paths.append(path)
    return paths


def test_the_replica_check_counts_good_files_and_names_what_is_wrong(
    skeleton: ModuleType, tmp_path: Path
) -> None:
    good = _batch(0, _record(0, 7, -1, b"a"), _record(1, 8, -1, b"b")) + _batch(2, _record(2, 7, 0, b"c"))
    assert skeleton.verify_replicas(_files(tmp_path, good, good, good)) == 3

    waltz_format = b"".join([struct.pack(">qI", 0, 2), _waltz(0, 7, -1, b"a"), _waltz(1, 7, 0, b"b")])
    assert skeleton.verify_replicas(_files(tmp_path, waltz_format), store_protobuf=True) == 2
    with pytest.raises(skeleton.ReplicaError, match="record CRC mismatch"):
        skeleton.verify_replicas(_files(tmp_path, waltz_format[:-1] + b"X"), store_protobuf=True)

    cases = {
        "differs from": (good, good, good[:-1]),
        "wrote lock 7 at mark -1, after transaction 0": (
            _batch(0, _record(0, 7, -1, b"a"), _record(1, 7, -1, b"b")),
        ),
        "a payload CRC-32 mismatch at byte 41": (
            _batch(0, _record(0, 7, -1, b"a"), _record(1, 8, -1, b"b", crc=1)),
        ),
        "is not transaction 1": (_batch(0, _record(0, 7, -1, b"a"), _record(2, 8, -1, b"b")),),
        "starts at 5, not 0": (_batch(5, _record(5, 7, -1, b"a")),),
        "cut short": (good[:-3],),
    }
    for i, (message, contents) in enumerate(cases.items()):
        directory = tmp_path / str(i)
        directory.mkdir()
        with pytest.raises(skeleton.ReplicaError, match=message):
            skeleton.verify_replicas(_files(directory, *contents))
