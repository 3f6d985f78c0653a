"""Run waltz-py and its peers under the same workload, one after the other, and print one table.

The workload (``waltz.perf.loadgen``, the load generator of ``waltz perf``): 200-byte
transactions, each with one write lock drawn uniformly from a pool of 1,000, the writer's
last-seen position of that lock as the concurrency check (a conflict is retried; the check of
docs/design/locks.md, "Optimistic locking in Waltz"), closed loop with a fixed number in flight.
Systems:

- waltz-py: 1 and 4 partitions x 1 and 2 servers, 3 storage nodes, RF 3 (``bench_waltz.py``);
- eventsourcing on PostgreSQL, with a tracking-record projection into SQL (``bench_eventsourcing.py``);
- etcd, 3 nodes on loopback, Txn comparing the key's mod revision (``bench_etcd.py``);
- SmallBank on waltz-py: ``waltz perf smallbank`` with 3 ledger instances, partition-routed and
  batched, on a local cluster and a PostgreSQL database of the run's own, counted as the peers below
  count (``smallbank-waltz``, ``bench_smallbank_waltz.py``; ``--smallbank-rate`` paces it);
- SmallBank without waltz-py, the ledger example's workload (BenchBase's mix on 200 customers with
  a hotspot; its own load, not the one above): straight on PostgreSQL, an operation one transaction
  with ``SELECT ... FOR UPDATE`` in customer order (``smallbank-pg``, ``bench_smallbank_pg.py``),
  the same on a primary with two synchronous standbys in quorum started for the case (ANY 1: 2 of
  3 copies per commit, a Waltz partition's durability at RF 3; ``smallbank-pg-quorum``,
  ``bench_smallbank_pg.py --quorum``, ``pg_quorum.py``), and on eventsourcing with an aggregate per
  customer (``smallbank-es``, ``bench_smallbank_es.py``);
  ``--smallbank-processes`` x ``--smallbank-threads`` connections in a closed loop, the money
  check in the row;
- one hot row straight on PostgreSQL, the peer of ``waltz perf inventory --instances 3 --skus 1``
  (its own load too): every request reserves units of the same SKU under an idempotency key, one
  transaction with ``SELECT ... FOR UPDATE`` of the row (``hot-row-pg``, ``hot_row_pg.py``), and
  the same on the quorum server (``hot-row-pg-quorum``); ``--hot-row-processes`` x
  ``--hot-row-threads`` connections, ``--hot-row-skus`` rows; tx/s is reservations committed/s
  and the inventory checks are in the row;
- the machine: fsyncs/s, and records/s through one gRPC stream with batching (``bench_limits.py``);
- the machine's limit for this design in CPython: a skeleton of waltz-py's data path (client,
  server and 3 storage processes, raw bytes, quorum writes with fdatasync, the lock check), alone
  and with waltz-py's storage messages, its client messages, a Future per transaction or its
  client threads put back (``bench_skeleton.py``).

Each case runs in a child process of its own (own session; killed with its children after its
time limit), on 127.0.0.1 only, with free ports and temporary directories it removes. Install the
peers first with ``benchmarks/peers/setup.sh``; a case whose peer is missing is named before the
first run and skipped in every round. Run it as a module from the repository's root. Usage::

    .venv/bin/python -m benchmarks.peers.run_all --quick          # a few minutes
    .venv/bin/python -m benchmarks.peers.run_all                  # the full run
    .venv/bin/python -m benchmarks.peers.run_all --only etcd,waltz-p4-s2 --json results.json
    .venv/bin/python -m benchmarks.peers.run_all --repeat 3        # median of 3 runs per case
    .venv/bin/python -m benchmarks.peers.run_all --only smallbank-pg,smallbank-pg-quorum,smallbank-es
    .venv/bin/python -m benchmarks.peers.run_all --only smallbank-waltz,smallbank-pg,smallbank-pg-quorum \
        --transactions 60000 --repeat 3 --json sitting.json   # SmallBank's sitting of record
    .venv/bin/python -m benchmarks.peers.run_all --only smallbank-waltz --smallbank-rate 325 \
        --transactions 9750 --repeat 3     # latency at a tenth of the target (2,000 committed/s)
    .venv/bin/python -m benchmarks.peers.run_all --only hot-row-pg,hot-row-pg-quorum

Before each run the parent times an empty loop of 10 million iterations, ``python3 -c`` from
``PATH`` (``empty_loop_s`` in the row): the machine's speed at that moment, by which runs of different
sittings are compared (``benchmarks/RESULTS.md`` names spells by it). Figures are printed, never
asserted. Decisions that rest on them cite them, e.g.
docs/decisions/0001-group-commit-on-storage-nodes.md and docs/decisions/0007-store-linger.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waltz.tuning import GRPC_ENVIRONMENT


@dataclass(frozen=True)
class Sizes:
    """Transactions (or records) per case."""

    waltz: int
    etcd: int
    eventsourcing: int
    fsync: int
    fsync_batched: int
    grpc: int
    grpc_batched: int
    skeleton: int
    smallbank_pg: int
    smallbank_es: int
    hot_row_pg: int


QUICK = Sizes(
    waltz=4_000,
    etcd=4_000,
    eventsourcing=1_500,
    fsync=2_000,
    fsync_batched=50_000,
    grpc=3_000,
    grpc_batched=100_000,
    skeleton=4_000,
    smallbank_pg=2_000,
    smallbank_es=2_000,
    hot_row_pg=2_000,
)
FULL = Sizes(
    waltz=40_000,
    etcd=30_000,
    eventsourcing=8_000,
    fsync=10_000,
    fsync_batched=500_000,
    grpc=20_000,
    grpc_batched=1_000_000,
    skeleton=100_000,
    smallbank_pg=6_000,
    smallbank_es=6_000,
    hot_row_pg=3_000,
)

WALTZ_CASES = [(p, s) for s in (1, 2) for p in (1, 4)]
CASES = [f"waltz-p{p}-s{s}" for p, s in WALTZ_CASES] + [
    "eventsourcing",
    "etcd",
    "smallbank-waltz",
    "smallbank-pg",
    "smallbank-pg-quorum",
    "smallbank-es",
    "hot-row-pg",
    "hot-row-pg-quorum",
    "fsync-1",
    "fsync-100",
    "grpc-1",
    "grpc-100",
    "skeleton",
    "skeleton-store-protobuf",
    "skeleton-futures",
    "skeleton-client-protobuf",
    "skeleton-threads",
]


def run_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one case in this process.

    Args:
        name: one of :data:`CASES`.
        args: the command line's options.

    Returns:
        Its result row.

    Raises:
        ValueError: an unknown case.
    """
    from waltz.perf.loadgen import LoadSpec

    sizes = QUICK if args.quick else FULL

    def spec(n: int, in_flight: int) -> LoadSpec:
        return LoadSpec(
            args.transactions or n,
            payload_size=200,
            lock_pool_size=1000,
            max_in_flight=in_flight,
            timeout=args.case_timeout,
            seed=args.seed,
        )

    if name.startswith("waltz-"):
        from benchmarks.peers import bench_waltz

        partitions, servers = (int(part[1:]) for part in name.split("-")[1:])
        env = dict(item.split("=", 1) for item in args.waltz_env)
        return bench_waltz.run(partitions, servers, spec(sizes.waltz, args.in_flight), args.clients, env)
    if name == "eventsourcing":
        from benchmarks.peers import bench_eventsourcing

        return bench_eventsourcing.run(spec(sizes.eventsourcing, args.es_threads))
    if name == "etcd":
        from benchmarks.peers import bench_etcd

        return bench_etcd.run(spec(sizes.etcd, args.in_flight))
    if name.startswith("smallbank-"):
        from benchmarks.peers.smallbank_workload import Options

        options = Options(
            transactions=args.transactions
            or (sizes.smallbank_es if name == "smallbank-es" else sizes.smallbank_pg),
            processes=args.smallbank_processes,
            threads=args.smallbank_threads,
            accounts=args.smallbank_accounts,
            seed=args.seed,
            time_limit=args.case_timeout,
        )
        if name == "smallbank-waltz":
            from benchmarks.peers import bench_smallbank_waltz

            return bench_smallbank_waltz.run(options, args.smallbank_rate)
        if name in ("smallbank-pg", "smallbank-pg-quorum"):
            from benchmarks.peers import bench_smallbank_pg

            return bench_smallbank_pg.run(options, quorum=name == "smallbank-pg-quorum")
        from benchmarks.peers import bench_smallbank_es

        return bench_smallbank_es.run(options)
    if name.startswith("hot-row-"):
        from benchmarks.peers import hot_row_pg, hot_row_report
        from benchmarks.peers.hot_row_workers import HotRowOptions

        hot_row = HotRowOptions(
            transactions=args.transactions or sizes.hot_row_pg,
            processes=args.hot_row_processes,
            threads=args.hot_row_threads,
            skus=args.hot_row_skus,
            seed=args.seed,
            timeout=args.case_timeout,
        )
        report = hot_row_pg.run(hot_row, quorum=name == "hot-row-pg-quorum")
        return hot_row_report.peer_row(report.summary())
    if name.startswith("skeleton"):
        from benchmarks.peers import bench_skeleton

        return bench_skeleton.run(
            spec(sizes.skeleton, args.in_flight),
            store_protobuf=name == "skeleton-store-protobuf",
            client_futures=name == "skeleton-futures",
            client_protobuf=name == "skeleton-client-protobuf",
            client_threads=name == "skeleton-threads",
        )
    from benchmarks.peers import bench_limits

    if name == "fsync-1":
        return bench_limits.fsync_case(sizes.fsync, 1)
    if name == "fsync-100":
        return bench_limits.fsync_case(sizes.fsync_batched, 100)
    if name == "grpc-1":
        return bench_limits.grpc_case(sizes.grpc, 1)
    if name == "grpc-100":
        return bench_limits.grpc_case(sizes.grpc_batched, 100)
    raise ValueError(f"unknown case {name!r}; cases: {', '.join(CASES)}")


