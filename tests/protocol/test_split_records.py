"""The split records' form: a barrier and a genesis, UTF-8 JSON of form 1 under the header "WPSH"
(docs/design/splits.md "Record forms"), read by this release before anything writes them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.errors import ApplyPausedError, WaltzError
from waltz.protocol.split_records import (
    SPLIT_RECORD_HEADER,
    SplitBarrier,
    SplitGenesis,
    SplitRecord,
    SplitRecordFormatError,
    SplitRecordVersionError,
    decode_split_record,
    encode_split_record,
)


def test_the_header_is_wpsh() -> None:
    assert SPLIT_RECORD_HEADER.to_bytes(4, "big") == b"WPSH"


def test_both_records_are_written_field_by_field_as_the_table_says() -> None:
    barrier = SplitBarrier(epoch=1, count=8, previous_count=4, parent=3)
    genesis = SplitGenesis(epoch=1, count=8, previous_count=4, parent=3, barrier=1041)
    assert barrier.encode() == (b'{"count":8,"epoch":1,"kind":"barrier","parent":3,"previous_count":4,"v":1}')
    assert (
        genesis.encode()
        == encode_split_record(genesis)
        == (b'{"barrier":1041,"count":8,"epoch":1,"kind":"genesis","parent":3,"previous_count":4,"v":1}')
    )
    assert (barrier.v, barrier.kind, genesis.v, genesis.kind) == (1, "barrier", 1, "genesis")
    assert decode_split_record(barrier.encode()) == barrier
    assert decode_split_record(genesis.encode()) == genesis


@st.composite
def split_records(draw: st.DrawFn) -> SplitRecord:
    previous = draw(st.integers(1, 1 << 16))
    count = previous * draw(st.integers(2, 64))
    fields = {
        "epoch": draw(st.integers(1, 1 << 31)),
        "count": count,
        "previous_count": previous,
        "parent": draw(st.integers(0, previous - 1)),
    }
    if draw(st.booleans()):
        return SplitBarrier(**fields)
    return SplitGenesis(**fields, barrier=draw(st.integers(0, (1 << 63) - 1)))


@given(split_records())
def test_every_split_record_survives_encoding(record: SplitRecord) -> None:
    data = encode_split_record(record)
    assert decode_split_record(data) == record
    assert json.loads(data)["v"] == 1


GOOD = {"v": 1, "kind": "genesis", "epoch": 1, "count": 4, "previous_count": 2, "parent": 1, "barrier": 9}


def _with(**changes: object) -> bytes:
    document = {**GOOD, **changes}
    return json.dumps({k: v for k, v in document.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not UTF-8 JSON"),
        (b'{"v":1,"kind":"barrier"\xff}', "not UTF-8 JSON"),
        (b"[1]", "a JSON object, got list"),
        (_with(v=...), "form None is not a form"),
        (_with(v="1"), "form '1' is not a form"),
        (_with(v=True), "form True is not a form"),
        (_with(v=0), "form 0 is not a form"),
        (_with(kind="merge"), "kind 'merge' is unknown .*'barrier', 'genesis'"),
        (_with(kind=None), "kind None is unknown"),
        (_with(barrier=...), "split genesis of form 1 lacks barrier"),
        (_with(epoch=..., parent=...), "lacks epoch, parent"),
        (_with(kind="barrier"), "split barrier of form 1 has no barrier"),
        (_with(note="x"), "has no note"),
        (_with(epoch="1"), "epoch is an integer, got '1'"),
        (_with(parent=False), "parent is an integer, got False"),
        (_with(barrier=1.0), "barrier is an integer, got 1.0"),
        (_with(epoch=0), "starts epoch 1 or later, not 0"),
        (_with(count=3), "count 3 is not a multiple of at least 2 of its previous count 2"),
        (_with(count=2), "count 2 is not a multiple"),
        (_with(previous_count=0, parent=0), "count 4 is not a multiple"),
        (_with(parent=2), "parent 2 is not a partition of the previous count 2"),
        (_with(parent=-1), "parent -1 is not a partition"),
        (_with(barrier=-1), "barrier -1 is not a transaction ID"),
    ],
)
def test_what_is_not_a_split_record_of_form_1_is_refused_clearly(data: bytes, message: str) -> None:
    with pytest.raises(SplitRecordFormatError, match=message) as raised:
        decode_split_record(data)
    assert not isinstance(raised.value, ApplyPausedError)  # retried and reported, never a wait
    assert isinstance(raised.value, WaltzError)


@pytest.mark.parametrize("form", [2, 17])
def test_a_newer_form_waits_for_an_upgrade_naming_the_form(form: int) -> None:
    with pytest.raises(SplitRecordVersionError, match=f"of form {form} .*this release reads form 1; upgrade"):
        decode_split_record(_with(v=form, kind="split-of-the-future", barrier=...))
    try:
        decode_split_record(_with(v=form))
    except SplitRecordVersionError as exc:
        assert isinstance(exc, ApplyPausedError) and exc.form == form


def test_a_record_no_split_writes_cannot_be_built() -> None:
    with pytest.raises(SplitRecordFormatError, match="parent 4 is not a partition"):
        SplitBarrier(epoch=1, count=8, previous_count=4, parent=4)
