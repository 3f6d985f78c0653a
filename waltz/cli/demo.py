"""``waltz demo``: the main job of the README's first command (the ledger under faults, checked).

The logic lives in :mod:`waltz.workloads.demo`; this module parses options and draws progress.
``--app`` names another SmallBank application than the ledger example (by module).
Exit codes: 0 every check passed; 1 a check failed; 2 the demo could not run.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from waltz.cli.options import NodesLogLevelOption
from waltz.cli.output import fail
from waltz.errors import ConfigurationError
from waltz.logs import configure_logging
from waltz.workloads.application import DEFAULT_APPLICATION


def demo(
    transactions: Annotated[
        int, typer.Option(help="SmallBank transactions to draw (Balance reads included).", min=1)
    ] = 3000,
    instances: Annotated[int, typer.Option(help="Ledger instances sharing the database.", min=1)] = 3,
    partitions: Annotated[int, typer.Option(help="Partitions of the log.", min=1)] = 4,
    accounts: Annotated[int, typer.Option(help="SmallBank customers.", min=2)] = 200,
    db: Annotated[
        str | None,
        typer.Option(
            help=(
                "Application database URL, e.g. postgresql+psycopg://postgres@127.0.0.1/demo or "
                "mysql+pymysql://root@127.0.0.1/demo (an empty database). Default: SQLite in the "
                "work directory."
            ),
            envvar="WALTZ_DEMO_DB",
        ),
    ] = None,
    faults: Annotated[
        bool, typer.Option(help="kill -9 a storage node and a server during the run, then restart them.")
    ] = True,
    evolve: Annotated[
        bool,
        typer.Option(
            help=(
                "Start on the application's first release and deploy its later ones while the mix "
                "runs (the ledger's Account changes twice)."
            )
        ),
    ] = True,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch/--no-batch",
            help=(
                "The instances submit through an EntityBatcher: operations ready for a partition "
                "while its last log transaction is in flight go as one log transaction "
                '(docs/sql.md "Batching entity transactions"); the checks count each member '
                "applied exactly once, and the summary says how many batches committed. The "
                "instances run the current release from the start (as --no-evolve): the earlier "
                "releases do not batch."
            ),
        ),
    ] = False,
    split_to: Annotated[
        int | None,
        typer.Option(
            "--split-to",
            help=(
                "Split the log's partitions to this count (a multiple of --partitions) at 60 % of "
                "the mix, while it runs (waltz cluster split; docs/design/splits.md); the checks "
                "then cover every partition of both counts."
            ),
            min=2,
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed of the workload.")] = 7,
    spark: Annotated[
        bool,
        typer.Option(help="End with the Spark rebuild of the ledger from the log and the drift check."),
    ] = True,
    spark_master: Annotated[
        str | None, typer.Option(help="Spark master URL of the rebuild (default `local[*]`).")
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            help="Keep the cluster's data, logs and the SQLite database here. Run again with it, the "
            "demo goes on with the same cluster and log, every instance on the current release."
        ),
    ] = None,
    log_level: NodesLogLevelOption = "WARNING",
    app: Annotated[
        str,
        typer.Option(
            help="The SmallBank application, by module name: SMALLBANK of MODULE.smallbank or MODULE."
        ),
    ] = DEFAULT_APPLICATION,
) -> None:
    """Run the ledger demo: SmallBank on a local Waltz cluster, under faults, then check it.

    Starts ZooKeeper, 3 storage nodes and 2 servers as processes on loopback and several ledger
    instances sharing one database; runs the SmallBank mix (transfers across partitions become
    two-step transfers) and prints committed/s and the p50 and p99 of submit -> commit and of
    submit -> applied; kills a storage node and a server with SIGKILL and restarts them; starts on
    the ledger's first release and deploys its model changes mid-run (a new column, a renamed one);
    then
    checks that every transaction was applied exactly once, money is conserved (counting money
    in flight), every transfer completed once, no balance broke the rules, the database holds
    every row as the log last wrote it, and every replica holds the same records; finally
    rebuilds the ledger from the log with Spark and checks that the live database has not
    drifted from it (needs the spark extra). Exits 1 if any check fails.
    With --batch the instances submit through an EntityBatcher and the run prints the batches
    and the operations they carried.
    """
    if spark:
        # Its last check needs Spark: say so now, not after the run.
        missing = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
        if missing:
            raise fail(
                f"the demo ends with a Spark rebuild of the ledger, and {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not installed here: pip install "
                "'waltz-py[spark]' (in a clone, WALTZ_EXTRAS=dev,sql,spark scripts/setup), or run "
                "the demo with --no-spark",
                2,
            )
    from waltz.workloads.demo import DemoOptions, run_demo
    from waltz.workloads.perf.database import UnusableDatabaseError

    configure_logging(log_level)

    bars: list[Any] = []

    def progress(label: str, total: int) -> Callable[[int], None]:
        """A progress bar on a terminal; a line per tenth of the way otherwise (logs, CI)."""
        for bar in bars:  # the previous phase is over
            bar.__exit__(None, None, None)
        bars.clear()
        if sys.stdout.isatty():
            bar = typer.progressbar(length=total, label=label, show_pos=True, show_eta=True)
            bar.__enter__()
            bars.append(bar)
            return bar.update
        state = {"done": 0, "last": 0}
        typer.echo(f"{label}: 0/{total}")

        def step(n: int) -> None:
            state["done"] += n
            if state["done"] - state["last"] >= max(1, total // 10) or state["done"] == total:
                state["last"] = state["done"]
                typer.echo(f"{label}: {state['done']}/{total}")

        return step

    def say(line: str) -> None:
        if bars and bars[0].pos >= bars[0].length:
            bars.pop().__exit__(None, None, None)
        typer.echo(("\n" if bars else "") + line)

    def run(directory: Path) -> bool:
        options = DemoOptions(
            work_dir=directory,
            db_url=db,
            transactions=transactions,
            instances=instances,
            partitions=partitions,
            accounts=accounts,
            faults=faults,
            evolve=evolve,
            batch=batch,
            split_to=split_to,
            seed=seed,
            spark=spark,
            spark_master=spark_master,
            app=app,
        )
        try:
            return run_demo(options, say, progress).passed
        finally:
            for bar in bars:
                bar.__exit__(None, None, None)

    try:
        if work_dir is not None:
            work_dir.mkdir(parents=True, exist_ok=True)
            passed = run(work_dir)
        else:
            with tempfile.TemporaryDirectory(prefix="waltz-demo-") as tmp:
                passed = run(Path(tmp))
    except (OSError, TimeoutError, ConfigurationError, UnusableDatabaseError) as exc:
        typer.echo(f"the demo could not run: {exc}", err=True)
        raise typer.Exit(2) from exc
    except KeyboardInterrupt:
        kept = f"kept in {work_dir}" if work_dir is not None else "removed"
        typer.echo(f"\ninterrupted: the demo's cluster was stopped; its work directory was {kept}", err=True)
        raise typer.Exit(130) from None
    raise typer.Exit(0 if passed else 1)