def unavailable(name: str) -> str | None:
    """Why a case cannot run here (a peer not installed or not running), or None.

    Args:
        name: one of :data:`CASES`.

    Returns:
        The reason, or None when the case can run.
    """
    if name == "etcd" and shutil.which("etcd") is None:
        return "etcd not installed (run benchmarks/peers/setup.sh)"
    if name in ("eventsourcing", "smallbank-es"):
        try:
            import eventsourcing  # noqa: F401
        except ImportError:
            return "eventsourcing not installed (run benchmarks/peers/setup.sh)"
    if name in ("smallbank-pg-quorum", "hot-row-pg-quorum"):
        from benchmarks.peers.pg_quorum import PgQuorumError, find_bindir

        try:
            find_bindir()
        except PgQuorumError as exc:
            return str(exc)
    if name == "smallbank-waltz":
        from waltz.errors import ConfigurationError
        from waltz.local.zookeeper import find_zookeeper_classpath

        try:
            find_zookeeper_classpath()
        except ConfigurationError as exc:
            return str(exc)
    if name in ("eventsourcing", "smallbank-pg", "smallbank-es", "smallbank-waltz", "hot-row-pg"):
        try:
            socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
        except OSError:
            return "PostgreSQL not listening on 127.0.0.1:5432"
    return None


