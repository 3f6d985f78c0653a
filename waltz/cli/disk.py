"""``waltz disk``: inspect and verify a storage node's files directly, without a running node.

Every command only reads: no file is created, changed, truncated or repaired. The logic lives in
:mod:`waltz.services.storage.inspect`; this module only formats its results. Exit codes: 0 when
all is well, 1 when ``verify`` finds an error, 2 when the input is unusable (missing directory,
not a storage directory, unreadable control file or segment header).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from waltz.cli.groups import HELP, MARKUP
from waltz.cli.options import (
    CheckpointIntervalOption,
    DiskPartitionOption,
    JsonOption,
    SegmentArgument,
    StorageDirArgument,
)
from waltz.errors import WaltzError
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.services.storage import format as fmt
from waltz.services.storage import inspect
from waltz.services.storage.control_file import UNRECOVERABLE_REPLICA
from waltz.services.storage.retention_file import RETENTION_FILE, RetentionRecord
from waltz.services.storage.storage_partition import DEFAULT_CHECKPOINT_INTERVAL

app = typer.Typer(
    help=HELP["disk"],
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)


@contextmanager
def _usage_errors() -> Iterator[None]:
    """Turn an unusable input into a one-line message and exit code 2 (no traceback)."""
    try:
        yield
    except (OSError, WaltzError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _require_file(path: Path) -> Path:
    """Return ``path`` if it is a regular file; raise an error naming it otherwise."""
    if not path.exists():
        raise FileNotFoundError(f"segment file {path} does not exist")
    if not path.is_file():
        raise IsADirectoryError(f"{path} is not a file: give a segment data file (<first txn ID>.seg)")
    return path


def _iso(ms: int) -> str:
    """Format milliseconds since the epoch as ISO-8601 UTC."""
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return f"invalid ({ms} ms)"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _jsonable(value: object) -> object:
    """Convert inspection results (dataclasses, enums, UUIDs, paths, bytes) to JSON values.

    A UUID of an inspection result is a cluster key: it is shown by its fingerprint, never itself.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, uuid.UUID):
        return cluster_key_fingerprint(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return value


def _echo_json(value: object) -> None:
    typer.echo(json.dumps(_jsonable(value), indent=2))


# ---- control ----


def _info_text(struct: inspect.PartitionInfoStruct) -> str:
    info = struct.info
    if info is None:
        return "CORRUPT (CRC mismatch)"
    return (
        f"session ID {info.session_id}, low-water mark {info.low_water_mark}, "
        f"local low-water mark {info.local_low_water_mark}, CRC OK"
    )


@app.command("control")
def control(storage_dir: StorageDirArgument, json_output: JsonOption = False) -> None:
    """Dump the control file (waltz-storage.ctl) of a storage directory.

    Shows the header (format version, creation time in ISO-8601 UTC, cluster key, number of
    partitions) and, per partition, both partition-info structs (session ID, low-water mark,
    local low-water mark, CRC OK or CORRUPT), which struct is current (the one a storage node
    uses on start-up), both fence slots and the effective fence session ID.
    """
    with _usage_errors():
        dump = inspect.read_control_file(storage_dir)
    if json_output:
        _echo_json(dump)
        return
    header = dump.header
    typer.echo(f"control file: {dump.path} ({dump.size} bytes)")
    typer.echo(f"format version:  {header.version}")
    typer.echo(f"creation time:   {_iso(header.creation_time_ms)} ({header.creation_time_ms} ms)")
    typer.echo(f"cluster key:     {cluster_key_fingerprint(header.cluster_key)} (fingerprint)")
    typer.echo(f"partitions:      {header.num_partitions}")
    if dump.trailing_bytes:
        typer.echo(f"WARNING: {dump.trailing_bytes} unexpected bytes after the fence section")
    for entry in dump.partitions:
        typer.echo("")
        typer.echo(f"partition {entry.partition_id} (entry at offset {entry.offset})")
        if entry.stored_partition_id != entry.partition_id:
            typer.echo(f"  CORRUPT: the entry holds partition ID {entry.stored_partition_id}")
        for struct in entry.structs:
            mark = "  <- current" if struct.index == entry.current_struct else ""
            typer.echo(f"  struct {struct.index} (offset {struct.offset}): {_info_text(struct)}{mark}")
        if entry.current_struct is None:
            typer.echo(f"  current struct: none, both are corrupt: {UNRECOVERABLE_REPLICA}")
        for slot in entry.fence_slots:
            text = (
                "CORRUPT (CRC mismatch)"
                if slot.session_id is None
                else f"session ID {slot.session_id}, CRC OK"
            )
            typer.echo(f"  fence slot {slot.index} (offset {slot.offset}): {text}")
        typer.echo(f"  fence session ID: {entry.fence}")


# ---- segment ----


def _header_lines(header: fmt.SegmentHeader) -> list[str]:
    return [
        f"format version:        {header.version}",
        f"creation time:         {_iso(header.creation_time_ms)} ({header.creation_time_ms} ms)",
        f"cluster key:           {cluster_key_fingerprint(header.cluster_key)} (fingerprint)",
        f"partition:             {header.partition_id}",
        f"first transaction ID:  {header.first_transaction_id}",
    ]


def _index_line(segment: inspect.SegmentFile) -> str:
    path = segment.path.with_suffix(fmt.INDEX_SUFFIX)
    try:
        with inspect.IndexFile(path) as index:
            if index.header is None:
                return f"index file:            {path}: unusable header: {index.header_error}"
            same = "" if index.header == segment.header else " (header differs from the data file's!)"
            partial = f", {index.partial_bytes} trailing bytes" if index.partial_bytes else ""
            return f"index file:            {path}: {index.entry_count} entries{partial}{same}"
    except OSError as exc:
        return f"index file:            missing ({exc.strerror})"


def _record_line(item: inspect.ScannedRecord, hex_bytes: int) -> str:
    record = item.record
    req = record.req_id
    line = (
        f"{item.offset:>12} {record.transaction_id:>12}  "
        f"{f'{req.client_id}/{req.generation}/{req.partition_id}/{req.seq_num}':<20} "
        f"{record.header:>11} {len(record.data):>10}  {record.checksum:#010x}"
    )
    if hex_bytes > 0:
        more = "..." if len(record.data) > hex_bytes else ""
        line += f"  {record.data[:hex_bytes].hex()}{more}"
    return line


@app.command("segment")
def segment(
    segment_file: SegmentArgument,
    records: Annotated[bool, typer.Option("--records/--no-records", help="List the records.")] = True,
    limit: Annotated[
        int | None, typer.Option(min=0, help="List at most this many records (default: all).")
    ] = None,
    from_txn: Annotated[
        int | None,
        typer.Option(
            "--from-txn", help="Start the listing at this transaction ID (found through the index)."
        ),
    ] = None,
    hex_bytes: Annotated[
        int, typer.Option("--hex", min=0, help="Show the first N bytes of each record's data as hex.")
    ] = 0,
) -> None:
    """Dump a segment data file: its header, its index file and its records.

    Each record is listed with its byte offset, transaction ID, ReqId
    (client/generation/partition/sequence), transaction header, data length and data CRC; every
    listed record passed both its CRCs. The listing ends with why the scan stopped: the end of
    the file, a torn tail (what start-up cuts from the last segment) or a corrupt record (run
    verify-segment for details).
    """
    with _usage_errors(), inspect.SegmentFile(_require_file(segment_file)) as seg:
        typer.echo(f"segment file: {seg.path} ({seg.file_size} bytes)")
        for line in _header_lines(seg.header):
            typer.echo(line)
        typer.echo(_index_line(seg))
        if not records:
            return
        start = fmt.HEADER_SIZE if from_txn is None else inspect.find_record_offset(seg, from_txn)
        typer.echo("")
        heading = f"{'offset':>12} {'transaction':>12}  {'req id':<20} {'header':>11} {'length':>10}"
        typer.echo(f"{heading}  data CRC" + ("    data" if hex_bytes else ""))
        shown = 0
        last_seen: int | None = None  # the transaction ID of the last valid record scanned
        scan = seg.scan(start)
        for item in scan:
            last_seen = item.record.transaction_id
            if from_txn is not None and item.record.transaction_id < from_txn:
                continue
            if limit is not None and shown >= limit:
                typer.echo(f"(stopped after {limit} records: --limit)")
                return
            typer.echo(_record_line(item, hex_bytes))
            shown += 1
        if scan.stop is None:  # pragma: no cover - the scan always sets stop when it ends
            return
        expected = seg.header.first_transaction_id if last_seen is None else last_seen + 1
        stop = inspect.classify_stop(seg, scan.stop, expected)
        if stop.kind is inspect.StopKind.END:
            typer.echo(f"(end of file at offset {stop.offset}; {shown} records listed)")
        else:
            tail = seg.file_size - stop.offset
            typer.echo(f"({stop.kind.value} at offset {stop.offset}, {tail} bytes: {stop.reason})")
            if stop.kind is inspect.StopKind.CORRUPT:
                typer.echo(f"(run: waltz disk verify-segment {seg.path})")


# ---- dump ----


@app.command("dump")
def dump(
    storage_dir: Annotated[
        Path | None,
        typer.Argument(
            help="The storage directory (the one holding waltz-storage.ctl); leave it out to read the "
            "archive only.",
            show_default=False,
        ),
    ] = None,
    partition: Annotated[int, typer.Option("--partition", "-p", min=0, help="The partition.")] = 0,
    from_txn: Annotated[
        int | None,
        typer.Option(
            "--from-txn",
            min=0,
            help="The first transaction (default: the archive's first with --archive, else the local start).",
        ),
    ] = None,
    to_txn: Annotated[
        int | None,
        typer.Option(
            "--to-txn",
            min=0,
            help="The last transaction (default: the last on disk, or the archived-through without a "
            "storage directory).",
        ),
    ] = None,
    archive: Annotated[
        str | None,
        typer.Option(
            "--archive",
            help="The archive (a directory or a URL pyarrow opens: s3://, gs://, hdfs://): the "
            "transactions below the local start are read there.",
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(min=0, help="List at most this many records.")] = None,
    hex_bytes: Annotated[
        int, typer.Option("--hex", min=0, help="Show the first N bytes of each record's data as hex.")
    ] = 0,
    json_output: JsonOption = False,
) -> None:
    """Dump a partition's records from --from-txn to --to-txn, across its segments and, below its
    local start (the segments retention deleted), from the archive (--archive).

    Each record is listed with its transaction ID, ReqId (client/generation/partition/sequence),
    transaction header, data length, data CRC and where it was read (a segment file, or the
    archive's chunk file). Every record passed its checks: both CRCs on disk; from the archive the
    chunk's size, SHA-256, rows, consecutive IDs, each record's data against its checksum and its
    data_crc. A range below the local start without --archive, or a chunk that fails a check, is an
    error naming the range (exit 2); so is a corrupt record on disk before the range's end (the
    default range, everything on disk, reaches one the last segment holds), named with its file,
    offset and transaction, after the records before it.
    """
    if storage_dir is None and archive is None:
        typer.echo("error: give a storage directory, --archive URL, or both", err=True)
        raise typer.Exit(2)
    from waltz.archive.layout import ArchiveFiles

    with _usage_errors():
        if storage_dir is not None:
            inspect.require_storage_directory(storage_dir)
        files = None if archive is None else ArchiveFiles.open(archive)
        held = inspect.partition_range(storage_dir, partition, files)
        if storage_dir is not None and files is None:
            kept: list[Path] = []  # unassigned with their files kept: still theirs to dump
            held_here = fmt.partition_directories(storage_dir, kept)
            if partition not in held_here and str(partition) not in {k.name for k in kept}:
                raise inspect.DumpRangeError(
                    f"partition {partition}: {storage_dir} holds no such partition (it holds "
                    f"{', '.join(map(str, sorted(held_here))) or 'none'})"
                )
        if from_txn is not None and to_txn is not None and to_txn < from_txn:
            raise inspect.DumpRangeError(f"--from-txn {from_txn} is after --to-txn {to_txn}: an empty range")
        first = from_txn
        if first is None:
            first = held.archive_start if held.archive_start is not None else (held.local_start or 0)
            if to_txn is not None and to_txn < first:
                first = 0  # a range below where the records start: said so below, or read from the archive
        last = to_txn
        if last is None:
            last = held.last_on_disk if storage_dir is not None else held.archived_through
            if storage_dir is not None and held.corrupt_transaction_id is not None:
                last = held.corrupt_transaction_id  # everything on disk: fail at the corrupt record
        if not json_output:
            corrupt = "" if held.corruption is None else f", then {held.corruption}"
            typer.echo(
                f"partition {partition}: local start {_or_none(held.local_start)}, last on disk "
                f"{held.last_on_disk}{corrupt}, archive {_or_none(archive)}"
                + ("" if files is None else f" holds {_or_none(held.archive_start)}..{held.archived_through}")
            )
            heading = f"{'transaction':>12}  {'req id':<20} {'header':>11} {'length':>10}  data CRC    from"
            typer.echo(heading + ("  data" if hex_bytes else ""))
        listed: list[dict[str, object]] = []
        shown = 0
        for item in inspect.dump_records(storage_dir, partition, first, last, files):
            if limit is not None and shown >= limit:
                if not json_output:
                    typer.echo(f"(stopped after {limit} records: --limit)")
                break
            shown += 1
            record = item.record
            if json_output:
                listed.append(
                    {
                        "transaction_id": record.transaction_id,
                        "req_id": _jsonable(record.req_id),
                        "header": record.header,
                        "length": len(record.data),
                        "checksum": record.checksum,
                        "source": item.source,
                        "archived": item.archived,
                        "data_hex": record.data[:hex_bytes].hex() if hex_bytes else None,
                    }
                )
                continue
            req = record.req_id
            line = (
                f"{record.transaction_id:>12}  "
                f"{f'{req.client_id}/{req.generation}/{req.partition_id}/{req.seq_num}':<20} "
                f"{record.header:>11} {len(record.data):>10}  {record.checksum:#010x}  "
                f"{'archive ' if item.archived else ''}{Path(item.source).name}"
            )
            if hex_bytes > 0:
                more = "..." if len(record.data) > hex_bytes else ""
                line += f"  {record.data[:hex_bytes].hex()}{more}"
            typer.echo(line)
    if json_output:
        _echo_json({"partition_id": partition, "first": first, "last": last, "records": listed})
    else:
        typer.echo(f"({shown} records listed)")


def _or_none(value: object) -> str:
    return "none" if value is None else str(value)


# ---- verify ----


def _echo_problems(problems: tuple[inspect.Problem, ...]) -> None:
    for problem in problems:
        typer.echo(problem.describe())


def _summary(errors: int, warnings: int) -> str:
    verdict = "PASSED" if errors == 0 else "FAILED"
    return f"{verdict} ({errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)})"


def _with_counts(
    report: inspect.StorageReport | inspect.PartitionReport, document: object
) -> dict[str, object]:
    """Add the error and warning counts and the verdict to a report's JSON object."""
    if not isinstance(document, dict):
        raise TypeError(f"expected a JSON object for {type(report).__name__}, got {type(document).__name__}")
    document.update(errors=report.errors, warnings=report.warnings, passed=report.passed)
    return document


@app.command("verify")
def verify(
    storage_dir: StorageDirArgument,
    partition: DiskPartitionOption = None,
    checkpoint_interval: CheckpointIntervalOption = DEFAULT_CHECKPOINT_INTERVAL,
    json_output: JsonOption = False,
) -> None:
    """Verify every segment of every (or the given) partition of a storage directory.

    Checks the control file's CRCs, and for each segment: the header (version, partition, cluster
    key, file name), every record's record CRC and data CRC, transaction IDs consecutive from the
    segment's first ID, every index entry against its record's offset, the index entry count
    against the record count, that segments chain (a segment starts at the previous one's max
    transaction ID + 1; the first one at the partition's local start, 0 unless retention deleted
    older segments or the log was started later) and that nothing follows the last valid record.
    Reads each partition's retention file (retention.json: the archived-through the archiver last
    gave the node); a damaged one is a WARNING, since the node takes it as -1.

    Each problem is printed with partition, file, byte offset and transaction ID. What a storage
    node repairs by itself at start-up (a torn tail of the last segment, its index after the last
    checkpoint, a missing index) is a WARNING; everything else is an ERROR. Prints PASSED or FAILED
    per partition, with its segments, records, local start and archived-through; exits with 1 when
    an ERROR was found, 0 otherwise.
    """
    with _usage_errors():
        report = inspect.verify_storage(storage_dir, partition, checkpoint_interval=checkpoint_interval)
    if json_output:
        document = _with_counts(report, _jsonable(report))
        document["partitions"] = [_with_counts(result, _jsonable(result)) for result in report.partitions]
        typer.echo(json.dumps(document, indent=2))
    else:
        _echo_problems(report.problems)
        for result in report.partitions:
            _echo_problems(result.problems)
            segments = len(result.segments)
            records = sum(s.records for s in result.segments)
            typer.echo(
                f"partition {result.partition_id}: {_summary(result.errors, result.warnings)}: "
                f"{segments} segments, {records} records, local start {result.local_start}, "
                f"archived through {result.archived_through}{_retention_note(result.retention)}"
            )
        if not report.partitions and partition is None:
            typer.echo(f"no partition directories in {storage_dir}")
        typer.echo(f"storage {storage_dir}: {_summary(report.errors, report.warnings)}")
    if not report.passed:
        raise typer.Exit(1)


def _retention_note(record: RetentionRecord | None) -> str:
    """Where the archived-through came from: `` (retention.json: archive ..., set by ... at ...)``."""
    if record is None:
        return ""
    facts = [
        f"archive {record.archive}" if record.archive else "",
        f"set by {record.operator}" if record.operator else "",
    ]
    facts.append(f"at {record.updated_at}" if record.updated_at else "")
    said = ", ".join(fact for fact in facts if fact)
    return f" ({RETENTION_FILE}{': ' + said if said else ''})"


def _segment_context(path: Path) -> tuple[int | None, uuid.UUID | None, bool]:
    """Guess a segment file's partition, cluster key and whether it is last, from where it lies."""
    siblings = sorted(path.parent.glob("*" + fmt.SEGMENT_SUFFIX))
    is_last = not siblings or siblings[-1].name <= path.name
    directory = path.parent
    if not (directory.name.isascii() and directory.name.isdigit()):
        return None, None, is_last
    try:
        dump = inspect.read_control_file(directory.parent)
    except (OSError, WaltzError):
        return None, None, is_last
    return int(directory.name), dump.header.cluster_key, is_last


@app.command("verify-segment")
def verify_segment(
    segment_file: SegmentArgument,
    checkpoint_interval: CheckpointIntervalOption = DEFAULT_CHECKPOINT_INTERVAL,
    json_output: JsonOption = False,
) -> None:
    """Verify one segment data file and its index file.

    The same checks as verify, for one segment. When the file lies in `<storage dir>/<partition>/`,
    its partition and cluster key are checked against the directory and the control file, and it
    is judged as the last segment (torn tail is a WARNING) only when no later segment follows it.
    Exits with 1 when an ERROR was found (an unreadable header is one), 0 otherwise.
    """
    with _usage_errors():
        _require_file(segment_file)
        partition_id, cluster_key, is_last = _segment_context(segment_file)
        report = inspect.verify_segment(
            segment_file,
            partition_id=partition_id,
            cluster_key=cluster_key,
            is_last=is_last,
            checkpoint_interval=checkpoint_interval,
        )
    if json_output:
        document = _jsonable(report)
        if isinstance(document, dict):
            document["errors"] = report.errors
            document["passed"] = report.errors == 0
        typer.echo(json.dumps(document, indent=2))
    else:
        _echo_problems(report.problems)
        warnings = len(report.problems) - report.errors
        typer.echo(
            f"segment {segment_file}: {_summary(report.errors, warnings)}: {report.records} records, "
            f"transactions {report.first_transaction_id} to {report.max_transaction_id}"
        )
    if report.errors:
        raise typer.Exit(1)


# ---- stats ----


@app.command("stats")
def stats(
    storage_dir: StorageDirArgument,
    partition: DiskPartitionOption = None,
    json_output: JsonOption = False,
) -> None:
    """Print statistics per partition of a storage directory.

    Per partition: segments, valid records, record bytes (records on disk, with their 40-byte
    framing), data bytes (transaction data only), the local start (the first transaction on disk)
    and the max transaction ID, the archived-through of its retention file (-1: none), and the
    session ID, low-water mark and local low-water mark of the current partition-info struct and
    the fence from the control file. Every record is read and its CRCs checked, so the numbers are exact;
    the last column counts the problems found (details: waltz disk verify). A --partition the
    directory does not hold is refused (exit 2), naming those it holds.
    """
    with _usage_errors():
        summaries = inspect.collect_stats(storage_dir, partition)
    if json_output:
        _echo_json(summaries)
        return
    typer.echo(_row(_STATS_COLUMNS))
    for s in summaries:
        info = s.info
        control_values: tuple[object, ...] = ("CORRUPT", "-", "-")
        if info is not None:
            control_values = (info.session_id, info.low_water_mark, info.local_low_water_mark)
        problems = "none" if not (s.errors or s.warnings) else f"{s.errors} errors, {s.warnings} warnings"
        values = (s.partition_id, s.segments, s.records, s.record_bytes, s.data_bytes, s.first_transaction_id)
        typer.echo(
            _row((*values, s.max_transaction_id, s.archived_through, *control_values, s.fence, problems))
        )


_STATS_COLUMNS = (
    "partition",
    "segments",
    "records",
    "record bytes",
    "data bytes",
    "local start",
    "max txn",
    "archived",
    "session",
    "lwm",
    "local lwm",
    "fence",
    "problems",
)
_STATS_WIDTHS = (9, 8, 10, 14, 14, 11, 10, 10, 8, 10, 10, 8, 0)


def _row(values: tuple[object, ...]) -> str:
    """Format one line of the stats table: right-aligned columns, the last one left-aligned."""
    cells = [f"{value!s:>{width}}" for value, width in zip(values[:-1], _STATS_WIDTHS, strict=False)]
    return " ".join([*cells, f" {values[-1]}"])
