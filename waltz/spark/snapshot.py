"""Snapshots: an application's tables as of one set of marks, as Parquet files with a manifest.

Source: docs/design/spark.md "Snapshots". ``waltz snapshot`` reads the application's tables
(``AppViews.tables``), this log's high-water-mark rows and its idempotency keys in one database
transaction, so every table is exactly the state at those marks, and writes one Parquet file per
table plus ``manifest.json`` (written last: a directory without one is not a snapshot). A rebuild
from a snapshot (:func:`waltz.spark.rebuild.compute_views` with ``snapshot=``) replays only the log
after its marks on top of it; :func:`load_snapshot` writes it into a database, from which an
application instance resumes the log after the marks.

The location is a directory or any URL that ``pyarrow.fs`` opens (``s3://bucket/path``,
``gs://...``, ``hdfs://...``); every file is checked against the manifest's SHA-256 and row count
before it is used.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import functools
import itertools
import json
import logging
import posixpath
import re
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, Table, delete, insert, select, types
from sqlalchemy.engine import Connection

from waltz.archive.layout import ARCHIVE_MANIFEST
from waltz.archive.location import (
    LocationError,
    check_form,
    create_private_dir,
    file_sha256,
    finish_file,
    int_field,
    str_field,
    write_json_atomically,
)
from waltz.archive.location import open_location as open_any_location
from waltz.errors import WaltzError
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.marks import HighWaterMarks, logs_followed
from waltz.jdbc_style.schema import high_water_marks, idempotency_keys
from waltz.jdbc_style.upcasting import StoredRows, UpcastError
from waltz.spark.views import DECIMAL_PRECISION, carries_decimal_text

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

    from waltz.jdbc_style.entities import EntityInfo
    from waltz.spark.views import AppViews

__all__ = [
    "MANIFEST_NAME",
    "PARQUET_DECIMAL_PRECISION",
    "SNAPSHOT_FORM",
    "SnapshotEntityRows",
    "SnapshotError",
    "SnapshotFile",
    "SnapshotManifest",
    "SnapshotSeed",
    "SnapshotUnreadableError",
    "check_snapshot",
    "check_stored_rows",
    "describe_stored",
    "entity_file",
    "keeps_decimal_text",
    "load_snapshot",
    "open_location",
    "read_manifest",
    "read_snapshot_file",
    "replays_every_row",
    "rows_as_changes",
    "snapshot_entity_rows",
    "stored_rows",
    "upcast_rows",
    "verify_snapshot",
    "write_snapshot",
]

log = logging.getLogger(__name__)

#: The newest snapshot manifest form (``"form"``) this code reads; a reader refuses a newer one.
#: A snapshot is written at form 2 when a table keeps a column as decimal text
#: (``SnapshotFile.decimal_text``), which a reader of form 1 would hand its upcasters as text;
#: at form 1 otherwise, which every release reads.
SNAPSHOT_FORM = 2
#: The largest precision of a Parquet decimal here (``decimal128``, as Spark's ``DecimalType``).
PARQUET_DECIMAL_PRECISION = DECIMAL_PRECISION
#: The manifest's file name in a snapshot directory.
MANIFEST_NAME = "manifest.json"
#: What ``"kind"`` says in a snapshot's manifest.
SNAPSHOT_KIND = "waltz-snapshot"
#: Rows per Parquet row group and per read from the database.
BATCH_ROWS = 50_000
#: A rebuild from a snapshot replays every row of an entity file, without joining the file with
#: the log's keys, when the file holds at most this many rows per transaction of the log after
#: the snapshot's marks (:func:`replays_every_row`; decision 0076).
REPLAY_EVERY_ROW_PER_TRANSACTION = 1.0

#: How many rows of an older model's entity file the driver upcasts before a rebuild's Spark jobs
#: (:func:`check_stored_rows`).
CHECKED_ROWS = 100

Progress = Callable[[str], None]


class SnapshotError(WaltzError):
    """A snapshot that cannot be written, read or trusted: names the file and what is wrong."""


class SnapshotUnreadableError(SnapshotError):
    """No snapshot can be read at a location: it does not exist, holds no manifest (a snapshot
    still being written has none yet), or its manifest cannot be opened; as against a snapshot
    that is there and damaged (a plain :class:`SnapshotError`)."""


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    """One table of a snapshot.

    Attributes:
        table: the table's name.
        file: the Parquet file, relative to the snapshot's location.
        rows: its row count.
        sha256: the SHA-256 of the file's bytes, hex.
        columns: ``(name, SQL type)`` of each column, in order (the type as SQLAlchemy names it).
        decimal_text: the decimal columns kept as their exact text (a Parquet string), those
            whose declaration no Parquet decimal holds (:func:`keeps_decimal_text`); empty in a
            snapshot of form 1, whose decimal columns are all Parquet decimals.
    """

    table: str
    file: str
    rows: int
    sha256: str
    columns: tuple[tuple[str, str], ...] = ()
    decimal_text: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "table": self.table,
            "file": self.file,
            "rows": self.rows,
            "sha256": self.sha256,
            "columns": [list(c) for c in self.columns],
        }
        if self.decimal_text:
            out["decimal_text"] = list(self.decimal_text)
        return out

    @staticmethod
    def from_json(raw: Any, where: str) -> SnapshotFile:
        """Parse a table entry of a manifest, every field of its own type.

        Raises:
            SnapshotError: a field missing or of another type, a row count below 0, a SHA-256 that
                is not 64 hex digits, or a file that is not a plain name in the snapshot's own
                directory (``../x.parquet``, ``a/b``): named.
        """
        if not isinstance(raw, Mapping):
            raise SnapshotError(f"{where}: a table entry is {raw!r}, expected an object")
        table = str_field(raw, "table", where, SnapshotError)
        file = str_field(raw, "file", where, SnapshotError)
        if file in ("", ".", "..") or "/" in file or "\\" in file:
            raise SnapshotError(f"{where}: table {table!r}: file {file!r} is not a file name of the snapshot")
        rows = int_field(raw, "rows", where, SnapshotError)
        sha256 = str_field(raw, "sha256", where, SnapshotError)
        if rows < 0 or not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise SnapshotError(f"{where}: table {table!r}: rows {rows!r} or sha256 {sha256!r} malformed")
        columns = raw.get("columns", [])
        if not isinstance(columns, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(isinstance(part, str) for part in c) for c in columns
        ):
            raise SnapshotError(f"{where}: table {table!r}: columns {columns!r}, expected [name, type] pairs")
        decimal_text = raw.get("decimal_text", [])
        names = {n for n, _ in columns}
        if (
            not isinstance(decimal_text, list)
            or not all(isinstance(c, str) for c in decimal_text)
            or (names and not set(decimal_text) <= names)
        ):
            raise SnapshotError(
                f"{where}: table {table!r}: decimal_text {decimal_text!r}, expected a list of its columns"
            )
        return SnapshotFile(table, file, rows, sha256, tuple((n, t) for n, t in columns), tuple(decimal_text))


@dataclass(frozen=True, slots=True)
class SnapshotManifest:
    """What a snapshot holds (``manifest.json``; docs/design/spark.md "Snapshots" lists every field).

    Attributes:
        cluster_name: the log's name in the database's mark rows.
        marks: ``{partition: high-water mark}``: every table is the state after exactly these
            transactions (-1: none of the partition).
        entities: ``{entity name: {"schema_version": n, "table": name, "attributes": {attribute:
            column}, "key": [attribute, ...]}}`` of the application's models when the snapshot was
            written (``attributes`` and ``key`` absent from snapshots written before they were
            recorded).
        tables: one entry per application table.
        idempotency_keys: this log's rows of ``waltz_idempotency_keys``.
        written_at: when the snapshot's database transaction read the tables (UTC, ISO 8601).
        dialect: the database it was read from (``postgresql``, ``mysql``, ``sqlite``).
        cluster_key_fingerprint: reserved: ``sha256:<hex>`` of the cluster key (never the key)
            when the writer's caller passed one, else None (``waltz snapshot create``, which reads
            a database with no cluster at hand, writes None); no reader uses it
            (docs/design/spark.md, "Snapshots").
        form: the manifest's form: 2 when a table keeps a column as decimal text, else 1 (a
            reader takes up to :data:`SNAPSHOT_FORM`).
    """

    cluster_name: str
    marks: Mapping[int, int]
    entities: Mapping[str, Mapping[str, Any]]
    tables: Sequence[SnapshotFile]
    idempotency_keys: SnapshotFile
    written_at: str
    dialect: str
    cluster_key_fingerprint: str | None = None
    form: int = SNAPSHOT_FORM

    def to_json(self) -> dict[str, Any]:
        return {
            "form": self.form,
            "kind": SNAPSHOT_KIND,
            "cluster_name": self.cluster_name,
            "cluster_key_fingerprint": self.cluster_key_fingerprint,
            "marks": {str(p): m for p, m in sorted(self.marks.items())},
            "entities": {name: dict(e) for name, e in sorted(self.entities.items())},
            "tables": [t.to_json() for t in self.tables],
            "idempotency_keys": self.idempotency_keys.to_json(),
            "written_at": self.written_at,
            "dialect": self.dialect,
        }

    @staticmethod
    def from_json(raw: Any, where: str) -> SnapshotManifest:
        """Parse a manifest.

        Raises:
            SnapshotError: not a snapshot manifest, a newer form than this code reads, or a
                field missing or malformed (named), an entity's ``table`` among them.
        """
        raw = check_form(
            raw, kind=SNAPSHOT_KIND, newest=SNAPSHOT_FORM, noun="snapshot", where=where, error=SnapshotError
        )
        form = raw["form"]
        cluster_name = str_field(raw, "cluster_name", where, SnapshotError)
        if not cluster_name:
            raise SnapshotError(f"{where}: field 'cluster_name' is empty")
        marks, entities, tables = raw.get("marks"), raw.get("entities", {}), raw.get("tables")
        if not isinstance(marks, Mapping) or not all(
            re.fullmatch(r"0|[1-9][0-9]*", p) and type(m) is int and m >= -1 for p, m in marks.items()
        ):
            raise SnapshotError(f"{where}: field 'marks' is {marks!r}, expected {{partition: mark >= -1}}")
        if not isinstance(entities, Mapping) or not all(isinstance(e, Mapping) for e in entities.values()):
            raise SnapshotError(f"{where}: field 'entities' is {entities!r}, expected an object of objects")
        for entity_name, entity in entities.items():
            str_field(entity, "table", f"{where}: entity {entity_name!r}", SnapshotError)
        if not isinstance(tables, list):
            raise SnapshotError(f"{where}: field 'tables' is {tables!r}, expected a list")
        fingerprint = raw.get("cluster_key_fingerprint")
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise SnapshotError(
                f"{where}: field 'cluster_key_fingerprint' is {fingerprint!r}, expected a string"
            )
        dialect = raw.get("dialect", "")
        if not isinstance(dialect, str):
            raise SnapshotError(f"{where}: field 'dialect' is {dialect!r}, expected a string")
        return SnapshotManifest(
            cluster_name=cluster_name,
            marks={int(p): m for p, m in marks.items()},
            entities={str(n): dict(e) for n, e in entities.items()},
            tables=[SnapshotFile.from_json(t, where) for t in tables],
            idempotency_keys=SnapshotFile.from_json(raw.get("idempotency_keys"), where),
            written_at=str_field(raw, "written_at", where, SnapshotError),
            dialect=dialect,
            cluster_key_fingerprint=fingerprint,
            form=form,
        )

    def table(self, name: str) -> SnapshotFile | None:
        """The entry of a table, or None."""
        return next((t for t in self.tables if t.table == name), None)


# --- locations -------------------------------------------------------------------------------------


def open_location(location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path of a directory or a URL (``s3://...``), for ``pyarrow.fs``.

    :func:`waltz.archive.location.open_location`, with its errors as :class:`SnapshotError`.

    Raises:
        SnapshotError: pyarrow is missing, or the URL names no filesystem pyarrow knows.
    """
    try:
        return open_any_location(location)
    except LocationError as exc:
        raise SnapshotError(str(exc)) from exc