def spawn_case(name: str, args: argparse.Namespace, forwarded: list[str]) -> dict[str, Any]:
    """Run a case in a child process (own session) and parse its result.

    The child is ``python -m benchmarks.peers.run_all --case NAME``; after its time limit it gets
    SIGTERM, then SIGKILL.

    Args:
        name: one of :data:`CASES`.
        args: the command line's options.
        forwarded: the options the child takes from them.

    Returns:
        Its row with ``case``, ``wall_s`` and ``load_average``; an error row (``error``, ``stderr``)
        when it failed or timed out.
    """
    command = [sys.executable, "-m", "benchmarks.peers.run_all", "--case", name, *forwarded]
    env = dict(os.environ)
    if name.startswith("waltz-"):
        # The client as Waltz's own processes run it (waltz.tuning.tune_grpc_transport and
        # tune_grpc_fork_support; decisions 0080, 0082), not the other systems' gRPC clients (etcd's).
        for variable, value in GRPC_ENVIRONMENT.items():
            env.setdefault(variable, value)
    loop_seconds = empty_loop_seconds()
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    try:
        out, err = child.communicate(timeout=args.case_timeout + 180)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the case unwinds its context managers and stops what it started (its
        # servers run in sessions of their own, out of reach of a signal to its group).
        os.killpg(child.pid, signal.SIGTERM)
        try:
            out, err = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, err = child.communicate()
        return {
            "system": name,
            "empty_loop_s": loop_seconds,
            "error": f"timed out after {time.monotonic() - started:.0f}s",
            "stderr": err[-2000:],
        }
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT "):
            row: dict[str, Any] = json.loads(line[len("RESULT ") :])
            row["case"] = name
            row["wall_s"] = round(time.monotonic() - started, 1)
            row["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            row["empty_loop_s"] = loop_seconds
            return row
    return {
        "system": name,
        "case": name,
        "empty_loop_s": loop_seconds,
        "error": f"exit code {child.returncode}",
        "stderr": err[-2000:],
    }


#: The empty loop by which ``benchmarks/RESULTS.md`` names the machine's spells, run as a command of
#: its own (module level, interpreter start included), as the results were timed.
EMPTY_LOOP = "for i in range(10_000_000): pass"


def empty_loop_seconds() -> float:
    """Time :data:`EMPTY_LOOP` as ``benchmarks/RESULTS.md``'s spells were timed: ``python3 -c``, the
    ``python3`` found on ``PATH`` (this interpreter when there is none), its start included: the
    machine's speed just before a run (on the 2-core VMs of ``RESULTS.md`` 0.17 to 0.24 s in a fast
    spell, 0.43 s or more in a slow one). The start counts: on those VMs ``python3`` was pyenv's
    shim, which adds about 0.1 s to the loop run by the project's virtual environment.

    Returns:
        Its wall-clock seconds, to the hundredth.
    """
    started = time.perf_counter()
    subprocess.run([shutil.which("python3") or sys.executable, "-c", EMPTY_LOOP], check=True)
    return round(time.perf_counter() - started, 2)


def fmt(value: Any, digits: int = 1) -> str:
    """A figure of the table: thousands separated, ``digits`` decimals for a float, ``-`` for None.

    Args:
        value: the figure.
        digits: decimals of a float.

    Returns:
        The text.
    """
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for the runs of one case.

    Args:
        runs: the case's rows, in the order they ran; failed ones have ``error``.

    Returns:
        The successful run of median throughput (the lower of the two middle ones for an even
        count), with every run's throughput in ``runs_tx_s`` and the number of failed runs in
        ``failed_runs``; the first failure when no run succeeded.
    """
    ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["transactions_per_second"])
    if not ok:
        return runs[0]
    row = dict(ok[(len(ok) - 1) // 2])
    row["runs_tx_s"] = [r["transactions_per_second"] for r in runs if "error" not in r]
    row["failed_runs"] = len(runs) - len(ok)
    return row


def _spread(row: dict[str, Any]) -> str:
    runs = row.get("runs_tx_s") or [row["transactions_per_second"]]
    failed = f", {row['failed_runs']} failed" if row.get("failed_runs") else ""
    if len(runs) == 1 and not failed:
        return "1"
    return f"{len(runs)}: {fmt(min(runs), 0)} to {fmt(max(runs), 0)}{failed}"


#: The processes of a row's CPU figures that are the client side: a peer's or the log benchmark's
#: client processes, or ``waltz perf smallbank``'s ledger instances.
CLIENT_CPU = ("client", "instances")


def _cpu(row: dict[str, Any]) -> str:
    """CPU microseconds per transaction of the run's processes (waltz-py rows: the client's and
    the cluster's, summed over the nodes whose CPU could be read), or ``-``."""
    cpu = row.get("cpu_us_per_transaction") or {}
    if not cpu:
        return "-"
    client = sum(us for name, us in cpu.items() if name in CLIENT_CPU)
    nodes = sum(us for name, us in cpu.items() if name not in CLIENT_CPU)
    return f"{sum(cpu.values()):,.0f} (client {client:,.0f}, cluster {nodes:,.0f})"


def workload(system: str) -> str:
    """The workload a row's system name names: its last parenthesis (``SmallBank`` of
    ``PostgreSQL, 2 synchronous standbys (ANY 1) (SmallBank)``), or ``""`` (the log's own load).

    Args:
        system: the row's ``system``.

    Returns:
        The workload's name.
    """
    if not system.endswith(")") or "(" not in system:
        return ""
    return system[system.rindex("(") + 1 : -1]


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the rows, with each row's throughput over the best waltz-py row's of the
    same workload (the system name's last parenthesis: ``waltz-py (SmallBank)`` for
    ``PostgreSQL (SmallBank)``; none for the log's own rows, ``waltz-py``), or ``-`` without one.

    Args:
        rows: one per case, see :func:`summarize`.

    Returns:
        The table.
    """
    best: dict[str, float] = {}
    for r in rows:
        if "error" not in r and r["system"].startswith("waltz-py"):
            kind = workload(r["system"])
            best[kind] = max(best.get(kind, 0.0), r["transactions_per_second"])
    lines = [
        "| system | configuration | tx/s | runs: tx/s min to max | ratio to best waltz-py | MB/s "
        "| retries/tx | p50 ms | p90 ms | p99 ms | p99.9 ms | CPU µs/tx | load "
        "| batch / linger / durability settings |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            dashes = " | ".join("-" * 12)
            lines.append(f"| {r.get('case', r['system'])} | {dashes} | {r['error']} |")
            continue
        lat = r["latency_ms"]
        top = best.get(workload(r["system"]))
        ratio = f"{r['transactions_per_second'] / top:.2f}" if top else "-"
        lines.append(
            f"| {r['system']} | {r['config']} | {fmt(r['transactions_per_second'])} | {_spread(r)} | "
            f"{ratio} | "
            f"{fmt(r['mb_per_second'], 3)} | {fmt(r['retries_per_transaction'], 3)} | {fmt(lat['p50'], 2)} | "
            f"{fmt(lat['p90'], 2)} | {fmt(lat['p99'], 2)} | {fmt(lat['p99.9'], 2)} | {_cpu(r)} | "
            f"{r['load'] or '-'} | "
            f"{r['settings']} |"
        )
    return "\n".join(lines)


def machine() -> str:
    """The machine the run is on, one line: platform, CPUs and their model, memory, Python.

    Returns:
        The line.
    """
    cpus = os.cpu_count()
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        memory = float("nan")
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    python = platform.python_version()
    return f"{platform.platform()}, {cpus} CPU(s) {model}, {memory:.0f} GiB RAM, Python {python}"


def main() -> None:
    """Run the cases given (each in a child process of its own, round by round) and print the table.

    With ``--case`` (the child's side) it runs that one case in this process and prints its row as
    a ``RESULT`` line.
    """
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small runs: the whole set in a few minutes")
    parser.add_argument("--only", default="", help=f"comma-separated cases (default all): {', '.join(CASES)}")
    parser.add_argument(
        "--transactions", type=int, default=0, help="transactions per system case (overrides)"
    )
    parser.add_argument(
        "--in-flight", type=int, default=200, help="closed loop: outstanding (waltz-py, etcd)"
    )
    parser.add_argument(
        "--es-threads", type=int, default=16, help="eventsourcing writer threads (= in flight)"
    )
    parser.add_argument("--clients", type=int, default=1, help="waltz-py client processes")
    parser.add_argument(
        "--smallbank-processes", type=int, default=3, help="SmallBank peers: worker processes"
    )
    parser.add_argument(
        "--smallbank-threads", type=int, default=21, help="SmallBank peers: threads (connections) per process"
    )
    parser.add_argument("--smallbank-accounts", type=int, default=200, help="SmallBank peers: customers")
    parser.add_argument(
        "--smallbank-rate",
        type=float,
        default=None,
        help="smallbank-waltz: draws per second in all, on a fixed schedule, for latency at a share of "
        "the load (default: closed loop, as the SmallBank peers always run)",
    )
    parser.add_argument(
        "--hot-row-processes",
        type=int,
        default=3,
        help="hot-row peers: worker processes (inventory instances)",
    )
    parser.add_argument(
        "--hot-row-threads", type=int, default=21, help="hot-row peers: threads (connections) per process"
    )
    parser.add_argument("--hot-row-skus", type=int, default=1, help="hot-row peers: hot rows (SKUs)")
    parser.add_argument(
        "--waltz-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="server setting, e.g. WALTZ_STORE_LINGER=0.001",
    )
    parser.add_argument("--seed", type=int, default=8, help="seed of lock draws")
    parser.add_argument("--case-timeout", type=float, default=900.0, help="seconds each case may run")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every case this many times, round by round (drift of the machine hits every case "
        "alike); the table shows each case's median run and the range",
    )
    parser.add_argument("--json", type=Path, help="also write the rows (and every run) to this JSON file")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.case:
        import logging

        logging.basicConfig(level=logging.WARNING)
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        print("RESULT " + json.dumps(run_case(args.case, args)), flush=True)
        return

    if __spec__ is None:  # run by its path: ``benchmarks`` is not importable, nor are the cases
        parser.error(
            "run it as a module, from the repository's root: .venv/bin/python -m benchmarks.peers.run_all ..."
        )

    forwarded = [
        *(["--quick"] if args.quick else []),
        *("--transactions", str(args.transactions), "--in-flight", str(args.in_flight)),
        *("--es-threads", str(args.es_threads), "--clients", str(args.clients), "--seed", str(args.seed)),
        *("--smallbank-processes", str(args.smallbank_processes)),
        *("--smallbank-threads", str(args.smallbank_threads)),
        *("--smallbank-accounts", str(args.smallbank_accounts)),
        *(("--smallbank-rate", str(args.smallbank_rate)) if args.smallbank_rate is not None else ()),
        *("--hot-row-processes", str(args.hot_row_processes)),
        *("--hot-row-threads", str(args.hot_row_threads), "--hot-row-skus", str(args.hot_row_skus)),
        *("--case-timeout", str(args.case_timeout)),
        *(x for kv in args.waltz_env for x in ("--waltz-env", kv)),
    ]
    cases = [c.strip() for c in args.only.split(",") if c.strip()] or CASES
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}")
    started = time.time()
    print(f"# peer benchmarks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}")
    print(f"machine: {machine()}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"1-min load average before: {os.getloadavg()[0]:.2f} (other work on the machine skews figures)",
        flush=True,
    )
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.smallbank_rate is not None and args.smallbank_rate <= 0:
        parser.error(f"--smallbank-rate must be above 0, got {args.smallbank_rate}")
    # Asked once, before the first run: a case that cannot run is said at the start of a sitting,
    # not after the runs before it.
    reasons = {name: unavailable(name) for name in cases}
    for name, why in reasons.items():
        if why:
            print(f"{name}: skipped in every round: {why}", file=sys.stderr, flush=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for round_number in range(1, args.repeat + 1):
        if args.repeat > 1:
            print(f"round {round_number} of {args.repeat}", flush=True)
        for name in cases:
            reason = reasons[name]
            row: dict[str, Any] = (
                {"system": name, "case": name, "error": f"skipped: {reason}"}
                if reason
                else spawn_case(name, args, forwarded)
            )
            runs[name].append(row)
            if "error" in row:
                print(f"{name}: {row['error']}\n{row.get('stderr', '')}", file=sys.stderr, flush=True)
            else:
                if row.get("passed") is False:
                    print(f"{name}: a check failed: {row.get('checks')}", file=sys.stderr, flush=True)
                print(
                    f"{name}: {row['transactions_per_second']:,.1f} tx/s, p50 {row['latency_ms']['p50']} ms, "
                    f"p99 {row['latency_ms']['p99']} ms ({row['wall_s']} s; 1-min load average "
                    f"{row['load_average'][0]} -> {row['load_average'][1]} on {os.cpu_count()} CPUs)",
                    flush=True,
                )
    rows = [summarize(runs[name]) for name in cases]
    print()
    print(table(rows))
    loops = [row["empty_loop_s"] for name in cases for row in runs[name] if "empty_loop_s" in row]
    if loops:
        print(f"\nthe empty loop ({EMPTY_LOOP!r}) before each run: {min(loops)} to {max(loops)} s")
    print(f"\n(total {time.time() - started:.0f} s)")
    if args.json:
        args.json.write_text(
            json.dumps({"machine": machine(), "command": sys.argv, "rows": rows, "runs": runs}, indent=2)
            + "\n"
        )


if __name__ == "__main__":
    main()
