"""The invariants ``waltz chaos`` asserts at the end of a run (docs/chaos.md "The checks").

- :func:`read_log`: a fresh client reads every partition from the start and keeps what it saw
  (per partition a running checksum, and where every tagged payload lies);
- :func:`segment_digests`: with every node stopped, the CRC-32 of every segment body (the bytes
  after the 128-byte header up to the end of the last valid record, docs/design/storage.md
  "Segments and index files") of every replica of every partition, read from the storage directories;
- :func:`check_run`: the checks themselves, each a :class:`ChaosCheck` with a verdict and details.
"""

from __future__ import annotations

import threading
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waltz.chaos.sequence import ChecksumCallbacks, counter_key_for, decode_counter, decode_tag, payload_for
from waltz.client.config import WaltzClientConfig
from waltz.client.reading import read_up_to
from waltz.client.transaction import Transaction
from waltz.errors import (
    ClientAheadOfLogError,
    MessageTooLargeError,
    PartitionNotMountedError,
    PartitionNotOpenError,
    PartitionPausedError,
    StalePartitionEpochError,
    TransactionExpiredError,
)
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitRecordFormatError, decode_split_record
from waltz.services.storage import format as fmt
from waltz.services.storage.inspect.reader import SegmentFile, StopKind

__all__ = [
    "DEFINITE_FAILURES",
    "DROPPED",
    "ChaosCheck",
    "LogObserver",
    "LogReading",
    "ReplicaDigest",
    "WorkerResult",
    "check_definite_failures",
    "check_gaps",
    "check_outcomes_complete",
    "check_progress",
    "check_replicas_on_disk",
    "check_run",
    "read_log",
    "segment_digests",
]

#: Bytes read at once while computing a segment body's CRC.
_CRC_CHUNK = 4 * 1024 * 1024

#: The error a worker records for a submission its context dropped (``execute`` returned False):
#: never appended, so never committed.
DROPPED = "execute returned False"

#: The errors, by the name a worker records (:func:`failure_kind`), that tell the application its
#: transaction did not and will not commit (docs/chaos.md "The checks"): an expiry (it ends a
#: context only with no attempt in flight), a refusal of the append by the server or the client
#: (a stale epoch, a partition not open yet or not mounted, a mount refused, data too large), a
#: lock failure whose retry cannot run (an apply paused for an upgrade), a context's own drop.
#: Every other error (a timeout, a lost connection, a client closed with the transaction in
#: flight, an unknown one) leaves its fate open: found in the log, it is counted, not a failure.
DEFINITE_FAILURES = frozenset(
    {
        TransactionExpiredError.__name__,
        PartitionPausedError.__name__,
        StalePartitionEpochError.__name__,
        PartitionNotOpenError.__name__,
        ClientAheadOfLogError.__name__,
        PartitionNotMountedError.__name__,
        MessageTooLargeError.__name__,
        DROPPED,
    }
)


@dataclass(frozen=True, slots=True)
class ChaosCheck:
    """One invariant's verdict."""

    name: str
    passed: bool
    detail: str


@dataclass
class WorkerResult:
    """What one chaos client reported (the JSON of :mod:`waltz.chaos.worker`).

    Attributes:
        worker: the worker's index (the writer of its payloads).
        client_id: its Waltz client ID.
        acked: ``(sequence, partition, transaction ID)`` of every acknowledged submission.
        failed: ``(sequence, repr of the error)`` of every failed one.
        lock_failures: lock failures it retried.
        partitions: partition -> ``(mark, checksum, count, errors)`` of what it applied.
        uncaught: exceptions its applies raised.
        ledger: the ledger workload's counts and errors.
        submitted: how many submissions it made, sequences ``0..submitted-1`` (None: the
            ledger workload's result, or one that does not say).
    """

    worker: int
    client_id: int
    acked: list[tuple[int, int, int]]
    failed: list[tuple[int, str]]
    lock_failures: int
    partitions: dict[int, tuple[int, int, int, list[str]]]
    uncaught: list[str]
    ledger: dict[str, Any] = field(default_factory=dict)
    submitted: int | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkerResult:
        """Decode the worker's result file."""
        return cls(
            worker=int(raw["worker"]),
            client_id=int(raw["client_id"]),
            acked=[(int(s), int(p), int(t)) for s, p, t in raw["acked"]],
            failed=[(int(s), str(e)) for s, e in raw["failed"]],
            lock_failures=int(raw["lock_failures"]),
            partitions={
                int(p): (int(v[0]), int(v[1]), int(v[2]), list(v[3])) for p, v in raw["partitions"].items()
            },
            uncaught=list(raw["uncaught"]),
            ledger=dict(raw.get("ledger", {})),
            submitted=int(raw["submitted"]) if "submitted" in raw else None,
        )


