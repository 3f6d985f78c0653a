"""SmallBank on waltz-py, run the way the SmallBank peers run: ``waltz perf smallbank`` (the ledger
example's mix and rules, from ledger instances on a local cluster) on a PostgreSQL database created
for the run and dropped afterwards, its summary turned into a result row of the same shape as the
peers' rows, so that one ``run_all`` sitting puts waltz-py beside plain PostgreSQL and the
quorum-replicated PostgreSQL, round by round (``benchmarks/RESULTS.md``, "SmallBank").

The run is the SmallBank row of record: ``--processes`` ledger instances (3), each in a process of
its own with ``--threads`` SmallBank transactions in flight (21, the peers' threads per process),
``--partition-routing`` (a partition per instance, each request to the instance of its customer's
partition) and ``--batch`` (an instance's ready transactions of a partition share one log
transaction; docs/design/sql.md, "Batched entity transactions"), on a local cluster (2 servers, 3
storage nodes, RF 3, mutual TLS: ``waltz perf smallbank --local``'s defaults). ``--warmup`` draws in
all are split over the instances, as the peers split theirs over their threads. ``--rate`` paces the
draws on a fixed schedule (latency counts from each draw's scheduled start), for the latency targets
at a share of the load; the peers have no such mode.

How it counts, as the peers do: ``transactions`` and ``transactions_per_second`` are the committed
SmallBank transactions (those that changed state), over the instances' common window; Balance reads
(``balances_read``) and operations the rules dropped (``dropped``, by reason in ``drop_reasons``)
are apart. ``latency_ms`` is submit -> applied (the submitting instance has applied the commit to
its database: the moment a peer's commit returns, the application's own write readable); submit ->
commit (the log acknowledged it) is in ``latency_ms_submit_to_commit``. ``retries_per_transaction``
is lock failures per committed transaction. ``cpu_us_per_transaction`` is the instances' and the
cluster's processes' CPU (PostgreSQL's backends are not counted in this row). ``passed`` and
``checks`` are the ledger's checks (applied exactly once, money conserved, transfers exactly once,
balance rules); ``waltz`` holds the whole summary ``waltz perf smallbank --json`` printed. Usage::

    .venv/bin/python -m benchmarks.peers.bench_smallbank_waltz                   # 6,000 draws, 3 x 21
    .venv/bin/python -m benchmarks.peers.bench_smallbank_waltz --transactions 60000
    .venv/bin/python -m benchmarks.peers.bench_smallbank_waltz --rate 325 --transactions 9750
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

from benchmarks.peers.pg_server import LOCAL, PgServer, scratch_database
from benchmarks.peers.smallbank_workload import Options, options_of, parser
from waltz.client.config import WaltzClientConfig

#: The system's name in the row, beside ``PostgreSQL (SmallBank)``.
SYSTEM = "waltz-py (SmallBank)"

#: Seconds the command may take beyond its measured phase's time limit: starting the local cluster,
#: migrating and opening the accounts, the warm-up, the checks and stopping.
SETUP_SECONDS = 300.0

#: Seconds the command is given to stop the local cluster it started once it was sent SIGTERM (as
#: Ctrl-C, waltz's commands unwind on it), before it is killed.
STOP_SECONDS = 60.0


class SmallBankRunError(RuntimeError):
    """``waltz perf smallbank`` failed before it printed a summary (bad options, no cluster, no
    database); the message carries the end of what it wrote to stderr."""


def command(url: str, options: Options, rate: float | None = None) -> list[str]:
    """The ``waltz perf smallbank`` command of a run.

    Args:
        url: the run's database, a SQLAlchemy URL.
        options: the peers' options: ``processes`` are the instances, ``threads`` the transactions
            each keeps in flight, ``warmup`` the draws before the measured phase in all.
        rate: draws per second in all, on a fixed schedule; None for the closed loop.

    Returns:
        The argument list, run with this interpreter (``python -m waltz``).
    """
    warm_up = math.ceil(options.warmup / options.processes)
    arguments = [
        *(sys.executable, "-m", "waltz", "perf", "smallbank", "--local"),
        *("--instances", str(options.processes), "--partition-routing", "--batch"),
        *("--transactions", str(options.transactions), "--accounts", str(options.accounts)),
        *("--warm-up", str(warm_up), "--seed", str(options.seed), "--timeout", str(options.time_limit)),
        *("--db", url, "--json"),
    ]
    if rate is None:
        arguments += ["--in-flight", str(options.threads)]
    else:
        # A paced run keeps its own default in flight (a tenth of a second of draws, at least 21):
        # the threads of a closed loop are no bound on a schedule.
        arguments += ["--rate", str(rate)]
    return arguments


def batch_linger() -> float:
    """The batch linger the instances run with: ``client.batchLinger`` as this environment sets it
    (``WALTZ_CLIENT_BATCH_LINGER``, inherited by the command), or its default.

    Returns:
        Seconds.
    """
    # The cluster's address is the command's own (--local); any will do to read the setting.
    config = WaltzClientConfig(zookeeper_connect_string="127.0.0.1:2181", cluster_root="/waltz")
    return config.client_batch_linger


def _count(number: int, noun: str) -> str:
    """``1 partition``, ``3 partitions``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def row(summary: dict[str, Any], linger: float | None = None) -> dict[str, Any]:
    """The result row of a ``waltz perf smallbank --json`` summary.

    Args:
        summary: the JSON object the command printed.
        linger: the instances' batch linger in seconds (:func:`batch_linger`), named in the row's
            ``settings``; None: not named.

    Returns:
        The row: ``common.result``'s keys (``system``, ``config``, ``settings``, ``load``,
        ``transactions``, ``transactions_per_second``, ``latency_ms``, ...) and SmallBank's
        (``committed``, ``dropped``, ``balances_read``, ``draws``, ``drop_reasons``), the checks
        (``passed``, ``checks``) and the whole summary under ``waltz``.

    Raises:
        KeyError: the summary lacks a field of the row (another command's output).
    """
    settings = summary["settings"]
    cpu = dict(summary["cpu_us_per_transaction"])
    servers = sum(1 for name in cpu if name.startswith("server-"))
    storages = sum(1 for name in cpu if name.startswith("storage-"))
    applied = summary["latency_ms"]["submit_to_applied"]
    seconds = summary["seconds"]
    routing = ", partition-routed" if settings["partition_routing"] else ""
    batched = ", batched" if settings["batch"] else ""
    rate = settings["rate"]
    return {
        "system": SYSTEM,
        "config": (
            f"{_count(settings['instances'], 'ledger instance')}{routing}{batched}, "
            f"{_count(summary['partitions'], 'partition')}, {_count(servers, 'server')}, "
            f"{_count(storages, 'storage node')} (RF {min(3, storages)}), PostgreSQL"
        ),
        "settings": "waltz perf smallbank --local's defaults (mutual TLS)"
        + (f", batch linger {linger * 1000:g} ms" if linger is not None else ""),
        "load": (
            f"{settings['transactions']:,} draws, "
            + (f"{rate:,.1f}/s on a schedule" if rate else "closed loop")
            + f", {settings['in_flight']} in flight per instance"
        ),
        "transactions": summary["committed"],
        "transactions_per_second": summary["committed_per_second"],
        "seconds": seconds,
        "mb_per_second": None,
        "retries_per_transaction": summary["lock_failures_per_committed"],
        "failed": summary["errors"],
        "errors": summary["error_samples"],
        "latency_ms": {key: applied[key] for key in ("p50", "p90", "p99", "p99.9", "max", "mean", "count")},
        "latency_ms_submit_to_commit": summary["latency_ms"]["submit_to_commit"],
        "cpu_us_per_transaction": cpu,
        "committed": summary["committed"],
        "dropped": summary["dropped"],
        "balances_read": summary["balances_read"],
        "balances_read_per_second": round(summary["balances_read"] / seconds, 1) if seconds else None,
        "draws": summary["draws"],
        "drop_reasons": summary["drop_reasons"],
        "processes": settings["instances"],
        "threads": settings["in_flight"],
        "accounts": settings["accounts"],
        "passed": summary["passed"],
        "checks": summary["checks"],
        "waltz": summary,
    }