# --- types -----------------------------------------------------------------------------------------


def arrow_type(column_type: types.TypeEngine[Any]) -> pa.DataType:
    """The Arrow type a column's values are kept as in a snapshot.

    Raises:
        SnapshotError: a type without a Parquet form here (override it in the application).
    """
    import pyarrow as pa

    checks: list[tuple[type[Any], pa.DataType]] = [
        (types.Boolean, pa.bool_()),
        (types.BigInteger, pa.int64()),
        (types.SmallInteger, pa.int64()),
        (types.Integer, pa.int64()),
        (types.Float, pa.float64()),
        (types.Date, pa.date32()),
        (types.Time, pa.time64("us")),
        (types.LargeBinary, pa.binary()),
        (types.BINARY, pa.binary()),
        (types.VARBINARY, pa.binary()),
        (types.Uuid, pa.string()),
        (types.Enum, pa.string()),
        (types.String, pa.string()),
        (types.JSON, pa.string()),
    ]
    if isinstance(column_type, types.DateTime):
        return pa.timestamp("us", tz="UTC") if column_type.timezone else pa.timestamp("us")
    if keeps_decimal_text(column_type):
        return pa.string()
    if isinstance(column_type, types.Numeric) and not isinstance(column_type, types.Float):
        assert column_type.precision is not None and column_type.scale is not None  # keeps_decimal_text
        return pa.decimal128(column_type.precision, column_type.scale)
    for kind, arrow in checks:
        if isinstance(column_type, kind):
            return arrow
    raise SnapshotError(f"no Parquet type for the SQL type {column_type!r}")


def keeps_decimal_text(column_type: types.TypeEngine[Any]) -> bool:
    """Whether a snapshot keeps a decimal column's values as their exact text (a Parquet
    string; docs/design/spark.md "Snapshots"): the columns the rebuild carries as decimal text
    (:func:`waltz.spark.views.carries_decimal_text`). A decimal column of both a precision and a
    scale, within :data:`PARQUET_DECIMAL_PRECISION` digits, is a Parquet decimal of its own
    precision and scale."""
    return carries_decimal_text(column_type)


def sql_type_name(column_type: types.TypeEngine[Any]) -> str:
    """A column's SQL type as a manifest records it: as SQLAlchemy renders it, but ``UUID`` for a
    UUID column whose attribute holds ``uuid.UUID`` values (``as_uuid``), which a dialect without
    one stores as ``CHAR(32)``: its values are text in the Parquet file either way, and a reader
    that upcasts them gives the upcasters ``uuid.UUID`` values, as the log does."""
    return "UUID" if isinstance(column_type, types.Uuid) and column_type.as_uuid else str(column_type)