@dataclass
class LogReading:
    """What a fresh client read from the start of every partition.

    Attributes:
        marks: partition -> the highest transaction ID read.
        checksums: partition -> the running checksum at that mark (as every client keeps it).
        counts: partition -> transactions read.
        places: ``(writer, sequence)`` -> every ``(partition, transaction ID)`` holding it.
        bad_payloads: transactions whose data is not the payload their tag names.
        errors: gaps or repeats the reader's callbacks saw, and apply exceptions.
        counter_errors: counter increments that did not read the key's latest value (lost updates).
        counter_keys: counter keys written (the counter workload).
        generations: partition -> (the first, the latest) generation of the ReqIds read.
        generation_errors: transactions whose generation is older than that of a transaction
            before them in the partition (a stale owner committed after a takeover).
        split_records: ``(partition, transaction ID)`` of every split barrier and genesis read.
        first_ids: partition -> the first transaction ID of its log (0, or a split's new
            partition's genesis, ``B(p) + 1``); partitions not named start at 0.
    """

    marks: dict[int, int] = field(default_factory=dict)
    checksums: dict[int, int] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    places: dict[tuple[int, int], list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    bad_payloads: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    counter_errors: list[str] = field(default_factory=list)
    counter_keys: int = 0
    generations: dict[int, tuple[int, int]] = field(default_factory=dict)
    generation_errors: list[str] = field(default_factory=list)
    split_records: list[tuple[int, int]] = field(default_factory=list)
    first_ids: dict[int, int] = field(default_factory=dict)

    def summary(self) -> dict[int, tuple[int, int]]:
        """partition -> (mark, checksum), what two readings must agree on."""
        return {pid: (self.marks[pid], self.checksums[pid]) for pid in sorted(self.marks)}


class LogObserver:
    """Records where every chaos payload lies in the log, and checks it as it is read.

    Called with every transaction a reader applies, in ID order per partition (possibly from one
    thread per partition). Damaged or foreign payloads go to ``reading.bad_payloads``; a counter
    increment whose value is not its key's previous value plus one (a lost or doubled update) goes
    to ``reading.counter_errors``.

    Args:
        reading: where to record.
        seed: the run's seed (payloads and counter keys are derived from it).
        workload: ``raw`` or ``counter``.
        keys: the counter workload's number of keys.
    """

    def __init__(self, reading: LogReading, seed: int, workload: str, keys: int) -> None:
        self.reading = reading
        self.seed = seed
        self.workload = workload
        self.keys = keys
        self.values: dict[int, int] = {}
        self._lock = threading.Lock()

    def __call__(self, transaction: Transaction, data: bytes) -> None:
        reading, seed = self.reading, self.seed
        where = (transaction.partition_id, transaction.transaction_id)
        generation = transaction.req_id.generation
        with self._lock:
            first, latest = reading.generations.get(where[0], (generation, generation))
            if generation < latest:
                reading.generation_errors.append(f"{where}: generation {generation} after {latest}")
            reading.generations[where[0]] = (first, max(latest, generation))
        if transaction.header == SPLIT_RECORD_HEADER:
            # A split's barrier or genesis (docs/design/splits.md "Record forms"): the servers'
            # record, no client's payload; a damaged one fails the readers' apply.
            try:
                decode_split_record(data)
            except SplitRecordFormatError as exc:
                with self._lock:
                    reading.bad_payloads.append(f"{where}: a split record that does not decode: {exc}")
                return
            with self._lock:
                reading.split_records.append(where)
            return
        if self.workload == "counter":
            counter = decode_counter(data)
            with self._lock:
                if counter is None or counter[2] != counter_key_for(seed, counter[0], counter[1], self.keys):
                    reading.bad_payloads.append(f"{where}: {len(data)} bytes, not a counter increment")
                    return
                writer, sequence, key, value = counter
                reading.places[(writer, sequence)].append(where)
                # The key's value, whichever partition wrote it: after a split its increments go on
                # in its new partition, whose genesis this reader applies only once the parent is
                # applied to the barrier.
                previous = self.values.get(key, 0)
                if value != previous + 1:
                    reading.counter_errors.append(
                        f"{where}: key {key} set to {value} by writer {writer} #{sequence}, after {previous}"
                    )
                self.values[key] = value
            return
        tag = decode_tag(data)
        with self._lock:
            if tag is None or data != payload_for(seed, *tag):
                reading.bad_payloads.append(f"{where}: {len(data)} bytes, tag {tag}")
            else:
                reading.places[tag].append(where)


def read_log(
    config: WaltzClientConfig,
    marks: Mapping[int, int],
    seed: int,
    timeout: float = 600.0,
    *,
    workload: str = "raw",
    keys: int = 1000,
    progress: Callable[[int, int], None] | None = None,
    first_ids: Mapping[int, int] | None = None,
) -> LogReading:
    """Read every partition from the start of its log up to ``marks`` with a fresh client.

    Args:
        config: the client settings that reach the cluster.
        marks: partition -> the high-water mark to read up to (-1: empty partition).
        seed: the run's seed (to re-derive every payload and compare it byte for byte).
        timeout: seconds allowed in all.
        workload: ``raw`` (payloads re-derived from the seed and located), ``counter`` (also every
            increment must have read the key's latest value), or ``ledger`` (only checksums).
        keys: the counter workload's number of keys.
        progress: called now and then with ``(transactions read, transactions to read)``.
        first_ids: partition -> where its log starts, for a split's new partitions (their
            genesis, ``PartitionEpochs.first_transaction_ids``); others start at 0.

    Returns:
        What was read.

    Raises:
        TimeoutError: a partition was not read up to its mark in time.
    """
    reading = LogReading(first_ids=dict(first_ids or {}))

    observer = LogObserver(reading, seed, workload, keys)

    callbacks = ChecksumCallbacks(observer if workload in ("raw", "counter") else None)
    read_up_to(callbacks, config, marks, timeout=timeout, progress=progress)
    for pid in marks:
        state = callbacks.sequence(pid)
        reading.marks[pid] = state.mark
        reading.checksums[pid] = state.checksum
        reading.counts[pid] = state.count
        reading.errors += state.errors
    reading.errors += callbacks.uncaught
    reading.counter_keys = len(observer.values)
    return reading


@dataclass(frozen=True, slots=True)
class ReplicaDigest:
    """One replica of one partition as its storage directory holds it.

    Attributes:
        segments: ``(file name, CRC-32 of the body, records)`` of each segment, in order.
        records: valid records in all.
        stream_crc: CRC-32 of every segment body one after the other.
        problems: a scan that did not end cleanly (torn tail or corruption), with where.
    """

    segments: tuple[tuple[str, int, int], ...]
    records: int
    stream_crc: int
    problems: tuple[str, ...]


def _partition_digest(directory: Path) -> ReplicaDigest:
    segments: list[tuple[str, int, int]] = []
    stream = 0
    records = 0
    problems: list[str] = []
    for path in sorted(directory.glob("*" + fmt.SEGMENT_SUFFIX)):
        with SegmentFile(path) as segment:
            scan = segment.scan()
            count = sum(1 for _ in scan)
            stop = scan.stop
            end = stop.offset if stop is not None else segment.file_size
            if stop is not None and stop.kind is not StopKind.END:
                problems.append(f"{path.name}: {stop.kind.value} at byte {stop.offset} ({stop.reason})")
            crc = 0
            offset = fmt.HEADER_SIZE
            while offset < end:
                chunk = segment.pread(min(_CRC_CHUNK, end - offset), offset)
                if not chunk:
                    break
                crc = zlib.crc32(chunk, crc)
                stream = zlib.crc32(chunk, stream)
                offset += len(chunk)
        segments.append((path.name, crc, count))
        records += count
    return ReplicaDigest(tuple(segments), records, stream, tuple(problems))


def segment_digests(storage_dirs: Mapping[str, Path]) -> dict[int, dict[str, ReplicaDigest]]:
    """The digest of every replica of every partition, read from stopped storage nodes' directories.

    Args:
        storage_dirs: storage node name -> its storage directory (the nodes must not run).

    Returns:
        partition -> storage node name -> its replica's digest (partitions a node does not hold
        are absent).

    Raises:
        OSError: a file cannot be read.
        CorruptDataError: a segment header is unreadable.
    """
    result: dict[int, dict[str, ReplicaDigest]] = defaultdict(dict)
    for name, storage_dir in sorted(storage_dirs.items()):
        for child in sorted(storage_dir.iterdir()):
            if child.is_dir() and child.name.isdigit() and str(int(child.name)) == child.name:
                result[int(child.name)][name] = _partition_digest(child)
    return dict(result)


def check_replicas_on_disk(
    digests: Mapping[int, Mapping[str, ReplicaDigest]],
    marks: Mapping[int, int],
    replicas: int,
    first_ids: Mapping[int, int] | None = None,
) -> ChaosCheck:
    """All replicas of every partition byte-identical: same segments, same body CRCs, every record.

    Args:
        digests: from :func:`segment_digests`.
        marks: partition -> its high-water mark (each replica must hold records first..mark, no
            more).
        replicas: replicas per partition (each partition must have that many).
        first_ids: partition -> its first transaction ID (a split's new partition starts at its
            genesis, ``B(p) + 1``); others start at 0.
    """
    wrong: list[str] = []
    firsts = first_ids or {}
    for pid, mark in sorted(marks.items()):
        held = digests.get(pid, {})
        if len(held) != replicas:
            wrong.append(f"partition {pid}: {len(held)} replicas on disk, expected {replicas}")
        expected = mark + 1 - firsts.get(pid, 0)
        for name, digest in held.items():
            if digest.records != expected:
                wrong.append(f"partition {pid} on {name}: {digest.records} records, expected {expected}")
            wrong += [f"partition {pid} on {name}: {p}" for p in digest.problems]
        if len({(d.segments, d.stream_crc) for d in held.values()}) > 1:
            lines = "; ".join(
                f"{name}: " + ", ".join(f"{s}={crc:08x}/{n}" for s, crc, n in d.segments)
                for name, d in sorted(held.items())
            )
            wrong.append(f"partition {pid}: replicas differ: {lines}")
    segments = sum(len(d.segments) for held in digests.values() for d in held.values())
    return ChaosCheck(
        "all replicas byte-identical on disk (CRC-32 of every segment body)",
        not wrong,
        "; ".join(wrong[:10]) if wrong else f"{segments} segment files of {len(digests)} partitions compared",
    )


def check_run(
    *,
    workers: Sequence[WorkerResult],
    submitted: Mapping[int, int],
    marks: Mapping[int, int],
    reading: LogReading,
) -> list[ChaosCheck]:
    """The checks on the log and the clients after the run (see the module docstring).

    Args:
        workers: every worker's result.
        submitted: worker -> how many transactions it submitted, by its own count
            (:attr:`WorkerResult.submitted`); a worker not named fails the outcomes' check.
        marks: partition -> the servers' high-water mark after healing.
        reading: what a fresh client read from the start.
    """
    acked = [(w.worker, s, p, t) for w in workers for s, p, t in w.acked]
    checks: list[ChaosCheck] = [
        check_progress(len(acked), sum(submitted.values())),
        check_outcomes_complete(workers, submitted),
    ]
    # Every acknowledged transaction is in the log exactly once, where its acknowledgement said.
    misplaced = [
        f"writer {w} #{s}: acknowledged as {p}:{t}, found at {reading.places.get((w, s), [])}"
        for w, s, p, t in acked
        if reading.places.get((w, s)) != [(p, t)]
    ]
    checks.append(
        ChaosCheck(
            "every acknowledged transaction is in the log exactly once",
            not misplaced,
            f"{len(acked)} acknowledged" if not misplaced else f"{len(misplaced)} wrong: {misplaced[:5]}",
        )
    )
    # No transaction twice, nothing that was never submitted, no damaged payload.
    repeated = {tag: where for tag, where in reading.places.items() if len(where) > 1}
    foreign = [tag for tag in reading.places if not 0 <= tag[1] < submitted.get(tag[0], 0)]
    checks.append(
        ChaosCheck(
            "no transaction in the log twice, none unsubmitted or damaged",
            not repeated and not foreign and not reading.bad_payloads,
            f"{sum(len(v) for v in reading.places.values())} tagged transactions; repeated {len(repeated)} "
            f"{list(repeated.items())[:3]}; never submitted {len(foreign)}; "
            f"damaged {len(reading.bad_payloads)} {reading.bad_payloads[:3]}"
            + (f"; {len(reading.split_records)} split records" if reading.split_records else ""),
        )
    )
    checks.append(check_definite_failures(workers, reading))
    checks.append(check_gaps(marks, reading, workers))
    spans = ", ".join(f"{pid}: {a}..{b}" for pid, (a, b) in sorted(reading.generations.items()))
    checks.append(
        ChaosCheck(
            "generations never go back in a partition's log (no stale owner committed after a takeover)",
            not reading.generation_errors,
            f"generations by partition {spans}"
            if not reading.generation_errors
            else f"{len(reading.generation_errors)} wrong: {reading.generation_errors[:3]}",
        )
    )
    # Every client applied the same sequence as the fresh reader.
    expected = reading.summary()
    differing = []
    for w in workers:
        theirs = {pid: (v[0], v[1]) for pid, v in w.partitions.items() if pid in expected}
        if theirs != expected:
            differing.append(f"worker {w.worker} (client {w.client_id}): {theirs}")
    checks.append(
        ChaosCheck(
            "every client applied the same sequence as a fresh reader (checksums match)",
            not differing,
            f"{len(workers)} clients, {_format_summary(expected)}"
            if not differing
            else "; ".join(differing[:3]),
        )
    )
    if reading.counter_keys:
        checks.append(
            ChaosCheck(
                "counter: every increment read its key's latest value (no lost update)",
                not reading.counter_errors,
                f"{reading.counter_keys} counters"
                if not reading.counter_errors
                else f"{len(reading.counter_errors)} wrong: {reading.counter_errors[:3]}",
            )
        )
    uncaught = [u for w in workers for u in w.uncaught]
    checks.append(
        ChaosCheck(
            "no apply failed in any client",
            not uncaught,
            f"{len(uncaught)} uncaught exceptions {uncaught[:3]}",
        )
    )
    return checks


def failure_kind(error: str) -> str:
    """The kind of a failed submission's error as a worker records it: the exception's class name
    (the error is its ``repr``), or :data:`DROPPED`."""
    return error.split("(", 1)[0]


def check_progress(acknowledged: int, submitted: int) -> ChaosCheck:
    """The clients made progress: at least one submission was acknowledged (docs/chaos.md "The
    checks"). A run whose every submission failed, whatever each error, tells nothing of the
    log's guarantees and fails.

    Args:
        acknowledged: submissions acknowledged (the ledger workload: transactions committed).
        submitted: submissions made.
    """
    return ChaosCheck(
        "the clients made progress (submissions acknowledged)",
        acknowledged > 0,
        f"{acknowledged} of {submitted} submissions acknowledged"
        + ("" if acknowledged > 0 else ": nothing acknowledged, the run made no progress"),
    )


def check_definite_failures(workers: Sequence[WorkerResult], reading: LogReading) -> ChaosCheck:
    """No submission whose error said it did not and will not commit (:data:`DEFINITE_FAILURES`)
    is in the log; those of an open fate found there are counted by kind (docs/chaos.md "The
    checks").

    Args:
        workers: every worker's result.
        reading: what a fresh client read from the start.
    """
    committed = [
        (w.worker, s, failure_kind(error), reading.places[(w.worker, s)])
        for w in workers
        for s, error in w.failed
        if reading.places.get((w.worker, s))
    ]
    definite = [
        f"writer {w} #{s} failed with {kind}, committed at {where}"
        for w, s, kind, where in committed
        if kind in DEFINITE_FAILURES
    ]
    open_fate = Counter(kind for _, _, kind, _ in committed if kind not in DEFINITE_FAILURES)
    kinds = ", ".join(f"{kind}: {n}" for kind, n in sorted(open_fate.items()))
    failed = sum(len(w.failed) for w in workers)
    counted = f"{len(committed)} of {failed} failed submissions committed anyway" + (
        f" ({kinds})" if kinds else ""
    )
    return ChaosCheck(
        "no submission that failed for certain is in the log",
        not definite,
        counted if not definite else f"{len(definite)} in the log: {definite[:5]}; {counted}",
    )


def _listed(numbers: Sequence[int]) -> str:
    """Up to 10 numbers, and how many more."""
    more = f" and {len(numbers) - 10} more" if len(numbers) > 10 else ""
    return f"{list(numbers[:10])}{more}"


def check_outcomes_complete(workers: Sequence[WorkerResult], submitted: Mapping[int, int]) -> ChaosCheck:
    """Every client recorded one outcome per submission: its acknowledged and failed sequences
    together are ``0..n-1``, each once, ``n`` its own count of submissions (docs/chaos.md "The
    checks").

    An outcome recorded twice would count an acknowledgement twice; one missing would leave a
    submission in the log that no outcome accounts for.

    Args:
        workers: every worker's result.
        submitted: worker -> how many submissions it made.
    """
    wrong: list[str] = []
    for w in workers:
        count = submitted.get(w.worker)
        if count is None:
            wrong.append(f"worker {w.worker}: its result gives no count of submissions")
            continue
        seen = Counter([s for s, _, _ in w.acked] + [s for s, _ in w.failed])
        problems = []
        missing = sorted(set(range(count)) - seen.keys())
        if missing:
            problems.append(f"missing {_listed(missing)}")
        duplicated = sorted(s for s, n in seen.items() if n > 1)
        if duplicated:
            problems.append(f"duplicated {_listed(duplicated)}")
        outside = sorted(s for s in seen if not 0 <= s < count)
        if outside:
            problems.append(f"outside 0..{count - 1} {_listed(outside)}")
        if problems:
            wrong.append(f"worker {w.worker}: {', '.join(problems)} of {count} submissions")
    return ChaosCheck(
        "every client's outcomes cover its submissions, each once",
        not wrong,
        "; ".join(wrong[:5])
        if wrong
        else f"{len(workers)} clients, {sum(submitted.values())} submissions, one outcome each",
    )


def check_gaps(
    marks: Mapping[int, int], reading: LogReading, workers: Sequence[WorkerResult] = ()
) -> ChaosCheck:
    """No gaps: transaction IDs first..mark on every partition (0, or a split's new partition's
    genesis: ``reading.first_ids``), each read (and applied) once.

    Args:
        marks: partition -> the servers' high-water mark.
        reading: what a fresh client read.
        workers: the clients' results (their own gap and repeat errors count too).
    """
    firsts = reading.first_ids
    sizes = {pid: mark + 1 - firsts.get(pid, 0) for pid, mark in marks.items()}
    gaps = [
        f"partition {pid}: read {reading.counts.get(pid, 0)} up to {reading.marks.get(pid)}, mark {mark}"
        + (f" from {firsts[pid]}" if pid in firsts else "")
        for pid, mark in sorted(marks.items())
        if reading.counts.get(pid, 0) != sizes[pid] or reading.marks.get(pid) != mark
    ]
    worker_errors = [e for w in workers for _, _, _, errors in w.partitions.values() for e in errors]
    split = f", {len(firsts)} of them from a split's genesis on" if firsts else ""
    return ChaosCheck(
        "no gaps in transaction IDs, nothing applied twice",
        not gaps and not reading.errors and not worker_errors,
        f"{sum(sizes.values())} transactions in {len(marks)} partitions{split}"
        if not (gaps or reading.errors or worker_errors)
        else f"{gaps[:3]} {reading.errors[:3]} {worker_errors[:3]}",
    )


def _format_summary(summary: Mapping[int, tuple[int, int]]) -> str:
    return ", ".join(f"p{pid} {mark}/{crc:08x}" for pid, (mark, crc) in sorted(summary.items()))


def compare_readings(name: str, first: LogReading, second: LogReading) -> ChaosCheck:
    """Two readings of the same log agree on every partition's mark and checksum."""
    a, b = first.summary(), second.summary()
    return ChaosCheck(
        name,
        a == b and not second.errors and not second.bad_payloads,
        _format_summary(b) if a == b else f"before {_format_summary(a)}; now {_format_summary(b)}",
    )


def lock_failure_total(workers: Sequence[WorkerResult]) -> int:
    """Lock failures retried by every client together (information, not a check)."""
    return sum(w.lock_failures for w in workers)


def failure_kinds(workers: Sequence[WorkerResult]) -> Counter[str]:
    """How many submissions failed, by exception type (information, not a check)."""
    return Counter(failure_kind(error) for w in workers for _, error in w.failed)
