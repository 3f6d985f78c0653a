"""Transaction data to row changes: change-sets decode generically, applications add decoders.

Source: docs/design/spark.md "Computing views"; ``docs/sql.md`` ("Change-set format"), decoded with
:class:`waltz.jdbc_style.ChangeSet`. A row change becomes one row of :data:`CHANGES_SCHEMA`:

``partition_id, transaction_id, op_index`` (position in the log), ``member`` (the change-set's place in
a batch, 0 outside one), ``header``, ``entity``, ``operation``
(``insert``/``update``/``delete``), ``key`` (canonical JSON text of the key, for grouping),
``key_values`` and ``values`` (``map<string,string>``: every value rendered as text, see
:func:`render_value`, cast to the column's type by :mod:`waltz.spark.views`), ``meta`` (the
change-set's ``meta`` as JSON text) and ``idempotency_key``.

The records of a partition split (a barrier or a genesis, :mod:`waltz.protocol.split_records`)
carry no row changes: their form is checked and they give none (docs/design/splits.md "Spark
across a split"). Command-style transactions (any other header) go to a decoder the application
registers for their header: ``decoders.register(header, fn)`` with ``fn(data: bytes) ->
Sequence[RowChange]``.

Given the application's schema chains, every row change is upcast to its entity's current model in
the same step, with the live apply's own code (docs/design/sql.md "Schema versions and upcasting"):
what the views see is what an instance on the current models would apply.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from waltz.jdbc_style.changeset import (
    CHANGE_SET_HEADER,
    ChangeSet,
    ChangeSetFormatError,
    ChangeSetVersionError,
    RowChange,
    decode_members,
    repeated_key_members,
)
from waltz.jdbc_style.upcasting import SchemaChains, SchemaVersionAheadError, UpcastError
from waltz.protocol.split_records import (
    SPLIT_RECORD_HEADER,
    SplitRecordFormatError,
    SplitRecordVersionError,
    decode_split_record,
)

__all__ = ["CHANGES_SCHEMA", "CommandDecoder", "DecoderRegistry", "decode_changes", "render_value"]

#: The schema of decoded row changes (Spark DDL).
CHANGES_SCHEMA = (
    "partition_id INT, transaction_id BIGINT, header INT, op_index INT, member INT, entity STRING, "
    "operation STRING, "
    "key STRING, "
    "key_values MAP<STRING, STRING>, `values` MAP<STRING, STRING>, meta STRING, idempotency_key STRING"
)

#: Decodes a command-style transaction's data into row changes.
CommandDecoder = Callable[[bytes], Sequence[RowChange]]


def render_value(value: Any) -> str | None:
    """A column value as text that Spark casts back to the column's type.

    ``None`` stays None; booleans become ``true``/``false``; numbers and decimals their exact
    text; datetimes, dates and times ISO-8601; bytes base64 (the views decode it with
    ``unbase64``); UUIDs their canonical text; enums their value.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str | decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, enum.Enum):
        return render_value(value.value)
    return str(value)


