"""The generic change-set transaction format for declared entities.

Source: docs/design/sql.md "Change-sets" (a transaction message consists of descriptions of
intended data change; one message, several DML statements applied in one SQL transaction).
``docs/sql.md`` ("Change-set format") is the reference; the Spark rebuild decodes the same bytes.

A change-set transaction has the header :data:`CHANGE_SET_HEADER` and UTF-8 JSON data (compact,
sorted keys)::

    {"v": 1,
     "ops": [{"op": "insert", "entity": "account", "key": {"account_id": 7},
              "values": {"account_id": 7, "balance": {"$decimal": "10.00"}, "owner": "ann"}},
             {"op": "update", "entity": "account", "key": {...}, "values": {<the whole new row>}},
             {"op": "delete", "entity": "account", "key": {...}}],
     "idempotency_key": "req-42",          (optional)
     "meta": {...}}                         (optional, the application's own JSON)

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

from waltz.errors import SqlFrameworkError

__all__ = [
    "CHANGE_SET_HEADER",
    "ChangeSet",
    "ChangeSetFormatError",
    "Operation",
    "RowChange",
    "decode_value",
    "encode_value",
]

#: Transaction header of change-set transactions ("WCS1" as a big-endian 32-bit integer).
CHANGE_SET_HEADER = 0x57435331
#: Format version written in ``"v"``.
FORMAT_VERSION = 1


class ChangeSetFormatError(SqlFrameworkError):
    """Transaction data that is not a valid change-set (names the transaction when known)."""


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
    """

    operation: Operation
    entity: str
    key: Mapping[str, Any]
    values: Mapping[str, Any] = field(default_factory=dict)


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
        """The transaction data (see the module docstring).

        Raises:
            ChangeSetFormatError: a value cannot be encoded (unsupported type, non-finite float).
        """
        ops: list[dict[str, Any]] = []
        for change in self.changes:
            op: dict[str, Any] = {
                "op": change.operation.value,
                "entity": change.entity,
                "key": {k: encode_value(v) for k, v in change.key.items()},
            }
            if change.operation is not Operation.DELETE:
                op["values"] = {k: encode_value(v) for k, v in change.values.items()}
            ops.append(op)
        document: dict[str, Any] = {"v": FORMAT_VERSION, "ops": ops}
        if self.idempotency_key is not None:
            document["idempotency_key"] = self.idempotency_key
        if self.meta:
            document["meta"] = dict(self.meta)
        try:
            return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False).encode(
                "utf-8"
            )
        except (TypeError, ValueError) as exc:
            raise ChangeSetFormatError(f"change-set cannot be encoded as JSON: {exc}") from exc

    @staticmethod
    def decode(data: bytes) -> ChangeSet:
        """Parse transaction data written by :meth:`encode`.

        Raises:
            ChangeSetFormatError: not UTF-8 JSON, an unknown version or operation, or a missing field.
        """
        try:
            document = json.loads(data)
        except (ValueError, RecursionError) as exc:
            # ValueError: not UTF-8 or not JSON (JSONDecodeError), or an integer literal longer than
            # Python's digit limit; RecursionError: nesting deeper than the interpreter's stack.
            raise ChangeSetFormatError(f"change-set data is not UTF-8 JSON: {exc}") from exc
        if not isinstance(document, dict) or document.get("v") != FORMAT_VERSION:
            version = document.get("v") if isinstance(document, dict) else None
            raise ChangeSetFormatError(
                f"change-set format version {version!r} is not supported (expected {FORMAT_VERSION}); "
                "upgrade waltz-py on this instance"
            )
        changes: list[RowChange] = []
        try:
            for op in document["ops"]:
                operation = Operation(op["op"])
                values = {} if operation is Operation.DELETE else _decode_map(op["values"])
                changes.append(RowChange(operation, str(op["entity"]), _decode_map(op["key"]), values))
        except (KeyError, TypeError, ValueError) as exc:
            raise ChangeSetFormatError(f"malformed change-set operation: {exc!r}") from exc
        key = document.get("idempotency_key")
        meta = document.get("meta") or {}
        if key is not None and not isinstance(key, str):
            raise ChangeSetFormatError(f"idempotency_key must be a string, got {key!r}")
        if not isinstance(meta, dict):
            raise ChangeSetFormatError(f"meta must be a JSON object, got {type(meta).__name__}")
        return ChangeSet(changes, key, meta)


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


_DECODERS: dict[str, Any] = {
    "$decimal": decimal.Decimal,
    "$datetime": dt.datetime.fromisoformat,
    "$date": dt.date.fromisoformat,
    "$time": dt.time.fromisoformat,
    "$bytes": base64.b64decode,
    "$uuid": uuid.UUID,
}


def decode_value(raw: Any) -> Any:
    """The inverse of :func:`encode_value` (without the schema: enums come back as their values).

    Raises:
        ValueError: an unknown tag or a malformed tagged value.
    """
    if isinstance(raw, dict):
        if len(raw) != 1:
            raise ValueError(f"a tagged value has exactly one key, got {sorted(raw)}")
        ((tag, text),) = raw.items()
        decoder = _DECODERS.get(tag)
        if decoder is None:
            raise ValueError(f"unknown value tag {tag!r}")
        try:
            return decoder(text)
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed {tag} value {text!r}: {exc}") from exc
    if isinstance(raw, list):
        raise ValueError("lists are not column values")
    return raw
