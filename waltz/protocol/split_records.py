"""The records of a partition split: the barrier and the genesis, form 1.

Design: docs/design/splits.md "Record forms" (and "Terms" for what the fields mean). Both records
have the transaction header :data:`SPLIT_RECORD_HEADER` ("WPSH") and UTF-8 JSON data, compact with
sorted keys::

    {"count": 8, "epoch": 1, "kind": "barrier", "parent": 3, "previous_count": 4, "v": 1}
    {"barrier": 1041, "count": 8, "epoch": 1, "kind": "genesis", "parent": 3, "previous_count": 4, "v": 1}

The readers of this release (the SQL framework's live apply and entity cache, the Spark rebuild)
read the form before anything writes it: they pass a split record over without row changes. The
module stands with the wire protocol, below every reader and the servers that will write it.
A record of a form newer than :data:`SPLIT_RECORD_FORM` raises :class:`SplitRecordVersionError`
(an :class:`~waltz.errors.ApplyPausedError`: the partition waits for an upgrade), anything else
that is not a record of form 1 :class:`SplitRecordFormatError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from waltz.errors import SplitRecordFormatError, SplitRecordVersionError

__all__ = [
    "SPLIT_RECORD_FORM",
    "SPLIT_RECORD_HEADER",
    "SplitBarrier",
    "SplitGenesis",
    "SplitRecord",
    "SplitRecordFormatError",
    "SplitRecordVersionError",
    "decode_split_record",
    "encode_split_record",
    "opening_genesis",
]

#: Transaction header of the barrier and the genesis ("WPSH" as a big-endian 32-bit integer).
SPLIT_RECORD_HEADER = 0x57505348
#: The form this code writes and reads (``"v"``).
SPLIT_RECORD_FORM = 1

#: The fields every split record of form 1 has.
_COMMON_FIELDS = ("v", "kind", "epoch", "count", "previous_count", "parent")


def _check(record: SplitBarrier | SplitGenesis) -> None:
    """Refuse values no split could write: each an integer (not a bool), ``epoch`` at least 1,
    ``count`` a multiple of ``previous_count`` by at least 2, ``parent`` a partition of the count
    before, a genesis's ``barrier`` a transaction ID (docs/design/splits.md "Terms").

    Raises:
        SplitRecordFormatError: naming the field and its value.
    """
    values = {name: getattr(record, name) for name in _COMMON_FIELDS[2:]}
    if isinstance(record, SplitGenesis):
        values["barrier"] = record.barrier
    for name, value in values.items():
        if type(value) is not int:
            raise SplitRecordFormatError(f"a split {record.kind}'s {name} is an integer, got {value!r}")
    kind, epoch, count, before = record.kind, record.epoch, record.count, record.previous_count
    parent = record.parent
    if epoch < 1:
        raise SplitRecordFormatError(f"a split {kind} starts epoch 1 or later, not {epoch}")
    if before < 1 or count < 2 * before or count % before:
        raise SplitRecordFormatError(
            f"a split {kind}'s count {count} is not a multiple of at least 2 of its previous count {before}"
        )
    if not 0 <= parent < before:
        raise SplitRecordFormatError(
            f"a split {kind}'s parent {parent} is not a partition of the previous count {before}"
        )
    if isinstance(record, SplitGenesis) and record.barrier < 0:
        raise SplitRecordFormatError(f"a split genesis's barrier {record.barrier} is not a transaction ID")


@dataclass(frozen=True, slots=True)
class SplitBarrier:
    """The record a parent's owner appends when the parent hands over; its ID is the parent's
    barrier ``B(p)`` (docs/design/splits.md "Terms", "The handover").

    Attributes:
        epoch: the epoch that starts (``n+1``), at least 1.
        count: its partition count ``C(n+1)``, a multiple of ``previous_count`` by at least 2.
        previous_count: the count before, ``C(n)``.
        parent: the parent partition ``p``, below ``previous_count``.
        v: the form (class attribute, :data:`SPLIT_RECORD_FORM`).
        kind: ``"barrier"`` (class attribute).

    Raises:
        SplitRecordFormatError: at construction, a value no split writes.
    """

    v: ClassVar[int] = SPLIT_RECORD_FORM
    kind: ClassVar[str] = "barrier"

    epoch: int
    count: int
    previous_count: int
    parent: int

    def __post_init__(self) -> None:
        _check(self)

    def encode(self) -> bytes:
        """The transaction data (see the module docstring)."""
        return encode_split_record(self)


@dataclass(frozen=True, slots=True)
class SplitGenesis:
    """The first record of a new child, at ID ``barrier + 1``: the child's log starts there
    (docs/design/splits.md "Terms", "The handover").

    Attributes:
        epoch: the epoch that starts (``n+1``), at least 1.
        count: its partition count ``C(n+1)``, a multiple of ``previous_count`` by at least 2.
        previous_count: the count before, ``C(n)``.
        parent: the parent partition ``p``, below ``previous_count``.
        barrier: the parent's barrier ID ``B(p)``, at least 0.
        v: the form (class attribute, :data:`SPLIT_RECORD_FORM`).
        kind: ``"genesis"`` (class attribute).

    Raises:
        SplitRecordFormatError: at construction, a value no split writes.
    """

    v: ClassVar[int] = SPLIT_RECORD_FORM
    kind: ClassVar[str] = "genesis"

    epoch: int
    count: int
    previous_count: int
    parent: int
    barrier: int

    def __post_init__(self) -> None:
        _check(self)

    def encode(self) -> bytes:
        """The transaction data (see the module docstring)."""
        return encode_split_record(self)


#: A decoded split record.
SplitRecord = SplitBarrier | SplitGenesis

_KINDS: dict[str, type[SplitBarrier] | type[SplitGenesis]] = {
    "barrier": SplitBarrier,
    "genesis": SplitGenesis,
}


def encode_split_record(record: SplitRecord) -> bytes:
    """The transaction data of a barrier or a genesis: UTF-8 JSON of form 1, compact, keys sorted
    (docs/design/splits.md "Record forms").

    Args:
        record: the record.

    Returns:
        The bytes to append under :data:`SPLIT_RECORD_HEADER`.
    """
    document: dict[str, Any] = {
        "v": record.v,
        "kind": record.kind,
        "epoch": record.epoch,
        "count": record.count,
        "previous_count": record.previous_count,
        "parent": record.parent,
    }
    if isinstance(record, SplitGenesis):
        document["barrier"] = record.barrier
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")


def decode_split_record(data: bytes) -> SplitRecord:
    """Read a barrier or a genesis from its transaction data (docs/design/splits.md "Record
    forms"): the form first, then the kind, then exactly the kind's fields.

    Args:
        data: the transaction data of a record with :data:`SPLIT_RECORD_HEADER`.

    Returns:
        A :class:`SplitBarrier` or a :class:`SplitGenesis`.

    Raises:
        SplitRecordVersionError: an integer form above :data:`SPLIT_RECORD_FORM` (the partition
            waits for this instance's upgrade).
        SplitRecordFormatError: not UTF-8 JSON, not an object, no form or one that is not a
            positive integer, an unknown kind, a field missing, a field the kind does not have,
            or a value no split writes.
    """
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        # ValueError: not UTF-8 or not JSON, or an integer longer than Python's digit limit;
        # RecursionError: nesting deeper than the interpreter's stack.
        raise SplitRecordFormatError(f"split record data is not UTF-8 JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise SplitRecordFormatError(f"split record data is a JSON object, got {type(document).__name__}")
    form = document.get("v")
    if type(form) is not int or form < 1:
        raise SplitRecordFormatError(
            f"split record form {form!r} is not a form (this waltz-py reads form {SPLIT_RECORD_FORM})"
        )
    if form != SPLIT_RECORD_FORM:
        raise SplitRecordVersionError(
            f"a split record of form {form} is newer than this waltz-py reads: this release reads "
            f"form {SPLIT_RECORD_FORM}; upgrade waltz-py on this instance",
            form,
        )
    kind = document.get("kind")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        known = ", ".join(map(repr, _KINDS))
        raise SplitRecordFormatError(
            f"split record kind {kind!r} is unknown (form {SPLIT_RECORD_FORM} has {known})"
        )
    fields = _COMMON_FIELDS + (("barrier",) if cls is SplitGenesis else ())
    missing = [name for name in fields if name not in document]
    if missing:
        raise SplitRecordFormatError(f"a split {kind} of form {form} lacks {', '.join(missing)}")
    extra = sorted(set(document) - set(fields))
    if extra:
        raise SplitRecordFormatError(f"a split {kind} of form {form} has no {', '.join(extra)}")
    return cls(**{name: document[name] for name in fields[2:]})


def opening_genesis(transaction_id: int, data: bytes) -> SplitGenesis | None:
    """The genesis a record with :data:`SPLIT_RECORD_HEADER` is when it opens its partition's
    log: one that decodes as a genesis at its barrier plus one (docs/design/splits.md "Record
    forms"); else None, also for data that does not decode (damaged, or of a newer form): the
    reader's own apply reports that.

    Args:
        transaction_id: the record's transaction ID.
        data: its transaction data.
    """
    try:
        record = decode_split_record(data)
    except SplitRecordFormatError:  # SplitRecordVersionError too
        return None
    if isinstance(record, SplitGenesis) and transaction_id == record.barrier + 1:
        return record
    return None
