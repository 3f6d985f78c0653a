"""A long run with the archiver following and retention on: the storage nodes' data directories
stay under a bound stated in advance, and a fresh client still reads the whole log from 0 (exits 1
when either fails; prints figures).

docs/design/archive.md, "Retention on the storage nodes" and "Reads below the local start".
Starts a LocalCluster (its own ZooKeeper, 3 storage nodes rolling segments of
``--segment-bytes``, retention ``archived`` keeping ``--keep-segments`` newer segments, 1 server,
1 partition) and ``waltz archive run --follow`` as a process of its own (chunks of
``--chunk-transactions``, sealed after 2 quiet seconds). One client writes ``--transactions``
transactions (``--in-flight`` at a time, no locks), each one's data its own sequence number
(``retention:<12 digits>``); it waits while the archive lags more than ``--max-lag`` committed
transactions behind, as an operator's alert on the archiver's lag would stop the load: retention
can only delete what is archived, so the bound holds for a lag the archiver keeps up with.

The bound, printed before the run: ``(keep + 2 + lag segments) x (segment bytes + one record +
its index) + slack`` per node, where ``lag segments`` is how many segments ``--max-lag`` records
fill (the keep segments, the active one, one sealed segment waiting for the next retention check,
and the unarchived lag). A thread samples every storage node's data directory (every file's size)
every ``--sample-interval`` seconds during the run and after it; any sample past the bound fails
the run. At the end a fresh client mounts partition 0 from transaction 0 and applies every
transaction (below the replicas' local start the server reads the archive), fetching its data
(every datum checked against its CRC-32 by the client); each record's data must name a sequence
number not seen before, and every sequence number must be read exactly once.

    .venv/bin/python -m benchmarks.retention_run                          # 2,000,000 transactions
    .venv/bin/python -m benchmarks.retention_run --transactions 100000 --json /tmp/retention.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waltz.archive.layout import ArchiveFiles
from waltz.archive.manifests import read_partition_manifest
from waltz.client import Transaction, TransactionBuilder, TransactionContext, WaltzClient, WaltzClientConfig
from waltz.client.callbacks import WaltzClientCallbacks
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions, SecurityOptions
from waltz.protocol.storage_client import StorageAdminClient

#: Bytes of a segment record besides its data (docs/format.md "Transaction record (40 bytes + data)").
RECORD_OVERHEAD = 40
#: Index bytes per record (one 8-byte offset), and the data and index files' 128-byte headers:
#: docs/format.md "Segment index file <first transaction ID>.idx".
INDEX_PER_RECORD = 8
SEGMENT_HEADERS = 256
#: Files besides segments in a node's data directory (control file, retention.json, the
#: partition's own small files, a segment header each), with room to spare.
SLACK_BYTES = 1 << 20
DATA_PREFIX = b"retention:"

#: The protocol's figures, comparable with the earlier runs: plaintext, on purpose (what TLS
#: costs: benchmarks/tls_cost.py; decision 0065).
PLAINTEXT = SecurityOptions.plaintext()


def data_of(sequence: int) -> bytes:
    """The data written for sequence number ``sequence``."""
    return DATA_PREFIX + b"%012d" % sequence


def sequence_of(data: bytes) -> int:
    """The sequence number a record's data names; ValueError if it is not data this run wrote."""
    if len(data) != len(DATA_PREFIX) + 12 or not data.startswith(DATA_PREFIX):
        raise ValueError(f"data {data[:40]!r} is not a retention run's record")
    return int(data[len(DATA_PREFIX) :])


