"""Reading an archived range with the ``waltz`` data source: from the archive's chunks vs. from the
storage nodes' segments (prints figures; asserts nothing about timings).

docs/design/spark.md "Archived ranges" reads a range the archive holds from its chunks even while
the replicas still hold it. Starts a LocalCluster (its own ZooKeeper, 3 storage nodes, 1 server,
1 partition), commits ``--records`` records of ``--size`` data bytes through the server's admin
append, archives them (chunks of ``--chunk-transactions``), then ``--rounds`` times reads the
archived range through the data source's reader in this process (the plan on the driver, then
every planned range as a task reads it, to Arrow batches; no Spark job), once with the archive
(pyarrow, every chunk check) and once with ``archive=off`` (the admin ports, each record's CRC
checked). Prints each read's wall time and records/s, then the medians.

    .venv/bin/python -m benchmarks.archived_reads                      # 200,000 records of 200 bytes
    .venv/bin/python -m benchmarks.archived_reads --records 20000 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.archive_throughput import commit
from waltz.archive.archiver import Archiver, ChunkPolicy
from waltz.local.cluster import LocalCluster
from waltz.local.options import SecurityOptions
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import connect_zookeeper
from waltz.spark.archived import ArchivedRange
from waltz.spark.source import WaltzLogReader

#: The protocol's figures, comparable with the earlier runs: plaintext, on purpose (what TLS
#: costs: benchmarks/tls_cost.py; decision 0065).
PLAINTEXT = SecurityOptions.plaintext()


def read_range(cluster: LocalCluster, last: int, archive: str | None) -> dict[str, Any]:
    """Read transactions 0..last of partition 0 through the data source's reader; time it."""
    options = {
        "zookeeper": cluster.zookeeper_connect_string,
        "cluster_root": cluster.root,
        "to_transaction_id": str(last),
    }
    if archive is not None:
        options["archive"] = archive
    started = time.monotonic()
    reader = WaltzLogReader(options)
    ranges = list(reader.partitions())
    rows = sum(batch.num_rows for planned in ranges for batch in reader.read(planned))
    wall = time.monotonic() - started
    if rows != last + 1:
        raise RuntimeError(f"read {rows} rows, expected {last + 1}")
    return {
        "from": "archive" if archive is None else "segments",
        "ranges": len(ranges),
        "archived_ranges": sum(isinstance(r, ArchivedRange) for r in ranges),
        "wall_s": round(wall, 2),
        "records_per_s": round(rows / wall),
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
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="waltz-bench-archived-reads-") as tmp,
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
            started = time.monotonic()
            (result,) = Archiver(
                ClusterZk(client, cluster.root), str(Path(tmp) / "archive"), policy=policy
            ).run()
        finally:
            client.stop()
            client.close()
        if result.error is not None or result.archived_through < 0:
            raise RuntimeError(f"the archive is incomplete: {result}")
        last = result.archived_through
        print(f"archived 0..{last} in {time.monotonic() - started:.1f}s", flush=True)
        for number in range(args.rounds):
            for archive in (None, "off"):
                row = read_range(cluster, last, archive)
                rows.append(row)
                print(f"round {number + 1}: {json.dumps(row)}", flush=True)
    medians = {
        source: {
            key: statistics.median(r[key] for r in rows if r["from"] == source)
            for key in ("wall_s", "records_per_s")
        }
        for source in ("archive", "segments")
    }
    print(f"medians of {args.rounds} rounds: {json.dumps(medians)}")
    if args.json_output:
        Path(args.json_output).write_text(
            json.dumps({"arguments": vars(args), "reads": rows, "medians": medians}, indent=2) + "\n"
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