class DecoderRegistry:
    """Which decoder turns a transaction into row changes, by transaction header.

    Args:
        on_unknown: ``"fail"`` (default): a transaction with a header nobody decodes fails the
            job; ``"skip"``: it yields no row change (its mark still counts as read). Change-sets
            and split records are the framework's, whatever this says.
    """

    def __init__(self, on_unknown: str = "fail") -> None:
        if on_unknown not in ("fail", "skip"):
            raise ValueError(f"on_unknown must be 'fail' or 'skip', got {on_unknown!r}")
        self.on_unknown = on_unknown
        self._decoders: dict[int, CommandDecoder] = {}

    def register(self, header: int, decoder: CommandDecoder) -> None:
        """Decode transactions with ``header`` with ``decoder`` (must be picklable by cloudpickle).

        Raises:
            ValueError: ``header`` is the change-set or the split records' header (decoded by the
                framework).
        """
        if header in (CHANGE_SET_HEADER, SPLIT_RECORD_HEADER):
            raise ValueError(
                "change-sets and split records are decoded by the framework; register command headers only"
            )
        self._decoders[header] = decoder

    def decode(self, header: int, data: bytes) -> ChangeSet:
        """Decode one transaction (a split record: a change-set without row changes).

        Raises:
            ChangeSetVersionError: a change-set or a split record of a form newer than this code
                reads (named, its form kept).
            ChangeSetFormatError: malformed change-set or split record data, or an unknown header
                with ``"fail"``.
        """
        if header == CHANGE_SET_HEADER:
            return ChangeSet.decode(data)
        if header == SPLIT_RECORD_HEADER:
            _check_split_record(data)
            return ChangeSet(())
        decoder = self._decoders.get(header)
        if decoder is None:
            if self.on_unknown == "skip":
                return ChangeSet(())
            raise ChangeSetFormatError(
                f"no decoder for transaction header {header}: register one (DecoderRegistry.register) "
                "or use on_unknown='skip'"
            )
        return ChangeSet(tuple(decoder(data)))

    def decode_members(self, header: int, data: bytes) -> tuple[ChangeSet, ...]:
        """Decode one transaction into its change-sets: a batch's members (docs/design/sql.md
        "Batched change-sets"), none for a split record (docs/design/splits.md "Spark across a
        split"), or the one change-set of any other transaction.

        Raises:
            ChangeSetVersionError: a change-set or a split record of a form newer than this code
                reads (named, its form kept).
            ChangeSetFormatError: malformed change-set or split record data, or an unknown header
                with ``"fail"``.
        """
        if header == CHANGE_SET_HEADER:
            return decode_members(data)
        if header == SPLIT_RECORD_HEADER:
            _check_split_record(data)
            return ()
        return (self.decode(header, data),)


def _check_split_record(data: bytes) -> None:
    """Read a split record's form and fields (docs/design/splits.md "Record forms"), as the live
    apply does before it passes the record over.

    Raises:
        ChangeSetVersionError: the record is of a form newer than this code reads (its form kept:
            a newer waltz-py's record, as a change-set of a newer form is).
        ChangeSetFormatError: the record is not a barrier or a genesis of its form (the split
            record's own error chained).
    """
    try:
        decode_split_record(data)
    except SplitRecordVersionError as exc:
        raise ChangeSetVersionError(str(exc), exc.form) from exc
    except SplitRecordFormatError as exc:
        raise ChangeSetFormatError(str(exc)) from exc


def _render_map(values: Mapping[str, Any]) -> dict[str, str | None]:
    return {k: render_value(v) for k, v in values.items()}


