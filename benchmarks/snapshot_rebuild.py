"""A rebuild from a snapshot against the full rebuild, on the same log, alternated (prints figures;
asserts nothing about timings).

The snapshot of docs/design/spark.md ("Snapshots"): a rebuild that starts from a snapshot reads only
the log after the snapshot's marks. Starts a LocalCluster (its own ZooKeeper, 3 storage nodes, 1
server, ``--partitions`` partitions) and writes the ledger log of :mod:`benchmarks.spark_rebuild`
(``--transactions`` change-sets: one ``open`` per customer, then deposits). Then, each into a fresh
PostgreSQL database on the server of ``--db`` (dropped at the end):

1. a rebuild up to the marks at ``--snapshot-at`` of every partition's log (0.9: 900,000 of
   1,000,000), and a snapshot of that database (``waltz snapshot create``);
2. ``--rounds`` rounds of, alternated: the full rebuild of the whole log, and the rebuild from the
   snapshot; each round's two times and their ratio are printed, then the medians;
3. a check that the two databases of the last round hold the same ledger rows (a mismatch is
   reported and exits 1).

    .venv/bin/python -m benchmarks.snapshot_rebuild                      # 1,000,000, snapshot at 90 %
    .venv/bin/python -m benchmarks.snapshot_rebuild --transactions 100000 --rounds 1
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

from benchmarks.databases import fresh_database
from benchmarks.spark_rebuild import CLUSTER_NAME, append_all, generate, table_rows
from waltz.local.cluster import LocalCluster
from waltz.local.options import SecurityOptions

#: The protocol's figures, comparable with the earlier runs: plaintext, on purpose (what TLS
#: costs: benchmarks/tls_cost.py; decision 0065).
PLAINTEXT = SecurityOptions.plaintext()


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--transactions", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--snapshot-at", type=float, default=0.9, help="share of each partition's log")
    parser.add_argument("--rounds", type=int, default=2, help="alternated pairs of rebuilds")
    parser.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--append-batch", type=int, default=500)
    parser.add_argument("--json", dest="json_output", help="write the figures to this file as JSON")
    parser.add_argument("--steps", action="store_true", help="print each rebuild step with its time")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from waltz.spark.rebuild import LogSource, rebuild
    from waltz.spark.session import spark_session
    from waltz.spark.snapshot import write_snapshot
    from waltz_examples.ledger.views import VIEWS

    started_at = time.monotonic()

    def step(line: str) -> None:
        if args.steps:
            print(f"  [{time.monotonic() - started_at:8.1f}s] {line}", flush=True)

    with (
        tempfile.TemporaryDirectory(prefix="waltz-bench-snapshot-") as tmp,
        LocalCluster(
            security=PLAINTEXT, storages=3, servers=1, partitions=args.partitions, work_dir=Path(tmp)
        ) as cluster,
    ):
        cluster.wait_ready(120)
        logs = generate(args.partitions, args.transactions, args.customers)
        started = time.monotonic()
        asyncio.run(append_all(cluster.owner(0), logs, args.append_batch))
        print(
            f"log: {args.transactions:,} transactions in {args.partitions} partitions, written in "
            f"{time.monotonic() - started:.1f}s",
            flush=True,
        )
        cut = {pid: int(len(items) * args.snapshot_at) - 1 for pid, items in logs.items()}
        source = LogSource(zookeeper=cluster.zookeeper_connect_string, cluster_root=cluster.root)
        spark = spark_session(args.master, app_name="waltz-bench-snapshot")
        spark.sparkContext.setLogLevel("ERROR")
        snapshot = str(Path(tmp) / "snapshot")
        with fresh_database(args.db) as base_db:
            base = rebuild(spark, VIEWS, source, base_db, cluster_name=CLUSTER_NAME, up_to=cut)
            started = time.monotonic()
            manifest = write_snapshot(VIEWS, base_db, snapshot, cluster_name=CLUSTER_NAME)
            snapshot_seconds = time.monotonic() - started
        rows = sum(t.rows for t in manifest.tables)
        print(
            f"snapshot at {sum(m + 1 for m in base.marks.values()):,} transactions: {rows:,} rows, "
            f"written in {snapshot_seconds:.1f}s",
            flush=True,
        )
        full_times: list[float] = []
        from_snapshot_times: list[float] = []
        same = False
        for round_number in range(1, args.rounds + 1):
            with fresh_database(args.db) as full_db, fresh_database(args.db) as snap_db:
                full = rebuild(spark, VIEWS, source, full_db, cluster_name=CLUSTER_NAME, progress=step)
                from_snapshot = rebuild(
                    spark, VIEWS, source, snap_db, cluster_name=CLUSTER_NAME, snapshot=snapshot, progress=step
                )
                full_times.append(full.seconds)
                from_snapshot_times.append(from_snapshot.seconds)
                print(
                    f"round {round_number}: full rebuild {full.seconds:.1f}s, from the snapshot "
                    f"{from_snapshot.seconds:.1f}s, ratio {from_snapshot.seconds / full.seconds:.1%}",
                    flush=True,
                )
                if round_number == args.rounds:
                    same = table_rows(full_db) == table_rows(snap_db) and full.marks == from_snapshot.marks
        spark.stop()
    ratios = [s / f for s, f in zip(from_snapshot_times, full_times, strict=True)]
    figures = {
        "transactions": args.transactions,
        "partitions": args.partitions,
        "snapshot_at": args.snapshot_at,
        "snapshot_rows": rows,
        "snapshot_seconds": round(snapshot_seconds, 2),
        "full_seconds": [round(t, 2) for t in full_times],
        "from_snapshot_seconds": [round(t, 2) for t in from_snapshot_times],
        "median_ratio": round(statistics.median(ratios), 4),
        "same_rows": same,
    }
    print(
        f"median: full {statistics.median(full_times):.1f}s, from the snapshot "
        f"{statistics.median(from_snapshot_times):.1f}s, ratio {statistics.median(ratios):.1%}; "
        f"both databases hold the same ledger rows and marks: {same}"
    )
    if args.json_output:
        Path(args.json_output).write_text(json.dumps(figures, indent=2) + "\n")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
