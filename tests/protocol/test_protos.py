"""The committed generated protobuf modules match the .proto files (scripts/gen-protos)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = sorted(
    p.relative_to(ROOT)
    for pattern in ("*_pb2.py", "*_pb2_grpc.py", "*_pb2.pyi", "*_pb2_grpc.pyi")
    for p in (ROOT / "waltz" / "protocol").glob(pattern)
)


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-protos"), str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    fresh = sorted(p.relative_to(tmp_path) for p in (tmp_path / "waltz" / "protocol").glob("*_pb2*"))
    assert fresh == GENERATED, "generated files differ in name: run scripts/gen-protos and commit"
    stale = [str(p) for p in GENERATED if (tmp_path / p).read_bytes() != (ROOT / p).read_bytes()]
    assert not stale, f"stale generated modules {stale}: run scripts/gen-protos and commit the result"


def test_every_seed_storage_request_is_in_the_protocol() -> None:
    from waltz.protocol import storage_pb2

    body = storage_pb2.StorageRequest.DESCRIPTOR.oneofs_by_name["body"]
    assert {f.name for f in body.fields} == {
        "open",
        "last_session_info",
        "max_transaction_id",
        "truncate",
        "set_low_water_mark",
        "append",
        "record_header",
        "record",
        "record_header_list",
        "record_list",
        "open_session",  # ours: a store session takes the partition; reads never move a fence
        "reset_start",  # ours: a replica restarts its log past an archived gap (docs/design/archive.md)
    }
    common = {f.name for f in storage_pb2.StorageRequest.DESCRIPTOR.fields}
    assert {"session_id", "seq_num", "partition_id"} <= common