def run(
    options: Options, rate: float | None = None, server: PgServer = LOCAL, timeout: float | None = None
) -> dict[str, Any]:
    """Run ``waltz perf smallbank`` on a database created on ``server`` and dropped afterwards.

    Args:
        options: the peers' options (see :func:`command`).
        rate: draws per second in all, on a fixed schedule; None for the closed loop.
        server: the PostgreSQL server of the run's database.
        timeout: seconds the command may take in all; None: its measured phase's time limit
            (``options.time_limit``) and :data:`SETUP_SECONDS`.

    Returns:
        The row (:func:`row`). A run whose ledger checks failed still gives its row, with
        ``passed`` false.

    Raises:
        SmallBankRunError: the command printed no summary.
        subprocess.TimeoutExpired: it ran past ``timeout``; it was stopped (SIGTERM, then SIGKILL
            after :data:`STOP_SECONDS`), as it is when this raises otherwise while it runs.
        psycopg.OperationalError: the server is not reachable.
    """
    with scratch_database("waltz_peer_sb_waltz", server) as dbname:
        url = f"postgresql+psycopg://{server.user}@{server.host}:{server.port}/{dbname}"
        child = subprocess.Popen(
            command(url, options, rate), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            out, err = child.communicate(
                timeout=options.time_limit + SETUP_SECONDS if timeout is None else timeout
            )
        except BaseException:
            # SIGTERM first, so that the command stops the local cluster it started (its nodes
            # run in sessions of their own: a SIGKILL to the command would leave them running,
            # holding its output open).
            child.terminate()
            try:
                child.communicate(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate(timeout=STOP_SECONDS)
            raise
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise SmallBankRunError(
            f"waltz perf smallbank exited {child.returncode} without a summary: {err[-2000:]}"
        )
    return row(json.loads(lines[-1]), batch_linger())


def main() -> None:
    """Run from the command line (the SmallBank peers' options and ``--rate``); print the row as one
    JSON line."""
    arguments = parser(__doc__)
    arguments.add_argument(
        "--rate",
        type=float,
        default=None,
        help="draws per second in all, on a fixed schedule (default: closed loop)",
    )
    args = arguments.parse_args()
    if args.rate is not None and args.rate <= 0:
        arguments.error(f"--rate must be above 0, got {args.rate}")
    print(json.dumps(run(options_of(args), args.rate)), flush=True)


if __name__ == "__main__":
    main()
