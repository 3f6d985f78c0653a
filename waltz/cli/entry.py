"""The ``waltz`` console script and ``python -m waltz``: process settings, then the command line.

Importing :mod:`waltz.cli.main` imports gRPC (through the commands it lists), and gRPC core reads
its experiments and its fork support at that import, so :func:`waltz.tuning.tune_grpc_transport`
and :func:`waltz.tuning.tune_grpc_fork_support` run here, before it
(docs/decisions/0080-grpc-core-without-the-event-engine.md,
docs/decisions/0082-grpc-fork-handlers-off.md). Every process a command starts (the nodes of a
local cluster, the instances of ``waltz perf``) inherits the settings.
"""

from __future__ import annotations

from collections.abc import Sequence

from waltz.tuning import tune_grpc_fork_support, tune_grpc_transport

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``waltz`` command line (:func:`waltz.cli.main.main`) with gRPC tuned first.

    Args:
        argv: the arguments after ``waltz``; ``None`` takes ``sys.argv``.

    Raises:
        SystemExit: always, with the command's exit status (as every Typer program exits).
    """
    tune_grpc_transport()
    tune_grpc_fork_support()
    from waltz.cli.main import main as run_command_line

    run_command_line(argv)
