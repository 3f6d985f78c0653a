"""The archiver's throughput and CPU per archived record (prints figures; asserts nothing about
timings).

docs/decisions/0055-the-archiver-a-process-of-its-own.md weighs what archiving costs against what
the server spends per committed record. Starts a LocalCluster (its own ZooKeeper, 3 storage nodes,
1 server, 1 partition), commits ``--records`` records of ``--size`` data bytes through the
server's admin append, then ``--rounds`` times archives the whole partition into a fresh
directory with :class:`~waltz.archive.archiver.Archiver` in this process (chunks of
``--chunk-transactions``, read from a quorum of 2 of the 3 replicas and compared, written with
zstd, read back and checked). Each round prints its wall time, records/s, MB/s of data, the
archive's bytes, the CPU of this process (the archiver) and of the storage nodes (serving its
reads) per archived record; then the medians.

    .venv/bin/python -m benchmarks.archive_throughput                    # 200,000 records of 200 bytes
    .venv/bin/python -m benchmarks.archive_throughput --records 20000 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from waltz.archive.archiver import Archiver, ChunkPolicy
from waltz.local.cluster import LocalCluster
from waltz.local.options import SecurityOptions
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import connect_zookeeper
from waltz.perf.cost import process_cpu_seconds
from waltz.protocol.records import ReqId
from waltz.protocol.server_client import ServerAdminClient

#: The protocol's figures, comparable with the earlier runs: plaintext, on purpose (what TLS
#: costs: benchmarks/tls_cost.py; decision 0065).
PLAINTEXT = SecurityOptions.plaintext()


async def commit(endpoint: str, records: int, size: int, batch: int) -> None:
    """Commit ``records`` records of ``size`` bytes to partition 0, ``batch`` per append, 4 in flight;
    the data is the record's number followed by random bytes (the same on every run)."""
    pool = random.Random(7).randbytes(1 << 16)  # data that compresses about as little as real payloads

    def data(n: int) -> bytes:
        offset = n * 37 % (len(pool) - size)
        return (b"%012d" % n + pool[offset : offset + size])[:size]

    async def one(admin: ServerAdminClient, start: int) -> None:
        count = min(batch, records - start)
        items = [(ReqId(1, 1, 0, start + i), 0, data(start + i)) for i in range(count)]
        outcomes = await admin.append(0, items)
        if not all(isinstance(o, int) for o in outcomes):
            raise RuntimeError(f"append refused: {outcomes[:3]}")

    async with ServerAdminClient(endpoint, timeout=120) as admin:
        starts = list(range(0, records, batch))
        for i in range(0, len(starts), 4):
            await asyncio.gather(*(one(admin, s) for s in starts[i : i + 4]))


def storage_cpu(cluster: LocalCluster) -> float:
    """CPU seconds the storage nodes have spent so far."""
    return sum(process_cpu_seconds(pid) for name, pid in cluster.pids().items() if name.startswith("storage"))


def archive_round(
    cluster: LocalCluster, zk: ClusterZk, location: Path, policy: ChunkPolicy
) -> dict[str, Any]:
    """Archive partition 0 into ``location`` (a fresh archive) and measure it."""
    if zk.zk.exists(zk.paths.archive):
        zk.zk.delete(zk.paths.archive)
    archiver = Archiver(zk, str(location), policy=policy, partitions=[0])
    nodes_before, cpu_before, started = storage_cpu(cluster), time.process_time(), time.monotonic()
    (result,) = archiver.run()
    wall = time.monotonic() - started
    cpu, nodes = time.process_time() - cpu_before, storage_cpu(cluster) - nodes_before
    if result.error is not None or result.records != result.high_water_mark + 1:
        raise RuntimeError(f"the archive is incomplete: {result}")
    return {
        "records": result.records,
        "wall_s": round(wall, 2),
        "records_per_s": round(result.records / wall),
        "archive_bytes": result.size_bytes,
        "archiver_cpu_s": round(cpu, 2),
        "archiver_cpu_us_per_record": round(cpu / result.records * 1e6, 1),
        "storage_cpu_us_per_record": round(nodes / result.records * 1e6, 1),
    }


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200, help="data bytes per record")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-transactions", type=int, default=100_000)
    parser.add_argument("--append-batch", type=int, default=500)
    parser.add_argument("--json", dest="json_output", help="write the figures to this file as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    policy = ChunkPolicy(chunk_transactions=args.chunk_transactions, seal_after=0)
    with (
        tempfile.TemporaryDirectory(prefix="waltz-bench-archive-") as tmp,
        LocalCluster(
            security=PLAINTEXT, storages=3, servers=1, partitions=1, work_dir=Path(tmp) / "cluster"
        ) as cluster,
    ):
        cluster.wait_ready(120)
        started = time.monotonic()
        asyncio.run(commit(cluster.owner(0), args.records, args.size, args.append_batch))
        took = time.monotonic() - started
        print(f"log: {args.records:,} records of {args.size} bytes, committed in {took:.1f}s")
        client = connect_zookeeper(cluster.zookeeper_connect_string, security=cluster.zookeeper_security)
        try:
            zk = ClusterZk(client, cluster.root)
            rounds = []
            for number in range(args.rounds):
                row = archive_round(cluster, zk, Path(tmp) / f"archive-{number}", policy)
                row["data_mb_per_s"] = round(args.records * args.size / row["wall_s"] / 1e6, 2)
                rounds.append(row)
                print(f"round {number + 1}: {json.dumps(row)}", flush=True)
        finally:
            client.stop()
            client.close()
    medians = {
        key: statistics.median(r[key] for r in rounds)
        for key in (
            "wall_s",
            "records_per_s",
            "data_mb_per_s",
            "archiver_cpu_us_per_record",
            "storage_cpu_us_per_record",
        )
    }
    print(f"medians of {len(rounds)} rounds: {json.dumps(medians)}")
    if args.json_output:
        Path(args.json_output).write_text(
            json.dumps({"arguments": vars(args), "rounds": rounds, "medians": medians}, indent=2) + "\n"
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
