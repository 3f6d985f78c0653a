"""``python -m waltz.services.storage``: the same as ``waltz storage start``."""

import sys

from waltz.services.runtime import run_command
from waltz.services.storage.command import start

if __name__ == "__main__":
    run_command(start, sys.argv[1:], "waltz storage start")
