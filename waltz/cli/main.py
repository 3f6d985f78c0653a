"""The ``waltz`` command: one entry point for every service and tool."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from types import FrameType

import typer

from waltz import __version__
from waltz.cli import chaos, console, demo, perf, rebuild, server, storage, up
from waltz.cli.groups import MARKUP, LazyGroup
from waltz.cli.output import missing_extra

app = typer.Typer(
    help="Waltz: a quorum-replicated, partitioned write-ahead log with optimistic locking.",
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
    pretty_exceptions_enable=False,
    cls=LazyGroup,  # disk, cluster and db are imported when used (waltz.cli.groups)
)
app.add_typer(
    server.app, name="server", short_help="Run a server; list servers; change preferred partitions."
)
app.add_typer(
    storage.app, name="storage", short_help="Run a storage node; list and sync a node's partitions."
)
app.add_typer(perf.app, name="perf")
app.command("demo", short_help="Run the ledger demo on a local cluster under faults; check it.")(demo.demo)
app.command("up", short_help="Run a local cluster (loopback or network namespaces) until Ctrl-C.")(up.up)
app.command("rebuild", short_help="Rebuild an application's tables from the log with Spark.")(
    rebuild.rebuild_command
)
app.command("chaos", short_help="Run a local cluster under faults and check every invariant.")(chaos.chaos)
app.command("console", short_help="Serve a web console of a cluster: map, metrics, operator actions.")(
    console.console
)


@app.command("version")
def version() -> None:
    """Print the waltz-py version."""
    typer.echo(__version__)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``waltz`` command line.

    SIGTERM (``timeout``, a CI job cancelled, ``kill``) unwinds the command as Ctrl-C would, so
    that a tool which started processes (``waltz chaos``, ``waltz perf --local``, ``waltz demo``)
    stops them before it exits with 143; SIGHUP (its terminal closed) likewise, exiting with 129;
    commands that serve until SIGTERM install their own handler.
    """
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:  # SIGHUP stays ignored under nohup
            signal.signal(signum, _exit_on_sigterm)
    try:
        app(args=list(argv) if argv is not None else None, prog_name="waltz")
    except ImportError as exc:
        # A command whose extra is not installed says what to install, not a traceback.
        hint = missing_extra(exc)
        if hint is None:
            raise
        words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")][:1]
        typer.secho(f"error: waltz {' '.join(words)} cannot run: {hint}", err=True, fg=typer.colors.RED)
        raise SystemExit(2) from exc
