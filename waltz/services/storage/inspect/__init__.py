"""Read-only inspection of a storage node's files: control file dump, record scans, verification.

Design: docs/design/storage.md "Files on disk"; ``docs/format.md``. Used by ``waltz disk`` and meant
for later tools (the Spark reader, chaos checks). Nothing here writes, truncates or creates a file.

Reading files and checking them, in separate modules, re-exported here:

* :mod:`~waltz.services.storage.inspect.reader` reads files: :func:`read_control_file`,
  :class:`SegmentFile` and its :class:`RecordScan`, :class:`IndexFile`,
  :func:`find_record_offset`, and start-up's torn-tail test (:func:`later_record_indexed`,
  :func:`classify_stop`).
* :mod:`~waltz.services.storage.inspect.dump` reads a partition's records across its segments,
  and from the archive below its local start: :func:`dump_records`, :func:`partition_range`.
* :mod:`~waltz.services.storage.inspect.verify` checks them the way a storage node's start-up
  would: :func:`verify_segment`, :func:`verify_partition` and :func:`verify_storage`, and
  :mod:`~waltz.services.storage.inspect.stats` sums a verification up: :func:`collect_stats`.
  Both return the values of :mod:`~waltz.services.storage.inspect.report` (:class:`Problem` with
  its :class:`Severity`, the reports and :class:`PartitionSummary`).
"""

from waltz.services.storage.inspect.dump import (
    DumpedRecord,
    DumpRangeError,
    PartitionRange,
    dump_records,
    partition_range,
    segment_paths,
)
from waltz.services.storage.inspect.reader import (
    DEFAULT_CHUNK_SIZE,
    ControlFileDump,
    ControlPartition,
    FenceSlot,
    IndexFile,
    PartitionInfoStruct,
    RecordScan,
    ScannedRecord,
    ScanStop,
    SegmentFile,
    StopKind,
    classify_stop,
    find_record_offset,
    later_record_indexed,
    read_control_file,
    require_storage_directory,
)
from waltz.services.storage.inspect.report import (
    PartitionReport,
    PartitionSummary,
    Problem,
    SegmentReport,
    Severity,
    StorageReport,
)
from waltz.services.storage.inspect.stats import PartitionNotHeldError, collect_stats
from waltz.services.storage.inspect.verify import verify_partition, verify_segment, verify_storage

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "ControlFileDump",
    "ControlPartition",
    "DumpRangeError",
    "DumpedRecord",
    "FenceSlot",
    "IndexFile",
    "PartitionInfoStruct",
    "PartitionNotHeldError",
    "PartitionRange",
    "PartitionReport",
    "PartitionSummary",
    "Problem",
    "RecordScan",
    "ScanStop",
    "ScannedRecord",
    "SegmentFile",
    "SegmentReport",
    "Severity",
    "StopKind",
    "StorageReport",
    "classify_stop",
    "collect_stats",
    "dump_records",
    "find_record_offset",
    "later_record_indexed",
    "partition_range",
    "read_control_file",
    "require_storage_directory",
    "segment_paths",
    "verify_partition",
    "verify_segment",
    "verify_storage",
]
