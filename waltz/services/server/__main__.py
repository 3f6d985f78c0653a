"""``python -m waltz.services.server``: the same as ``waltz server start``."""

import sys

from waltz.tuning import tune_grpc_fork_support, tune_grpc_transport

if __name__ == "__main__":
    # Before anything imports grpc: docs/decisions/0080-grpc-core-without-the-event-engine.md
    # and docs/decisions/0082-grpc-fork-handlers-off.md.
    tune_grpc_transport()
    tune_grpc_fork_support()
    from waltz.services.runtime import run_command
    from waltz.services.server.command import start

    run_command(start, sys.argv[1:], "waltz server start")