def _decode_one(
    registry: DecoderRegistry,
    pid: int,
    txid: int,
    header: int,
    data: bytes,
    chains: SchemaChains | None = None,
    check: Callable[[RowChange], str | None] | None = None,
) -> list[tuple[Any, ...]]:
    """The row changes of one transaction as tuples of the struct fields after ``transaction_id``,
    upcast by ``chains`` when given; with ``check``, each tuple ends with its problem (or None)."""
    try:
        members = registry.decode_members(header, bytes(data))
        if chains is not None:
            members = tuple(chains.upcast(member) for member in members)
    except SchemaVersionAheadError as exc:
        # The kind of error is kept, so that the task's failure says what a rebuild makes of it.
        raise SchemaVersionAheadError(
            exc.entity, exc.version, exc.known, f"partition {pid} transaction {txid}"
        ) from exc
    except UpcastError as exc:
        raise UpcastError(f"partition {pid} transaction {txid}: {exc}") from exc
    except ChangeSetVersionError as exc:
        raise ChangeSetVersionError(f"partition {pid} transaction {txid}: {exc}", exc.version) from exc
    except ChangeSetFormatError as exc:
        raise ChangeSetFormatError(f"partition {pid} transaction {txid}: {exc}") from exc
    rows: list[tuple[Any, ...]] = []
    index = 0  # the row changes of a batch's members are numbered on, in order
    repeated = repeated_key_members(members)
    for member, change_set in enumerate(members):  # member: as ChangeSetCallbacks.member_index
        key = change_set.idempotency_key
        if member in repeated:
            # A second copy of a request in one batch: the live apply skips it, so do we.
            continue
        meta = json.dumps(dict(change_set.meta), sort_keys=True) if change_set.meta else None
        if not change_set.changes:
            # A change-set without row changes still carries its meta (applications may count it).
            empty: tuple[Any, ...] = (-1, member, None, None, None, None, None, meta, key)
            rows.append(empty + ((None,) if check is not None else ()))
        for change in change_set.changes:
            key_values = _render_map(change.key)
            values = _render_map(change.values)
            row: tuple[Any, ...] = (
                index,
                member,
                change.entity,
                change.operation.value,
                json.dumps(key_values, sort_keys=True, separators=(",", ":")),
                key_values,
                values,
                meta,
                key,
            )
            index += 1
            if check is not None:
                # Checked as rendered, as change_problems checks the decoded columns.
                row += (check(RowChange(change.operation, change.entity, key_values, values)),)
            rows.append(row)
    return rows


def decode_changes(
    log: Any,
    registry: DecoderRegistry | None = None,
    chains: SchemaChains | None = None,
    *,
    check: Callable[[RowChange], str | None] | None = None,
) -> Any:
    """Decode a log DataFrame (the ``waltz`` source's columns) into row changes.

    Args:
        log: a DataFrame with at least ``partition_id, transaction_id, header, data``.
        registry: decoders for command-style headers (default: change-sets only, others fail).
        chains: the application's schema chains (``EntityRegistry.schema_chains()``): every row
            change is upcast to its entity's current model. None: changes keep the attributes
            they were written with.
        check: run on every row change as it is decoded (values rendered as text), e.g.
            :func:`waltz.spark.views.change_check`: its answer is the row's ``problem`` column
            (docs/design/spark.md "Computing views": the model check in the decoding pass).

    Returns:
        A DataFrame of :data:`CHANGES_SCHEMA`, then ``problem STRING`` when ``check`` is given; a
        change-set without row changes (a transaction, or a member of a batch) gives one row with
        ``op_index`` -1 and null entity (so its ``meta`` is kept).

    Raises:
        ChangeSetFormatError: (when the job runs) a transaction could not be decoded; its
            :class:`~waltz.jdbc_style.upcasting.UpcastError` (an upcaster failed) and
            :class:`~waltz.jdbc_style.upcasting.SchemaVersionAheadError` (a change newer than the
            models) and :class:`~waltz.jdbc_style.changeset.ChangeSetVersionError` (a form newer
            than this code) stay of their kind, named by partition and transaction.
    """
    from pyspark.sql import functions as func

    chosen = registry or DecoderRegistry()
    struct = (
        "op_index INT, member INT, entity STRING, operation STRING, key STRING, "
        "key_values MAP<STRING, STRING>, `values` MAP<STRING, STRING>, meta STRING, idempotency_key STRING"
    ) + (", problem STRING" if check is not None else "")

    def decode(pid: int, txid: int, header: int, data: bytes) -> list[tuple[Any, ...]]:
        return _decode_one(chosen, pid, txid, header, data, chains, check)

    # A plain Python UDF (not Arrow-optimized): it needs neither pandas nor a schema per batch.
    udf = func.udf(decode, f"ARRAY<STRUCT<{struct}>>", useArrow=False)
    exploded = log.select(
        "partition_id",
        "transaction_id",
        "header",
        func.explode(udf("partition_id", "transaction_id", "header", "data")).alias("c"),
    )
    return exploded.select("partition_id", "transaction_id", "header", "c.*")
