"""The Spark decoding step with and without upcasting, row-wise and as a column expression (prints
figures; asserts nothing about timings).

Measures the choice of docs/decisions/0054-upcasting-in-the-decoding-step.md: where the Spark
rebuild upcasts old row changes (docs/design/sql.md "Schema versions and upcasting"). Writes a
log of ``--transactions`` change-sets of five updates each, every one of schema version 1 of an
entity whose model is at version 2 (an attribute renamed), to a Parquet file with the ``waltz``
source's columns, then times, alternated for ``--rounds`` rounds, the decode of the whole log
(``decode_changes``) followed by a sum over the renamed attribute:

- ``none``: decoded without upcasting (the renamed attribute is missing: the baseline cost);
- ``rowwise``: upcast in the decoding UDF by the live apply's own code (what the rebuild does);
- ``vectorised``: decoded without upcasting, then the rename as a Spark expression on the values
  map (``transform_keys``).

    .venv/bin/python -m benchmarks.upcast_decode                 # 200,000 transactions, 1,000,000 changes
    .venv/bin/python -m benchmarks.upcast_decode --transactions 20000 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from waltz.jdbc_style import CHANGE_SET_HEADER, ChangeSet, Operation, RenameAttribute, RowChange
from waltz.jdbc_style.upcasting import SchemaChain, SchemaChains

KINDS = ("none", "rowwise", "vectorised")


def write_log(path: Path, transactions: int) -> None:
    """A Parquet log of ``transactions`` change-sets of five version-1 updates of ``acct`` each.

    Args:
        path: the file to write.
        transactions: how many change-sets.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = [
        ChangeSet(
            [
                RowChange(Operation.UPDATE, "acct", {"id": i}, {"id": i, "value": t, "owner": "x"})
                for i in range(t * 5 % 5000, t * 5 % 5000 + 5)
            ]
        ).encode()
        for t in range(transactions)
    ]
    table = pa.table(
        {
            "partition_id": pa.array([0] * transactions, pa.int32()),
            "transaction_id": pa.array(range(transactions), pa.int64()),
            "header": pa.array([CHANGE_SET_HEADER] * transactions, pa.int32()),
            "data": pa.array(data, pa.binary()),
        }
    )
    pq.write_table(table, path)


def timed(spark: Any, log: Any, kind: str, chains: SchemaChains) -> float:
    """Seconds to decode the log one way and sum the renamed attribute's lengths.

    Args:
        spark: the Spark session.
        log: the log DataFrame.
        kind: one of :data:`KINDS`.
        chains: the chains that rename ``value`` to ``amount``.

    Returns:
        The wall time of the job.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from waltz.spark.decoders import decode_changes

    if kind == "rowwise":
        changes = decode_changes(log, None, chains)
    else:
        changes = decode_changes(log)
        if kind == "vectorised":
            renamed = F.transform_keys(
                "values", lambda k, v: F.when(k == "value", F.lit("amount")).otherwise(k)
            )
            changes = changes.withColumn(
                "values", F.when(F.col("entity") == "acct", renamed).otherwise(F.col("values"))
            )
    started = time.monotonic()
    changes.select(F.sum(F.length(F.col("values").getItem("amount")))).collect()
    return time.monotonic() - started


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--transactions", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", dest="json_output", help="write the figures to this file as JSON")
    args = parser.parse_args()
    from waltz.spark.session import spark_session

    chains = SchemaChains([SchemaChain("acct", 2, [RenameAttribute(1, "value", "amount")])])
    with tempfile.TemporaryDirectory(prefix="waltz-bench-upcast-") as tmp:
        path = Path(tmp) / "log.parquet"
        write_log(path, args.transactions)
        spark = spark_session(args.master, app_name="waltz-bench-upcast", shuffle_partitions=2)
        spark.sparkContext.setLogLevel("ERROR")
        log = spark.read.parquet(str(path)).repartition(2)
        timed(spark, log, "none", chains)  # warm-up
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for round_number in range(args.rounds):
            order = KINDS if round_number % 2 == 0 else KINDS[::-1]
            for kind in order:
                times[kind].append(timed(spark, log, kind, chains))
            print("round", round_number + 1, {k: round(v[-1], 2) for k, v in times.items()}, flush=True)
        spark.stop()
    changes = args.transactions * 5
    figures: dict[str, Any] = {"transactions": args.transactions, "changes": changes, "cpus": os.cpu_count()}
    for kind in KINDS:
        median = statistics.median(times[kind])
        figures[kind] = {"seconds": [round(t, 2) for t in times[kind]], "median": round(median, 2)}
        print(f"{kind}: median {median:.1f}s ({changes / median:,.0f} row changes/s)")
    for kind in ("rowwise", "vectorised"):
        ratios = [t / n for t, n in zip(times[kind], times["none"], strict=True)]
        figures[kind]["median_ratio_to_none"] = round(statistics.median(ratios), 3)
        print(f"{kind} / none, round by round: median {statistics.median(ratios):.2f}")
    if args.json_output:
        Path(args.json_output).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