def directory_bytes(directory: Path) -> int:
    """The bytes of every file under ``directory`` (files removed while walking count 0)."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


@dataclass
class Sampler:
    """Samples every storage node's data directory in a thread; remembers each node's maximum."""

    directories: dict[str, Path]
    bound: int
    interval: float
    maxima: dict[str, int] = field(default_factory=dict)
    over: list[str] = field(default_factory=list)
    samples: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        """Measure every directory once; record the maxima and any passing of the bound."""
        for name, directory in self.directories.items():
            size = directory_bytes(directory)
            self.maxima[name] = max(self.maxima.get(name, 0), size)
            if size > self.bound and len(self.over) < 20:
                self.over.append(f"{name}: {size:,} bytes > bound {self.bound:,} at {time.strftime('%X')}")
        self.samples += 1

    def run(self) -> None:
        """Sample until stopped."""
        while not self.stop.wait(self.interval):
            self.sample()


class Write(TransactionContext):
    """One transaction whose data is its sequence number; tells the writer when it ends."""

    def __init__(self, sequence: int, done: threading.Semaphore, failures: list[str]) -> None:
        super().__init__()
        self.sequence = sequence
        self._done = done
        self._failures = failures

    def partition_id(self, num_partitions: int) -> int:
        """Partition 0."""
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        """Append the sequence number."""
        builder.set_raw_data(data_of(self.sequence))
        return True

    def on_completion(self, result: bool) -> None:
        """Free a slot."""
        self._done.release()

    def on_exception(self, exception: BaseException) -> None:
        """Record the failure; free a slot."""
        self._failures.append(f"sequence {self.sequence}: {exception!r}")
        self._done.release()


class Writer(WaltzClientCallbacks):
    """The writing client's callbacks: it applies nothing (it starts at the log's end)."""

    def __init__(self) -> None:
        self._marks: dict[int, int] = {}

    def get_client_high_water_mark(self, partition_id: int) -> int:
        """The last applied transaction (-1 at the start)."""
        return self._marks.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        """Move the mark (the writer does not read the data)."""
        self._marks[transaction.partition_id] = transaction.transaction_id

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        """Log it."""
        logging.getLogger(__name__).error("writer: %s at %s: %r", partition_id, transaction_id, exception)


class Reader(WaltzClientCallbacks):
    """A fresh client's callbacks from transaction 0: checks and counts every record's data."""

    prefetch_transaction_data = True

    def __init__(self, expected: int) -> None:
        self.mark = -1
        self.seen = bytearray(expected)
        self.read = 0
        self.errors: list[str] = []
        self.started: float | None = None
        self.ended = 0.0

    def get_client_high_water_mark(self, partition_id: int) -> int:
        """The last applied transaction."""
        return self.mark

    def apply_transaction(self, transaction: Transaction) -> None:
        """Check the transaction follows the last one and its data names a sequence not yet seen."""
        if self.started is None:
            self.started = time.monotonic()
        tid = transaction.transaction_id
        if tid != self.mark + 1 and len(self.errors) < 20:
            self.errors.append(f"transaction {tid} applied after {self.mark}")
        data = transaction.get_raw_data()
        try:
            sequence = sequence_of(data)
            if self.seen[sequence]:
                raise ValueError(f"sequence {sequence} read twice")
            self.seen[sequence] = 1
        except (ValueError, IndexError) as exc:
            if len(self.errors) < 20:
                self.errors.append(f"transaction {tid}: {exc}")
        self.read += 1
        self.mark = tid
        self.ended = time.monotonic()

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        """Record it (a feed error is retried by the client; the run still needs every record)."""
        logging.getLogger(__name__).warning("reader: %s at %s: %r", partition_id, transaction_id, exception)


def local_starts(cluster: LocalCluster) -> dict[str, int]:
    """Each storage node's local start of partition 0 (its first transaction on disk)."""

    async def run() -> dict[str, int]:
        starts = {}
        for index, node in enumerate(cluster.storages):
            async with StorageAdminClient(node.admin_address, cluster.cluster_key, 1) as admin:
                (found,) = (await admin.partition_status(0)).partitions
                starts[f"storage-{index}"] = found.local_start
        return starts

    return asyncio.run(run())


