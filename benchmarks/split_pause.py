"""Throughput before and after a live split, and the longest write pause of a key during the
handover (prints figures and writes JSON; asserts nothing about timings).

The run is ``waltz perf split`` (:mod:`waltz.perf.split`, whose docstring says what it measures),
on a plaintext cluster as the other protocol benchmarks (decision 0065); upstream's validate
failing exits 1.

    .venv/bin/python -m benchmarks.split_pause                      # 2 -> 4, 4 producers
    .venv/bin/python -m benchmarks.split_pause --before 10 --after 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from waltz.perf.split import SplitPerfSettings, run_split


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=2, help="partitions at creation")
    parser.add_argument("--to", type=int, default=4, help="partitions after the split")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=8, help="bumps each producer keeps in flight")
    parser.add_argument("--before", type=float, default=15.0, help="seconds before the split")
    parser.add_argument("--after", type=float, default=15.0, help="seconds after it")
    parser.add_argument("--storages", type=int, default=3)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--json", dest="json_output", help="write the figures to this file as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    settings = SplitPerfSettings(
        partitions=args.partitions,
        to=args.to,
        producers=args.producers,
        keys=args.keys,
        in_flight=args.in_flight,
        before=args.before,
        after=args.after,
        storages=args.storages,
        servers=args.servers,
        secure=False,
    )
    figures = run_split(settings).summary()
    print(json.dumps(figures, indent=2))
    if args.json_output:
        Path(args.json_output).write_text(json.dumps(figures, indent=2) + "\n")
    if not figures["validate"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
