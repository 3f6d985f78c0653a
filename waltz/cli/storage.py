"""``waltz storage``: run a storage node."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from waltz.cli.groups import MARKUP
from waltz.logs import configure_logging
from waltz.services.storage.command import start

app = typer.Typer(help="Run a Waltz storage node.", no_args_is_help=True, rich_markup_mode=MARKUP)


app.command("start")(start)


@app.command("smoke")
def smoke(
    transactions: Annotated[int, typer.Option(help="Records to append in all.", min=1)] = 20_000,
    partitions: Annotated[int, typer.Option(help="Partitions to spread them over.", min=1)] = 4,
    size: Annotated[int, typer.Option(help="Transaction data bytes per record.", min=0)] = 200,
    work_dir: Annotated[
        Path | None, typer.Option(help="Keep the storage directory and logs here (default: a temp dir).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Log level of this process.")] = "WARNING",
) -> None:
    """Smoke-test a storage node: append, kill -9, restart, read back, compare.

    Starts a real storage node process, appends records over replica session streams, kills the
    node with SIGKILL, restarts it, reads every record back through the admin port and checks it
    byte for byte, and checks that the fence of the newest store session survived the crash.
    Exits non-zero if anything was lost or changed.
    """
    from waltz.local.storage_smoke import run_storage_smoke

    configure_logging(log_level)

    def run(directory: Path) -> bool:
        with typer.progressbar(length=transactions, label="appending") as bar:
            result = run_storage_smoke(
                directory,
                partitions=partitions,
                transactions=transactions,
                size=size,
                progress=bar.update,
                say=lambda line: typer.echo(f"\n{line}" if line.startswith("killing") else line),
            )
        rate = result.appended / result.append_seconds if result.append_seconds else 0.0
        typer.echo(
            f"appended {result.appended} records in {result.append_seconds:.2f}s ({rate:,.0f} records/s)"
        )
        typer.echo(f"verified {result.verified} records byte for byte after kill -9 and restart")
        for problem in result.problems:
            typer.echo(f"PROBLEM: {problem}", err=True)
        typer.echo("PASSED" if result.passed else "FAILED")
        return result.passed

    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        passed = run(work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="waltz-demo-") as tmp:
            passed = run(Path(tmp))
    raise typer.Exit(0 if passed else 1)