def archived_through(archive: Path) -> int:
    """Partition 0's archived-through in the archive's manifest (-1 before the first chunk)."""
    if not (archive / "archive.json").exists():
        return -1
    return read_partition_manifest(ArchiveFiles.open(str(archive)), 0).archived_through


def write(
    config: WaltzClientConfig, args: argparse.Namespace, archive: Path
) -> tuple[float, float, list[str]]:
    """Write the transactions with back-pressure on the archive's lag; (seconds, seconds waited, failures)."""
    failures: list[str] = []
    slots = threading.Semaphore(args.in_flight)
    waited = 0.0
    started = time.monotonic()
    with WaltzClient(Writer(), config) as client:
        client.wait_mounted(120, [0])
        for sequence in range(args.transactions):
            if sequence % 1000 == 0:
                lag_started = time.monotonic()
                while sequence - args.in_flight - archived_through(archive) > args.max_lag:
                    if time.monotonic() - lag_started > args.stall_timeout:
                        raise RuntimeError(
                            f"the archive stayed more than {args.max_lag:,} transactions behind the "
                            f"writer for {args.stall_timeout:g}s "
                            f"(archived through {archived_through(archive)})"
                        )
                    time.sleep(0.2)  # a poll of the archive's manifest, bounded by the stall timeout
                waited += time.monotonic() - lag_started
                if sequence % 100_000 == 0:
                    print(f"  wrote {sequence:,}; archived through {archived_through(archive):,}", flush=True)
            if not slots.acquire(timeout=args.stall_timeout):
                raise RuntimeError(f"no transaction completed in {args.stall_timeout:g}s (at {sequence:,})")
            client.execute(Write(sequence, slots, failures))
        client.flush(args.stall_timeout)
    return time.monotonic() - started, waited, failures


def read_all(config: WaltzClientConfig, expected: int, timeout: float) -> Reader:
    """Mount a fresh client from transaction 0 and read until it applied ``expected`` transactions."""
    reader = Reader(expected)
    deadline = time.monotonic() + timeout
    with WaltzClient(reader, config):
        while reader.mark < expected - 1 and time.monotonic() < deadline:
            time.sleep(0.5)  # progress poll, bounded by the read's deadline
    return reader


def start_archiver(
    cluster: LocalCluster, archive: Path, args: argparse.Namespace, log: Path
) -> subprocess.Popen[bytes]:
    """``waltz archive run --follow`` as a process of its own, its output to ``log``."""
    command = [
        sys.executable, "-m", "waltz", "archive", "run", "--to", str(archive), "--follow",
        "--chunk-transactions", str(args.chunk_transactions), "--seal-after", "2", "--interval", "1",
        "--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root, "--log-level", "WARNING",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **cluster.zookeeper_env()}
        )


