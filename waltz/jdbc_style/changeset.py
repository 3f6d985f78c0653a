"""The generic change-set transaction format for declared entities.

Source: docs/design/sql.md "Change-sets" (a transaction message consists of descriptions of
intended data change; one message, several DML statements applied in one SQL transaction).
``docs/sql.md`` ("Change-set format") is the reference; the Spark rebuild decodes the same bytes.

A change-set transaction has the header :data:`CHANGE_SET_HEADER` and UTF-8 JSON data (compact,
sorted keys)::

    {"v": 2,
     "ops": [{"op": "insert", "entity": "account", "key": {"account_id": 7}, "sv": 2,
              "values": {"account_id": 7, "balance": {"$decimal": "10.00"}, "owner": "ann"}},
             {"op": "update", "entity": "account", "key": {...}, "values": {<the whole new row>}},
             {"op": "delete", "entity": "account", "key": {...}}],
     "idempotency_key": "req-42",          (optional)
     "meta": {...}}                         (optional, the application's own JSON)

``"sv"`` is the schema version of the entity's model that the op's attributes follow, written
when it is above 1 (docs/design/sql.md "Schema versions and upcasting"). A change-set without one
is written in form 1 (``"v": 1``, no ``"sv"``), the form every waltz-py reads; one with an
``"sv"`` in form 2, which a waltz-py that knows no schema versions refuses (its partition waits)
instead of applying it as if it were version 1. Both forms are read.

A batch (form 3, :class:`ChangeSetBatch`) holds several change-sets in one log transaction:
``{"v": 3, "members": [{"ops": [...], "idempotency_key": ..., "meta": ...}, ...]}``, each member a
change-set of form 2 without its ``"v"`` (docs/design/sql.md "Batched change-sets").
:func:`decode_members` reads every form as the transaction's list of change-sets.

``insert`` and ``update`` carry the whole new row (attribute name → value), so replaying a log
keeps the last write per key; ``delete`` carries the key. Values that JSON cannot hold exactly are
tagged: ``{"$decimal": "1.10"}``, ``{"$datetime": "2026-01-02T03:04:05+00:00"}``, ``{"$date":
"2026-01-02"}``, ``{"$time": "03:04:05"}``, ``{"$bytes": "<base64>"}``, ``{"$uuid": "..."}``;
floats must be finite.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from waltz.errors import ApplyPausedError, SqlFrameworkError

__all__ = [
    "CHANGE_SET_HEADER",
    "ChangeSet",
    "ChangeSetBatch",
    "ChangeSetFormatError",
    "ChangeSetVersionError",
    "Operation",
    "RowChange",
    "batch_data",
    "decode_members",
    "decode_value",
    "encode_members",
    "encode_value",
    "member_data",
    "repeated_key_members",
]

#: Transaction header of change-set transactions ("WCS1" as a big-endian 32-bit integer).
CHANGE_SET_HEADER = 0x57435331
#: The form written in ``"v"`` by a change-set whose every op is of schema version 1.
FORMAT_VERSION = 1
#: The form written when an op carries a schema version above 1 (``"sv"``).
FORMAT_VERSION_SCHEMAS = 2
#: The form of a batch: several change-sets (members) in one log transaction.
FORMAT_VERSION_BATCH = 3
#: Every form this code reads.
READABLE_FORMATS = (FORMAT_VERSION, FORMAT_VERSION_SCHEMAS, FORMAT_VERSION_BATCH)
#: The newest form this code reads (a record of a higher integer form waits for an upgrade).
NEWEST_FORMAT = FORMAT_VERSION_BATCH


class ChangeSetFormatError(SqlFrameworkError):
    """Transaction data that is not a valid change-set (names the transaction when known)."""


class ChangeSetVersionError(ChangeSetFormatError, ApplyPausedError):
    """A change-set of a form newer than this code reads: the partition waits for an upgrade.

    Attributes:
        version: the form the record declares.
    """

    def __init__(self, message: str, version: object) -> None:
        super().__init__(message)
        self.version = version


class Operation(enum.Enum):
    """What a row change does."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row change of a change-set.

    Attributes:
        operation: insert, update or delete.
        entity: the entity's name (its ``WaltzEntity.lock_name``).
        key: the entity's key attributes and values.
        values: the whole new row for insert and update (attribute → value); empty for delete.
        schema_version: the schema version of the entity's model that ``key`` and ``values``
            follow (``WaltzEntity.schema_version`` when it was written; docs/design/sql.md "Schema
            versions and upcasting"). Records without one are version 1; so is a change built by
            hand that does not say.
    """

    operation: Operation
    entity: str
    key: Mapping[str, Any]
    values: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = 1


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """A decoded change-set transaction.

    Attributes:
        changes: the row changes, applied in order.
        idempotency_key: the application's request key, or None.
        meta: the application's own JSON object (never interpreted by the framework).
    """

    changes: Sequence[RowChange]
    idempotency_key: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The transaction data (see the module docstring): form 1 when every op is of schema
        version 1, else form 2.

        Raises:
            ChangeSetFormatError: a value cannot be encoded (unsupported type, non-finite float),
                or a schema version is not an integer of at least 1.
        """
        document, form = self._document()
        return _dumps({"v": form, **document})

    def _document(self) -> tuple[dict[str, Any], int]:
        """This change-set's fields (``ops``, ``idempotency_key``, ``meta``) as JSON, and the
        lowest single-change-set form that holds them (1, or 2 with a schema version above 1)."""
        ops: list[dict[str, Any]] = []
        form = FORMAT_VERSION
        for change in self.changes:
            op: dict[str, Any] = {
                "op": change.operation.value,
                "entity": change.entity,
                "key": {k: encode_value(v) for k, v in change.key.items()},
            }
            if change.operation is not Operation.DELETE:
                op["values"] = {k: encode_value(v) for k, v in change.values.items()}
            version = change.schema_version
            if version != 1:
                if type(version) is not int or version < 1:
                    raise ChangeSetFormatError(
                        f"{change.operation.value} of {change.entity}: schema version {version!r} "
                        "is not an integer of at least 1"
                    )
                op["sv"] = version
                form = FORMAT_VERSION_SCHEMAS
            ops.append(op)
        document: dict[str, Any] = {"ops": ops}
        if self.idempotency_key is not None:
            document["idempotency_key"] = self.idempotency_key
        if self.meta:
            document["meta"] = dict(self.meta)
        return document, form

    @staticmethod
    def decode(data: bytes) -> ChangeSet:
        """Parse transaction data written by :meth:`encode` (forms 1 and 2).

        The row changes keep the schema version they were written with (1 for form 1): the
        decoding step that upcasts them to the current models is
        :meth:`waltz.jdbc_style.upcasting.SchemaChains.upcast`. A batch (form 3) holds several
        change-sets: :func:`decode_members` reads every form.

        Raises:
            ChangeSetVersionError: a form newer than this code reads (an integer ``"v"`` above
                :data:`READABLE_FORMATS`): the partition waits for an upgrade.
            ChangeSetFormatError: not UTF-8 JSON, no form, a batch, an unknown operation, a
                missing field, or a schema version that is not an integer of at least 1.
        """
        form, members = _decode(data)
        if form == FORMAT_VERSION_BATCH:
            raise ChangeSetFormatError(
                f"the data is a batch of {len(members)} change-sets (form {FORMAT_VERSION_BATCH}); "
                "decode_members reads it"
            )
        return members[0]


@dataclass(frozen=True, slots=True)
class ChangeSetBatch:
    """Several change-sets in one log transaction (form 3): applied in order, in one database
    transaction, each member with its own idempotency key and ``meta`` (docs/design/sql.md
    "Batched change-sets").

    Attributes:
        members: the change-sets, in the order they apply; at least two (one change-set is
            written in its own form, which every older reader reads).
    """

    members: Sequence[ChangeSet]

    def encode(self) -> bytes:
        """The transaction data: ``{"v": 3, "members": [{"ops": ..., "idempotency_key": ...,
        "meta": ...}, ...]}`` (each member as a change-set of form 1 or 2 has it, without ``"v"``;
        an op of a schema version above 1 carries its ``"sv"``).

        Raises:
            ChangeSetFormatError: fewer than two members, or a member that cannot be encoded.
        """
        if len(self.members) < 2:
            raise ChangeSetFormatError(
                f"a batch holds at least two change-sets, not {len(self.members)} (write one "
                "change-set with ChangeSet.encode, in the form every reader reads)"
            )
        return batch_data([member_data(member) for member in self.members])


def member_data(change_set: ChangeSet) -> bytes:
    """A change-set as a member of a batch: its fields (``ops``, ``idempotency_key``, ``meta``)
    without ``"v"``, as :func:`batch_data` joins them.

    Raises:
        ChangeSetFormatError: a value cannot be encoded.
    """
    return _dumps(change_set._document()[0])


def batch_data(members: Sequence[bytes]) -> bytes:
    """The transaction data of a batch (form 3) from its members' :func:`member_data`, in order:
    the JSON ``{"members": [...], "v": 3}`` with sorted keys, joined without encoding any member
    again."""
    return b'{"members":[' + b",".join(members) + b'],"v":' + str(FORMAT_VERSION_BATCH).encode() + b"}"


def encode_members(members: Sequence[ChangeSet]) -> bytes:
    """The transaction data of one change-set (its own form, 1 or 2) or of several (a batch,
    form 3).

    Raises:
        ChangeSetFormatError: no member, or a member that cannot be encoded.
    """
    if not members:
        raise ChangeSetFormatError("a transaction holds at least one change-set")
    return members[0].encode() if len(members) == 1 else ChangeSetBatch(tuple(members)).encode()


def decode_members(data: bytes) -> tuple[ChangeSet, ...]:
    """The change-sets of a transaction's data, in order: one for forms 1 and 2, the members of a
    batch (form 3). Row changes keep the schema version they were written with.

    Raises:
        ChangeSetVersionError: a form newer than this code reads (an integer ``"v"`` above
            :data:`NEWEST_FORMAT`): the partition waits for an upgrade.
        ChangeSetFormatError: not UTF-8 JSON, no form, an unknown operation, a missing field, a
            schema version that is not an integer of at least 2 in a form that carries one, a
            batch whose ``members`` is not a list of at least two JSON objects, or what no writer
            gives: a key twice in one JSON object, ``NaN`` or an infinite number, a non-finite
            ``$decimal``, a ``$bytes`` that is not base64, an ``entity`` that is not a string, a
            ``meta`` that is not an object. Fields the form does not name are read past.
    """
    return _decode(data)[1]


def repeated_key_members(members: Sequence[ChangeSet]) -> frozenset[int]:
    """The indexes of a transaction's members whose idempotency key an earlier member of the same
    transaction carried: the live apply skips them, and so do Spark and the workload checks
    (docs/design/sql.md "Batched change-sets").

    Returns:
        The indexes (0-based) to pass over; empty for a transaction of one change-set.
    """
    seen: set[str] = set()
    repeated: set[int] = set()
    for index, member in enumerate(members):
        key = member.idempotency_key
        if key is None:
            continue
        if key in seen:
            repeated.add(index)
        seen.add(key)
    return frozenset(repeated)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict, refusing a key given twice (which ``json`` would let
    the last one win: two writers' readings of one record could differ)."""
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ChangeSetFormatError(f"change-set data has the key {key!r} twice in one JSON object")
            seen.add(key)
    return document


def _no_constant(name: str) -> Any:
    """``json``'s ``parse_constant``: no writer gives ``NaN``, ``Infinity`` or ``-Infinity``."""
    raise ChangeSetFormatError(
        f"change-set data holds the constant {name}, which JSON does not have and no writer gives "
        "(a float must be finite)"
    )


def _finite_float(text: str) -> float:
    """``json``'s ``parse_float``: a number too large for a float (``1e999``) is not read as
    infinity, which no writer gives."""
    number = float(text)
    if not math.isfinite(number):
        raise ChangeSetFormatError(f"change-set data holds the number {text}, which is not finite as a float")
    return number


def _decode(data: bytes) -> tuple[int, tuple[ChangeSet, ...]]:
    """The form of a transaction's data and its change-sets (see :func:`decode_members`)."""
    try:
        document = json.loads(
            data, object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite_float
        )
    except (ValueError, RecursionError) as exc:
        # ValueError: not UTF-8 or not JSON (JSONDecodeError), or an integer literal longer than
        # Python's digit limit; RecursionError: nesting deeper than the interpreter's stack.
        raise ChangeSetFormatError(f"change-set data is not UTF-8 JSON: {exc}") from exc
    form = document.get("v") if isinstance(document, dict) else None
    if form not in READABLE_FORMATS or type(form) is not int:
        if type(form) is int and form > NEWEST_FORMAT:
            raise ChangeSetVersionError(
                f"change-set form {form} is newer than this waltz-py reads (forms "
                f"{', '.join(map(str, READABLE_FORMATS))}); upgrade waltz-py on this instance",
                form,
            )
        raise ChangeSetFormatError(
            f"change-set format version {form!r} is not supported (this waltz-py reads forms "
            f"{', '.join(map(str, READABLE_FORMATS))})"
        )
    assert isinstance(document, dict)
    if form != FORMAT_VERSION_BATCH:
        if "members" in document:
            raise ChangeSetFormatError(f"a change-set of form {form} has no members (only form 3 does)")
        return form, (_decode_member(document, form),)
    members = document.get("members")
    if "ops" in document or not isinstance(members, list) or len(members) < 2:
        raise ChangeSetFormatError(
            "a batch (form 3) has a list of at least two members and no ops of its own, got "
            f"members {type(members).__name__}" + (f" of {len(members)}" if isinstance(members, list) else "")
        )
    decoded = []
    for index, member in enumerate(members):
        if not isinstance(member, dict) or "v" in member or "members" in member:
            raise ChangeSetFormatError(
                f"member {index} of the batch is not a change-set object without a form of its own"
            )
        try:
            decoded.append(_decode_member(member, form))
        except ChangeSetFormatError as exc:
            raise ChangeSetFormatError(f"member {index} of the batch: {exc}") from exc
    return form, tuple(decoded)


def _decode_member(document: dict[str, Any], form: int) -> ChangeSet:
    """One change-set's fields (``ops``, ``idempotency_key``, ``meta``) in a record of ``form``."""
    changes: list[RowChange] = []
    try:
        for op in document["ops"]:
            operation = Operation(op["op"])
            values = {} if operation is Operation.DELETE else _decode_map(op["values"])
            version = op.get("sv", 1)
            if "sv" in op and (form == FORMAT_VERSION or type(version) is not int or version < 2):
                raise ValueError(f"schema version {version!r} in a change-set of form {form}")
            entity = op["entity"]
            if not isinstance(entity, str):
                raise TypeError(f"entity must be a string, got {entity!r}")
            changes.append(RowChange(operation, entity, _decode_map(op["key"]), values, version))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ChangeSetFormatError(f"malformed change-set operation: {exc!r}") from exc
    key = document.get("idempotency_key")
    meta = document.get("meta")
    if meta is None:  # absent: the writers leave out an empty one
        meta = {}
    if key is not None and not isinstance(key, str):
        raise ChangeSetFormatError(f"idempotency_key must be a string, got {key!r}")
    if not isinstance(meta, dict):
        raise ChangeSetFormatError(f"meta must be a JSON object, got {type(meta).__name__}")
    return ChangeSet(changes, key, meta)


def _dumps(document: dict[str, Any]) -> bytes:
    try:
        return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ChangeSetFormatError(f"change-set cannot be encoded as JSON: {exc}") from exc


def _decode_map(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TypeError(f"expected a JSON object, got {type(raw).__name__}")
    return {str(k): decode_value(v) for k, v in raw.items()}


def encode_value(value: Any) -> Any:
    """A column value as JSON (tagged when JSON cannot hold it exactly).

    Raises:
        ChangeSetFormatError: unsupported type or a non-finite float.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ChangeSetFormatError(f"float {value!r} cannot be stored in a change-set")
        return value
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, enum.Enum):
        return encode_value(value.value)
    raise ChangeSetFormatError(
        f"a value of type {type(value).__name__} cannot be stored in a change-set (supported: None, "
        "bool, int, float, str, Decimal, datetime, date, time, bytes, UUID, Enum)"
    )


def _finite_decimal(text: str) -> decimal.Decimal:
    """A ``$decimal``: finite, as :func:`encode_value` writes every ``Decimal`` a column holds
    (``NaN``, ``sNaN`` and infinities are no amounts, and ``sNaN`` raises in comparisons)."""
    number = decimal.Decimal(text)
    if not number.is_finite():
        raise ValueError("not a finite number")
    return number


def _base64(text: str) -> bytes:
    """A ``$bytes``: standard base64 with its padding, as :func:`encode_value` writes it; other
    characters are an error, not left out (which would read ``"@@@@"`` as ``b""``)."""
    return base64.b64decode(text, validate=True)


_DECODERS: dict[str, Any] = {
    "$decimal": _finite_decimal,
    "$datetime": dt.datetime.fromisoformat,
    "$date": dt.date.fromisoformat,
    "$time": dt.time.fromisoformat,
    "$bytes": _base64,
    "$uuid": uuid.UUID,
}


def decode_value(raw: Any) -> Any:
    """The inverse of :func:`encode_value` (without the schema: enums come back as their values).

    Raises:
        ValueError: an unknown tag or a malformed tagged value (its text not a string; a
            ``$decimal`` that is not a finite number; a ``$bytes`` that is not base64 with its
            padding; a date, time or UUID that does not parse).
    """
    if isinstance(raw, dict):
        if len(raw) != 1:
            raise ValueError(f"a tagged value has exactly one key, got {sorted(raw)}")
        ((tag, text),) = raw.items()
        decoder = _DECODERS.get(tag)
        if decoder is None:
            raise ValueError(f"unknown value tag {tag!r}")
        if not isinstance(text, str):
            raise ValueError(f"malformed {tag} value {text!r}: not a string")
        try:
            return decoder(text)
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed {tag} value {text!r}: {exc}") from exc
    if isinstance(raw, list):
        raise ValueError("lists are not column values")
    return raw
