"""``python -m waltz.services.server``: the same as ``waltz server start``."""

import sys

from waltz.services.runtime import run_command
from waltz.services.server.command import start

if __name__ == "__main__":
    run_command(start, sys.argv[1:], "waltz server start")
