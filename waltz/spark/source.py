"""The ``waltz`` PySpark data source: ``spark.read.format("waltz")`` reads the committed log.

Source: docs/design/spark.md "What the rebuild is for", "Reading committed records only";
``docs/spark.md`` documents the options and why only committed records are returned.

Columns (:data:`LOG_SCHEMA`): ``partition_id`` (int), ``transaction_id`` (bigint), ``header``
(int), the ReqId fields ``req_client_id``, ``req_generation``, ``req_partition_id``,
``req_seq_num`` (int) and ``data`` (binary). Each partition's committed range is split into
ranges of ``range_size`` transactions, one Spark partition each. The options ``partitions``,
``from_transaction_id`` and ``to_transaction_id`` prune the ranges; Spark applies filters to the
rows only: none is pushed down (docs/decisions/0097-the-log-source-pushes-no-filters-down.md).

Options (all strings, as Spark passes them):

- live cluster: ``zookeeper`` (connect string) and ``cluster_root`` (znode path); on a cluster
  whose storage nodes serve TLS, ``ssl_ca_file``, ``ssl_cert_file`` and ``ssl_key_file`` (PEM
  files, readable where the tasks run);
- offline: ``storage_dirs`` (comma-separated storage directories, or ``load(path)``),
  ``replicas`` (replicas per partition in the cluster: required unless ``high_water_mark`` is
  given) and ``high_water_mark`` (the user vouches: ``"120"`` for every partition or
  ``"0:120,1:98"``); the directories must be readable where the Spark tasks run (a shared
  filesystem on a cluster);
- ``partitions`` (``"0,2"``), ``from_transaction_id``, ``to_transaction_id`` (inclusive),
  ``up_to`` (per-partition inclusive upper bounds ``"0:120,1:98"``; more than the committed
  high-water mark is an error), ``after`` (per-partition exclusive lower bounds, the same form:
  what a snapshot at those marks already holds), ``range_size`` (default 100000),
  ``batch_records`` (default 5000), ``timeout`` (seconds per admin call, default 30): each at
  least 1 (``timeout`` above 0), or the read is refused naming the option (ConfigurationError);
- ``archive``: the archive's location (a directory or a URL pyarrow opens) whose chunks hold the
  ranges it archived, read instead of the storage nodes (:mod:`waltz.spark.archived`); a live
  read takes the one ZooKeeper names when it is not given; ``off``: the storage nodes only.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from waltz.archive.layout import ArchiveFiles
from waltz.archive.manifests import read_archive_manifest
from waltz.committed.reads import DEFAULT_BATCH_RECORDS, read_committed
from waltz.committed.sources import CommittedPartition, LiveSource, OfflineSource
from waltz.errors import ConfigurationError
from waltz.protocol.channels import TlsConfig
from waltz.services.storage import inspect
from waltz.spark.archived import (
    ARCHIVE_OFF,
    ArchivedRange,
    archive_cluster_problem,
    plan_archived,
    read_archived_range,
)
from waltz.spark.errors import CommittedReadError

__all__ = ["LOG_SCHEMA", "LogRange", "WaltzDataSource", "WaltzLogReader", "parse_marks", "tls_option"]

log = logging.getLogger(__name__)

#: The data source's schema (Spark DDL).
LOG_SCHEMA = (
    "partition_id INT, transaction_id BIGINT, header INT, req_client_id INT, req_generation INT, "
    "req_partition_id INT, req_seq_num INT, data BINARY"
)

_ARROW_SCHEMA = pa.schema(
    [
        ("partition_id", pa.int32()),
        ("transaction_id", pa.int64()),
        ("header", pa.int32()),
        ("req_client_id", pa.int32()),
        ("req_generation", pa.int32()),
        ("req_partition_id", pa.int32()),
        ("req_seq_num", pa.int32()),
        ("data", pa.binary()),
    ]
)

#: Rows per Arrow batch handed to Spark.
_ROWS_PER_BATCH = 8192
#: Default transactions per Spark partition.
DEFAULT_RANGE_SIZE = 100_000


def parse_marks(text: str, option: str) -> dict[int, int]:
    """Parse ``"0:120,1:98"`` into ``{0: 120, 1: 98}``.

    Raises:
        ConfigurationError: malformed text (names ``option``).
    """
    marks: dict[int, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        pid, sep, mark = item.partition(":")
        try:
            if not sep:
                raise ValueError(item)
            marks[int(pid)] = int(mark)
        except ValueError:
            raise ConfigurationError(
                f"option {option}={text!r}: expected partition:transaction pairs such as 0:120,1:98"
            ) from None
    return marks


@dataclass(frozen=True)
class LogRange(InputPartition):
    """One Spark partition: transactions ``first..last`` of one Waltz partition, and where they are."""

    partition_id: int
    first: int
    last: int
    source: LiveSource | OfflineSource


class WaltzDataSource(DataSource):
    """``spark.read.format("waltz")``: the committed records of a Waltz log (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "waltz"

    def schema(self) -> str:
        return LOG_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return WaltzLogReader(dict(self.options))


def tls_option(options: Mapping[str, str]) -> TlsConfig | None:
    """Client TLS files from the ``ssl_ca_file``, ``ssl_cert_file``, ``ssl_key_file`` options."""
    files = [options.get(name) or None for name in ("ssl_ca_file", "ssl_cert_file", "ssl_key_file")]
    if not any(files):
        return None
    ca, cert, key = (Path(f) if f else None for f in files)
    return TlsConfig(ca, cert, key)


#: Default seconds per admin call of a live read (the ``timeout`` option).
DEFAULT_TIMEOUT = 30.0


def _int_option(
    options: Mapping[str, str], name: str, default: int | None, *, minimum: int | None = None
) -> int | None:
    """The integer an option gives (``default`` when it is absent or empty).

    Raises:
        ConfigurationError: not an integer, or below ``minimum`` (naming the option and its value).
    """
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"option {name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ConfigurationError(f"option {name}={raw!r}: give an integer of at least {minimum}")
    return value


def _seconds_option(options: Mapping[str, str], name: str, default: float) -> float:
    """The positive, finite number of seconds an option gives (``default`` when absent or empty).

    Raises:
        ConfigurationError: not a number, not finite, or zero or less (naming the option and its
            value).
    """
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"option {name}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"option {name}={raw!r}: give a finite number of seconds above 0")
    return value


def _partitions_option(options: Mapping[str, str]) -> list[int] | None:
    """The partition IDs of the ``partitions`` option (``"0,2"``), or None when it is not given.

    Raises:
        ConfigurationError: an item that is not a partition ID (an integer of at least 0).
    """
    raw = options.get("partitions")
    if not raw:
        return None
    partitions = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        try:
            pid = int(item)
        except ValueError:
            pid = -1
        if pid < 0:
            raise ConfigurationError(
                f"option partitions={raw!r}: {item!r} is not a partition ID; give partition IDs such as 0,2"
            )
        partitions.append(pid)
    return partitions


def _range_size(options: Mapping[str, str]) -> int:
    """Transactions per Spark partition (the ``range_size`` option, at least 1)."""
    return _int_option(options, "range_size", DEFAULT_RANGE_SIZE, minimum=1) or DEFAULT_RANGE_SIZE


def _batch_records(options: Mapping[str, str]) -> int:
    """Records per admin record-list request (the ``batch_records`` option, at least 1)."""
    return _int_option(options, "batch_records", DEFAULT_BATCH_RECORDS, minimum=1) or DEFAULT_BATCH_RECORDS


class WaltzLogReader(DataSourceReader):
    """Plans the committed ranges on the driver and reads them in the tasks."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = {k.lower(): v for k, v in options.items()}

    # No ``pushFilters``: PySpark 4.3 keeps the plan of a query whose filters were pushed down for
    # the next query on the same DataFrame that pushes none, which then read only the first
    # query's ranges (docs/decisions/0097-the-log-source-pushes-no-filters-down.md). The options
    # ``partitions``, ``from_transaction_id`` and ``to_transaction_id`` prune the plan instead.

    # ---- planning ----

    def plan(self) -> list[CommittedPartition]:
        """The committed partitions of the configured log (live or offline).

        Raises:
            ConfigurationError: neither or both of a live cluster and storage directories given.
            CommittedReadError: a partition's committed records cannot be proven.
        """
        # The planning's modules (ZooKeeper, the storage nodes' admin calls) are imported here, on
        # the driver, not where the tasks only read: a Spark task imports this module to read.
        from waltz.committed.plan import plan_live, plan_offline
        from waltz.metadata.zk_security import ZOOKEEPER_SECURITY_FILE_FIELDS, security_from_files

        options = self.options
        partitions = _partitions_option(options)
        dirs = options.get("storage_dirs") or options.get("path")
        zookeeper = options.get("zookeeper")
        if bool(dirs) == bool(zookeeper):
            raise ConfigurationError(
                "give either zookeeper and cluster_root (a live cluster) or storage_dirs "
                "(directories on disk)"
            )
        if zookeeper:
            root = options.get("cluster_root")
            if not root:
                raise ConfigurationError("option cluster_root is required with zookeeper")
            timeout = _seconds_option(options, "timeout", DEFAULT_TIMEOUT)
            files = {k: options[k] for k in ZOOKEEPER_SECURITY_FILE_FIELDS if options.get(k)}
            security = security_from_files(files) if files else None
            return plan_live(
                zookeeper, root, partitions, timeout=timeout, tls=tls_option(options), security=security
            )
        directories = [d.strip() for d in (dirs or "").split(",") if d.strip()]
        explicit: dict[int, int] | None = None
        raw = options.get("high_water_mark")
        if raw:
            if ":" in raw:
                explicit = parse_marks(raw, "high_water_mark")
            else:
                mark = _int_option(options, "high_water_mark", -1)
                count = inspect.read_control_file(Path(directories[0])).header.num_partitions
                explicit = dict.fromkeys(range(count), -1 if mark is None else mark)
        return plan_offline(
            directories,
            partitions,
            replicas=_int_option(options, "replicas", None),
            high_water_marks=explicit,
        )

    def partitions(self) -> Sequence[InputPartition]:
        """The ranges to read, one Spark partition each (on the driver).

        Raises:
            ConfigurationError: an option that is not of its form (named with its value):
                ``partitions`` not partition IDs, ``range_size`` or ``batch_records`` not an
                integer of at least 1, ``timeout`` not a finite number of seconds above 0, a
                transaction ID or marks option not integers; the source's options as
                :meth:`plan` refuses them; or an ``archive`` of another cluster.
            CommittedReadError: as :meth:`plan`, or ``up_to`` above what is proven committed.
        """
        options = self.options
        range_size = _range_size(options)
        # Checked here, on the driver, before the tasks read with them.
        _batch_records(options)
        _seconds_option(options, "timeout", DEFAULT_TIMEOUT)
        low = _int_option(options, "from_transaction_id", 0) or 0
        high = _int_option(options, "to_transaction_id", None)
        up_to = parse_marks(options.get("up_to", ""), "up_to")
        after = parse_marks(options.get("after", ""), "after")
        ranges: list[InputPartition] = []
        archives: dict[str, ArchiveFiles] = {}
        plans = self.plan()
        self._require_cluster_archive(plans)
        for committed in plans:
            pid = committed.partition_id
            last = committed.high_water_mark
            if pid in up_to:
                if up_to[pid] > committed.high_water_mark:
                    raise CommittedReadError(
                        f"partition {pid}: asked to read up to {up_to[pid]}, "
                        f"but only {committed.high_water_mark} "
                        f"is proven committed ({committed.proof})"
                    )
                last = up_to[pid]
            if high is not None:
                last = min(last, high)
            start = max(low, after.get(pid, -1) + 1, committed.first_transaction_id)
            log.info("partition %d: reading %d..%d (%s)", pid, start, last, committed.proof)
            location = self._archive(committed)
            archived: list[ArchivedRange] = []
            span = None
            if location is not None and start <= last:
                if location not in archives:
                    archives[location] = ArchiveFiles.open(location)
                files = archives[location]
                archived, span = plan_archived(files, pid, start, last)
            if span is None:
                ranges.extend(_log_ranges(pid, start, last, range_size, committed.source))
                continue
            log.info("partition %d: %d..%d from the archive %s", pid, span[0], span[1], location)
            ranges.extend(_log_ranges(pid, start, span[0] - 1, range_size, committed.source))
            ranges.extend(archived)
            ranges.extend(_log_ranges(pid, span[1] + 1, last, range_size, committed.source))
        if not ranges:
            # Spark needs at least one partition; an empty range reads nothing.
            ranges.append(LogRange(0, 0, -1, OfflineSource((), None)))
        return ranges

    def _require_cluster_archive(self, plans: Sequence[CommittedPartition]) -> None:
        """The archive the ``archive`` option names, if it holds one, is the archive of the log's
        cluster (:func:`~waltz.spark.archived.archive_cluster_problem`): another cluster's chunks
        would be read as this log's (docs/design/spark.md, "Archived ranges").

        Raises:
            ConfigurationError: it is another cluster's, or another partition count's.
        """
        given = self.options.get("archive")
        if not given or given.lower() == ARCHIVE_OFF:
            return
        manifest = read_archive_manifest(ArchiveFiles.open(given))
        problem = None if manifest is None else archive_cluster_problem(manifest, plans)
        if problem is not None:
            raise ConfigurationError(
                f"option archive={given} {problem}; give the archive of the cluster the log is read from "
                "(waltz archive status names it), or a copy of it"
            )

    def _archive(self, committed: CommittedPartition) -> str | None:
        """The archive to read a partition's archived ranges from (None: the storage nodes only)."""
        given = self.options.get("archive")
        if given:
            return None if given.lower() == ARCHIVE_OFF else given
        source = committed.source
        return source.archive if isinstance(source, LiveSource) else None

    # ---- reading (in the tasks) ----

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Read one planned range (in a Spark task): committed records, CRC-checked, as Arrow batches.

        Raises:
            CorruptRecordError: a record failed its CRC or broke the ID sequence on every replica.
            CommittedReadError: no proven replica could serve the range.
            ArchiveCheckError: an archived range's chunk is missing or fails a check.
        """
        if isinstance(partition, ArchivedRange):
            yield from read_archived_range(partition, _ARROW_SCHEMA, _ROWS_PER_BATCH)
            return
        if not isinstance(partition, LogRange):
            raise TypeError(f"not a planned Waltz range: {partition!r}")
        batch_records = _batch_records(self.options)
        timeout = _seconds_option(self.options, "timeout", DEFAULT_TIMEOUT)
        columns: list[list[Any]] = [[] for _ in range(8)]
        records = read_committed(
            partition.partition_id,
            partition.first,
            partition.last,
            partition.source,
            batch_records=batch_records,
            timeout=timeout,
        )
        for record in records:
            req = record.req_id
            for column, value in zip(
                columns,
                (
                    partition.partition_id,
                    record.transaction_id,
                    record.header,
                    req.client_id,
                    req.generation,
                    req.partition_id,
                    req.seq_num,
                    record.data,
                ),
                strict=True,
            ):
                column.append(value)
            if len(columns[0]) >= _ROWS_PER_BATCH:
                yield pa.RecordBatch.from_arrays(
                    [pa.array(c, t.type) for c, t in zip(columns, _ARROW_SCHEMA, strict=True)],
                    schema=_ARROW_SCHEMA,
                )
                columns = [[] for _ in range(8)]
        if columns[0]:
            yield pa.RecordBatch.from_arrays(
                [pa.array(c, t.type) for c, t in zip(columns, _ARROW_SCHEMA, strict=True)],
                schema=_ARROW_SCHEMA,
            )


def _log_ranges(
    partition_id: int, first: int, last: int, range_size: int, source: LiveSource | OfflineSource
) -> list[LogRange]:
    """``first..last`` read from the storage nodes, in ranges of ``range_size`` transactions."""
    return [
        LogRange(partition_id, start, min(last, start + range_size - 1), source)
        for start in range(first, last + 1, range_size)
    ]
