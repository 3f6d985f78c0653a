"""``<root>/discovery``'s format: 1 before any split, 2 with the newest epoch once one started
(docs/design/splits.md "What ZooKeeper holds")."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.errors import MetadataError
from waltz.metadata.values import DISCOVERY_SPLIT_FORMAT, FORMAT_VERSION, DiscoveryParams, _load

PATH = "/waltz/c1/discovery"


def test_epoch_0_writes_the_bytes_of_before_splits() -> None:
    assert (
        DiscoveryParams("orders", 4).encode()
        == b'{"format_version": 1, "name": "orders", "num_partitions": 4}'
    )


@given(name=st.text(min_size=1, max_size=20), count=st.integers(1, 65_536), epoch=st.integers(0, 1000))
def test_every_epoch_reads_back(name: str, count: int, epoch: int) -> None:
    value = DiscoveryParams(name, count, epoch)
    encoded = value.encode()
    assert DiscoveryParams.decode(encoded, PATH) == value
    assert json.loads(encoded)["format_version"] == (FORMAT_VERSION if epoch == 0 else DISCOVERY_SPLIT_FORMAT)


def test_a_reader_of_format_1_only_refuses_a_split_cluster() -> None:
    """What a client that predates splits does with the raised format (its reader takes format 1)."""
    with pytest.raises(MetadataError, match="has format version 2; this waltz-py reads 1"):
        _load(DiscoveryParams("orders", 4, 1).encode(), PATH)


@pytest.mark.parametrize(
    ("value", "refusal"),
    [
        ({"format_version": 2, "name": "o", "num_partitions": 4}, "lacks the field 'epoch'"),
        ({"format_version": 2, "name": "o", "num_partitions": 4, "epoch": 0}, "expected 1 or more"),
        ({"format_version": 3, "name": "o", "num_partitions": 4, "epoch": 1}, "reads 1 or 2"),
    ],
)
def test_what_no_split_writes_is_refused(value: dict[str, object], refusal: str) -> None:
    with pytest.raises(MetadataError, match=refusal):
        DiscoveryParams.decode(json.dumps(value).encode(), PATH)