def main() -> None:
    """Parse the command line (``--help``), run, print the figures; exit 1 when a check fails."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--transactions", type=int, default=2_000_000)
    parser.add_argument("--segment-bytes", type=int, default=1 << 20)
    parser.add_argument("--keep-segments", type=int, default=3)
    parser.add_argument("--chunk-transactions", type=int, default=20_000)
    parser.add_argument("--max-lag", type=int, default=60_000, help="committed, not archived transactions")
    parser.add_argument("--in-flight", type=int, default=400)
    parser.add_argument("--sample-interval", type=float, default=0.5)
    parser.add_argument("--stall-timeout", type=float, default=600.0)
    parser.add_argument("--read-timeout", type=float, default=7200.0)
    parser.add_argument("--json", dest="json_output", help="write the figures to this file as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    record = RECORD_OVERHEAD + len(data_of(0))
    per_segment = (
        args.segment_bytes + record + (args.segment_bytes // record + 1) * INDEX_PER_RECORD + SEGMENT_HEADERS
    )
    lag_segments = -(-args.max_lag * record // args.segment_bytes)
    bound = (args.keep_segments + 2 + lag_segments) * per_segment + SLACK_BYTES
    print(
        f"bound per storage node's data directory: {bound:,} bytes = ({args.keep_segments} kept + 1 active "
        f"+ 1 awaiting the retention check + {lag_segments} of archive lag <= {args.max_lag:,} records) "
        f"x {per_segment:,} bytes + {SLACK_BYTES:,} slack; {args.transactions:,} records would take "
        f"{args.transactions * record:,} bytes",
        flush=True,
    )
    storage_env = {
        "WALTZ_STORAGE_SEGMENT_SIZE_THRESHOLD": str(args.segment_bytes),
        "WALTZ_STORAGE_RETENTION_POLICY": "archived",
        "WALTZ_STORAGE_RETENTION_KEEP_SEGMENTS": str(args.keep_segments),
        "WALTZ_STORAGE_RETENTION_KEEP_SECONDS": "0",
        "WALTZ_STORAGE_RETENTION_CHECK_INTERVAL": "1",
    }
    figures: dict[str, Any] = {"arguments": vars(args), "bound_bytes": bound}
    failed: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="waltz-bench-retention-") as tmp,
        LocalCluster(
            security=PLAINTEXT,
            storages=3,
            servers=1,
            partitions=1,
            work_dir=Path(tmp) / "cluster",
            processes=ProcessOptions(storage_env=storage_env),
        ) as cluster,
    ):
        cluster.wait_ready(120)
        config = WaltzClientConfig(
            zookeeper_connect_string=cluster.zookeeper_connect_string, cluster_root=cluster.root
        )
        archive = Path(tmp) / "archive"
        sampler = Sampler(
            {f"storage-{i}": node.directory for i, node in enumerate(cluster.storages)},
            bound,
            args.sample_interval,
        )
        thread = threading.Thread(target=sampler.run, name="sampler", daemon=True)
        thread.start()
        archiver = start_archiver(cluster, archive, args, Path(tmp) / "archiver.log")
        try:
            took, waited, failures = write(config, args, archive)
            failed += failures[:20]
            figures.update(
                write_s=round(took, 1),
                tx_per_s=round(args.transactions / took),
                writer_waited_for_archive_s=round(waited, 1),
            )
            print(
                f"wrote {args.transactions:,} in {took:.1f}s ({args.transactions / took:,.0f} tx/s)",
                flush=True,
            )
            figures["local_starts_at_read"] = local_starts(cluster)
            reader = read_all(config, args.transactions, args.read_timeout)
            read_s = reader.ended - (reader.started or reader.ended)
            figures.update(
                records_read=reader.read,
                sequences_read=sum(reader.seen),
                read_s=round(read_s, 1),
                read_per_s=round(reader.read / read_s) if read_s > 0 else None,
                archived_through_at_read=archived_through(archive),
            )
            failed += reader.errors
            if reader.read != args.transactions or sum(reader.seen) != args.transactions:
                failed.append(
                    f"read {reader.read:,} records, {sum(reader.seen):,} sequences; "
                    f"expected {args.transactions:,}"
                )
        finally:
            sampler.stop.set()
            thread.join(10)
            sampler.sample()
            archiver.send_signal(signal.SIGTERM)
            try:
                archiver.wait(60)
            except subprocess.TimeoutExpired:
                archiver.kill()
                archiver.wait(10)
            archiver_log = (Path(tmp) / "archiver.log").read_text(errors="replace")
        figures.update(
            max_dir_bytes=sampler.maxima,
            final_dir_bytes={name: directory_bytes(d) for name, d in sampler.directories.items()},
            samples=sampler.samples,
        )
    failed += sampler.over
    figures["failures"] = failed
    print(json.dumps(figures, indent=2))
    if args.json_output:
        Path(args.json_output).write_text(json.dumps(figures, indent=2) + "\n")
    if failed:
        print("archiver log (tail):\n" + "\n".join(archiver_log.splitlines()[-20:]), file=sys.stderr)
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