def _arrow_value(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value


def _decimal_text(value: Any) -> Any:
    """A decimal column's value as the exact text a snapshot keeps (``str`` of a ``Decimal``, as
    a change-set's ``$decimal`` and the rebuild's rendering write it; ``repr`` of a float)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, decimal.Decimal | int) and not isinstance(value, bool):
        return str(value)
    return value


def _decimal_value(value: Any) -> Any:
    """A value of a Parquet decimal column: a float (a ``Numeric(asdecimal=False)``) as the
    ``Decimal`` of its shortest text."""
    return decimal.Decimal(repr(value)) if isinstance(value, float) else _arrow_value(value)


def _table_schema(table: Table) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([pa.field(c.name, arrow_type(c.type), nullable=True) for c in table.columns])


def _value_converters(table: Table) -> list[Callable[[Any], Any]]:
    """Per column of ``table``: its value as the snapshot's Arrow type takes it."""
    converters: list[Callable[[Any], Any]] = []
    for column in table.columns:
        if keeps_decimal_text(column.type):
            converters.append(_decimal_text)
        elif isinstance(column.type, types.Numeric) and not isinstance(column.type, types.Float):
            converters.append(_decimal_value)
        else:
            converters.append(_arrow_value)
    return converters


def _unfit_value(
    table: Table, column: str, arrow: pa.DataType, values: Sequence[Any], error: Exception
) -> SnapshotError:
    """The error of a batch that pyarrow refused: the first value of ``values`` that does not
    convert to ``arrow`` named, with the table, the column and the SQL type."""
    import pyarrow as pa

    culprit: Any = None
    for value in values:
        try:
            pa.array([value], type=arrow)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            culprit, error = value, exc
            break
    shown = repr(culprit)
    shown = shown if len(shown) <= 120 else shown[:117] + "..."
    return SnapshotError(
        f"table {table.name}, column {column}: the value {shown} does not fit the snapshot's Parquet "
        f"type {arrow} of the column's {table.c[column].type} ({error}); the database holds a value "
        "its declared type does not: correct the row, or declare the column's type as the database "
        "holds it. Nothing was written"
    )


# --- writing ---------------------------------------------------------------------------------------


def _write_table(filesystem: pafs.FileSystem, path: str, table: Table, rows: Iterator[Sequence[Any]]) -> int:
    """Write ``table``'s rows to a Parquet file at ``path``: their count.

    Raises:
        SnapshotError: a value does not convert to its column's Arrow type (named).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _table_schema(table)
    converters = _value_converters(table)
    count = 0
    with filesystem.open_output_stream(path) as stream, pq.ParquetWriter(stream, schema) as writer:
        batch: list[Sequence[Any]] = []

        def flush() -> None:
            columns = list(zip(*batch, strict=True)) if batch else [() for _ in schema]
            arrays = []
            for column, field, convert in zip(columns, schema, converters, strict=True):
                values = [convert(v) for v in column]
                try:
                    arrays.append(pa.array(values, type=field.type))
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                    raise _unfit_value(table, field.name, field.type, values, exc) from exc
            writer.write_table(pa.Table.from_arrays(arrays, schema=schema))

        for row in rows:
            batch.append(tuple(row))
            count += 1
            if len(batch) >= BATCH_ROWS:
                flush()
                batch = []
        if batch or count == 0:
            flush()
    finish_file(filesystem, path)  # 0600 and on disk before the manifest names it
    return count


def write_snapshot(
    app: AppViews,
    db_url: str | Engine,
    location: str,
    *,
    cluster_name: str | None = None,
    cluster_key_fingerprint: str | None = None,
    progress: Progress | None = None,
) -> SnapshotManifest:
    """Write the application's tables, marks and idempotency keys as one consistent snapshot.

    Args:
        app: the application's views (its ``tables`` are written; its ``entities`` recorded).
        db_url: the application's database (a SQLAlchemy URL or an engine).
        location: an empty directory or URL (created when missing).
        cluster_name: the log's name in the mark rows (default ``app.cluster_name``).
        cluster_key_fingerprint: ``sha256:<hex>`` of the cluster key
            (:func:`waltz.protocol.cluster_key.cluster_key_fingerprint`), recorded in the
            manifest when given (reserved: no reader uses it); None writes null.
        progress: called with a line per table.

    Returns:
        The manifest written.

    Raises:
        SnapshotError: the location holds a snapshot already, a table has a column type
            without a Parquet form, or the database holds no marks of the log ``cluster_name``
            while an application table holds rows (naming the logs whose marks it holds). Nothing
            is left at the location: the files written before the failure are removed, and the
            directory when this call made it.
        sqlalchemy.exc.DBAPIError: the database failed.
    """
    say = progress or (lambda _: None)
    name = cluster_name or app.cluster_name
    filesystem, root = open_location(location)
    manifest_path = posixpath.join(root, MANIFEST_NAME)
    import pyarrow.fs as pafs

    if filesystem.get_file_info(manifest_path).type != pafs.FileType.NotFound:
        raise SnapshotError(f"{location} holds a snapshot already ({MANIFEST_NAME}); choose a new location")
    engine = db_url if isinstance(db_url, Engine) else create_framework_engine(db_url)
    written: list[str] = []  # the files this call wrote, removed when it fails
    made = filesystem.get_file_info(root).type == pafs.FileType.NotFound
    try:
        _require_tables(engine, app, name)
        create_private_dir(filesystem, root)
        dialect = engine.dialect.name
        connection = engine.connect()
        try:
            if dialect != "sqlite":
                connection = connection.execution_options(isolation_level="REPEATABLE READ")
            with connection.begin():
                if dialect in ("mysql", "mariadb"):
                    from sqlalchemy import text

                    connection.execute(text("SELECT 1"))  # the snapshot starts at the first read
                marks = HighWaterMarks(name).read_all(connection)
                if not marks:
                    _refuse_rows_without_marks(connection, engine, app, name)
                written_at = dt.datetime.now(dt.UTC).isoformat()
                files: list[SnapshotFile] = []
                for table in app.tables:
                    file = f"{table.name}.parquet"
                    written.append(posixpath.join(root, file))
                    rows = connection.execution_options(yield_per=BATCH_ROWS).execute(
                        select(*table.columns).order_by(*table.primary_key.columns)
                    )
                    count = _write_table(filesystem, posixpath.join(root, file), table, iter(rows))
                    digest = file_sha256(filesystem, posixpath.join(root, file))
                    files.append(
                        SnapshotFile(
                            table.name,
                            file,
                            count,
                            digest,
                            tuple((c.name, sql_type_name(c.type)) for c in table.columns),
                            tuple(c.name for c in table.columns if keeps_decimal_text(c.type)),
                        )
                    )
                    say(f"{table.name}: {count} rows")
                keys_file = "waltz_idempotency_keys.parquet"
                written.append(posixpath.join(root, keys_file))
                keys = connection.execution_options(yield_per=BATCH_ROWS).execute(
                    select(*idempotency_keys.columns)
                    .where(idempotency_keys.c.cluster_name == name)
                    .order_by(idempotency_keys.c.idempotency_key)
                )
                key_count = _write_table(
                    filesystem, posixpath.join(root, keys_file), idempotency_keys, iter(keys)
                )
                say(f"idempotency keys: {key_count}")
        finally:
            connection.close()
        entities: dict[str, dict[str, Any]] = {}
        if app.entities is not None:
            for info in app.entities:
                entities[info.name] = {
                    "schema_version": info.schema_version,
                    "table": info.model.__table__.name,
                    "attributes": _attribute_columns(info),
                    "key": list(info.key),
                }
        manifest = SnapshotManifest(
            cluster_name=name,
            marks=marks,
            entities=entities,
            tables=files,
            idempotency_keys=SnapshotFile(
                idempotency_keys.name,
                keys_file,
                key_count,
                file_sha256(filesystem, posixpath.join(root, keys_file)),
                tuple((c.name, str(c.type)) for c in idempotency_keys.columns),
            ),
            written_at=written_at,
            dialect=dialect,
            cluster_key_fingerprint=cluster_key_fingerprint,
            form=2 if any(f.decimal_text for f in files) else 1,
        )
        write_json_atomically(filesystem, manifest_path, manifest.to_json())
    except BaseException:
        _remove_partial(filesystem, root, written, made)
        raise
    finally:
        if not isinstance(db_url, Engine):
            engine.dispose()
    say(f"snapshot at marks {dict(sorted(marks.items()))} written to {location}")
    return manifest


def _refuse_rows_without_marks(connection: Connection, engine: Engine, app: AppViews, name: str) -> None:
    """Refuse a snapshot under a log name the database holds no marks of while an application
    table holds rows (docs/design/spark.md "Snapshots"): loaded, its rows would have no marks, and
    an instance would apply the log from its start onto them. Read in the snapshot's transaction.

    Raises:
        SnapshotError: naming the tables with rows and the logs whose marks the database holds.
    """
    held = [
        table.name
        for table in app.tables
        if connection.execute(select(*table.primary_key.columns).limit(1)).first() is not None
    ]
    if not held:
        return  # nothing applied under any name: the snapshot of the log's start
    others = sorted(logs_followed(connection))
    where = engine.url.render_as_string(hide_password=True)
    if others:
        advice = (
            f"it holds the marks of the logs {others}: give the name of the log it follows "
            f"(waltz snapshot create --cluster-name {others[0]}; cluster_name={others[0]!r})"
        )
    else:
        advice = "it holds no marks of any log: its rows were not applied from a log"
    raise SnapshotError(
        f"the database {where} has no marks of the log {name!r}, yet rows in {', '.join(held)}: a "
        "snapshot of them without marks would have an instance on a database it is loaded into apply "
        f"the log from its start onto them; {advice}. Nothing was written"
    )


def _remove_partial(filesystem: pafs.FileSystem, root: str, files: Sequence[str], made: bool) -> None:
    """Remove what a failed ``write_snapshot`` wrote: its files, and the directory when it made
    it and nothing else is in it. Best effort: a file that cannot be removed is logged (without
    a manifest the location is no snapshot either way)."""
    import pyarrow.fs as pafs

    for path in files:
        try:
            if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
                filesystem.delete_file(path)
        except OSError as exc:
            log.warning("could not remove %s of a snapshot that failed: %s", path, exc)
    if not made:
        return
    try:
        info = filesystem.get_file_info(root)
        if info.type == pafs.FileType.Directory and not filesystem.get_file_info(pafs.FileSelector(root)):
            filesystem.delete_dir(root)
    except OSError as exc:
        log.warning("could not remove the directory %s of a snapshot that failed: %s", root, exc)


# --- reading ---------------------------------------------------------------------------------------


def entity_file(manifest: SnapshotManifest, info: EntityInfo) -> SnapshotFile | None:
    """The file of an entity's rows (docs/design/spark.md "Snapshots of an older model"): the
    one of the table the manifest records for the entity (a model may have moved to another
    table since); None when the snapshot has no file of that table (its table was not among the
    application's tables when the snapshot was written: a snapshot holds ``AppViews.tables``
    only), whatever file the model's table has now: that file holds that table's rows, not the
    entity's. An entity the manifest does not record (declared since) is read from its model's
    table's file, when the snapshot has one."""
    recorded = manifest.entities.get(info.name)
    if recorded is not None:
        return manifest.table(recorded["table"])  # a string: SnapshotManifest.from_json
    return manifest.table(info.model.__table__.name)


def stored_rows(
    manifest: SnapshotManifest, info: EntityInfo, where: str = "the snapshot"
) -> StoredRows | None:
    """How the rows of an entity file that an older model wrote become rows of ``info``'s model
    (docs/design/spark.md "Snapshots of an older model"), or None when the snapshot holds the
    entity at the model's schema version (or not at all), read by the model's own columns. A file
    of the model's schema version whose manifest gives the model's attributes, one of them on
    another column (a release that kept a renamed attribute on its old column), is read by the
    manifest's mapping, without upcasting.

    The manifest's ``attributes`` and ``key`` of the entity name the stored columns' attributes
    and the key at that version; a manifest written before it recorded them gives each column's
    name as its attribute, and the model's key attributes with the chain's renames undone.

    Raises:
        SnapshotError: the entity's schema version is not an integer of at least 1, or newer than
            the model's; its entry names a table without a file, columns the file does not have,
            or a key attribute it does not store.
    """
    recorded = manifest.entities.get(info.name)
    if recorded is None:
        return None
    raw_version = recorded.get("schema_version", 1)
    if type(raw_version) is not int or raw_version < 1:
        raise SnapshotError(
            f"{where}: the manifest gives {info.name} the schema version {raw_version!r}, not an integer "
            "of at least 1"
        )
    version = raw_version
    if version > info.schema_version:
        raise SnapshotError(
            f"{where}: {info.name} is at schema version {version} in the snapshot, newer than the "
            f"application's model ({info.schema_version}): read it with the release of the newer model"
        )
    entry = entity_file(manifest, info)
    if entry is None:
        return None
    stored = [name for name, _ in entry.columns]
    raw_attributes = recorded.get("attributes")
    if version == info.schema_version and (
        not isinstance(raw_attributes, Mapping)
        or set(raw_attributes) != set(info.attributes)
        or _attribute_columns(info) == dict(raw_attributes)
    ):
        return None  # read by the model's own columns
    if isinstance(raw_attributes, Mapping):
        attributes = tuple((str(a), str(c)) for a, c in raw_attributes.items())
    else:
        attributes = tuple((c, c) for c in stored)
    absent = [c for _, c in attributes if stored and c not in stored]
    raw_key = recorded.get("key")
    key = (
        tuple(str(k) for k in raw_key)
        if isinstance(raw_key, list)
        else info.schema.names_at(version, info.key)
    )
    names = {a for a, _ in attributes}
    unknown_key = [k for k in key if k not in names]
    if absent or unknown_key:
        problems = []
        if absent:
            problems.append(f"the manifest names columns {absent} that the file {entry.file} does not have")
        if unknown_key:
            problems.append(
                f"the key {list(key)} names attributes {unknown_key} that the file does not store"
            )
        raise SnapshotError(
            f"{where}: {info.name} at schema version {version}: {'; '.join(problems)} (its columns: {stored})"
        )
    uuids = tuple(name for name, sql_type in entry.columns if sql_type.upper() == "UUID")
    return StoredRows(info.schema, version, attributes, key, info.attributes, uuids, entry.decimal_text)


def describe_stored(upcast: StoredRows) -> str:
    """``upcast from schema version N``, or ``its attributes read from the snapshot's columns``
    when only the attributes' columns differ (for the progress lines)."""
    if upcast.version == upcast.chain.version:
        return "its attributes read from the snapshot's columns"
    return f"upcast from schema version {upcast.version}"


def check_stored_rows(
    location: str, manifest: SnapshotManifest, info: EntityInfo, upcast: StoredRows
) -> None:
    """Upcast the first rows of an older model's entity file where the driver runs, so that a
    mapping the upcasters do not lead to the model is refused before a Spark job starts (a row
    upcaster that fails on a later row only still fails the job).

    Raises:
        SnapshotError: a row does not upcast (naming the file and the upcaster's error).
    """
    entry = entity_file(manifest, info)
    if entry is None or entry.rows == 0:
        return
    with contextlib.closing(_rows(location, entry, CHECKED_ROWS)) as rows:
        first = itertools.islice(rows, CHECKED_ROWS)
        for _ in upcast_rows(first, upcast, info, f"{location}: {entry.file}"):
            pass


def check_snapshot(location: str, app: AppViews, manifest: SnapshotManifest | None = None) -> list[str]:
    """Whether the application's current models load a verified snapshot, checked as
    ``load_snapshot`` checks it, without a database (docs/design/spark.md "Snapshots of an older
    model"): each table is in it; an entity file of an older model (or on other columns) upcasts,
    every row of it; any other file has the table's columns. Reads every row of the older models'
    files, nothing of the others. The values are not held to the database's types or constraints.

    Returns:
        One line per table: its rows, and how they are read.

    Raises:
        SnapshotError: what the load would refuse (naming the table, the file or the row).
    """
    manifest = manifest if manifest is not None else verify_snapshot(location)
    lines = []
    for table_name, plan in _table_plans(location, manifest, app).items():
        entry = plan.entry
        if plan.empty:
            lines.append(f"{table_name}: 0 rows, {_NO_ENTITY_ROWS}")
            continue
        if entry is None:
            raise SnapshotError(f"{location}: the snapshot has no table {table_name}")
        if plan.upcast is not None and plan.info is not None:
            where = f"{location}: {entry.file}"
            count = sum(1 for _ in upcast_rows(_rows(location, entry), plan.upcast, plan.info, where))
            lines.append(f"{table_name}: {count} rows, {describe_stored(plan.upcast)}")
            continue
        table = next(t for t in app.tables if t.name == table_name)
        _check_columns(location, table, entry)
        lines.append(f"{table_name}: {entry.rows} rows, the application's columns")
    return lines


#: How ``load_snapshot`` and ``check_snapshot`` describe a table planned ``empty``.
_NO_ENTITY_ROWS = "the snapshot holds no rows of its entity (no file of the table its manifest records)"


@dataclass(frozen=True, slots=True)
class _TablePlan:
    """How the load reads one application table from a snapshot: its file (None: missing, or no
    rows when ``empty``), and for an older model's entity rows how they upcast.

    Attributes:
        empty: the table is an entity's, and the snapshot holds none of the entity's rows (the
            table the manifest records for it has no file): it loads no rows, as a rebuild from
            the snapshot gives it none (docs/design/spark.md "Snapshots of an older model").
    """

    entry: SnapshotFile | None
    upcast: StoredRows | None = None
    info: EntityInfo | None = None
    empty: bool = False


def _table_plans(location: str, manifest: SnapshotManifest, app: AppViews) -> dict[str, _TablePlan]:
    """Per table of ``app.tables``, in order: how ``load_snapshot`` and ``check_snapshot`` read it.
    An entity's file is the one of the table its manifest entry records (a model may have moved to
    another table since it was written); an entity recorded on a table of which the snapshot has
    no file gives its table no rows (``empty``), not the rows of a file named after its model's
    table now, as a rebuild from the snapshot does (docs/design/spark.md "Snapshots of an older
    model").

    Raises:
        SnapshotError: as :func:`stored_rows`, or two entities on one table both stored by an
            older model.
    """
    entries: dict[str, SnapshotFile] = {}
    empty: set[str] = set()
    older: dict[str, tuple[StoredRows, EntityInfo]] = {}
    for info in app.entities or ():
        table_name = info.model.__table__.name
        entry = entity_file(manifest, info)
        if entry is not None:
            entries.setdefault(table_name, entry)
        elif info.name in manifest.entities:
            empty.add(table_name)
        upcast = stored_rows(manifest, info, location)
        if upcast is None:
            continue
        if table_name in older:
            raise SnapshotError(
                f"{location}: the entities {older[table_name][1].name} and {info.name} share table "
                f"{table_name} and are both stored by an older model: load it with the release that "
                "wrote it, then migrate"
            )
        older[table_name] = (upcast, info)
        if entry is not None:
            entries[table_name] = entry
    plans = {}
    for table in app.tables:
        upcast, info = older.get(table.name, (None, None))
        entry = entries.get(table.name)
        if entry is None and table.name in empty:
            plans[table.name] = _TablePlan(None, empty=True)
            continue
        plans[table.name] = _TablePlan(entry or manifest.table(table.name), upcast, info)
    return plans


def _check_columns(
    location: str,
    table: Table,
    entry: SnapshotFile,
    advice: str = "load it with the application's version that wrote it, then migrate",
) -> None:
    """A file read as it is must have the table's columns.

    Raises:
        SnapshotError: it has others (the message ends with ``advice``).
    """
    names = [c.name for c in table.columns]
    if entry.columns and [n for n, _ in entry.columns] != names:
        raise SnapshotError(
            f"{location}: table {table.name} has columns {[n for n, _ in entry.columns]} in the "
            f"snapshot and {names} in the application; {advice}"
        )


def _attribute_columns(info: EntityInfo) -> dict[str, str]:
    """The model's attribute -> column name, in the model's order (a manifest's ``attributes``)."""
    return {a: c.name for a, c in zip(info.attributes, info.columns, strict=True)}


def upcast_rows(
    rows: Iterator[dict[str, Any]], upcast: StoredRows, info: EntityInfo, where: str
) -> Iterator[dict[str, Any]]:
    """Stored rows of an older model as rows of ``info``'s table (column -> value).

    Raises:
        SnapshotError: a row does not upcast (naming the file and the upcaster's error).
    """
    column_of = _attribute_columns(info)
    for row in rows:
        try:
            values = upcast.upcast(row)
        except UpcastError as exc:
            raise SnapshotError(f"{where}: {exc}") from exc
        yield {column_of[a]: v for a, v in values.items()}


def read_manifest(location: str) -> SnapshotManifest:
    """The manifest of a snapshot.

    Raises:
        SnapshotUnreadableError: no such location, no manifest there, or one that cannot be opened.
        SnapshotError: a manifest that is not JSON, or not a snapshot manifest this code reads.
    """
    filesystem, root = open_location(location)
    path = posixpath.join(root, MANIFEST_NAME)
    try:
        with filesystem.open_input_stream(path) as stream:
            data = stream.read()
    except (FileNotFoundError, OSError) as exc:
        raise SnapshotUnreadableError(f"{location}: {_no_manifest(filesystem, root, exc)}") from exc
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:  # not JSON, nested too deep, too many digits
        raise SnapshotError(f"{location}/{MANIFEST_NAME} is not JSON: {exc}") from exc
    return SnapshotManifest.from_json(raw, f"{location}/{MANIFEST_NAME}")


def _require_tables(engine: Engine, app: AppViews, name: str) -> None:
    """Refuse a database that lacks a table of the application or the framework's before anything
    is written: another application's database, or one never migrated.

    Raises:
        SnapshotError: naming the tables missing.
    """
    from sqlalchemy import inspect

    present = set(inspect(engine).get_table_names())
    missing = [t.name for t in (*app.tables, high_water_marks, idempotency_keys) if t.name not in present]
    if missing:
        raise SnapshotError(
            f"the database {engine.url.render_as_string(hide_password=True)} has no table "
            f"{', '.join(missing)} of the application {name!r} or of the framework: is it this "
            "application's database (--app, --url)? nothing was written"
        )


def _no_manifest(filesystem: Any, root: str, error: OSError) -> str:
    """Why a location's manifest could not be read, as far as a look at it tells: it does not
    exist, it is an archive, snapshots lie one level below it, or it holds none (a snapshot being
    written, or one that failed, has no manifest yet: it is written last). A manifest that is there
    but unreadable (permissions, the object store refusing), or a location that cannot be looked
    at, is named with ``error``."""
    from pyarrow import fs

    unreadable = f"{MANIFEST_NAME} could not be read ({error})"
    try:
        if filesystem.get_file_info(posixpath.join(root, MANIFEST_NAME)).type != fs.FileType.NotFound:
            return unreadable
        info = filesystem.get_file_info(root)
        if info.type == fs.FileType.NotFound:
            return "no such location"
        if info.type != fs.FileType.Directory:
            return "a file, not a snapshot's directory"
        entries = filesystem.get_file_info(fs.FileSelector(root))
        names = {posixpath.basename(e.path) for e in entries}
        if ARCHIVE_MANIFEST in names:
            return (
                f"an archive ({ARCHIVE_MANIFEST}), not a snapshot: give a snapshot's location (waltz "
                "snapshot create writes one)"
            )
        below = sorted(
            e.path
            for e in entries
            if e.type == fs.FileType.Directory
            and filesystem.get_file_info(posixpath.join(e.path, MANIFEST_NAME)).type == fs.FileType.File
        )
        if below:
            shown = ", ".join(below[:5]) + (f" and {len(below) - 5} more" if len(below) > 5 else "")
            return f"no {MANIFEST_NAME} here, but snapshots below it: {shown}; give one of them"
    except OSError:
        return unreadable  # the location cannot be looked at: the error says why
    return (
        f"no {MANIFEST_NAME}: not a complete snapshot (a snapshot's manifest is written last, so one "
        "being written or one that failed has none)"
    )


def verify_snapshot(location: str, manifest: SnapshotManifest | None = None) -> SnapshotManifest:
    """Check every file of a snapshot against its manifest: present, same SHA-256, same rows;
    and that a snapshot of rows has marks (docs/design/spark.md "Snapshots").

    Raises:
        SnapshotError: a file missing, changed, not Parquet, or with another row count (named); or
            a manifest that gives rows but no marks.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = manifest or read_manifest(location)
    _check_rows_have_marks(location, manifest)
    filesystem, root = open_location(location)
    for entry in [*manifest.tables, manifest.idempotency_keys]:
        path = posixpath.join(root, entry.file)
        try:
            digest = file_sha256(filesystem, path)
        except (FileNotFoundError, OSError) as exc:
            raise SnapshotError(f"{location}/{entry.file} ({entry.table}): missing ({exc})") from exc
        if digest != entry.sha256:
            raise SnapshotError(
                f"{location}/{entry.file} ({entry.table}): its SHA-256 is {digest}, the manifest says "
                f"{entry.sha256}; the file was changed or damaged"
            )
        try:
            with filesystem.open_input_file(path) as stream:
                rows = pq.ParquetFile(stream).metadata.num_rows
        except (pa.ArrowException, OSError) as exc:  # its SHA-256 as recorded, yet no Parquet file
            where = f"{location}/{entry.file} ({entry.table})"
            raise SnapshotError(f"{where}: not a Parquet file ({exc})") from exc
        if rows != entry.rows:
            raise SnapshotError(
                f"{location}/{entry.file} ({entry.table}): {rows} rows, the manifest says {entry.rows}"
            )
    return manifest


def _check_rows_have_marks(location: str, manifest: SnapshotManifest) -> None:
    """Refuse a manifest that gives rows but no marks: a snapshot written under a log name its
    database held no marks of (which ``write_snapshot`` now refuses). Loaded or rebuilt from, its
    rows would be taken as the log's start, and the whole log applied onto them.

    Raises:
        SnapshotError: naming the rows and the log.
    """
    if manifest.marks:
        return
    held = [f"{entry.rows} rows of {entry.table}" for entry in manifest.tables if entry.rows]
    if manifest.idempotency_keys.rows:
        held.append(f"{manifest.idempotency_keys.rows} idempotency keys")
    if not held:
        return
    raise SnapshotError(
        f"{location}: the snapshot holds {' and '.join(held)} but no marks of the log "
        f"{manifest.cluster_name!r}: it was written under a log name its database held no marks of, "
        "and an instance would apply the log from its start onto these rows. Write a new snapshot "
        "under the name of the log the database follows (waltz snapshot create --cluster-name)"
    )


def _rows(
    location: str, entry: SnapshotFile, batch_rows: int = BATCH_ROWS
) -> Generator[dict[str, Any], None, None]:
    import pyarrow.parquet as pq

    filesystem, root = open_location(location)
    with filesystem.open_input_file(posixpath.join(root, entry.file)) as stream:
        parquet = pq.ParquetFile(stream)
        for batch in parquet.iter_batches(batch_size=batch_rows):
            yield from batch.to_pylist()


def _python_value(column_type: types.TypeEngine[Any], value: Any) -> Any:
    if value is None:
        return None
    if isinstance(column_type, types.Uuid) and isinstance(value, str):
        return uuid.UUID(value) if column_type.as_uuid else value
    if isinstance(column_type, types.Uuid) and isinstance(value, uuid.UUID) and not column_type.as_uuid:
        return str(value)
    if isinstance(column_type, types.DateTime) and isinstance(value, dt.datetime):
        return value if column_type.timezone else value.replace(tzinfo=None)
    if isinstance(column_type, types.Numeric) and not isinstance(column_type, types.Float):
        return decimal.Decimal(value) if not isinstance(value, decimal.Decimal) else value
    return value


def load_snapshot(
    location: str,
    app: AppViews,
    db_url: str | Engine,
    *,
    replace: bool = False,
    progress: Progress | None = None,
) -> SnapshotManifest:
    """Write a verified snapshot into a database: its tables, marks and idempotency keys, in one
    transaction. An application instance started on the database resumes the log after the marks.

    Args:
        location: the snapshot.
        app: the application's views (``prepare`` creates its tables; they must match the
            snapshot's).
        db_url: the database (a SQLAlchemy URL or an engine).
        replace: replace the rows of the application's tables and this log's marks and keys;
            False: the tables must be empty and the log must have no marks there, checked before
            ``app.prepare`` migrates anything (a refused load leaves the database as it was) and
            again in the load's transaction.
        progress: called with a line per table.

    Raises:
        SnapshotError: the snapshot does not verify, a table of the application is missing from it
            or has other columns (other than an entity's rows that an older model wrote), the
            database is not empty (without ``replace``), an entity's schema version in the snapshot
            is newer than the application's model, or an older model's row does not upcast to the
            model's attributes (docs/design/spark.md "Snapshots of an older model").
    """
    say = progress or (lambda _: None)
    manifest = verify_snapshot(location)
    plans = _table_plans(location, manifest, app)
    engine = db_url if isinstance(db_url, Engine) else create_framework_engine(db_url)
    try:
        name = manifest.cluster_name
        if not replace:
            # Before prepare migrates anything: a refused load leaves the database as it was.
            with engine.connect() as conn:
                _refuse_a_used_database(conn, app, name)
        app.prepare(engine)
        with engine.begin() as conn:
            if not replace:
                _refuse_a_used_database(conn, app, name)  # again, in the load's transaction
            for table in app.tables:
                plan = plans[table.name]
                entry = plan.entry
                if plan.empty:
                    conn.execute(delete(table))
                    say(f"{table.name}: 0 rows, {_NO_ENTITY_ROWS}")
                    continue
                if entry is None:
                    raise SnapshotError(f"{location}: the snapshot has no table {table.name}")
                conn.execute(delete(table))
                if plan.upcast is not None and plan.info is not None:
                    where = f"{location}: {entry.file}"
                    rows = upcast_rows(_rows(location, entry), plan.upcast, plan.info, where)
                    count = _insert_rows(conn, table, rows)
                    say(f"{table.name}: {count} rows, {describe_stored(plan.upcast)}")
                    continue
                _check_columns(location, table, entry)
                count = _insert_rows(conn, table, _rows(location, entry))
                say(f"{table.name}: {count} rows")
            conn.execute(delete(idempotency_keys).where(idempotency_keys.c.cluster_name == name))
            keys = _insert_rows(conn, idempotency_keys, _rows(location, manifest.idempotency_keys))
            say(f"idempotency keys: {keys}")
            conn.execute(delete(high_water_marks).where(high_water_marks.c.cluster_name == name))
            now = dt.datetime.now(dt.UTC)
            for pid, mark in sorted(manifest.marks.items()):
                conn.execute(
                    insert(high_water_marks).values(
                        cluster_name=name, partition_id=pid, high_water_mark=mark, updated_at=now
                    )
                )
        say(f"loaded the snapshot at marks {dict(sorted(manifest.marks.items()))}")
    finally:
        if not isinstance(db_url, Engine):
            engine.dispose()
    return manifest


def _refuse_a_used_database(conn: Connection, app: AppViews, name: str) -> None:
    """Refuse a load (without ``replace``) into a database that holds marks of the log ``name``
    or rows in an application table, of the tables that exist: the load runs it before the
    application's ``prepare``, which would migrate the database, and again in its transaction.
    Only table names are read, so a table of an older revision of the application is read too.

    Raises:
        SnapshotError: naming the marks or the table.
    """
    from sqlalchemy import inspect, literal
    from sqlalchemy import table as table_clause

    inspector = inspect(conn)
    if inspector.has_table(high_water_marks.name) and HighWaterMarks(name).read_all(conn):
        raise SnapshotError(
            f"the database has marks of {name!r} already: load into an empty database, or "
            "replace its tables and marks (waltz snapshot load --replace; replace=True)"
        )
    for table in app.tables:
        if not inspector.has_table(table.name, schema=table.schema):
            continue
        named = table_clause(table.name, schema=table.schema)
        if conn.execute(select(literal(1)).select_from(named).limit(1)).first() is not None:
            raise SnapshotError(
                f"table {table.name} is not empty: load into an empty database, or replace "
                "its tables and marks (waltz snapshot load --replace; replace=True)"
            )


def _insert_rows(conn: Any, table: Any, rows: Iterator[dict[str, Any]], typed: Table | None = None) -> int:
    column_types = {c.name: c.type for c in (typed if typed is not None else table).columns}
    count = 0
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append({k: _python_value(column_types[k], v) for k, v in row.items()})
        if len(batch) >= 1000:
            conn.execute(insert(table), batch)
            count += len(batch)
            batch = []
    if batch:
        conn.execute(insert(table), batch)
        count += len(batch)
    return count


# --- a snapshot's rows copied straight into a rebuild's staging table -------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotSeed:
    """The rows of one snapshot table that a rebuild copies into its staging table as they are
    (docs/design/spark.md "Snapshots": a table that is not an entity table starts with them).

    Attributes:
        location: the snapshot (verified).
        entry: the table's entry in its manifest.
    """

    location: str
    entry: SnapshotFile

    def copy_into(self, conn: Connection, table: Table, staging: str) -> int:
        """Copy the rows into ``staging`` (a table with ``table``'s columns), in ``conn``'s
        transaction: PostgreSQL's ``COPY`` (psycopg), a batched ``INSERT`` elsewhere. When every
        column is an integer, boolean or text column, the ``COPY`` reads CSV that pyarrow writes
        from the Parquet batches, without a Python object per value.

        Returns:
            The rows copied.

        Raises:
            SnapshotError: the file's columns are not the table's.
            sqlalchemy.exc.DBAPIError, psycopg.Error: the database refused a row.
        """
        _check_columns(self.location, table, self.entry, "rebuild from the log alone")
        driver = conn.connection.driver_connection
        if conn.dialect.name == "postgresql" and hasattr(driver, "cursor") and hasattr(driver, "pgconn"):
            if all(_csv_native(c.type) for c in table.columns):
                return _copy_csv(driver, conn, table, staging, self.location, self.entry)
            return _copy_rows(driver, conn, table, staging, _rows(self.location, self.entry))
        return _insert_rows(conn, _renamed_table(table, staging), _rows(self.location, self.entry), table)


def _converters(table: Table) -> list[Callable[[Any], Any] | None]:
    """Per column: None where the Parquet value goes in as it is, else a conversion."""
    out: list[Callable[[Any], Any] | None] = []
    for column in table.columns:
        kind = column.type
        if isinstance(kind, types.Integer | types.Boolean | types.Float) or (
            isinstance(kind, types.String) and not isinstance(kind, types.JSON)
        ):
            out.append(None)
        else:
            out.append(functools.partial(_python_value, kind))
    return out


def _copy_rows(
    driver: Any, conn: Connection, table: Table, staging: str, rows: Iterator[dict[str, Any]]
) -> int:
    preparer = conn.dialect.identifier_preparer
    names = [c.name for c in table.columns]
    convert = _converters(table)
    statement = f"COPY {preparer.quote(staging)} ({', '.join(preparer.quote(n) for n in names)}) FROM STDIN"
    count = 0
    with driver.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row(
                [v if f is None else f(v) for v, f in zip((row[n] for n in names), convert, strict=True)]
            )
            count += 1
    return count


def _csv_native(column_type: types.TypeEngine[Any]) -> bool:
    """Whether pyarrow's CSV of a column's snapshot values is what PostgreSQL's ``COPY`` takes as
    they are (digits, ``true``/``false``, quoted text; NULL unquoted and empty)."""
    return isinstance(column_type, types.Integer | types.Boolean) or (
        isinstance(column_type, types.String) and not isinstance(column_type, types.JSON)
    )


def _copy_csv(
    driver: Any, conn: Connection, table: Table, staging: str, location: str, entry: SnapshotFile
) -> int:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    preparer = conn.dialect.identifier_preparer
    names = [c.name for c in table.columns]
    statement = (
        f"COPY {preparer.quote(staging)} ({', '.join(preparer.quote(n) for n in names)}) "
        "FROM STDIN WITH (FORMAT csv)"
    )
    # Text always quoted (so "" is an empty text), NULL as nothing: PostgreSQL's CSV.
    options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
    count = 0
    filesystem, root = open_location(location)
    with (
        filesystem.open_input_file(posixpath.join(root, entry.file)) as stream,
        driver.cursor() as cursor,
        cursor.copy(statement) as copy,
    ):
        for batch in pq.ParquetFile(stream).iter_batches(batch_size=BATCH_ROWS, columns=names):
            sink = pa.BufferOutputStream()
            pacsv.write_csv(batch.select(names), sink, write_options=options)
            copy.write(sink.getvalue())
            count += batch.num_rows
    return count


def _renamed_table(table: Table, name: str) -> Any:
    from sqlalchemy import column as column_clause
    from sqlalchemy import table as table_clause

    return table_clause(name, *(column_clause(c.name) for c in table.columns))


# --- Spark: a snapshot as the state a rebuild starts from -------------------------------------------


def spark_path(location: str, file: str) -> str:
    """The path Spark reads a snapshot's file at (a local path, or the URL as given)."""
    if "://" in location:
        return location.rstrip("/") + "/" + file
    return str(Path(location).expanduser().resolve() / file)


def _inferred_alike(arrow: pa.DataType) -> bool:
    """Whether Spark's Parquet schema inference reads an Arrow type of a snapshot file as
    ``from_arrow_schema`` converts it (times and nanosecond timestamps are left to the inference)."""
    import pyarrow as pa

    return (
        (pa.types.is_timestamp(arrow) and arrow.unit in ("ms", "us"))
        or pa.types.is_int64(arrow)
        or pa.types.is_boolean(arrow)
        or pa.types.is_string(arrow)
        or pa.types.is_float64(arrow)
        or pa.types.is_binary(arrow)
        or pa.types.is_date32(arrow)
        or pa.types.is_decimal128(arrow)
    )


def read_snapshot_file(spark: Any, location: str, file: str) -> Any:
    """A snapshot's Parquet file as a DataFrame, its schema read from the file's footer here.

    Spark's own schema inference runs a Spark job per file read; the footer, read with pyarrow
    where the driver runs, gives the same schema without one (docs/design/spark.md "Snapshots").
    A file with a column type the inference could read otherwise (times, nanosecond timestamps)
    is left to the inference.

    Args:
        spark: the Spark session.
        location: the snapshot (a directory or a URL ``pyarrow.fs`` opens).
        file: the file's name in the snapshot (``SnapshotFile.file``).

    Returns:
        A DataFrame of the file's columns.

    Raises:
        SnapshotError: the location cannot be opened.
        OSError: the file cannot be read.
    """
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    filesystem, root = open_location(location)
    with filesystem.open_input_file(posixpath.join(root, file)) as stream:
        schema = pq.ParquetFile(stream).schema_arrow
    reader = spark.read
    if all(_inferred_alike(f.type) for f in schema):
        # A timestamp without a time zone is read as TIMESTAMP_NTZ unless the session says not.
        ntz = str(spark.conf.get("spark.sql.parquet.inferTimestampNTZ.enabled", "true")).lower() == "true"
        reader = reader.schema(from_arrow_schema(schema, prefer_timestamp_ntz=ntz))
    return reader.parquet(spark_path(location, file))


@dataclass(frozen=True)
class SnapshotEntityRows:
    """A snapshot's entity rows: those the rebuild replays, and those that pass through.

    Attributes:
        changes: the rows replayed, as row changes that come before every change of the log (a
            DataFrame of :data:`~waltz.spark.decoders.CHANGES_SCHEMA`): every row of a file that
            :func:`replays_every_row`, else the rows whose key a change after the marks names;
            the replay decides what they become.
        untouched: entity table name -> the rows of a joined file that no change after the marks
            names (the snapshot's columns as read from its Parquet file): they are the full
            replay's rows as they are. No entry for a file replayed whole.
        cached: the persisted DataFrames they come from (``after``, then each joined file's
            rows with its touched flag), to unpersist when the rebuild is done; empty when no
            file was joined.
    """

    changes: Any
    untouched: Mapping[str, Any]
    cached: tuple[Any, ...] = ()


def _natively_rendered(column_type: types.TypeEngine[Any]) -> bool:
    """Whether Spark's cast to text renders a column's snapshot value as ``render_value`` does."""
    return isinstance(column_type, types.Integer | types.Boolean) or (
        isinstance(column_type, types.String) and not isinstance(column_type, types.JSON)
    )


def replays_every_row(rows: int, tail_transactions: int) -> bool:
    """Whether a rebuild from a snapshot replays every row of an entity file of ``rows`` rows,
    rather than joining the file with the keys of the ``tail_transactions`` transactions after
    the snapshot's marks (docs/design/spark.md "Snapshots"; decision 0076).

    A small file, at most :data:`REPLAY_EVERY_ROW_PER_TRANSACTION` rows per transaction after
    the marks, is replayed whole: each such file adds at most one row to the replay per
    transaction after the marks, and the rebuild saves the join's Spark jobs and plans, its
    fixed cost. A larger file is joined, so that a long history with a short log after it
    replays only what that log touches.
    """
    return rows <= REPLAY_EVERY_ROW_PER_TRANSACTION * tail_transactions


def snapshot_entity_rows(
    spark: Any,
    location: str,
    manifest: SnapshotManifest,
    app: AppViews,
    after: Any,
    *,
    tail_transactions: int = 0,
) -> SnapshotEntityRows:
    """The snapshot's entity rows: as row changes those the rebuild replays, apart those that
    pass through.

    A file that :func:`replays_every_row` for ``tail_transactions`` becomes row changes whole.
    Another is joined with the log's keys: a row is touched when a change of its entity after
    the marks names its key (the entity's key or its primary key, docs/design/sql.md
    "Change-sets"); the key values are compared as the column's type (``values`` cast as
    :func:`waltz.spark.views.entity_table` casts them). An untouched row is the row a full
    replay gives, and passes through as read. A replayed row becomes an ``insert`` of the whole
    row, with ``partition_id`` and ``transaction_id`` -1
    (:data:`waltz.spark.views.SNAPSHOT_TRANSACTION_ID`) and no header (so that views that read
    the changes' headers or meta, such as audit rows, pass over it), its values rendered as the
    decoders render a change-set's (:func:`waltz.spark.decoders.render_value`): by Spark's own
    casts for integer, boolean and text columns with integer keys, by a Python function
    otherwise.

    Args:
        spark: the Spark session.
        location: the snapshot.
        manifest: its verified manifest.
        app: the application's views; its ``entities`` say which tables are entity tables.
        after: the log's row changes after the snapshot's marks (:data:`CHANGES_SCHEMA`).
        tail_transactions: how many transactions the log after the marks holds (at most); 0,
            the default, joins every file. When a file is joined, ``after`` is cached (it is
            among ``cached``).

    Returns:
        The replayed rows as changes (empty without entities) and the untouched rows per
        joined file.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from waltz.spark.decoders import CHANGES_SCHEMA
    from waltz.spark.views import spark_type

    frames = []
    cached: list[Any] = []
    untouched: dict[str, Any] = {}
    try:
        for info in app.entities or ():
            table: Table = info.model.__table__
            entry = entity_file(manifest, info)
            if entry is None or entry.rows == 0:
                continue
            rows = read_snapshot_file(spark, location, entry.file)
            upcast = stored_rows(manifest, info, location)
            if upcast is not None:
                # An older model's columns: every row is upcast, so every row is replayed.
                frames.append(rows_as_changes(rows, info, upcast=upcast, where=f"{location}: {entry.file}"))
                continue
            if replays_every_row(entry.rows, tail_transactions):
                frames.append(rows_as_changes(rows, info))
                continue
            column_of = _attribute_columns(info)
            if not cached:
                # The joins and the union with the snapshot's rows all read the changes after the
                # marks: cached before the first join's rows are persisted, or those would read
                # and decode the log again.
                after.cache()
                cached.append(after)
            ours = after.where(F.col("entity") == info.name)
            flags = []
            for index, key in enumerate(dict.fromkeys([tuple(info.key), tuple(info.primary_key)])):
                names = [column_of[a] for a in key]
                typed = {n: spark_type(table.c[n].type) for n in names}
                flag = f"_touched_{index}"
                touched = (
                    ours.select(
                        *[
                            F.coalesce(F.col("key_values").getItem(a), F.col("values").getItem(a))
                            .cast(typed[n])
                            .alias(f"_key_{n}")
                            for a, n in zip(key, names, strict=True)
                        ]
                    )
                    .dropna()
                    .distinct()
                    .withColumn(flag, F.lit(True))
                )
                condition = [rows[n].cast(typed[n]) == touched[f"_key_{n}"] for n in names]
                rows = rows.join(touched, condition, "left").drop(*[f"_key_{n}" for n in names])
                flags.append(F.col(flag).isNotNull())
            hit = flags[0]
            for flag_column in flags[1:]:
                hit = hit | flag_column
            # Persisted: the touched rows become changes (cached with the log's) and the untouched
            # ones are written later; without it, each use would read and join the file again.
            rows = (
                rows.withColumn("_touched", hit).drop(*[f"_touched_{i}" for i in range(len(flags))]).persist()
            )
            cached.append(rows)
            untouched[table.name] = rows.where(~F.col("_touched")).drop("_touched")
            frames.append(rows_as_changes(rows.where(F.col("_touched")), info))
    except BaseException:
        for frame in cached:  # nothing stays cached for a rebuild that cannot go on
            frame.unpersist()
        raise
    if not frames:
        return SnapshotEntityRows(spark.createDataFrame([], CHANGES_SCHEMA), untouched, tuple(cached))
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return SnapshotEntityRows(result, untouched, tuple(cached))


def spark_timestamp_as_utc(value: Any) -> Any:
    """A value of a Spark ``timestamp`` column as a Python UDF gets it (a naive datetime in the
    process's local time) as the aware UTC datetime it stands for; any other value as it is."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC)  # a naive datetime is taken as local time
    return value


def rows_as_changes(
    rows: Any, info: EntityInfo, *, python: bool = False, upcast: StoredRows | None = None, where: str = ""
) -> Any:
    """Snapshot rows of one entity as ``insert`` row changes at partition and transaction -1
    (docs/design/spark.md "Snapshots").

    Args:
        rows: the entity table's rows as read from the snapshot's Parquet file.
        info: the entity.
        python: render every value with :func:`waltz.spark.decoders.render_value` in a Python
            function, even where Spark's casts give the same text.
        upcast: the rows are an older model's (:func:`stored_rows`): each is upcast to the
            model's attributes in a Python function before it is rendered (docs/design/spark.md
            "Snapshots of an older model"); an upcaster's failure fails the Spark job with the
            :class:`~waltz.jdbc_style.upcasting.UpcastError`, prefixed with ``where`` (the file).

    Returns:
        A DataFrame of :data:`~waltz.spark.decoders.CHANGES_SCHEMA`.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from waltz.spark.decoders import render_value
    from waltz.spark.views import SNAPSHOT_TRANSACTION_ID

    table: Table = info.model.__table__
    by_column = {prop.columns[0].name: prop.key for prop in info.mapper.column_attrs}
    columns = [c.name for c in table.columns if c.name in by_column]
    attributes = [by_column[c] for c in columns]
    key_names = tuple(info.key)
    column_of = dict(zip(attributes, columns, strict=True))
    entity = info.name
    position = [
        F.lit(SNAPSHOT_TRANSACTION_ID).cast("int").alias("partition_id"),
        F.lit(SNAPSHOT_TRANSACTION_ID).cast("bigint").alias("transaction_id"),
        F.lit(None).cast("int").alias("header"),
    ]
    native = (
        not python
        and upcast is None
        and all(_natively_rendered(table.c[c].type) for c in columns)
        and all(isinstance(table.c[column_of[k]].type, types.Integer) for k in key_names)
    )
    if native:
        # json.dumps(sort_keys=True, separators=(",", ":")) of the rendered key: integers and
        # identifier names need no escaping.
        parts: list[Any] = []
        for index, name in enumerate(sorted(key_names)):
            prefix = "{" if index == 0 else ","
            parts += [F.lit(f'{prefix}"{name}":"'), F.col(column_of[name]).cast("string"), F.lit('"')]
        parts.append(F.lit("}"))
        key_values = F.create_map(
            *[x for k in key_names for x in (F.lit(k), F.col(column_of[k]).cast("string"))]
        )
        values = F.create_map(
            *[
                x
                for a, c in zip(attributes, columns, strict=True)
                for x in (F.lit(a), F.col(c).cast("string"))
            ]
        )
        return rows.select(
            *position,
            F.lit(0).cast("int").alias("op_index"),
            F.lit(0).cast("int").alias("member"),
            F.lit(entity).alias("entity"),
            F.lit("insert").alias("operation"),
            F.concat(*parts).alias("key"),
            key_values.alias("key_values"),
            values.alias("values"),
            F.lit(None).cast("string").alias("meta"),
            F.lit(None).cast("string").alias("idempotency_key"),
        )
    struct = (
        "op_index INT, member INT, entity STRING, operation STRING, key STRING, "
        "key_values MAP<STRING, STRING>, `values` MAP<STRING, STRING>, meta STRING, idempotency_key STRING"
    )

    # Spark gives a timestamp with a time zone to a Python function as a naive datetime in the
    # worker's local time: taken as the aware UTC instant it stands for, as pyarrow (the load)
    # and the log give it, both to the upcasters and to the rendering, whose text without an
    # offset would be read back as UTC.
    zoned = frozenset(f.name for f in rows.schema.fields if f.dataType.typeName() == "timestamp")
    values_of: Callable[[Any], Mapping[str, Any]]
    if upcast is not None:
        read = [c for _, c in upcast.attributes]

        def values_of(row: Any) -> Mapping[str, Any]:
            stored = {
                c: (spark_timestamp_as_utc(v) if c in zoned else v) for c, v in zip(read, row, strict=True)
            }
            try:
                return upcast.upcast(stored)
            except UpcastError as exc:
                raise UpcastError(f"{where}: {exc}" if where else str(exc)) from exc

    else:
        read = columns

        def values_of(row: Any) -> Mapping[str, Any]:
            return {
                a: (spark_timestamp_as_utc(v) if c in zoned else v)
                for a, c, v in zip(attributes, columns, row, strict=True)
            }

    def change(row: Any) -> tuple[Any, ...]:
        values = {a: render_value(v) for a, v in values_of(row).items()}
        key_values = {k: values[k] for k in key_names}
        key = json.dumps(key_values, sort_keys=True, separators=(",", ":"))
        return (0, 0, entity, "insert", key, key_values, values, None, None)

    udf = F.udf(change, f"STRUCT<{struct}>", useArrow=False)
    return rows.select(*position, udf(F.struct(*[F.col(c) for c in read])).alias("c")).select(
        "partition_id", "transaction_id", "header", "c.*"
    )


def snapshot_keys(spark: Any, location: str, manifest: SnapshotManifest) -> Any:
    """The snapshot's idempotency key rows (``waltz_idempotency_keys`` columns)."""
    return read_snapshot_file(spark, location, manifest.idempotency_keys.file)


def snapshot_table(spark: Any, location: str, manifest: SnapshotManifest, table: Table) -> Any | None:
    """A table of the snapshot as a DataFrame, or None when the snapshot lacks it."""
    entry = manifest.table(table.name)
    return None if entry is None else read_snapshot_file(spark, location, entry.file)
