"""Fuzzing the decoders of bytes that come from the network, ZooKeeper or configuration files.

* change-set transaction data (``waltz/jdbc_style/changeset.py``): ``ChangeSetFormatError`` only;
* protobuf records as received on the wire and their conversion (``waltz/protocol/records.py``);
* ZooKeeper znode codecs (``waltz/metadata/values.py``, ``assignment.py``):
  ``MetadataError`` naming the znode;
* YAML configuration files (``waltz/config.py``): ``ConfigurationError`` naming the file.

Inputs that once broke a decoder are kept as tests of their own at the end.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf.message import DecodeError
from hypothesis import example, given
from hypothesis import strategies as st
from support.fuzz_settings import fuzz_settings

from waltz.config import load_settings
from waltz.errors import ConfigurationError, MetadataError
from waltz.jdbc_style.changeset import ChangeSet, ChangeSetFormatError, Operation, RowChange
from waltz.metadata.assignment import Member, PartitionAssignment
from waltz.metadata.preferred import PreferredPartitions
from waltz.metadata.values import (
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    PartitionMetadata,
    ReplicaAssignments,
)
from waltz.protocol import common_pb2
from waltz.protocol.records import Record, RecordHeader, ReqId
from waltz.services.server.config import ServerConfig
from waltz.services.storage.config import StorageConfig

pytestmark = pytest.mark.fuzz

JSON_SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text()
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE_INT = b"1" * 5_000  # longer than Python's int digit limit (4,300)


# ---- change-sets ------------------------------------------------------------------------------------


def decode_change_set(data: bytes) -> ChangeSet | None:
    try:
        return ChangeSet.decode(data)
    except ChangeSetFormatError as error:
        assert str(error)
        return None


TAGS = ["$decimal", "$datetime", "$date", "$time", "$bytes", "$uuid", "$other"]
TAGGED = st.builds(lambda tag, value: {tag: value}, st.sampled_from(TAGS), JSON_SCALARS | st.text())
OPERATION = st.fixed_dictionaries(
    {"op": st.sampled_from(["insert", "update", "delete", "upsert"]) | JSON_SCALARS},
    optional={
        "entity": JSON_SCALARS,
        "key": st.dictionaries(st.text(max_size=5), JSON_SCALARS | TAGGED, max_size=3) | JSON,
        "values": st.dictionaries(st.text(max_size=5), JSON_SCALARS | TAGGED, max_size=3) | JSON,
    },
)
DOCUMENT = st.fixed_dictionaries(
    {"v": st.just(1) | JSON_SCALARS, "ops": st.lists(OPERATION, max_size=3) | JSON},
    optional={"idempotency_key": JSON_SCALARS, "meta": JSON},
)


@fuzz_settings()
@given(st.binary(max_size=300))
@example(DEEP)
@example(b'{"v":1,"ops":[],"meta":{"n":' + HUGE_INT + b"}}")
@example(b'{"v":1,"ops":[{"op":"insert","entity":"e","key":{},"values":{"x":' + HUGE_INT + b"}}]}")
@example('{"v":1,"ops":[]}'.encode("utf-16"))
@example(b"\xff\xfe\x00")
def test_change_set_from_arbitrary_bytes(data: bytes) -> None:
    decode_change_set(data)


@fuzz_settings()
@given(DOCUMENT | JSON)
def test_change_set_from_arbitrary_json(document: Any) -> None:
    decode_change_set(json.dumps(document).encode())


VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.datetimes(timezones=st.none() | st.just(dt.UTC))
    | st.dates()
    | st.times()
    | st.binary(max_size=20)
    | st.uuids()
)
ROWS = st.dictionaries(st.text(max_size=6), VALUES, max_size=4)


@fuzz_settings(0.5)
@given(
    st.lists(st.tuples(st.sampled_from(list(Operation)), st.text(max_size=8), ROWS, ROWS), max_size=4),
    st.none() | st.text(max_size=10),
)
def test_change_sets_round_trip(
    changes: list[tuple[Operation, str, dict[str, Any], dict[str, Any]]], key: str | None
) -> None:
    """What ``encode`` writes, ``decode`` reads back unchanged (the valid inputs are not refused)."""
    change_set = ChangeSet(
        [RowChange(op, entity, k, {} if op is Operation.DELETE else v) for op, entity, k, v in changes], key
    )
    decoded = ChangeSet.decode(change_set.encode())
    assert decoded.idempotency_key == key
    assert [(c.operation, c.entity) for c in decoded.changes] == [(op, e) for op, e, _, _ in changes]
    for original, back in zip(change_set.changes, decoded.changes, strict=True):
        for mine, theirs in ((original.key, back.key), (original.values, back.values)):
            assert mine.keys() == theirs.keys()
            for name, value in mine.items():
                if isinstance(value, decimal.Decimal) and value.is_nan():
                    continue
                assert theirs[name] == value


# ---- protobuf records from the wire ----------------------------------------------------------------


@fuzz_settings()
@given(st.binary(max_size=200))
def test_wire_records_from_arbitrary_bytes(data: bytes) -> None:
    try:
        message = common_pb2.Record.FromString(data)
    except DecodeError:
        return
    record = Record.from_proto(message)
    assert Record.from_proto(record.to_proto()) == record
    assert record.checksum_ok() == (
        record.checksum == Record.create(0, record.req_id, 0, record.data).checksum
    )
    assert RecordHeader.from_proto(record.record_header.to_proto()) == record.record_header
    assert ReqId.from_proto(record.req_id.to_proto()) == record.req_id


# ---- ZooKeeper znodes -------------------------------------------------------------------------------

ZNODE = "/waltz/fuzz/store/partition/0"
DECODERS: dict[str, Callable[[bytes], object]] = {
    "ClusterParams": lambda data: ClusterParams.decode(data, ZNODE),
    "ReplicaAssignments": lambda data: ReplicaAssignments.decode(data, ZNODE),
    "GroupDescriptor": lambda data: GroupDescriptor.decode(data, ZNODE),
    "ConnectionMetadata": lambda data: ConnectionMetadata.decode(data, ZNODE),
    "PartitionMetadata": lambda data: PartitionMetadata.decode(data, ZNODE),
    "PartitionAssignment": lambda data: PartitionAssignment.decode(data, ZNODE),
    "Member": lambda data: Member.decode("member-0000000001", data, ZNODE),
    "PreferredPartitions": lambda data: PreferredPartitions.decode(data, ZNODE),
}
ASCII_KEYS = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)
ZNODE_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | ASCII_KEYS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(ASCII_KEYS, children, max_size=3),
    max_leaves=15,
)
FIELDS = [
    "format_version", "name", "num_partitions", "cluster_key", "assignments", "groups", "connections",
    "generation", "session_id", "replicas", "partitions", "endpoint", "preferred_partitions",
    "member", "closing_high_water_mark", "127.0.0.1:55280", "0", "1", "health_url", "servers",
]  # fmt: skip
ZNODE_OBJECTS = st.recursive(
    ZNODE_JSON,
    lambda children: st.dictionaries(st.sampled_from(FIELDS), children, max_size=5),
    max_leaves=20,
)


def check_znode(decoder: str, data: bytes) -> None:
    try:
        DECODERS[decoder](data)
    except MetadataError as error:
        assert ZNODE in str(error) or "connect string" in str(error), f"{error} does not name the znode"


@fuzz_settings()
@given(
    st.sampled_from(sorted(DECODERS)),
    st.binary(max_size=200) | ZNODE_OBJECTS.map(lambda v: json.dumps(v).encode()),
)
def test_znode_decoders(decoder: str, data: bytes) -> None:
    check_znode(decoder, data)


@fuzz_settings(0.5)
@given(st.sampled_from(sorted(DECODERS)), st.data())
def test_znode_decoders_on_damaged_valid_znodes(decoder: str, data: st.DataObject) -> None:
    valid = {
        "ClusterParams": ClusterParams("c", 2, uuid.UUID(int=1)).encode(),
        "ReplicaAssignments": ReplicaAssignments({"127.0.0.1:1": (0, 1)}).encode(),
        "GroupDescriptor": GroupDescriptor({"127.0.0.1:1": 0}).encode(),
        "ConnectionMetadata": ConnectionMetadata({"127.0.0.1:1": 2}).encode(),
        "PartitionMetadata": PartitionMetadata(3, 4, {}).encode(),
        "PartitionAssignment": PartitionAssignment({}).encode(),
        "Member": Member("member-0000000001", "127.0.0.1:1", (0,), "http://127.0.0.1:2/health").encode(),
        "PreferredPartitions": PreferredPartitions({"127.0.0.1:1": (0, 1)}).encode(),
    }[decoder]
    document = json.loads(valid)
    key = data.draw(st.sampled_from(sorted(document)))
    document[key] = data.draw(ZNODE_OBJECTS)
    check_znode(decoder, json.dumps(document).encode())


# ---- YAML configuration files -----------------------------------------------------------------------

KNOWN_KEYS = sorted({*StorageConfig.KEYS, *ServerConfig.KEYS})
YAML_VALUES = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
YAML_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)


def check_config(text: str) -> None:
    with tempfile.TemporaryDirectory(prefix="waltz-fuzz-") as name:
        path = Path(name) / "config.yaml"
        path.write_text(text)
        for settings_class in (StorageConfig, ServerConfig):
            try:
                load_settings(settings_class, path)
            except ConfigurationError as error:
                assert str(path) in str(error), f"the error does not name the file: {error}"


@fuzz_settings(0.5)
@given(YAML_TEXT)
@example("storage: {directory: /tmp, port: 99999999999999999999}")
@example("storage.directory: [1, 2]\nstorage.port: .nan")
@example("? [a, b]\n: 1")
@example("!!python/object:os.system {}")
def test_config_files_from_arbitrary_text(text: str) -> None:
    check_config(text)


@fuzz_settings(0.5)
@given(
    st.dictionaries(
        st.sampled_from(KNOWN_KEYS) | st.text(max_size=10),
        YAML_VALUES | st.lists(YAML_VALUES, max_size=2),
        max_size=6,
    )
)
def test_config_files_with_wrong_values(values: dict[str, Any]) -> None:
    check_config(yaml.safe_dump(values))


# ---- inputs that broke decoders once (fixed: each raises its documented error now) -----------------


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b'{"name": ' + HUGE_INT + b"}", id="integer-over-the-digit-limit"),
        pytest.param(DEEP, id="deep-nesting"),
    ],
)
def test_znode_json_limits_raise_metadata_error(data: bytes) -> None:
    """waltz/metadata/values.py ``_load`` once let ValueError and RecursionError out."""
    with pytest.raises(MetadataError):
        ClusterParams.decode(data, ZNODE)


def test_assignment_with_a_unicode_digit_partition_raises_metadata_error() -> None:
    """waltz/metadata/assignment.py: ``"²".isdigit()`` is True, but ``int("²")`` raises."""
    data = json.dumps({"partitions": {"²": {"member": None, "endpoint": None, "generation": 1}}}).encode()
    with pytest.raises(MetadataError):
        PartitionAssignment.decode(data, ZNODE)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"storage: &s {directory: /tmp, more: *s}\n", id="recursive-alias"),
        pytest.param(b"storage.directory: /tmp\n# \xff\xfe not UTF-8\n", id="not-utf-8"),
    ],
)
def test_config_file_errors_are_configuration_errors(content: bytes, tmp_path: Path) -> None:
    """waltz/config.py: ``flatten_keys`` once recursed into a self-referencing YAML alias forever, and
    a file that is not UTF-8 raised UnicodeDecodeError."""
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigurationError):
        load_settings(StorageConfig, path)
