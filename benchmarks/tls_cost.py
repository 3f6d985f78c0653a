"""What mutual TLS costs a producer: ``waltz perf producer --local``, secure and plaintext, alternated.

A local cluster is secure by default (mutual TLS with role certificates on every port, ZooKeeper
credentials per role; docs/design/overview.md, "Roles"); ``--insecure`` is the explicit opt-out.
This runs the same producer load against a fresh local cluster of each kind, alternated
(secure, plaintext, secure, plaintext, ...) so that the VM's slow and fast spells fall on both,
and reports per pair and as medians: transactions/s, submit-to-commit latency (p50, p99) and
CPU per transaction (client, servers, storage nodes, all).

    .venv/bin/python -m benchmarks.tls_cost --rounds 3 --transactions 60000 --partitions 1 --clients 1

Writes the runs as JSON with ``--out``. Exits with 1 when a run fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODES = ("secure", "insecure")


def run_once(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One ``waltz perf producer --local --json`` run; its summary plus the mode and wall time."""
    command = [
        sys.executable,
        "-m",
        "waltz",
        "perf",
        "producer",
        "--local",
        f"--{mode}",
        "--servers",
        str(args.servers),
        "--partitions",
        str(args.partitions),
        "--in-flight",
        str(args.in_flight),
        "--lock-pool-size",
        str(args.lock_pool_size),
        "--clients",
        str(args.clients),
        "-n",
        str(args.transactions),
        "--size",
        str(args.size),
        "--json",
    ]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(done.stdout)
    summary["mode"] = mode
    summary["wall_seconds"] = round(time.monotonic() - started, 2)
    return summary


def figures(summary: dict[str, Any]) -> dict[str, float]:
    """The figures compared: throughput, latency percentiles, CPU per transaction by role."""
    cpu = summary.get("cpu_us_per_transaction", {})
    return {
        "tx/s": float(summary["transactions_per_second"]),
        "p50 ms": float(summary["latency_ms"]["p50"]),
        "p99 ms": float(summary["latency_ms"]["p99"]),
        "client µs": float(cpu.get("client", 0.0)),
        "servers µs": sum(float(v) for k, v in cpu.items() if k.startswith("server")),
        "storage µs": sum(float(v) for k, v in cpu.items() if k.startswith("storage")),
        "all µs": sum(float(v) for v in cpu.values()),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the pairs, print each and the medians; 0, or 1 when a run failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs (secure, plaintext)")
    parser.add_argument("--transactions", type=int, default=60000, help="transactions per client")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--in-flight", type=int, default=200, help="transactions in flight per client")
    parser.add_argument("--lock-pool-size", type=int, default=1000, help="one write lock drawn from N")
    parser.add_argument("--size", type=int, default=200, help="payload bytes")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run")
    parser.add_argument("--out", type=Path, help="write the runs here as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.rounds > 20:
        parser.error("--rounds must be 1 to 20")
    runs: list[dict[str, Any]] = []
    try:
        for round_number in range(1, args.rounds + 1):
            pair = {}
            for mode in MODES:
                summary = run_once(mode, args)
                runs.append(summary)
                pair[mode] = figures(summary)
            secure, plain = pair["secure"], pair["insecure"]
            print(
                f"pair {round_number}: "
                + ", ".join(
                    f"{name} {secure[name]:,.1f} / {plain[name]:,.1f}"
                    + (f" ({secure[name] / plain[name]:.2f}x)" if plain[name] else "")
                    for name in secure
                ),
                flush=True,
            )
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("medians (secure / plaintext, ratio):")
    for name in figures(runs[0]):
        values = {m: statistics.median(figures(r)[name] for r in runs if r["mode"] == m) for m in MODES}
        ratio = values["secure"] / values["insecure"] if values["insecure"] else float("nan")
        print(f"  {name:12} {values['secure']:>12,.1f} {values['insecure']:>12,.1f}  {ratio:.2f}x")
    if args.out is not None:
        settings = {k: v for k, v in vars(args).items() if k != "out"}
        args.out.write_text(json.dumps({"settings": settings, "runs": runs}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
