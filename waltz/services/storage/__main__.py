"""``python -m waltz.services.storage``: the same as ``waltz storage start``."""

import sys

from waltz.tuning import tune_grpc_transport

if __name__ == "__main__":
    tune_grpc_transport()  # before the first import of grpc: waltz.tuning, tune_grpc_transport
    from waltz.services.runtime import run_command
    from waltz.services.storage.command import start

    run_command(start, sys.argv[1:], "waltz storage start")
